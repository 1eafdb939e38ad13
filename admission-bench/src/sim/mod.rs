//! A deterministic, virtual-time simulation of a server behind a count limit: the
//! evidence for `admission_core::adaptive` (the `adaptive` binary prints it).
//!
//! The model: a server of `C` workers (a count that may change mid-run), first-come
//! first-served; requests beyond `C` wait in the server's own queue. Service times have
//! mean `S` and a chosen distribution ([`Service`](crate::sim::Service): exponential, lognormal, Pareto, or a
//! mixture of short and long requests), and may slow down in steps or drift (a
//! dependency slowing). Open-loop Poisson arrivals, at a rate that may change in steps
//! (bursts), pass the limiter (a real [`CountLedger`](admission_core::CountLedger), its
//! capacity fixed or driven by an [`AdaptiveLimit`](admission_core::AdaptiveLimit) on
//! the simulation's clock) or are shed, and shed requests are not retried. A client
//! gives up at its deadline: the request is cancelled, in the queue or in service (as an
//! async server drops a request's future when its client goes away), its permit
//! released, and the limiter told `Gone`. Goodput counts answers (every answer is
//! within the deadline, since late ones are cancelled) as a share of what could have
//! been answered: second by second, the arrivals or the capacity present, whichever is
//! fewer.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use admission_core::adaptive::{AdaptiveLimit, Algorithm, Outcome};
use admission_core::{Acquire, CountLedger, CountPermit};
use rand_core::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

mod events;
mod scenario;
#[cfg(test)]
mod tests;

use events::{Event, Events};
use scenario::next_arrival;
pub use scenario::{Scenario, Service};

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
    /// Answers, as a share of what could have been answered (second by second, the
    /// arrivals or the capacity present, whichever is fewer).
    pub goodput: f64,
    /// Shed, as a share of arrivals.
    pub shed: f64,
    /// Latency of admitted requests (answered, or given up at the deadline), seconds.
    pub p50: f64,
    /// See `p50`.
    pub p99: f64,
    /// Time admitted requests waited in the server's queue, p99, in multiples of `S`: each
    /// wait is scaled by the slowdown in force when the request arrived, so that it reads
    /// in multiples of the service time of its day.
    pub queued_p99: f64,
    /// Time from arrival to refusal of shed requests, p99, seconds (0 for a refusal at
    /// once; a request that waited for a slot and was refused counts its wait).
    pub refused_p99: f64,
    /// The limit's average over each second of the run (for a static limit, itself).
    pub limit_by_second: Vec<f64>,
    /// Goodput of each second of the run, as `goodput` counts it.
    pub goodput_by_second: Vec<f64>,
    /// The mean latency of the requests answered in each second, seconds (`NaN` for a
    /// second with none).
    pub latency_by_second: Vec<f64>,
}

/// An admission wait in front of the limit: [`CountLedger::set_max_waiting`] waiters,
/// each for at most `max_wait` seconds (and never past its client's deadline), and, with
/// a `target`, refused once the queue stands and a newer request takes its place
/// ([`CountLedger::set_standing_queue`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Wait {
    /// How many may wait at once.
    pub max_waiting: usize,
    /// The longest a request waits for a slot, seconds.
    pub max_wait: f64,
    /// The standing-queue rule's interval, seconds: after this long without emptying,
    /// the queue stands (served newest first).
    pub interval: f64,
    /// How long a request waits, once the queue stands, before a newer one takes its
    /// place, seconds; `None`: as long as `max_wait` (the queue is still served newest
    /// first).
    pub target: Option<f64>,
}

impl Wait {
    /// `max_waiting` waiters for at most `max_wait` seconds, with the ledger's default
    /// standing-queue rule (100 ms, 5 ms).
    pub const fn new(max_waiting: usize, max_wait: f64) -> Self {
        Self {
            max_waiting,
            max_wait,
            interval: 0.100,
            target: Some(0.005),
        }
    }
}

thread_local! {
    /// The simulation's clock, for the ledger's standing-queue rule: its epoch, and the
    /// time of the event being handled.
    static CLOCK: std::cell::Cell<(Option<Instant>, f64)> = const { std::cell::Cell::new((None, 0.0)) };
}

fn sim_now() -> Instant {
    let (epoch, t) = CLOCK.with(std::cell::Cell::get);
    epoch.expect("set by `run`") + Duration::from_secs_f64(t)
}

