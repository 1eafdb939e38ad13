//! A limit below the server, held there by a no-load estimate grown stale, must grow
//! (`gradient/check.rs`): the service slows as the server grows, so the latency at the
//! old limit reads as the old server's queue against the old estimate.

use proptest::prelude::*;

use super::flat;
use crate::adaptive::{Algorithm, Gradient};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The estimate is taken and confirmed on a server of `before` workers at `ms`, the
    /// limit `L` held at its queue; then the server grows `grown` times and each request
    /// takes about `L / before` times as long (`drift` off that): at `L`, the same
    /// latency and throughput as before, within a few percent, so nothing the rounds
    /// read has changed. Within six seconds (a few dozen rounds: the scheduled probe is
    /// a hundred away) the limit is near the new server, and stays.
    #[test]
    fn a_limit_below_the_server_grows_whatever_the_estimate_says(
        seed in 1u64..u64::MAX,
        before in 8u64..40,
        ms in 2.0f64..20.0,
        grown in 2u64..5,
        drift in -0.04f64..0.04,
    ) {
        let mut state = seed;
        let mut gradient = Gradient::default();
        let mut limit = 4 * before;
        for _ in 0..200 {
            limit = gradient.update(&flat(limit, before, ms / 1e3, &mut state)).clamp(1, 10_000);
        }
        let slower = (limit as f64 / before as f64).max(1.0) * (1.0 + drift);
        let (capacity, service) = (grown * before, slower * ms / 1e3);
        let mut limits = Vec::new();
        for _ in 0..80 {
            limit = gradient.update(&flat(limit, capacity, service, &mut state)).clamp(1, 10_000);
            limits.push(limit);
        }
        let last = limits[60..].iter().copied().min().unwrap_or(0);
        prop_assert!(
            last as f64 >= 0.75 * capacity as f64,
            "{capacity} workers at {service:.4} s: the limit's last: {:?}",
            &limits[40..]
        );
    }
}
