//! Telling a queue from noise: a round read against the spread of the service, not its own.

use super::*;

/// Cause 2: a probe that read 5% below the estimate took it as the estimate, and probed
/// lower: inside the noise of a window's mean when latencies spread (CV 2), so the
/// estimate drifted low, and the limit with it.
#[test]
fn a_noisy_service_keeps_its_estimate_and_does_not_cascade_below_the_server() {
    let mut gradient = Gradient::default();
    let mut state = 0x9e37_79b9_7f4a_7c15;
    let (capacity, service) = (64u64, 0.010);
    let mut limit = 64;
    let mut lowest = (f64::INFINITY, u64::MAX);
    for i in 0..3_000 {
        let throughput = limit.min(capacity) as f64 / service;
        let samples = (throughput * 0.1) as u64;
        let mean = service * (limit as f64 / capacity as f64).max(1.0);
        let noisy = mean * (1.0 + 2.0 / (samples as f64).sqrt() * normal(&mut state)).max(0.2);
        let window = spread_window(limit, samples, noisy, 2.0, 100 * MS, limit);
        limit = gradient.update(&window).clamp(1, 10_000);
        if i >= 300 {
            let noload = gradient.no_load_latency().unwrap().as_secs_f64();
            lowest = (lowest.0.min(noload), lowest.1.min(limit));
        }
    }
    let (noload, limit) = lowest;
    assert!(noload >= 0.85 * service, "the estimate fell to {noload}");
    assert!(
        limit >= 40,
        "the limit fell to {limit} (a probe's 0.9 × 0.7 × 64 = 40)"
    );
}

#[test]
fn a_fall_in_capacity_on_a_round_the_work_did_not_fill_is_not_a_slower_service() {
    // Rounds near the server's concurrency (72 in flight for 64: 11.25 ms), then a round
    // whose latency rose beyond their noise (30 ms).
    let (noload, limit) = after_a_pause(72, 30 * MS);
    assert!(noload.abs_diff(10 * MS) < MS, "{noload:?}");
    assert!((32..=48).contains(&limit), "{limit}");
    // Rounds under a queue (110 in flight for 64: 17.2 ms), then one whose latency is
    // within their noise (19.5 ms) but beyond doubt over the estimate: the cut is sure.
    let (noload, limit) = after_a_pause(110, 19 * MS + MS / 2);
    assert!(noload.abs_diff(10 * MS) < MS, "{noload:?}");
    assert!((32..=48).contains(&limit), "{limit}");
}

/// A limit started far above a small server holds a queue from the first window: its
/// first estimate is taken as the queue forms, and the queue then stands a fifth or so
/// above it. Its latencies, each a sum of many waits, spread far less than a service's
/// (a CV of a quarter): read with the noise of a spread of 1, every round was within the
/// noise of the knee, the rounds were averaged into the estimate, and the limit grew
/// with the queue for three seconds before two rounds read as queued. Read with the
/// spread it has, the first probe comes within a second and a half.
#[test]
fn a_queue_from_the_first_window_sets_off_the_first_probe_by_its_own_spread() {
    let mut gradient = Gradient::default();
    let (capacity, service) = (8, 0.010);
    let mut limit = 32;
    let mut first_probe = None;
    for window in 0..40 {
        // The queue forms over the first three windows, then stands at the limit's
        // (Little's law: 40 ms at 32).
        let standing = service * limit as f64 / capacity as f64;
        let latency = standing * [0.78, 0.85, 0.95].get(window).copied().unwrap_or(1.0);
        let samples = (capacity as f64 / service * 0.1) as u64;
        let spread = spread_window(limit, samples, latency, 0.25, 100 * MS, limit);
        limit = gradient.update(&spread).clamp(1, 10_000);
        if gradient.probing().is_some() {
            first_probe.get_or_insert(window);
        }
    }
    let first_probe = first_probe.expect("no probe in 4 s");
    assert!(
        first_probe < 15,
        "the first probe came at window {first_probe}"
    );
}

/// The spread the queue test reads by is measured from a hundred samples at least: fewer
/// read a heavy tail low (the long requests are rare), and two windows that caught a
/// patch of them then read as queued, setting off the first probe for nothing.
#[test]
fn the_queue_test_reads_the_spread_of_a_hundred_samples_at_least() {
    let mut gradient = Gradient::default();
    // A server of 64 at 10 ms, far below it: no queue. The first windows' spread reads
    // a CV of 0.2 from a dozen samples each; windows 2 and 3 caught long requests.
    let mut limit = 10;
    for window in 0..6 {
        let latency = if (2..4).contains(&window) {
            0.0125
        } else {
            0.010
        };
        limit = gradient.update(&spread_window(limit, 100, latency, 0.2, 100 * MS, limit));
        assert_eq!(gradient.probing(), None, "a probe at window {window}");
    }
}

