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
//! released, and the limiter told `Dropped`. Goodput counts answers (every answer is
//! within the deadline, since late ones are cancelled) as a share of what could have
//! been answered: second by second, the arrivals or the capacity present, whichever is
//! fewer.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use admission_core::adaptive::{AdaptiveLimit, Algorithm, Outcome};
use admission_core::{Acquire, CountLedger, CountPermit};
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// The distribution of service times, each with the scenario's mean.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Service {
    /// Exponential (coefficient of variation 1).
    Exponential,
    /// Lognormal with this coefficient of variation.
    Lognormal {
        /// Standard deviation over mean.
        cv: f64,
    },
    /// Pareto with this shape (a tail that falls as `x^-shape`; above 2 for a variance).
    Pareto {
        /// The tail index.
        shape: f64,
    },
    /// Two kinds of request, each exponential: a `share` of them `factor` times longer
    /// than the rest.
    Mixture {
        /// The long ones' share of requests.
        share: f64,
        /// How many times longer they take.
        factor: f64,
    },
}

impl Service {
    /// One service time of mean `mean`.
    pub fn draw(self, rng: &mut Xoshiro256PlusPlus, mean: f64) -> f64 {
        match self {
            Self::Exponential => exponential(rng, mean),
            Self::Lognormal { cv } => {
                let sigma2 = (1.0 + cv * cv).ln();
                let mu = mean.ln() - sigma2 / 2.0;
                (mu + sigma2.sqrt() * normal(rng)).exp()
            }
            Self::Pareto { shape } => {
                let scale = mean * (shape - 1.0) / shape;
                scale / unit(rng).powf(1.0 / shape)
            }
            Self::Mixture { share, factor } => {
                let short = mean / (1.0 - share + share * factor);
                if unit(rng) <= share {
                    exponential(rng, short * factor)
                } else {
                    exponential(rng, short)
                }
            }
        }
    }
}

/// A scenario: the server, its load, and how both change.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Its name in the tables.
    pub name: String,
    /// Mean service time `S`, seconds.
    pub service: f64,
    /// The distribution of service times.
    pub distribution: Service,
    /// Arrival rate as a multiple of the initial capacity (`C / S` per second), from each
    /// time on (seconds). The first entry is from 0.
    pub load: Vec<(f64, f64)>,
    /// Capacity changes: from each time on (seconds), this many workers. The first entry
    /// is from 0.
    pub workers: Vec<(f64, u64)>,
    /// Service time changes: from each time on (seconds), service times this many times
    /// `S` (a dependency slowing down). Empty: `S` throughout.
    pub slowdown: Vec<(f64, f64)>,
    /// A slow drift on top of the steps: from `.0` to `.1` seconds the service time
    /// grows linearly to `.2` times, and stays there.
    pub drift: Option<(f64, f64, f64)>,
    /// The clients' deadline, seconds.
    pub deadline: f64,
    /// Seconds before measuring.
    pub warmup: f64,
    /// How long it runs (seconds of virtual time).
    pub seconds: f64,
    /// Arrivals in bursts instead of Poisson: every `.0` seconds, `.1` requests at once
    /// (the `load` steps are then not used).
    pub bursts: Option<(f64, u64)>,
}

impl Scenario {
    /// A steady scenario: `workers` workers with exponential service times of mean
    /// `service`, at `load`, clients giving up at 100 service times, measured after 5 s
    /// of a 15-s run. The other fields are to be set with struct update syntax.
    pub fn steady(name: impl Into<String>, workers: u64, service: f64, load: f64) -> Self {
        Self {
            name: name.into(),
            service,
            distribution: Service::Exponential,
            load: vec![(0.0, load)],
            workers: vec![(0.0, workers)],
            slowdown: Vec::new(),
            drift: None,
            deadline: 100.0 * service,
            warmup: 5.0,
            seconds: 15.0,
            bursts: None,
        }
    }

    /// The workers present at `t`.
    pub fn workers_at(&self, t: f64) -> u64 {
        step_at(&self.workers, t).unwrap_or(self.workers[0].1)
    }

    /// The load (a multiple of the initial capacity) at `t`.
    pub fn load_at(&self, t: f64) -> f64 {
        step_at(&self.load, t).unwrap_or(self.load[0].1)
    }

