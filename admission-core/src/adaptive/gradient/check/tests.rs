use super::super::estimate::Estimate;
use super::super::noise::ServiceSpread;
use super::super::testing::window;
use super::{AFTER, Found};
use crate::adaptive::Window;
use crate::adaptive::gradient::Gradient;

/// A confirmed estimate of 10 ms of a service whose latencies barely spread, the limit
/// at 20, and three rounds read queued at 15 ms with the law holding: a check is due.
fn due() -> (Gradient, Window) {
    let mut gradient = Gradient::default();
    gradient.estimate.set(Some(0.010), true);
    gradient.limit = 20.0;
    gradient.spread = ServiceSpread::with_cv(0.02);
    let round = window(20, &[(15.0, 200)]);
    for _ in 0..AFTER {
        gradient.observe_check(true, true, &round, 0.015);
    }
    (gradient, round)
}

/// A check begun from `due` (the limit to 14), and what it found in a round at `limit`
/// of `samples` latencies of `ms`.
fn checked(limit: u64, ms: f64, samples: u64) -> (Gradient, Option<Found>) {
    let (mut gradient, round) = due();
    gradient.check_if_due(&round, 0.015, 0.011);
    let found = gradient.check_step(&window(limit, &[(ms, samples)]), ms / 1e3);
    (gradient, found)
}

#[test]
fn a_check_lowers_the_limit_to_the_law_s_concurrency_without_the_allowance() {
    let (mut gradient, round) = due();
    // 20 × 11 ms / 15 ms: 14.
    assert_eq!(gradient.check_if_due(&round, 0.015, 0.011), Some(14));
    assert_eq!(gradient.limit, 14.0);
    // Not before the third round in a row.
    let (mut early, round) = due();
    early.check.queued = AFTER - 1;
    assert_eq!(early.check_if_due(&round, 0.015, 0.011), None);
}

#[test]
fn a_latency_that_stays_as_the_limit_falls_is_no_queue_and_the_limit_comes_back() {
    let (mut gradient, found) = checked(14, 15.0, 140);
    assert_eq!(found, Some(Found::NoQueue(0.015)));
    assert_eq!(gradient.limit, 20.0);
    assert_eq!(gradient.check.queued, 0);
    // One round only: the next reads as any other.
    assert_eq!(
        gradient.check_step(&window(20, &[(15.0, 200)]), 0.015),
        None
    );
}

#[test]
fn a_latency_that_falls_with_the_limit_is_a_queue() {
    // 15 ms × 14 / 20: what a queue gives.
    let (gradient, found) = checked(14, 10.5, 140);
    assert_eq!(found, Some(Found::Queue));
    assert_eq!(gradient.limit, 20.0);
}

#[test]
fn a_check_the_bounds_held_up_learns_nothing() {
    assert_eq!(checked(20, 15.0, 200).1, Some(Found::Nothing));
}

#[test]
fn no_check_where_the_drop_is_within_the_noise_or_the_estimate_is_given() {
    // An exponential service: 200 samples read within 7%, and a drop of 30% is within
    // six times the two rounds' noise.
    let (mut noisy, round) = due();
    noisy.spread = ServiceSpread::with_cv(1.0);
    assert_eq!(noisy.check_if_due(&round, 0.015, 0.011), None);
    // A drop under a tenth is not worth a round.
    let (mut near, round) = due();
    assert_eq!(near.check_if_due(&round, 0.0115, 0.011), None);
    let (mut given, round) = due();
    given.estimate = Estimate::given(0.010);
    assert_eq!(given.check_if_due(&round, 0.015, 0.011), None);
    let (mut unconfirmed, round) = due();
    unconfirmed.estimate.set(Some(0.010), false);
    assert_eq!(unconfirmed.check_if_due(&round, 0.015, 0.011), None);
}

#[test]
fn a_descent_with_the_latency_unmoved_is_checked_and_one_that_follows_the_limit_is_not() {
    let mut gradient = Gradient::default();
    gradient.estimate.set(Some(0.010), true);
    gradient.limit = 20.0;
    gradient.spread = ServiceSpread::with_cv(0.02);
    // The law cuts 20, 17, 14 with the latency at 15 ms: nothing answers to the cuts.
    for limit in [20, 17, 14] {
        let round = window(limit, &[(15.0, 200)]);
        gradient.observe_check(true, false, &round, 0.015);
    }
    assert!(gradient.check.steady);
    let mut following = Gradient::default();
    following.estimate.set(Some(0.010), true);
    following.spread = ServiceSpread::with_cv(0.02);
    // A queue: the latency falls with the limit.
    for (limit, ms) in [(20, 15.0), (17, 12.75), (14, 10.5)] {
        let round = window(limit, &[(ms, 200)]);
        following.observe_check(true, false, &round, ms / 1e3);
    }
    assert!(!following.check.steady);
    // A round with no queue starts the count over.
    gradient.observe_check(false, false, &window(14, &[(10.0, 200)]), 0.010);
    assert_eq!((gradient.check.queued, gradient.check.anchor), (0, None));
}

#[test]
fn a_latency_that_stays_with_the_throughput_held_learns_nothing() {
    // As many answers a second at 14 as at 20: the server full, whatever the latency
    // says (a noisy clock, a server that changed meanwhile).
    assert_eq!(checked(14, 15.0, 200).1, Some(Found::Nothing));
    // A latency that rose: the same.
    assert_eq!(checked(14, 20.0, 140).1, Some(Found::Nothing));
}

/// A controller at a confirmed 10 ms, its service's latencies barely spread.
fn fresh() -> Gradient {
    let mut gradient = Gradient::default();
    gradient.estimate.set(Some(0.010), true);
    gradient.spread = ServiceSpread::with_cv(0.02);
    gradient
}

#[test]
fn a_round_neither_held_nor_cut_a_tenth_or_whose_latency_jumped_is_not_steady() {
    // The law moves the limit by less than a tenth and does not hold it.
    let mut moving = fresh();
    for limit in [20, 19, 19] {
        moving.observe_check(true, false, &window(limit, &[(15.0, 200)]), 0.015);
    }
    assert!(!moving.check.steady);
    // Held, but the latency jumped from one round to the next; then held at it.
    let mut jumped = fresh();
    jumped.observe_check(true, true, &window(20, &[(15.0, 200)]), 0.015);
    jumped.observe_check(true, true, &window(20, &[(20.0, 200)]), 0.020);
    assert!(!jumped.check.steady);
    jumped.observe_check(true, true, &window(20, &[(20.0, 200)]), 0.020);
    assert!(jumped.check.steady);
}
