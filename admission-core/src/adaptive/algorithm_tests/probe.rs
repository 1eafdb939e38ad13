//! The no-load estimate's probes: when one is due, how it is sized, how long it measures,
//! where it resumes.

use super::*;

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

/// The gradient's fall detector: the server's throughput, while the work fills the
/// limit, falling by a tenth or more below what it was just after the last probe brings
/// a probe at once, sized from what the server now runs (throughput × the estimate),
/// and the limit resumes where the probe finds the server; a server that holds steady is
/// probed only at its period.
#[test]
fn a_fall_in_the_servers_throughput_is_probed_at_once_and_a_steady_one_is_not() {
    let answers_of = |mut gradient: Gradient, capacity: u64, windows: usize| {
        let limit = run(&mut gradient, 64, 64, 300);
        let answers: Vec<u64> = (0..windows)
            .scan(limit, |limit, _| {
                *limit = gradient.update(&saturated(*limit, capacity));
                Some(*limit)
            })
            .collect();
        (limit, answers)
    };
    let answers = |capacity, windows| answers_of(Gradient::default(), capacity, windows);
    // Steady at 64: one periodic probe (two windows at 0.9 × 64) in 40 windows.
    let (limit, steady) = answers(64, 40);
    assert!((64..=96).contains(&limit), "{limit}");
    let probes = steady.iter().filter(|&&answer| answer < 64).count();
    assert_eq!(probes, 2, "{steady:?}");
    // Halved to 32: the next window is already a probe, below the new server (about
    // 0.9 × 32), and within four windows the limit resumes where the probe found the
    // server (32 × 1.1 + √35.2 = 41), not at the 79 it was, and stays near it.
    let (before, fall) = answers(32, 12);
    assert!(before > 64, "{before}");
    assert!((24..32).contains(&fall[0]), "a probe at once: {fall:?}");
    let resumed = fall.iter().position(|&l| l >= 32).expect("resumed");
    assert!(resumed <= 3, "{fall:?}");
    assert!(
        fall[resumed..].iter().all(|l| (32..=48).contains(l)),
        "{fall:?}"
    );
    // Without the early probe, the first answer is no probe: the law cuts by halves.
    let (_, slow) = answers_of(Gradient::default().without(Mechanism::FallProbe), 32, 12);
    assert!(slow[0] >= 32, "{slow:?}");
}

/// A window faster than the estimate is probed at once, and the probe is sized from what
/// the server ran (throughput × the latency, the lower of it and the estimate):
/// throughput × the stale, higher estimate would overstate it, and probe above the knee.
#[test]
fn a_faster_window_is_probed_at_once_below_the_knee() {
    let answers_of = |gradient: &mut Gradient| {
        let limit = run(gradient, 64, 64, 300);
        let answers: Vec<u64> = (0..6)
            .scan(limit, |limit, _| {
                *limit = gradient.update(&saturated_at(*limit, 64, 5 * MS));
                Some(*limit)
            })
            .collect();
        (limit, answers)
    };
    let mut gradient = Gradient::default();
    let (limit, answers) = answers_of(&mut gradient);
    // Converged just above a server of 64 at 10 ms. At 5 ms the round's latency is
    // below the estimate beyond its noise: the next answer is a probe, sized from the
    // limit the server filled (throughput × the stale 10 ms estimate reads 128, above
    // the knee), which finds less and goes lower; the limit then resumes where the
    // server is (64 × 1.1 + √70 = 79, and up).
    assert!((64..=96).contains(&limit), "{limit}");
    assert!(
        answers[0] < limit && answers[0] >= limit * 8 / 10,
        "{answers:?}"
    );
    assert!(
        answers[1..4].iter().any(|&a| a < answers[0]),
        "a descent: {answers:?}"
    );
    assert!((79..=90).contains(&answers[5]), "{answers:?}");
    let noload = gradient.no_load_latency().unwrap();
    assert!(noload.abs_diff(5 * MS) < MS / 2, "{noload:?}");
    // Without the early probe, the estimate stays stale.
    let mut stale = Gradient::default().without(Mechanism::FasterProbe);
    let (limit, answers) = answers_of(&mut stale);
    assert!(answers[0] >= limit, "{answers:?}");
    let noload = stale.no_load_latency().unwrap();
    assert!(noload > 9 * MS, "{noload:?}");
}

