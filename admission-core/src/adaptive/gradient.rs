use super::{Algorithm, Window};

/// A delay-gradient controller: the limit follows the ratio of a no-load latency it
/// measures itself to the latency now, plus a small queue allowance.
///
/// When the server is saturated (its workers all busy, a queue forming), Little's law
/// makes the mean latency `m` over the no-load latency `n` equal to the limit over the
/// server's concurrency. So each round (windows merged until they hold enough samples
/// for a mean within about 10%, and span one and a half latencies since the limit last
/// moved), with `knee = n × (1 + tolerance)`:
///
/// ```text
/// concurrency = limit × clamp(knee / m, 0.5, 1 + tolerance)
/// target      = concurrency + √concurrency
/// ```
///
/// just above the knee, where the server is busy all the time and its queue stays
/// short. A cut is smoothed (halfway, by default) unless the queue is beyond doubt, and
/// never goes below what the work used when the work did not fill the limit (such a round
/// made no queue, whatever its latency reads). Growth needs the work to fill the limit,
/// and speeds up round after round with no queue (`√limit`, then half the limit, then the
/// limit, where the round held the limit full), so a server four times larger is found in
/// four rounds, while a load at the server's capacity, whose queue nears any limit now
/// and then, grows it by the formula's step alone. When capacity comes back, the first
/// rounds still hold requests that queued before, and read near the knee, within its
/// noise; but the server answers more a second than the saturated rounds before it did
/// (beyond how much that varied round to round), and the latency fell with it (Little's
/// law read the other way), though not below `n` (a faster service, which is probed):
/// two such rounds in a row count as rounds with no queue.
///
/// # The no-load estimate, and why it is probed
///
/// The hard part is `n`. The minimum of recent samples reads far too low when service times
/// vary; a long average of recent latencies catches up with the latency of a standing
/// queue, and the limit runs away. So, like BBR's round-trip probe, every
/// [`probe_every`](Self::probe_every) rounds it lowers the limit to [`probe`](Self::probe)
/// (90%) of the concurrency the server showed (throughput × `n`), waits one and a half
/// latencies for the queue to drain, and measures: until it has enough samples for the
/// latencies' spread (100 × CV², at least 200) over at least ten latencies (more as the
/// spread grows: a short reading of a heavy tail reads low; one already above the estimate
/// beyond its noise is taken once it has its samples). A reading within its noise of the
/// estimate is averaged in; one lower beyond its noise means the estimate was high (the
/// probe may itself have queued): it is taken and the next probe goes 30% lower at once,
/// until one finds no less. Such a probe measures as long as any other: where its latency
/// is too noisy to tell one step from none, its throughput tells, held at the step before's
/// where both queued (Little's law), fallen where it ran below the knee (as the last of a
/// descent does, shedding while it measures). Another probe checks a descent ten rounds on,
/// unless its last probe served less than the one before by more than half a step, beyond
/// the noise of both: that one ran below the knee and read the service alone. (Not for a
/// service spread wider than an exponential: its answers come in bunches, and one pair of
/// probes' counts cannot tell.) A higher one is taken, but at most 1.5 times the estimate
/// per probe unless the probe's throughput shows it ran below the knee. But one more than
/// 1.5 times it whose latencies spread as a queue's do is taken and checked at once by a
/// probe a step lower, as in a descent: a probe that begins as capacity falls queues at the
/// smaller server, and its throughput falls too, as if it had run below the knee. A queue
/// adds a wait for many services to each latency, so they spread about `1 / k` as much as
/// the service's (`k` the reading over the estimate), where a slower service's spread as
/// before: the probe's coefficient of variation (from every sample's bucket) under the
/// service's over `√k` reads as a queue. The service's is the larger of the rounds' (over
/// the last hundred windows or so) and the last probe's: the rounds hold a short queue,
/// which narrows their spread, and a probe runs with none. The limit then resumes where the
/// probe found the server (throughput × the new estimate, plus the allowance), not at the
/// limit before it; after a descent that began with such a queue, at the throughput of the
/// probe that queued (the smaller server's, as busy as it can be), not at the one before
/// the server shrank. A probe due on its schedule waits until ten rounds after the limit
/// last grew for sure (at most ten rounds late): a probe as the limit lands, after capacity
/// came back, would cut it again within the same second.
///
/// The first estimate is the first hundred samples' mean (within 10%, and biased low: the
/// short requests end first). Until it is confirmed, the rounds with no more in flight
/// (within 10%) that read no queue beyond their noise are averaged in, and so are rounds
/// that read as queued but spread at least as the first samples did (over `√k`, `k` the
/// reading over the estimate) and wider than an exponential's (a CV over 1.25), under a
/// limit no lower than the first's: a queue's wait, alike for all, narrows the latencies'
/// spread, where the rounds after a first estimate that missed a skewed service's long
/// requests spread wider than its samples. It is replaced when a round with half as much
/// again in flight (than the most in flight then) reads no queue, and the first probe comes
/// when two rounds in a row read as queued (a limit started far above the server's).
/// Whether a round queued is read against its noise, and the noise from the latencies'
/// spread as measured (over a hundred samples at least) where that is below 1: the queue of
/// a limit started far above a small server, each latency a sum of many waits, spreads far
/// less than a service, and stands only a fifth or so above a first estimate taken as it
/// formed. A probe the work did not fill goes no lower: the limit held nothing back, and a
/// lower one would only shed work.
///
/// The estimate may go stale. A service that slows (a dependency taking longer) reads,
/// against the old `n`, like a queue, and the limit comes down; but a queue's latency
/// falls in proportion to what is in flight, a slower service's does not. So once what
/// the work runs at once (throughput × latency) has come down by a quarter from the most
/// it ran, and the latency has not come down with it (beyond three times the noise of the
/// two rounds), the latency now is taken as the estimate, with no probe; a probe follows
/// within ten rounds to check it. The most it ran counts from the last rise in latency
/// beyond its noise or beyond doubt over `n`, on any round: a fall in capacity raises the
/// latency too, and may come as a pause in the load ends, on a round the work did not
/// fill; measured across it, the cut that follows would read like a slower service. A
/// probe also comes early when the throughput of the rounds the work filled falls below
/// what it was after the last probe, by more than its noise and at least 10% (the server
/// runs fewer at once, or each request takes longer), or when a round is faster than `n`
/// beyond its noise. Or when a service that quickened hides behind a queue: read against
/// the stale `n`, a limit that grew until the latency reached the knee holds a queue as
/// long as the service, and no round reads faster. But a queue adds a wait alike to
/// every latency, which moves each quartile alike: the latencies' interquartile range
/// over the last probe's is what the service takes now, as a share of what it took then
/// (a heavy tail moves the quartiles little, where a few hundred of its samples read
/// their coefficient of variation far off the truth now and then). Under 0.6, the limit
/// does not grow; twice in a row, a probe comes, and where its mean is a quarter more
/// than its own spread says the service takes, it queued, and it descends as a probe
/// that read lower does. Less demand sets off no probe: a round the work did not fill
/// says nothing of the server. A probe set off by a fall while the latency stands within
/// half again of `n` is sized from the geometric mean of `n` and the latency rather than
/// from `n`: a service slowing little by little reads as a queue as long, and a probe
/// sized from the stale `n` went as far below the server as the service had slowed.
///
/// # Skewed service: read by its median
///
/// Where most requests are short and a few very long (a median under half the mean, as
/// each probe reads them), a round's mean moves more with how many long requests it
/// happened to hold than with a queue as long as a service time. A queue, though, adds
/// to every request's latency alike, short ones included, so it moves the median as much
/// as the mean, and the long requests barely move the median. For such a service the
/// latency in the formula above is read as `n × (1 − shape) + median`, `shape` the
/// median over the mean at no load, averaged over probes: the mean the round would show
/// without its tail's noise. A probe's own reading is its median over `shape` (a short
/// reading of a skewed service's mean reads low, its long requests unfinished), but no
/// more than its mean and the mean's noise (a probe that queued has the queue in its
/// median once, which over `shape` would count several times), and a probe goes no lower
/// than three quarters of the limit. A round of a skewed service (as the probes read it,
/// or as its own median does) spans, since the limit changed, the latency of its long
/// requests (the 95th percentile) rather than its mean: what has ended of the work
/// admitted since is its short requests, and reads faster than the server is. The
/// median and the percentile are read from every sample's latency bucket (eight to a
/// doubling), one relaxed add per sample.
///
/// # When it is slow to follow, and why
///
/// It acts once per round, and a round needs samples: about 100 × CV² of them (CV the
/// latencies' coefficient of variation, taken as at least 1) and a latency and a half of
/// time. Where the server answers few requests a second (a small limit times a long service
/// time: 10 in flight at 200 ms is 50 a second) a round lasts seconds, and so does every
/// step. Heavy-tailed latencies (CV 2 and more) need four times the samples or more, and
/// their probes take longer; a skewed service's rounds span its long requests, not its
/// mean. Started far below a mixture of very unequal requests, the first estimate comes
/// from the short requests that end first; the rounds that follow correct it, but a round
/// of such a service at a low limit takes several windows (100 × CV² samples), so the ramp
/// starts a second or two on, and it confirms an estimate still 10-20% low (the short
/// requests of the new slots end first) until the first probe, ten seconds on. Meanwhile a
/// round's queue is read by its median against the median of the rounds the estimate came
/// from (a queue moves both alike, the long requests the estimate missed barely), so the
/// limit holds the knee's queue, not less; a round's mean would have read that low
/// estimate's knee at the server's concurrency, or under it. A service that slows little by
/// little reads as a queue until what is in flight has fallen by a quarter, or the
/// throughput by 10%, so the limit sags meanwhile, and the probe that follows, sized from
/// an estimate that is partly stale, runs a little below the server until its reading is in
/// (a few windows). Growth after capacity comes back takes three rounds or so (a third of a
/// second with 100 ms windows): the first round still holds requests that queued before;
/// the first that reads no queue, with every slot busy, under half the limit the last probe
/// began at, grows the limit by half at once, and the next doubles it (from a start far
/// above, the first probe's limit is the start's, and a round with no queue under half of
/// it is only a first one). Started far above a server of a handful, the first probe comes
/// within a second or so, its descent takes two seconds more (a step of 0.7 each half
/// second) and ends below the server. In `admission-bench`'s simulator each of these meets
/// its targets on the seeds CI runs, some by a small margin (the second capacity comes back
/// from a quarter in, 81.7% at worst for a target of 80%); on other seeds some do not (a
/// long service started far below, a server of a handful, capacity coming back): see that
/// crate's README for the figures. And a probe that begins just as capacity falls queues at
/// the smaller server; where its reading is under 1.5 times the estimate (capacity down by
/// a third, say) a queue's spread is too near a service's to tell, and it reads as a slower
/// service (the latency up, the throughput down): the limit then sits near twice the new
/// server's until the next probe, ten seconds on.
///
/// # When to use it
///
/// When latency reflects load: a server whose work waits for a bounded resource (a pool,
/// a dependency's concurrency, CPU) and whose requests are alike enough that a round's
/// mean latency means something. Where latency says little and the service reports
/// overload itself, use [`Aimd`](super::Aimd).
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
    probe: f64,
    backoff: f64,
    threshold: f64,
    /// The controller's limit, fractional.
    limit: f64,
    /// The no-load latency estimate, in seconds.
    noload: Option<f64>,
    /// Whether a probe has measured the estimate, or the limit has grown well beyond
    /// the first window's with no more latency (the first estimate comes from whatever
    /// the first window saw).
    confirmed: bool,
    /// What the work ran at once (throughput × latency) when the first estimate was
    /// taken.
    first: f64,
    /// The first estimate's samples' coefficient of variation, and the limit then.
    first_cv: Option<(f64, u64)>,
    /// Windows since the last probe ended.
    since_probe: u32,
    /// Rounds in a row that found no queue and grew the limit while the work filled it.
    streak: u32,
    /// Rounds in a row read as queued, while the estimate is unconfirmed.
    queued_rounds: u32,
    /// Rounds in a row whose spread reads a service far faster than the estimate.
    quick_rounds: u32,
    /// Rounds since the limit last grew by a sure step (a second round in a row with no
    /// queue).
    since_growth: u32,
    /// The saturated round with the most in flight since the estimate was last set, or
    /// since the latency last rose: that many, its latency and its samples. A queue's
    /// latency falls with what is in flight; a slower service's does not.
    anchor: Option<(f64, f64, u64)>,

    /// The first saturated rounds after the last probe: their samples and seconds (their
    /// throughput, the reference a fall is measured from).
    reference: (u64, f64),
    /// The saturated rounds since, averaged (a weight of 0.3 each).
    recent: Option<Recent>,
    /// Rounds in a row whose throughput rose above `recent`'s beyond how much it varies,
    /// their latency falling.
    rising: u32,
    /// In a descent, the last probe's throughput and samples.
    chain: Option<(f64, u64)>,
    /// The share of overloaded samples the last probe saw: what the service fails with
    /// no queue, which no limit cures.
    baseline: f64,
    /// The latencies' spread over the last hundred windows or so (decaying sums of the
    /// squared samples: count, µs, and units of 1024 µs²): the service's, steadier than
    /// one round's.
    spread: (f64, f64, f64),
    /// Seconds since the limit last changed.
    since_change: f64,
    /// The windows since then that show the limit in force, merged.
    round: Window,
    phase: Phase,
    /// The median latency over the mean at no load: as the rounds of the first estimate
    /// read it, then as probes do (averaged).
    shape: Option<f64>,
    /// The probe's measuring windows, merged (for their median).
    probed: Window,
    /// The latencies at no load, as the last probe that ended read them: their
    /// coefficient of variation, their interquartile range (µs) and their mean (seconds).
    quiet: Option<(f64, f64, f64)>,
    /// In a descent, what a probe read as queued (by its spread) answered a second: all
    /// the server can, where it shrank as the probes began.
    shrunk: Option<f64>,
    /// The windows the unconfirmed estimate was read from, merged: their mean is the
    /// estimate, their median its shape's.
    unconfirmed: Window,
    /// The limit in force when the last probe began (the estimate confirmed by then).
    probed_from: Option<f64>,
}

