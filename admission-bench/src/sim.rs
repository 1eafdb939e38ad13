//! A deterministic, virtual-time simulation of a server behind a count limit: the
//! evidence for `admission_core::adaptive` (the `adaptive` binary prints it).
//!
//! The model: a server of `C` workers (a count that may change mid-run) with exponential
//! service times of mean `S`, first-come first-served; requests beyond `C` wait in the
//! server's own queue. Open-loop Poisson arrivals pass the limiter (a real
//! [`CountLedger`](admission_core::CountLedger), its capacity fixed or driven by an
//! [`AdaptiveLimit`](admission_core::AdaptiveLimit) on the
//! simulation's clock) or are shed, and shed requests are not retried. A client gives
//! up at its deadline: the request is cancelled, in the queue or in service (as an async
//! server drops a request's future when its client goes away), its permit released,
//! and the limiter told `Dropped`. Goodput counts answers within the deadline (every
//! answer, since late ones are cancelled), as a share of the capacity present.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use admission_core::adaptive::{AdaptiveLimit, Algorithm, Outcome};
use admission_core::{CountLedger, CountPermit};
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// A scenario: the load and how the server's capacity changes.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Its name in the table.
    pub name: &'static str,
    /// Arrival rate as a multiple of the initial capacity (`C / S` per second).
    pub load: f64,
    /// Capacity changes: from each time on (seconds), this many workers.
    pub workers: Vec<(f64, u64)>,
    /// Service time changes: from each time on (seconds), service times this many times
    /// the model's (a dependency slowing down). Empty: the model's throughout.
    pub slowdown: Vec<(f64, f64)>,
    /// How long it runs (seconds of virtual time).
    pub seconds: f64,
}

impl Scenario {
    /// The workers present at `t`.
    pub fn workers_at(&self, t: f64) -> u64 {
        self.workers
            .iter()
            .rev()
            .find(|(from, _)| t >= *from)
            .map_or(self.workers[0].1, |(_, w)| *w)
    }

    /// How many times the model's service time it takes at `t`.
    pub fn slowdown_at(&self, t: f64) -> f64 {
        self.slowdown
            .iter()
            .rev()
            .find(|(from, _)| t >= *from)
            .map_or(1.0, |(_, factor)| *factor)
    }

    /// The times the capacity (workers or service time) changes after the start.
    pub fn changes(&self) -> Vec<f64> {
        let workers = self.workers.iter().skip(1).map(|(t, _)| *t);
        let slowdown = self.slowdown.iter().map(|(t, _)| *t).filter(|t| *t > 0.0);
        let mut changes: Vec<f64> = workers.chain(slowdown).collect();
        changes.sort_by(f64::total_cmp);
        changes
    }
}

/// The model's fixed choices.
#[derive(Debug, Clone, Copy)]
pub struct Model {
    /// Mean service time, seconds.
    pub service: f64,
    /// The clients' deadline, seconds.
    pub deadline: f64,
    /// Seconds before measuring.
    pub warmup: f64,
}

/// What limits admission in a run.
#[derive(Debug)]
pub enum Limiter {
    /// No limit.
    None,
    /// A fixed count limit.
    Static(u64),
    /// An adaptive algorithm, from an initial limit.
    Adaptive(Box<dyn Algorithm>, u64),
}

/// One run's figures, measured after the warm-up.
#[derive(Debug, Clone, Default)]
pub struct Outcomes {
    /// Answers within the deadline, as a share of the capacity present.
    pub goodput: f64,
    /// Shed, as a share of arrivals.
    pub shed: f64,
    /// Latency of admitted requests (answered, or given up at the deadline), seconds.
    pub p50: f64,
    /// See `p50`.
    pub p99: f64,
    /// Time admitted requests waited in the server's queue, p99, in seconds of the
    /// model's service time: each wait is scaled by the slowdown in force when the
    /// request arrived, so that it reads in multiples of the service time of its day.
    pub queued_p99: f64,
    /// The limit's average over each second of the run (for a static limit, itself).
    pub limit_by_second: Vec<f64>,
    /// Goodput of each second of the run, as a share of the capacity present.
    pub goodput_by_second: Vec<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A worker finishes a request (a slot and its generation).
    Done(usize, u64),
    /// A request's client gives up.
    Deadline(usize, u64),
    Arrival,
}

/// A request in flight, in a slot reused once it ends (`permit` is `None` then).
struct Request {
    generation: u64,
    arrived: f64,
    started: Option<f64>,
    permit: Option<CountPermit>,
}

