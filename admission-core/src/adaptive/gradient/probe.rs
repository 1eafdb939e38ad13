//! The no-load estimate's probe: the limit is lowered below the server's concurrency,
//! the queue drains, and the latency measured then is the no-load latency.

use super::noise::{SAMPLES_PER_CV2, margin};
use super::skew::SKEWED;
use super::{Gradient, Mechanism, Move, seconds};
use crate::adaptive::Window;

/// A probe measures until it has this many samples (more where the latencies spread
/// more), or for this many windows, whichever comes first.
const MEASURE_SAMPLES: u64 = 200;
const MEASURE_WINDOWS: u32 = 10;
/// ... and over at least ten latencies per unit of CV² (at most fifty): a short reading
/// of a heavy tail reads low, its long requests unfinished.
const MEASURE_LATENCIES: f64 = 10.0;
const MEASURE_LATENCIES_CAP: f64 = 50.0;
/// A reading this far from the estimate (beyond its noise) is decided at once: a service
/// that doubled its time need not be measured to the last percent.
const DECIDED: f64 = 0.25;
/// The queue drains in about the latency of the round before, with a margin for the tail.
const DRAIN_LATENCIES: f64 = 1.5;
/// A probe this far above the estimate may have queued (at a server that shrank as it
/// began): its spread tells.
const MAX_RAISE: f64 = 1.5;
/// What a probe that found the estimate high multiplies its limit by for the next.
const DESCENT: f64 = 0.7;
/// A skewed service's probe goes no lower than this share of the limit: its estimate
/// reads low (the short requests end first).
const SKEWED_PROBE_FLOOR: f64 = 0.75;
/// A probe the work filled reached this share of its limit: one it did not fill queued
/// no more than the work brought, and a lower one would only shed work.
const FILLED: f64 = 0.9;
/// A probe that needs checking is followed by another this many rounds on.
const SOON: u32 = 10;
/// A fall with the latency within half again of `n` may be a service slowing little by
/// little: its probe is sized from the geometric mean of the two.
const DRIFT: f64 = 1.5;

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(super) enum Phase {
    #[default]
    Normal,
    /// The limit is lowered to `probe` until the queue has drained: for `left` seconds.
    Draining { probe: Probe, left: f64 },
    /// The limit is lowered; these windows' samples are the estimate.
    Measuring { probe: Probe, reading: Reading },
}

/// One probe: where it began and what it is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Probe {
    /// The limit to resume at if nothing better is known.
    resume: f64,
    /// The limit the probe holds.
    limit: u64,
    /// An earlier probe of this run found the estimate high (a descent).
    descended: bool,
    /// The throughput of the saturated round before the probe, if it was.
    before: Option<f64>,
    /// The mean latency of the round before the probe (in a descent, the last probe's).
    mean: f64,
}

/// The probes' state.
#[derive(Debug, Clone, Default)]
pub(super) struct Probes {
    phase: Phase,
    /// Rounds since the last probe ended.
    since: u32,
    /// In a descent, the last probe's throughput and samples.
    chain: Option<(f64, u64)>,
    /// In a descent, what a probe read as queued (by its spread) answered a second: all
    /// the server can, where it shrank as the probes began.
    shrunk: Option<f64>,
    /// The latencies at no load, as the last probe read them.
    quiet: Option<Quiet>,
    /// The share of overloaded samples the last probe saw: what the service fails with
    /// no queue, which no limit cures.
    baseline: f64,
    /// The probe's measuring windows, merged (for their median and spread).
    probed: Window,
    /// The limit in force when the last probe began (the estimate confirmed by then).
    from: Option<f64>,
}

/// The latencies at no load, as a probe read them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Quiet {
    /// Their coefficient of variation.
    pub(super) cv: f64,
    /// Their interquartile range, in microseconds.
    pub(super) iqr: f64,
    /// Their mean, in seconds.
    pub(super) mean: f64,
}

impl Probes {
    /// A round closed outside a probe.
    pub(super) fn count_round(&mut self) {
        self.since += 1;
    }

    /// Rounds since the last probe ended.
    pub(super) fn since(&self) -> u32 {
        self.since
    }

    /// The share of overloaded samples the last probe saw.
    pub(super) fn baseline(&self) -> f64 {
        self.baseline
    }

    /// The limit in force when the last probe began, if the estimate was confirmed then.
    pub(super) fn from(&self) -> Option<f64> {
        self.from
    }

    /// The latencies at no load, as the last probe read them.
    pub(super) fn quiet(&self) -> Option<Quiet> {
        self.quiet
    }

    /// The last probe's measuring windows, merged.
    pub(super) fn probed(&self) -> &Window {
        &self.probed
    }

