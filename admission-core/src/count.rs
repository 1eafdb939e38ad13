//! The count ledger: at most `capacity` permits in flight.
//!
//! # Design
//!
//! One 64-bit word holds the number of permits in flight below bit 63 and, in bit 63,
//! the presence of the ledger's handles (see `raw`). Acquiring is a bounded
//! compare-exchange loop on that word; releasing is one atomic subtraction. The word is
//! also the allocation's reference count, so a permit is one pointer and costs no
//! reference-count traffic of its own.
//!
//! Why a compare-exchange loop rather than an optimistic add with roll-back: the add
//! never retries, but near the limit it makes the word overshoot for a moment, so a
//! concurrent acquirer can be refused although the limit was never really reached
//! (a spurious 503), and a snapshot can read more than the capacity. The loop retries
//! only when another thread changed the word between the load and the exchange, and
//! never refuses spuriously. The benches (`admission-bench`, group `count`) measure both.

use std::fmt;
use std::ptr::NonNull;

use crossbeam_utils::CachePadded;

use crate::limit;
use crate::raw::{self, Counted, Owner, OWNER};
use crate::stats::{Snapshot, Stats};
use crate::sync::{Arc, AtomicU64, Ordering, Track};
use crate::{CapacityError, Refused};

/// A limit on how many permits are in flight at once.
///
/// Cloning the ledger gives another handle to the same limit. Permits are `'static`: a
/// permit keeps the ledger's state alive by itself, so handles may be dropped while
/// permits are still held. A capacity of 0 means unlimited: the ledger still counts
/// (so [`snapshot`](Self::snapshot) works) but never refuses.
///
/// What it bounds: the number of permits. It does not bound what each permit's holder
/// does (bytes buffered, time taken); pair it with a [`ByteLedger`](crate::ByteLedger)
/// for memory.
///
/// # Examples
///
/// ```
/// use admission_core::{CountLedger, Refused};
///
/// let ledger = CountLedger::new(2)?;
/// let a = ledger.try_acquire()?;
/// let b = ledger.try_acquire()?;
/// assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Count);
///
/// drop(a);
/// let c = ledger.try_acquire()?;
/// assert_eq!(ledger.in_flight(), 2);
/// drop((b, c));
/// assert_eq!(ledger.in_flight(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Cost, and the choice behind it
///
/// Acquiring is one compare-exchange on the ledger's word, releasing one atomic
/// subtraction: no lock, no allocation, and no reference-count traffic, because the
/// ledger's admission word is also its allocation's reference count (a permit is one
/// pointer). Measured with criterion on a 2-core x86_64 machine, acquire + release of an
/// owned permit costs the same as a bare compare-exchange loop on a padded atomic (the
/// floor: 1.01x), against 2.0x for the same loop plus an `Arc` clone per permit and 3.0x
/// for `tokio::sync::Semaphore::try_acquire_owned` (see `admission-bench`).
///
/// The trade-off: a compare-exchange loop retries when another thread changed the word
/// between its load and its exchange, where an optimistic add-then-roll-back never
/// retries. In the same run the optimistic add was 5% faster uncontended and about 10%
/// faster with two threads on one ledger, but near the limit it makes the word overshoot
/// for a moment, so a concurrent acquirer can be refused although the limit was never
/// reached (a spurious 503), and snapshots can read more than the capacity. A spurious
/// refusal under load is exactly when it hurts, so this ledger retries.
///
/// # Memory ordering
///
/// Admission itself is a counter: an acquisition synchronises with nothing, and the
/// ledger makes no promise about the order of work done under different permits. (The
/// release decrement and the final free are ordered: every release is a `Release`
/// decrement and the one that frees makes an `Acquire` load of the word first, as `Arc`
/// does under ThreadSanitizer; weakening either fails the loom models and Miri.)
#[derive(Clone)]
pub struct CountLedger {
    owner: Arc<Owner<CountInner>>,
}

struct CountInner {
    /// The admission word and the capacity it is checked against, read together on
    /// every acquire, share a cache line. The statistics, written on the cold path, are
    /// on another line so a refusal storm does not slow admissions. (128-byte padding as
    /// `crossbeam_utils::CachePadded` chooses for x86_64 and aarch64: adjacent-line
    /// prefetch pairs lines.)
    hot: CachePadded<Hot>,
    stats: CachePadded<Stats>,
    track: Track,
}

