//! The unconfirmed estimate: what confirms it, what is averaged into it, and what it
//! holds the limit against.

use super::super::estimate::Estimate;
use super::super::testing::{round, skewed, window};
use super::*;

/// An unconfirmed controller whose first samples read 10 ms with `in_flight` at once.
fn unconfirmed(in_flight: f64) -> Gradient {
    let mut gradient = Gradient {
        estimate: Estimate::at(Some(0.010), false, None),
        ..Gradient::default()
    };
    gradient.first.in_flight = in_flight;
    gradient
}

#[test]
fn a_round_with_half_as_much_again_in_flight_and_no_queue_confirms_and_may_raise() {
    // 20 in flight (1,000 a second at 20 ms) against 10 then: the estimate takes it.
    let mut gradient = unconfirmed(10.0);
    let w = window(100, &[(20.0, 100)]);
    gradient.confirm_first(
        &round(100.0, 100, 1000.0, 0.1),
        &w,
        0.010,
        0.020,
        false,
        false,
    );
    assert!(gradient.estimate.confirmed());
    assert_eq!(gradient.estimate.latency(), Some(0.020));
    // Faster than the estimate: confirmed, but not lowered (only a probe lowers it).
    let mut gradient = unconfirmed(10.0);
    gradient.confirm_first(
        &round(100.0, 100, 2000.0, 0.1),
        &w,
        0.010,
        0.008,
        false,
        false,
    );
    assert!(gradient.estimate.confirmed());
    assert_eq!(gradient.estimate.latency(), Some(0.010));
}

#[test]
fn a_round_with_as_much_in_flight_is_averaged_in() {
    let average = |max_in_flight: u64| {
        let mut gradient = unconfirmed(100.0);
        gradient.first.unconfirmed = window(100, &[(10.0, 100)]);
        let mut w = window(100, &[(12.0, 100)]);
        w.max_in_flight = max_in_flight;
        gradient.confirm_first(
            &round(100.0, 100, 1000.0, 0.1),
            &w,
            0.010,
            0.012,
            false,
            false,
        );
        assert!(!gradient.estimate.confirmed());
        gradient.estimate.latency().unwrap()
    };
    // Within 10% of as many in flight: a reading of the same.
    assert!((average(109) - 0.011).abs() < 1e-6, "{}", average(109));
    assert_eq!(average(111), 0.010);
}

#[test]
fn unconfirmed_the_limit_is_cut_only_at_twice_the_knee_and_its_noise() {
    // Knee 1, noise 10%: twice the knee and two standard errors is 2.4.
    let gradient = unconfirmed(10.0);
    assert!(gradient.unconfirmed_holds(2.3, 1.0, 0.1, false));
    assert!(!gradient.unconfirmed_holds(2.5, 1.0, 0.1, false));
    assert!(gradient.unconfirmed_holds(2.5, 1.0, 0.1, true));
}

#[test]
fn a_round_spread_wider_than_the_first_samples_is_the_service() {
    // The first samples spread as an exponential (CV 1), at a limit of 100; a queued
    // round spreads at CV 2.5 (a skewed service).
    let wide = skewed(100);
    let mut gradient = unconfirmed(10.0);
    gradient.first.cv = Some((1.0, 100));
    assert!(gradient.wider(true, &wide, 0.0059, 0.0059));
    assert!(!gradient.wider(false, &wide, 0.0059, 0.0059));
    // First samples of no spread at all tell nothing of the service's.
    gradient.first.cv = Some((0.0, 100));
    assert!(!gradient.wider(true, &wide, 0.0059, 0.0059));
}
