use super::{Algorithm, Window};

/// A delay-gradient controller: the limit follows the ratio of the no-load latency to the
/// latency now, plus a small queue allowance.
///
/// Each window, with `m` the window's mean latency and `n` the no-load estimate:
///
/// ```text
/// gradient = min(1, n × (1 + tolerance) / m)        (and at least 0.5)
/// target   = limit × gradient + √limit
/// limit    = target                                 if target > limit, unless app-limited
///            limit + smoothing × (target − limit)   if target < limit
/// ```
///
/// When the server is saturated (its workers all busy, a queue forming), Little's law
/// makes `m / n` equal to the limit over the server's concurrency, so one step takes the
/// limit to that concurrency times `1 + tolerance` plus `√limit`: just above the knee,
/// where the server is busy all the time and its queue stays short (one step with no
/// smoothing; with the default smoothing of 0.5 the way down halves the distance each
/// window). Below the knee the gradient is 1 and the limit grows by `√limit` a window,
/// while the work uses it.
///
/// # The no-load estimate, and why it is probed
///
/// The hard part is `n`. The minimum of recent samples (Gradient2's and Envoy's
/// starting point) reads far too low when service times vary: the smallest of a
/// thousand exponential service times is a thousandth of their mean. A long average of
/// recent latencies catches up with the current latency under sustained load, so the
/// gradient tends to 1 and the limit runs away. So this controller measures `n` the way
/// BBR measures round-trip time: every [`probe_every`](Self::probe_every) windows it
/// lowers the limit, for two windows, to [`probe`](Self::probe) (90%) of the concurrency
/// the server showed (throughput × `n`), below the knee, where nothing queues; the first
/// window lets the queue drain, and the second window's mean latency is the estimate (averaged
/// with the previous one unless they disagree by more than 20%: the service changed).
/// A probe that finds less than 95% of the estimate may itself have queued (the estimate
/// it was sized from was high), so it takes the lower reading and probes again at once,
/// 19% lower, until a probe finds no less, and once more ten windows later. The very
/// first probe always takes a second step (the first estimate comes from whatever the
/// first window saw, queue included). A limit started far above the server's comes down
/// in a few seconds. A probe costs
/// about 10% of two windows' throughput: with the defaults (100 ms windows, a probe
/// every 100), about 0.2%. No probe runs until the limit binds (the work reaches 90% of it).
///
/// A probe also comes early (four windows after the last at the soonest) when the
/// estimate may have gone stale: when the server's concurrency as throughput × `n` shows
/// it has fallen by a quarter since the last probe (it runs fewer at once, or each request
/// takes longer: a slower dependency, which read against the old `n` would look like
/// queueing and take the limit far below what the server runs), or when a window is
/// faster than `n` (each request takes less than it did).
///
/// # When to use it
///
/// When latency reflects load: a server whose work waits for a bounded resource (a pool,
/// a dependency's concurrency, CPU) and whose requests are alike enough that a window's
/// mean latency means something. It keeps the limit just above what the server can run
/// at once, so time queued inside the server stays near zero. Where latency says little
/// (requests of wildly different sizes) and the service reports overload itself, use
/// [`Aimd`](super::Aimd).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_core::adaptive::{Algorithm, Gradient, Outcome, Window};
///
/// let mut gradient = Gradient::default().smoothing(1.0);
/// let window = |limit, latency_ms| {
///     let mut w = Window::new(limit, Duration::from_millis(100));
///     for _ in 0..100 {
///         w.add(Duration::from_millis(latency_ms), Outcome::Success, limit);
///     }
///     w
/// };
/// // The first window sets the no-load estimate (10 ms).
/// assert_eq!(gradient.update(&window(64, 10)), 64);
/// // No queue while the work uses the limit: it grows by √64.
/// assert_eq!(gradient.update(&window(64, 10)), 72);
/// // Latency doubled at 128: the server runs 64 at once. The limit goes to
/// // 64 × 1.1 + √128 = 81.7.
/// assert_eq!(gradient.update(&window(128, 20)), 81);
/// ```
#[derive(Debug, Clone)]
pub struct Gradient {
    tolerance: f64,
    smoothing: f64,
    probe_every: u32,
    probe: f64,
    backoff: f64,
    threshold: f64,
    /// The controller's limit, fractional.
    limit: f64,
    /// The no-load latency estimate, in seconds.
    noload: Option<f64>,
    /// Whether a probe has measured the estimate (the first comes from whatever the
    /// first window saw).
    confirmed: bool,
    /// Windows since the last probe ended.
    since_probe: u32,
    /// The throughput of the first window after the last probe (requests a second).
    reference: Option<f64>,
    phase: Phase,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Normal,
    /// The limit is lowered to `probe`; the queue drains this window. `descended`: an
    /// earlier probe of this run found the estimate high.
    Draining {
        resume: f64,
        probe: u64,
        descended: bool,
    },
    /// The limit is lowered; this window's mean is the estimate.
    Measuring {
        resume: f64,
        probe: u64,
        descended: bool,
    },
}

