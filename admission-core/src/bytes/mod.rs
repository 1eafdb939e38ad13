//! The byte ledger: at most `budget` bytes charged in flight.
//!
//! # Design
//!
//! One 64-bit word, as in the count ledger, doubles as the allocation's reference count
//! (see `raw`):
//!
//! ```text
//!   bit 63      OWNER: the ledger's handles
//!   bits 40-62  permits alive (each counts 1 here, so a zero-byte permit still counts)
//!   bits 0-39   bytes charged
//! ```
//!
//! A charge adds `PERMIT + n` with one compare-exchange; a drop subtracts what the permit
//! holds with one atomic subtraction. So budgets and single charges are limited to
//! 2^40 - 1 bytes (1 TiB) and live permits to 2^23 - 1 (8,388,607): more than any one
//! process buffers, and both limits are checked, never overflowed.
//!
//! The compare-exchange loop (rather than an optimistic add) matters more here than for
//! counts: an optimistic add of a large charge would make every concurrent small charge
//! fail while it is rolled back.

use std::fmt;

use crossbeam_utils::CachePadded;

use crate::limit;
use crate::raw::{self, Counted, OWNER, Owner};
use crate::stats::{Snapshot, Stats};
use crate::sync::{Arc, AtomicU64, Ordering, Track};
use crate::{CapacityError, Refused};

const PERMIT_SHIFT: u32 = 40;
const PERMIT: u64 = 1 << PERMIT_SHIFT;
const BYTES: u64 = PERMIT - 1;
const PERMITS: u64 = !OWNER & !BYTES;

/// Whether a word reading `current` can take a new permit charged `bytes` (at most
/// `BYTES`, checked by the caller) against `budget`: the budget allows it, or nothing is
/// charged (the lone-request exemption); and the byte and permit fields cannot overflow.
#[inline]
fn has_room(current: u64, bytes: u64, budget: u64) -> bool {
    let charged = current & BYTES;
    // `charged + bytes` cannot overflow: both are at most 2^40.
    let over_budget = charged != 0 && charged + bytes > budget;
    !over_budget && charged + bytes <= BYTES && current & PERMITS != PERMITS
}

/// A limit on how many bytes are charged in flight at once.
///
/// Each [`BytePermit`] holds a charge of some bytes until it is dropped; it can grow as a
/// body streams in ([`BytePermit::try_grow`]) and give part of its charge back early
/// ([`BytePermit::shrink`]).
///
/// **Lone-request exemption.** When nothing is charged, a single charge is admitted
/// however large it is (up to [`max_charge`](Self::max_charge), if one is set): one
/// request is one atomic batch, and refusing the only thing in flight would shed load the
/// process is not short of. Likewise a permit that holds every charged byte may grow past
/// the budget. So `in_flight` can exceed the budget by at most one request.
///
/// What it bounds: bytes that callers say they hold. It does not measure memory; it
/// bounds what is charged against it, and is only as good as the charges.
///
/// A budget of 0 means unlimited (still counted).
///
/// # Examples
///
/// ```
/// use admission_core::{ByteLedger, Refused};
///
/// let ledger = ByteLedger::new(1024)?;
/// let a = ledger.try_charge(600)?;
/// assert_eq!(ledger.try_charge(600).unwrap_err(), Refused::Bytes);
/// let b = ledger.try_charge(400)?;
/// assert_eq!(ledger.in_flight(), 1000);
/// drop((a, b));
/// assert_eq!(ledger.in_flight(), 0);
///
/// // Lone-request exemption: on an idle ledger one oversized charge is admitted.
/// let big = ledger.try_charge(10_000)?;
/// assert!(ledger.try_charge(1).is_err());
/// drop(big);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Memory ordering
///
/// As for [`CountLedger`](crate::CountLedger): charges synchronise with nothing.
#[derive(Clone)]
pub struct ByteLedger {
    owner: Arc<Owner<ByteInner>>,
}

