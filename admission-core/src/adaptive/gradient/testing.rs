//! What the mechanisms' tests build their rounds and windows from.

use std::time::Duration;

use super::Round;
use crate::adaptive::{Outcome, Window};

/// A saturated round at `limit` (its work filled it) of `samples` answered at
/// `throughput` a second, its mean's relative noise `noise` (its mean latency, Little's
/// law's).
pub(super) fn round(limit: f64, samples: u64, throughput: f64, noise: f64) -> Round {
    Round {
        limit,
        window_limit: limit as u64,
        count: samples,
        mean: limit / throughput,
        noise,
        throughput,
        max_in_flight: limit as u64,
        elapsed: samples as f64 / throughput,
        binds: true,
        saturated: true,
    }
}

/// A window of 100 ms at `limit` holding, for each `(ms, count)`, `count` latencies of
/// `ms` milliseconds.
pub(super) fn window(limit: u64, latencies: &[(f64, u64)]) -> Window {
    let mut window = Window::new(limit, Duration::from_millis(100));
    for &(ms, count) in latencies {
        for _ in 0..count {
            window.add(Duration::from_secs_f64(ms / 1e3), Outcome::Success, limit);
        }
    }
    window
}

/// A skewed window: nine in ten requests take 1 ms, one in ten 50 ms (median about
/// 1 ms, mean 5.9 ms, CV about 2.5).
pub(super) fn skewed(limit: u64) -> Window {
    window(limit, &[(1.0, 90), (50.0, 10)])
}