impl Default for Gradient {
    fn default() -> Self {
        Self {
            tolerance: 0.1,
            smoothing: 0.5,
            probe_every: 100,
            probe: 0.9,
            backoff: 0.9,
            threshold: 0.01,
            limit: 0.0,
            noload: None,
            confirmed: false,
            since_probe: 0,
            reference: None,
            phase: Phase::Normal,
        }
    }
}

impl Gradient {
    /// How much above the no-load latency a window's mean may be before the limit falls
    /// (default 0.1: 10%). Higher keeps more queued in the server (more throughput when
    /// the estimate reads low, more latency).
    pub fn tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = tolerance.clamp(0.0, 10.0);
        self
    }

    /// How far each window moves the limit down toward a lower target (default 0.5;
    /// between 0.05 and 1): lower is steadier and slower. (Growth takes the whole step: it
    /// is one √limit at a time already.)
    pub fn smoothing(mut self, smoothing: f64) -> Self {
        self.smoothing = smoothing.clamp(0.05, 1.0);
        self
    }

    /// Windows between probes of the no-load latency (default 100; at least 4).
    pub fn probe_every(mut self, windows: u32) -> Self {
        self.probe_every = windows.max(4);
        self
    }

    /// The share of the server's estimated concurrency a probe lowers the limit to
    /// (default 0.9; between 0.1 and 1).
    pub fn probe(mut self, share: f64) -> Self {
        self.probe = share.clamp(0.1, 1.0);
        self
    }

    /// What the limit is multiplied by after a window in which more than
    /// [`threshold`](Self::threshold) of the samples were overloaded or dropped
    /// (default 0.9).
    pub fn backoff(mut self, backoff: f64) -> Self {
        self.backoff = backoff.clamp(0.1, 1.0);
        self
    }

    /// The share of overloaded or dropped samples that triggers a backoff (default 0.01).
    pub fn threshold(mut self, share: f64) -> Self {
        self.threshold = share.clamp(0.0, 1.0);
        self
    }

    /// The no-load latency estimate, once there is one.
    pub fn no_load_latency(&self) -> Option<std::time::Duration> {
        self.noload.map(std::time::Duration::from_secs_f64)
    }

    fn start_probe(&mut self, window: &Window, noload: f64) -> u64 {
        let concurrency = window.throughput() * noload;
        let probe = (concurrency * self.probe)
            .min(self.limit * self.probe)
            .max(1.0) as u64;
        self.phase = Phase::Draining {
            resume: self.limit,
            probe,
            descended: false,
        };
        probe
    }

    /// Takes a probe's measurement: averaged with the estimate when they agree within
    /// 20%, else the new estimate.
    fn measured(&mut self, latency: f64) {
        self.noload = Some(match self.noload {
            Some(n) if (latency - n).abs() <= 0.2 * n => (n + latency) / 2.0,
            _ => latency,
        });
    }
}

