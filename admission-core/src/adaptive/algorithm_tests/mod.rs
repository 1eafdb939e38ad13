//! The algorithms against model windows: Gradient and AIMD, found, followed, bounded.
//!
//! Here the model servers the tests run them on; the tests by what they check.

use std::time::Duration;

use super::*;

mod changed;
mod descent;
mod growth;
mod law;
mod noise;
mod probe;
mod skew;
mod strand;
mod window;

const MS: Duration = Duration::from_millis(1);

/// A server of `capacity` workers and mean service time 10 ms, saturated: Little's law
/// gives the mean latency of a window at `limit`.
fn saturated(limit: u64, capacity: u64) -> Window {
    saturated_at(limit, capacity, 10 * MS)
}

/// `saturated`, with a mean service time of `service`.
fn saturated_at(limit: u64, capacity: u64, service: Duration) -> Window {
    let service = service.as_secs_f64();
    let latency = service * (limit as f64 / capacity as f64).max(1.0);
    let throughput = limit.min(capacity) as f64 / service;
    let elapsed = Duration::from_millis(100);
    let samples = (throughput * elapsed.as_secs_f64()) as u64;
    Window {
        samples,
        latency_total: Duration::from_secs_f64(latency) * samples as u32,
        max_in_flight: limit,
        limit,
        elapsed,
        ..Window::default()
    }
}

/// A server of `capacity` workers whose every request takes `service` seconds, give or
/// take 2% (a sleep, a cache hit: a flat latency): a window of 100 ms at `limit`, the
/// work filling it (Little's law gives the queue's wait).
pub(super) fn flat(limit: u64, capacity: u64, service: f64, seed: &mut u64) -> Window {
    let latency = service * (limit as f64 / capacity as f64).max(1.0);
    let samples = (limit.min(capacity) as f64 / service * 0.1).max(1.0) as u64;
    let mut window = Window::new(limit, Duration::from_millis(100));
    for _ in 0..samples {
        let jitter = 1.0 + 0.02 * normal(seed) / 3f64.sqrt();
        window.add(
            Duration::from_secs_f64(latency * jitter),
            Outcome::Success,
            limit,
        );
    }
    window
}

fn run(algorithm: &mut impl Algorithm, limit: u64, capacity: u64, windows: usize) -> u64 {
    run_at(algorithm, limit, capacity, 10 * MS, windows)
}

/// `run`, with a mean service time of `service`; the lowest limit set on the way too.
fn run_at(
    algorithm: &mut impl Algorithm,
    mut limit: u64,
    capacity: u64,
    service: Duration,
    windows: usize,
) -> u64 {
    for _ in 0..windows {
        limit = algorithm
            .update(&saturated_at(limit, capacity, service))
            .clamp(1, 10_000);
    }
    limit
}

/// A server whose queue takes time to drain: a window's samples are of work admitted a
/// latency before, under the limit in force then (Little's law at that limit).
struct Lagged {
    capacity: u64,
    service: f64,
    elapsed: Duration,
    history: Vec<u64>,
}

impl Lagged {
    fn new(capacity: u64, service: Duration, elapsed: Duration) -> Self {
        Self {
            capacity,
            service: service.as_secs_f64(),
            elapsed,
            history: Vec::new(),
        }
    }

    fn latency(&self, limit: u64) -> f64 {
        self.service * (limit as f64 / self.capacity as f64).max(1.0)
    }

    fn window(&mut self, limit: u64) -> Window {
        self.history.push(limit);
        let lag = (self.latency(limit) / self.elapsed.as_secs_f64()) as usize;
        let then = self.history[self.history.len() - 1 - lag.min(self.history.len() - 1)];
        let latency = self.latency(then);
        let throughput = then.min(self.capacity) as f64 / self.service;
        let samples = (throughput * self.elapsed.as_secs_f64()).max(1.0) as u64;
        spread_window(limit, samples, latency, 1.0, self.elapsed, then)
    }
}