struct ByteInner {
    /// The word and the limits checked against it share a line; statistics are apart
    /// (see `CountLedger` for the padding choice).
    hot: CachePadded<Hot>,
    stats: CachePadded<Stats>,
    too_large: AtomicU64,
    track: Track,
}

struct Hot {
    state: AtomicU64,
    budget: AtomicU64,
    max_charge: AtomicU64,
}

impl Counted for ByteInner {
    fn word(&self) -> &AtomicU64 {
        &self.hot.state
    }

    fn track(&self) -> &Track {
        &self.track
    }
}

impl ByteLedger {
    /// The largest budget, and the largest single charge, a byte ledger represents:
    /// 2^40 - 1 bytes (1 TiB).
    pub const MAX_BUDGET: u64 = BYTES;

    /// The most permits of one byte ledger alive at once: 2^23 - 1.
    pub const MAX_PERMITS: u64 = PERMITS >> PERMIT_SHIFT;

    /// A ledger admitting at most `budget` bytes charged at once; 0 means unlimited.
    ///
    /// # Errors
    ///
    /// [`CapacityError`] if `budget` is above [`MAX_BUDGET`](Self::MAX_BUDGET).
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// let ledger = ByteLedger::new(64 << 20)?;
    /// assert_eq!(ledger.budget(), 64 << 20);
    /// assert!(ByteLedger::new(u64::MAX).is_err());
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn new(budget: u64) -> Result<Self, CapacityError> {
        Self::with_max_charge(budget, 0)
    }