/// Exponential with mean `mean`.
fn exponential(rng: &mut Xoshiro256PlusPlus, mean: f64) -> f64 {
    // 53 random bits in (0, 1].
    let u = ((rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
    -u.ln() * mean
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let index = ((values.len() as f64 - 1.0) * p).round() as usize;
    *values.select_nth_unstable_by(index, f64::total_cmp).1
}

/// Runs one scenario under one limiter with one seed.
pub fn run(model: Model, scenario: &Scenario, limiter: Limiter, seed: u64) -> Outcomes {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let epoch = Instant::now();
    let at = |t: f64| epoch + Duration::from_secs_f64(t);
    let ledger = CountLedger::new(0).expect("unlimited");
    let adaptive = match limiter {
        Limiter::None => None,
        Limiter::Static(limit) => {
            ledger.set_capacity(limit as usize).expect("a limit");
            None
        }
        Limiter::Adaptive(algorithm, initial) => Some(
            AdaptiveLimit::builder(algorithm)
                .bounds(1, 100_000)
                .initial(initial)
                .epoch(epoch)
                .build(&ledger)
                .expect("bounds"),
        ),
    };
    let rate = scenario.load * scenario.workers[0].1 as f64 / model.service;
    let seconds = scenario.seconds.ceil() as usize;

    let mut events: BinaryHeap<Reverse<(u64, Event)>> = BinaryHeap::new();
    let key = |t: f64| (t * 1e9) as u64;
    let mut requests: Vec<Request> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut generation = 0u64;
    let mut queue: VecDeque<(usize, u64)> = VecDeque::new();
    let mut busy = 0u64;
    events.push(Reverse((
        key(exponential(&mut rng, 1.0 / rate)),
        Event::Arrival,
    )));

    let (mut arrivals, mut shed) = (0u64, 0u64);
    let mut latencies = Vec::new();
    let mut queued = Vec::new();
    let mut answered_by_second = vec![0u64; seconds];
    let mut limit_area = vec![0f64; seconds];
    let (mut last_t, mut last_limit) = (0.0, ledger.capacity() as f64);
    let end = scenario.seconds;

    while let Some(Reverse((time, event))) = events.pop() {
        let t = time as f64 / 1e9;
        if t >= end {
            break;
        }
        // The limit's area under the curve, second by second.
        let mut from = last_t;
        while from < t {
            let second = from.floor();
            let to = t.min(second + 1.0);
            limit_area[second as usize] += last_limit * (to - from);
            from = to;
        }
        last_t = t;
        let measured = t >= model.warmup;
        let live = |requests: &[Request], id: usize, generation: u64| {
            let request = &requests[id];
            request.generation == generation && request.permit.is_some()
        };
        let mut finish = |id: usize, outcome: Outcome, requests: &mut [Request]| {
            let request = &mut requests[id];
            let latency = t - request.arrived;
            if let Some(limit) = &adaptive {
                limit.record_at(at(t), Duration::from_secs_f64(latency), outcome);
            }
            request.permit = None;
            free.push(id);
            if request.arrived >= model.warmup {
                latencies.push(latency);
                let waited = request.started.unwrap_or(t) - request.arrived;
                queued.push(waited / scenario.slowdown_at(request.arrived));
            }
        };
        match event {
            Event::Arrival => {
                events.push(Reverse((
                    key(t + exponential(&mut rng, 1.0 / rate)),
                    Event::Arrival,
                )));
                if measured {
                    arrivals += 1;
                }
                let Ok(permit) = ledger.try_acquire() else {
                    if measured {
                        shed += 1;
                    }
                    continue;
                };
                generation += 1;
                let request = Request {
                    generation,
                    arrived: t,
                    started: None,
                    permit: Some(permit),
                };
                let id = match free.pop() {
                    Some(id) => {
                        requests[id] = request;
                        id
                    }
                    None => {
                        requests.push(request);
                        requests.len() - 1
                    }
                };
                let deadline = Event::Deadline(id, generation);
                events.push(Reverse((key(t + model.deadline), deadline)));
                queue.push_back((id, generation));
            }
            Event::Done(id, generation) => {
                if !live(&requests, id, generation) {
                    continue; // given up while in service: its worker moved on then
                }
                finish(id, Outcome::Success, &mut requests);
                answered_by_second[t as usize] += 1;
                busy -= 1;
            }
            Event::Deadline(id, generation) => {
                if !live(&requests, id, generation) {
                    continue; // answered
                }
                if requests[id].started.is_some() {
                    busy -= 1;
                }
                // One still queued stays in the queue, skipped when it comes up.
                finish(id, Outcome::Dropped, &mut requests);
            }
        }
        // Free workers (as many as the capacity now allows) take from the queue.
        while busy < scenario.workers_at(t) {
            let Some((next, generation)) = queue.pop_front() else {
                break;
            };
            if !live(&requests, next, generation) {
                continue;
            }
            busy += 1;
            requests[next].started = Some(t);
            let done = t + exponential(&mut rng, model.service * scenario.slowdown_at(t));
            events.push(Reverse((key(done), Event::Done(next, generation))));
        }
        last_limit = match ledger.capacity() {
            0 => f64::NAN,
            limit => limit as f64,
        };
    }

    let capacity_in = |from: f64, to: f64| {
        // Workers / service time, integrated over [from, to) by milliseconds.
        let steps = ((to - from) * 1000.0).round() as usize;
        (0..steps)
            .map(|i| {
                let t = from + i as f64 / 1000.0;
                scenario.workers_at(t) as f64 / (model.service * scenario.slowdown_at(t)) / 1000.0
            })
            .sum::<f64>()
    };
    let warm = model.warmup as usize;
    let answered: u64 = answered_by_second[warm..].iter().sum();
    Outcomes {
        goodput: answered as f64 / capacity_in(model.warmup, end),
        shed: shed as f64 / arrivals.max(1) as f64,
        p50: percentile(&mut latencies, 0.5),
        p99: percentile(&mut latencies, 0.99),
        queued_p99: percentile(&mut queued, 0.99),
        limit_by_second: limit_area,
        goodput_by_second: (0..seconds)
            .map(|s| answered_by_second[s] as f64 / capacity_in(s as f64, s as f64 + 1.0))
            .collect(),
    }
}
