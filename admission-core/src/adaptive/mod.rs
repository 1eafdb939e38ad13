//! Adaptive concurrency: a count limit that finds the server's concurrency itself, and
//! follows it when it changes.
//!
//! Every static count limit is a guess: too high and the server queues inside (latency
//! climbs, work times out after it was paid for), too low and it sheds work it could have
//! served. An [`AdaptiveLimit`] drives a [`CountLedger`]'s capacity from what the work
//! admitted under it reports: its latency and its [`Outcome`].
//!
//! ```
//! use std::time::Instant;
//! use admission_core::adaptive::{AdaptiveLimit, Gradient, Outcome};
//! use admission_core::CountLedger;
//!
//! let ledger = CountLedger::new(0)?;
//! let _limit = AdaptiveLimit::builder(Gradient::default()).bounds(4, 5_000).build(&ledger)?;
//!
//! // Per request: admit, work, report.
//! let permit = ledger.try_acquire()?;
//! let admitted = Instant::now();
//! // ... the work ...
//! permit.record(admitted.elapsed(), Outcome::Success);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Choosing an algorithm
//!
//! - [`Gradient`] (the default choice): compares each round's mean latency with a
//!   no-load latency it measures itself (by short probes below the knee), and keeps the
//!   limit just above the concurrency the server really has (10% plus √limit above it),
//!   where it is busy all the time and its queue stays short. For servers whose work
//!   waits on a bounded resource (a pool, a dependency's concurrency, CPU). Told neither
//!   the server's concurrency nor its service time, started far below and far above, it
//!   meets the targets of `admission-bench`'s simulator (`cargo run --release -p
//!   admission-bench --bin adaptive`: goodput at least 98% of capacity, p99 latency within
//!   1.25x of the best static limit's, p99 time queued inside the server under one service
//!   time, the limit within 0.75x-1.5x of a new capacity 2 s after it changes) across
//!   exponential and heavy-tailed service times, 8 to 500 workers, 1 ms to 200 ms, bursts,
//!   steps and capacity changes, except where its docs say it is slow to follow
//!   (mixtures of very unequal requests, a service slowing little by little, the second
//!   after capacity comes back from a quarter); the bench README lists every figure.
//! - [`Aimd`]: grows while nothing fails, backs off on failures (overload answers, errors,
//!   clients giving up). For services that report overload themselves, or whose requests
//!   vary so much that latency says little. It learns of a queue only when the queue
//!   makes work fail, so a limit that is too high is never lowered while nothing errors:
//!   pair it with a latency threshold ([`AdaptiveBuilder::overload_latency`]).
//! - Your own: [`Algorithm`] is one method, from a [`Window`] of samples to the next limit.
//!
//! [`AdaptiveLimit::latency`] gives the limit's estimate of how long an admitted request
//! takes now (recent windows' mean latency, and the algorithm's no-load latency), and when
//! it was taken.
//!
//! # Where a sample ends
//!
//! Latency runs from admission to a point the adapter chooses. `admission-tower` ends it
//! at the response head by default: a streaming response (server-sent events, a gRPC
//! stream, a download to a slow client) would otherwise read as a server slowing down;
//! it can end at the body's end instead, for services whose work is in the body. Work
//! that ends without a response (the client went away) is [`Outcome::Dropped`].
//!
//! # Bounds, windows, and who wins
//!
//! The limit stays within [`AdaptiveBuilder::bounds`] (default 1 to 10 000), whatever the
//! algorithm says: the minimum is what a struggling server is still sent. A window closes
//! at the first sample after it has lasted [`AdaptiveBuilder::window`] (100 ms) with at
//! least [`AdaptiveBuilder::min_samples`] (50): a slow server has longer windows. An
//! operator's `close` or `drain` of the ledger overrides the controller; an operator's
//! `set_capacity` takes the limit out of its hands until [`AdaptiveLimit::resume`].
//!
//! # Design
//!
//! Admission is untouched: the [`CountLedger`] still admits with one compare-exchange
//! against its capacity, and an [`AdaptiveLimit`] changes that capacity between windows,
//! through the same path an operator's `set_capacity` takes (so held permits are never
//! revoked and priority classes follow the new limit at once).
//!
//! Recording a sample must not serialise the releases: each thread adds its samples to
//! its own shard (cache-padded; four per core), with one `fetch_add` of the latency and
//! the count packed together, so a window takes each sample whole or not at all; the
//! permits in flight are read for one sample in eight. Whichever recording finds the
//! window's time up closes it under a `try_lock` (the others walk on, never waiting):
//! it gathers the shards and hands the window to the [`Algorithm`], whose answer,
//! clamped into the bounds, becomes the ledger's capacity. The shards live in the
//! ledger's allocation, so a permit records through its ledger
//! ([`CountPermit::record`](crate::CountPermit::record)) with no reference-count traffic.
//! Measured in `admission-bench` (group `adaptive`) on a 2-core x86_64 machine: a sample
//! adds about 16 ns to an acquire and release (8 ns with two threads on one ledger), plus
//! the two clock reads a real sample takes (about 70 ns on that machine's clock source).
//!
//! Every atomic here is relaxed: the samples are statistics (each read-modify-write puts a
//! sample in exactly one window, whatever the ordering), the window's state is under a
//! mutex, and the capacity changes through the ledger's control lock. loom models check
//! that samples recorded on two threads while windows close are each counted once
//! (swapping a shard's word as a load and a store loses samples and fails it), and that
//! an operator's capacity outlasts a controller setting it at the same time (dropping the
//! check fails it), and that a controller dropped while a window closes neither deadlocks
//! nor lingers (a window's closer takes the limit's lock and then the ledger's; removing
//! the controller while holding the ledger's lock, as a first version did, deadlocks in
//! that model).