struct Hot {
    /// `OWNER` | permits in flight.
    state: AtomicU64,
    capacity: AtomicU64,
}

impl Counted for CountInner {
    fn word(&self) -> &AtomicU64 {
        &self.hot.state
    }

    fn track(&self) -> &Track {
        &self.track
    }
}

impl CountLedger {
    /// The largest capacity a count ledger accepts.
    pub const MAX_CAPACITY: usize = usize::MAX >> 2;

    /// A ledger admitting at most `capacity` permits at once; 0 means unlimited.
    ///
    /// # Errors
    ///
    /// [`CapacityError`] if `capacity` is above [`MAX_CAPACITY`](Self::MAX_CAPACITY).
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(8)?;
    /// assert_eq!(ledger.capacity(), 8);
    /// assert!(CountLedger::new(usize::MAX).is_err());
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn new(capacity: usize) -> Result<Self, CapacityError> {
        let capacity = Self::encode(capacity)?;
        let inner = CountInner {
            hot: CachePadded::new(Hot {
                state: AtomicU64::new(OWNER),
                capacity: AtomicU64::new(capacity),
            }),
            stats: CachePadded::new(Stats::new()),
            track: Track::new(),
        };
        Ok(Self {
            owner: Arc::new(Owner::new(inner)),
        })
    }

    fn encode(capacity: usize) -> Result<u64, CapacityError> {
        limit::encode(capacity as u64, Self::MAX_CAPACITY as u64)
    }

    #[inline]
    fn inner(&self) -> &CountInner {
        self.owner.get()
    }

    /// Takes one permit if fewer than `capacity` are in flight, else refuses at once.
    ///
    /// Never blocks, never allocates, takes no lock.
    ///
    /// # Errors
    ///
    /// [`Refused::Count`] when the ledger is at (or above a lowered) capacity.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(1)?;
    /// let permit = ledger.try_acquire()?;
    /// assert!(ledger.try_acquire().is_err());
    /// drop(permit);
    /// assert!(ledger.try_acquire().is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire(&self) -> Result<CountPermit, Refused> {
        let (permit, level) = self.try_acquire_unobserved()?;
        self.inner().stats.observe(level);
        Ok(permit)
    }

    /// `try_acquire` without recording the high-water mark: the permit and the level it
    /// brought the ledger to, for a caller (the gate) that records it only once every
    /// other dimension has admitted too. A refusal is counted here.
    #[inline]
    pub(crate) fn try_acquire_unobserved(&self) -> Result<(CountPermit, u64), Refused> {
        let inner = self.inner();
        // Relaxed: the capacity is a plain setting; an acquisition racing `set_capacity`
        // may see either value, which is the documented "next acquisition" semantics.
        let capacity = inner.hot.capacity.load(Ordering::Relaxed);
        let mut current = inner.hot.state.load(Ordering::Relaxed);
        loop {
            let held = current & !OWNER;
            if held >= capacity {
                inner.stats.refuse();
                return Err(Refused::Count);
            }
            // Relaxed on success: admission orders no other memory, and the new permit's
            // share of the reference count is made through our live handle, so no
            // ordering is needed for the lifetime protocol either (see `raw`). `held` is
            // below `MAX_CAPACITY`, so `+ 1` cannot reach `OWNER`.
            match inner.hot.state.compare_exchange_weak(
                current,
                current + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    let permit = CountPermit {
                        inner: self.owner.ptr(),
                    };
                    return Ok((permit, held + 1));
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Whether an acquisition would be admitted now, by one load and no write; a "no"
    /// is counted as a refusal. The gate asks this of every dimension before it takes
    /// anything, so a request that one dimension refuses holds nothing in another even
    /// for a moment (no collateral refusals of other requests).
    #[inline]
    pub(crate) fn check(&self) -> Result<(), Refused> {
        let hot = &*self.inner().hot;
        // Relaxed: advisory; the compare-exchange that follows decides.
        let held = hot.state.load(Ordering::Relaxed) & !OWNER;
        if held >= hot.capacity.load(Ordering::Relaxed) {
            self.inner().stats.refuse();
            return Err(Refused::Count);
        }
        Ok(())
    }

    /// Records a level an unobserved acquisition reached (see `try_acquire_unobserved`).
    #[inline]
    pub(crate) fn observe(&self, level: u64) {
        self.inner().stats.observe(level);
    }

    /// Permits in flight now.
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(4)?;
    /// let _p = ledger.try_acquire()?;
    /// assert_eq!(ledger.in_flight(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_flight(&self) -> u64 {
        self.inner().hot.state.load(Ordering::Relaxed) & !OWNER
    }

    /// The capacity in force; 0 means unlimited.
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// assert_eq!(CountLedger::new(0)?.capacity(), 0);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn capacity(&self) -> u64 {
        limit::decode(self.inner().hot.capacity.load(Ordering::Relaxed))
    }

    /// Changes the capacity for the next acquisition; 0 means unlimited.
    ///
    /// Lowering the capacity below the number in flight refuses new permits until enough
    /// held ones are released; it never revokes a held permit.
    ///
    /// # Errors
    ///
    /// [`CapacityError`] if `capacity` is above [`MAX_CAPACITY`](Self::MAX_CAPACITY); the
    /// capacity in force is then unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(2)?;
    /// let a = ledger.try_acquire()?;
    /// let b = ledger.try_acquire()?;
    /// ledger.set_capacity(1)?;
    /// drop(a);
    /// assert!(ledger.try_acquire().is_err(), "one still held, capacity now one");
    /// drop(b);
    /// assert!(ledger.try_acquire().is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_capacity(&self, capacity: usize) -> Result<(), CapacityError> {
        let capacity = Self::encode(capacity)?;
        self.inner().hot.capacity.store(capacity, Ordering::Relaxed);
        Ok(())
    }

    /// A cheap reading of in-flight, capacity, high-water mark and refusals.
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(3)?;
    /// let _p = ledger.try_acquire()?;
    /// assert_eq!(ledger.snapshot().high_water, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot(&self) -> Snapshot {
        let inner = self.inner();
        Snapshot {
            in_flight: self.in_flight(),
            capacity: self.capacity(),
            high_water: inner.stats.high_water(),
            refused: inner.stats.refused(),
        }
    }
}