/// The saturated rounds since the last probe, averaged.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Recent {
    /// Answers a second.
    throughput: f64,
    /// The throughputs' squared relative deviation from the average: how much it varies
    /// round to round (more than the count's noise where long requests end in bunches).
    spread: f64,
    /// Latency, seconds.
    latency: f64,
}

/// Samples gathered over a probe's measuring windows.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Reading {
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
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Normal,
    /// The limit is lowered to `probe` until the queue has drained: for `left` seconds
    /// more. `descended`: an earlier probe of this run found the estimate high.
    Draining {
        resume: f64,
        probe: u64,
        descended: bool,
        left: f64,
        /// The throughput of the saturated window before the probe, if it was.
        before: Option<f64>,
    },
    /// The limit is lowered; these windows' samples are the estimate.
    Measuring {
        resume: f64,
        probe: u64,
        descended: bool,
        before: Option<f64>,
        reading: Reading,
    },
}

/// A probe measures until it has this many samples (more where the latencies spread
/// more: [`Gradient::enough`]), or for `MEASURE_WINDOWS`.
const MEASURE_SAMPLES: u64 = 200;
const MEASURE_WINDOWS: u32 = 10;
/// The most a probe raises the estimate by: more waits for the next probe, soon.
const MAX_RAISE: f64 = 1.5;
/// A service whose median latency is below this share of its mean is read by its median.
const SKEWED: f64 = 0.5;
/// A coefficient of variation beyond an exponential's (1), with a margin for the noise of
/// a few hundred samples: latencies spread so wide are a service's, not a queue's (a wait
/// alike for all narrows the spread), and their count varies beyond what it says (the
/// long requests end in bunches).
const WIDE: f64 = 1.25;

