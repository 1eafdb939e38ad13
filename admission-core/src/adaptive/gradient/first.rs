//! The first estimate: the first hundred samples' mean, biased low (the short requests
//! end first) and possibly queued (a limit started far above). Until a probe or a round
//! with more in flight confirms it, rounds that read the same latency are averaged in,
//! and only a probe or a latency twice the knee cuts.

use super::noise::QUEUE_SIGMAS;
use super::{Gradient, Mechanism, Round, seconds};
use crate::adaptive::Window;

/// The first estimate is the mean of this many samples (within 10% for an exponential).
pub(super) const FIRST_SAMPLES: u64 = 100;
/// Half as many again in flight as when the first estimate was taken, with no queue:
/// the estimate stands.
const CONFIRM_IN_FLIGHT: f64 = 1.5;
/// No more in flight than then (within 10%): a reading of the same latency.
const SAME_IN_FLIGHT: f64 = 1.1;
/// A coefficient of variation beyond an exponential's (1), with a margin for the noise of
/// a few hundred samples: latencies spread so wide are a service's, not a queue's (a wait
/// alike for all narrows the spread).
pub(super) const WIDE: f64 = 1.25;
/// Unconfirmed, the limit is cut only when the latency doubles the knee.
const UNCONFIRMED_CUT: f64 = 2.0;

/// The first estimate's state.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct First {
    /// What the work ran at once (throughput × latency) when the estimate was taken.
    in_flight: f64,
    /// The first samples' coefficient of variation, and the limit then.
    cv: Option<(f64, u64)>,
    /// The windows the unconfirmed estimate was read from, merged.
    unconfirmed: Window,
    /// Rounds in a row read as queued.
    queued_rounds: u32,
}

impl First {
    /// Counts the rounds in a row an unconfirmed estimate read queued.
    pub(super) fn note_queued(&mut self, queued: bool) {
        self.queued_rounds = if queued { self.queued_rounds + 1 } else { 0 };
    }

    /// Whether two rounds in a row read queued: the first probe is due.
    pub(super) fn queued_twice(&self) -> bool {
        self.queued_rounds >= 2
    }
}

impl Gradient {
    /// Gathers the first samples; once there are enough, their mean is the estimate.
    pub(super) fn first_samples(&mut self, window: &Window) {
        self.round.merge(window);
        if self.round.samples < FIRST_SAMPLES {
            return;
        }
        self.estimate.first(seconds(self.round.mean_latency()));
        self.seed_jitter(self.round.latency_total.as_nanos());
        // (At least the most in flight: the first round's throughput counts the time
        // before its first answers, and reads low.)
        self.first.in_flight = (self.round.throughput() * self.estimate.latency().unwrap_or(0.0))
            .max(self.round.max_in_flight as f64);
        self.first.unconfirmed = self.round;
        self.first.cv = self.round.spread.bucketed_cv().zip(Some(window.limit));
        self.round = Window::default();
    }

    /// Whether an unconfirmed round read as queued spreads at least as the first samples
    /// did (over `√k`, `k` the reading over the estimate) and wider than an exponential:
    /// not a queue (which narrows the spread) but the long requests the first samples
    /// missed. Not under a limit cut since: a draining queue spreads wide too.
    pub(super) fn wider(&self, queued: bool, round: &Window, noload: f64, latency: f64) -> bool {
        !self.estimate.confirmed()
            && queued
            && self.on(Mechanism::FirstWider)
            && self
                .first
                .cv
                .zip(round.spread.bucketed_cv())
                .is_some_and(|((first, then), cv)| {
                    round.limit >= then
                        && first > 0.0
                        && cv > WIDE
                        && cv >= first * (noload / latency).sqrt()
                })
    }

    /// An unconfirmed estimate is confirmed by a round with half as much again in flight
    /// and no queue (its latency, from more samples, is taken if higher, and the shape is
    /// read from the rounds so far), or averaged with a round of the same.
    pub(super) fn confirm_first(
        &mut self,
        round: &Round,
        window: &Window,
        noload: f64,
        latency: f64,
        queued: bool,
        wider: bool,
    ) {
        if self.estimate.confirmed() {
            return;
        }
        if !queued && round.throughput * latency >= CONFIRM_IN_FLIGHT * self.first.in_flight {
            let median = seconds(self.first.unconfirmed.median_latency());
            self.estimate.confirm(latency.max(noload), median);
        } else if wider
            || self.on(Mechanism::FirstAverage)
                && !queued
                && window.max_in_flight as f64 <= SAME_IN_FLIGHT * self.first.in_flight
        {
            self.first.unconfirmed.merge(window);
            self.estimate
                .averaged(seconds(self.first.unconfirmed.mean_latency()));
        }
    }

    /// Whether an unconfirmed estimate holds the limit where the law would cut it.
    pub(super) fn unconfirmed_holds(
        &self,
        latency: f64,
        knee: f64,
        noise: f64,
        wider: bool,
    ) -> bool {
        !self.estimate.confirmed()
            && (wider || latency < UNCONFIRMED_CUT * knee * (1.0 + QUEUE_SIGMAS * noise))
    }
}

#[cfg(all(test, not(admission_loom), not(miri)))]
mod tests;
