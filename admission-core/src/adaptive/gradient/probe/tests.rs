//! A probe's reading: what it gathers, when it has enough, what it concludes.

use super::super::estimate::Estimate;
use super::super::testing::{skewed, window};
use super::*;

/// A reading of `samples` latencies of mean `mean` seconds spread as an exponential's
/// (CV 1), over `windows` windows lasting `elapsed` seconds.
fn reading(samples: u64, mean: f64, windows: u32, elapsed: f64) -> Reading {
    let n = samples as f64;
    Reading {
        samples,
        total: mean * n,
        squares: 2.0 * n * mean * mean,
        overloaded: 0,
        windows,
        elapsed,
    }
}

/// A probe at `limit`, filled, by a controller whose confirmed estimate is 10 ms.
fn probing(limit: u64, descended: bool) -> (Gradient, Probe) {
    let mut gradient = Gradient {
        estimate: Estimate::at(Some(0.010), true, None),
        ..Gradient::default()
    };
    gradient.probes.probed = Window {
        max_in_flight: limit,
        ..Window::new(limit, std::time::Duration::from_millis(100))
    };
    let probe = Probe {
        resume: 100.0,
        limit,
        descended,
        before: None,
        mean: 0.012,
    };
    (gradient, probe)
}

#[test]
fn a_reading_gathers_its_windows_samples_and_overloads() {
    let mut sum = Reading::default();
    let mut w = window(10, &[(10.0, 100)]);
    w.overloaded = 5;
    sum.add(&w, 0.010, 1.0);
    w.overloaded = 3;
    sum.add(&w, 0.010, 1.0);
    assert_eq!((sum.samples, sum.overloaded, sum.windows), (200, 8, 2));
    assert!(
        (sum.throughput() - 1000.0).abs() < 1e-9,
        "{}",
        sum.throughput()
    );
    assert!((sum.cv() - 1.0).abs() < 1e-9, "{}", sum.cv());
}

#[test]
fn a_reading_at_the_estimate_measures_until_long_enough_or_ten_windows() {
    let (gradient, _) = probing(10, false);
    // Enough samples, but over five latencies of the ten an exponential asks for.
    assert!(gradient.measuring(&reading(250, 0.010, 2, 0.05)));
    assert!(!gradient.measuring(&reading(250, 0.010, 2, 0.10)));
    // Ten windows end it, however few its samples.
    assert!(gradient.measuring(&reading(50, 0.010, 9, 0.9)));
    assert!(!gradient.measuring(&reading(50, 0.010, 10, 1.0)));
    // Far from the estimate beyond its noise: decided at once.
    assert!(!gradient.measuring(&reading(50, 0.020, 1, 0.1)));
}

#[test]
fn a_skewed_services_probe_reads_its_median_over_the_services_shape() {
    let (mut gradient, _) = probing(10, false);
    gradient.probes.probed = skewed(10);
    let mean = gradient.probes.probed.mean_latency().unwrap().as_secs_f64();
    let sum = reading(100, mean, 1, 0.1);
    gradient.estimate.set_shape(Some(0.3));
    let read = gradient.probe_latency(&sum);
    assert!(read < 0.8 * mean, "{read} of {mean}");
    gradient.estimate.set_shape(Some(0.9));
    assert_eq!(gradient.probe_latency(&sum), mean);
}

#[test]
fn a_descents_probe_held_if_it_served_within_half_a_step_of_the_last() {
    let held = |samples: u64, count: u64, throughput: f64| {
        let (mut gradient, _) = probing(10, true);
        gradient.probes.chain = Some((1000.0, count));
        let sum = reading(samples, 0.010, 10, samples as f64 / throughput);
        gradient.held(&sum, true)
    };
    // A step (30%) beyond three standard errors of both readings: told apart.
    assert_eq!(held(10_000, 1000, 860.0), Some(true));
    assert_eq!(held(10_000, 1000, 840.0), Some(false));
    // 150 samples each: the step is within the noise, and nothing is told.
    assert_eq!(held(150, 150, 840.0), None);
    // Outside a descent, nothing either.
    let (gradient, _) = probing(10, false);
    assert_eq!(
        gradient.held(&reading(10_000, 0.010, 10, 10.0), false),
        None
    );
}

