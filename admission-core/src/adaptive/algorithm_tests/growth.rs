//! Growth, and a service that speeds up or slows down (a stale estimate).

use super::*;

/// Capacity comes back (a quarter to the whole), and the first rounds still read near
/// the knee (requests that queued before, and noise): within its noise, the formula's
/// step alone, damped, and the limit took half a second to find the server. But the
/// server answers more a second than it did at the same limit, beyond how much that
/// varied: it runs more at once. Twice in a row, that is as sure as a second round with
/// no queue, and the limit grows by half.
#[test]
fn a_rise_in_throughput_at_the_same_limit_grows_the_limit_like_a_round_with_no_queue() {
    let mut gradient = Gradient::default();
    let limit = run(&mut gradient, 64, 64, 300);
    let mut limit = run(&mut gradient, limit, 16, 100);
    assert!((16..=26).contains(&limit), "{limit} for 16");
    let (start, mut highest) = (limit, 0);
    for _ in 0..4 {
        // 12% above the 10 ms no-load latency (in the knee's noise), every slot busy.
        let latency = 0.0112;
        let samples = (limit as f64 / latency * 0.1) as u64;
        let window = spread_window(limit, samples, latency, 1.0, 100 * MS, limit);
        limit = gradient.update(&window);
        highest = highest.max(limit);
    }
    // Damped formula steps: 22, 24, 26, 28. A rise read twice: 36 by the second round.
    assert!(
        highest >= start * 3 / 2,
        "{start} to at most {highest} in 4 rounds"
    );
}

/// Capacity comes back after a fall that a probe found (a quarter to the whole), and the
/// first round that reads no queue, every slot busy, grew the limit by √ of it, damped,
/// like any first round with no queue: with the rounds after (half the limit, then the
/// limit) that took four rounds of 0.1 s, the second it came back in under 80% of what
/// the server could answer. Under half the limit the last probe began at, a round with no
/// queue is as sure as a second one: half the limit at once.
#[test]
fn capacity_that_comes_back_under_half_the_last_probe_s_limit_is_climbed_at_once() {
    let climb = |mut gradient: Gradient| {
        let limit = run(&mut gradient, 64, 64, 300);
        let mut limit = run(&mut gradient, limit, 16, 100);
        assert!((16..=26).contains(&limit), "{limit} for 16");
        let mut path = vec![limit];
        for _ in 0..2 {
            limit = gradient.update(&saturated(limit, 64));
            path.push(limit);
        }
        path
    };
    let path = climb(Gradient::default());
    assert!(
        path[2] >= 48,
        "three quarters of 64 in two rounds: {path:?}"
    );
    // The mechanism is what does it: without, √ of the limit a round, damped.
    let without = climb(Gradient::default().without(Mechanism::CapacityBack));
    assert!(without[2] < 48, "without CapacityBack: {without:?}");

    // A round within the knee but with a queue beyond the noise (8% over the no-load
    // latency, a round's noise 7%) is no such sign: √ of the limit, damped.
    let mut gradient = Gradient::default();
    let limit = run(&mut gradient, 64, 64, 300);
    let limit = run(&mut gradient, limit, 16, 100);
    let latency = 0.0108;
    let samples = (limit as f64 / latency * 0.1) as u64;
    let window = spread_window(limit, samples, latency, 1.0, 100 * MS, limit);
    let grown = gradient.update(&window);
    assert!(grown <= limit + limit / 4, "{limit} to {grown}");
}

/// The rise in throughput that grows the limit must come with a fall in latency (Little's
/// law at the same limit): a count that rose alone, latency steady, is more often the
/// count's noise, and growing on it doubled a limit already above the server.
#[test]
fn a_rise_in_throughput_alone_with_the_latency_steady_grows_nothing() {
    let mut gradient = Gradient::default().probe_every(1_000);
    run(&mut gradient, 64, 64, 300);
    // Held at 70 (the answers not applied): rounds just above the knee (3%, within its
    // noise), 620 answers each; then three with 800, the latency as it was.
    let knee = gradient.no_load_latency().unwrap().as_secs_f64() * 1.1;
    let near = |samples: u64| spread_window(70, samples, knee * 1.03, 1.0, 100 * MS, 70);
    for _ in 0..30 {
        gradient.update(&near(620));
    }
    let answers: Vec<u64> = (0..3).map(|_| gradient.update(&near(800))).collect();
    // The formula's damped step (70 + √70, half of it), each round: 73. Read as a rise,
    // the second and third would be 105 and 140.
    assert!(answers.iter().all(|&a| a <= 80), "{answers:?}");
}

