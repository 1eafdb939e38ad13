//! A change in throughput counts only beyond its noise; the reference it is judged
//! against is gathered from saturated rounds only, up to its cap.

use super::super::noise::ServiceSpread;
use super::super::testing::round;
use super::*;

/// A controller whose recent rounds answered 1,000 a second at 20 ms, varying by
/// `spread` (squared, relative).
fn after(spread: f64) -> Gradient {
    let mut gradient = Gradient::default();
    gradient.stale.recent = Some(Recent {
        throughput: 1000.0,
        spread,
        latency: 0.020,
    });
    gradient
}

fn rises(mut gradient: Gradient, samples: u64, throughput: f64) -> bool {
    // The latency fell (20 to 15 ms), not below the estimate (10 ms).
    gradient.note_rise(&round(100.0, samples, throughput, 0.01), 0.010, 0.015)
}

#[test]
fn a_rise_counts_only_beyond_how_much_the_recent_rounds_vary() {
    // Rounds that vary by 10% (a spread of 0.01): a rise must pass 15%.
    assert!(!rises(after(0.01), 10_000, 1140.0));
    assert!(rises(after(0.01), 10_000, 1160.0));
    // Steady rounds: the 10% floor.
    assert!(!rises(after(0.0), 10_000, 1090.0));
    assert!(rises(after(0.0), 10_000, 1110.0));
}

#[test]
fn a_rise_counts_only_beyond_the_noise_of_the_rounds_count() {
    // A service of CV 2 over 100 samples: 2.5 standard errors is 50%.
    let mut gradient = after(0.0);
    gradient.spread = ServiceSpread::with_cv(2.0);
    assert!(!rises(gradient.clone(), 100, 1450.0));
    assert!(rises(gradient, 100, 1550.0));
}

#[test]
fn a_rise_with_the_latency_not_falling_is_not_capacity_back() {
    let mut gradient = after(0.0);
    assert!(!gradient.note_rise(&round(100.0, 10_000, 1500.0, 0.01), 0.010, 0.020));
    assert_eq!(gradient.stale.rising, 0);
    assert!(gradient.note_rise(&round(100.0, 10_000, 1500.0, 0.01), 0.010, 0.015));
    assert!(gradient.note_rise(&round(100.0, 10_000, 1500.0, 0.01), 0.010, 0.015));
    assert_eq!(gradient.stale.rising, 2);
}

/// A controller whose reference (the rounds after the last probe) answered 1,000 a
/// second over `samples`.
fn referenced(samples: u64) -> Gradient {
    let mut gradient = Gradient::default();
    gradient.stale.reference = (samples, samples as f64 / 1000.0);
    gradient
}

#[test]
fn a_fall_counts_only_beyond_the_noise_of_the_rounds_count() {
    // CV 2 over 100 samples: a fall must pass 50%.
    let falls = |throughput: f64| {
        let mut gradient = referenced(1000);
        gradient.spread = ServiceSpread::with_cv(2.0);
        gradient.note_fall(&round(100.0, 100, throughput, 0.2), 0.01, false)
    };
    assert!(!falls(600.0));
    assert!(falls(450.0));
    // And by a tenth at least, however many samples.
    let falls = |throughput: f64| {
        referenced(1000).note_fall(&round(100.0, 1_000_000, throughput, 0.001), 0.01, false)
    };
    assert!(!falls(910.0));
    assert!(falls(890.0));
}

#[test]
fn a_fall_is_judged_only_against_a_reference_of_enough_samples() {
    let falls =
        |samples| referenced(samples).note_fall(&round(100.0, 1000, 500.0, 0.03), 0.01, false);
    assert!(!falls(REFERENCE_MIN - 1));
    assert!(falls(REFERENCE_MIN));
}

#[test]
fn the_reference_gathers_saturated_rounds_up_to_its_cap() {
    let steady = round(100.0, 100, 1000.0, 0.1);
    let mut gradient = referenced(300);
    gradient.note_fall(&steady, 0.01, false);
    assert_eq!(gradient.stale.reference.0, 400);
    // A round the work did not fill says nothing of the server.
    let idle = Round {
        saturated: false,
        ..round(100.0, 100, 1000.0, 0.1)
    };
    gradient.note_fall(&idle, 0.01, false);
    assert_eq!(gradient.stale.reference.0, 400);
    // Once it holds its cap, it holds still (a slow drift then shows as a fall).
    let mut gradient = referenced(REFERENCE_MAX - 1);
    gradient.note_fall(&steady, 0.01, false);
    assert_eq!(gradient.stale.reference.0, REFERENCE_MAX + 99);
    let mut gradient = referenced(REFERENCE_MAX);
    gradient.note_fall(&steady, 0.01, false);
    assert_eq!(gradient.stale.reference.0, REFERENCE_MAX);
}

#[test]
fn the_recent_spread_follows_how_much_the_rounds_vary() {
    // Rounds alternating 20% above and below 1,000 a second: each deviates by about a
    // quarter from the average before it, so the spread settles near 0.06 (a quarter,
    // squared).
    let mut gradient = Gradient::default();
    for i in 0..100 {
        let throughput = if i % 2 == 0 { 1200.0 } else { 800.0 };
        gradient.note_fall(&round(100.0, 100, throughput, 0.1), 0.01, false);
    }
    let recent = gradient.stale.recent.unwrap();
    assert!((0.04..0.08).contains(&recent.spread), "{}", recent.spread);
    assert!(
        (950.0..1050.0).contains(&recent.throughput),
        "{}",
        recent.throughput
    );
    // Steady rounds: it decays toward none.
    for _ in 0..100 {
        gradient.note_fall(&round(100.0, 100, 1000.0, 0.1), 0.01, false);
    }
    let recent = gradient.stale.recent.unwrap();
    assert!((0.0..0.001).contains(&recent.spread), "{}", recent.spread);
}

#[test]
fn a_quiet_range_under_two_buckets_reads_no_service_share() {
    use super::super::probe::Quiet;
    use super::super::testing::window;
    // 10 ms at no load: a bucket is 1.25 ms wide there, two are 2.5 ms.
    let share = |iqr_us: f64| {
        let mut gradient = Gradient::default();
        gradient.probes.set_quiet(Quiet {
            cv: 0.05,
            iqr: iqr_us,
            mean: 0.010,
        });
        gradient.service_share(&window(8, &[(8.0, 50), (12.0, 50)]).spread)
    };
    assert_eq!(share(2_000.0), None);
    assert!(share(2_600.0).is_some());
}