/// A request in flight, in a slot reused once it ends (`permit` is `None` then).
struct Request {
    generation: u64,
    arrived: f64,
    started: Option<f64>,
    permit: Option<CountPermit>,
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let index = ((values.len() as f64 - 1.0) * p).round() as usize;
    *values.select_nth_unstable_by(index, f64::total_cmp).1
}

/// Runs one scenario under one limiter with one seed.
pub fn run(scenario: &Scenario, limiter: Limiter, seed: u64) -> Outcomes {
    run_waiting(scenario, limiter, None, seed)
}

/// [`run`], with an admission wait in front of the limit, if given (its standing-queue
/// rule on the simulation's clock).
pub fn run_waiting(
    scenario: &Scenario,
    limiter: Limiter,
    wait: Option<Wait>,
    seed: u64,
) -> Outcomes {
    run_inner(scenario, limiter, wait, sim_now, seed)
}

/// [`run_waiting`], with the standing-queue rule reading `clock` (a clock that never moves
/// keeps the queue first come first served).
pub fn run_waiting_with_clock(
    scenario: &Scenario,
    limiter: Limiter,
    wait: Wait,
    clock: fn() -> Instant,
    seed: u64,
) -> Outcomes {
    run_inner(scenario, limiter, Some(wait), clock, seed)
}

