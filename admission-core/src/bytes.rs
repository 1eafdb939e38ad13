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
use std::ptr::NonNull;

use crossbeam_utils::CachePadded;

use crate::limit;
use crate::raw::{self, Counted, Owner, OWNER};
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
    /// assert_eq!((snap.in_flight, snap.high_water, snap.capacity), (0, 70, 100));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot(&self) -> Snapshot {
        let inner = self.inner();
        Snapshot {
            in_flight: self.in_flight(),
            capacity: self.budget(),
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

/// A charge against a [`ByteLedger`], released when dropped.
///
/// `'static`, `Send + Sync`; it may outlive every handle of its ledger.
///
/// ```
/// use admission_core::ByteLedger;
///
/// let ledger = ByteLedger::new(100)?;
/// let mut permit = ledger.try_charge(10)?;
/// permit.try_grow(50)?;
/// permit.shrink(20);
/// assert_eq!((permit.charged(), ledger.in_flight()), (40, 40));
/// drop(permit);
/// assert_eq!(ledger.in_flight(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "the charge is released as soon as the permit is dropped"]
pub struct BytePermit {
    inner: NonNull<ByteInner>,
    charged: u64,
}

impl BytePermit {
    fn inner(&self) -> &ByteInner {
        // SAFETY: this permit's `PERMIT` share of the word keeps the cell alive for as
        // long as the permit, and so for the borrow of `self`.
        unsafe { self.inner.as_ref() }
    }

    /// Bytes this permit holds.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// assert_eq!(ledger.try_charge(7)?.charged(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charged(&self) -> u64 {
        self.charged
    }

    /// Adds `bytes` to this permit's charge if the budget allows, else refuses and leaves
    /// the charge as it was.
    ///
    /// A permit that holds every charged byte of its ledger may grow past the budget (the
    /// lone-request exemption), but never past [`ByteLedger::max_charge`].
    ///
    /// # Errors
    ///
    /// [`Refused::TooLarge`] if the grown charge would exceed the maximum single charge;
    /// [`Refused::Bytes`] if the budget cannot take it now.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::{ByteLedger, Refused};
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// let _other = ledger.try_charge(50)?;
    /// let mut body = ledger.try_charge(0)?;
    /// body.try_grow(50)?;
    /// assert_eq!(body.try_grow(1).unwrap_err(), Refused::Bytes);
    /// assert_eq!(body.charged(), 50);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_grow(&mut self, bytes: u64) -> Result<(), Refused> {
        let inner = self.inner();
        let hot = &*inner.hot;
        let grown = self.charged.saturating_add(bytes);
        if grown > hot.max_charge.load(Ordering::Relaxed) || grown > BYTES {
            inner.too_large.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::TooLarge);
        }
        let budget = hot.budget.load(Ordering::Relaxed);
        let mut current = hot.state.load(Ordering::Relaxed);
        loop {
            let charged = current & BYTES;
            // The permit's own bytes are part of `charged`, so this cannot underflow.
            let others = charged - self.charged;
            if (others != 0 && charged + bytes > budget) || charged + bytes > BYTES {
                inner.stats.refuse();
                return Err(Refused::Bytes);
            }
            // Relaxed: the permit's share keeps the cell alive; nothing else is ordered.
            match hot.state.compare_exchange_weak(
                current,
                current + bytes,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    inner.stats.observe(charged + bytes);
                    self.charged = grown;
                    return Ok(());
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Grows this permit's charge by up to `bytes`, as far as the budget has room now, and
    /// never past [`ByteLedger::max_charge`]; returns how many bytes it grew. It never
    /// refuses, so it counts no refusal: for a charge made ahead of need, such as a
    /// reservation for what a body is about to send. Being ahead of need, it takes no
    /// lone-request exemption: it stays within the budget even for the only charge in
    /// flight ([`try_grow`](Self::try_grow) is for what is needed now).
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// let _other = ledger.try_charge(70)?;
    /// let mut body = ledger.try_charge(10)?;
    /// assert_eq!(body.grow_within(50), 20, "the room there was");
    /// assert_eq!((body.charged(), ledger.in_flight()), (30, 100));
    /// assert_eq!(ledger.snapshot().refused, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn grow_within(&mut self, bytes: u64) -> u64 {
        let inner = self.inner();
        let hot = &*inner.hot;
        let most = hot.max_charge.load(Ordering::Relaxed).min(BYTES);
        let bytes = bytes.min(most.saturating_sub(self.charged));
        let budget = hot.budget.load(Ordering::Relaxed);
        let mut current = hot.state.load(Ordering::Relaxed);
        loop {
            let charged = current & BYTES;
            let grow = bytes.min(budget.min(BYTES).saturating_sub(charged));
            if grow == 0 {
                return 0;
            }
            // Relaxed: the permit's share keeps the cell alive; nothing else is ordered
            // (as in `try_grow`).
            match hot.state.compare_exchange_weak(
                current,
                current + grow,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    inner.stats.observe(charged + grow);
                    self.charged += grow;
                    return grow;
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Gives back up to `bytes` of this permit's charge now, keeping the permit; returns
    /// how many bytes were given back.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// let mut permit = ledger.try_charge(30)?;
    /// assert_eq!(permit.shrink(50), 30);
    /// assert_eq!(ledger.in_flight(), 0);
    /// assert_eq!(ledger.permits(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shrink(&mut self, bytes: u64) -> u64 {
        let bytes = bytes.min(self.charged);
        if bytes != 0 {
            // Relaxed: the permit's `PERMIT` share stays, so this never frees the cell.
            self.inner().hot.state.fetch_sub(bytes, Ordering::Relaxed);
            self.charged -= bytes;
        }
        bytes
    }

    /// Gives the whole charge and the permit's share back. Called only from `Drop`.
    fn release(&mut self) {
        // SAFETY: the word holds `PERMIT + charged` on this permit's behalf (made on
        // charge, kept in step by `try_grow` and `shrink`); given up once, here.
        unsafe { raw::put(self.inner, PERMIT + self.charged) };
    }
}

impl Drop for BytePermit {
    fn drop(&mut self) {
        self.release();
    }
}

impl fmt::Debug for BytePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BytePermit")
            .field("charged", &self.charged)
            .finish()
    }
}

