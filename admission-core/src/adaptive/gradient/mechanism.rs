//! The mechanisms by name, each of which can be turned off to measure what it earns.
//!
//! Each is switched only in its own file, which keeps its state: `probe.rs` (`Descent`,
//! `ProbeQueueSpread`, `ProbeChanged`, `DriftSizing`), `growth.rs` (`Ramp`, `CapacityBack`'s climb,
//! `Settle`), `stale.rs` (`FallProbe`, `FasterProbe`, `Quicker`, and the rise
//! `CapacityBack` reads), `skew.rs` (`Skew`), `first.rs` (`FirstAverage`,
//! `FirstWider`) and `check.rs` (`Check`). The law (`law.rs`) asks them and checks no
//! switch itself. Without the `ablation` feature, every switch reads `true`.

/// One of [`Gradient`](super::Gradient)'s mechanisms, by name: turned off with
/// `Gradient::without` (feature `ablation`), for measuring what each earns
/// (`admission-bench`'s ablation table). Not for production use: every mechanism is on,
/// for a reason that table gives.
#[doc(hidden)]
#[cfg_attr(not(any(test, feature = "ablation")), allow(unreachable_pub))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mechanism {
    /// A probe that reads lower than the estimate probes 30% lower at once.
    Descent,
    /// A probe far above the estimate whose latencies spread as a queue's is a queue.
    ProbeQueueSpread,
    /// A probe whose latency rose over the round before it (the server changed as it
    /// began) is dropped, and another comes soon.
    ProbeChanged,
    /// Growth speeds up round after round with no queue (√limit, half, the limit).
    Ramp,
    /// Capacity that comes back (throughput rising, or no queue under half the last
    /// probe's limit) is climbed at once.
    CapacityBack,
    /// A fall in throughput sets off a probe early.
    FallProbe,
    /// A round faster than the estimate sets off a probe early.
    FasterProbe,
    /// A service that quickened behind a queue is read from its interquartile range.
    Quicker,
    /// A skewed service is read by its median.
    Skew,
    /// Unconfirmed, rounds that read the same latency are averaged into the estimate.
    FirstAverage,
    /// Unconfirmed, a round spread wider than the first samples is the service, not a queue.
    FirstWider,
    /// A scheduled probe waits ten rounds after the limit grew for sure.
    Settle,
    /// A probe set off by a fall with the latency near the estimate is sized from the
    /// geometric mean of the two.
    DriftSizing,
    /// A queue the law holds (or cuts toward, the latency unmoved) is checked by a round
    /// without the allowance; a latency that stays is the no-load latency.
    Check,
}

#[cfg(any(test, feature = "ablation"))]
impl Mechanism {
    /// Every mechanism, in the order the ablation table lists them.
    pub const ALL: [Mechanism; 14] = [
        Self::Descent,
        Self::ProbeQueueSpread,
        Self::ProbeChanged,
        Self::Ramp,
        Self::CapacityBack,
        Self::FallProbe,
        Self::FasterProbe,
        Self::Quicker,
        Self::Skew,
        Self::FirstAverage,
        Self::FirstWider,
        Self::Settle,
        Self::DriftSizing,
        Self::Check,
    ];

    pub(super) fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::Mechanism;
    use crate::adaptive::Gradient;

    #[test]
    fn turning_one_mechanism_off_leaves_the_others_on() {
        for off in Mechanism::ALL {
            let gradient = Gradient::default().without(off);
            for mechanism in Mechanism::ALL {
                assert_eq!(
                    gradient.on(mechanism),
                    mechanism != off,
                    "{off:?}, {mechanism:?}"
                );
            }
        }
    }
}