use std::cell::Cell;
use std::fmt;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::count::CountLedger;
use crate::sync::{AtomicU32, AtomicU64, Mutex, Ordering};

mod aimd;
mod builder;
mod driver;
mod gradient;

pub use aimd::Aimd;
pub use builder::AdaptiveBuilder;
pub(crate) use driver::{Control, Driver, Steered};
use driver::{micros, nanos};
pub use gradient::Gradient;
#[doc(hidden)]
pub use gradient::Mechanism;

/// How an admitted piece of work ended, as the limit learns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Served.
    Success,
    /// The service failed it or answered that it is overloaded (a 5xx, a gRPC
    /// `RESOURCE_EXHAUSTED` or `UNAVAILABLE`, an error), or it took at least the
    /// limit's [`overload_latency`](AdaptiveBuilder::overload_latency).
    Overload,
    /// The client went away before the answer (a deadline, a disconnect).
    Dropped,
}

/// The samples of one window, as an [`Algorithm`] sees them.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_core::adaptive::{Outcome, Window};
///
/// let mut window = Window::new(32, Duration::from_millis(100));
/// window.add(Duration::from_millis(10), Outcome::Success, 20);
/// window.add(Duration::from_millis(30), Outcome::Overload, 31);
/// assert_eq!(window.mean_latency(), Some(Duration::from_millis(20)));
/// assert_eq!(window.overload_share(), 0.5);
/// assert!(!window.app_limited());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// Samples recorded in the window.
    pub samples: u64,
    /// Their latencies added up (at microsecond resolution).
    pub latency_total: Duration,
    /// Samples whose outcome was [`Outcome::Overload`].
    pub overloaded: u64,
    /// Samples whose outcome was [`Outcome::Dropped`].
    pub dropped: u64,
    /// The most permits in flight seen when samples were recorded (read for one sample
    /// in eight, the first of each thread's included).
    pub max_in_flight: u64,
    /// The limit in force during the window (the ledger's capacity).
    pub limit: u64,
    /// How long the window lasted.
    pub elapsed: Duration,
    /// The squares of some of the latencies, for their spread (see [`Window::latency_cv`]).
    spread: Spread,
}

/// Squared latencies of a sample of a window's samples (one in eight of each shard's,
/// the same ones whose permits in flight are read): enough for the spread.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spread {
    /// Samples squared.
    pub(crate) samples: u64,
    /// Their latencies, in µs (capped as their squares are).
    pub(crate) total: u64,
    /// Their squares, each in units of 1024 µs² (see [`Spread::square`]).
    pub(crate) squares: u128,
    /// Their latencies by bucket (see [`Spread::bucket`]).
    pub(crate) buckets: [u32; BUCKETS],
}

// The buckets summed, not listed: a window's `Debug` stays readable.
impl fmt::Debug for Spread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Spread")
            .field("samples", &self.samples)
            .field("total", &self.total)
            .field("squares", &self.squares)
            .field(
                "bucketed",
                &self.buckets.iter().map(|&c| u64::from(c)).sum::<u64>(),
            )
            .finish()
    }
}

