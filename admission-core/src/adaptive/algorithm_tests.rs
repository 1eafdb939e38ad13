//! The algorithms against model windows: Gradient and AIMD, found, followed, bounded.

use std::time::Duration;

use super::*;

const MS: Duration = Duration::from_millis(1);

/// A server of `capacity` workers and mean service time 10 ms, saturated: Little's law
/// gives the mean latency of a window at `limit`.
fn saturated(limit: u64, capacity: u64) -> Window {
    saturated_at(limit, capacity, 10 * MS)
}

/// `saturated`, with a mean service time of `service`.
fn saturated_at(limit: u64, capacity: u64, service: Duration) -> Window {
    let service = service.as_secs_f64();
    let latency = service * (limit as f64 / capacity as f64).max(1.0);
    let throughput = limit.min(capacity) as f64 / service;
    let elapsed = Duration::from_millis(100);
    let samples = (throughput * elapsed.as_secs_f64()) as u64;
    Window {
        samples,
        latency_total: Duration::from_secs_f64(latency) * samples as u32,
        max_in_flight: limit,
        limit,
        elapsed,
        ..Window::default()
    }
}

fn run(algorithm: &mut impl Algorithm, limit: u64, capacity: u64, windows: usize) -> u64 {
    run_at(algorithm, limit, capacity, 10 * MS, windows)
}

/// `run`, with a mean service time of `service`; the lowest limit set on the way too.
fn run_at(
    algorithm: &mut impl Algorithm,
    mut limit: u64,
    capacity: u64,
    service: Duration,
    windows: usize,
) -> u64 {
    for _ in 0..windows {
        limit = algorithm
            .update(&saturated_at(limit, capacity, service))
            .clamp(1, 10_000);
    }
    limit
}

#[test]
fn a_slower_service_is_probed_at_once_and_the_limit_stays_near_the_servers() {
    let mut gradient = Gradient::default();
    let limit = run(&mut gradient, 64, 64, 300);
    // A dependency slows: every request takes twice as long, the server still runs 64 at
    // once. Read as queueing with the old estimate, the limit would fall toward 5 until
    // the next periodic probe, 100 windows on; the estimate is measured again at once.
    let mut lowest = limit;
    let mut limit_now = limit;
    for _ in 0..30 {
        limit_now = run_at(&mut gradient, limit_now, 64, 20 * MS, 1);
        lowest = lowest.min(limit_now);
    }
    let noload = gradient.no_load_latency().unwrap();
    assert!(noload.abs_diff(20 * MS) < MS, "{noload:?}");
    assert!((64..=96).contains(&limit_now), "{limit_now}");
    assert!(
        lowest >= 28,
        "the limit fell to {lowest} (probes excepted: 0.9 × 32)"
    );
    // And back: faster again, the estimate follows at once, so the limit does not settle
    // at twice the server's concurrency.
    let limit = run_at(&mut gradient, limit_now, 64, 10 * MS, 30);
    let noload = gradient.no_load_latency().unwrap();
    assert!(noload.abs_diff(10 * MS) < MS, "{noload:?}");
    assert!((64..=96).contains(&limit), "{limit}");
}

#[test]
fn a_probe_that_agrees_with_the_estimate_is_averaged_into_it() {
    let mut gradient = Gradient::default().probe_every(4);
    run(&mut gradient, 64, 64, 100);
    // 10% slower: within 20% of the estimate, so the next probe averages.
    run_at(&mut gradient, 64, 64, 11 * MS, 8);
    let noload = gradient.no_load_latency().unwrap();
    assert!(
        noload > 10 * MS + MS / 5 && noload < 11 * MS - MS / 5,
        "averaged, not replaced: {noload:?}"
    );
}

#[test]
fn the_gradient_finds_the_servers_concurrency_from_far_below_and_far_above() {
    for start in [8, 64, 512] {
        let mut gradient = Gradient::default();
        let limit = run(&mut gradient, start, 64, 300);
        assert!((64..=96).contains(&limit), "from {start}: {limit}");
        let noload = gradient.no_load_latency().unwrap();
        assert!(
            noload.abs_diff(10 * MS) < MS / 2,
            "from {start}: {noload:?}"
        );
    }
}

