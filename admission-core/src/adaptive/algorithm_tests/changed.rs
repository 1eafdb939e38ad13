//! A server that shrinks as a probe begins must not become the estimate
//! (`gradient/probe.rs`, `ProbeChanged`): the probe's reading is the new server's queue,
//! and an estimate taken from it would hold the limit at that queue.

use proptest::prelude::*;

use super::flat;
use crate::adaptive::{Algorithm, Gradient};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// A server of `workers` at `ms` (a flat latency), the limit settled near it; as the
    /// next scheduled probe lowers the limit (`at_drain`) or begins to measure, the server
    /// shrinks to a quarter. The estimate stays within a fourth of the service's latency
    /// (the probe's descent takes up to two seconds at the smaller server), and from
    /// three seconds on the limit is within half again of the law's target for the
    /// quarter, `c + √c` (the steps around it are whole requests). Taken whole, the
    /// probe's queue made the estimate about three times the service's, and held the
    /// limit at about three times the quarter.
    #[test]
    fn a_server_that_shrinks_as_a_probe_begins_is_not_the_estimate(
        seed in 1u64..u64::MAX,
        workers in 32u64..128,
        ms in 4.0f64..20.0,
        at_drain in any::<bool>(),
    ) {
        let mut state = seed;
        let mut gradient = Gradient::default();
        let mut limit = 2 * workers;
        let service = ms / 1e3;
        let mut shrunk = false;
        // (Settled first: 15 s, the first probe and its checks long over.)
        for window in 0..600 {
            limit = gradient.update(&flat(limit, workers, service, &mut state)).clamp(1, 10_000);
            let phase = if at_drain { Some(false) } else { Some(true) };
            if window >= 150 && gradient.probing() == phase {
                shrunk = true;
                break;
            }
        }
        prop_assert!(shrunk, "no probe in 60 s");
        let quarter = workers / 4;
        let mut limits = Vec::new();
        for _ in 0..50 {
            limit = gradient.update(&flat(limit, quarter, service, &mut state)).clamp(1, 10_000);
            limits.push(limit);
        }
        let estimate = gradient.no_load_latency().map_or(0.0, |n| n.as_secs_f64());
        prop_assert!(
            estimate <= 1.25 * service,
            "{quarter} workers at {ms:.1} ms: the estimate {estimate:.4} s"
        );
        let most = 1.5 * (quarter as f64 + (quarter as f64).sqrt());
        let high = limits[30..].iter().copied().max().unwrap_or(0);
        prop_assert!(
            high as f64 <= most,
            "{quarter} workers at {ms:.1} ms: the limit: {limits:?}"
        );
    }
}