    /// How many times `S` service takes at `t`.
    pub fn slowdown_at(&self, t: f64) -> f64 {
        let step = step_at(&self.slowdown, t).unwrap_or(1.0);
        let drift = match self.drift {
            Some((from, to, factor)) if t > from => {
                let progress = ((t - from) / (to - from)).min(1.0);
                1.0 + (factor - 1.0) * progress
            }
            _ => 1.0,
        };
        step * drift
    }

    /// Whether the load never exceeds `at_most` times the capacity.
    pub fn light(&self, at_most: f64) -> bool {
        self.bursts.is_none()
            && self.load.iter().all(|(_, load)| *load <= at_most)
            && self.workers.iter().all(|(_, w)| *w >= self.workers[0].1)
            && self.slowdown.is_empty()
            && self.drift.is_none()
    }

    /// The times the capacity (workers or service time) changes after the start; a drift
    /// changes it from its start.
    pub fn changes(&self) -> Vec<f64> {
        let workers = self.workers.iter().skip(1).map(|(t, _)| *t);
        let slowdown = self.slowdown.iter().map(|(t, _)| *t).filter(|t| *t > 0.0);
        let drift = self.drift.map(|(from, _, _)| from);
        let mut changes: Vec<f64> = workers.chain(slowdown).chain(drift).collect();
        changes.sort_by(f64::total_cmp);
        changes
    }

    /// The capacity present (requests a second) at `t`.
    fn capacity_at(&self, t: f64) -> f64 {
        self.workers_at(t) as f64 / (self.service * self.slowdown_at(t))
    }
}

/// The value of the step function `steps` at `t`, if a step has begun.
fn step_at<T: Copy>(steps: &[(f64, T)], t: f64) -> Option<T> {
    steps
        .iter()
        .rev()
        .find(|(from, _)| t >= *from)
        .map(|(_, value)| *value)
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A worker finishes a request (a slot and its generation).
    Done(usize, u64),
    /// A request's client gives up.
    Deadline(usize, u64),
    /// A waiting request's wait may have run out.
    WaitEnd,
    Arrival,
    /// A burst of arrivals.
    Burst,
}

/// The run's events in time order: a heap, and beside it the clients' deadlines in a
/// queue kept sorted. A deadline is its request's arrival plus the scenario's deadline, so
/// each comes at or near the back; most are for requests long answered, and in the heap
/// they would make it many times larger (every admission of the last 100 S) and its
/// operations most of a run's cost. Taken in the order of `(time, event)`, as one heap
/// would give them.
#[derive(Default)]
struct Events {
    heap: BinaryHeap<Reverse<(u64, Event)>>,
    deadlines: VecDeque<(u64, Event)>,
}

impl Events {
    fn push(&mut self, time: u64, event: Event) {
        if let Event::Deadline(..) = event {
            let item = (time, event);
            let at = self.deadlines.iter().rposition(|d| *d <= item);
            self.deadlines.insert(at.map_or(0, |at| at + 1), item);
        } else {
            self.heap.push(Reverse((time, event)));
        }
    }