impl fmt::Debug for CountLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountLedger")
            .field("in_flight", &self.in_flight())
            .field("capacity", &self.capacity())
            .finish()
    }
}

/// One unit of a [`CountLedger`]'s capacity, released when dropped.
///
/// The permit is one pointer wide, `'static`, and may be sent to and dropped on any
/// thread, also after every handle of its ledger is gone.
///
/// ```
/// use admission_core::CountLedger;
///
/// let ledger = CountLedger::new(1)?;
/// let permit = ledger.try_acquire()?;
/// std::thread::spawn(move || drop(permit)).join().unwrap();
/// assert_eq!(ledger.in_flight(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "the permit is released as soon as it is dropped"]
pub struct CountPermit {
    inner: NonNull<CountInner>,
}

impl CountPermit {
    /// Gives the permit's unit back to its ledger. Called only from `Drop`, so it runs
    /// exactly once.
    fn release(&mut self) {
        // SAFETY: this permit added 1 to the word when it was made and gives it up here,
        // once (only `Drop` calls this); it never touches `inner` again.
        unsafe { raw::put(self.inner, 1) }
    }
}

impl Drop for CountPermit {
    fn drop(&mut self) {
        self.release();
    }
}

impl fmt::Debug for CountPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountPermit").finish_non_exhaustive()
    }
}