    /// Sets the latencies at no load the last probe read, for a test of another
    /// mechanism.
    #[cfg(all(test, not(admission_loom)))]
    pub(super) fn set_quiet(&mut self, quiet: Quiet) {
        self.quiet = Some(quiet);
    }

    /// Sets what the last probe saw, for a test of another mechanism.
    #[cfg(all(test, not(admission_loom)))]
    pub(super) fn set_last(&mut self, from: Option<f64>, baseline: f64) {
        (self.from, self.baseline) = (from, baseline);
    }
}

/// Samples gathered over a probe's measuring windows.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(super) struct Reading {
    samples: u64,
    /// Latencies added up, seconds.
    total: f64,
    /// Their squares added up (from each window's mean and spread), seconds².
    squares: f64,
    overloaded: u64,
    windows: u32,
    /// Seconds the windows lasted.
    elapsed: f64,
}

impl Reading {
    fn add(&mut self, window: &Window, mean: f64, cv: f64) {
        let n = window.samples as f64;
        self.samples += window.samples;
        self.total += mean * n;
        self.squares += n * mean * mean * (1.0 + cv * cv);
        self.overloaded += window.overloaded;
        self.windows += 1;
        self.elapsed += window.elapsed.as_secs_f64();
    }

    fn mean(&self) -> f64 {
        self.total / self.samples.max(1) as f64
    }

    /// The latencies' coefficient of variation.
    fn cv(&self) -> f64 {
        let n = self.samples.max(1) as f64;
        let mean = self.mean();
        let variance = (self.squares / n - mean * mean).max(0.0);
        variance.sqrt() / mean.max(f64::MIN_POSITIVE)
    }

    /// The relative noise of the mean: the latencies' spread over √samples.
    fn noise(&self) -> f64 {
        self.cv() / (self.samples.max(1) as f64).sqrt()
    }

    fn throughput(&self) -> f64 {
        self.samples as f64 / self.elapsed.max(1e-9)
    }
}

impl Gradient {
    /// Lowers the limit to a probe's: `share` of `concurrency` (the server's, as the
    /// round before shows it) or of `limit`, and waits for the queue to drain. `began_at`:
    /// the limit in force, where the estimate is confirmed; `mean`, the round's mean
    /// latency (`latency` as the law read it).
    pub(super) fn start_probe(
        &mut self,
        limit: f64,
        concurrency: Option<f64>,
        latency: f64,
        mean: f64,
        before: Option<f64>,
        began_at: Option<f64>,
    ) -> u64 {
        let mut probe = concurrency.unwrap_or(limit).min(limit) * self.probe;
        if self.skewed() {
            probe = probe.max(SKEWED_PROBE_FLOOR * limit);
        }
        let probe = probe.max(1.0) as u64;
        self.growth.stop();
        self.probes.from = began_at;
        self.probes.phase = Phase::Draining {
            probe: Probe {
                resume: limit,
                limit: probe,
                descended: false,
                before,
                mean,
            },
            left: DRAIN_LATENCIES * latency,
        };
        self.changed();
        probe
    }

    /// The latency a probe sizes the server's concurrency from: the estimate's, or, for
    /// a probe set off by a fall (`fell_early`) with the latency near the estimate
    /// (`DriftSizing`), the geometric mean of the two (a service slowing little by
    /// little).
    pub(super) fn sizing_latency(&self, fell_early: bool, noload: f64, latency: f64) -> f64 {
        if self.on(Mechanism::DriftSizing) && fell_early && latency <= DRIFT * noload {
            (noload * latency).sqrt()
        } else {
            noload
        }
    }

    /// Advances a probe by one window; `None` outside a probe.
    pub(super) fn probe_step(&mut self, window: &Window, latency: f64) -> Option<u64> {
        match self.probes.phase {
            Phase::Normal => None,
            Phase::Draining { probe, left } => {
                let left = left - window.elapsed.as_secs_f64();
                self.probes.phase = if left > 0.0 {
                    Phase::Draining { probe, left }
                } else {
                    self.probes.probed = Window::default();
                    Phase::Measuring {
                        probe,
                        reading: Reading::default(),
                    }
                };
                Some(probe.limit)
            }
            Phase::Measuring { probe, mut reading } => {
                // (A server that changed makes the windows before this one another's.)
                let changed = self.server_changed(&probe, window, latency);
                if changed {
                    (reading, self.probes.probed) = (Reading::default(), Window::default());
                }
                reading.add(window, latency, self.spread.cv());
                self.probes.probed.merge(window);
                if !changed && self.measuring(&reading) {
                    self.probes.phase = Phase::Measuring { probe, reading };
                    return Some(probe.limit);
                }
                Some(self.measured(reading, probe, changed))
            }
        }
    }