/// The first estimate's rounds begin as the work ramps up: their throughput counts the
/// time before the first answers, so Little's law read what the work ran at once low (18
/// of the 32 the limit let in). A later round at the same limit then read as "half as
/// much again in flight, no more latency", confirmed the estimate (a queue four service
/// times long), and no probe ever questioned it. What the work ran at once is at least
/// the most it had in flight.
#[test]
fn a_first_estimate_taken_as_the_work_ramps_up_is_not_confirmed_by_the_same_limit() {
    let mut gradient = Gradient::default();
    // The ramp: 20 answers in the first 100 ms, the first ones, at 25 ms.
    let ramp = spread_window(32, 20, 0.025, 1.0, 100 * MS, 32);
    let mut limit = gradient.update(&ramp);
    // Then a server of 8 at 10 ms, saturated at 32: a queue of three service times.
    for _ in 0..400 {
        limit = gradient
            .update(&saturated_at(limit, 8, 10 * MS))
            .clamp(1, 10_000);
    }
    let noload = gradient.no_load_latency().unwrap();
    assert!(
        noload < 15 * MS,
        "the queue became the estimate: {noload:?}"
    );
    assert!(limit <= 16, "{limit} for a server of 8");
}

/// The first estimate is the first hundred samples' mean, within 10% of the service's
/// (one standard error) and biased low (the short requests end first). Read 20% low
/// against a long service, every round after it read within the noise of a queue, and
/// the limit crept up a request a round while the server had room for six times as
/// many. Rounds at no more in flight than the first, with no queue beyond their noise,
/// are readings of the same latency: averaged in, the estimate is the service's, and the
/// server is found in ten seconds rather than twenty.
#[test]
fn an_unconfirmed_estimate_averages_the_rounds_at_the_same_limit() {
    let mut gradient = Gradient::default();
    let (capacity, service) = (64, 0.200);
    // Fifty answers a window of a second at 10 in flight; the first hundred read 160 ms.
    let mut limit = 10;
    for _ in 0..2 {
        limit = gradient.update(&spread_window(limit, 50, 0.160, 1.0, 1000 * MS, limit));
    }
    let mut windows = 0;
    while limit < capacity && windows < 15 {
        let latency = service * (limit as f64 / capacity as f64).max(1.0);
        let samples = (limit.min(capacity) as f64 / service) as u64;
        limit = gradient.update(&spread_window(
            limit,
            samples,
            latency,
            1.0,
            1000 * MS,
            limit,
        ));
        windows += 1;
    }
    assert!(
        limit >= capacity,
        "{limit} after {windows} s for a server of {capacity}"
    );
    let noload = gradient.no_load_latency().unwrap();
    assert!(noload >= 180 * MS, "{noload:?}");
}

