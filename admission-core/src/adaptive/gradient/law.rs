//! The law, once per round: the target from the latency's gradient over the no-load
//! estimate, backed off on overload, held or grown; the step toward it; and whether a
//! check or a probe is due.

use super::check::Found;
use super::noise::{self, beyond_doubt, queued};
use super::{Gradient, Move, seconds};
use crate::adaptive::Window;

/// A cut waits for the work to fill the limit: its most in flight at 90% of it ...
const BINDS: f64 = 0.9;
/// ... and on average (throughput × latency, Little's law) at 80%.
const SATURATED: f64 = 0.8;
/// A round spans one and a half latencies since the limit changed: the work admitted
/// before the change has ended by then.
const ROUND_LATENCIES: f64 = 1.5;
/// A window at least four times the latency is a round in itself.
const SHORT_LATENCY: f64 = 0.25;
/// A round that reads no queue may grow the limit on this many samples (the next round
/// corrects a wrong step), fewer than its spread asks for a cut.
const CLEAR_SAMPLES: u64 = 100;
/// The law's gradient goes no lower than this per round: a limit halves at most.
const GRADIENT_FLOOR: f64 = 0.5;
/// The overloaded share's noise: three standard errors of the share the last probe saw.
const OVERLOAD_SIGMAS: f64 = 3.0;
/// The law holds the limit where its target is within this share of it.
const HOLDS: f64 = 0.1;
/// An early probe (a fall in throughput, a faster round) waits this many rounds after
/// the last.
const EARLY_AFTER: u32 = 4;

/// A round, as read once it closes.
pub(super) struct Round {
    /// The controller's limit (fractional) and the one in force.
    pub(super) limit: f64,
    pub(super) window_limit: u64,
    pub(super) count: u64,
    /// Its mean latency.
    pub(super) mean: f64,
    /// The mean's relative noise: the service's spread over √samples.
    pub(super) noise: f64,
    pub(super) throughput: f64,
    pub(super) max_in_flight: u64,
    pub(super) elapsed: f64,
    /// The work filled the limit at some point ...
    pub(super) binds: bool,
    /// ... and on average.
    pub(super) saturated: bool,
}

impl Round {
    /// Its samples, as a number to compute with.
    pub(super) fn samples(&self) -> f64 {
        self.count as f64
    }
}

/// A round as the law reads it.
pub(super) struct Law {
    pub(super) noload: f64,
    /// The round's latency (a skewed service's read by its median).
    pub(super) latency: f64,
    pub(super) knee: f64,
    /// The noise the queue test uses.
    pub(super) noise: f64,
    pub(super) target: f64,
    pub(super) queued: bool,
    /// Unconfirmed, and spread as the service rather than a queue.
    pub(super) wider: bool,
    /// More of the round's requests overloaded than the probes' baseline explains: the
    /// target is the backoff's.
    pub(super) overloaded: bool,
    /// The target is within a tenth of the limit: the law holds it.
    pub(super) holds: bool,
}

impl Gradient {
    /// Adds a window to the round; the round once it spans enough time and samples.
    pub(super) fn next_round(
        &mut self,
        window: &Window,
        latency: f64,
        noload: f64,
    ) -> Option<Window> {
        // A window's samples are of work admitted up to a latency before: just after a
        // change, under the limit before. Such a window is left out.
        let start = self.since_change;
        self.since_change += window.elapsed.as_secs_f64();
        let span = self.reach(window, latency);
        if start >= span || span <= SHORT_LATENCY * window.elapsed.as_secs_f64() {
            self.round.merge(window);
        }
        let round = self.round;
        let latency = seconds(round.mean_latency())?;
        let clear = round.samples >= CLEAR_SAMPLES && latency <= noload * (1.0 + self.tolerance);
        if self.since_change < ROUND_LATENCIES * self.reach(&round, latency)
            || (round.samples < self.spread.enough() && !clear)
        {
            return None;
        }
        self.round = Window::default();
        Some(round)
    }

    fn read(&self, window: &Window, mean: f64) -> Round {
        let samples = window.samples as f64;
        let throughput = window.throughput();
        Round {
            limit: self.limit,
            window_limit: window.limit,
            count: window.samples,
            mean,
            noise: self.spread.cv() / samples.sqrt(),
            throughput,
            max_in_flight: window.max_in_flight,
            elapsed: window.elapsed.as_secs_f64(),
            binds: window.max_in_flight as f64 >= BINDS * window.limit as f64,
            saturated: throughput * mean >= SATURATED * self.limit,
        }
    }

    /// One round's decision: the limit it sets, or a check's or a probe's. A round read
    /// under a check is the check's alone.
    pub(super) fn decide(&mut self, window: &Window, mean: f64, noload: f64) -> u64 {
        let round = self.read(window, mean);
        let latency = self.read_latency(window, noload, mean);
        if let Some(found) = self.check_step(window, latency) {
            self.probes.count_round();
            if let Found::NoQueue(latency) = found {
                self.estimate.checked(latency);
                self.stale.after_probe();
                self.growth.room();
            }
            return self.limit as u64;
        }
        let quick = self.note_quick(&round, &window.spread);
        let rose = self.note_rise(&round, noload, latency);
        let target = self.target(&round, window, noload, latency);
        // (A round that reads a quicker service holds the limit: at the stale estimate
        // the queue it grew into would be read as none.)
        let target = if quick {
            target.min(round.limit)
        } else {
            target
        };
        self.step_toward(target, &round, noload, latency);
        self.probes.count_round();
        let fell = self.note_fall(&round, latency, rose);
        let faster = self.reads_faster(&round, noload, latency) || self.stale.quick_twice();
        let knee = noload * (1.0 + self.tolerance);
        self.check_if_due(window, latency, knee)
            .or_else(|| self.probe_if_due(&round, noload, latency, fell, faster))
            .unwrap_or(self.limit as u64)
    }

