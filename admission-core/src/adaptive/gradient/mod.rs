use super::{Algorithm, Window};

mod check;
mod estimate;
mod first;
mod growth;
mod law;
mod mechanism;
mod noise;
mod probe;
mod skew;
mod stale;
// The estimator's tests (here and in each mechanism's file) are arithmetic on model
// windows, with no unsafe code beneath them: they do not run under Miri.
#[cfg(all(test, not(admission_loom), not(miri)))]
mod testing;

use estimate::Estimate;
use law::{Law, Round};
#[cfg(not(any(test, feature = "ablation")))]
use mechanism::Mechanism;
#[cfg(any(test, feature = "ablation"))]
pub use mechanism::Mechanism;
use noise::ServiceSpread;

/// A delay-gradient controller: the limit follows the ratio of a no-load latency it
/// measures itself to the latency now, plus a small queue allowance.
///
/// # The law
///
/// Once per round (windows merged until they hold enough samples for a mean within about
/// 10%, over one and a half latencies since the limit last moved), with `n` the no-load
/// latency, `m` the round's mean latency and `knee = n × (1 + tolerance)`:
///
/// ```text
/// concurrency = limit × clamp(knee / m, 0.5, 1 + tolerance)
/// target      = concurrency + √concurrency
/// ```
///
/// While the server is saturated, Little's law makes `m / n` the limit over the server's
/// concurrency, so the target sits just above what the server runs at once, with a queue
/// of `√` of it to keep its workers busy between arrivals. A cut is smoothed (halfway,
/// by default) unless the queue is beyond doubt; growth needs the work to fill the limit.
/// A share of [`Overload`](super::Outcome::Overload) outcomes above what the service
/// fails with at no load multiplies the limit by [`backoff`](Self::backoff) instead.
///
/// # Its mechanisms
///
/// - **The no-load estimate and its probe.** `n` starts as the first hundred samples'
///   mean. Every [`probe_every`](Self::probe_every) rounds (sooner when throughput falls
///   or a round reads faster than `n`) the limit drops to [`probe`](Self::probe) of the
///   server's concurrency until the queue drains, and the latency then is `n`. A probe
///   that reads lower probes 30% lower at once, until one finds no less; so does one
///   whose latency rose over the round before it (a lower limit cannot raise an
///   unchanged server's latency: the server shrank or slowed as the probe began, and
///   only a step lower tells a queue from a slower service).
/// - **A queue, or noise.** A round is queued only beyond two standard errors of its
///   mean (the latencies' spread over √samples), and beyond doubt at 1.5 times that.
/// - **Growth.** Rounds with no queue grow the limit by √limit, then half of it, then
///   all of it. Under half the last probe's limit, a round with no queue at all is
///   capacity coming back, climbed at once.
/// - **A changed service or server.** A probe comes early when the throughput of the
///   rounds the work fills falls by a tenth (fewer at once, or each slower: the probe
///   tells which), or a round reads faster than `n`, or, behind the queue the stale knee
///   allows, spreads less (a queue moves every quartile alike).
/// - **A queue the law holds, checked.** At its fixed point the law keeps a queue of
///   `√` the concurrency and reads it round after round; an estimate grown stale (the
///   service slowed as the server grew) reads the same with no queue at all, and would
///   hold the limit below the server. After three such rounds (the law holding the
///   limit, or cutting it with the latency unmoved), where the rounds' noise allows, the
///   limit goes for one round to `limit × knee / m`: a queue's latency falls with it (at
///   no cost in throughput, the server still full), and a latency that stays is the
///   service's at no load, which becomes `n`; the limit then grows as after two rounds
///   with no queue.
/// - **A skewed service.** Where the median is under half the mean, a round is read by
///   its median (which a queue moves and the long requests barely do).
///
/// # Choosing it, and what it costs
///
/// Use it where latency reflects load: work that waits for a bounded resource (a pool,
/// a dependency's concurrency, CPU). Where latency says little and the service reports
/// overload itself, use [`Aimd`](super::Aimd); where the server's capacity is known and
/// fixed, a static limit is simpler and as good.
///
/// It moves once per round, and a round needs about 100 × CV² samples (CV the latencies'
/// coefficient of variation, at least 1): a server answering 50 a second (10 in flight
/// at 200 ms) takes seconds per step, and heavy tails four times that. Each probe holds
/// the limit below the server for a few rounds. A service that slows little by little
/// reads as a queue until the throughput falls by a tenth, so the limit sags meanwhile.
/// Each mechanism's effect on the simulator's targets, with and without it, is in
/// `admission-bench`'s README.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_core::adaptive::{Algorithm, Gradient, Outcome, Window};
///
/// // 100 ms of a server of 64 workers at 10 ms, saturated (Little's law).
/// let window = |limit: u64| {
///     let mut w = Window::new(limit, Duration::from_millis(100));
///     let latency = Duration::from_millis(10 * limit.max(64) / 64);
///     for _ in 0..10 * limit.min(64) {
///         w.add(latency, Outcome::Success, limit);
///     }
///     w
/// };
/// let mut gradient = Gradient::default();
/// // The first hundred samples set the no-load estimate.
/// assert_eq!(gradient.update(&window(64)), 64);
/// assert_eq!(gradient.no_load_latency(), Some(Duration::from_millis(10)));
/// // At 128, twice the latency: a queue. Two rounds read so, a probe finds the
/// // estimate right, and the limit comes down to just above the knee.
/// let mut limit = 128;
/// for _ in 0..20 {
///     limit = gradient.update(&window(limit));
/// }
/// assert!((64..=90).contains(&limit), "{limit}");
/// ```
#[derive(Debug, Clone)]
pub struct Gradient {
    tolerance: f64,
    smoothing: f64,
    probe_every: u32,
    probe_jitter: f64,
    /// Rounds from the last probe to the next scheduled one: `probe_every`, jittered.
    scheduled: u32,
    /// The jitter's generator (xorshift), seeded by the first samples; 0 until then.
    draws: u64,
    probe: f64,
    backoff: f64,
    threshold: f64,
    /// The controller's limit, fractional.
    limit: f64,
    /// The no-load latency, whether it is confirmed, and the service's shape.
    estimate: Estimate,
    spread: ServiceSpread,
    /// Seconds since the limit last changed.
    since_change: f64,
    /// The windows since then that show the limit in force, merged.
    round: Window,
    probes: probe::Probes,
    first: first::First,
    stale: stale::Stale,
    growth: growth::Growth,
    check: check::Check,
    /// Mechanisms turned off (bits of [`Mechanism`]).
    #[cfg(any(test, feature = "ablation"))]
    off: u32,
}