// SAFETY: the permit refers to a `CountInner`, which is all atomics (`Send + Sync`), and
// its only operation, the release in `Drop`, is an atomic decrement that is correct on
// any thread.
unsafe impl Send for CountPermit {}
// SAFETY: `&CountPermit` offers no operation at all.
unsafe impl Sync for CountPermit {}

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use super::*;

    /// The last permit and the last handle dropped on two threads at once, with no join
    /// between them: whichever drop is last frees the ledger, and every use by the other
    /// thread must happen before that free. Under Miri, weakening the release decrement
    /// or the acquire load on the free path makes this a reported data race.
    #[test]
    fn the_last_permit_and_the_last_handle_dropped_on_two_threads_free_after_every_use() {
        for _ in 0..if cfg!(miri) { 8 } else { 1_000 } {
            let ledger = CountLedger::new(2).unwrap();
            let permit = ledger.try_acquire().unwrap();
            let t = std::thread::spawn(move || drop(permit));
            drop(ledger);
            t.join().unwrap();
        }
    }

    #[test]
    fn bounds() {
        fn is_send_sync_unpin<T: Send + Sync + Unpin + 'static>() {}
        is_send_sync_unpin::<CountLedger>();
        is_send_sync_unpin::<CountPermit>();
        assert_eq!(
            std::mem::size_of::<CountPermit>(),
            std::mem::size_of::<usize>()
        );
    }

    #[test]
    fn acquire_refuse_release_admit_again_and_back_to_zero() {
        let ledger = CountLedger::new(2).unwrap();
        let a = ledger.try_acquire().unwrap();
        let b = ledger.try_acquire().unwrap();
        assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Count);
        assert_eq!(ledger.in_flight(), 2);
        drop(a);
        assert_eq!(ledger.in_flight(), 1);
        let c = ledger.try_acquire().unwrap();
        drop(b);
        drop(c);
        assert_eq!(ledger.in_flight(), 0);
        assert_eq!(ledger.snapshot().refused, 1);
        assert_eq!(ledger.snapshot().high_water, 2);
    }

    #[test]
    fn zero_capacity_means_unlimited_but_still_counted() {
        let ledger = CountLedger::new(0).unwrap();
        let permits: Vec<_> = (0..1000).map(|_| ledger.try_acquire().unwrap()).collect();
        assert_eq!(ledger.in_flight(), 1000);
        assert_eq!(ledger.capacity(), 0);
        drop(permits);
        assert_eq!(ledger.in_flight(), 0);
    }

    #[test]
    fn capacities_the_ledger_cannot_represent_are_errors_not_panics() {
        for capacity in [usize::MAX, usize::MAX - 1, CountLedger::MAX_CAPACITY + 1] {
            let err = CountLedger::new(capacity).unwrap_err();
            assert_eq!(err.requested(), capacity as u64);
        }
        let ledger = CountLedger::new(CountLedger::MAX_CAPACITY).unwrap();
        assert!(ledger.set_capacity(usize::MAX).is_err());
        assert_eq!(ledger.capacity(), CountLedger::MAX_CAPACITY as u64);
        let _p = ledger.try_acquire().unwrap();
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_capacity_reaching_the_reference_bit_cannot_be_represented() {
        assert!(CountLedger::new(usize::MAX >> 1).is_err());
        assert!(CountLedger::new(1 << 62).is_err());
        assert!(CountLedger::new((1 << 62) - 1).is_ok());
    }

    #[test]
    fn debug_output_names_the_state() {
        let ledger = CountLedger::new(3).unwrap();
        let p = ledger.try_acquire().unwrap();
        assert_eq!(
            format!("{ledger:?}"),
            "CountLedger { in_flight: 1, capacity: 3 }"
        );
        assert_eq!(format!("{p:?}"), "CountPermit { .. }");
    }

    #[test]
    fn lowering_capacity_refuses_new_work_and_lets_held_permits_drain() {
        let ledger = CountLedger::new(3).unwrap();
        let held: Vec<_> = (0..3).map(|_| ledger.try_acquire().unwrap()).collect();
        ledger.set_capacity(1).unwrap();
        let mut held = held.into_iter();
        drop(held.next());
        assert!(ledger.try_acquire().is_err(), "2 held, capacity 1");
        drop(held.next());
        assert!(ledger.try_acquire().is_err(), "1 held, capacity 1");
        drop(held.next());
        let p = ledger.try_acquire().unwrap();
        assert!(ledger.try_acquire().is_err());
        drop(p);
        assert_eq!(ledger.in_flight(), 0);
    }

    #[test]
    fn raising_capacity_admits_more_at_once() {
        let ledger = CountLedger::new(1).unwrap();
        let _a = ledger.try_acquire().unwrap();
        assert!(ledger.try_acquire().is_err());
        ledger.set_capacity(2).unwrap();
        let _b = ledger.try_acquire().unwrap();
    }

    #[test]
    fn the_last_reference_frees_the_ledger_whichever_it_is() {
        let before = crate::raw::live::count();
        let ledger = CountLedger::new(1).unwrap();
        let permit = ledger.try_acquire().unwrap();
        assert_eq!(crate::raw::live::count(), before + 1);
        drop(ledger);
        assert_eq!(crate::raw::live::count(), before + 1, "the permit keeps it");
        drop(permit);
        assert_eq!(crate::raw::live::count(), before, "the permit was the last");

        let ledger = CountLedger::new(1).unwrap();
        drop(ledger.try_acquire().unwrap());
        assert_eq!(crate::raw::live::count(), before + 1, "the handle keeps it");
        drop(ledger);
        assert_eq!(crate::raw::live::count(), before, "the handle was the last");
    }

    #[test]
    fn a_permit_outliving_every_handle_releases_safely() {
        let ledger = CountLedger::new(1).unwrap();
        let clone = ledger.clone();
        let permit = ledger.try_acquire().unwrap();
        drop(ledger);
        assert_eq!(clone.in_flight(), 1);
        drop(clone);
        drop(permit);
    }

    #[test]
    fn clones_share_one_limit() {
        let ledger = CountLedger::new(1).unwrap();
        let clone = ledger.clone();
        let _p = ledger.try_acquire().unwrap();
        assert_eq!(clone.try_acquire().unwrap_err(), Refused::Count);
    }

    #[test]
    fn concurrent_threads_never_exceed_the_capacity() {
        let ledger = CountLedger::new(3).unwrap();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..if cfg!(miri) { 50 } else { 20_000 } {
                        if let Ok(p) = ledger.try_acquire() {
                            assert!(ledger.in_flight() <= 3);
                            drop(p);
                        }
                    }
                });
            }
        });
        assert_eq!(ledger.in_flight(), 0);
        assert!(ledger.snapshot().high_water <= 3);
    }
}

