//! What a scenario is: the server's workers and service times, the load, the clients'
//! deadlines; and the draws of arrivals and service times from them.

use rand_core::RngCore;
use rand_xoshiro::Xoshiro256PlusPlus;

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
    /// Every request the same time (a sleep, a cache hit), plus up to `jitter` of it more,
    /// uniform (a timer's granularity: 1 ms of a 40-ms sleep is 0.025).
    Constant {
        /// The most added, as a share of the mean.
        jitter: f64,
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
            Self::Constant { jitter } => {
                let base = mean / (1.0 + jitter / 2.0);
                base * (1.0 + jitter * unit(rng))
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
    pub(super) fn capacity_at(&self, t: f64) -> f64 {
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

/// Uniform in (0, 1]: 53 random bits.
pub(super) fn unit(rng: &mut Xoshiro256PlusPlus) -> f64 {
    ((rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
}

/// Exponential with mean `mean`.
pub(super) fn exponential(rng: &mut Xoshiro256PlusPlus, mean: f64) -> f64 {
    -unit(rng).ln() * mean
}

/// Standard normal (Box-Muller; one of the pair).
pub(super) fn normal(rng: &mut Xoshiro256PlusPlus) -> f64 {
    let (u, v) = (unit(rng), unit(rng));
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// The next arrival after `t` of a Poisson process whose rate follows the scenario's
/// load steps (memoryless: a draw that crosses a step is drawn again from the step).
pub(super) fn next_arrival(
    rng: &mut Xoshiro256PlusPlus,
    scenario: &Scenario,
    base: f64,
    t: f64,
) -> f64 {
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