/// A service that quickens (here from 20 ms to 10) answers more at once, and its
/// latency falls, as a server whose capacity came back does: both raise the limit. But
/// at the stale estimate the ramp stops only where the queue makes up the difference, at
/// about twice the server, with a queue half of every latency, and no round reads faster
/// than the estimate. A queue adds a wait alike for all: the round's latencies spread as
/// a faster service's do. Such a round holds the limit, and two in a row bring a probe.
#[test]
fn a_service_that_quickens_is_probed_rather_than_ramped_into_a_queue() {
    let wait = |limit: u64, service: f64| service * (limit as f64 / 64.0 - 1.0).max(0.0);
    // Past two probes at 20 ms, the service quickens: in a round half at each, then with
    // the limit in force at `from` (the gradient's own, or one handed to it). The
    // estimate after, the limit's mean over the last two seconds, and its most.
    let quicken_with = |mut gradient: Gradient, from: Option<u64>| {
        let mut seed = 11;
        let mut limit = to_second_probe(&mut gradient, 72, &mut seed, true, |limit| {
            (64, 0.020, wait(limit, 0.020))
        });
        let before = gradient.no_load_latency().unwrap().as_secs_f64();
        assert!(before > 0.017, "the slow service read as {before} s");
        let mut straddle = drawn(limit, 64, 0.020, wait(limit, 0.020), &mut seed);
        straddle.merge(&drawn(limit, 64, 0.010, wait(limit, 0.010), &mut seed));
        let own = gradient.update(&straddle).clamp(1, 10_000);
        limit = from.unwrap_or(own);
        let mut limits = Vec::new();
        for _ in 0..100 {
            limit = gradient
                .update(&drawn(limit, 64, 0.010, wait(limit, 0.010), &mut seed))
                .clamp(1, 10_000);
            limits.push(limit);
        }
        let after = gradient.no_load_latency().unwrap().as_secs_f64();
        let last = limits[80..].iter().sum::<u64>() as f64 / 20.0;
        let (most, least) = (limits.iter().max().copied(), limits.iter().min().copied());
        (after, last, most.unwrap(), least.unwrap())
    };
    let quicken = |from| quicken_with(Gradient::default(), from);
    // Its own limit: the round that reads the faster service holds it (a ramp would
    // queue as long as the service), and the probe finds the service.
    let (after, last, most, least) = quicken(None);
    assert!(after < 0.013, "the estimate stayed at {after} s");
    assert!(
        last < 96.0,
        "the limit held a queue: {last} for a server of 64"
    );
    assert!(most <= 96, "the limit ramped to {most} for a server of 64");
    // (The descent ends where a probe no longer queues: one that reads the faster
    // service with no queue is not taken as queued for its spread alone.)
    assert!(
        least >= 24,
        "the probes went down to {least} for a server of 64"
    );
    // A limit at twice the server when it quickened: at 19 ms a latency, no round reads
    // faster than the estimate of 20; only the spread tells.
    let (after, last, ..) = quicken(Some(128));
    assert!(after < 0.013, "from 128, the estimate stayed at {after} s");
    assert!(
        last < 96.0,
        "from 128, the limit held a queue: {last} for 64"
    );
    // The mechanism is what does it from there: without, the estimate stays stale and
    // the limit holds a queue.
    let (after, last, ..) =
        quicken_with(Gradient::default().without(Mechanism::Quicker), Some(128));
    assert!(
        after >= 0.013 || last >= 96.0,
        "without Quicker: the estimate {after} s, the limit {last}"
    );
}

/// Capacity comes back and the limit climbs to it by sure steps; a probe is due on
/// schedule as it lands. Taken then, the probe cuts the limit it just reached below the
/// server, within the same second, and the climb starts over: the limit lands, then
/// holds, for ten rounds before a scheduled probe may come.
#[test]
fn a_scheduled_probe_waits_for_a_limit_that_climbed_back_to_settle() {
    let climb = |gradient: Gradient| {
        let mut gradient = gradient.probe_every(4);
        let limit = run(&mut gradient, 64, 64, 300);
        let mut limit = run(&mut gradient, limit, 16, 100);
        let mut path = Vec::new();
        for _ in 0..40 {
            limit = gradient.update(&saturated(limit, 64));
            path.push((limit, gradient.probing().is_some()));
        }
        path
    };
    // Rounds from the one that lands the climb (the last limit rise) to the first probe.
    let held = |path: &[(u64, bool)]| {
        let probe = path
            .iter()
            .position(|&(_, probing)| probing)
            .expect("a probe");
        let landed = path[..probe]
            .windows(2)
            .rposition(|w| w[1].0 > w[0].0 + w[0].0 / 4)
            .expect("a climb")
            + 1;
        (path[landed].0, probe - landed)
    };
    let path = climb(Gradient::default());
    let (landed, rounds) = held(&path);
    assert!(landed >= 64, "climbed back to {landed}: {path:?}");
    assert!(
        rounds >= 10,
        "probed {rounds} rounds after landing: {path:?}"
    );
    let without = climb(Gradient::default().without(Mechanism::Settle));
    let (_, rounds) = held(&without);
    assert!(rounds < 10, "without Settle: {rounds} rounds: {without:?}");
}