/// Cause 1: a probe read one window just after lowering the limit, and a reading far from
/// the estimate replaced it. With windows shorter than a latency the queue has not
/// drained by then: the estimate ratcheted up, and the limit with it.
#[test]
fn a_probe_waits_for_the_queue_to_drain_where_windows_are_shorter_than_a_latency() {
    let mut server = Lagged::new(64, 200 * MS, 100 * MS);
    let mut gradient = Gradient::default();
    let mut limit = 256;
    let mut limits = Vec::new();
    for _ in 0..1_200 {
        limit = gradient.update(&server.window(limit)).clamp(1, 10_000);
        limits.push(limit);
    }
    let noload = gradient.no_load_latency().unwrap();
    assert!(
        noload > 150 * MS && noload < 300 * MS,
        "the estimate ratcheted: {noload:?}"
    );
    let highest = limits[600..].iter().max().unwrap();
    assert!(*highest <= 128, "the limit ran up to {highest}");
}

/// Cause 3: less demand read as less capacity. Throughput × the estimate fell by a quarter
/// while the work did not fill the limit, and an early probe (sized from that throughput)
/// cut the limit to what the quiet work used.
#[test]
fn less_demand_sets_off_no_probe() {
    let mut gradient = Gradient::default();
    let limit = run(&mut gradient, 64, 64, 300);
    for _ in 0..60 {
        // A third of the demand: 21 in flight at 10 ms on average, no queue; in bursts
        // that reach the limit now and then.
        let window = spread_window(limit, 210, 0.010, 1.0, 100 * MS, limit);
        let next = gradient.update(&window);
        assert!(next >= limit * 9 / 10, "{next} from {limit}");
    }
}

/// Cause 4: a probe resumed at the limit before it, which after a fall in capacity
/// overshoots the server; it resumes where the probe found the server instead.
#[test]
fn a_probe_after_a_fall_in_capacity_resumes_near_the_new_capacity() {
    let mut gradient = Gradient::default();
    let limit = run(&mut gradient, 64, 64, 300);
    let mut limit_now = limit;
    let mut after = Vec::new();
    for _ in 0..40 {
        limit_now = gradient.update(&saturated(limit_now, 16));
        after.push(limit_now);
    }
    assert!(
        after[8..].iter().all(|&l| l <= 24),
        "above 1.5 × 16 after the probe: {after:?}"
    );
}

/// Capacity comes back (a quarter to the whole) just as a probe falls due on its schedule:
/// the limit, found again round after round, would be cut at once to 0.9 of the server
/// for the probe, twice the cost in the second it recovers. A scheduled probe waits for
/// the limit to settle, ten rounds after it last grew for sure (at most ten rounds late).
#[test]
fn a_scheduled_probe_waits_for_the_limit_to_settle_after_it_grew() {
    let mut gradient = Gradient::default();
    let limit = run(&mut gradient, 64, 64, 300);
    let limit = run(&mut gradient, limit, 16, 30);
    // Capacity back after each number of windows a probe's period spans, so that for one
    // of them the probe falls due as the limit grows.
    for offset in 0..110 {
        let mut gradient = gradient.clone();
        let mut limit = run(&mut gradient, limit, 16, offset);
        let mut found = false;
        let mut below = Vec::new();
        // (Found in three rounds; then seven that leave it be, a probe overdue included.)
        for _ in 0..10 {
            limit = gradient.update(&saturated(limit, 64));
            found |= limit >= 64;
            if found && limit < 64 {
                below.push(limit);
            }
        }
        assert!(found, "after {offset}: not found again in 3 rounds");
        assert!(
            below.is_empty(),
            "after {offset}: cut to {below:?} as it landed"
        );
    }
}

