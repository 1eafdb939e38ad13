//! A skewed service: read by its median and its shape, its long requests waited for.

use super::*;

/// A skewed service's window means are too noisy to show a queue as long as a service
/// time: the long requests move a window's mean more than such a queue does, and the
/// limit follows the noise, up past the server's concurrency and a half. Read by its
/// median, which the queue moves as much and the long requests little, it stays below.
#[test]
fn a_skewed_service_is_read_by_its_median_and_the_limit_follows_the_queue_not_the_tail() {
    for start in [10, 256] {
        for seed in 1..=4 {
            let mut gradient = Gradient::default();
            let (mut limit, mut state) = (start, seed);
            let (mut low, mut high) = (u64::MAX, 0);
            for round in 0..600 {
                limit = gradient
                    .update(&skewed(limit, 64, &mut state))
                    .clamp(1, 10_000);
                if round >= 200 {
                    (low, high) = (low.min(limit), high.max(limit));
                }
            }
            // 64 busy, and a queue of at most half a service time at 2x the throughput.
            assert!(high <= 96, "from {start}, seed {seed}: up to {high}");
            // And the probes, whose readings of a skewed service are low, go no lower
            // than three quarters of the limit: here 54 and up, not 45.
            assert!(low >= 54, "from {start}, seed {seed}: down to {low}");
        }
    }
}

/// A skewed service's probe reads its median over the shape (the median over the mean at
/// no load): the mean of a short reading is low. But a probe that queued (the capacity
/// fell as it began) has the queue in its median too, and over the shape (a third) the
/// queue would count three times: capped at the reading's mean, it counts once.
#[test]
fn a_skewed_probe_that_queued_counts_its_queue_once() {
    for seed in 1..=4 {
        let mut gradient = Gradient::default();
        let (mut limit, mut state) = (64, seed);
        for _ in 0..600 {
            limit = gradient.update(&skewed(limit, 64, &mut state));
        }
        let mut capacity = 64;
        let mut highest = Duration::ZERO;
        for _ in 0..300 {
            limit = gradient.update(&skewed(limit, capacity, &mut state));
            if gradient.probing() == Some(false) {
                capacity = 40;
            }
            highest = highest.max(gradient.no_load_latency().unwrap());
        }
        assert_eq!(capacity, 40, "seed {seed}: no probe in 300 rounds");
        // The queue of a probe at 0.9 × 64 on 40 workers adds 4 ms to every request: the
        // reading is at most 10 + 4 ms and its noise, not 10 + 3 × 4.
        assert!(
            highest < 20 * MS,
            "seed {seed}: the estimate rose to {highest:?}"
        );
    }
}

/// A skewed service's first estimate read low (its first rounds ended fewer of the long
/// requests than it has: 7 to 9 ms for 10), and a ramp confirmed it. Every round after it
/// read the mean latency over the knee of that estimate, and the limit settled where the
/// gradient's step met its queue allowance: under the server (61 for 64), answering less
/// than it could until the first scheduled probe, ten seconds on. The median of the
/// rounds the estimate was read from, over the estimate, is the service's shape as those
/// rounds show it; read by it (as a probe's shape is read), a round's queue is its median
/// over theirs, whatever the mean missed, and the limit holds the knee's queue.
#[test]
fn a_low_first_estimate_of_a_skewed_service_reads_the_queue_by_the_median() {
    for seed in 1..=4 {
        let mut gradient = Gradient::default();
        let (mut limit, mut state) = (10, seed);
        for _ in 0..10 {
            limit = gradient
                .update(&mixed(limit, 64, 14, &mut state))
                .clamp(1, 10_000);
        }
        let estimate = gradient.no_load_latency();
        let mut settled = Vec::new();
        for round in 0..90 {
            limit = gradient
                .update(&skewed(limit, 64, &mut state))
                .clamp(1, 10_000);
            assert_eq!(gradient.probing(), None, "seed {seed}: a probe at {round}");
            if round >= 30 {
                settled.push(limit);
            }
        }
        // The server's 64 and the knee's queue, 70 and √70 (with a rounding's slack):
        // without the median, 40 to 71 on seed 4, 65 to 76 on seed 2; with the shape
        // read against the estimate before the ramp's reading replaced it, 86 to 88 on
        // seed 1.
        assert!(
            settled.iter().all(|limit| (70..=84).contains(limit)),
            "seed {seed}, first estimate {estimate:?}: {settled:?}"
        );
    }
}