/// Why the limit moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    /// A round's step toward the law's target (`law.rs`).
    Law,
    /// The limit in force is not the controller's, rounded: the bounds clamped it, or an
    /// operator handed it back.
    InForce,
    /// A probe ended: the limit resumes where the round before it says the server is
    /// (`probe.rs`).
    ProbeEnds,
    /// A check begins, at the law's concurrency without the allowance, or ends, back
    /// where it was (`check.rs`).
    Check,
}

fn seconds(duration: Option<std::time::Duration>) -> Option<f64> {
    duration.map(|d| d.as_secs_f64())
}

impl Default for Gradient {
    fn default() -> Self {
        Self {
            tolerance: 0.1,
            smoothing: 0.5,
            probe_every: 100,
            probe_jitter: 0.0,
            scheduled: 100,
            draws: 0,
            probe: 0.9,
            backoff: 0.9,
            threshold: 0.01,
            limit: 0.0,
            estimate: Estimate::default(),
            spread: ServiceSpread::default(),
            since_change: 0.0,
            round: Window::default(),
            probes: probe::Probes::default(),
            first: first::First::default(),
            stale: stale::Stale::default(),
            growth: growth::Growth::default(),
            check: check::Check::default(),
            #[cfg(any(test, feature = "ablation"))]
            off: 0,
        }
    }
}