/// Rounds a scheduled probe waits after the limit last grew by a sure step: a probe as the
/// limit lands, after capacity came back, would cut it again within the same second.
/// (While it grows for sure no probe is due: the streak holds it.)
const SETTLE: u32 = 10;

/// What a probe that found the estimate high multiplies its limit by for the next.
const DESCENT: f64 = 0.7;

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
            first: 0.0,
            first_cv: None,
            since_probe: 0,
            streak: 0,
            queued_rounds: 0,
            quick_rounds: 0,
            since_growth: u32::MAX,
            anchor: None,
            reference: (0, 0.0),
            recent: None,
            rising: 0,
            chain: None,
            baseline: 0.0,
            spread: (0.0, 0.0, 0.0),
            since_change: 0.0,
            round: Window::default(),
            phase: Phase::Normal,
            shape: None,
            probed: Window::default(),
            quiet: None,
            shrunk: None,
            unconfirmed: Window::default(),
            probed_from: None,
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
    /// between 0.05 and 1): lower is steadier and slower.
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

    /// What the limit is multiplied by after a window in which the share of
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

    /// The latencies' coefficient of variation, over the last hundred windows or so,
    /// taken as between 1 and 4 (an estimate from few samples reads low).
    fn cv(&self) -> f64 {
        self.measured_cv(1.0).map_or(1.0, |cv| cv.clamp(1.0, 4.0))
    }

    /// The latencies' coefficient of variation over the last hundred windows or so, as
    /// measured, once they hold `least` samples' spread.
    fn measured_cv(&self, least: f64) -> Option<f64> {
        let (n, total, squares) = self.spread;
        if n < least || total <= 0.0 {
            return None;
        }
        let mean = total / n;
        let square = squares * 1024.0 / n;
        Some((square - mean * mean).max(0.0).sqrt() / mean)
    }

    /// Samples enough for a mean within about 10% (one standard error): 100 × the
    /// squared coefficient of variation.
    fn enough(&self) -> u64 {
        let cv = self.cv();
        (100.0 * cv * cv) as u64
    }

    /// How far a reading may stray from the estimate before it counts as a change: three
    /// times its noise, and at least 5%.
    fn margin(noise: f64) -> f64 {
        (3.0 * noise).max(0.05)
    }

    fn start_probe(
        &mut self,
        limit: f64,
        concurrency: Option<f64>,
        latency: f64,
        before: Option<f64>,
    ) -> u64 {
        let mut probe = concurrency.unwrap_or(limit).min(limit) * self.probe;
        if self.skewed() {
            // A skewed service's estimate reads low: no probe below three quarters of
            // the limit the work filled.
            probe = probe.max(0.75 * limit);
        }
        let probe = probe.max(1.0) as u64;
        self.streak = 0;
        self.phase = Phase::Draining {
            resume: limit,
            probe,
            descended: false,
            // The queue drains once what was admitted before has ended: about the
            // latency of the window before, with a margin for the tail.
            left: 1.5 * latency,
            before,
        };
        self.changed();
        probe
    }

    /// A probe's reading is in: the estimate follows it (or the probe goes lower), and
    /// the limit resumes.
    fn measured(
        &mut self,
        reading: Reading,
        resume: f64,
        probe: u64,
        descended: bool,
        before: Option<f64>,
    ) -> u64 {
        // (The probe's windows: emptied when its measuring began.)
        let median = self.probed.median_latency().map(|m| m.as_secs_f64());
        // A skewed service's short reading of the mean reads low (the short requests end
        // first): its median, scaled by the shape, does not.
        let latency = match (self.shape, median) {
            // But no more than its mean and the mean's noise: a probe that queued has the
            // queue in its median once, which over the shape would count 1 / shape times.
            (Some(shape), Some(median)) if shape < SKEWED => {
                (median / shape).min(reading.mean() * (1.0 + 3.0 * reading.noise()))
            }
            _ => reading.mean(),
        };
        if let Some(median) = median {
            let shape = median / reading.mean().max(f64::MIN_POSITIVE);
            self.shape = Some(self.shape.map_or(shape, |old| (old + shape) / 2.0));
        }
        // The estimate is itself a reading about as noisy: their difference is √2 times
        // as noisy as one.
        let margin = Self::margin(std::f64::consts::SQRT_2 * reading.noise());
        self.baseline = reading.overloaded as f64 / reading.samples.max(1) as f64;
        // The probe lowered the throughput (by more than its noise) from a window the
        // work filled: it ran below the knee, so nothing queued in it.
        let throughput = reading.samples as f64 / reading.elapsed.max(1e-9);
        let unqueued = Self::unqueued(&reading, before);
        // Lower by more than its noise; or by half a descent's step while the throughput
        // held (a probe that queued reads the limit's share lower at the next step down,
        // as the latency of a queue is in proportion to what is in flight, and the server
        // stays as busy; one that did not queue reads the same, and serves less).
        // In a descent, this probe (lower by a step) against the one before, where a
        // step is beyond the noise of both: it held (served within half a step of as
        // many: both queued), or it fell (served less by more: it ran below the knee, and
        // read the service alone).
        let held = descended
            .then_some(self.chain)
            .flatten()
            .filter(|&(_, count)| {
                let noise = self.cv() * (1.0 / reading.samples as f64 + 1.0 / count as f64).sqrt();
                (1.0 - DESCENT) > 3.0 * noise
            })
            .map(|(previous, _)| throughput >= previous * (1.0 - (1.0 - DESCENT) / 2.0));
        // (A fall is not read where the latencies spread wider than an exponential's:
        // such a service's answers come in bunches, and its count varies beyond what it
        // says.)
        let fell = held == Some(false)
            && self
                .probed
                .spread
                .bucketed_cv()
                .is_some_and(|cv| cv <= WIDE);
        let held = held == Some(true);
        // In a descent the estimate is the probe before's reading, a step higher: queued
        // at both, this one reads a step lower; queued at neither, the same. The
        // midpoint decides, where the two are apart by twice the noise either side.
        let sharp = std::f64::consts::SQRT_2 * reading.noise() < (1.0 - DESCENT) / 4.0;
        let lower = self.noload.is_none_or(|n| {
            latency < (1.0 - margin) * n
                || ((held || (descended && sharp)) && latency < (1.0 + DESCENT) / 2.0 * n)
        });
        // A probe the work did not fill queued no more than the work brought: a lower one
        // would only shed it.
        let filled = self.probed.max_in_flight as f64 >= 0.9 * probe as f64;
        // Far above the estimate, and spread as a queue: it may have queued at a server
        // that shrank as it began. Taken, and checked by a probe a step lower at once (a
        // slower service reads the same there, and ends the descent). Nearer the estimate
        // the two spreads are within a probe's noise of each other, and it is not read.
        let queued = self
            .noload
            .is_some_and(|n| latency > MAX_RAISE * n && !self.spreads_as_a_service(latency, n))
            || self.quickened(latency);
        if (lower || !self.confirmed || queued) && filled && probe > 1 {
            // Lower than the estimate: the estimate was high, and this probe may still
            // have queued; or the first probe, whose limit came from an unmeasured
            // estimate and may have queued just as much; or far above, spread as a
            // queue. Take it, and probe lower at once, until a probe no longer finds
            // less.
            self.noload = Some(match self.noload {
                Some(n) if self.confirmed && !queued => n.min(latency),
                _ => latency,
            });
            self.confirmed = true;
            self.chain = Some((throughput, reading.samples));
            if queued {
                self.shrunk = Some(throughput);
            }
            let next = ((probe as f64 * DESCENT) as u64).max(1);
            self.phase = Phase::Draining {
                resume,
                probe: next,
                descended: true,
                left: 1.5 * latency,
                before,
            };
            return next;
        }
        let mut soon = descended && !fell;
        let spread = &self.probed.spread;
        self.quiet = spread
            .bucketed_cv()
            .zip(spread.interquartile())
            .map(|(cv, iqr)| (cv, iqr, latency));
        self.quick_rounds = 0;
        self.noload = Some(match self.noload {
            Some(n) if latency > (1.0 + margin) * n => {
                // Slower. Unless the probe ran below the knee, a bounded step, so that a
                // probe that still queued cannot ratchet the estimate up; the next probe
                // comes soon to go on.
                if latency > MAX_RAISE * n && !unqueued {
                    soon = true;
                    MAX_RAISE * n
                } else {
                    latency
                }
            }
            Some(n) if !lower => (n + latency) / 2.0,
            _ => latency,
        });
        self.confirmed = true;
        self.phase = Phase::Normal;
        self.anchor = None;
        self.reference = (0, 0.0);
        self.recent = None;
        self.chain = None;
        self.since_probe = if soon {
            self.probe_every.saturating_sub(10)
        } else {
            0
        };
        // Resume where the round before the probe says the server's concurrency is (its
        // throughput times the estimate), if the work filled it: after a fall in
        // capacity the old limit overshoots, and after a slower service it had sunk
        // (read against the old estimate, the service's slowing looked like a queue).
        let noload = self.noload.unwrap_or(latency);
        // (A server that shrank as the probe began answers what its queued probe did.)
        let before = before.map(|b| self.shrunk.take().map_or(b, |s| b.min(s)));
        let found = before.map_or(f64::INFINITY, |throughput| {
            let concurrency = throughput * noload * (1.0 + self.tolerance);
            concurrency + concurrency.sqrt()
        });
        self.limit = if found.is_finite() { found } else { resume }
            .max(probe as f64)
            .max(1.0);
        self.changed();
        self.limit as u64
    }

    /// Whether a probe's reading shows it ran below the knee: its throughput fell from
    /// that of the saturated round before the probe (`before`) beyond its noise.
    fn unqueued(reading: &Reading, before: Option<f64>) -> bool {
        let throughput = reading.samples as f64 / reading.elapsed.max(1e-9);
        before.is_some_and(|before| {
            throughput < before * (1.0 - 3.0 / (reading.samples as f64).sqrt()).min(0.95)
        })
    }

    /// Whether a probe's reading `k` times the estimate `n` spreads as a slower service's
    /// latencies do rather than as a queue's: a coefficient of variation at least the
    /// service's (the larger of the rounds', over the last hundred windows or so, and the
    /// last probe's: the rounds' short queue narrows theirs) over `√k`, the geometric
    /// midpoint of a slower service's (the same) and a queue's (`1 / k` of it). The
    /// probe's is read from its buckets, which hold every sample, rather than from the one
    /// in eight squared: a probe has a few hundred samples, and a few dozen squares cannot
    /// tell. Where either is unmeasured, the throughput alone decides.
    fn spreads_as_a_service(&self, latency: f64, n: f64) -> bool {
        let service = match (self.measured_cv(100.0), self.quiet.map(|(cv, ..)| cv)) {
            (Some(rounds), Some(quiet)) => Some(rounds.max(quiet)),
            (rounds, quiet) => rounds.or(quiet),
        };
        service
            .zip(self.probed.spread.bucketed_cv())
            .is_none_or(|(service, probe)| probe >= service * (n / latency).sqrt())
    }

    /// What a spread of latencies says the service takes now, as a share of what it took
    /// at the last probe: their interquartile range over the probe's. A queue's wait,
    /// alike for all, moves every quartile alike, and a heavy tail moves them little.
    fn service_share(&self, spread: &super::Spread) -> Option<f64> {
        let (_, quiet, _) = self.quiet.filter(|&(_, iqr, _)| iqr > 0.0)?;
        Some(spread.interquartile()? / quiet)
    }

    /// Whether a probe (`latency` its mean) begun for a service that quickened (its rounds
    /// spread far less than the service at no load) queued: its mean a quarter more than
    /// what its spread says the service takes.
    fn quickened(&self, latency: f64) -> bool {
        self.quick_rounds >= 2
            && self
                .service_share(&self.probed.spread)
                .zip(self.quiet)
                .is_some_and(|(share, (.., mean))| latency > 1.25 * share * mean)
    }

    /// Whether the service reads as skewed (its median under `SKEWED` of its mean at no
    /// load), as `shape` has it.
    fn skewed(&self) -> bool {
        self.shape.is_some_and(|shape| shape < SKEWED)
    }

    /// Whether a probe is draining the queue (`Some(false)`) or measuring (`Some(true)`);
    /// `None` outside a probe.
    #[cfg(test)]
    pub(super) fn probing(&self) -> Option<bool> {
        match self.phase {
            Phase::Normal => None,
            Phase::Draining { .. } => Some(false),
            Phase::Measuring { .. } => Some(true),
        }
    }

    /// The service's median over its mean at no load, as read so far.
    #[cfg(test)]
    pub(super) fn shape(&self) -> Option<f64> {
        self.shape
    }

    /// The limit changed: what follows is measured afresh.
    fn changed(&mut self) {
        self.since_change = 0.0;
        self.round = Window::default();
    }
}