/// The shape a first estimate gives the service (its median over its mean, until a probe
/// reads it) is that of every round the estimate was read from. The first hundred samples
/// are the short requests that end first, their median as short as their mean; read alone,
/// against the estimate the rounds averaged in after them bring up, an exponential service
/// (a shape of ln 2) read 0.49 here on one seed of twelve, as skewed (under 0.5), and its
/// rounds would wait for a tail it does not have.
#[test]
fn a_first_estimate_s_shape_is_read_from_all_its_rounds() {
    for seed in 1..=12 {
        let mut gradient = Gradient::default();
        let (mut limit, mut state) = (10, seed);
        // The first samples: the shorter part of the service (a mean of 8 ms for 10).
        limit = gradient
            .update(&exponential(limit, 64, 8.0, &mut state))
            .clamp(1, 10_000);
        let mut rounds = 0;
        while gradient.shape().is_none() && rounds < 100 {
            limit = gradient
                .update(&exponential(limit, 64, 10.0, &mut state))
                .clamp(1, 10_000);
            rounds += 1;
        }
        let shape = gradient.shape();
        // (`SKEWED` is 0.5.)
        assert!(
            shape.is_some_and(|shape| (0.5..=0.85).contains(&shape)),
            "seed {seed}: {shape:?} after {rounds} rounds, for ln 2"
        );
    }
}

/// Growth from below on a skewed service: in the window just after the limit rises, the
/// new slots' ended requests are their short ones, and the window reads faster than the
/// server is: the limit doubled on it, far past the server. A skewed round spans its
/// tail (the 95th percentile) since the change, as a round spans the mean latency.
#[test]
fn a_skewed_round_waits_for_its_long_requests_before_growing() {
    for seed in 1..=4 {
        let mut gradient = Gradient::default();
        let (mut limit, mut before, mut state) = (10, 10, seed);
        let mut highest = 0;
        for _ in 0..300 {
            let window = skewed_after(limit, before, 64, &mut state);
            before = limit;
            limit = gradient.update(&window).clamp(1, 10_000);
            highest = highest.max(limit);
        }
        // A growth streak may overshoot (up to 142 here, once, with an estimate read high
        // from the first samples); doubling on windows of short requests, the limit ran
        // past 230, nearly four times the server.
        assert!(highest < 3 * 64, "seed {seed}: up to {highest}");
    }
}

/// Started far below a server of mostly short requests and a few long ones, the first
/// hundred samples are the short requests (they end first), and the first estimate reads
/// a third of the service's mean. Every round after it read as a queue against it: the
/// limit held, then was cut, then probes (whose readings are taken and checked a step
/// lower while the estimate is unconfirmed) took seconds at a low limit; in the
/// simulator the server was found five to seven seconds on. But a queue adds a wait
/// alike to every latency, which narrows their spread, and these rounds spread wider
/// than the first samples did: such a round is the service read over more samples,
/// averaged into the estimate (at any limit no lower than the first's), not a queue. No
/// probe or cut is needed: here the server is found in 2.4 to 4 seconds.
#[test]
fn a_first_estimate_that_missed_the_long_requests_is_corrected_by_a_wider_round() {
    for seed in 1..=4 {
        let mut gradient = Gradient::default();
        let mut state = seed;
        // The first hundred answers, at 8 in flight: the short requests, 3 ms on average.
        assert_eq!(gradient.update(&drawn(8, 3, 0.003, 0.0, &mut state)), 8);
        let first = gradient.no_load_latency().unwrap();
        assert!(first < 4 * MS, "{first:?}");
        // The rounds, from 10 (more in flight than the first samples had, as where the
        // limit grew a step before the first round ended).
        let mut limit = 10;
        let mut windows = 0;
        while limit < 64 && windows < 50 {
            limit = gradient
                .update(&skewed(limit, 64, &mut state))
                .clamp(1, 10_000);
            windows += 1;
            assert_eq!(
                gradient.probing(),
                None,
                "seed {seed}: a probe at {windows}"
            );
            // Nor a cut: the rounds are the service, however high against the estimate.
            assert!(limit >= 10, "seed {seed}: cut to {limit} at {windows}");
        }
        let noload = gradient.no_load_latency().unwrap();
        assert!(
            limit >= 64,
            "seed {seed}: {limit} after {windows} windows; the estimate {noload:?}"
        );
        assert!(noload >= 7 * MS, "seed {seed}: {noload:?}");
    }
}