/// A probe of a service that slowed reads above the estimate: a short reading only reads
/// low (the long requests unfinished), so one above it beyond its noise is taken once it
/// has its samples, without waiting the ten latencies a reading below would need. Each
/// window it waits, the probe (sized from the stale estimate) holds the limit far below
/// the server.
#[test]
fn a_probe_that_reads_higher_ends_once_it_has_its_samples() {
    // 256 workers at 100 ms, then 130 ms: a probe's windows hold about 140 samples each,
    // ten latencies are thirteen windows.
    let mut gradient = Gradient::default();
    let limit = run_at(&mut gradient, 256, 256, 100 * MS, 300);
    let (mut limit, mut measuring, mut longest) = (limit, 0, 0);
    for _ in 0..100 {
        limit = gradient.update(&saturated_at(limit, 256, 130 * MS));
        measuring = if gradient.probing() == Some(true) {
            measuring + 1
        } else {
            0
        };
        longest = longest.max(measuring);
    }
    // Two windows for its 200 samples; the ten a reading below would need, before.
    assert!(longest <= 3, "measured for {longest} windows");
    let noload = gradient.no_load_latency().unwrap();
    assert!(noload.abs_diff(130 * MS) < 5 * MS, "{noload:?}");
}

/// A probe the work does not fill queues no more than the work brought (the limit never
/// held anything back), so a lower probe finds nothing a higher one did not, and only
/// sheds. At light load, the first probe went on down regardless (its estimate was
/// unconfirmed) and cut the limit below what the work used.
#[test]
fn a_probe_the_work_does_not_fill_goes_no_lower() {
    let mut gradient = Gradient::default();
    let mut limit = 32;
    let (mut lowest, mut probed) = (u64::MAX, false);
    for i in 0..400 {
        // Light load on a server of 64: at 10 ms, no queue, up to 10 in flight; under a
        // probe, up to 7 (the bursts are short). Two rounds read slow (a patch of long
        // requests), which sets off the first probe.
        let used = if gradient.probing().is_some() { 7 } else { 10 };
        let latency = if (10..16).contains(&i) { 0.016 } else { 0.010 };
        let window = spread_window(limit, 40, latency, 1.0, 100 * MS, used.min(limit));
        limit = gradient.update(&window);
        lowest = lowest.min(limit);
        probed |= gradient.probing().is_some();
    }
    assert!(probed && gradient.probing().is_none());
    // The probe: 0.9 × 10 = 9, unfilled. A descent's next step: 6, below what the work
    // used.
    assert!(lowest >= 9, "the limit went down to {lowest}");
}

/// A service that slows little by little reads, against the estimate, like a queue that
/// grew by as much; its throughput falls a tenth and a probe comes at once, sized from
/// throughput × the estimate: for a server that slowed by a tenth and more, a tenth and
/// more below the 90% meant, and it shed while it measured. Where the latency stands
/// within half again of the estimate (a fall in capacity's queue soon stands higher), the
/// probe is sized from the geometric mean of the two: near 90% of the server either way.
#[test]
fn a_probe_set_off_by_a_slow_drift_is_sized_near_the_server() {
    let mut gradient = Gradient::default();
    let mut limit = run(&mut gradient, 64, 64, 300);
    let mut service = 10.0;
    let probe = (0..60).find_map(|_| {
        service *= 1.01;
        limit = run_at(&mut gradient, limit, 64, MS.mul_f64(service), 1);
        gradient.probing().map(|_| (limit, service))
    });
    let (probe, service) = probe.expect("a probe within 60 windows");
    // Slowed by a tenth and more when the probe came.
    assert!(service >= 11.0, "{service}");
    // Near 90% of 64 (57.6): not 50, as from the stale estimate, nor 63, as from the
    // latency alone (0.9 of the limit, 70), which would leave the queue to drain.
    assert!(probe >= 54, "a probe at {probe} for a server of 64");
    assert!(probe <= 60, "a probe at {probe} for a server of 64");
}