impl Algorithm for Gradient {
    fn update(&mut self, window: &Window) -> u64 {
        let Some(latency) = window.mean_latency().map(|m| m.as_secs_f64()) else {
            return window.limit;
        };
        let (n, total, squares) = self.spread;
        self.spread = (
            0.99 * n + window.spread.samples as f64,
            0.99 * total + window.spread.total as f64,
            0.99 * squares + window.spread.squares as f64,
        );
        match self.phase {
            Phase::Draining {
                resume,
                probe,
                descended,
                left,
                before,
            } => {
                let left = left - window.elapsed.as_secs_f64();
                self.phase = if left > 0.0 {
                    Phase::Draining {
                        resume,
                        probe,
                        descended,
                        left,
                        before,
                    }
                } else {
                    self.probed = Window::default();
                    Phase::Measuring {
                        resume,
                        probe,
                        descended,
                        before,
                        reading: Reading::default(),
                    }
                };
                return probe;
            }
            Phase::Measuring {
                resume,
                probe,
                descended,
                before,
                mut reading,
            } => {
                reading.add(window, latency, self.cv());
                self.probed.merge(window);
                // Enough samples for the spread, over long enough for the long requests
                // begun in it to end (a short reading of a heavy tail reads low: the
                // short ones end first): ten latencies, more as the spread grows.
                let cv = reading.cv().clamp(1.0, 4.0);
                let enough = MEASURE_SAMPLES.max((100.0 * cv * cv) as u64);
                let long = reading.elapsed >= (10.0 * cv * cv).min(50.0) * reading.mean();
                // A reading far from the estimate, beyond its noise, is decided at once: a
                // service that doubled its time need not be measured to the last percent
                // (and the probe, sized from the old estimate, sheds while it lasts).
                let decided = self.noload.is_some_and(|n| {
                    (reading.mean() / n - 1.0).abs() > 0.25 + 3.0 * reading.noise()
                });
                // A reading above the estimate beyond its noise needs no more time: a
                // short reading only reads low (and the probe, sized from the stale
                // estimate, holds the limit below the server while it lasts).
                let margin = Self::margin(std::f64::consts::SQRT_2 * reading.noise());
                let high = self
                    .noload
                    .is_some_and(|n| reading.mean() > n * (1.0 + margin));
                if !decided
                    && (reading.samples < enough || !(long || high))
                    && reading.windows < MEASURE_WINDOWS
                {
                    self.phase = Phase::Measuring {
                        resume,
                        probe,
                        descended,
                        before,
                        reading,
                    };
                    return probe;
                }
                return self.measured(reading, resume, probe, descended, before);
            }
            Phase::Normal => {}
        }
        // Start from the limit in force unless it is our own, rounded (clamped by the
        // bounds, or handed back by an operator).
        if (self.limit - window.limit as f64).abs() >= 1.0 {
            self.limit = window.limit as f64;
            self.changed();
        }
        let Some(noload) = self.noload else {
            // The first hundred samples: their latency is the estimate until the first
            // probe, which comes when a round first reads as queued (the work that ended
            // first may have queued, or been the short ones).
            self.round.merge(window);
            if self.round.samples >= 100 {
                self.noload = self.round.mean_latency().map(|m| m.as_secs_f64());
                // What the work ran at once then (Little's law).
                // (At least the most in flight: the first round's throughput counts the
                // time before its first answers, and reads low.)
                self.first = (self.round.throughput() * self.noload.unwrap_or(0.0))
                    .max(self.round.max_in_flight as f64);
                self.unconfirmed = self.round;
                self.first_cv = self.round.spread.bucketed_cv().zip(Some(window.limit));
                self.round = Window::default();
            }
            return window.limit;
        };
        // A window's samples are of work admitted up to a latency before: just after a
        // change, under the limit before. Such a window is left out where that is a
        // large part of it, and the limit moves once per round: windows merged until
        // they span one and a half latencies since the change (one window, where latency is short
        // next to it). Acting faster than the work answers would overshoot.
        // For a skewed service (as the probes read it, or as the window's own latencies
        // do) the latency its long requests take, the 95th percentile: of the work
        // admitted since the change, what has ended within a mean latency is the short
        // requests, and reads faster than the server is.
        let by_probes = self.skewed();
        let skewed = |window: &Window, latency: f64| {
            by_probes
                || window
                    .median_latency()
                    .is_some_and(|median| median.as_secs_f64() < SKEWED * latency)
        };
        let reach = |window: &Window, latency: f64| {
            let tail = window
                .spread
                .quantile(0.95)
                .filter(|_| skewed(window, latency));
            tail.map_or(latency, |micros| latency.max(micros / 1e6))
        };
        let start = self.since_change;
        self.since_change += window.elapsed.as_secs_f64();
        let span = reach(window, latency);
        if start >= span || span <= 0.25 * window.elapsed.as_secs_f64() {
            self.round.merge(window);
        }
        let round = self.round;
        let Some(latency) = round.mean_latency().map(|m| m.as_secs_f64()) else {
            return self.limit as u64;
        };
        // Enough samples to act on: for the spread, or (to grow, which the next round
        // corrects if wrong) a hundred that read no queue.
        let clear = round.samples >= 100 && latency <= noload * (1.0 + self.tolerance);
        if self.since_change < 1.5 * reach(&round, latency)
            || (round.samples < self.enough() && !clear)
        {
            return self.limit as u64;
        }
        self.round = Window::default();
        let window = &round;
        let limit = self.limit;
        let samples = window.samples as f64;
        let noise = self.cv() / samples.sqrt();
        let throughput = window.throughput();
        // The work filled the limit: at some point (`binds`), and on average (Little's
        // law: throughput × latency is the mean in flight).
        let binds = window.max_in_flight as f64 >= 0.9 * window.limit as f64;
        let saturated = throughput * latency >= 0.8 * limit;
        // What the work ran at once has come down by a quarter from the anchor (Little's
        // law: throughput × latency), the work filling the limit all along, and the
        // latency has not come down with it: what read as a queue was the service
        // slowing (a queue's latency falls in proportion to what is in flight; a slower
        // service's throughput does instead). The latency now is the no-load latency:
        // the estimate takes it, with no probe (a probe sized from the stale estimate
        // would go far below the server).
        let mut noload = noload;
        let in_flight = throughput * latency;
        // (Only a round of work admitted under this limit: none above it in flight.)
        let clean = window.max_in_flight <= window.limit;
        if self.confirmed {
            let spread = |count: u64| self.cv() * (1.0 / count as f64 + 1.0 / samples).sqrt();
            let filled = saturated && binds && clean;
            let jumped = latency > 1.5 * noload * (1.0 + self.tolerance) * (1.0 + 2.0 * noise);
            match self.anchor {
                // The latency rose beyond the noise: something changed (capacity, or the
                // service), and only what follows tells which. Measured from here: from
                // this round if the work filled it, else from the next that it fills.
                // (Any round: the limit may be cut for a fall in capacity on a round the
                // work did not fill, one that spans a pause in the load. Anchored before
                // the fall, the cut's rounds would read like a slower service. Such a
                // round's mean is diluted by the pause's: a rise beyond doubt over the
                // estimate, a sure cut's, counts too.)
                Some((_, anchored, count))
                    if latency > anchored * (1.0 + 3.0 * spread(count)) || jumped =>
                {
                    self.anchor = filled.then_some((in_flight, latency, window.samples));
                }
                _ if !filled => {}
                Some((high, anchored, count)) if in_flight <= 0.75 * high => {
                    // (A queue's would be in proportion: the latency must stand above
                    // that by three times the noise of the two rounds.)
                    if latency >= anchored * (in_flight / high + 3.0 * spread(count)).max(0.9) {
                        noload = latency;
                        self.noload = Some(latency);
                        self.anchor = None;
                        // Some of it may be queue still: a probe (sized from the new
                        // estimate, so near the server) measures it soon.
                        self.since_probe =
                            self.since_probe.max(self.probe_every.saturating_sub(10));
                        self.reference = (0, 0.0);
                        self.recent = None;
                    }
                }
                // Near the most in flight: the latency there now (a queue that formed
                // since, after a fall in capacity, is one a cut will shorten).
                Some((high, ..)) if in_flight >= 0.9 * high => {
                    self.anchor = Some((high.max(in_flight), latency, window.samples));
                }
                Some(_) => {}
                None => self.anchor = Some((in_flight, latency, window.samples)),
            }
        }
        // The latency a queue adds, read from the median (which the tail moves little),
        // over the no-load mean: what the mean would read without the tail's noise.
        let latency = match (self.shape, window.median_latency()) {
            (Some(shape), Some(median)) if shape < SKEWED => {
                noload * (1.0 - shape) + median.as_secs_f64()
            }
            _ => latency,
        };
        // A queue adds a wait alike for all, which moves every quartile of the latencies
        // alike: their interquartile range over the last probe's is what the service
        // takes now, as a share of what it took then. Far below it, twice in a row: the
        // service quickened, and the stale estimate would hold a queue as long as the
        // service (read as the knee). It is probed.
        let quick = saturated
            && self
                .service_share(&window.spread)
                .is_some_and(|share| share < 0.6);
        self.quick_rounds = if quick { self.quick_rounds + 1 } else { 0 };
        // The server answers more a second than the rounds the work filled before,
        // beyond how much those vary, and its latency fell (at a limit grown, the count
        // rises with it, the latency does not fall), though not below the estimate (a
        // faster service answers more too, and is probed): it runs more at once
        // (capacity came back). Twice in a row, where the limit would grow, it is as
        // sure as a second round with no queue.
        let rose = self.recent.is_some_and(|recent| {
            let margin = (2.5 * self.cv() / samples.sqrt())
                .max(1.5 * recent.spread.sqrt())
                .max(0.1);
            saturated
                && latency >= (1.0 - Self::margin(noise).max(0.1)) * noload
                && throughput > recent.throughput * (1.0 + margin)
                // (And the latency fell with it, beyond one round's noise: Little's law
                // at the same limit, read the other way. A rise in the count alone is
                // more often its noise.)
                && latency < recent.latency * (1.0 - noise)
        });
        self.rising = if rose { self.rising + 1 } else { 0 };
        let overloaded = window.overloaded as f64 / samples;
        let allowance = self.baseline + self.threshold + 3.0 * (self.baseline / samples).sqrt();
        let target = if overloaded > allowance {
            self.streak = 0;
            limit * self.backoff
        } else {
            let knee = noload * (1.0 + self.tolerance);
            // The server's concurrency as the round shows it (Little's law: the limit
            // over the latency's multiple of the no-load latency), with the tolerance.
            let gradient = (knee / latency).clamp(0.5, 1.0 + self.tolerance);
            let concurrency = limit * gradient;
            // Just above it, with a queue of √ of it: enough to keep the server busy
            // between arrivals, short next to a small server.
            let target = concurrency + concurrency.sqrt();
            // Queued beyond the round's noise, read by the latencies' spread as measured
            // (from a hundred samples at least: fewer read a heavy tail low) where it is
            // below the 1 `cv` takes it as at least. A limit started far above a small
            // server holds a queue whose latencies, each a sum of many waits, spread far
            // less than a service's; its first estimate was taken as the queue formed,
            // and the queue then stands a fifth or so above it: within the noise of a
            // spread of 1, far beyond that of the spread it has.
            let noise = self
                .measured_cv(100.0)
                .map_or(noise, |cv| noise.min(cv / samples.sqrt()));
            let queued = latency > knee * (1.0 + 2.0 * noise);
            // Unconfirmed, read as queued, but spread at least as the first samples were
            // (over the geometric midpoint of a slower service's spread and a queue's,
            // `1 / k` of it): a queue's wait, alike for all, narrows the spread; the
            // first estimate missed the service's long requests (they end last), and this
            // round reads the service over more samples. Not under a limit cut since: a
            // queue draining holds long waits and short ones, and spreads wide. Only a
            // spread wider than an exponential's: a queue's latencies that rise within
            // the round (a server that shrinks) spread a little too, and so may the
            // first samples; a service that spreads no wider has no long requests for
            // the first samples to miss. (Nor where the first samples did not spread at
            // all: nothing spreads less.)
            let wider = !self.confirmed
                && queued
                && self.first_cv.zip(window.spread.bucketed_cv()).is_some_and(
                    |((first, then), round)| {
                        window.limit >= then
                            && first > 0.0
                            && round > WIDE
                            && round >= first * (noload / latency).sqrt()
                    },
                );
            let queued = queued && !wider;
            self.queued_rounds = if queued { self.queued_rounds + 1 } else { 0 };
            // Half as many again in flight as when the first estimate was taken, and no
            // more latency: it did not queue then, and it stands.
            if !self.confirmed && !queued && throughput * latency >= 1.5 * self.first {
                self.confirmed = true;
                // And this round read no queue at half as much again in flight: its
                // latency is a no-load reading, from more samples than the first (whose
                // short requests, ending first, read low).
                if latency > noload {
                    self.noload = Some(latency);
                }
                // The median of the rounds the estimate was read from, over the estimate
                // now, is the service's shape as those rounds show it (until a probe reads
                // it). A skewed service's first samples are its short requests, which end
                // first, and their mean reads low; but a queue moves the median as much as
                // the mean, and the long requests barely: read by the median over theirs,
                // a round shows its queue whatever their mean missed. (All of the rounds:
                // the first hundred samples' median, as short as their mean, would read an
                // exponential service as skewed.)
                if self.shape.is_none() {
                    let estimate = self.noload.unwrap_or(noload);
                    self.shape = self
                        .unconfirmed
                        .median_latency()
                        .map(|median| median.as_secs_f64() / estimate);
                }
            } else if !self.confirmed
                && (wider || !queued && window.max_in_flight as f64 <= 1.1 * self.first)
            {
                // No more at once than when the first estimate was taken, and no queue
                // beyond the noise: a reading of the same latency, averaged in (a hundred
                // samples' mean is within 10%, and the short requests that end first bias
                // it low): the estimate is the mean of every round merged so far.
                self.unconfirmed.merge(window);
                self.noload = self.unconfirmed.mean_latency().map(|m| m.as_secs_f64());
            }
            if target < limit {
                self.streak = 0;
                if !self.confirmed && (wider || latency < 2.0 * knee * (1.0 + 2.0 * noise)) {
                    // The estimate is the first samples', unmeasured: the work that ended
                    // first, the short requests, may have set it. Only a probe cuts,
                    // unless the latency doubled.
                    limit
                } else if binds || latency > 1.5 * knee * (1.0 + 2.0 * noise) {
                    // The work filled the limit, or queued beyond doubt (more of it in
                    // flight than the server runs at once, under a limit far above).
                    target
                } else {
                    // The work did not fill the limit, and the latency may be its noise
                    // (a heavy tail's window): cut no lower than what the work used, with
                    // the same allowance, or the next burst is shed for a reading.
                    let used = window.max_in_flight as f64;
                    target.max(used * (1.0 + self.tolerance) + used.sqrt())
                }
            } else if !binds {
                // The work did not reach the limit: growing it would only raise a
                // number nothing tests (and be far too high when the load comes).
                self.streak = 0;
                limit
            } else {
                // No queue (the latency at most the knee): grow, faster round after round
                // (until a round is queued beyond its noise), so that a server far above
                // the limit is found in a few rounds.
                // Under half the limit the last probe began at, and no queue at all (the
                // no-load latency, within the noise) with every slot busy: a probe, or a
                // cut since, found less capacity, and it has come back. As sure as a
                // second round with no queue: half the limit at once, not √ of it damped
                // (the server ran that many before). (From the first rounds after the
                // change, which still hold requests that queued before, the ramp took
                // four rounds.) So is a rise in throughput read twice (`rising`).
                let back = latency <= noload * (1.0 + noise)
                    && self.probed_from.is_some_and(|from| limit < 0.5 * from);
                if self.rising >= 2 || back {
                    self.streak = self.streak.max(1);
                }
                if latency > knee && self.rising < 2 {
                    // Within the noise of the knee: the formula's step alone.
                    if queued {
                        self.streak = 0;
                    }
                    target
                } else {
                    self.streak += 1;
                    // √limit, then half the limit, then the limit: a server that grew four
                    // times over is found in four rounds. (The larger steps only where the
                    // round held the limit full, as a ramp does: a load at the server's
                    // capacity nears any limit now and then, its queue a random walk, and
                    // a doubled limit there only lengthens the queue's tail.)
                    let full = window.max_in_flight >= window.limit;
                    let step = match self.streak {
                        2 if full => limit / 2.0,
                        3.. if full => limit,
                        _ => limit.sqrt(),
                    };
                    target.max(limit + step.max(limit.sqrt()))
                }
            }
        };
        // (A round that reads a quicker service holds the limit: at the stale estimate
        // the queue it grew into would be read as none.)
        let target = if quick { target.min(limit) } else { target };
        // Smoothing damps every move but a sure one beyond the round's noise: a second
        // round in a row with no queue, or a queue beyond doubt (half as long again as the
        // knee). A noisy round would shed work, or queue it.
        let within_noise = (target / limit - 1.0).abs() <= 3.0 * noise;
        let sure = if target >= limit {
            // Growth: the second round in a row with no queue.
            self.streak >= 2
        } else {
            latency > 1.5 * noload * (1.0 + self.tolerance) * (1.0 + 2.0 * noise)
        };
        let step = if sure && !within_noise {
            1.0
        } else {
            self.smoothing
        };
        self.limit = (limit + step * (target - limit)).max(1.0);
        self.since_growth = if sure && target > limit {
            0
        } else {
            self.since_growth.saturating_add(1)
        };
        if self.limit as u64 != limit as u64 {
            self.changed();
        }
        self.since_probe += 1;
        // The server's concurrency, as throughput × no-load latency shows it while the
        // work fills the limit, fell by a quarter since the last probe: either it runs
        // fewer at once (the latency that rose is queueing, and the gradient is right)
        // or each request takes longer (a dependency slowed: the estimate is stale, and
        // the gradient would take the limit far below what the server runs). Only a
        // probe tells them apart. A window the work did not fill says nothing of the
        // server: less demand is not less capacity.
        let (count, seconds) = self.reference;
        // The recent throughput (rounds the work filled, averaged), against the reference:
        // a fall of a tenth, or of several times the noise of one round (a quarter of a
        // round's noise for the average of several).
        if saturated {
            self.recent = Some(match self.recent {
                Some(recent) => Recent {
                    throughput: 0.7 * recent.throughput + 0.3 * throughput,
                    // (A rise is no noise.)
                    spread: if rose {
                        recent.spread
                    } else {
                        let deviation = throughput / recent.throughput - 1.0;
                        0.7 * recent.spread + 0.3 * deviation * deviation
                    },
                    latency: 0.7 * recent.latency + 0.3 * latency,
                },
                // (At first, as much as a quarter: nothing reads as a rise yet.)
                None => Recent {
                    throughput,
                    spread: 0.0625,
                    latency,
                },
            });
        }
        let fell = saturated
            && count >= 200
            && self.recent.is_some_and(|recent| {
                recent.throughput
                    < count as f64 / seconds * (1.0 - (2.5 * self.cv() / samples.sqrt()).max(0.1))
            });
        // The reference is the throughput of the rounds just after the probe (enough of
        // them for a steady figure), so that a slow drift shows as a fall.
        if saturated && !fell && count < 1000 {
            self.reference = (
                count + window.samples,
                seconds + window.elapsed.as_secs_f64(),
            );
        }
        // A window faster than the no-load latency, beyond its noise: the estimate is
        // stale the other way (each request takes less than it did).
        let faster =
            latency < (1.0 - Self::margin(noise).max(0.1)) * noload || self.quick_rounds >= 2;
        let early = (fell || faster) && self.since_probe >= 4;
        // A probe waits until the work fills the limit on average: until then the limit
        // shapes little, and a probe (sized from what the work runs at once) would only
        // shed work.
        // Nor while the limit grows round after round with no queue: the limit is below
        // the knee, and the estimate reads true (or it would read faster, or queued).
        let due = if self.confirmed {
            self.since_probe >= self.probe_every && self.streak == 0 && self.since_growth >= SETTLE
        } else {
            // Two rounds in a row read as queued: one alone may be the noise of a
            // long service's few samples, and the first probe is a costly one.
            self.queued_rounds >= 2 || self.since_probe >= self.probe_every
        };
        // The first probe also comes where the work queues without filling the limit (a
        // limit started far above a server the work overfills from the start: its
        // first samples were queued already, and only a probe tells).
        let first = !self.confirmed && self.queued_rounds >= 2;
        if (saturated && binds && (due || early)) || first {
            // From the limit before this round's step (a probe measures the limit in
            // force, not the step), or what the work used, if less.
            // (After a fall, from the limit before this round's cut, which may read a
            // slower service as a queue.)
            let from = if fell { limit } else { limit.min(self.limit) }
                .min(window.max_in_flight.max(1) as f64);
            // What the work runs at once at no-load speed: the server's concurrency
            // when the work fills the limit, what the work needs when it does not. (At
            // most what it ran: a faster server has a stale, high estimate.)
            // An unconfirmed estimate may read low (the short requests end first), so
            // the first probe is sized from the limit alone.
            // A fall with the latency within half again of the estimate may be a service
            // slowing little by little (read against the stale estimate as a queue as
            // long) as much as a smaller server (whose queue, under a limit set for a
            // larger one, soon stands higher): sized from the geometric mean of the two,
            // a smaller server is probed at most a tenth above (0.9 × √1.5), a slower one
            // far nearer 90% of it than throughput × the estimate would put it.
            let sized = if fell && !due && latency <= 1.5 * noload {
                (noload * latency).sqrt()
            } else {
                noload
            };
            let concurrency = self.confirmed.then(|| throughput * sized.min(latency));
            let before = saturated.then_some(throughput);
            // (A first probe's limit is the start's, not one the server ran.)
            self.probed_from = self.confirmed.then_some(limit);
            return self.start_probe(from, concurrency, latency, before);
        }
        self.limit as u64
    }

    fn no_load_latency(&self) -> Option<std::time::Duration> {
        self.noload.map(std::time::Duration::from_secs_f64)
    }
}