#[test]
fn the_gradient_follows_a_capacity_that_halves_and_recovers() {
    let mut gradient = Gradient::default();
    let limit = run(&mut gradient, 64, 64, 200);
    let halved = run(&mut gradient, limit, 32, 20);
    assert!((32..=48).contains(&halved), "{halved}");
    let recovered = run(&mut gradient, halved, 64, 20);
    assert!((64..=96).contains(&recovered), "{recovered}");
}

#[test]
fn the_gradient_backs_off_on_overload_outcomes_and_holds_while_app_limited() {
    let mut gradient = Gradient::default().smoothing(1.0);
    let mut window = saturated(40, 64);
    assert_eq!(
        gradient.update(&window),
        40,
        "the first window sets the estimate"
    );
    window.max_in_flight = 10;
    assert_eq!(gradient.update(&window), 40, "app-limited: no growth");
    window.max_in_flight = 40;
    assert!(gradient.update(&window) > 40, "busy, no queue: growth");
    let mut window = saturated(40, 64);
    window.overloaded = window.samples / 10;
    assert_eq!(
        gradient.update(&window),
        36,
        "10% overloaded: backoff to 90%"
    );
}

#[test]
fn aimd_grows_while_busy_and_backs_off_on_failures() {
    let mut aimd = Aimd::default();
    let mut window = saturated(40, 64);
    assert_eq!(aimd.update(&window), 41);
    window.limit = 41;
    window.max_in_flight = 5;
    assert_eq!(aimd.update(&window), 41, "app-limited: no growth");
    window.dropped = 1;
    assert_eq!(aimd.update(&window), 36, "a drop: backoff to 90%");
    let mut lenient = Aimd::default().threshold(0.5);
    assert_eq!(lenient.update(&window), 41, "under the threshold");
}

#[test]
fn the_gradient_smooths_its_way_down_and_grows_a_whole_step() {
    let mut gradient = Gradient::default().smoothing(0.5);
    let mut window = saturated(100, 200);
    assert_eq!(
        gradient.update(&window),
        100,
        "the first window sets the estimate (10 ms)"
    );
    // Growth: the whole √100 step.
    assert_eq!(gradient.update(&window), 110);
    // A server of 80 at 110: latency 13.75 ms, the gradient 11 / 13.75 = 0.8, the target
    // 110 × 0.8 + √110 = 98.5; half the way down. (A server of 80 is not a quarter below
    // the 100 it showed: no early probe.)
    window = saturated(110, 80);
    assert_eq!(gradient.update(&window), 104);
}

#[test]
fn a_limit_started_far_above_comes_down_within_a_few_seconds() {
    // From 8x the server's concurrency: the first window's latency (8x the no-load one)
    // is the estimate only until the probes, four windows on, measure it.
    let mut gradient = Gradient::default();
    let limit = run(&mut gradient, 512, 64, 60);
    assert!((64..=96).contains(&limit), "after 6 s of windows: {limit}");
}

