//! The window's buckets, quantiles and spread, as an algorithm reads them.

use super::*;
use crate::samples::BUCKETS;

#[test]
fn a_window_s_median_is_its_middle_sample_within_a_bucket() {
    let mut window = Window::new(8, Duration::from_millis(100));
    assert_eq!(window.median_latency(), None);
    // 1 ms to 99 ms: the median is 50 ms, read to within an eighth of a doubling.
    for ms in 1..100 {
        window.add(ms * MS, Outcome::Success, 1);
    }
    let median = window.median_latency().unwrap().as_secs_f64() * 1e3;
    assert!((50.0 / 1.09..=50.0 * 1.09).contains(&median), "{median}");
    // Merged windows: their samples together.
    let mut later = Window::new(8, Duration::from_millis(100));
    for _ in 0..200 {
        later.add(200 * MS, Outcome::Success, 1);
    }
    window.merge(&later);
    let median = window.median_latency().unwrap().as_secs_f64() * 1e3;
    assert!((200.0 / 1.09..=200.0 * 1.09).contains(&median), "{median}");
}

#[test]
fn latency_buckets_are_eighths_of_a_doubling_and_saturate() {
    assert_eq!(Spread::bucket(0), 0);
    assert_eq!(Spread::bucket(1), 0);
    assert_eq!(Spread::bucket(2), 8);
    assert_eq!(Spread::bucket(3), 12);
    assert_eq!(Spread::bucket(1024), 80);
    assert_eq!(Spread::bucket(1024 + 128), 81);
    assert_eq!(Spread::bucket(2047), 87);
    assert_eq!(Spread::bucket(u64::MAX), BUCKETS - 1);
    for micros in [1, 7, 100, 1_000, 12_345, 1 << 20] {
        let low = Spread::lower(Spread::bucket(micros));
        let micros = micros as f64;
        assert!(low <= micros && micros < low * 1.126, "{micros}");
    }
}

#[test]
fn a_window_s_buckets_read_its_spread_from_their_middles() {
    let mut window = Window::new(8, Duration::from_millis(100));
    assert_eq!(window.spread.bucketed_cv(), None);
    for _ in 0..50 {
        window.add(12 * MS, Outcome::Success, 1);
    }
    assert_eq!(window.spread.bucketed_cv(), Some(0.0));
    // 10 ms and 30 ms alike: a mean of 20, a deviation of 10, a CV of a half.
    let mut even = Window::new(8, Duration::from_millis(100));
    for latency in [10 * MS, 30 * MS].repeat(50) {
        even.add(latency, Outcome::Success, 1);
    }
    // (Each bucket's middle is within a sixteenth of its latencies; its lower bound, as
    // much as an eighth below, would read 0.514.)
    let cv = even.spread.bucketed_cv().unwrap();
    assert!((cv - 0.5).abs() < 0.01, "{cv}");
}

/// The interquartile range, from the buckets: a queue's wait, alike for all, leaves it
/// as it was (within the buckets' eighth of an octave, interpolated).
#[test]
fn a_window_s_interquartile_range_is_the_same_behind_a_queue() {
    let mut seed = 9u64;
    let mut quiet = Window::new(8, Duration::from_millis(100));
    let mut queued = Window::new(8, Duration::from_millis(100));
    assert_eq!(quiet.spread.interquartile(), None);
    for _ in 0..1_000 {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let uniform = ((seed >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let service = Duration::from_secs_f64(-0.010 * uniform.ln());
        quiet.add(service, Outcome::Success, 1);
        queued.add(service + 30 * MS, Outcome::Success, 1);
    }
    // Exponential of mean 10 ms: quartiles at 2.9 and 13.9 ms, 11 ms apart.
    let (quiet, queued) = (
        quiet.spread.interquartile().unwrap(),
        queued.spread.interquartile().unwrap(),
    );
    assert!((quiet / 11_000.0 - 1.0).abs() < 0.1, "{quiet} µs");
    assert!(
        (queued / quiet - 1.0).abs() < 0.05,
        "{queued} µs behind a queue"
    );
}

#[test]
fn a_window_s_debug_sums_its_buckets_rather_than_listing_them() {
    let mut window = Window::new(8, Duration::from_millis(100));
    window.add(3 * MS, Outcome::Success, 1);
    window.add(5 * MS, Outcome::Success, 1);
    let shown = format!("{window:?}");
    assert!(shown.contains("bucketed: 2"), "{shown}");
    assert!(shown.len() < 400, "{shown}");
}

/// The coefficient of variation from a window's sampled squares: exact for two samples
/// (10 and 30 ms: a mean of 20, a deviation of 10), none without samples, 0 for
/// latencies of 0; and two windows merged read as one window of all their samples.
#[test]
fn a_window_s_cv_is_its_deviation_over_its_mean_and_survives_a_merge() {
    let mut empty = Window::new(4, 100 * MS);
    assert_eq!(empty.latency_cv(), None);
    assert_eq!(empty.bucketed_latency_cv(), None);
    let mut zero = empty;
    zero.add(Duration::ZERO, Outcome::Success, 1);
    zero.add(Duration::ZERO, Outcome::Success, 1);
    assert_eq!(zero.latency_cv(), Some(0.0));

    let mut both = empty;
    both.add(10 * MS, Outcome::Success, 1);
    both.add(30 * MS, Outcome::Success, 1);
    let cv = both.latency_cv().unwrap();
    assert!((cv - 0.5).abs() < 1e-3, "{cv}");

    let mut later = Window::new(4, 100 * MS);
    later.add(30 * MS, Outcome::Success, 1);
    empty.add(10 * MS, Outcome::Success, 1);
    empty.merge(&later);
    assert_eq!(empty.latency_cv(), both.latency_cv());
    assert_eq!(empty.bucketed_latency_cv(), both.bucketed_latency_cv());
    assert_eq!(empty.median_latency(), both.median_latency());

    let mut first = Window::new(4, 100 * MS);
    first.add(MS, Outcome::Gone, 2);
    let mut second = Window::new(8, 100 * MS);
    second.add(MS, Outcome::Gone, 1);
    second.add(MS, Outcome::Overload, 1);
    first.merge(&second);
    assert_eq!((first.samples, first.dropped, first.overloaded), (3, 2, 1));
    assert_eq!((first.limit, first.max_in_flight), (8, 2));
    assert_eq!(first.elapsed, 200 * MS);
}

/// The quantiles at the ends: 0 is the lowest sample's bucket, not the first bucket, and
/// 1 the highest's.
#[test]
fn a_window_s_extreme_quantiles_are_its_lowest_and_highest_buckets() {
    let mut window = Window::new(4, 100 * MS);
    window.add(10 * MS, Outcome::Success, 1);
    window.add(40 * MS, Outcome::Success, 1);
    let lowest = window.latency_quantile(0.0).unwrap();
    let highest = window.latency_quantile(1.0).unwrap();
    assert!((9 * MS..=10 * MS).contains(&lowest), "{lowest:?}");
    assert!((40 * MS..=45 * MS).contains(&highest), "{highest:?}");
}