// SAFETY: `ByteInner` is all atomics; the permit's operations (`try_grow`, `shrink`
// through `&mut self`, the release in `Drop`) are atomic and correct on any thread.
unsafe impl Send for BytePermit {}
// SAFETY: `&BytePermit` only reads the permit's own `charged`.
unsafe impl Sync for BytePermit {}

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use super::*;

    #[test]
    fn growth_within_the_room_takes_what_there_is_and_counts_no_refusal() {
        let ledger = ByteLedger::with_max_charge(100, 60).unwrap();
        let other = ledger.try_charge(50).unwrap();
        let mut permit = ledger.try_charge(10).unwrap();
        assert_eq!(permit.grow_within(0), 0);
        assert_eq!(permit.grow_within(100), 40, "the room left");
        assert_eq!(permit.grow_within(1), 0, "none left");
        assert_eq!((permit.charged(), ledger.in_flight()), (50, 100));
        assert_eq!(ledger.snapshot().refused, 0);
        assert_eq!(ledger.snapshot().high_water, 100);
        drop(other);
        assert_eq!(
            permit.grow_within(100),
            10,
            "never past the maximum single charge"
        );
        assert_eq!(permit.charged(), 60);
    }

    #[test]
    fn growth_within_the_room_takes_no_lone_request_exemption() {
        let ledger = ByteLedger::new(100).unwrap();
        let mut permit = ledger.try_charge(10).unwrap();
        assert_eq!(
            permit.grow_within(500),
            90,
            "ahead of need: within the budget"
        );
        permit.try_grow(50).unwrap(); // what is needed now: the only charge may pass it
        assert_eq!(permit.grow_within(1), 0);
        assert_eq!(ledger.in_flight(), 150);
        drop(permit);
        assert_eq!(ledger.in_flight(), 0);
    }

    /// The last permit and the last handle dropped on two threads at once, with no join
    /// between them: whichever drop is last frees the ledger, and every use by the other
    /// thread must happen before that free. Under Miri, weakening the release decrement
    /// or the acquire load on the free path makes this a reported data race.
    #[test]
    fn the_last_permit_and_the_last_handle_dropped_on_two_threads_free_after_every_use() {
        for _ in 0..if cfg!(miri) { 8 } else { 1_000 } {
            let ledger = ByteLedger::new(100).unwrap();
            let permit = ledger.try_charge(10).unwrap();
            let t = std::thread::spawn(move || drop(permit));
            drop(ledger);
            t.join().unwrap();
        }
    }

    #[test]
    fn bounds() {
        fn is_send_sync_unpin<T: Send + Sync + Unpin + 'static>() {}
        is_send_sync_unpin::<ByteLedger>();
        is_send_sync_unpin::<BytePermit>();
    }

    #[test]
    fn charge_refuse_release_admit_again_and_back_to_zero() {
        let ledger = ByteLedger::new(100).unwrap();
        let a = ledger.try_charge(60).unwrap();
        assert_eq!(ledger.try_charge(41).unwrap_err(), Refused::Bytes);
        let b = ledger.try_charge(40).unwrap();
        assert_eq!(ledger.in_flight(), 100);
        drop(a);
        let c = ledger.try_charge(60).unwrap();
        drop((b, c));
        assert_eq!((ledger.in_flight(), ledger.permits()), (0, 0));
        assert_eq!(ledger.snapshot().refused, 1);
    }

    #[test]
    fn a_lone_oversized_charge_is_admitted_and_the_next_refused() {
        let ledger = ByteLedger::new(100).unwrap();
        let big = ledger.try_charge(1_000).unwrap();
        assert_eq!(ledger.try_charge(1).unwrap_err(), Refused::Bytes);
        drop(big);
        assert_eq!(ledger.in_flight(), 0);
        let _small = ledger.try_charge(1).unwrap();
        assert_eq!(ledger.try_charge(1_000).unwrap_err(), Refused::Bytes);
    }

    #[test]
    fn zero_byte_permits_do_not_end_the_lone_exemption() {
        let ledger = ByteLedger::new(100).unwrap();
        let _empty = ledger.try_charge(0).unwrap();
        let _big = ledger.try_charge(1_000).unwrap();
    }

    #[test]
    fn growth_is_checked_and_the_only_charge_may_grow_past_the_budget() {
        let ledger = ByteLedger::new(100).unwrap();
        let mut other = ledger.try_charge(0).unwrap();
        let mut only = ledger.try_charge(10).unwrap();
        only.try_grow(500).unwrap();
        assert_eq!((only.charged(), ledger.in_flight()), (510, 510));
        assert_eq!(other.try_grow(1).unwrap_err(), Refused::Bytes);
        assert_eq!(other.charged(), 0);
        assert_eq!(
            ledger.try_charge(0).unwrap_err(),
            Refused::Bytes,
            "over the budget, nothing new is admitted"
        );
        drop(only);
        other.try_grow(100).unwrap();
        assert_eq!(ledger.in_flight(), 100);
    }

    #[test]
    fn a_permit_that_is_not_the_only_charge_may_not_grow_past_the_budget() {
        let ledger = ByteLedger::new(100).unwrap();
        let _a = ledger.try_charge(10).unwrap();
        let mut b = ledger.try_charge(10).unwrap();
        assert_eq!(b.try_grow(81).unwrap_err(), Refused::Bytes);
        b.try_grow(80).unwrap();
        assert_eq!(ledger.in_flight(), 100);
    }

    #[test]
    fn growth_within_the_budget_beside_other_charges() {
        let ledger = ByteLedger::new(100).unwrap();
        let _a = ledger.try_charge(30).unwrap();
        let mut b = ledger.try_charge(30).unwrap();
        b.try_grow(40).unwrap();
        assert_eq!(b.try_grow(1).unwrap_err(), Refused::Bytes);
        assert_eq!(ledger.in_flight(), 100);
    }

    #[test]
    fn shrink_gives_back_part_of_the_charge_early() {
        let ledger = ByteLedger::new(100).unwrap();
        let mut a = ledger.try_charge(100).unwrap();
        assert_eq!(a.shrink(30), 30);
        assert_eq!(ledger.in_flight(), 70);
        let b = ledger.try_charge(30).unwrap();
        assert_eq!(a.shrink(0), 0);
        assert_eq!(a.shrink(u64::MAX), 70);
        assert_eq!(a.charged(), 0);
        drop((a, b));
        assert_eq!((ledger.in_flight(), ledger.permits()), (0, 0));
    }

    #[test]
    fn max_charge_refuses_too_large_even_when_idle_and_on_growth() {
        let ledger = ByteLedger::new(100).unwrap();
        ledger.set_max_charge(50).unwrap();
        assert_eq!(ledger.try_charge(51).unwrap_err(), Refused::TooLarge);
        let mut p = ledger.try_charge(50).unwrap();
        assert_eq!(p.try_grow(1).unwrap_err(), Refused::TooLarge);
        assert_eq!(p.try_grow(u64::MAX).unwrap_err(), Refused::TooLarge);
        assert_eq!(p.charged(), 50);
        assert_eq!(ledger.snapshot().refused, 3);
        ledger.set_max_charge_unlimited();
        p.try_grow(1).unwrap();
    }

    #[test]
    fn values_the_ledger_cannot_represent_are_errors_not_panics() {
        for v in [u64::MAX, u64::MAX - 1, ByteLedger::MAX_BUDGET + 1] {
            assert_eq!(ByteLedger::new(v).unwrap_err().requested(), v);
        }
        let ledger = ByteLedger::new(0).unwrap();
        assert!(ledger.set_budget(u64::MAX).is_err());
        assert!(ledger.set_max_charge(u64::MAX).is_err());
        assert_eq!(ledger.try_charge(u64::MAX).unwrap_err(), Refused::TooLarge);
        let mut p = ledger.try_charge(ByteLedger::MAX_BUDGET).unwrap();
        assert_eq!(p.try_grow(1).unwrap_err(), Refused::TooLarge);
        assert_eq!(
            ledger.try_charge(1).unwrap_err(),
            Refused::Bytes,
            "word is full"
        );
        drop(p);
        assert_eq!(ledger.in_flight(), 0);
    }

    #[test]
    fn the_maximum_charge_reads_back_as_set_and_zero_when_unset() {
        let ledger = ByteLedger::new(100).unwrap();
        assert_eq!(ledger.max_charge(), 0);
        ledger.set_max_charge(40).unwrap();
        assert_eq!(ledger.max_charge(), 40);
        ledger.set_max_charge_unlimited();
        assert_eq!(ledger.max_charge(), 0);
    }

    #[test]
    #[cfg_attr(miri, ignore = "8 million permits: too many to interpret")]
    fn the_permit_count_is_bounded_and_refuses_rather_than_overflowing() {
        let ledger = ByteLedger::new(0).unwrap();
        assert_eq!(ByteLedger::MAX_PERMITS, (1 << 23) - 1);
        let mut held: Vec<_> = (0..ByteLedger::MAX_PERMITS)
            .map(|_| ledger.try_charge(0).unwrap())
            .collect();
        assert_eq!(ledger.permits(), ByteLedger::MAX_PERMITS);
        assert_eq!(ledger.try_charge(0).unwrap_err(), Refused::Bytes);
        assert_eq!(ledger.try_charge(1).unwrap_err(), Refused::Bytes);
        held.pop();
        let last = ledger.try_charge(5).unwrap();
        assert_eq!(
            (ledger.permits(), ledger.in_flight()),
            (ByteLedger::MAX_PERMITS, 5)
        );
        drop((held, last));
        assert_eq!((ledger.permits(), ledger.in_flight()), (0, 0));
    }

    #[test]
    fn growth_is_checked_at_its_exact_boundaries() {
        let ledger = ByteLedger::new(0).unwrap();
        ledger.set_max_charge(50).unwrap();
        let mut p = ledger.try_charge(40).unwrap();
        p.try_grow(10).unwrap();
        assert_eq!(p.charged(), 50, "growing to exactly the maximum is allowed");
        drop(p);

        ledger.set_max_charge_unlimited();
        let mut alone = ledger.try_charge(0).unwrap();
        alone.try_grow(ByteLedger::MAX_BUDGET).unwrap();
        drop(alone);

        let _other = ledger.try_charge(10).unwrap();
        let mut p = ledger.try_charge(0).unwrap();
        assert_eq!(
            p.try_grow(ByteLedger::MAX_BUDGET - 9).unwrap_err(),
            Refused::Bytes,
            "the word would overflow"
        );
        p.try_grow(ByteLedger::MAX_BUDGET - 10).unwrap();
        assert_eq!(ledger.in_flight(), ByteLedger::MAX_BUDGET);
    }

    #[test]
    fn debug_output_names_the_state() {
        let ledger = ByteLedger::new(9).unwrap();
        let p = ledger.try_charge(4).unwrap();
        assert_eq!(
            format!("{ledger:?}"),
            "ByteLedger { in_flight: 4, budget: 9 }"
        );
        assert_eq!(format!("{p:?}"), "BytePermit { charged: 4 }");
    }

    #[test]
    fn unlimited_budget_admits_everything_representable() {
        let ledger = ByteLedger::new(0).unwrap();
        let held: Vec<_> = (0..100)
            .map(|_| ledger.try_charge(1 << 30).unwrap())
            .collect();
        assert_eq!(ledger.in_flight(), 100 << 30);
        drop(held);
        assert_eq!(ledger.in_flight(), 0);
    }

    #[test]
    fn lowering_the_budget_refuses_new_charges_and_drains() {
        let ledger = ByteLedger::new(100).unwrap();
        let a = ledger.try_charge(50).unwrap();
        let b = ledger.try_charge(50).unwrap();
        ledger.set_budget(60).unwrap();
        drop(a);
        assert!(ledger.try_charge(20).is_err());
        let c = ledger.try_charge(10).unwrap();
        drop((b, c));
        assert_eq!(ledger.in_flight(), 0);
    }

    #[test]
    fn the_last_reference_frees_the_ledger() {
        let before = crate::raw::live::count();
        let ledger = ByteLedger::new(10).unwrap();
        let mut permit = ledger.try_charge(0).unwrap();
        drop(ledger);
        permit.try_grow(5).unwrap();
        permit.shrink(5);
        assert_eq!(
            crate::raw::live::count(),
            before + 1,
            "a zero-byte permit keeps it"
        );
        drop(permit);
        assert_eq!(crate::raw::live::count(), before);
    }

    #[test]
    fn a_permit_outliving_every_handle_releases_safely() {
        let ledger = ByteLedger::new(10).unwrap();
        let mut permit = ledger.try_charge(5).unwrap();
        drop(ledger);
        permit.try_grow(100).unwrap();
        permit.shrink(3);
        drop(permit);
    }
}

