//! Growth: the law's step near the knee, faster steps where the round finds no queue or
//! capacity comes back.

use super::super::testing::round;
use super::*;

/// A round at a limit of 32, full, whose latency is `latency` times the estimate.
fn law(latency: f64) -> Law {
    let noload = 0.010;
    Law {
        noload,
        latency: latency * noload,
        knee: 1.1 * noload,
        noise: 0.01,
        target: Gradient::allowance(32.0 * (1.1 / latency).min(1.1)),
        queued: false,
        wider: false,
        overloaded: false,
        holds: false,
    }
}

#[test]
fn under_half_the_last_probes_limit_a_round_with_no_queue_is_capacity_back() {
    let grow = |from: f64| {
        let mut gradient = Gradient::default();
        gradient.probes.set_last(Some(from), 0.0);
        gradient.grow(&round(32.0, 1000, 3200.0, 0.01), &law(1.0))
    };
    // Capacity back: as sure as a second round with no queue, half the limit at once.
    assert_eq!(grow(65.0), 48.0);
    // At half (and above), growth begins at the law's step.
    assert!(grow(64.0) < 42.0, "{}", grow(64.0));
}

#[test]
fn rising_throughput_two_rounds_running_grows_past_the_knee() {
    let grow = |rising: u32| {
        let mut gradient = Gradient::default();
        gradient.stale.set_rising(rising);
        gradient.grow(&round(32.0, 1000, 3200.0, 0.01), &law(1.2))
    };
    // Above the knee (1.2 times the estimate), the law's step alone ...
    assert!(grow(1) <= 32.0 + 32f64.sqrt(), "{}", grow(1));
    // ... unless capacity is coming back.
    assert_eq!(grow(2), 48.0);
}
