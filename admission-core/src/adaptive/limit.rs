use std::fmt;
use std::time::{Duration, Instant};

use super::{Outcome, Window};
use crate::count::CountLedger;
use crate::samples::Estimate;

/// A count limit that an [`Algorithm`](super::Algorithm) moves, window by window, from the latency and
/// outcome of the work admitted under it (see the [module docs](crate::adaptive)).
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
    pub(super) guard: std::sync::Arc<Guard>,
}

/// Hands the ledger back when the last handle of its controller goes.
pub(super) struct Guard {
    pub(super) ledger: CountLedger,
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
/// first sample after [`AdaptiveBuilder::window`](super::AdaptiveBuilder::window) (100 ms) with at least
/// [`AdaptiveBuilder::min_samples`](super::AdaptiveBuilder::min_samples) (50), so under load it is at most a window and a bit
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
    /// ([`Algorithm::no_load_latency`](super::Algorithm::no_load_latency); [`Gradient`](super::Gradient) measures it by
    /// probes, [`Aimd`](super::Aimd) keeps none): a lower bound on `typical`, as of the
    /// algorithm's last probe.
    pub no_load: Option<Duration>,
    /// When the last window closed (on the limit's clock: see [`AdaptiveBuilder::epoch`](super::AdaptiveBuilder::epoch)).
    pub as_of: Instant,
}

impl From<Estimate> for LatencyEstimate {
    fn from(estimate: Estimate) -> Self {
        Self {
            typical: estimate.typical,
            no_load: estimate.no_load,
            as_of: estimate.as_of,
        }
    }
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
    /// [`AdaptiveBuilder::epoch`](super::AdaptiveBuilder::epoch)). Call it once per admitted piece of work, while or just
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
        self.guard
            .ledger
            .driver()?
            .latency()
            .map(LatencyEstimate::from)
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
            latency: driver.latency().map(LatencyEstimate::from),
        }
    }

    #[cfg(all(test, admission_loom))]
    pub(super) fn close_window(&self, now: u64) {
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