/// A window of `samples` with mean latency `latency` seconds and coefficient of
/// variation `cv`.
fn spread_window(
    limit: u64,
    samples: u64,
    latency: f64,
    cv: f64,
    elapsed: Duration,
    in_flight: u64,
) -> Window {
    let micros = latency * 1e6;
    let squared = samples.div_ceil(8);
    let square = micros * micros * (1.0 + cv * cv) / 1024.0;
    Window {
        samples,
        latency_total: Duration::from_secs_f64(latency * samples as f64),
        max_in_flight: in_flight,
        limit,
        elapsed,
        spread: Spread {
            samples: squared,
            total: (micros * squared as f64) as u64,
            squares: (square * squared as f64) as u128,
            ..Spread::default()
        },
        ..Window::default()
    }
}

/// A deterministic standard normal-ish draw (four uniforms summed, scaled).
fn normal(state: &mut u64) -> f64 {
    let mut sum = 0.0;
    for _ in 0..4 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        sum += (*state >> 11) as f64 / (1u64 << 53) as f64;
    }
    (sum - 2.0) * 3f64.sqrt()
}

/// A window at `limit` of a server of `capacity` workers whose requests are mostly short,
/// a tenth 25 times longer (mean 10 ms): each request waits what the queue adds alike
/// (Little's law), and which requests are long is drawn by `seed`.
fn skewed(limit: u64, capacity: u64, seed: &mut u64) -> Window {
    mixed(limit, capacity, 10, seed)
}

/// `skewed`, with one request in `one_in` the long one (the mean latency and the queue's
/// wait as `skewed`'s).
fn mixed(limit: u64, capacity: u64, one_in: u64, seed: &mut u64) -> Window {
    served(limit, capacity, 10.0, seed, |state| {
        if (state >> 33) % one_in == 0 {
            250.0 / 3.4
        } else {
            10.0 / 3.4
        }
    })
}

/// A window at `limit` of a server of `capacity` workers at 10 ms a request, whose
/// latencies (ms) `service` draws from a 64-bit state stepped for each (a linear
/// congruential step: deterministic, and enough to vary the tail), plus the wait a queue
/// adds alike to each (Little's law, at a mean service time of `mean` ms).
fn served(
    limit: u64,
    capacity: u64,
    mean: f64,
    seed: &mut u64,
    service: impl Fn(u64) -> f64,
) -> Window {
    let wait = mean * (limit as f64 / capacity as f64 - 1.0).max(0.0);
    let samples = (limit.min(capacity) as f64 / 0.010 * 0.1) as u64;
    let mut window = Window::new(limit, Duration::from_millis(100));
    for _ in 0..samples {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        window.add(
            Duration::from_secs_f64((service(*seed) + wait) / 1e3),
            Outcome::Success,
            limit,
        );
    }
    window
}

