//! The scenarios the limiters run, and where the adaptive ones start.

use admission_bench::sim::{Scenario, Service};

const MS: f64 = 0.001;

pub(super) fn scenarios() -> Vec<Scenario> {
    let steady =
        |name: &str, workers, service, load| Scenario::steady(name, workers, service, load);
    let tuned = |name: &str, load| steady(name, 64, 10.0 * MS, load);
    let long = |name: &str, seconds, warmup| Scenario {
        seconds,
        warmup,
        ..tuned(name, 2.0)
    };
    vec![
        // The tuned case: 64 workers, exponential service of 10 ms.
        tuned("0.5x", 0.5),
        tuned("2x", 2.0),
        tuned("10x", 10.0),
        Scenario {
            workers: vec![(0.0, 64), (12.0, 32), (22.0, 64)],
            ..long("2x, capacity halves at 12 s, back at 22 s", 32.0, 5.0)
        },
        // A dependency slows down: every request takes twice as long, so the server's
        // throughput halves, but it still runs 64 at once: the right limit stays 64.
        Scenario {
            slowdown: vec![(12.0, 2.0), (22.0, 1.0)],
            ..long("2x, service time doubles at 12 s, back at 22 s", 32.0, 5.0)
        },
        // Heavy tails and mixtures: a window's mean is noisy.
        Scenario {
            distribution: Service::Lognormal { cv: 2.0 },
            ..tuned("lognormal CV 2, 2x", 2.0)
        },
        Scenario {
            distribution: Service::Lognormal { cv: 2.0 },
            ..tuned("lognormal CV 2, 10x", 10.0)
        },
        Scenario {
            distribution: Service::Pareto { shape: 2.1 },
            ..tuned("Pareto 2.1 (CV 2.2), 2x", 2.0)
        },
        Scenario {
            distribution: Service::Mixture {
                share: 0.1,
                factor: 25.0,
            },
            ..tuned("a tenth of requests 25x longer, 2x", 2.0)
        },
        // Service times from 1 ms to a few hundred: windows shorter than S. Measured
        // after 20 s (100 S; the tuned case's 5 s is 500 S): from C/6, the limit sees 50
        // answers a second, and a decision takes about a hundred.
        Scenario {
            warmup: 20.0,
            seconds: 50.0,
            ..steady("S = 200 ms, 2x", 64, 200.0 * MS, 2.0)
        },
        Scenario {
            seconds: 10.0,
            ..steady("S = 1 ms, C = 16, 2x", 16, MS, 2.0)
        },
        // From a handful of workers to hundreds.
        steady("C = 8, 2x", 8, 10.0 * MS, 2.0),
        steady("C = 8, 0.5x", 8, 10.0 * MS, 0.5),
        Scenario {
            seconds: 12.0,
            ..steady("C = 500, S = 20 ms, 2x", 500, 20.0 * MS, 2.0)
        },
        // Capacity down to a quarter and back.
        Scenario {
            workers: vec![(0.0, 64), (12.0, 16), (22.0, 64)],
            ..long(
                "2x, capacity falls to a quarter at 12 s, back at 22 s",
                32.0,
                5.0,
            )
        },
        // Bursty and stepped load.
        Scenario {
            load: (0..10)
                .map(|i| (3.0 * i as f64, if i % 2 == 0 { 5.0 } else { 0.3 }))
                .collect(),
            ..long("on-off: 3 s at 5x, 3 s at 0.3x", 30.0, 6.0)
        },
        Scenario {
            load: vec![
                (0.0, 0.5),
                (8.0, 1.0),
                (13.0, 2.0),
                (18.0, 4.0),
                (23.0, 1.0),
                (28.0, 0.5),
            ],
            ..long("steps: 0.5x, 1x, 2x, 4x, 1x, 0.5x every 5 s", 33.0, 5.0)
        },
        // A slow drift.
        Scenario {
            drift: Some((10.0, 30.0, 3.0)),
            ..long("2x, service time drifts up 3x from 10 s to 30 s", 40.0, 5.0)
        },
        // Clients that give up soon, and cancel.
        Scenario {
            deadline: 5.0 * 10.0 * MS,
            ..tuned("deadline 5 S, 2x", 2.0)
        },
        Scenario {
            deadline: 5.0 * 10.0 * MS,
            distribution: Service::Lognormal { cv: 2.0 },
            ..tuned("deadline 5 S, lognormal CV 2, 10x", 10.0)
        },
    ]
}

/// Flat latency, judged apart (`--flat`) until `Gradient` meets its targets there (#74):
/// every request takes the same time (a sleep, a cache hit), or that plus a timer's jitter
/// (a tenth of it), so the latency barely spreads; capacity to a quarter and back, and
/// back with the service slower (the latency at the old limit no longer answers to it).
pub(super) fn flat_scenarios() -> Vec<Scenario> {
    let long = |name: &str| Scenario {
        seconds: 32.0,
        warmup: 5.0,
        ..Scenario::steady(name, 64, 10.0 * MS, 2.0)
    };
    vec![
        Scenario {
            workers: vec![(0.0, 64), (12.0, 16), (22.0, 64)],
            distribution: Service::Constant { jitter: 0.0 },
            ..long("flat 10 ms, 2x, capacity falls to a quarter at 12 s, back at 22 s")
        },
        Scenario {
            workers: vec![(0.0, 64), (12.0, 16), (22.0, 64)],
            distribution: Service::Constant { jitter: 0.1 },
            ..long("flat 10 ms + timer jitter, 2x, capacity to a quarter at 12 s, back at 22 s")
        },
        Scenario {
            workers: vec![(0.0, 64), (12.0, 16), (22.0, 64)],
            slowdown: vec![(0.0, 1.0), (22.0, 1.5)],
            distribution: Service::Constant { jitter: 0.1 },
            ..long("flat + jitter, capacity to a quarter at 12 s, back 1.5x slower at 22 s")
        },
    ]
}

/// Where the adaptive limiters start: far below (C/6, at least 2) and far above (4C).
pub(super) fn starts(scenario: &Scenario) -> [u64; 2] {
    let c = scenario.workers[0].1;
    [(c / 6).max(2), 4 * c]
}