#[cfg(all(test, admission_loom))]
mod loom_models {
    use super::*;

    /// Invariant 5: two concurrent oversized charges on an empty ledger, exactly one is
    /// admitted.
    #[test]
    fn concurrent_oversized_charges_on_an_empty_ledger_admit_exactly_one() {
        loom::model(|| {
            let ledger = ByteLedger::new(10).unwrap();
            let other = {
                let ledger = ledger.clone();
                loom::thread::spawn(move || ledger.try_charge(100).ok())
            };
            let mine = ledger.try_charge(100).ok();
            let theirs = other.join().unwrap();
            assert_eq!(mine.is_some() as u8 + theirs.is_some() as u8, 1);
            drop((mine, theirs));
            assert_eq!(ledger.in_flight(), 0);
        });
    }

    /// Growth racing a charge never takes the total past the budget unless one permit is
    /// the only charge; the permits' drops on two threads, after the last handle, free
    /// the ledger once.
    #[test]
    fn growth_racing_a_charge_respects_the_budget_and_frees_once() {
        loom::model(|| {
            let ledger = ByteLedger::new(10).unwrap();
            let mut grower = ledger.try_charge(4).unwrap();
            let other = {
                let ledger = ledger.clone();
                loom::thread::spawn(move || {
                    let p = ledger.try_charge(4);
                    let total = ledger.in_flight();
                    assert!(total <= 10, "in flight {total}");
                    p
                })
            };
            let grew = grower.try_grow(4).is_ok();
            assert!(ledger.in_flight() <= 10);
            let charged = other.join().unwrap();
            // 4 + 4 + 4 > 10: at most one of the grow and the charge succeeds.
            assert!(!(grew && charged.is_ok()));
            drop(ledger);
            let t = loom::thread::spawn(move || drop(charged));
            drop(grower);
            t.join().unwrap();
        });
    }