fn run_inner(
    scenario: &Scenario,
    limiter: Limiter,
    wait: Option<Wait>,
    clock: fn() -> Instant,
    seed: u64,
) -> Outcomes {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let epoch = Instant::now();
    let at = |t: f64| epoch + Duration::from_secs_f64(t);
    CLOCK.with(|clock| clock.set((Some(epoch), 0.0)));
    let ledger = CountLedger::new(0).expect("unlimited");
    if let Some(wait) = wait {
        ledger.set_max_waiting(wait.max_waiting);
        ledger.set_wait_clock(clock);
        let target = wait.target.unwrap_or(wait.max_wait);
        ledger.set_standing_queue(
            Duration::from_secs_f64(wait.interval),
            Duration::from_secs_f64(target),
        );
    }
    // Each waiter, with when it arrived and when its wait runs out.
    let mut waiting: Vec<(Acquire, f64, f64)> = Vec::new();
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
    let base = scenario.workers[0].1 as f64 / scenario.service;
    let seconds = scenario.seconds.ceil() as usize;

    let mut events = Events::default();
    let key = |t: f64| (t * 1e9) as u64;
    let mut requests: Vec<Request> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut generation = 0u64;
    let mut queue: VecDeque<(usize, u64)> = VecDeque::new();
    let mut busy = 0u64;
    if scenario.bursts.is_some() {
        events.push(0, Event::Burst);
    } else {
        let first = next_arrival(&mut rng, scenario, base, 0.0);
        if first.is_finite() {
            events.push(key(first), Event::Arrival);
        }
    }

    let (mut arrivals, mut shed) = (0u64, 0u64);
    // How long each shed request (measured) took to be refused.
    let mut refusals: Vec<f64> = Vec::new();
    let mut arrived_by_second = vec![0u64; seconds];
    let mut latencies = Vec::new();
    let mut queued = Vec::new();
    let mut answered_by_second = vec![0u64; seconds];
    let mut latency_by_second = vec![0f64; seconds];
    let mut limit_area = vec![0f64; seconds];
    let (mut last_t, mut last_limit) = (0.0, ledger.capacity() as f64);
    let end = scenario.seconds;
    let warmup = scenario.warmup;

    while let Some((time, event)) = events.pop() {
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
        CLOCK.with(|clock| clock.set((Some(epoch), t)));
        let measured = t >= warmup;
        // Admits a request that arrived at `arrived` with `permit`: into the server's
        // queue, its client's deadline counted from its arrival.
        macro_rules! admit {
            ($arrived:expr, $permit:expr) => {{
                generation += 1;
                let request = Request {
                    generation,
                    arrived: $arrived,
                    started: None,
                    permit: Some($permit),
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
                events.push(key($arrived + scenario.deadline), deadline);
                queue.push_back((id, generation));
            }};
        }
        let arrivals_now = match event {
            Event::Arrival => {
                let next = next_arrival(&mut rng, scenario, base, t);
                if next.is_finite() {
                    events.push(key(next), Event::Arrival);
                }
                1
            }
            Event::Burst => {
                let (period, size) = scenario.bursts.expect("bursts");
                events.push(key(t + period), Event::Burst);
                size
            }
            _ => 0,
        };
        for _ in 0..arrivals_now {
            arrived_by_second[t as usize] += 1;
            if measured {
                arrivals += 1;
            }
            let outcome = match wait {
                None => Poll::Ready(ledger.try_acquire()),
                Some(wait) => {
                    let mut acquire = ledger.acquire();
                    match Pin::new(&mut acquire).poll(&mut Context::from_waker(Waker::noop())) {
                        Poll::Pending => {
                            let until = t + wait.max_wait.min(scenario.deadline);
                            events.push(key(until), Event::WaitEnd);
                            waiting.push((acquire, t, until));
                            Poll::Pending
                        }
                        ready => ready,
                    }
                }
            };
            match outcome {
                Poll::Ready(Ok(permit)) => admit!(t, permit),
                Poll::Ready(Err(_)) => {
                    if measured {
                        shed += 1;
                        refusals.push(0.0);
                    }
                }
                Poll::Pending => {}
            }
        }
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
            if request.arrived >= warmup {
                latencies.push(latency);
                let waited = request.started.unwrap_or(t) - request.arrived;
                queued.push(waited / scenario.slowdown_at(request.arrived));
            }
        };
        match event {
            Event::Arrival | Event::Burst | Event::WaitEnd => {}
            Event::Done(id, generation) => {
                if !live(&requests, id, generation) {
                    continue; // given up while in service: its worker moved on then
                }
                latency_by_second[t as usize] += t - requests[id].arrived;
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
                finish(id, Outcome::Gone, &mut requests);
            }
        }
        // Waiters: served by the releases above, or out of time.
        if !waiting.is_empty() {
            let mut still = Vec::with_capacity(waiting.len());
            for (mut acquire, arrived, until) in waiting.drain(..) {
                match Pin::new(&mut acquire).poll(&mut Context::from_waker(Waker::noop())) {
                    Poll::Ready(Ok(permit)) => admit!(arrived, permit),
                    Poll::Ready(Err(_)) => {
                        if arrived >= warmup {
                            shed += 1;
                            refusals.push(t - arrived);
                        }
                    }
                    Poll::Pending if t >= until - 1e-9 => {
                        // Out of time: it stops waiting (and is refused).
                        drop(acquire);
                        if arrived >= warmup {
                            shed += 1;
                            refusals.push(t - arrived);
                        }
                    }
                    Poll::Pending => still.push((acquire, arrived, until)),
                }
            }
            waiting = still;
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
            let mean = scenario.service * scenario.slowdown_at(t);
            let done = t + scenario.distribution.draw(&mut rng, mean);
            events.push(key(done), Event::Done(next, generation));
        }
        last_limit = match ledger.capacity() {
            0 => f64::NAN,
            limit => limit as f64,
        };
    }

    // What could have been answered, second by second: the arrivals or the capacity
    // present (integrated by milliseconds), whichever is fewer.
    let possible: Vec<f64> = (0..seconds)
        .map(|second| {
            let to = (second as f64 + 1.0).min(end);
            let steps = ((to - second as f64) * 1000.0).round() as usize;
            let capacity = (0..steps)
                .map(|i| scenario.capacity_at(second as f64 + i as f64 / 1000.0) / 1000.0)
                .sum::<f64>();
            capacity.min(arrived_by_second[second] as f64)
        })
        .collect();
    let warm = warmup as usize;
    let answered: u64 = answered_by_second[warm..].iter().sum();
    Outcomes {
        goodput: answered as f64 / possible[warm..].iter().sum::<f64>(),
        shed: shed as f64 / arrivals.max(1) as f64,
        p50: percentile(&mut latencies, 0.5),
        p99: percentile(&mut latencies, 0.99),
        queued_p99: percentile(&mut queued, 0.99) / scenario.service,
        refused_p99: percentile(&mut refusals, 0.99),
        limit_by_second: limit_area,
        goodput_by_second: (0..seconds)
            .map(|s| answered_by_second[s] as f64 / possible[s].max(1.0))
            .collect(),
        latency_by_second: (0..seconds)
            .map(|s| match answered_by_second[s] {
                0 => f64::NAN,
                answered => latency_by_second[s] / answered as f64,
            })
            .collect(),
    }
}
