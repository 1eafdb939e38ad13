//! Observation that stays off the admit fast path.

use crate::sync::{AtomicU64, Ordering};

/// Cold-path counters of one ledger, kept on their own cache line (see the ledgers).
///
/// Neither counter adds a read-modify-write to an admission that does not set a new
/// high-water mark: the mark is read first and written only when it rises, and the
/// refusal counter is touched only by refusals.
#[derive(Debug)]
pub(crate) struct Stats {
    high_water: AtomicU64,
    refused: AtomicU64,
}

impl Stats {
    pub(crate) fn new() -> Self {
        Self {
            high_water: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Records that the ledger reached `level`.
    #[inline]
    pub(crate) fn observe(&self, level: u64) {
        // Relaxed throughout: the mark is a statistic and synchronises nothing. A plain
        // load first keeps the common case (no new high) free of a read-modify-write.
        if level > self.high_water.load(Ordering::Relaxed) {
            self.high_water.fetch_max(level, Ordering::Relaxed);
        }
    }

    #[cold]
    pub(crate) fn refuse(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn high_water(&self) -> u64 {
        self.high_water.load(Ordering::Relaxed)
    }

    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// A point-in-time reading of a count or byte ledger.
///
/// Each field is read on its own with relaxed ordering: under concurrent traffic the
/// fields are individually accurate but not one atomic picture.
///
/// # Examples
///
/// ```
/// use admission_core::CountLedger;
///
/// let ledger = CountLedger::new(2)?;
/// let a = ledger.try_acquire()?;
/// let _b = ledger.try_acquire()?;
/// let _ = ledger.try_acquire().unwrap_err();
/// drop(a);
///
/// let snap = ledger.snapshot();
/// assert_eq!(snap.in_flight, 1);
/// assert_eq!(snap.capacity, Some(2));
/// assert_eq!(CountLedger::new(0)?.snapshot().capacity, None, "no limit");
/// assert_eq!(snap.high_water, 2);
/// assert_eq!(snap.refused, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Snapshot {
    /// Permits (count ledger) or bytes (byte ledger) held now.
    pub in_flight: u64,
    /// The configured limit; `None`: no limit.
    pub capacity: Option<u64>,
    /// The highest `in_flight` seen since the ledger was created.
    pub high_water: u64,
    /// How many acquisitions this ledger has refused.
    pub refused: u64,
}

/// A limit as a snapshot says it: `None` for none (stored as 0).
pub(crate) fn configured(limit: u64) -> Option<u64> {
    (limit != 0).then_some(limit)
}
