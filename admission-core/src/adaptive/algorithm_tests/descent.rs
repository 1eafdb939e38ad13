//! A probe's descent: a probe that finds a queue probes lower, and where its answers are checked.

use super::*;

/// A descent's probes measured 400 × CV² samples, to tell a step from none by their
/// latency alone: for a server of 8 started at 32, half a second each, and the descent
/// took three seconds, shedding at each step below the server. A probe that
/// queued as the one before did tells by its throughput, which held (Little's law); one
/// below the knee by its throughput, which fell: a descent's probe measures what any
/// other does, 100 × CV² samples (at least 200) over ten latencies.
#[test]
fn a_descent_probe_measures_as_long_as_any_other() {
    let mut gradient = Gradient::default();
    let mut limit = 32;
    // Windows measured at each limit, in the first descent.
    let mut measured = std::collections::BTreeMap::<u64, u32>::new();
    let mut descending = false;
    for _ in 0..200 {
        limit = gradient
            .update(&saturated_at(limit, 8, 10 * MS))
            .clamp(1, 10_000);
        match gradient.probing() {
            Some(true) => {
                descending = true;
                *measured.entry(limit).or_default() += 1;
            }
            None if descending => break,
            _ => {}
        }
    }
    // 36 (the first probe, from 40), then 25, 17, 11, 7 and 4: the last two below the
    // server, the last serving half of it.
    assert_eq!(measured.len(), 6, "{measured:?}");
    assert_eq!(measured.keys().next(), Some(&4), "{measured:?}");
    // The descent's (the first probe's is ten latencies of a long queue): at 80 answers
    // a window (70 at 7, 40 at 4), 200 samples or ten latencies, in three or four
    // windows (five at 4), not 400 samples in five or six.
    for (limit, windows) in measured.iter().take(5) {
        let most = if *limit < 5 { 5 } else { 4 };
        assert!(*windows <= most, "{measured:?}");
    }
}

/// A probe that begins as capacity falls (here to a quarter) queues at the smaller
/// server: its latency reads about three times the estimate, and its throughput falls as
/// if it had run below the knee, which alone let a reading that high be taken whole (and
/// the limit resume at several times the new server's, until the next probe ten seconds
/// on). But a queue's latencies, each a wait for many services plus its own, spread far
/// less than a service's: such a reading is taken and checked by a probe a step lower at
/// once, as a descent is, and the descent finds the service's latency. A service as
/// slow, spread as before, is found too: its latency rose over the round before the
/// probe, as only a changed server's can, so it descends, and stays a step lower.
#[test]
fn a_probe_begun_as_capacity_falls_does_not_read_the_queue_as_a_slower_service() {
    // Until the scheduled probe begins, at a server of 64 at 10 ms; then the probe, its
    // descent included, at `during(limit)`: capacity and queue. The estimate before and
    // after, and the lowest limit the probe set.
    let probe_with = |during: &dyn Fn(u64) -> (u64, f64, f64)| {
        let (mut gradient, mut seed) = (Gradient::default(), 7);
        let mut limit = to_second_probe(&mut gradient, 72, &mut seed, false, |limit| {
            (64, 0.010, 0.010 * (limit as f64 / 64.0 - 1.0).max(0.0))
        });
        let before = gradient.no_load_latency().unwrap().as_secs_f64();
        let probe = limit;
        let mut lowest = limit;
        // (Bounded: a probe that never ends fails here rather than hanging the test.)
        for _ in 0..200 {
            if gradient.probing().is_none() {
                break;
            }
            let (capacity, service, wait) = during(limit);
            limit = gradient
                .update(&drawn(limit, capacity, service, wait, &mut seed))
                .clamp(1, 10_000);
            lowest = lowest.min(limit);
        }
        assert_eq!(gradient.probing(), None, "still probing after 20 s");
        let after = gradient.no_load_latency().unwrap().as_secs_f64();
        (before, after, probe, lowest, limit)
    };
    // A queue: in flight over 16 workers (Little's law).
    let (before, after, .., resumed) =
        probe_with(&|limit| (16, 0.010, 0.010 * (limit as f64 / 16.0 - 1.0).max(0.0)));
    assert!(
        after < 1.25 * before,
        "a queue read as a slower service: {before} -> {after} s"
    );
    // And the limit resumes at the smaller server's concurrency (its queued probe's
    // throughput × the estimate), not at what the server answered before it shrank.
    assert!(resumed <= 24, "resumed at {resumed} for a server of 16");
    // A service four times slower at every limit, spread as before.
    let (before, after, probe, lowest, _) = probe_with(&|_| (64, 0.040, 0.0));
    assert!(
        after > 3.0 * before,
        "a slower service held back: {before} -> {after} s"
    );
    // Its latency rose over the round before the probe as a shrunk server's would: the
    // descent tells them apart within two steps.
    assert!(
        lowest as f64 >= 0.7 * 0.7 * probe as f64 - 1.0,
        "a slower service probed from {probe} down to {lowest}"
    );
}

/// A descent from far above ends on a probe that served less than the one before by more
/// than half a step, beyond the noise of both: it ran below the knee, and read the service
/// alone. The probe that checked every descent a few seconds on ran an eighth or more
/// below a server of 8 for half a second (in the simulator, 1.2% of C = 8's goodput from
/// above, under its target on most seeds). Such a descent is left to the schedule.
#[test]
fn a_descent_that_ends_below_the_knee_is_not_checked_at_once() {
    for seed in 1..=4 {
        let mut state = seed;
        let episodes = probe_episodes(
            &mut Gradient::default(),
            32,
            150,
            &mut state,
            |limit, seed| {
                let wait = 0.010 * (limit as f64 / 8.0 - 1.0).max(0.0);
                drawn(limit, 8, 0.010, wait, seed)
            },
        );
        // The first probe and its descent, within five seconds; nothing in the ten after.
        assert!(episodes[0].1 < 50, "seed {seed}: {episodes:?}");
        assert_eq!(episodes.len(), 1, "seed {seed}: {episodes:?}");
    }
}

/// But where the latencies spread wider than an exponential's, the answers come in
/// bunches (the long requests end together) and a probe's count varies beyond what it
/// says: a fall of a step is not read from one pair of probes, and the check comes as
/// before.
#[test]
fn a_descent_of_a_widely_spread_service_is_checked_at_once() {
    for seed in 1..=4 {
        let mut state = seed;
        let episodes = probe_episodes(
            &mut Gradient::default(),
            256,
            150,
            &mut state,
            |limit, seed| skewed(limit, 64, seed),
        );
        assert!(episodes.len() >= 2, "seed {seed}: {episodes:?}");
        assert!(
            episodes[1].0 < episodes[0].1 + 40,
            "seed {seed}: {episodes:?}"
        );
    }
}