    /// A growth within the room racing a charge: it takes what room the charge leaves,
    /// never more, and in flight never passes the budget.
    #[test]
    fn bytes_growth_within_the_room_racing_a_charge_stays_within_the_budget() {
        loom::model(|| {
            let ledger = ByteLedger::new(10).unwrap();
            let mut grower = ledger.try_charge(2).unwrap();
            let other = {
                let ledger = ledger.clone();
                loom::thread::spawn(move || ledger.try_charge(5).ok())
            };
            let grew = grower.grow_within(100);
            assert!(ledger.in_flight() <= 10);
            let charged = other.join().unwrap();
            let theirs = charged.as_ref().map_or(0, BytePermit::charged);
            // All the room there was when it grew: 8 before the charge, 3 after it.
            assert!(grew == 8 || grew == 3, "grew {grew}");
            assert_eq!(grower.charged(), 2 + grew);
            assert!(2 + grew + theirs <= 10);
            drop((grower, charged));
            assert_eq!(ledger.in_flight(), 0);
        });
    }

    /// The budget's exact boundary: 40 held, a charge of 30 racing a growth of 30 fills
    /// 100 of 100 exactly (both admitted); a growth of 31 instead would pass it by one
    /// byte (exactly one refused). In flight never exceeds the budget.
    #[test]
    fn bytes_exact_boundary_under_a_concurrent_charge_and_growth() {
        for (grow, both) in [(30, true), (31, false)] {
            loom::model(move || {
                let ledger = ByteLedger::new(100).unwrap();
                let mut grower = ledger.try_charge(40).unwrap();
                let other = {
                    let ledger = ledger.clone();
                    loom::thread::spawn(move || {
                        let p = ledger.try_charge(30).ok();
                        assert!(ledger.in_flight() <= 100);
                        p
                    })
                };
                let grew = grower.try_grow(grow).is_ok();
                assert!(ledger.in_flight() <= 100);
                let charged = other.join().unwrap();
                if both {
                    assert!(grew && charged.is_some(), "refused at exactly the budget");
                } else {
                    assert_eq!(grew as u8 + charged.is_some() as u8, 1);
                }
                drop((grower, charged));
                assert_eq!(ledger.in_flight(), 0);
            });
        }
    }