/// The service's share of a round's latency is read from the spread of its latencies by
/// their interquartile range, not their coefficient of variation: a few hundred samples
/// of a heavy tail (here lognormal, CV 2) read their coefficient far below the truth now
/// and then, which reads as a service far faster than the estimate, and probes again and
/// again, lower each time. Five minutes of it: the spell is rare, and long.
#[test]
fn a_heavy_tail_s_spread_is_read_by_its_quartiles() {
    let mut seed = 2u64;
    let mut uniform = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((seed >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    // Lognormal of mean 10 ms and CV 2 (σ² = ln 5).
    let sigma = 5f64.ln().sqrt();
    let mu = 0.010f64.ln() - sigma * sigma / 2.0;
    let mut service = move || {
        let z = (-2.0 * uniform().ln()).sqrt() * (std::f64::consts::TAU * uniform()).cos();
        (mu + sigma * z).exp()
    };
    let (mut gradient, mut limit) = (Gradient::default(), 72);
    let mut limits = Vec::new();
    for _ in 0..3_000 {
        // 64 workers, the work filling the limit; a queue's wait, alike for all, above.
        let wait = 0.010 * (limit as f64 / 64.0 - 1.0).max(0.0);
        let mut window = Window::new(limit, Duration::from_millis(100));
        for _ in 0..limit.min(64) * 10 {
            let latency = service() + wait;
            window.add(Duration::from_secs_f64(latency), Outcome::Success, limit);
        }
        limit = gradient.update(&window).clamp(1, 10_000);
        limits.push(limit);
    }
    let low = limits[300..].iter().filter(|&&l| l < 48).count();
    // (Read by the coefficient of variation instead, 255 windows of these 2,700, down to
    // a limit of 1.)
    assert!(low < 15, "{low} of 2,700 windows below 3/4 of the server");
}

/// The spread a probe's is held against is the service's at no load. The rounds hold a
/// short queue (here their latency is a quarter more than the service), which narrows
/// their spread; against theirs, a probe that began as capacity fell by two fifths and
/// queued (reading 1.6 times the estimate) spread too much for a queue, and was taken as
/// a slower service. Against the last probe's, it is a queue.
#[test]
fn a_queue_is_read_against_the_service_s_spread_at_no_load() {
    let (mut gradient, mut seed) = (Gradient::default(), 3);
    // A server whose queue starts at 50 (its work comes in bursts): a probe runs with
    // none, the rounds above it with a short one.
    let wait = |limit: u64, from: f64| 0.010 * (limit as f64 / from - 1.0).max(0.0);
    let mut limit = to_second_probe(&mut gradient, 72, &mut seed, false, |limit| {
        (64, 0.010, wait(limit, 50.0))
    });
    let before = gradient.no_load_latency().unwrap().as_secs_f64();
    let probe = limit;
    for _ in 0..200 {
        if gradient.probing().is_none() {
            break;
        }
        let capacity = (probe as f64 / 1.6) as u64;
        limit = gradient
            .update(&drawn(
                limit,
                capacity,
                0.010,
                wait(limit, capacity as f64),
                &mut seed,
            ))
            .clamp(1, 10_000);
    }
    assert_eq!(gradient.probing(), None, "still probing after 20 s");
    let after = gradient.no_load_latency().unwrap().as_secs_f64();
    // (Held against the rounds' spread, it read 0.0161 s here. Over twelve seeds, the
    // queue is read as one on eleven against the probe's spread, on one against theirs.)
    assert!(
        after < 1.25 * before,
        "a queue read as a slower service: {before} -> {after} s"
    );
}

/// A limit started far above a server is cut before its first probe where the latency
/// doubles. The queue then drains: the round after the cut holds requests that waited
/// long and requests that barely waited, whose latencies spread wider than the first
/// samples did. Read as the service's (as a round at the limit of the first estimate
/// is), it doubled the estimate (S = 200 ms in the simulator: 157 ms to 390 ms, for a
/// service of 200). A round under a limit cut since is not read so.
#[test]
fn a_draining_queue_s_wide_spread_is_not_read_as_the_service() {
    let mut seed = 5;
    let mut gradient = Gradient::default();
    // The first samples: a queue forming at 256, for a server of 64 at 10 ms.
    let limit = gradient.update(&drawn(256, 64, 0.010, 0.005, &mut seed));
    let first = gradient.no_load_latency().unwrap();
    // Then the queue stands at 40 ms: the latency doubled, and the limit is cut.
    let mut limit = limit;
    for _ in 0..3 {
        limit = gradient.update(&drawn(limit, 64, 0.010, 0.030, &mut seed));
        if limit < 256 {
            break;
        }
    }
    assert!(limit < 256, "no cut");
    assert_eq!(gradient.probing(), None);
    // Draining (three windows): each request waited anywhere from nothing to 60 ms.
    let mut uniform = || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((seed >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    for _ in 0..3 {
        let mut window = Window::new(limit, Duration::from_millis(100));
        for _ in 0..640 {
            let latency = -0.010 * uniform().ln() + 0.060 * uniform();
            window.add(Duration::from_secs_f64(latency), Outcome::Success, limit);
        }
        gradient.update(&window);
    }
    let noload = gradient.no_load_latency().unwrap();
    assert!(noload <= first + MS, "{first:?} to {noload:?}");
}