impl Default for Spread {
    fn default() -> Self {
        Self {
            samples: 0,
            total: 0,
            squares: 0,
            buckets: [0; BUCKETS],
        }
    }
}

/// Latency buckets: eight per doubling, from 1 µs to about 2^24 µs (16 s).
#[cfg(not(admission_loom))]
pub(crate) const BUCKETS: usize = 8 * 25;
/// Under loom, two: the same relaxed adds and swaps as two hundred, in a model that can
/// explore every interleaving of them.
#[cfg(admission_loom)]
pub(crate) const BUCKETS: usize = 2;

impl Spread {
    /// A latency's bucket.
    #[inline]
    pub(crate) fn bucket(micros: u64) -> usize {
        let micros = micros.max(1);
        let octave = 63 - micros.leading_zeros() as usize;
        // The three bits below the leading one.
        let sub = if octave >= 3 {
            (micros >> (octave - 3)) & 7
        } else {
            (micros << (3 - octave)) & 7
        } as usize;
        (octave * 8 + sub).min(BUCKETS - 1)
    }

    /// A bucket's lower bound, in µs.
    pub(crate) fn lower(bucket: usize) -> f64 {
        let (octave, sub) = (bucket / 8, bucket % 8);
        (1u64 << octave) as f64 * (1.0 + sub as f64 / 8.0)
    }

    /// The latency below which `q` of the bucketed samples fall, in µs.
    pub(crate) fn quantile(&self, q: f64) -> Option<f64> {
        let n: u64 = self.buckets.iter().map(|&c| u64::from(c)).sum();
        if n == 0 {
            return None;
        }
        let rank = q * n as f64;
        let mut seen = 0.0;
        for (bucket, &count) in self.buckets.iter().enumerate() {
            let count = f64::from(count);
            if count > 0.0 && seen + count >= rank {
                let (low, high) = (Self::lower(bucket), Self::lower(bucket + 1));
                return Some(low + (high - low) * ((rank - seen) / count).clamp(0.0, 1.0));
            }
            seen += count;
        }
        None
    }

    /// The latencies' interquartile range, in µs: what a wait alike for all (a queue's)
    /// leaves as it was, and a heavy tail moves little.
    pub(crate) fn interquartile(&self) -> Option<f64> {
        Some(self.quantile(0.75)? - self.quantile(0.25)?)
    }

    /// The latencies' coefficient of variation as their buckets read it (every sample,
    /// each at its bucket's middle: within 1/16 of its value).
    pub(crate) fn bucketed_cv(&self) -> Option<f64> {
        let (mut n, mut total, mut squares) = (0.0, 0.0, 0.0);
        for (bucket, &count) in self.buckets.iter().enumerate() {
            if count > 0 {
                let middle = (Self::lower(bucket) + Self::lower(bucket + 1)) / 2.0;
                let count = f64::from(count);
                n += count;
                total += count * middle;
                squares += count * middle * middle;
            }
        }
        if n == 0.0 {
            return None;
        }
        let mean = total / n;
        Some((squares / n - mean * mean).max(0.0).sqrt() / mean)
    }

    /// The longest latency squared as it is (about 67 s); longer ones count as this.
    pub(crate) const CAP_MICROS: u64 = 1 << 26;

    /// One latency's square, in units of 1024 µs²: at most 2^42, so a shard's word holds
    /// the 2^20 squares a shard can gather in a window.
    #[inline]
    pub(crate) fn square(micros: u64) -> u64 {
        let micros = micros.min(Self::CAP_MICROS);
        (micros * micros) >> 10
    }
}

impl Window {
    /// An empty window under `limit` that lasted `elapsed`: for testing an [`Algorithm`].
    pub fn new(limit: u64, elapsed: Duration) -> Self {
        Self {
            limit,
            elapsed,
            ..Self::default()
        }
    }

    /// Adds one sample, taken with `in_flight` permits in flight.
    pub fn add(&mut self, latency: Duration, outcome: Outcome, in_flight: u64) {
        self.samples += 1;
        self.latency_total += Duration::from_micros(micros(latency));
        match outcome {
            Outcome::Success => {}
            Outcome::Overload => self.overloaded += 1,
            Outcome::Dropped => self.dropped += 1,
        }
        self.max_in_flight = self.max_in_flight.max(in_flight);
        let micros = micros(latency).min(Spread::CAP_MICROS);
        self.spread.samples += 1;
        self.spread.total += micros;
        self.spread.squares += u128::from(Spread::square(micros));
        self.spread.buckets[Spread::bucket(micros)] += 1;
    }