    /// Whether a probe needs more: samples enough for its spread over long enough for
    /// the long requests begun in it to end, unless it reads far from the estimate (it
    /// sheds while it lasts) or above it beyond its noise (a short reading only reads
    /// low).
    fn measuring(&self, reading: &Reading) -> bool {
        let cv = reading.cv().clamp(1.0, 4.0);
        let enough = MEASURE_SAMPLES.max((SAMPLES_PER_CV2 * cv * cv) as u64);
        let latencies = (MEASURE_LATENCIES * cv * cv).min(MEASURE_LATENCIES_CAP);
        let long = reading.elapsed >= latencies * reading.mean();
        let decided = self
            .estimate
            .latency()
            .is_some_and(|n| (reading.mean() / n - 1.0).abs() > DECIDED + 3.0 * reading.noise());
        let margin = margin(std::f64::consts::SQRT_2 * reading.noise());
        let high = self
            .estimate
            .latency()
            .is_some_and(|n| reading.mean() > n * (1.0 + margin));
        !decided
            && (reading.samples < enough || !(long || high))
            && reading.windows < MEASURE_WINDOWS
    }

    /// The probe's latency: its mean, or for a skewed service its median over the
    /// service's shape (but no more than its mean and the mean's noise: a probe that
    /// queued has the queue in its median once, which over the shape would count
    /// `1 / shape` times). Updates the shape.
    fn probe_latency(&mut self, reading: &Reading) -> f64 {
        let median = seconds(self.probes.probed.median_latency());
        let latency = match (self.estimate.shape(), median) {
            (Some(shape), Some(median)) if shape < SKEWED => {
                (median / shape).min(reading.mean() * (1.0 + 3.0 * reading.noise()))
            }
            _ => reading.mean(),
        };
        if let Some(median) = median {
            let shape = median / reading.mean().max(f64::MIN_POSITIVE);
            self.estimate.shaped(shape);
        }
        latency
    }

    /// In a descent, this probe (a step lower) against the one before, where a step is
    /// beyond the noise of both: `Some(true)` if it served within half a step of as many
    /// (both queued), `Some(false)` if fewer (it ran below the knee).
    fn held(&self, reading: &Reading, descended: bool) -> Option<bool> {
        let (previous, count) = self.probes.chain.filter(|_| descended)?;
        let noise = self.spread.cv() * (1.0 / reading.samples as f64 + 1.0 / count as f64).sqrt();
        ((1.0 - DESCENT) > 3.0 * noise)
            .then(|| reading.throughput() >= previous * (1.0 - (1.0 - DESCENT) / 2.0))
    }

    /// A probe's reading is in: the estimate follows it (or the probe goes lower), and
    /// the limit resumes.
    fn measured(&mut self, reading: Reading, probe: Probe, changed: bool) -> u64 {
        let latency = self.probe_latency(&reading);
        // The estimate is itself a reading about as noisy: their difference is √2 times
        // as noisy as one.
        let margin = margin(std::f64::consts::SQRT_2 * reading.noise());
        self.probes.baseline = reading.overloaded as f64 / reading.samples.max(1) as f64;
        let held = self.held(&reading, probe.descended);
        // (A fall is not read where the latencies spread wider than an exponential's:
        // such a service's answers come in bunches.)
        let fell = held == Some(false)
            && self
                .probes
                .probed
                .spread
                .bucketed_cv()
                .is_some_and(|cv| cv <= super::first::WIDE);
        let held = held == Some(true);
        // Lower than the estimate: by more than its noise, or (where both probes queued,
        // or the probe reads sharp enough to tell a step) below the midpoint of a step.
        let sharp = std::f64::consts::SQRT_2 * reading.noise() < (1.0 - DESCENT) / 4.0;
        let lower = self.estimate.latency().is_none_or(|n| {
            latency < (1.0 - margin) * n
                || ((held || (probe.descended && sharp)) && latency < (1.0 + DESCENT) / 2.0 * n)
        });
        let filled = self.probes.probed.max_in_flight as f64 >= FILLED * probe.limit as f64;
        // Far above the estimate and spread as a queue (it may have queued at a server
        // that shrank as it began), above the round before it (the server changed as it
        // began), or a service that quickened behind a queue.
        let queued = changed
            || self.estimate.latency().is_some_and(|n| {
                self.on(Mechanism::ProbeQueueSpread)
                    && latency > MAX_RAISE * n
                    && !self.spreads_as_a_service(latency, n)
            })
            || self.quickened(latency);
        let descend = lower || !self.estimate.confirmed() || queued;
        if descend && self.on(Mechanism::Descent) && filled && probe.limit > 1 {
            return self.descend(&reading, probe, latency, queued);
        }
        let soon = probe.descended && !fell;
        self.conclude(probe, latency, margin, lower, soon)
    }