impl Algorithm for Gradient {
    fn update(&mut self, window: &Window) -> u64 {
        let Some(latency) = window.mean_latency().map(|m| m.as_secs_f64()) else {
            return window.limit;
        };
        match self.phase {
            Phase::Draining {
                resume,
                probe,
                descended,
            } => {
                self.phase = Phase::Measuring {
                    resume,
                    probe,
                    descended,
                };
                return probe;
            }
            Phase::Measuring {
                resume,
                probe,
                descended,
            } => {
                let lower = self.noload.is_none_or(|n| latency < 0.95 * n);
                if lower || !self.confirmed {
                    // Lower than the estimate: the estimate was high, and this probe may
                    // still have queued; or the first probe, whose limit came from an
                    // unmeasured estimate and may have queued just as much. Take it, and
                    // probe lower at once (by a step noise cannot hide), until a probe no
                    // longer finds less.
                    self.noload = Some(latency);
                    self.confirmed = true;
                    let probe = ((probe as f64 * self.probe * self.probe) as u64).max(1);
                    self.phase = Phase::Draining {
                        resume,
                        probe,
                        descended: true,
                    };
                    return probe;
                }
                self.measured(latency);
                self.phase = Phase::Normal;
                self.reference = None;
                // After a descent, confirm the estimate soon.
                self.since_probe = if descended {
                    self.probe_every.saturating_sub(10)
                } else {
                    0
                };
                self.limit = resume;
                return resume as u64;
            }
            Phase::Normal => {}
        }
        // Start from the limit in force unless it is our own, rounded (clamped by the
        // bounds, or handed back by an operator).
        if (self.limit - window.limit as f64).abs() >= 1.0 {
            self.limit = window.limit as f64;
        }
        let before = self.limit;
        let Some(noload) = self.noload else {
            // The first window: its latency is the estimate until the first probe, soon.
            self.noload = Some(latency);
            self.since_probe = self.probe_every - 4;
            return window.limit;
        };
        let target = if window.overload_share() > self.threshold {
            self.limit * self.backoff
        } else {
            let gradient = (noload * (1.0 + self.tolerance) / latency).clamp(0.5, 1.0);
            let target = self.limit * gradient + self.limit.sqrt();
            if target > self.limit && window.app_limited() {
                self.limit
            } else {
                target
            }
        };
        // Smoothing damps the way down, where a noisy window would shed work; growth
        // comes one √limit step at a time already.
        let step = if target < self.limit {
            self.smoothing
        } else {
            1.0
        };
        self.limit = (self.limit + step * (target - self.limit)).max(1.0);
        self.since_probe += 1;
        // A probe waits until the limit binds (the work reached 90% of it): until then the
        // limit shapes nothing, what the server does is its own, and a probe would only
        // shed work. Should the service slow down meanwhile, the gradient lowers the
        // limit until it binds, and the probe comes.
        let binds = window.max_in_flight.saturating_mul(10) >= window.limit.saturating_mul(9);
        // The server's concurrency, as throughput × no-load latency shows it, fell by a
        // quarter since the last probe: either it runs fewer at once (the latency that
        // rose is queueing, and the gradient is right) or each request takes longer (a
        // dependency slowed: the estimate is stale, and the gradient would take the
        // limit far below what the server runs). Only a probe tells them apart: probe
        // now, from the limit as it was. (The estimate holds still between probes, so
        // the concurrency falls by a quarter when the throughput does: that is compared.)
        let throughput = window.throughput();
        let fell = match self.reference {
            Some(reference) => throughput < 0.75 * reference,
            None => {
                self.reference = Some(throughput);
                false
            }
        };
        // A window faster than the no-load latency: the estimate is stale the other way
        // (each request takes less than it did), and the limit would settle too high.
        let faster = latency < 0.9 * noload;
        let early = (fell || faster) && self.since_probe >= 4;
        if binds && (self.since_probe >= self.probe_every || early) {
            if fell {
                self.limit = before;
            }
            return self.start_probe(window, noload);
        }
        self.limit as u64
    }
}