    /// Adds `later`'s samples to this window's, as one window that lasted both: the limit
    /// is `later`'s, the most in flight the larger.
    pub fn merge(&mut self, later: &Window) {
        self.samples += later.samples;
        self.latency_total += later.latency_total;
        self.overloaded += later.overloaded;
        self.dropped += later.dropped;
        self.max_in_flight = self.max_in_flight.max(later.max_in_flight);
        self.limit = later.limit;
        self.elapsed += later.elapsed;
        self.spread.samples += later.spread.samples;
        self.spread.total += later.spread.total;
        self.spread.squares += later.spread.squares;
        for (mine, theirs) in self.spread.buckets.iter_mut().zip(&later.spread.buckets) {
            *mine += theirs;
        }
    }

    /// The samples' median latency, to within an eighth of a doubling (each sample is
    /// counted in a latency bucket, eight to a doubling); `None` without samples.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_core::adaptive::{Outcome, Window};
    ///
    /// let mut window = Window::new(8, Duration::from_millis(100));
    /// for ms in [1, 2, 3, 400] {
    ///     window.add(Duration::from_millis(ms), Outcome::Success, 1);
    /// }
    /// // The mean is 101.5 ms; the median is about 2.5 ms.
    /// let median = window.median_latency().unwrap();
    /// assert!(median > Duration::from_millis(2) && median < Duration::from_millis(3));
    /// ```
    pub fn median_latency(&self) -> Option<Duration> {
        self.spread
            .quantile(0.5)
            .map(|micros| Duration::from_secs_f64(micros / 1e6))
    }

    /// The latency below which a share `q` (0 to 1) of the samples fall, to within an
    /// eighth of a doubling (each sample is counted in a latency bucket, eight to a
    /// doubling); `None` without samples. `latency_quantile(0.5)` is the median.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_core::adaptive::{Outcome, Window};
    ///
    /// let mut window = Window::new(8, Duration::from_millis(100));
    /// for ms in 1..=100 {
    ///     window.add(Duration::from_millis(ms), Outcome::Success, 1);
    /// }
    /// let p95 = window.latency_quantile(0.95).unwrap();
    /// assert!(p95 > Duration::from_millis(90) && p95 < Duration::from_millis(100));
    /// ```
    pub fn latency_quantile(&self, q: f64) -> Option<Duration> {
        self.spread
            .quantile(q.clamp(0.0, 1.0))
            .map(|micros| Duration::from_secs_f64(micros / 1e6))
    }

    /// The latencies' interquartile range (the 75th percentile less the 25th): how much
    /// the service itself varies. A queue's wait, alike for every request, moves every
    /// quartile alike and leaves it as it was; a heavy tail moves it little. `None`
    /// without samples.
    pub fn latency_interquartile_range(&self) -> Option<Duration> {
        self.spread
            .interquartile()
            .map(|micros| Duration::from_secs_f64(micros / 1e6))
    }

    /// The latencies' coefficient of variation read from every sample's bucket (each at
    /// its bucket's middle, within 1/16 of its value), where
    /// [`latency_cv`](Self::latency_cv) reads one sample in eight exactly: steadier for
    /// a window of a few hundred samples. `None` without samples.
    pub fn bucketed_latency_cv(&self) -> Option<f64> {
        self.spread.bucketed_cv()
    }

    /// The latencies' coefficient of variation (standard deviation over mean), from a
    /// sample of them (one in eight, the first of each thread's included); `None`
    /// without samples. The noise of [`mean_latency`](Self::mean_latency) is about this over the
    /// square root of [`samples`](Self::samples): an algorithm can tell a change from
    /// noise by it.
    pub fn latency_cv(&self) -> Option<f64> {
        let n = self.spread.samples as f64;
        if n == 0.0 {
            return None;
        }
        let mean = self.spread.total as f64 / n;
        if mean <= 0.0 {
            return Some(0.0);
        }
        let square = self.spread.squares as f64 * 1024.0 / n;
        Some((square - mean * mean).max(0.0).sqrt() / mean)
    }

