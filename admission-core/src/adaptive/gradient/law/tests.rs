//! The law's decisions at their boundaries: when overload backs off, how far a step
//! goes, when a round closes.

use super::super::estimate::Estimate;
use super::super::testing::{round, window};
use super::*;

/// A confirmed controller at an estimate of 10 ms.
fn confirmed() -> Gradient {
    Gradient {
        estimate: Estimate::at(Some(0.010), true, None),
        ..Gradient::default()
    }
}

#[test]
fn overload_backs_off_only_beyond_what_the_last_probe_saw_and_its_noise() {
    // The last probe saw 4% overloaded; over 400 samples its noise is 1% and three of
    // those count, with the 1% threshold: up to 8% is the service's own.
    let target = |overloaded: u64| {
        let mut gradient = confirmed();
        gradient.probes.set_last(None, 0.04);
        let mut w = window(100, &[(10.0, 400)]);
        w.overloaded = overloaded;
        let idle = Round {
            binds: false,
            ..round(100.0, 400, 10_000.0, 0.05)
        };
        gradient.target(&idle, &w, 0.010, 0.010)
    };
    assert_eq!(target(28), 100.0);
    assert_eq!(target(36), 90.0);
}

/// Where a step toward `target` from 100 lands, with the latency `latency` times the
/// estimate and the round's noise `noise`.
fn step(target: f64, latency: f64, noise: f64) -> f64 {
    let mut gradient = confirmed();
    gradient.step_toward(
        target,
        &round(100.0, 1000, 1000.0, noise),
        0.010,
        latency * 0.010,
    );
    gradient.limit
}

#[test]
fn a_cut_goes_the_whole_way_only_for_a_queue_beyond_doubt() {
    // Beyond doubt: 1.5 times the knee (1.1) and two standard errors (2%), 1.683.
    assert_eq!(step(30.0, 1.70, 0.01), 30.0);
    assert_eq!(step(30.0, 1.66, 0.01), 65.0);
}

#[test]
fn a_cut_within_three_standard_errors_of_the_limit_is_smoothed() {
    // 20% noise: a cut by half is within 60% of the limit; by 70%, beyond 45%.
    assert_eq!(step(50.0, 5.0, 0.2), 75.0);
    assert_eq!(step(30.0, 5.0, 0.15), 30.0);
}

#[test]
fn only_a_sure_growth_restarts_the_settling_count() {
    let mut gradient = confirmed();
    gradient.growth.set(2, 5);
    gradient.step_toward(150.0, &round(100.0, 1000, 1000.0, 0.01), 0.010, 0.010);
    assert_eq!((gradient.limit, gradient.growth.since_sure()), (150.0, 0));
    // A sure cut is no growth.
    gradient.growth.set(2, 5);
    gradient.step_toward(30.0, &round(100.0, 1000, 1000.0, 0.01), 0.010, 0.050);
    assert_eq!((gradient.limit, gradient.growth.since_sure()), (30.0, 6));
}

#[test]
fn a_round_closes_after_one_and_a_half_latencies_since_the_change() {
    // Latencies of a second, windows of 100 ms: the first second's windows are of work
    // admitted before the change and left out; the round closes at 1.5 s.
    let mut gradient = confirmed();
    let mut closed = Vec::new();
    for i in 0..20 {
        let w = window(100, &[(1000.0, 200)]);
        if gradient.next_round(&w, 1.0, 0.010).is_some() {
            closed.push(i);
        }
    }
    assert_eq!(closed.first(), Some(&14), "{closed:?}");
}

#[test]
fn a_queued_round_closes_on_the_samples_its_spread_asks_for() {
    // An exponential's spread asks for 100 samples: a window of 100 is a round.
    let mut gradient = confirmed();
    let w = window(100, &[(20.0, 100)]);
    assert!(gradient.next_round(&w, 0.020, 0.010).is_some());
    let mut gradient = confirmed();
    let w = window(100, &[(20.0, 99)]);
    assert!(gradient.next_round(&w, 0.020, 0.010).is_none());
}