#[cfg(all(test, admission_loom))]
mod loom_models {
    use super::*;

    /// Three threads contend for two permits: never more than two held, zero at the end,
    /// and the ledger is freed (loom fails the model on a leak).
    #[test]
    fn count_acquire_release_never_exceeds_capacity() {
        const CAPACITY: usize = 2;
        loom::model(|| {
            let ledger = CountLedger::new(CAPACITY).unwrap();
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let ledger = ledger.clone();
                    loom::thread::spawn(move || {
                        let permit = ledger.try_acquire();
                        assert!(ledger.in_flight() <= CAPACITY as u64);
                        drop(permit);
                    })
                })
                .collect();
            let main = ledger.try_acquire();
            assert!(ledger.in_flight() <= CAPACITY as u64);
            drop(main);
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(ledger.in_flight(), 0);
        });
    }

    /// A permit dropped on another thread after the last handle frees the ledger once.
    #[test]
    fn count_permit_dropped_after_last_handle_frees_once() {
        loom::model(|| {
            let ledger = CountLedger::new(2).unwrap();
            let a = ledger.try_acquire().unwrap();
            let b = ledger.try_acquire().unwrap();
            let t = loom::thread::spawn(move || drop(a));
            drop(ledger);
            drop(b);
            t.join().unwrap();
        });
    }

    /// `set_capacity` racing an acquisition: the new permit never makes the count exceed
    /// the larger of the two capacities, and a held permit is never revoked.
    #[test]
    fn set_capacity_racing_acquisitions() {
        loom::model(|| {
            let ledger = CountLedger::new(2).unwrap();
            let held = ledger.try_acquire().unwrap();
            let setter = {
                let ledger = ledger.clone();
                loom::thread::spawn(move || ledger.set_capacity(1).unwrap())
            };
            let second = ledger.try_acquire();
            setter.join().unwrap();
            // Once the lowering is visible, `held` alone fills capacity 1.
            assert!(ledger.try_acquire().is_err());
            assert!(ledger.in_flight() <= 2);
            drop(second);
            drop(held);
            assert_eq!(ledger.in_flight(), 0);
            assert!(ledger.try_acquire().is_ok());
        });
    }
}
