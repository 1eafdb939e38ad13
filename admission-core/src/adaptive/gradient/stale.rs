//! A stale estimate: the service or the server changed since the last probe. A fall in
//! the throughput of the rounds the work filled (fewer at once, or each slower: only a
//! probe tells which) or a round faster than the estimate sets off a probe early; a
//! service that quickened hides behind the queue the stale knee allows, but a queue moves
//! every quartile alike, so its interquartile range tells. Capacity that comes back shows
//! as throughput rising while the latency falls.

use super::noise::margin;
use super::{Gradient, Mechanism, Round};
use crate::adaptive::Spread;

/// Latencies are bucketed eight to a doubling (`Spread`).
const BUCKETS_PER_DOUBLING: f64 = 8.0;
/// The interquartile range under this share of the last probe's: the service quickened.
const QUICK: f64 = 0.6;
/// A probe begun for a quicker service queued when its mean is this much over what its
/// spread says the service takes.
const QUICKENED_QUEUE: f64 = 1.25;
/// Each saturated round's weight in the recent throughput.
const RECENT_WEIGHT: f64 = 0.3;
/// The recent throughput's spread at first (a quarter, squared): nothing reads as a rise.
const RECENT_SPREAD_START: f64 = 0.0625;
/// A change in throughput counts beyond 2.5 standard errors of a round's count, and at
/// least 10%.
const THROUGHPUT_SIGMAS: f64 = 2.5;
const THROUGHPUT_FLOOR: f64 = 0.1;
/// A rise counts beyond 1.5 times how much the recent throughput varies.
const RISE_SPREAD: f64 = 1.5;
/// The reference throughput (the rounds just after a probe) is read from at least this
/// many samples before a fall is judged, and from at most this many (so that a slow
/// drift shows as a fall).
const REFERENCE_MIN: u64 = 200;
const REFERENCE_MAX: u64 = 1000;
/// A faster round is faster than `n` beyond its noise and by at least a tenth.
const FASTER: f64 = 0.1;

/// The recent saturated rounds, averaged.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Recent {
    /// Answers a second.
    throughput: f64,
    /// The throughputs' squared relative deviation from the average.
    spread: f64,
    /// Latency, seconds.
    latency: f64,
}

/// What the stale-estimate checks keep.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Stale {
    /// The first saturated rounds after the last probe: their samples and seconds.
    reference: (u64, f64),
    /// The saturated rounds since, averaged.
    recent: Option<Recent>,
    /// Rounds in a row whose throughput rose beyond its noise, the latency falling.
    rising: u32,
    /// Rounds in a row whose spread reads a service far faster than the estimate.
    quick_rounds: u32,
}

impl Stale {
    /// Whether two rounds in a row read capacity coming back (throughput rising as the
    /// latency falls).
    pub(super) fn rising_twice(&self) -> bool {
        self.rising >= 2
    }

    /// Whether two rounds in a row read a quicker service.
    pub(super) fn quick_twice(&self) -> bool {
        self.quick_rounds >= 2
    }

    /// Sets the rising rounds, for a test of another mechanism.
    #[cfg(all(test, not(admission_loom)))]
    pub(super) fn set_rising(&mut self, rounds: u32) {
        self.rising = rounds;
    }

    /// A probe measured the estimate: what follows is measured from it.
    pub(super) fn after_probe(&mut self) {
        self.reference = (0, 0.0);
        self.recent = None;
        self.quick_rounds = 0;
    }
}

impl Gradient {
    /// What a spread of latencies says the service takes now, as a share of what it took
    /// at the last probe: their interquartile range over the probe's.
    fn service_share(&self, spread: &Spread) -> Option<f64> {
        // (A range narrower than two buckets, a quarter of the mean, is the buckets'
        // noise: a flat service's latencies fall in one or two.)
        let quiet = self
            .probes
            .quiet()
            .filter(|quiet| quiet.iqr >= 2.0 * quiet.mean * 1e6 / BUCKETS_PER_DOUBLING)?;
        Some(spread.interquartile()? / quiet.iqr)
    }