/// A window at `limit` of a server of `capacity` workers with an exponential service of
/// mean `mean` ms (and the queue's wait, as `skewed`'s), drawn by `seed`.
fn exponential(limit: u64, capacity: u64, mean: f64, seed: &mut u64) -> Window {
    served(limit, capacity, mean, seed, |state| {
        -mean * (((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64).ln()
    })
}

/// `skewed`, just after the limit rose from `before`: the requests admitted in the new
/// slots that have ended within the window are the short ones (a long one takes most of
/// a window).
fn skewed_after(limit: u64, before: u64, capacity: u64, seed: &mut u64) -> Window {
    let window = skewed(limit, capacity, seed);
    let (now, then) = (limit.min(capacity), before.min(capacity));
    if now <= then {
        return window;
    }
    let fresh = window.samples * (now - then) / now;
    let mut biased = skewed(then, capacity, seed);
    biased.limit = limit;
    biased.max_in_flight = limit;
    for _ in 0..fresh {
        biased.add(
            Duration::from_secs_f64(10.0 / 3.4 / 1e3),
            Outcome::Success,
            limit,
        );
    }
    biased
}

/// Capacity halves as the load comes back from a pause: the round at the fall spans the
/// pause, so the work did not fill it, and the limit is cut on it (the latency rose
/// beyond doubt). Anchored before the fall, the rounds at the cut limit would read like a
/// slower service (a quarter less in flight, as much latency) and the estimate would
/// take their queued latency as the no-load one. `held` is the limit the rounds before
/// ran at, over a server of 64 (above 64, a queue); `paused` the mean latency of the
/// round that spans the pause.
fn after_a_pause(held: u64, paused: Duration) -> (Duration, u64) {
    let mut gradient = Gradient::default();
    run(&mut gradient, 64, 64, 300);
    let mut limit = 0;
    for _ in 0..5 {
        limit = gradient.update(&saturated(held, 64));
    }
    assert_eq!(gradient.probing(), None);
    // A second of few samples (a pause), at the end of which capacity halved.
    let pause = spread_window(limit, 600, paused.as_secs_f64(), 1.0, 1000 * MS, limit);
    let cut = gradient.update(&pause);
    assert!(cut * 5 < limit * 4, "cut from {limit} to {cut}");
    let limit = run(&mut gradient, cut, 32, 20);
    (gradient.no_load_latency().unwrap(), limit)
}

/// A window of 100 ms at `limit`, a server of `capacity` workers whose service times are
/// exponential with a mean of `service` seconds, each latency that plus `wait` (the queue
/// of a full server: each request waits for many to end, so about alike; a tenth's
/// spread). Drawn by `seed`.
fn drawn(limit: u64, capacity: u64, service: f64, wait: f64, seed: &mut u64) -> Window {
    let samples = (limit.min(capacity) as f64 / service * 0.1) as u64;
    let mut window = Window::new(limit, Duration::from_millis(100));
    let mut uniform = || {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((*seed >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    for _ in 0..samples {
        let latency = -service * uniform().ln() + wait * (0.9 + 0.2 * uniform());
        window.add(Duration::from_secs_f64(latency), Outcome::Success, limit);
    }
    window
}

/// Windows drawn (`drawn`) from `server(limit)`, its capacity, service and wait, until
/// the gradient's second probe begins (or, with `ends`, ends); the limit then. At most
/// 400 windows: a probe that never comes fails the test rather than hanging it.
fn to_second_probe(
    gradient: &mut Gradient,
    mut limit: u64,
    seed: &mut u64,
    ends: bool,
    server: impl Fn(u64) -> (u64, f64, f64),
) -> u64 {
    let mut probes = 0;
    for _ in 0..400 {
        let was = gradient.probing().is_some();
        let (capacity, service, wait) = server(limit);
        limit = gradient
            .update(&drawn(limit, capacity, service, wait, seed))
            .clamp(1, 10_000);
        let now = gradient.probing().is_some();
        if now != was && now != ends {
            probes += 1;
            if probes == 2 {
                return limit;
            }
        }
    }
    panic!("no second probe in 400 windows");
}

/// Contiguous runs of windows in which `gradient` probed (a descent's probes follow one
/// another), over `windows` windows of `server(limit, seed)`, started at `limit`.
fn probe_episodes(
    gradient: &mut Gradient,
    mut limit: u64,
    windows: usize,
    seed: &mut u64,
    server: impl Fn(u64, &mut u64) -> Window,
) -> Vec<(usize, usize)> {
    let mut episodes: Vec<(usize, usize)> = Vec::new();
    for window in 0..windows {
        limit = gradient.update(&server(limit, seed)).clamp(1, 10_000);
        if gradient.probing().is_some() {
            match episodes.last_mut() {
                Some((_, end)) if *end + 1 == window => *end = window,
                _ => episodes.push((window, window)),
            }
        }
    }
    episodes
}