/// Each setting of the two algorithms reaches what they answer: the same windows, a
/// different answer, in the direction the setting says.
#[test]
fn every_setting_of_the_algorithms_changes_their_answer() {
    // Aimd: the step up, the backoff, and growth by fractions across windows.
    let busy = saturated(40, 64);
    assert_eq!(Aimd::default().update(&busy), 41);
    assert_eq!(Aimd::default().increase(3.0).update(&busy), 43);
    let mut failing = busy;
    failing.dropped = 1;
    assert_eq!(Aimd::default().update(&failing), 36);
    assert_eq!(Aimd::default().backoff(0.5).update(&failing), 20);
    let mut halves = Aimd::default().increase(0.5);
    assert_eq!(halves.update(&busy), 40, "40.5, answered whole");
    assert_eq!(
        halves.update(&busy),
        41,
        "its own 40.5 kept, not the window's 40"
    );

    // Gradient: the backoff and its threshold (10% of samples overloaded)...
    let mut overloaded = saturated(40, 64);
    overloaded.overloaded = overloaded.samples / 10;
    let after_overload = |gradient: Gradient| {
        let mut gradient = gradient.smoothing(1.0);
        gradient.update(&saturated(40, 64));
        gradient.update(&overloaded)
    };
    assert_eq!(after_overload(Gradient::default()), 36);
    assert_eq!(after_overload(Gradient::default().backoff(0.5)), 20);
    assert!(after_overload(Gradient::default().threshold(0.5)) >= 40);
    // A threshold of 0 backs off on any overload, and not without one.
    let mut one = saturated(40, 64);
    one.overloaded = 1;
    let after = |window: &Window| {
        let mut gradient = Gradient::default().smoothing(1.0).threshold(0.0);
        gradient.update(&saturated(40, 64));
        gradient.update(window)
    };
    assert_eq!(after(&one), 36);
    assert!(after(&saturated(40, 64)) > 40);
    // ... the tolerance (a mean 15% above the no-load latency: the tolerant one grows
    // more)...
    let after_slower = |gradient: Gradient| {
        let mut gradient = gradient.smoothing(1.0);
        gradient.update(&saturated(40, 64));
        gradient.update(&saturated_at(40, 64, 10 * MS + 15 * MS / 10))
    };
    let strict = after_slower(Gradient::default());
    let tolerant = after_slower(Gradient::default().tolerance(0.5));
    assert!(strict < tolerant, "{strict} {tolerant}");
    // ... and the probe: the share of the server's concurrency (64) it drops to, and,
    // the first probe finding less, the share of that share it tries next.
    let probes = |gradient: Gradient| {
        let mut gradient = gradient.probe_every(4);
        let mut limit = 64;
        let mut answers = Vec::new();
        for _ in 0..7 {
            limit = gradient.update(&saturated(limit, 64));
            answers.push(limit);
        }
        answers
    };
    assert_eq!(probes(Gradient::default()), [64, 72, 78, 80, 57, 57, 46]);
    assert_eq!(
        probes(Gradient::default().probe(0.5)),
        [64, 72, 78, 80, 32, 32, 8]
    );
}

/// The gradient's fall detector: the server's concurrency (throughput × the no-load
/// estimate) falling by more than a quarter since the last probe brings a probe at once,
/// from the limit as it was; a server that holds steady is probed only at its period.
#[test]
fn a_fall_in_the_servers_concurrency_is_probed_at_once_and_a_steady_one_is_not() {
    let answers = |capacity: u64, windows: usize| {
        let mut gradient = Gradient::default();
        let limit = run(&mut gradient, 64, 64, 300);
        let answers: Vec<u64> = (0..windows)
            .scan(limit, |limit, _| {
                *limit = gradient.update(&saturated(*limit, capacity));
                Some(*limit)
            })
            .collect();
        (limit, answers)
    };
    // Steady at 64: one periodic probe (two windows at 0.9 × 64) in 40 windows.
    let (limit, steady) = answers(64, 40);
    assert!((64..=96).contains(&limit), "{limit}");
    let probes = steady.iter().filter(|&&answer| answer < 64).count();
    assert_eq!(probes, 2, "{steady:?}");
    // Halved to 32: the next window is a probe at 0.9 × 32, the one after measures it,
    // then the limit as it was comes back for the gradient to take down from there.
    let (limit, fall) = answers(32, 12);
    assert_eq!(fall[..3], [28, 28, limit], "{fall:?}");
    assert!((32..=48).contains(&fall[11]), "{fall:?}");
}

/// A window faster than the estimate is probed at once, and the probe is bounded by the
/// limit itself: throughput × the stale (higher) estimate overstates what the server
/// runs, and a probe above the limit would measure nothing.
#[test]
fn a_faster_window_is_probed_at_once_below_the_limit() {
    let mut gradient = Gradient::default();
    let limit = run(&mut gradient, 64, 64, 300);
    let answers: Vec<u64> = (0..3)
        .scan(limit, |limit, _| {
            *limit = gradient.update(&saturated_at(*limit, 64, 5 * MS));
            Some(*limit)
        })
        .collect();
    // Converged at 79 for a server of 64 at 10 ms. At 5 ms the window's latency (6.2 ms)
    // is below 0.9 × the estimate: the gradient grows the limit to 88 and probes at once,
    // at 0.9 × 88 = 79 (throughput × the 10 ms estimate reads 128, and 0.9 × 128 would
    // probe above the limit). The next window measures it (lower than the estimate), and
    // the probe after that goes lower by the probe's share twice: 0.81 × 79 = 63.
    assert_eq!(limit, 79);
    assert_eq!(answers, [79, 79, 63]);
}