    /// Whether a saturated round's spread reads a service far quicker than at the last
    /// probe; counts such rounds in a row.
    pub(super) fn note_quick(&mut self, round: &Round, spread: &Spread) -> bool {
        let quick = self.on(Mechanism::Quicker)
            && round.saturated
            && self
                .service_share(spread)
                .is_some_and(|share| share < QUICK);
        self.stale.quick_rounds = if quick {
            self.stale.quick_rounds + 1
        } else {
            0
        };
        quick
    }

    /// Whether a probe (`latency` its mean) begun for a service that quickened queued.
    pub(super) fn quickened(&self, latency: f64) -> bool {
        self.stale.quick_twice()
            && self
                .service_share(&self.probes.probed().spread)
                .zip(self.probes.quiet())
                .is_some_and(|(share, quiet)| latency > QUICKENED_QUEUE * share * quiet.mean)
    }

    /// Capacity came back: the server answers more a second than the rounds before,
    /// beyond how much those vary, and the latency fell with it (Little's law at the
    /// same limit), though not below the estimate. Counts such rounds in a row.
    /// Whether a round reads faster than the estimate beyond its noise (`FasterProbe`):
    /// a probe comes early.
    pub(super) fn reads_faster(&self, round: &Round, noload: f64, latency: f64) -> bool {
        self.on(Mechanism::FasterProbe)
            && latency < (1.0 - margin(round.noise).max(FASTER)) * noload
    }

    pub(super) fn note_rise(&mut self, round: &Round, noload: f64, latency: f64) -> bool {
        let cv = self.spread.cv();
        let rose = self.stale.recent.is_some_and(|recent| {
            let needed = (THROUGHPUT_SIGMAS * cv / round.samples().sqrt())
                .max(RISE_SPREAD * recent.spread.sqrt())
                .max(THROUGHPUT_FLOOR);
            self.on(Mechanism::CapacityBack)
                && round.saturated
                && latency >= (1.0 - margin(round.noise).max(THROUGHPUT_FLOOR)) * noload
                && round.throughput > recent.throughput * (1.0 + needed)
                && latency < recent.latency * (1.0 - round.noise)
        });
        self.stale.rising = if rose { self.stale.rising + 1 } else { 0 };
        rose
    }

    /// Follows the throughput of the rounds the work filled, and answers whether it fell
    /// below the reference (the rounds just after the last probe) by a tenth, or several
    /// times a round's noise: the server runs fewer at once, or each request takes
    /// longer, and only a probe tells which. (A round the work did not fill says nothing
    /// of the server: less demand is not less capacity.)
    pub(super) fn note_fall(&mut self, round: &Round, latency: f64, rose: bool) -> bool {
        let (count, seconds) = self.stale.reference;
        if round.saturated {
            self.stale.recent = Some(match self.stale.recent {
                Some(recent) => {
                    let w = RECENT_WEIGHT;
                    let deviation = round.throughput / recent.throughput - 1.0;
                    Recent {
                        throughput: (1.0 - w) * recent.throughput + w * round.throughput,
                        // (A rise is no noise.)
                        spread: if rose {
                            recent.spread
                        } else {
                            (1.0 - w) * recent.spread + w * deviation * deviation
                        },
                        latency: (1.0 - w) * recent.latency + w * latency,
                    }
                }
                None => Recent {
                    throughput: round.throughput,
                    spread: RECENT_SPREAD_START,
                    latency,
                },
            });
        }
        let needed =
            (THROUGHPUT_SIGMAS * self.spread.cv() / round.samples().sqrt()).max(THROUGHPUT_FLOOR);
        let fell = self.on(Mechanism::FallProbe)
            && round.saturated
            && count >= REFERENCE_MIN
            && self
                .stale
                .recent
                .is_some_and(|recent| recent.throughput < count as f64 / seconds * (1.0 - needed));
        if round.saturated && !fell && count < REFERENCE_MAX {
            self.stale.reference = (count + round.count, seconds + round.elapsed);
        }
        fell
    }
}

#[cfg(all(test, not(admission_loom), not(miri)))]
mod tests;