    fn pop(&mut self) -> Option<(u64, Event)> {
        match (self.heap.peek(), self.deadlines.front()) {
            (Some(Reverse(next)), Some(deadline)) if next < deadline => {
                self.heap.pop().map(|Reverse(next)| next)
            }
            (_, Some(_)) => self.deadlines.pop_front(),
            (_, None) => self.heap.pop().map(|Reverse(next)| next),
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

/// Uniform in (0, 1]: 53 random bits.
fn unit(rng: &mut Xoshiro256PlusPlus) -> f64 {
    ((rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
}

/// Exponential with mean `mean`.
fn exponential(rng: &mut Xoshiro256PlusPlus, mean: f64) -> f64 {
    -unit(rng).ln() * mean
}

/// Standard normal (Box-Muller; one of the pair).
fn normal(rng: &mut Xoshiro256PlusPlus) -> f64 {
    let (u, v) = (unit(rng), unit(rng));
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let index = ((values.len() as f64 - 1.0) * p).round() as usize;
    *values.select_nth_unstable_by(index, f64::total_cmp).1
}

/// The next arrival after `t` of a Poisson process whose rate follows the scenario's
/// load steps (memoryless: a draw that crosses a step is drawn again from the step).
fn next_arrival(rng: &mut Xoshiro256PlusPlus, scenario: &Scenario, base: f64, t: f64) -> f64 {
    let mut t = t;
    loop {
        let rate = scenario.load_at(t) * base;
        let next_step = scenario
            .load
            .iter()
            .map(|(from, _)| *from)
            .find(|from| *from > t)
            .unwrap_or(f64::INFINITY);
        if rate <= 0.0 {
            if next_step.is_infinite() {
                return f64::INFINITY;
            }
            t = next_step;
            continue;
        }
        let next = t + exponential(rng, 1.0 / rate);
        if next < next_step {
            return next;
        }
        t = next_step;
    }
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: f64 = 0.01;

    fn steady(workers: u64, load: f64, seconds: f64) -> Scenario {
        Scenario {
            deadline: 10.0,
            warmup: 10.0,
            seconds,
            ..Scenario::steady("steady", workers, S, load)
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

    /// The events come out in the order one heap of them all would give, deadlines pushed
    /// out of order (a waiter admitted late), at equal times and between pops included.
    #[test]
    fn events_come_in_the_order_of_one_heap() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
        let mut events = Events::default();
        let mut reference = BinaryHeap::new();
        let (mut popped, mut deadlines_popped) = (0, 0);
        for generation in 0..20_000u64 {
            if rng.next_u64() % 3 == 0 {
                let next = events.pop();
                assert_eq!(next, reference.pop().map(|Reverse(e)| e));
                popped += 1;
                deadlines_popped += usize::from(matches!(next, Some((_, Event::Deadline(..)))));
                continue;
            }
            // Times from a few values, so that many are equal.
            let time = generation / 4 + rng.next_u64() % 8;
            let id = (rng.next_u64() % 16) as usize;
            let event = match rng.next_u64() % 4 {
                0 | 1 => Event::Deadline(id, generation),
                2 => Event::Done(id, generation),
                _ => Event::WaitEnd,
            };
            events.push(time, event);
            reference.push(Reverse((time, event)));
        }
        while let Some(Reverse(expected)) = reference.pop() {
            assert_eq!(events.pop(), Some(expected));
            popped += 1;
        }
        assert_eq!(events.pop(), None);
        assert!(
            popped > 10_000 && deadlines_popped > 1_000,
            "{popped}, {deadlines_popped}"
        );
    }

    /// A limit of one request per worker makes the server a loss system (M/M/C/C): it
    /// sheds what Erlang's B formula says, and whatever is admitted is served at once.
    #[test]
    fn a_limit_at_the_workers_sheds_what_erlang_b_says() {
        let outcomes = run(&steady(10, 0.5, 130.0), Limiter::Static(10), 1);
        // B(10 servers, 5 erlangs) = 0.01838.
        near("shed", outcomes.shed, 0.01838, 0.004);
        // Below capacity, what could be answered is what arrived.
        near("goodput", outcomes.goodput, 1.0 - 0.01838, 0.006);
        // No wait: latency is the service time, exponential with mean 10 ms.
        assert_eq!(outcomes.queued_p99, 0.0);
        near("p50", outcomes.p50, S * 2f64.ln(), 0.0005);
        near("p99", outcomes.p99, S * 100f64.ln(), 0.004);
        // The limit's area second by second (the last is cut short by the run's end).
        let (last, whole) = outcomes.limit_by_second.split_last().unwrap();
        assert!(whole.iter().all(|limit| (limit - 10.0).abs() < 1e-9));
        assert!(*last > 9.9 && *last <= 10.0, "{last}");
    }

    /// Unlimited, one worker at half load queues as M/M/1 does: time in the system
    /// exponential with mean 2 S, a wait longer than t with probability 0.5 e^(-t / 2 S).
    #[test]
    fn one_unlimited_worker_queues_as_m_m_1_says() {
        let outcomes = run(&steady(1, 0.5, 610.0), Limiter::None, 2);
        let mean_time = 2.0 * S;
        near("p50", outcomes.p50, mean_time * 2f64.ln(), 0.08 * mean_time);
        near(
            "p99",
            outcomes.p99,
            mean_time * 100f64.ln(),
            0.4 * mean_time,
        );
        // In multiples of S.
        near("queued p99", outcomes.queued_p99, 2.0 * 50f64.ln(), 0.8);
        near("goodput", outcomes.goodput, 1.0, 0.01);
        assert_eq!(outcomes.shed, 0.0);
        assert!(outcomes.limit_by_second.iter().all(|limit| limit.is_nan()));
        // Twice as slow throughout, at half the load: the same queue in multiples of the
        // slower service time, so the wait reads the same once scaled back, and the time
        // in the system is twice as long.
        let slowed = Scenario {
            slowdown: vec![(0.0, 2.0)],
            ..steady(1, 0.25, 610.0)
        };
        let outcomes = run(&slowed, Limiter::None, 2);
        near(
            "slowed p50",
            outcomes.p50,
            2.0 * mean_time * 2f64.ln(),
            0.16 * mean_time,
        );
        near("queued p99", outcomes.queued_p99, 2.0 * 50f64.ln(), 0.8);
    }

    /// Only what follows the warm-up is measured: service three times as slow from its
    /// end sheds what B(10 servers, 15 erlangs) says, not what the first seconds did.
    #[test]
    fn only_what_follows_the_warm_up_is_measured() {
        let slowed = Scenario {
            slowdown: vec![(10.0, 3.0)],
            ..steady(10, 0.5, 70.0)
        };
        let outcomes = run(&slowed, Limiter::Static(10), 6);
        near("shed", outcomes.shed, 0.4103, 0.02);
    }

    /// An adaptive limit runs on the simulation's clock: from a limit of 1 it finds the
    /// ten workers.
    #[test]
    fn an_adaptive_limit_runs_on_the_simulated_clock() {
        let algorithm = Box::new(admission_core::adaptive::Gradient::default());
        let outcomes = run(&steady(10, 0.9, 40.0), Limiter::Adaptive(algorithm, 1), 7);
        let settled = &outcomes.limit_by_second[30..39];
        assert!(settled.iter().all(|limit| *limit >= 8.0), "{settled:?}");
    }

    /// Overloaded three times over with no limit, clients give up at their deadline: no
    /// latency is longer, and the server still does a full day's work.
    #[test]
    fn a_client_gives_up_at_its_deadline() {
        let scenario = Scenario {
            deadline: 0.05,
            ..steady(2, 3.0, 40.0)
        };
        let outcomes = run(&scenario, Limiter::None, 3);
        near("p99", outcomes.p99, scenario.deadline, 1e-6);
        near("goodput", outcomes.goodput, 1.0, 0.05);
    }

    /// What could be answered follows the scenario second by second: the capacity
    /// present while overloaded (workers doubling halve the share five permits serve; a
    /// slowdown slows the permits and the capacity alike), the arrivals while not.
    #[test]
    fn goodput_is_a_share_of_what_could_be_answered_second_by_second() {
        let scenario = Scenario {
            load: vec![(0.0, 3.0), (180.0, 0.2)],
            workers: vec![(0.0, 10), (60.0, 20)],
            slowdown: vec![(120.0, 1.5)],
            deadline: 0.1,
            ..steady(10, 3.0, 240.0)
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
        assert_eq!(
            [0.0, 179.9, 180.0].map(|t| scenario.load_at(t)),
            [3.0, 3.0, 0.2]
        );
        let outcomes = run(&scenario, Limiter::Static(5), 4);
        let by_second = &outcomes.goodput_by_second;
        near("before", mean(&by_second[10..60]), 0.5, 0.02);
        near("doubled", mean(&by_second[65..120]), 0.25, 0.01);
        near("slowed", mean(&by_second[125..180]), 0.25, 0.01);
        // 200 a second at 15 ms is 3 erlangs on 5 permits: B(5, 3) = 0.110 are shed.
        near("light", mean(&by_second[185..240]), 0.89, 0.02);
        // The second of each change is the new capacity's from its first millisecond.
        near("second 60", by_second[60], 0.25, 0.05);
    }

    /// A drift grows the service time linearly, and counts as a change from its start.
    #[test]
    fn a_drift_slows_the_service_linearly() {
        let scenario = Scenario {
            slowdown: vec![(0.0, 2.0)],
            drift: Some((10.0, 30.0, 3.0)),
            ..steady(4, 0.5, 40.0)
        };
        assert_eq!(scenario.changes(), [10.0]);
        assert_eq!(
            [5.0, 10.0, 20.0, 30.0, 35.0].map(|t| scenario.slowdown_at(t)),
            [2.0, 2.0, 4.0, 6.0, 6.0]
        );
        assert!(!scenario.light(1.0));
        assert!(steady(4, 0.5, 10.0).light(0.5));
        assert!(!steady(4, 0.6, 10.0).light(0.5));
    }

    /// Arrivals follow the load's steps: a second at 0 has none, a second at twice the
    /// rate twice as many.
    #[test]
    fn arrivals_follow_the_load_steps() {
        let scenario = Scenario {
            load: vec![(0.0, 1.0), (100.0, 0.0), (200.0, 2.0)],
            ..steady(10, 1.0, 300.0)
        };
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(9);
        let (mut t, mut counts) = (0.0, [0u64; 3]);
        loop {
            t = next_arrival(&mut rng, &scenario, 1000.0, t);
            if t >= 300.0 {
                break;
            }
            counts[(t / 100.0) as usize] += 1;
        }
        assert_eq!(counts[1], 0);
        near("first", counts[0] as f64, 100_000.0, 1500.0);
        near("third", counts[2] as f64, 200_000.0, 2000.0);
        let silent = Scenario {
            load: vec![(0.0, 0.0)],
            ..scenario
        };
        assert_eq!(next_arrival(&mut rng, &silent, 1000.0, 0.0), f64::INFINITY);
    }

    /// Each distribution has the mean asked for, and the spread it names.
    #[test]
    fn the_service_distributions() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
        let mut moments = |service: Service, draws: usize| {
            let values: Vec<f64> = (0..draws).map(|_| service.draw(&mut rng, 2.0)).collect();
            let m = mean(&values);
            let var = values.iter().map(|v| (v - m).powi(2)).sum::<f64>() / draws as f64;
            (m, var.sqrt() / m)
        };
        let (m, cv) = moments(Service::Exponential, 200_000);
        near("exponential mean", m, 2.0, 0.02);
        near("exponential cv", cv, 1.0, 0.02);
        let (m, cv) = moments(Service::Lognormal { cv: 2.0 }, 400_000);
        near("lognormal mean", m, 2.0, 0.04);
        near("lognormal cv", cv, 2.0, 0.25);
        let (m, _) = moments(Service::Pareto { shape: 2.5 }, 400_000);
        near("pareto mean", m, 2.0, 0.04);
        let mixture = Service::Mixture {
            share: 0.1,
            factor: 25.0,
        };
        let (m, cv) = moments(mixture, 400_000);
        near("mixture mean", m, 2.0, 0.04);
        // A tenth 25 times longer: E[X²] = 2 (0.9 a² + 0.1 (25 a)²), a = 2 / 3.4.
        let a: f64 = 2.0 / 3.4;
        let expected = (2.0 * (0.9 * a * a + 0.1 * 625.0 * a * a) - 4.0).sqrt() / 2.0;
        near("mixture cv", cv, expected, 0.05);
        let draws: Vec<f64> = (0..10_000).map(|_| normal(&mut rng)).collect();
        near("normal mean", mean(&draws), 0.0, 0.03);
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

    /// Bursts: 20 at once every 100 ms against 4 workers of 10 ms (capacity 400/s, 200
    /// arrivals/s). Shed at once at 4, each burst loses all but 4: 40/s served; waiting,
    /// every request of the burst is served within the burst's 50 ms.
    #[test]
    fn bursts_arrive_together_and_a_wait_serves_what_shedding_loses() {
        let scenario = Scenario {
            bursts: Some((0.1, 20)),
            ..steady(4, 1.0, 20.0)
        };
        let shed = run(&scenario, Limiter::Static(4), 5);
        assert!(
            (shed.goodput - 0.2).abs() < 0.01,
            "4 of each 20: {}",
            shed.goodput
        );
        assert!((shed.shed - 0.8).abs() < 0.01, "{}", shed.shed);
        let wait = Wait::new(20, 0.1);
        let waited = run_waiting(&scenario, Limiter::Static(4), Some(wait), 5);
        assert!(waited.goodput > 0.99, "{}", waited.goodput);
        assert_eq!(waited.shed, 0.0);
        // Beyond `max_waiting`, shed at once: 4 admitted, 8 waiting, 8 shed.
        let fewer = Wait::new(8, 0.1);
        let some = run_waiting(&scenario, Limiter::Static(4), Some(fewer), 5);
        assert!((some.goodput - 0.6).abs() < 0.01, "{}", some.goodput);
    }
}