    /// The mean latency of the samples; `None` for an empty window.
    pub fn mean_latency(&self) -> Option<Duration> {
        let nanos = self
            .latency_total
            .as_nanos()
            .checked_div(u128::from(self.samples))?;
        Some(Duration::from_nanos(
            u64::try_from(nanos).unwrap_or(u64::MAX),
        ))
    }

    /// The share of samples that were overloaded or dropped (0 for an empty window).
    pub fn overload_share(&self) -> f64 {
        if self.samples == 0 {
            return 0.0;
        }
        (self.overloaded + self.dropped) as f64 / self.samples as f64
    }

    /// Samples per second over the window.
    pub fn throughput(&self) -> f64 {
        self.samples as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Whether the work never used half the limit: growing the limit then would only
    /// raise a number nothing tests (the limit would run away from the server while it
    /// is idle, and be far too high when load comes).
    pub fn app_limited(&self) -> bool {
        self.max_in_flight.saturating_mul(2) < self.limit
    }
}

/// An algorithm that sets a count limit from windows of samples.
///
/// Called once per window, under the limit's control lock (never on the admission path),
/// with the samples of the window that just closed; returns the limit for the next one.
/// The [`AdaptiveLimit`] clamps the answer into its bounds, so an algorithm should take
/// [`Window::limit`] (what was really in force) as its starting point rather than what
/// it returned last time: the two differ after clamping, and after an operator hands a
/// limit fixed by hand back to the controller.
///
/// Two are provided: [`Gradient`] (latency against a no-load estimate: the default)
/// and [`Aimd`] (outcomes only).
///
/// # Examples
///
/// ```
/// use admission_core::adaptive::{Algorithm, Window};
///
/// /// Doubles while nothing fails, halves on any failure.
/// #[derive(Debug)]
/// struct Doubling;
///
/// impl Algorithm for Doubling {
///     fn update(&mut self, window: &Window) -> u64 {
///         if window.overload_share() > 0.0 {
///             window.limit / 2
///         } else if window.app_limited() {
///             window.limit
///         } else {
///             window.limit * 2
///         }
///     }
/// }
/// ```
pub trait Algorithm: fmt::Debug + Send + 'static {
    /// The limit for the next window, given the window that just closed.
    fn update(&mut self, window: &Window) -> u64;

    /// The algorithm's estimate of a request's latency with nothing queued, if it keeps
    /// one (default: none). [`Gradient`] does; [`Aimd`] does not. Read after each window
    /// into [`AdaptiveLimit::latency`].
    fn no_load_latency(&self) -> Option<Duration> {
        None
    }
}

impl<A: Algorithm + ?Sized> Algorithm for Box<A> {
    fn update(&mut self, window: &Window) -> u64 {
        (**self).update(window)
    }

    fn no_load_latency(&self) -> Option<Duration> {
        (**self).no_load_latency()
    }
}

/// Why an [`AdaptiveLimit`] could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdaptiveError {
    /// The bounds are empty (minimum above maximum), start at 0, or end above
    /// [`CountLedger::MAX_CAPACITY`].
    Bounds {
        /// The minimum asked for.
        min: u64,
        /// The maximum asked for.
        max: u64,
    },
    /// Another [`AdaptiveLimit`] drives this ledger already.
    AlreadyDriven,
}

impl fmt::Display for AdaptiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bounds { min, max } => write!(
                f,
                "adaptive limit bounds {min}..={max} are invalid: need 1 <= min <= max <= {}",
                CountLedger::MAX_CAPACITY
            ),
            Self::AlreadyDriven => f.write_str("another adaptive limit drives this count ledger"),
        }
    }
}

impl std::error::Error for AdaptiveError {}

