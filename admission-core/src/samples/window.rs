use std::fmt;
use std::time::Duration;

use super::Outcome;
use super::micros;

/// The samples of one window, as an [`Algorithm`](super::Algorithm) sees them.
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
    /// Samples whose outcome was [`Outcome::Gone`].
    pub dropped: u64,
    /// The most permits in flight seen when samples were recorded (read for one sample
    /// in eight, the first of each thread's included).
    pub max_in_flight: u64,
    /// The limit in force during the window (the ledger's capacity).
    pub limit: u64,
    /// How long the window lasted.
    pub elapsed: Duration,
    /// The squares of some of the latencies, for their spread (see [`Window::latency_cv`]).
    pub(crate) spread: Spread,
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
    /// An empty window under `limit` that lasted `elapsed`: for testing an
    /// [`Algorithm`](super::Algorithm).
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
            Outcome::Gone => self.dropped += 1,
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