/// A probe's reading needs samples for the latencies' spread: 100 × CV² of them, a mean
/// within about 10%. At CV 2 that is 400, not the 200 enough at CV 1: fewer read a
/// heavy tail's mean low, and the estimate with it.
#[test]
fn a_probe_of_a_spread_service_measures_100_cv_squared_samples() {
    let mut gradient = Gradient::default();
    let (capacity, service) = (8u64, 0.010);
    let mut limit = 8;
    let mut measured = Vec::new();
    for _ in 0..400 {
        let samples = (limit.min(capacity) as f64 / service * 0.1) as u64;
        let mean = service * (limit as f64 / capacity as f64).max(1.0);
        let window = spread_window(limit, samples, mean, 2.0, 100 * MS, limit);
        limit = gradient.update(&window).clamp(1, 10_000);
        match gradient.probing() {
            Some(true) => measured.push(samples),
            None if measured.len() > 1 => break,
            _ => measured.clear(),
        }
    }
    // The probe's reading: the windows after its last draining one, up to the one that
    // ended it, as many as were recorded here (60 samples each at 6).
    let total: u64 = measured.iter().sum();
    assert!(total >= 400, "{measured:?}");
}

/// A no-load latency the user gives is taken as it is: the limit finds the server from
/// above and below with no probe (never below the server's concurrency), and the
/// estimate stays what was given.
#[test]
fn a_given_no_load_latency_is_never_probed_and_the_limit_finds_the_server() {
    for start in [8, 256] {
        let mut gradient = Gradient::default().no_load(10 * MS).probe_every(4);
        let mut limit = start;
        let mut lowest = u64::MAX;
        for round in 0..300 {
            limit = gradient.update(&saturated(limit, 64)).clamp(1, 10_000);
            assert_eq!(gradient.probing(), None, "probed at round {round}");
            if round > 100 {
                lowest = lowest.min(limit);
            }
        }
        assert_eq!(gradient.no_load_latency(), Some(10 * MS));
        assert!((64..=96).contains(&limit), "from {start}: {limit}");
        assert!(lowest >= 64, "from {start}: fell to {lowest}");
    }
    // What it costs, as documented: a service that slows reads as a queue, and the limit
    // falls, with no probe to learn the new latency.
    let mut gradient = Gradient::default().no_load(10 * MS);
    let limit = run(&mut gradient, 64, 64, 200);
    let slowed = run_at(&mut gradient, limit, 64, 20 * MS, 100);
    assert!(slowed < 48, "{slowed}");
    assert_eq!(gradient.no_load_latency(), Some(10 * MS));
}

/// The rounds from one scheduled probe to the next, over `probes` probes, of a server of
/// 64 at `ms` whose limit sits at its concurrency.
fn intervals(gradient: Gradient, ms: f64, probes: usize) -> Vec<u32> {
    let mut gradient = gradient;
    let (mut limit, mut rounds, mut since, mut was) = (64, Vec::new(), 0u32, false);
    let service = MS.mul_f64(ms);
    while rounds.len() < probes + 2 {
        limit = run_at(&mut gradient, limit, 64, service, 1);
        let probing = gradient.probing().is_some();
        if probing && !was {
            rounds.push(since);
            since = 0;
        }
        if !probing {
            since += 1;
        }
        was = probing;
    }
    // (The first probe's, from the start, and the second's, which checks a first that
    // descended ten rounds on.)
    rounds.split_off(2)
}

/// Jittered by a quarter, scheduled probes come 75 to 125 rounds apart, not every 100
/// alike, so replicas started together do not shed together; replicas whose first
/// samples differ draw differently, and one sequence of windows always draws the same.
#[test]
fn scheduled_probes_are_jittered_and_drawn_from_the_first_samples() {
    let jittered = || Gradient::default().probe_jitter(0.25);
    let first = intervals(jittered(), 10.0, 6);
    assert!(first.iter().all(|&r| (70..=130).contains(&r)), "{first:?}");
    assert!(first.iter().max() > first.iter().min(), "{first:?}");
    assert_eq!(intervals(jittered(), 10.0, 6), first);
    assert_ne!(intervals(jittered(), 10.1, 6), first);
    let fixed = intervals(Gradient::default(), 10.0, 4);
    let (low, high) = (fixed.iter().min().unwrap(), fixed.iter().max().unwrap());
    assert!(high - low <= 2, "{fixed:?}");
}