/// A count limit that an [`Algorithm`] moves, window by window, from the latency and
/// outcome of the work admitted under it (see the [module docs](self)).
///
/// It drives a [`CountLedger`]'s capacity: admission stays the ledger's one
/// compare-exchange. Each admitted piece of work is recorded once when it ends
/// ([`record`](Self::record), or the permit's
/// [`CountPermit::record`](crate::CountPermit::record), with its latency and
/// [`Outcome`]); recording adds to a per-thread shard (one uncontended `fetch_add`) and,
/// once per window, one recording closes the window and sets the new capacity. No timer
/// and no runtime: the clock is read at recording, or passed in
/// ([`record_at`](Self::record_at)), so a simulation can run it on virtual time.
///
/// Clones share one limit.
///
/// # Who wins
///
/// - A [`close`](CountLedger::close) or a [`drain`](CountLedger::drain) overrides the
///   controller: the ledger refuses everything new whatever capacity it sets meanwhile.
/// - An operator's [`set_capacity`](CountLedger::set_capacity) (or
///   [`set_unlimited`](CountLedger::set_unlimited), or [`set_fixed`](Self::set_fixed))
///   takes the limit out of the controller's hands: the capacity stays as set, and
///   windows close without changing it, until [`resume`](Self::resume) hands it back (the
///   algorithm then starts from the capacity in force).
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use admission_core::adaptive::{AdaptiveLimit, Gradient, Outcome};
/// use admission_core::CountLedger;
///
/// let ledger = CountLedger::new(0)?;
/// let limit = AdaptiveLimit::builder(Gradient::default())
///     .bounds(4, 1_000)
///     .initial(16)
///     .build(&ledger)?;
/// assert_eq!(ledger.capacity(), 16);
///
/// // On each admitted request:
/// let permit = ledger.try_acquire()?;
/// let admitted = Instant::now();
/// // ... the work ...
/// limit.record(admitted.elapsed(), Outcome::Success);
/// drop(permit);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct AdaptiveLimit {
    guard: std::sync::Arc<Guard>,
}

/// Hands the ledger back when the last handle of its controller goes.
struct Guard {
    ledger: CountLedger,
}

impl Drop for Guard {
    fn drop(&mut self) {
        // The ledger outlives its controller: it keeps the last capacity, and a later
        // controller may drive it.
        self.ledger.hand_back(true);
    }
}

/// How long an admitted request takes, as an [`AdaptiveLimit`] last measured it
/// ([`AdaptiveLimit::latency`]).
///
/// Fresh as of the last window's close ([`as_of`](Self::as_of)): windows close at the
/// first sample after [`AdaptiveBuilder::window`] (100 ms) with at least
/// [`AdaptiveBuilder::min_samples`] (50), so under load it is at most a window and a bit
/// old, and `typical` follows a change in the service within about four windows. With few
/// requests (fewer than `min_samples` a window) windows last longer, and with none the
/// estimate stays as it was: compare `as_of` with the clock before trusting an old one.
/// The fields are each read on their own: read while a window closes, one may be a
/// window newer than another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LatencyEstimate {
    /// The mean latency of recent windows, averaged with a weight of a quarter per window
    /// (the last four or so): what a request admitted now can expect, time queued inside
    /// the server included.
    pub typical: Duration,
    /// The algorithm's latency with nothing queued, where it keeps one
    /// ([`Algorithm::no_load_latency`]; [`Gradient`] measures it by probes, [`Aimd`] keeps
    /// none): a lower bound on `typical`, as of the algorithm's last probe.
    pub no_load: Option<Duration>,
    /// When the last window closed (on the limit's clock: see [`AdaptiveBuilder::epoch`]).
    pub as_of: Instant,
}

/// A reading of an [`AdaptiveLimit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdaptiveSnapshot {
    /// The limit in force (the ledger's capacity; 0 if an operator set it unlimited).
    pub limit: u64,
    /// Whether an operator has fixed the limit by hand (see [`AdaptiveLimit::resume`]).
    pub fixed: bool,
    /// The bounds the controller keeps the limit within.
    pub min: u64,
    /// See `min`.
    pub max: u64,
    /// Windows closed so far.
    pub windows: u64,
    /// The last window closed.
    pub last: Option<Window>,
    /// How long an admitted request takes now ([`AdaptiveLimit::latency`]).
    pub latency: Option<LatencyEstimate>,
}

impl AdaptiveLimit {
    /// A builder for a limit that `algorithm` drives.
    pub fn builder(algorithm: impl Algorithm) -> AdaptiveBuilder {
        AdaptiveBuilder {
            algorithm: Box::new(algorithm),
            min: 1,
            max: 10_000,
            initial: 20,
            window: Duration::from_millis(100),
            min_samples: 50,
            overload_latency: None,
            epoch: None,
        }
    }

    /// The ledger whose capacity this limit drives.
    pub fn ledger(&self) -> &CountLedger {
        &self.guard.ledger
    }

    /// The limit in force now (the ledger's capacity).
    pub fn limit(&self) -> u64 {
        self.guard.ledger.capacity()
    }