    /// The estimate was high (or unmeasured, or the probe queued): take the reading, and
    /// probe a step lower at once, until a probe no longer finds less.
    fn descend(&mut self, reading: &Reading, probe: Probe, latency: f64, queued: bool) -> u64 {
        // (A confirmed estimate descends only on a reading below it, or one that queued:
        // either way the reading is the estimate now.)
        self.estimate.descended(latency);
        self.probes.chain = Some((reading.throughput(), reading.samples));
        if queued {
            self.probes.shrunk = Some(reading.throughput());
        }
        let next = ((probe.limit as f64 * DESCENT) as u64).max(1);
        self.probes.phase = Phase::Draining {
            probe: Probe {
                limit: next,
                descended: true,
                mean: reading.mean(),
                ..probe
            },
            left: DRAIN_LATENCIES * latency,
        };
        next
    }

    /// The probe ends: the estimate takes its reading (averaged in where it agrees), and
    /// the limit resumes where the round before the probe says the server's concurrency
    /// is.
    fn conclude(
        &mut self,
        probe: Probe,
        latency: f64,
        margin: f64,
        lower: bool,
        soon: bool,
    ) -> u64 {
        let spread = &self.probes.probed.spread;
        self.probes.quiet = spread
            .bucketed_cv()
            .zip(spread.interquartile())
            .map(|(cv, iqr)| Quiet {
                cv,
                iqr,
                mean: latency,
            });
        self.stale.after_probe();
        self.estimate.probed(latency, margin, lower);
        self.probes.phase = Phase::Normal;
        self.probes.chain = None;
        self.draw_schedule();
        self.probes.since = if soon {
            self.scheduled.saturating_sub(SOON)
        } else {
            0
        };
        let noload = self.estimate.latency().unwrap_or(latency);
        // (A server that shrank as the probe began answers what its queued probe did.)
        let before = probe
            .before
            .map(|b| self.probes.shrunk.take().map_or(b, |s| b.min(s)));
        let limit = match before {
            Some(throughput) => Self::allowance(throughput * noload * (1.0 + self.tolerance)),
            None => probe.resume,
        };
        self.move_limit(limit.max(probe.limit as f64).max(1.0), Move::ProbeEnds);
        self.limit as u64
    }

    /// Whether a probe's window (its mean latency `latency`) reads a server that changed
    /// as the probe began: a lower limit cannot make an unchanged server's latency rise,
    /// and this one rose over the round before the probe by more than `DECIDED` and three
    /// times the window's noise (`ProbeChanged`). The probe then descends, as one that
    /// queued does: a queue's latency falls a step lower, a slower service's stays.
    fn server_changed(&self, probe: &Probe, window: &Window, latency: f64) -> bool {
        let cv = self.spread.cv().max(window.latency_cv().unwrap_or(0.0));
        let noise = std::f64::consts::SQRT_2 * cv / (window.samples.max(1) as f64).sqrt();
        self.on(Mechanism::ProbeChanged)
            && window.samples > 0
            && latency > probe.mean * (1.0 + DECIDED.max(3.0 * noise))
    }

    /// Whether a probe's reading `k` times the estimate `n` spreads as a slower service's
    /// latencies do rather than as a queue's: a coefficient of variation at least the
    /// service's (as the last probe read it, else the rounds') over `√k`, the
    /// geometric midpoint of a slower service's (the same) and a queue's (`1 / k` of it).
    /// Where either is unmeasured, the throughput alone decides.
    fn spreads_as_a_service(&self, latency: f64, n: f64) -> bool {
        let rounds = self.spread.measured_cv(super::noise::SPREAD_SAMPLES);
        // (The last probe's where there is one: the rounds' takes in the queues that
        // built and drained since, and reads a flat service as spread.)
        let service = self.probes.quiet.map(|quiet| quiet.cv).or(rounds);
        service
            .zip(self.probes.probed.spread.bucketed_cv())
            .is_none_or(|(service, probe)| probe >= service * (n / latency).sqrt())
    }

    /// Whether a probe is draining the queue (`Some(false)`) or measuring (`Some(true)`);
    /// `None` outside a probe.
    #[cfg(all(test, not(admission_loom)))]
    pub(in crate::adaptive) fn probing(&self) -> Option<bool> {
        match self.probes.phase {
            Phase::Normal => None,
            Phase::Draining { .. } => Some(false),
            Phase::Measuring { .. } => Some(true),
        }
    }
}

#[cfg(all(test, not(admission_loom), not(miri)))]
mod tests;