    /// `shrink` racing a charge: the charge is admitted only against what the ledger
    /// holds when it looks (60 held and 50 asked of 100: refused before the shrink of 30,
    /// admitted after it), and every byte comes back exactly once.
    #[test]
    fn bytes_shrink_racing_a_charge_gives_back_exactly_what_it_says() {
        loom::model(|| {
            let ledger = ByteLedger::new(100).unwrap();
            let mut held = ledger.try_charge(60).unwrap();
            let shrinker = loom::thread::spawn(move || {
                assert_eq!(held.shrink(30), 30);
                held
            });
            let charged = ledger.try_charge(50).ok();
            assert!(ledger.in_flight() <= 100);
            let held = shrinker.join().unwrap();
            let expected = 30 + charged.as_ref().map_or(0, BytePermit::charged);
            assert_eq!(ledger.in_flight(), expected);
            drop((held, charged));
            assert_eq!((ledger.in_flight(), ledger.permits()), (0, 0));
        });
    }

    /// `shrink` racing a growth of another permit: the growth sees either level, never a
    /// torn one, and both permits release exactly what they hold.
    #[test]
    fn bytes_shrink_racing_a_growth() {
        loom::model(|| {
            let ledger = ByteLedger::new(100).unwrap();
            let mut shrinking = ledger.try_charge(60).unwrap();
            let mut growing = ledger.try_charge(30).unwrap();
            let shrinker = loom::thread::spawn(move || {
                shrinking.shrink(20);
                shrinking
            });
            let grew = growing.try_grow(20).is_ok();
            let shrinking = shrinker.join().unwrap();
            assert_eq!(ledger.in_flight(), 40 + 30 + if grew { 20 } else { 0 });
            assert!(ledger.in_flight() <= 100);
            drop((shrinking, growing));
            assert_eq!(ledger.in_flight(), 0);
        });
    }