    /// Records one admitted piece of work that ended now: how long it took and how it
    /// ended. Reads the clock once; see [`record_at`](Self::record_at). (A permit of the
    /// ledger records the same way: [`CountPermit::record`](crate::CountPermit::record).)
    #[inline]
    pub fn record(&self, latency: Duration, outcome: Outcome) {
        self.record_at(Instant::now(), latency, outcome);
    }

    /// Records one admitted piece of work that ended at `now` (on the limit's clock: see
    /// [`AdaptiveBuilder::epoch`]). Call it once per admitted piece of work, while or just
    /// after its permit is released.
    ///
    /// Costs one `fetch_add` on this thread's shard, a load or two, and, once per
    /// window, closing the window (a `try_lock` that never waits).
    #[inline]
    pub fn record_at(&self, now: Instant, latency: Duration, outcome: Outcome) {
        self.guard.ledger.record_at(now, latency, outcome);
    }

    /// Fixes the limit at `capacity` by hand: the controller leaves it there until
    /// [`resume`](Self::resume). The same as the ledger's
    /// [`set_capacity`](CountLedger::set_capacity).
    ///
    /// # Errors
    ///
    /// As [`CountLedger::set_capacity`]: 0 or above the maximum.
    pub fn set_fixed(&self, capacity: usize) -> Result<(), crate::CapacityError> {
        self.guard.ledger.set_capacity(capacity)
    }

    /// Hands a limit fixed by hand back to the controller, which goes on from the
    /// capacity in force.
    ///
    /// ```
    /// use admission_core::adaptive::{AdaptiveLimit, Aimd};
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(0)?;
    /// let limit = AdaptiveLimit::builder(Aimd::default()).build(&ledger)?;
    /// ledger.set_capacity(5)?; // an operator
    /// assert!(limit.snapshot().fixed);
    /// limit.resume();
    /// assert!(!limit.snapshot().fixed);
    /// assert_eq!(limit.limit(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resume(&self) {
        self.guard.ledger.hand_back(false);
    }

    /// The limit's estimate of how long an admitted request takes now, from admission to
    /// where its sample ends (see [`LatencyEstimate`]); `None` until a window with samples
    /// has closed. Lock-free: three relaxed loads.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use admission_core::adaptive::{AdaptiveLimit, Gradient, Outcome};
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(0)?;
    /// let start = Instant::now();
    /// let limit = AdaptiveLimit::builder(Gradient::default()).epoch(start).build(&ledger)?;
    /// assert!(limit.latency().is_none(), "no window has closed");
    /// // A window closes at the first sample once it has lasted 100 ms with 50 samples.
    /// for i in 1..=50 {
    ///     let now = start + Duration::from_millis(2 * i);
    ///     limit.record_at(now, Duration::from_millis(10), Outcome::Success);
    /// }
    /// let estimate = limit.latency().expect("a window closed");
    /// assert_eq!(estimate.typical, Duration::from_millis(10));
    /// assert_eq!(estimate.as_of, start + Duration::from_millis(100));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn latency(&self) -> Option<LatencyEstimate> {
        self.guard.ledger.driver()?.latency()
    }

    /// The limit, whether it is fixed by hand, and the last window.
    pub fn snapshot(&self) -> AdaptiveSnapshot {
        let ledger = &self.guard.ledger;
        let driver = ledger.driver().expect("a driven ledger has a driver");
        let control = driver.control.lock();
        let control = control.as_ref().expect("a live controller");
        AdaptiveSnapshot {
            limit: ledger.capacity(),
            fixed: ledger.is_fixed(),
            min: control.bounds.0,
            max: control.bounds.1,
            windows: control.windows,
            last: control.last,
            latency: driver.latency(),
        }
    }

    #[cfg(all(test, admission_loom))]
    fn close_window(&self, now: u64) {
        let ledger = &self.guard.ledger;
        ledger
            .driver()
            .unwrap()
            .close_window(ledger.steering(), now);
    }
}

impl fmt::Debug for AdaptiveLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let snapshot = self.snapshot();
        f.debug_struct("AdaptiveLimit")
            .field("limit", &snapshot.limit)
            .field("fixed", &snapshot.fixed)
            .field("bounds", &(snapshot.min, snapshot.max))
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(admission_loom)))]
mod tests;

// Arithmetic on model windows, no unsafe code: not worth Miri's hundredfold slowdown.
#[cfg(all(test, not(admission_loom), not(miri)))]
mod algorithm_tests;

#[cfg(all(test, admission_loom))]
mod loom_tests;
