//! The check of a queue the law holds. At its fixed point the law keeps about
//! `√concurrency` queued and reads that queue round after round. A no-load estimate
//! grown stale (the service slowed as the server grew) reads the same way with no queue
//! at all, and would hold the limit below the server until the next scheduled probe:
//! passively the two cannot be told apart. So, after a few such rounds, the limit goes
//! for one round to what the law takes as the server's concurrency (the allowance off).
//! A queue's latency falls with it, at no cost in throughput (the server stays full); a
//! latency that does not move is the service's own, at no load, and becomes the estimate.

use super::noise::SPREAD_SAMPLES;
use super::{Gradient, Mechanism, Move};
use crate::adaptive::Window;

/// Rounds in a row the law reads a queue at a limit the work fills before a check.
const AFTER: u32 = 3;
/// A check lowers the limit by at least this share, or it is not worth a round ...
const LEAST_DROP: f64 = 0.1;
/// ... and by this many times the two rounds' noise: a queue's latency falls as much,
/// and is read as a queue below ...
const DROP_SIGMAS: f64 = 6.0;
/// ... this many times their noise under the latency before.
const STAY_SIGMAS: f64 = 3.0;

/// What the check keeps.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(super) struct Check {
    /// Rounds in a row read queued at a limit the work filled.
    queued: u32,
    /// The first of them: its limit in force and latency.
    anchor: Option<(u64, f64)>,
    /// The last of them's latency.
    last: f64,
    /// Whether the last of them reads the law holding the limit (its target within a
    /// tenth of it) at the latency of the round before, or the limit cut since the
    /// first with the latency as it was.
    steady: bool,
    /// A check under way.
    pending: Option<Pending>,
}

/// A check under way: the round it began after.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pending {
    /// The limit to go back to.
    resume: f64,
    /// The limit in force in that round, its latency and the latency's relative noise,
    /// and its throughput.
    limit: u64,
    latency: f64,
    noise: f64,
    throughput: f64,
}

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Found {
    /// The latency fell with the limit: the queue is there.
    Queue,
    /// The latency stayed, and the throughput fell with the limit: the service's own
    /// latency at no load, this.
    NoQueue(f64),
    /// The limit in force did not fall (the bounds held it), or the readings disagree
    /// (the server changed meanwhile): nothing learnt.
    Nothing,
}

impl Gradient {
    /// A round's reading (`window`, its latency `latency`): whether the law read a queue
    /// at a limit the work filled, and whether it holds the limit there.
    pub(super) fn observe_check(
        &mut self,
        queued: bool,
        holds: bool,
        window: &Window,
        latency: f64,
    ) {
        let last = std::mem::replace(&mut self.check.last, latency);
        if !queued {
            (self.check.queued, self.check.anchor) = (0, None);
            return;
        }
        self.check.queued += 1;
        let (limit, before) = *self.check.anchor.get_or_insert((window.limit, latency));
        let noise = self.check_noise(window);
        let cut = window.limit as f64 <= (1.0 - LEAST_DROP) * limit as f64;
        let flat = latency >= before * (1.0 - STAY_SIGMAS * noise);
        let same = (latency / last - 1.0).abs() <= STAY_SIGMAS * noise;
        self.check.steady = (holds && same) || (cut && flat);
    }

    /// A round's relative noise: the latencies' CV over √samples, the CV the larger of
    /// the round's and the service's at no load (as the last probe read it, else over
    /// the last windows): a round's, from the few latencies it squares, can read low.
    fn check_noise(&self, window: &Window) -> f64 {
        let service = match self.probes.quiet() {
            Some(quiet) => quiet.cv,
            None => self.spread.measured_cv(SPREAD_SAMPLES).unwrap_or(1.0),
        };
        let cv = window.latency_cv().unwrap_or(1.0).max(service);
        cv / (window.samples.max(1) as f64).sqrt()
    }

    /// Starts a check where one is due: after a round the law read queued (the round
    /// `window`, its latency `latency`), the third in a row, with the work filling the
    /// limit, unless the drop it would make is within the rounds' noise. The limit goes
    /// to the law's concurrency without the allowance: `limit × knee / latency`.
    pub(super) fn check_if_due(&mut self, window: &Window, latency: f64, knee: f64) -> Option<u64> {
        let check = &self.check;
        if self.estimate.is_given()
            || !self.on(Mechanism::Check)
            || !self.estimate.confirmed()
            || check.queued < AFTER
            || !check.steady
        {
            return None;
        }
        let from = window.limit;
        if from <= 1 {
            return None;
        }
        let noise = self.check_noise(window);
        let to = ((from as f64 * knee / latency) as u64).clamp(1, from - 1);
        let drop = 1.0 - to as f64 / from as f64;
        if drop < LEAST_DROP || drop < DROP_SIGMAS * std::f64::consts::SQRT_2 * noise {
            return None;
        }
        self.check.pending = Some(Pending {
            resume: self.limit,
            limit: from,
            latency,
            noise,
            throughput: window.throughput(),
        });
        self.move_limit(to as f64, Move::Check);
        Some(to)
    }

    /// Reads the round of a check under way (`latency` its latency), if one is: what it
    /// found. The limit goes back to where it was.
    pub(super) fn check_step(&mut self, window: &Window, latency: f64) -> Option<Found> {
        let pending = self.check.pending.take()?;
        self.move_limit(pending.resume, Move::Check);
        (self.check.queued, self.check.anchor) = (0, None);
        let share = window.limit as f64 / pending.limit as f64;
        let found = if share >= 1.0 {
            Found::Nothing
        } else {
            // A queue's latency falls as the limit does; a flat one stays within the
            // two rounds' noise (one that rose is a server that changed meanwhile).
            let noise = (pending.noise.powi(2) + self.check_noise(window).powi(2)).sqrt();
            let moved = latency / pending.latency - 1.0;
            // (And the throughput fell with the limit, by half the drop at least: a
            // queue's stays, the server full.)
            let fell = window.throughput() <= pending.throughput * (1.0 + share) / 2.0;
            if moved < -STAY_SIGMAS * noise {
                Found::Queue
            } else if moved <= STAY_SIGMAS * noise && fell {
                Found::NoQueue(latency)
            } else {
                Found::Nothing
            }
        };
        Some(found)
    }
}

#[cfg(all(test, not(admission_loom), not(miri)))]
mod tests;
