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

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: Model = Model {
        service: 0.01,
        deadline: 10.0,
        warmup: 10.0,
    };

    fn steady(workers: u64, load: f64, seconds: f64) -> Scenario {
        Scenario {
            name: "steady",
            load,
            workers: vec![(0.0, workers)],
            slowdown: Vec::new(),
            seconds,
        }
    }

    fn near(what: &str, value: f64, expected: f64, tolerance: f64) {
        assert!(
            (value - expected).abs() <= tolerance,
            "{what}: {value} (expected {expected} +- {tolerance})"
        );
    }

    fn mean(values: &[f64]) -> f64 {
        values.iter().sum::<f64>() / values.len() as f64
    }

    /// A limit of one request per worker makes the server a loss system (M/M/C/C): it
    /// sheds what Erlang's B formula says, and whatever is admitted is served at once.
    #[test]
    fn a_limit_at_the_workers_sheds_what_erlang_b_says() {
        let outcomes = run(MODEL, &steady(10, 0.5, 130.0), Limiter::Static(10), 1);
        // B(10 servers, 5 erlangs) = 0.01838.
        near("shed", outcomes.shed, 0.01838, 0.004);
        near("goodput", outcomes.goodput, 0.5 * (1.0 - 0.01838), 0.01);
        // No wait: latency is the service time, exponential with mean 10 ms.
        assert_eq!(outcomes.queued_p99, 0.0);
        near("p50", outcomes.p50, 0.01 * 2f64.ln(), 0.0005);
        near("p99", outcomes.p99, 0.01 * 100f64.ln(), 0.004);
        // The limit's area second by second (the last is cut short by the run's end).
        let (last, whole) = outcomes.limit_by_second.split_last().unwrap();
        assert!(whole.iter().all(|limit| (limit - 10.0).abs() < 1e-9));
        assert!(*last > 9.9 && *last <= 10.0, "{last}");
    }

    /// Unlimited, one worker at half load queues as M/M/1 does: time in the system
    /// exponential with mean 2 S, a wait longer than t with probability 0.5 e^(-t / 2 S).
    #[test]
    fn one_unlimited_worker_queues_as_m_m_1_says() {
        let outcomes = run(MODEL, &steady(1, 0.5, 610.0), Limiter::None, 2);
        let mean_time = 2.0 * MODEL.service;
        near("p50", outcomes.p50, mean_time * 2f64.ln(), 0.08 * mean_time);
        near(
            "p99",
            outcomes.p99,
            mean_time * 100f64.ln(),
            0.4 * mean_time,
        );
        near(
            "queued p99",
            outcomes.queued_p99,
            mean_time * 50f64.ln(),
            0.4 * mean_time,
        );
        near("goodput", outcomes.goodput, 0.5, 0.01);
        assert_eq!(outcomes.shed, 0.0);
        assert!(outcomes.limit_by_second.iter().all(|limit| limit.is_nan()));
        // Twice as slow throughout, at half the load: the same queue in multiples of the
        // slower service time, so the wait reads the same once scaled back, and the time
        // in the system is twice as long.
        let slowed = Scenario {
            slowdown: vec![(0.0, 2.0)],
            ..steady(1, 0.25, 610.0)
        };
        let outcomes = run(MODEL, &slowed, Limiter::None, 2);
        near(
            "slowed p50",
            outcomes.p50,
            2.0 * mean_time * 2f64.ln(),
            0.16 * mean_time,
        );
        near(
            "queued p99",
            outcomes.queued_p99,
            mean_time * 50f64.ln(),
            0.4 * mean_time,
        );
    }

    /// Only what follows the warm-up is measured: service three times as slow from its
    /// end sheds what B(10 servers, 15 erlangs) says, not what the first seconds did.
    #[test]
    fn only_what_follows_the_warm_up_is_measured() {
        let slowed = Scenario {
            slowdown: vec![(MODEL.warmup, 3.0)],
            ..steady(10, 0.5, 70.0)
        };
        let outcomes = run(MODEL, &slowed, Limiter::Static(10), 6);
        near("shed", outcomes.shed, 0.4103, 0.02);
    }

    /// An adaptive limit runs on the simulation's clock: from a limit of 1 it finds the
    /// ten workers.
    #[test]
    fn an_adaptive_limit_runs_on_the_simulated_clock() {
        let algorithm = Box::new(admission_core::adaptive::Gradient::default());
        let outcomes = run(
            MODEL,
            &steady(10, 0.9, 40.0),
            Limiter::Adaptive(algorithm, 1),
            7,
        );
        let settled = &outcomes.limit_by_second[30..39];
        assert!(settled.iter().all(|limit| *limit >= 8.0), "{settled:?}");
    }

    /// Overloaded three times over with no limit, clients give up at their deadline: no
    /// latency is longer, and the server still does a full day's work.
    #[test]
    fn a_client_gives_up_at_its_deadline() {
        let model = Model {
            deadline: 0.05,
            ..MODEL
        };
        let outcomes = run(model, &steady(2, 3.0, 40.0), Limiter::None, 3);
        near("p99", outcomes.p99, model.deadline, 1e-6);
        near("goodput", outcomes.goodput, 1.0, 0.05);
    }

    /// The capacity present follows the scenario: workers doubling halve the share the
    /// same load takes; a slowdown of 1.5 raises it by as much.
    #[test]
    fn goodput_is_a_share_of_the_capacity_present_second_by_second() {
        let scenario = Scenario {
            name: "changes",
            load: 0.5,
            workers: vec![(0.0, 10), (60.0, 20)],
            slowdown: vec![(120.0, 1.5)],
            seconds: 180.0,
        };
        assert_eq!(scenario.changes(), [60.0, 120.0]);
        // A slowdown from the start is no change.
        let slow_from_start = Scenario {
            slowdown: vec![(0.0, 2.0)],
            ..scenario.clone()
        };
        assert_eq!(slow_from_start.changes(), [60.0]);
        assert_eq!(
            [0.0, 59.9, 60.0, 119.0, 150.0].map(|t| scenario.workers_at(t)),
            [10, 10, 20, 20, 20]
        );
        assert_eq!(
            [0.0, 119.9, 120.0].map(|t| scenario.slowdown_at(t)),
            [1.0, 1.0, 1.5]
        );
        let outcomes = run(MODEL, &scenario, Limiter::None, 4);
        let by_second = &outcomes.goodput_by_second;
        near("before", mean(&by_second[10..60]), 0.5, 0.02);
        near("doubled", mean(&by_second[65..120]), 0.25, 0.01);
        near("slowed", mean(&by_second[125..180]), 0.375, 0.015);
        // The second of each change is the new capacity's from its first millisecond.
        near("second 60", by_second[60], 0.25, 0.08);
        near("second 120", by_second[120], 0.375, 0.08);
    }

    #[test]
    fn the_draws_and_the_percentiles() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
        let draws: Vec<f64> = (0..100_000).map(|_| exponential(&mut rng, 2.0)).collect();
        assert!(draws.iter().all(|d| *d > 0.0));
        near("mean", mean(&draws), 2.0, 0.02);
        let mut values = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(
            [0.0, 0.5, 0.74, 1.0].map(|p| percentile(&mut values, p)),
            [1.0, 3.0, 4.0, 5.0]
        );
        assert_eq!(percentile(&mut [], 0.5), 0.0);
    }
}