    /// `set_budget` and `set_max_charge` racing a charge: the charge sees the old or the
    /// new limits, and once the setter is done, nothing new gets through above them;
    /// what is held stays held.
    #[test]
    fn bytes_set_budget_and_set_max_charge_racing_a_charge() {
        loom::model(|| {
            let ledger = ByteLedger::new(100).unwrap();
            let held = ledger.try_charge(10).unwrap();
            let setter = {
                let ledger = ledger.clone();
                loom::thread::spawn(move || {
                    ledger.set_budget(50).unwrap();
                    ledger.set_max_charge(20).unwrap();
                })
            };
            let racing = ledger.try_charge(45);
            setter.join().unwrap();
            // Old limits: admitted (55 of 100). New budget: refused (55 of 50). New
            // maximum: too large (45 above 20).
            match &racing {
                Ok(p) => assert_eq!(p.charged(), 45),
                Err(refused) => assert!(matches!(refused, Refused::Bytes | Refused::TooLarge)),
            }
            assert_eq!(ledger.try_charge(21).unwrap_err(), Refused::TooLarge);
            if racing.is_ok() {
                assert_eq!(
                    ledger.try_charge(1).unwrap_err(),
                    Refused::Bytes,
                    "55 of 50"
                );
            } else {
                assert_eq!(ledger.try_charge(20).map(|p| p.charged()), Ok(20));
                assert_eq!(ledger.try_charge(31).unwrap_err(), Refused::TooLarge);
            }
            assert_eq!(held.charged(), 10, "a lowered limit revokes nothing");
            drop((held, racing));
            assert_eq!(ledger.in_flight(), 0);
        });
    }
}