    /// A ledger of `budget` bytes (0: unlimited) that refuses any single charge above
    /// `max_charge` as [`Refused::TooLarge`] (0: no maximum beyond
    /// [`MAX_BUDGET`](Self::MAX_BUDGET)).
    ///
    /// # Errors
    ///
    /// [`CapacityError`] if either is above [`MAX_BUDGET`](Self::MAX_BUDGET).
    ///
    /// ```
    /// use admission_core::{ByteLedger, Refused};
    ///
    /// let ledger = ByteLedger::with_max_charge(1 << 20, 4096)?;
    /// assert_eq!(ledger.try_charge(4097).unwrap_err(), Refused::TooLarge);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn with_max_charge(budget: u64, max_charge: u64) -> Result<Self, CapacityError> {
        let budget = Self::encode(budget)?;
        let max_charge = Self::encode(max_charge)?;
        let inner = ByteInner {
            hot: CachePadded::new(Hot {
                state: AtomicU64::new(OWNER),
                budget: AtomicU64::new(budget),
                max_charge: AtomicU64::new(max_charge),
            }),
            stats: CachePadded::new(Stats::new()),
            too_large: AtomicU64::new(0),
            track: Track::new(),
        };
        Ok(Self {
            owner: Arc::new(Owner::new(inner)),
        })
    }

    fn encode(value: u64) -> Result<u64, CapacityError> {
        limit::encode(value, Self::MAX_BUDGET)
    }

    #[inline]
    fn inner(&self) -> &ByteInner {
        self.owner.get()
    }

    /// Charges `bytes` if the budget allows (or nothing else is charged), else refuses.
    ///
    /// Never blocks, never allocates, takes no lock. A charge of 0 is admitted and gives
    /// a permit that can [`try_grow`](BytePermit::try_grow) later.
    ///
    /// # Errors
    ///
    /// - [`Refused::TooLarge`] if `bytes` is above [`max_charge`](Self::max_charge) or
    ///   [`MAX_BUDGET`](Self::MAX_BUDGET): no amount of waiting would admit it.
    /// - [`Refused::Bytes`] if other charges leave too little of the budget (or
    ///   [`MAX_PERMITS`](Self::MAX_PERMITS) permits are alive).
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::{ByteLedger, Refused};
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// ledger.set_max_charge(1000)?;
    /// assert_eq!(ledger.try_charge(1001).unwrap_err(), Refused::TooLarge);
    /// let permit = ledger.try_charge(40)?;
    /// assert_eq!(permit.charged(), 40);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_charge(&self, bytes: u64) -> Result<BytePermit, Refused> {
        let (permit, level) = self.try_charge_unobserved(bytes)?;
        self.inner().stats.observe(level);
        Ok(permit)
    }

    /// `try_charge` without recording the high-water mark: the permit and the level it
    /// brought the ledger to (see `CountLedger::try_acquire_unobserved`).
    #[inline]
    pub(crate) fn try_charge_unobserved(&self, bytes: u64) -> Result<(BytePermit, u64), Refused> {
        self.check_size(bytes)?;
        let inner = self.inner();
        let hot = &*inner.hot;
        // Relaxed: limits are plain settings, taking effect for the next charge.
        let budget = hot.budget.load(Ordering::Relaxed);
        let mut current = hot.state.load(Ordering::Relaxed);
        loop {
            if !has_room(current, bytes, budget) {
                inner.stats.refuse();
                return Err(Refused::Bytes);
            }
            // Relaxed on success: see `CountLedger::try_acquire`; the new permit's share
            // is made through our live handle.
            match hot.state.compare_exchange_weak(
                current,
                current + PERMIT + bytes,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    let permit = BytePermit {
                        inner: self.owner.ptr(),
                        charged: bytes,
                    };
                    return Ok((permit, (current & BYTES) + bytes));
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Refuses (and counts) a charge above the maximum single charge or
    /// [`MAX_BUDGET`](Self::MAX_BUDGET): the one refusal that waiting cannot change.
    #[inline]
    pub(crate) fn check_size(&self, bytes: u64) -> Result<(), Refused> {
        // Relaxed: a plain setting. `max_charge` is stored as `UNLIMITED` when unset.
        if bytes > self.inner().hot.max_charge.load(Ordering::Relaxed) || bytes > BYTES {
            return Err(self.too_large());
        }
        Ok(())
    }

    /// Whether a charge of `bytes` would be admitted now, by one load and no write; a
    /// "no" is counted as a refusal (see `CountLedger::check`). Assumes `check_size`.
    #[inline]
    pub(crate) fn check_room(&self, bytes: u64) -> Result<(), Refused> {
        let inner = self.inner();
        // Relaxed: advisory; the compare-exchange that follows decides.
        let current = inner.hot.state.load(Ordering::Relaxed);
        if !has_room(current, bytes, inner.hot.budget.load(Ordering::Relaxed)) {
            inner.stats.refuse();
            return Err(Refused::Bytes);
        }
        Ok(())
    }

    /// Records a level an unobserved charge reached.
    #[inline]
    pub(crate) fn observe(&self, level: u64) {
        self.inner().stats.observe(level);
    }

    /// Counts and returns a too-large refusal.
    #[cold]
    pub(crate) fn too_large(&self) -> Refused {
        self.inner().too_large.fetch_add(1, Ordering::Relaxed);
        Refused::TooLarge
    }

    /// Bytes charged now.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// let _p = ledger.try_charge(30)?;
    /// assert_eq!(ledger.in_flight(), 30);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_flight(&self) -> u64 {
        self.inner().hot.state.load(Ordering::Relaxed) & BYTES
    }

    /// Permits alive now, including those charged zero bytes.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// let _p = ledger.try_charge(0)?;
    /// assert_eq!(ledger.permits(), 1);
    /// assert_eq!(ledger.in_flight(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn permits(&self) -> u64 {
        (self.inner().hot.state.load(Ordering::Relaxed) & PERMITS) >> PERMIT_SHIFT
    }

    /// The budget in force; 0 means unlimited.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// assert_eq!(ByteLedger::new(0)?.budget(), 0);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn budget(&self) -> u64 {
        limit::decode(self.inner().hot.budget.load(Ordering::Relaxed))
    }

    /// Changes the budget for the next charge, to between 1 and
    /// [`MAX_BUDGET`](Self::MAX_BUDGET).
    ///
    /// Lowering it never revokes a held charge; new charges are refused until the held
    /// ones drain below it (the lone-request exemption still applies on an idle ledger).
    ///
    /// # Errors
    ///
    /// [`CapacityError`] for 0 (which would remove the budget: that is
    /// [`set_budget_unlimited`](Self::set_budget_unlimited)) or above `MAX_BUDGET`; the
    /// budget is then unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// let _held = ledger.try_charge(80)?;
    /// ledger.set_budget(50)?;
    /// assert!(ledger.try_charge(1).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_budget(&self, budget: u64) -> Result<(), CapacityError> {
        let budget = CapacityError::check_nonzero(budget, Self::MAX_BUDGET)?;
        self.inner().hot.budget.store(budget, Ordering::Relaxed);
        Ok(())
    }

    /// Removes the budget: charges are refused only above the maximum single charge.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// ledger.set_budget_unlimited();
    /// assert_eq!(ledger.budget(), 0);
    /// let _big = ledger.try_charge(1 << 30)?;
    /// let _more = ledger.try_charge(1 << 30)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_budget_unlimited(&self) {
        (self.inner().hot.budget).store(limit::UNLIMITED, Ordering::Relaxed);
    }

    /// The largest single charge (and the largest a permit may grow to); 0 means no
    /// maximum beyond [`MAX_BUDGET`](Self::MAX_BUDGET).
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// assert_eq!(ledger.max_charge(), 0);
    /// ledger.set_max_charge(10)?;
    /// assert_eq!(ledger.max_charge(), 10);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn max_charge(&self) -> u64 {
        limit::decode(self.inner().hot.max_charge.load(Ordering::Relaxed))
    }

    /// Sets the largest single charge, between 1 and [`MAX_BUDGET`](Self::MAX_BUDGET); a
    /// larger one is refused as [`Refused::TooLarge`], even on an idle ledger.
    ///
    /// # Errors
    ///
    /// [`CapacityError`] for 0 (which would remove the maximum: that is
    /// [`set_max_charge_unlimited`](Self::set_max_charge_unlimited)) or above
    /// `MAX_BUDGET`; the maximum is then unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::{ByteLedger, Refused};
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// ledger.set_max_charge(1000)?;
    /// assert!(ledger.try_charge(1000).is_ok(), "lone request above the budget");
    /// assert_eq!(ledger.try_charge(1001).unwrap_err(), Refused::TooLarge);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_max_charge(&self, max: u64) -> Result<(), CapacityError> {
        let max = CapacityError::check_nonzero(max, Self::MAX_BUDGET)?;
        self.inner().hot.max_charge.store(max, Ordering::Relaxed);
        Ok(())
    }

    /// Removes the maximum single charge (none beyond [`MAX_BUDGET`](Self::MAX_BUDGET)).
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// let ledger = ByteLedger::with_max_charge(0, 10)?;
    /// ledger.set_max_charge_unlimited();
    /// assert_eq!(ledger.max_charge(), 0);
    /// assert!(ledger.try_charge(11).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_max_charge_unlimited(&self) {
        (self.inner().hot.max_charge).store(limit::UNLIMITED, Ordering::Relaxed);
    }

    /// A cheap reading of bytes in flight, budget, high-water mark and refusals (both
    /// over-budget and too-large refusals count in `refused`).
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// drop(ledger.try_charge(70)?);
    /// let snap = ledger.snapshot();
    /// assert_eq!((snap.in_flight, snap.high_water, snap.capacity), (0, 70, Some(100)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot(&self) -> Snapshot {
        let inner = self.inner();
        Snapshot {
            in_flight: self.in_flight(),
            capacity: crate::stats::configured(self.budget()),
            high_water: inner.stats.high_water(),
            refused: inner.stats.refused() + inner.too_large.load(Ordering::Relaxed),
        }
    }
}

impl fmt::Debug for ByteLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ByteLedger")
            .field("in_flight", &self.in_flight())
            .field("budget", &self.budget())
            .finish()
    }
}

mod permit;

pub use permit::BytePermit;

#[cfg(all(test, not(admission_loom)))]
mod tests;

#[cfg(all(test, admission_loom))]
mod loom_models;