impl Gradient {
    /// How much above the no-load latency a round's mean may be before the limit falls
    /// (default 0.1: 10%). Higher keeps more queued in the server (more throughput when
    /// the estimate reads low, more latency).
    pub fn tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = tolerance.clamp(0.0, 10.0);
        self
    }

    /// How far each round moves the limit down toward a lower target (default 0.5;
    /// between 0.05 and 1): lower is steadier and slower.
    pub fn smoothing(mut self, smoothing: f64) -> Self {
        self.smoothing = smoothing.clamp(0.05, 1.0);
        self
    }

    /// Rounds between probes of the no-load latency (default 100; at least 4).
    pub fn probe_every(mut self, windows: u32) -> Self {
        self.probe_every = windows.max(4);
        self.scheduled = self.probe_every;
        self
    }

    /// How far each interval between scheduled probes strays from
    /// [`probe_every`](Self::probe_every), at random (default 0: none; at most 0.5;
    /// 0.25 makes it 75 to 125 rounds). Each probe sheds for a few rounds, and replicas
    /// started together probe in step, shedding together; jittered, they drift apart.
    /// The draws are seeded by the first samples' latencies, which differ from one
    /// server to the next, so one sequence of windows always gives the same decisions.
    ///
    /// What it costs: a probe drawn early sheds sooner, one drawn late leaves a stale
    /// estimate longer. On the simulator's held-out seeds 0.25 misses more targets than
    /// none, most where the service's time changes (`admission-bench`'s README). Set it
    /// where replicas probing together matter more.
    pub fn probe_jitter(mut self, share: f64) -> Self {
        self.probe_jitter = share.clamp(0.0, 0.5);
        self
    }

    /// The share of the server's estimated concurrency a probe lowers the limit to
    /// (default 0.9; between 0.1 and 1), for the few rounds it takes to drain the queue
    /// and measure: lower drains faster and sheds more. It is separate from the floor
    /// ([`AdaptiveBuilder::bounds`](super::AdaptiveBuilder::bounds)), which holds a probe
    /// up where it is higher.
    pub fn probe(mut self, share: f64) -> Self {
        self.probe = share.clamp(0.1, 1.0);
        self
    }

    /// What the limit is multiplied by after a round in which the share of
    /// [`Overload`](super::Outcome::Overload) samples exceeded what the last probe saw
    /// by more than [`threshold`](Self::threshold) (default 0.9).
    pub fn backoff(mut self, backoff: f64) -> Self {
        self.backoff = backoff.clamp(0.1, 1.0);
        self
    }

    /// How far the share of overloaded samples may exceed what the last probe saw before
    /// the limit backs off (default 0.01).
    pub fn threshold(mut self, share: f64) -> Self {
        self.threshold = share.clamp(0.0, 1.0);
        self
    }

    /// The service's latency with no queue, where you know it (a fixed sleep, a
    /// computation of known cost): the controller then takes it as given, and neither
    /// measures nor probes it. By default it takes the first hundred samples' mean and
    /// probes the estimate every [`probe_every`](Self::probe_every) rounds, and sooner
    /// when the server seems to change.
    ///
    /// What it costs: nothing of the probes' (each holds the limit below the server for a
    /// few rounds, shedding meanwhile); but a service that slows then reads as a queue,
    /// and the limit falls with it (toward the server's concurrency times the given
    /// latency over the new one), since no probe learns the new latency. A service that
    /// quickens leaves the limit high, with a queue. Give it only where the service's
    /// own time does not move. A latency of zero is taken as one nanosecond.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_core::adaptive::{Algorithm, Gradient};
    ///
    /// let gradient = Gradient::default().no_load(Duration::from_millis(40));
    /// assert_eq!(gradient.no_load_latency(), Some(Duration::from_millis(40)));
    /// ```
    pub fn no_load(mut self, latency: std::time::Duration) -> Self {
        self.estimate = Estimate::given(latency.as_secs_f64().max(1e-9));
        self
    }

    /// Turns a mechanism off, to measure what it earns (feature `ablation`, not for
    /// production use).
    #[doc(hidden)]
    #[cfg(any(test, feature = "ablation"))]
    pub fn without(mut self, mechanism: Mechanism) -> Self {
        self.off |= mechanism.bit();
        self
    }

    /// Whether a mechanism is on: always, but where the feature `ablation` (or a test)
    /// turns one off.
    #[inline(always)]
    fn on(&self, mechanism: Mechanism) -> bool {
        #[cfg(any(test, feature = "ablation"))]
        return self.off & mechanism.bit() == 0;
        #[cfg(not(any(test, feature = "ablation")))]
        {
            let _ = mechanism;
            true
        }
    }

    /// The limit moves, and says why: the only place it is written. What follows is
    /// measured afresh, except after a step of the law that left the limit in force as
    /// it was (a fraction of a slot).
    fn move_limit(&mut self, limit: f64, why: Move) {
        let before = self.limit as u64;
        self.limit = limit;
        if why != Move::Law || limit as u64 != before {
            self.changed();
        }
    }

    /// Seeds the probes' jitter from the first samples' latencies (their sum, in
    /// nanoseconds), and draws the first interval.
    fn seed_jitter(&mut self, nanos: u128) {
        // (splitmix64's finaliser: nearby sums give unrelated seeds.)
        let mut z = (nanos as u64) ^ 0x9e37_79b9_7f4a_7c15;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        self.draws = (z ^ (z >> 31)) | 1;
        self.draw_schedule();
    }

    /// The next interval between scheduled probes: `probe_every`, give or take
    /// `probe_jitter` of it, at least 4 rounds.
    fn draw_schedule(&mut self) {
        let mut x = self.draws;
        if x != 0 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.draws = x;
        }
        // Uniform in [-1, 1) (0 before the seed).
        let unit = if x == 0 {
            0.0
        } else {
            (x >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        };
        let every = self.probe_every as f64 * (1.0 + self.probe_jitter * unit);
        self.scheduled = (every.round() as u32).max(4);
    }

    /// What follows is measured afresh: the limit moved, or a probe's phase changed.
    fn changed(&mut self) {
        self.since_change = 0.0;
        self.round = Window::default();
    }

    /// A concurrency with the law's queue allowance: `c + √c`.
    fn allowance(concurrency: f64) -> f64 {
        concurrency + concurrency.sqrt()
    }
}

impl Algorithm for Gradient {
    fn update(&mut self, window: &Window) -> u64 {
        let Some(latency) = seconds(window.mean_latency()) else {
            return window.limit;
        };
        self.spread.observe(window);
        if let Some(probe) = self.probe_step(window, latency) {
            return probe;
        }
        // Start from the limit in force unless it is our own, rounded (clamped by the
        // bounds, or handed back by an operator).
        if (self.limit - window.limit as f64).abs() >= 1.0 {
            self.move_limit(window.limit as f64, Move::InForce);
        }
        let Some(noload) = self.estimate.latency() else {
            self.first_samples(window);
            return window.limit;
        };
        match self.next_round(window, latency, noload) {
            Some(round) => {
                let mean = seconds(round.mean_latency()).unwrap_or(latency);
                self.decide(&round, mean, noload)
            }
            None => self.limit as u64,
        }
    }

    fn no_load_latency(&self) -> Option<std::time::Duration> {
        self.estimate
            .latency()
            .map(std::time::Duration::from_secs_f64)
    }
}