#[test]
fn a_probe_measures_the_share_the_service_fails_with() {
    let (mut gradient, probe) = probing(10, false);
    let mut sum = reading(1000, 0.010, 10, 1.0);
    sum.overloaded = 10;
    gradient.measured(sum, probe, false);
    assert_eq!(gradient.probes.baseline, 0.01);
}

#[test]
fn a_descent_goes_on_below_the_midpoint_of_a_step_only_if_its_probe_reads_sharp() {
    // 20% under the estimate, which is within the noise of 278 samples (a 25% margin)
    // and of 400 (21%); only the second is sharp enough to tell a 30% step.
    let descends = |samples: u64, descended: bool| {
        let (mut gradient, probe) = probing(50, descended);
        gradient.measured(reading(samples, 0.008, 10, 1.0), probe, false);
        gradient.probing() == Some(false)
    };
    assert!(descends(400, true));
    assert!(!descends(278, true));
    // Outside a descent, a reading within its noise is no lower.
    assert!(!descends(400, false));
}

#[test]
fn a_probe_at_one_concludes() {
    let (mut gradient, probe) = probing(1, false);
    assert_eq!(
        gradient.measured(reading(1000, 0.005, 10, 1.0), probe, false),
        100
    );
    assert_eq!(gradient.probing(), None);
    assert_eq!(gradient.estimate.latency(), Some(0.005));
}

#[test]
fn a_probe_that_queued_takes_its_reading_and_descends() {
    let (mut gradient, probe) = probing(50, false);
    assert_eq!(
        gradient.descend(&reading(1000, 0.030, 10, 1.0), probe, 0.030, true),
        35
    );
    assert_eq!(gradient.estimate.latency(), Some(0.030));
}

#[test]
fn a_lower_reading_is_the_estimate_and_the_limit_resumes_at_the_servers_concurrency() {
    let (mut gradient, mut probe) = probing(5, false);
    probe.before = Some(1000.0);
    // 1,000 a second at 8 ms, with the tolerance's 10%: 8.8, and √ of it queued.
    assert_eq!(gradient.conclude(probe, 0.008, 0.05, true, false), 11);
    assert_eq!(gradient.estimate.latency(), Some(0.008));
    // Within the noise: averaged in.
    let (mut gradient, probe) = probing(5, false);
    gradient.conclude(probe, 0.012, 0.5, false, false);
    assert_eq!(gradient.estimate.latency(), Some(0.011));
}

/// A probe at `limit` measuring, its reading empty, the round before it at 12 ms.
fn measuring(limit: u64) -> Gradient {
    let (mut gradient, probe) = probing(limit, false);
    gradient.probes.phase = Phase::Measuring {
        probe,
        reading: Reading::default(),
    };
    gradient
}

#[test]
fn a_probe_whose_latency_rose_over_the_round_before_it_descends_from_that_window() {
    // The round before the probe read 12 ms; the probe's first window 10 ms, its second
    // 36 ms: the server shrank as it measured. The probe ends on the second window alone,
    // read as a queue: the estimate takes it for now and a probe a step lower follows.
    let mut gradient = measuring(50);
    assert_eq!(
        gradient.probe_step(&window(50, &[(10.0, 100)]), 0.010),
        Some(50)
    );
    let next = gradient.probe_step(&window(50, &[(36.0, 100)]), 0.036);
    assert_eq!(next, Some(35));
    assert_eq!(gradient.probing(), Some(false));
    assert_eq!(gradient.estimate.latency(), Some(0.036));
}

#[test]
fn a_probe_whose_latency_stays_near_the_round_before_it_measures_on() {
    // 14 ms over 12: within a fourth, as a draining queue's last waits may read.
    let mut gradient = measuring(50);
    gradient.probe_step(&window(50, &[(14.0, 160)]), 0.014);
    assert_eq!(gradient.probing(), Some(true));
}
