//! A skewed service (most requests short, a few very long) is read by its median: a
//! queue adds to every latency alike and moves the median as much as the mean, while
//! the long requests, bunching by chance, move the mean and barely the median.

use super::{Gradient, Mechanism};
use crate::adaptive::Window;

/// A service whose median latency is under half its mean is read by its median.
pub(super) const SKEWED: f64 = 0.5;
/// A skewed service's round spans the latency of its long requests: this quantile.
const TAIL: f64 = 0.95;

impl Gradient {
    /// Whether the service reads as skewed, as the probes (or the first estimate's
    /// rounds) have it.
    pub(super) fn skewed(&self) -> bool {
        self.on(Mechanism::Skew) && self.estimate.shape().is_some_and(|shape| shape < SKEWED)
    }

    /// How long a round must span since the limit changed: the latency, or for a skewed
    /// service (as the probes read it, or as the window's own median does) the latency
    /// of its long requests: of the work admitted since the change, what has ended within
    /// a mean latency is the short requests, and reads faster than the server is.
    pub(super) fn reach(&self, window: &Window, latency: f64) -> f64 {
        let skewed = self.skewed()
            || self.on(Mechanism::Skew)
                && window
                    .median_latency()
                    .is_some_and(|median| median.as_secs_f64() < SKEWED * latency);
        let tail = window.spread.quantile(TAIL).filter(|_| skewed);
        tail.map_or(latency, |micros| latency.max(micros / 1e6))
    }

    /// A round's latency as the law reads it: for a skewed service, the no-load mean's
    /// share above the median, plus the round's median (the mean the round would show
    /// without its tail's noise); otherwise its mean.
    pub(super) fn read_latency(&self, round: &Window, noload: f64, mean: f64) -> f64 {
        match (self.estimate.shape(), round.median_latency()) {
            (Some(shape), Some(median)) if shape < SKEWED && self.on(Mechanism::Skew) => {
                noload * (1.0 - shape) + median.as_secs_f64()
            }
            _ => mean,
        }
    }

    /// The service's median over its mean at no load, as read so far.
    #[cfg(all(test, not(admission_loom)))]
    pub(in crate::adaptive) fn shape(&self) -> Option<f64> {
        self.estimate.shape()
    }
}

#[cfg(all(test, not(admission_loom), not(miri)))]
mod tests;