    /// The law's reading of a round: a function of the round and the estimates (the
    /// no-load latency, the service's spread, the probes' overload baseline) that
    /// changes nothing. What the other mechanisms note from it is `target`'s.
    pub(super) fn law(&self, round: &Round, window: &Window, noload: f64, latency: f64) -> Law {
        let baseline = self.probes.baseline();
        let overloaded = window.overloaded as f64 / round.samples()
            > baseline + self.threshold + OVERLOAD_SIGMAS * (baseline / round.samples()).sqrt();
        let knee = noload * (1.0 + self.tolerance);
        let gradient = (knee / latency).clamp(GRADIENT_FLOOR, 1.0 + self.tolerance);
        // The queue test reads the spread as measured where it is below the 1 the count
        // takes it as: a queue of many waits (a limit far above a small server) spreads
        // far less than a service.
        let noise = self
            .spread
            .measured_cv(noise::SPREAD_SAMPLES)
            .map_or(round.noise, |cv| {
                round.noise.min(cv / round.samples().sqrt())
            });
        let queued = queued(latency, knee, noise);
        let wider = self.wider(queued, window, noload, latency);
        let target = if overloaded {
            round.limit * self.backoff
        } else {
            Self::allowance(round.limit * gradient)
        };
        Law {
            noload,
            latency,
            knee,
            noise,
            target,
            queued: queued && !wider,
            wider,
            overloaded,
            holds: (target / round.limit - 1.0).abs() <= HOLDS,
        }
    }

    /// The round's target: backed off on overload, else the law's, held or grown; and
    /// what the first estimate, the check and the growth note from the law's reading.
    fn target(&mut self, round: &Round, window: &Window, noload: f64, latency: f64) -> f64 {
        let law = self.law(round, window, noload, latency);
        if law.overloaded {
            self.growth.stop();
            self.observe_check(false, false, window, 0.0);
            return law.target;
        }
        self.first.note_queued(law.queued);
        self.observe_check(
            law.queued && round.saturated && round.binds,
            law.holds,
            window,
            latency,
        );
        self.confirm_first(round, window, noload, latency, law.queued, law.wider);
        if law.target < round.limit {
            self.growth.stop();
            self.cut(round, &law)
        } else if !round.binds {
            // Growing a limit the work did not reach would only raise a number nothing
            // tests (and be far too high when the load comes).
            self.growth.stop();
            round.limit
        } else {
            self.grow(round, &law)
        }
    }

    /// A cut: the law's, but held while an unconfirmed estimate may be the short
    /// requests'.
    fn cut(&self, round: &Round, law: &Law) -> f64 {
        if self.unconfirmed_holds(law.latency, law.knee, law.noise, law.wider) {
            round.limit
        } else {
            law.target
        }
    }

    /// Moves the limit toward `target`: the whole way for a sure move beyond the round's
    /// noise (a second round in a row with no queue, or a queue beyond doubt), by the
    /// smoothing otherwise.
    fn step_toward(&mut self, target: f64, round: &Round, noload: f64, latency: f64) {
        let limit = round.limit;
        let within_noise = (target / limit - 1.0).abs() <= 3.0 * round.noise;
        let sure = if target >= limit {
            self.growth.sure()
        } else {
            beyond_doubt(latency, noload * (1.0 + self.tolerance), round.noise)
        };
        let step = if sure && !within_noise {
            1.0
        } else {
            self.smoothing
        };
        self.move_limit((limit + step * (target - limit)).max(1.0), Move::Law);
        self.growth.stepped(sure && target > limit);
    }

    /// Starts a probe when one is due (on schedule, the limit settled), early (the
    /// throughput fell, a round read faster), or first (an unconfirmed estimate read
    /// queued twice); only while the work fills the limit, or a probe would shed work.
    fn probe_if_due(
        &mut self,
        round: &Round,
        noload: f64,
        latency: f64,
        fell: bool,
        faster: bool,
    ) -> Option<u64> {
        if self.estimate.is_given() {
            return None; // the user gave the estimate
        }
        let since = self.probes.since();
        let early = (fell || faster) && since >= EARLY_AFTER;
        let due = if self.estimate.confirmed() {
            since >= self.scheduled && !self.growth.growing() && self.settled()
        } else {
            self.first.queued_twice() || since >= self.scheduled
        };
        let first = !self.estimate.confirmed() && self.first.queued_twice();
        if !((round.saturated && round.binds && (due || early)) || first) {
            return None;
        }
        // From the limit before this round's step, or what the work used if less (after a
        // fall, from the limit before the cut, which may have read a slower service as a
        // queue).
        let from = if fell {
            round.limit
        } else {
            round.limit.min(self.limit)
        }
        .min(round.max_in_flight.max(1) as f64);
        let sized = self.sizing_latency(fell && !due, noload, latency);
        // An unconfirmed estimate may read low: the first probe is sized from the limit.
        let concurrency = self
            .estimate
            .confirmed()
            .then(|| round.throughput * sized.min(latency));
        let before = round.saturated.then_some(round.throughput);
        // (A first probe's limit is the start's, not one the server ran.)
        let began_at = self.estimate.confirmed().then_some(round.limit);
        Some(self.start_probe(from, concurrency, latency, round.mean, before, began_at))
    }
}

#[cfg(all(test, not(admission_loom), not(miri)))]
mod tests;
