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
use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll, Waker};

use crossbeam_utils::CachePadded;

use std::time::{Duration, Instant};

use crate::adaptive::{Control, Driver, Outcome, Steered};
use crate::limit::{self, UNLIMITED};
use crate::priority::{Priority, MAX_CLASSES};
use crate::raw::{self, Counted, Owner, OWNER};
use crate::stats::{Snapshot, Stats};
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering, Track};
use crate::{CapacityError, Refused};

/// Set in the word while a [`Drain`] waits for the last permit. A share of the count in
/// its own right (see "Waiting for the last permit" on [`CountLedger::drain`]), and above
/// every threshold, so nothing is admitted while it is set.
const WATCH: u64 = 1 << 62;
/// The permits-in-flight field of the word.
const HELD: u64 = WATCH - 1;

/// A limit on how many permits are in flight at once.
///
/// Cloning the ledger gives another handle to the same limit. Permits are `'static`: a
/// permit keeps the ledger's state alive by itself, so handles may be dropped while
/// permits are still held. A capacity of 0 given to [`new`](Self::new) means unlimited:
/// the ledger still counts (so [`snapshot`](Self::snapshot) and [`drain`](Self::drain)
/// work) but never refuses unless closed.
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
/// # Run-time control
///
/// [`set_capacity`](Self::set_capacity) changes the limit for the next acquisition (and
/// refuses 0, which in configuration means unlimited: removing the limit is
/// [`set_unlimited`](Self::set_unlimited), written out). [`close`](Self::close) refuses
/// everything new with [`Refused::Closed`] until [`reopen`](Self::reopen), whatever the
/// capacity is set to meanwhile: a close by an operator or at shutdown is never undone by
/// a later limit change. [`drain`](Self::drain) closes and waits for the last permit.
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
/// does under ThreadSanitizer; weakening either fails the loom models and Miri.) A
/// [`Drain`] that resolves because nothing is in flight has made an `Acquire` read of
/// the last release: everything done under every permit happens before it returns.
#[derive(Clone)]
pub struct CountLedger {
    owner: Arc<Owner<CountInner>>,
}

struct CountInner {
    /// The admission word and the threshold it is checked against, read together on
    /// every acquire, share a cache line. The rest, written on cold paths, is on another
    /// line so a refusal storm does not slow admissions. (128-byte padding as
    /// `crossbeam_utils::CachePadded` chooses for x86_64 and aarch64: adjacent-line
    /// prefetch pairs lines.)
    hot: CachePadded<Hot>,
    cold: CachePadded<Cold>,
    track: Track,
}

struct Hot {
    /// `OWNER` | `WATCH` | permits in flight.
    state: AtomicU64,
    /// What an acquisition compares the permits in flight against: the capacity, 0 while
    /// closed, `HELD` (a count no acquisition reaches) for unlimited. Written only
    /// under `Cold::control`, from the capacity and the closed flag together, so a
    /// capacity change cannot undo a close.
    threshold: AtomicU64,
}

struct Cold {
    stats: Stats,
    /// Refusals of class-aware acquisitions, by class index.
    refused_by_class: [AtomicU64; MAX_CLASSES],
    /// The configured capacity in its stored form (`UNLIMITED` for none).
    capacity: AtomicU64,
    closed: AtomicBool,
    /// An [`AdaptiveLimit`](crate::AdaptiveLimit) drives the capacity.
    driven: AtomicBool,
    /// An operator set the capacity by hand while it was driven: the controller's
    /// changes are ignored until the limit is handed back.
    fixed: AtomicBool,
    /// The samples and the controller of an adaptive limit, from the first one on.
    driver: std::sync::OnceLock<Driver>,
    /// Serialises every change of the threshold, and holds the drains waiting.
    control: Mutex<Waiters>,
}

/// The drains waiting for the last permit, each under the id it registered with.
#[derive(Default)]
struct Waiters {
    list: Vec<(u64, Waker)>,
    next_id: u64,
}

impl Counted for CountInner {
    fn word(&self) -> &AtomicU64 {
        &self.hot.state
    }

    fn track(&self) -> &Track {
        &self.track
    }
}

impl CountInner {
    /// Recomputes the threshold from the capacity and the closed flag. Called with
    /// `cold.control` held.
    fn store_threshold(&self) {
        let threshold = match (self.cold.closed.load(Ordering::Relaxed), self.capacity()) {
            (true, _) => 0,
            (false, UNLIMITED) => HELD,
            (false, capacity) => capacity,
        };
        // Relaxed: a plain setting, read by acquisitions as "the next acquisition" sees it.
        self.hot.threshold.store(threshold, Ordering::Relaxed);
    }

    fn capacity(&self) -> u64 {
        self.cold.capacity.load(Ordering::Relaxed)
    }

    /// What an acquisition of `priority`'s class (the whole threshold for none) compares
    /// the permits in flight against, from one read of the threshold word.
    #[inline(always)]
    fn threshold(&self, priority: Option<Priority>) -> u64 {
        // Relaxed: a plain setting (see `acquire`).
        let threshold = self.hot.threshold.load(Ordering::Relaxed);
        match priority {
            Some(priority) => priority.of(threshold),
            None => threshold,
        }
    }

    /// The refusal of an acquisition the threshold turned away: closed, or full.
    #[cold]
    fn refuse(&self, priority: Option<Priority>) -> Refused {
        self.cold.stats.refuse();
        if let Some(class) = priority.and_then(|p| self.cold.refused_by_class.get(p.index())) {
            // Relaxed: a statistic.
            class.fetch_add(1, Ordering::Relaxed);
        }
        if self.cold.closed.load(Ordering::Relaxed) {
            Refused::Closed
        } else {
            Refused::Count
        }
    }

    /// Takes `WATCH` out of the word if permits are still in flight: the last drain stopped
    /// waiting before the last release. With none in flight, `WATCH` belongs to the
    /// release that took the count to zero (see [`CountPermit::release`]) and is left to
    /// it. Called with `cold.control` held.
    fn unwatch(&self) {
        let state = &self.hot.state;
        let mut current = state.load(Ordering::Relaxed);
        // Relaxed: the bit is a share of the count, but the word stays above zero with
        // or without it (permits are in flight), so nothing is ordered for the lifetime
        // protocol; who may take it is decided under the control lock.
        while current & WATCH != 0 && current & HELD != 0 {
            match state.compare_exchange_weak(
                current,
                current & !WATCH,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
    }

    /// The rest of the release that took the count from one to zero while `WATCH` was
    /// set: wakes every drain, then gives `WATCH` back.
    ///
    /// # Safety
    ///
    /// `ptr` is a live `CountInner` whose word held `WATCH` when the caller's own release
    /// took the count to zero. That `WATCH` is then the caller's to give up: nothing can
    /// acquire while it is set, and drains and `reopen` take it only while permits are
    /// in flight. The caller does not use `ptr` afterwards.
    #[cold]
    #[inline(never)]
    unsafe fn last_out(ptr: NonNull<CountInner>) {
        let waiters = {
            // SAFETY: the `WATCH` share keeps the cell alive until the `put` below.
            let inner = unsafe { ptr.as_ref() };
            let mut control = inner.cold.control.lock();
            std::mem::take(&mut control.list)
        };
        // SAFETY: the `WATCH` share, given up once, after the lock guard is gone.
        unsafe { raw::put(ptr, WATCH) };
        // The wakers were moved out: waking touches nothing of the ledger's.
        for (_, waker) in waiters {
            waker.wake();
        }
    }
}

impl CountInner {
    #[inline]
    fn record_at(&self, now: Instant, latency: Duration, outcome: Outcome) {
        if let Some(driver) = self.cold.driver.get() {
            driver.record(self, now, latency, outcome);
        }
    }
}

impl Steered for CountInner {
    fn in_flight(&self) -> u64 {
        // Relaxed: a statistic.
        self.hot.state.load(Ordering::Relaxed) & HELD
    }

    fn capacity(&self) -> u64 {
        limit::decode(CountInner::capacity(self))
    }

    fn is_fixed(&self) -> bool {
        // Relaxed: a setting.
        self.cold.fixed.load(Ordering::Relaxed)
    }

    /// The controller's setting: applied unless an operator fixed the capacity by hand.
    /// A close (or drain) stays in force either way.
    fn steer(&self, capacity: u64) {
        let _control = self.cold.control.lock();
        // Relaxed: read and written only under `control`.
        if !self.cold.fixed.load(Ordering::Relaxed) {
            self.cold.capacity.store(capacity, Ordering::Relaxed);
            self.store_threshold();
        }
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
        let capacity = limit::encode(capacity as u64, Self::MAX_CAPACITY as u64)?;
        let inner = CountInner {
            hot: CachePadded::new(Hot {
                state: AtomicU64::new(OWNER),
                threshold: AtomicU64::new(0),
            }),
            cold: CachePadded::new(Cold {
                stats: Stats::new(),
                refused_by_class: std::array::from_fn(|_| AtomicU64::new(0)),
                capacity: AtomicU64::new(capacity),
                closed: AtomicBool::new(false),
                driven: AtomicBool::new(false),
                fixed: AtomicBool::new(false),
                driver: std::sync::OnceLock::new(),
                control: Mutex::new(Waiters::default()),
            }),
            track: Track::new(),
        };
        inner.store_threshold();
        Ok(Self {
            owner: Arc::new(Owner::new(inner)),
        })
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
    /// [`Refused::Count`] when the ledger is at (or above a lowered) capacity;
    /// [`Refused::Closed`] while it is closed.
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
        let (permit, level) = self.acquire(None)?;
        self.inner().cold.stats.observe(level);
        Ok(permit)
    }

    /// Takes one permit if fewer than `priority`'s share of the capacity are in flight
    /// (of every class together), else refuses at once: the least important work is shed
    /// first (see [`Priority`] and [`Classes`](crate::Classes)).
    ///
    /// Costs what [`try_acquire`](Self::try_acquire) costs: the same compare-exchange,
    /// against a threshold computed from the one the ledger holds (so a capacity change
    /// moves every class's threshold at once, never some before others).
    ///
    /// # Errors
    ///
    /// [`Refused::Count`] when the class's share is in flight, [`Refused::Closed`] while
    /// the ledger is closed. Either is also counted in
    /// [`refused_by_class`](Self::refused_by_class).
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::{CountLedger, Priority, Refused};
    ///
    /// let ledger = CountLedger::new(10)?;
    /// let sheddable: Vec<_> = (0..7).map(|_| ledger.try_acquire_as(Priority::SHEDDABLE)).collect::<Result<_, _>>()?;
    /// assert_eq!(ledger.try_acquire_as(Priority::SHEDDABLE).unwrap_err(), Refused::Count);
    /// let critical: Vec<_> = (0..3).map(|_| ledger.try_acquire_as(Priority::CRITICAL)).collect::<Result<_, _>>()?;
    /// assert_eq!(ledger.in_flight(), 10);
    /// # drop((sheddable, critical));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_as(&self, priority: Priority) -> Result<CountPermit, Refused> {
        let (permit, level) = self.acquire(Some(priority))?;
        self.inner().cold.stats.observe(level);
        Ok(permit)
    }

    /// `try_acquire` without recording the high-water mark: the permit and the level it
    /// brought the ledger to, for a caller (the gate) that records it only once every
    /// other dimension has admitted too. A refusal is counted here.
    #[inline]
    pub(crate) fn try_acquire_unobserved(
        &self,
        priority: Option<Priority>,
    ) -> Result<(CountPermit, u64), Refused> {
        self.acquire(priority)
    }

    /// The acquisition, for a class (its share of the threshold) or for none (the whole
    /// threshold). Always inlined, so that the plain path, whose `priority` is a constant
    /// `None`, compiles to exactly the compare against the threshold.
    #[inline(always)]
    fn acquire(&self, priority: Option<Priority>) -> Result<(CountPermit, u64), Refused> {
        let inner = self.inner();
        // Relaxed: the threshold is a plain setting; an acquisition racing a change may
        // see either value, which is the documented "next acquisition" semantics. A
        // class's threshold is derived from this one read, so it is the old or the new
        // setting's, never a mix.
        let threshold = inner.threshold(priority);
        let mut current = inner.hot.state.load(Ordering::Relaxed);
        loop {
            // `WATCH`, when set, is above every threshold: nothing is admitted.
            let held = current & !OWNER;
            if held >= threshold {
                return Err(inner.refuse(priority));
            }
            // Relaxed on success: admission orders no other memory, and the new permit's
            // share of the reference count is made through our live handle, so no
            // ordering is needed for the lifetime protocol either (see `raw`). `held` is
            // below the threshold, itself at most `HELD`, so `+ 1` stays in its field.
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

    /// Whether an acquisition (of `priority`'s class, if given) would be admitted now, by
    /// one load and no write; a "no" is counted as a refusal. The gate asks this of every
    /// dimension before it takes anything, so a request that one dimension refuses holds
    /// nothing in another even for a moment (no collateral refusals).
    #[inline]
    pub(crate) fn check(&self, priority: Option<Priority>) -> Result<(), Refused> {
        let inner = self.inner();
        // Relaxed: advisory; the compare-exchange that follows decides.
        let held = inner.hot.state.load(Ordering::Relaxed) & !OWNER;
        if held >= inner.threshold(priority) {
            return Err(inner.refuse(priority));
        }
        Ok(())
    }

    /// Records a level an unobserved acquisition reached (see `try_acquire_unobserved`).
    #[inline]
    pub(crate) fn observe(&self, level: u64) {
        self.inner().cold.stats.observe(level);
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
        self.inner().hot.state.load(Ordering::Relaxed) & HELD
    }

    /// The configured capacity; 0 means unlimited. (A closed ledger keeps its capacity
    /// and admits nothing: see [`is_closed`](Self::is_closed).)
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// assert_eq!(CountLedger::new(0)?.capacity(), 0);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn capacity(&self) -> u64 {
        limit::decode(self.inner().capacity())
    }

    /// Changes the capacity for the next acquisition, to between 1 and
    /// [`MAX_CAPACITY`](Self::MAX_CAPACITY). A closed ledger stays closed (and takes this
    /// capacity when reopened).
    ///
    /// Lowering the capacity below the number in flight refuses new permits until enough
    /// held ones are released; it never revokes a held permit.
    ///
    /// While an [`AdaptiveLimit`](crate::AdaptiveLimit) drives the ledger, this (and
    /// [`set_unlimited`](Self::set_unlimited)) takes the limit out of its hands: the
    /// capacity stays as set until [`AdaptiveLimit::resume`](crate::AdaptiveLimit::resume).
    ///
    /// # Errors
    ///
    /// [`CapacityError`] if `capacity` is 0 (which would remove the limit: that is
    /// [`set_unlimited`](Self::set_unlimited); to admit nothing, [`close`](Self::close))
    /// or above `MAX_CAPACITY`. The capacity in force is then unchanged.
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
    /// assert!(ledger.set_capacity(0).is_err(), "0 would remove the limit");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_capacity(&self, capacity: usize) -> Result<(), CapacityError> {
        let capacity = CapacityError::check_nonzero(capacity as u64, Self::MAX_CAPACITY as u64)?;
        self.configure(capacity);
        Ok(())
    }

    /// Removes the limit: every acquisition is admitted (unless the ledger is closed).
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(1)?;
    /// let _a = ledger.try_acquire()?;
    /// ledger.set_unlimited();
    /// assert_eq!(ledger.capacity(), 0);
    /// let _b = ledger.try_acquire()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_unlimited(&self) {
        self.configure(UNLIMITED);
    }

    /// An operator's setting: while an [`AdaptiveLimit`](crate::AdaptiveLimit) drives the
    /// ledger, it also takes the limit out of the controller's hands.
    fn configure(&self, capacity: u64) {
        let inner = self.inner();
        let _control = inner.cold.control.lock();
        // Relaxed: read and written only under `control`.
        if inner.cold.driven.load(Ordering::Relaxed) {
            inner.cold.fixed.store(true, Ordering::Relaxed);
        }
        inner.cold.capacity.store(capacity, Ordering::Relaxed);
        inner.store_threshold();
    }

    /// Puts the capacity under a controller's hands, starting at `capacity`; false if
    /// another controller has it already.
    ///
    /// Lock order: a window's closer holds the driver's lock and then takes the ledger's
    /// (to set the capacity), so nothing here holds the ledger's while taking the
    /// driver's.
    pub(crate) fn drive(
        &self,
        capacity: u64,
        epoch: Instant,
        control: Control,
        overload_after: u64,
    ) -> bool {
        let inner = self.inner();
        {
            let _control = inner.cold.control.lock();
            // Relaxed: read and written only under `control`.
            if inner.cold.driven.swap(true, Ordering::Relaxed) {
                return false;
            }
            inner.cold.fixed.store(false, Ordering::Relaxed);
            inner.cold.capacity.store(capacity, Ordering::Relaxed);
            inner.store_threshold();
        }
        let driver = inner.cold.driver.get_or_init(|| Driver::new(epoch));
        driver.install(control, epoch, overload_after);
        true
    }

    /// Hands a capacity fixed by hand back to the controller (`fixed` cleared), or, with
    /// `release`, ends the controller's drive altogether (its last handle is gone): the
    /// controller is removed first, and only then may another drive the ledger.
    pub(crate) fn hand_back(&self, release: bool) {
        let inner = self.inner();
        if release {
            if let Some(driver) = inner.cold.driver.get() {
                driver.uninstall();
            }
        }
        let _control = inner.cold.control.lock();
        // Relaxed: read and written only under `control`.
        inner.cold.fixed.store(false, Ordering::Relaxed);
        if release {
            inner.cold.driven.store(false, Ordering::Relaxed);
        }
    }

    /// The adaptive limit's state, once the ledger has been driven.
    pub(crate) fn driver(&self) -> Option<&Driver> {
        self.inner().cold.driver.get()
    }

    /// The ledger as its driver sees it.
    #[cfg(all(test, admission_loom))]
    pub(crate) fn steering(&self) -> &impl Steered {
        self.inner()
    }

    /// Records a sample for the ledger's adaptive limit, if it has one.
    #[inline]
    pub(crate) fn record_at(&self, now: Instant, latency: Duration, outcome: Outcome) {
        self.inner().record_at(now, latency, outcome);
    }

    /// Whether an operator has fixed a driven ledger's capacity by hand.
    pub(crate) fn is_fixed(&self) -> bool {
        Steered::is_fixed(self.inner())
    }

    /// Refuses every new acquisition with [`Refused::Closed`] until
    /// [`reopen`](Self::reopen); held permits are untouched. Capacity changes made while
    /// closed take effect at the reopening, not before.
    ///
    /// ```
    /// use admission_core::{CountLedger, Refused};
    ///
    /// let ledger = CountLedger::new(8)?;
    /// ledger.close();
    /// ledger.set_capacity(100)?; // an operator, or a controller, changing the limit
    /// assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Closed);
    /// ledger.reopen();
    /// assert!(ledger.try_acquire().is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn close(&self) {
        let inner = self.inner();
        let _control = inner.cold.control.lock();
        inner.cold.closed.store(true, Ordering::Relaxed);
        inner.store_threshold();
    }

    /// Admits again, at the configured capacity, after [`close`](Self::close) or
    /// [`drain`](Self::drain). A pending [`Drain`] resolves: the ledger is no longer
    /// draining.
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(1)?;
    /// ledger.close();
    /// assert!(ledger.is_closed());
    /// ledger.reopen();
    /// assert!(!ledger.is_closed());
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn reopen(&self) {
        let inner = self.inner();
        let waiters = {
            let mut control = inner.cold.control.lock();
            inner.cold.closed.store(false, Ordering::Relaxed);
            inner.store_threshold();
            inner.unwatch();
            std::mem::take(&mut control.list)
        };
        for (_, waker) in waiters {
            waker.wake();
        }
    }

    /// Whether the next acquisition is certain to be admitted: the ledger is unlimited
    /// and open. One load; for adapters that skip counting while nothing can be refused.
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(0)?;
    /// assert!(ledger.admits_all());
    /// ledger.close();
    /// assert!(!ledger.admits_all());
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    #[inline]
    pub fn admits_all(&self) -> bool {
        // Relaxed: a setting, as in `try_acquire_unobserved`.
        self.inner().hot.threshold.load(Ordering::Relaxed) == HELD
    }

    /// Whether the ledger is closed ([`close`](Self::close), [`drain`](Self::drain)).
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// assert!(!CountLedger::new(1)?.is_closed());
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn is_closed(&self) -> bool {
        self.inner().cold.closed.load(Ordering::Relaxed)
    }

    /// Closes the ledger and returns a [`Drain`]: a future (and, off async code, a
    /// blocking [`wait`](Drain::wait)) that completes once no permit is in flight. For
    /// shutdown: refuse new work, let admitted work finish, then stop.
    ///
    /// # Waiting for the last permit
    ///
    /// The release that takes the count to zero must wake the drain, and so touches the
    /// ledger after its count reached zero, when a handle dropped at that moment could
    /// otherwise free it. A waiting drain therefore sets a bit in the ledger's word that
    /// is a share of its reference count: the release that finds the bit as it takes
    /// the count to zero inherits that share, wakes the drains under the ledger's lock,
    /// and gives the share back only then. A drain that stops waiting (dropped) clears
    /// the bit only while permits are still in flight, so the share has one owner at a
    /// time; and nothing is admitted while the bit is set, so "zero in flight" cannot
    /// change under the inheriting release. Releases without a drain pay one comparison.
    /// loom models this, including a drain dropped while the last permit goes.
    ///
    /// ```
    /// use admission_core::{CountLedger, Refused};
    ///
    /// let ledger = CountLedger::new(8)?;
    /// let permit = ledger.try_acquire()?;
    /// let drain = ledger.drain();
    /// assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Closed);
    /// std::thread::spawn(move || drop(permit)); // the last request finishes
    /// drain.wait();
    /// assert_eq!(ledger.in_flight(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn drain(&self) -> Drain {
        self.close();
        Drain {
            ledger: self.clone(),
            id: None,
        }
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
            high_water: inner.cold.stats.high_water(),
            refused: inner.cold.stats.refused(),
        }
    }

    /// Refusals of class-aware acquisitions ([`try_acquire_as`](Self::try_acquire_as),
    /// a gate's [`Claim::priority`](crate::Claim::priority)) by class, indexed by
    /// [`Priority::index`]: which class was shed, and how often. (Refusals of plain
    /// acquisitions are in [`Snapshot::refused`] only.)
    ///
    /// ```
    /// use admission_core::{CountLedger, Priority};
    ///
    /// let ledger = CountLedger::new(1)?;
    /// let _held = ledger.try_acquire()?;
    /// let _ = ledger.try_acquire_as(Priority::SHEDDABLE).unwrap_err();
    /// let _ = ledger.try_acquire().unwrap_err();
    /// assert_eq!(ledger.refused_by_class()[..3], [0, 0, 1]);
    /// assert_eq!(ledger.snapshot().refused, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refused_by_class(&self) -> [u64; MAX_CLASSES] {
        let classes = &self.inner().cold.refused_by_class;
        std::array::from_fn(|index| classes[index].load(Ordering::Relaxed))
    }
}

impl fmt::Debug for CountLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountLedger")
            .field("in_flight", &self.in_flight())
            .field("capacity", &self.capacity())
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// The wait for a closed [`CountLedger`] to have nothing in flight; made by
/// [`CountLedger::drain`] (or [`Gate::drain`](crate::Gate::drain)).
///
/// As a future it needs no particular runtime: it completes once no permit is in flight,
/// or once the ledger is reopened (check [`CountLedger::is_closed`] if that matters).
/// Dropping it stops waiting; the ledger stays closed. Off async code, use
/// [`wait`](Self::wait) or [`wait_timeout`](Self::wait_timeout), which park the thread.
#[must_use = "a drain does nothing unless awaited or waited on"]
pub struct Drain {
    ledger: CountLedger,
    /// The id this drain's waker is registered under, once it has waited.
    id: Option<u64>,
}

impl Drain {
    /// The ledger being drained.
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(2)?;
    /// assert!(ledger.drain().ledger().is_closed());
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn ledger(&self) -> &CountLedger {
        &self.ledger
    }
}

/// Takes a drain's waker (registered under `id`, if it has waited) out of `waiters`.
fn forget(id: &mut Option<u64>, waiters: &mut Waiters) {
    if let Some(id) = id.take() {
        waiters.list.retain(|(other, _)| *other != id);
    }
}

impl Future for Drain {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let inner = this.ledger.inner();
        let mut control = inner.cold.control.lock();
        if !inner.cold.closed.load(Ordering::Relaxed) {
            // Reopened: not draining any more.
            forget(&mut this.id, &mut control);
            return Poll::Ready(());
        }
        let state = &inner.hot.state;
        // Acquire: reading zero synchronises with every release decrement before it.
        let mut current = state.load(Ordering::Acquire);
        loop {
            if current & HELD == 0 {
                // Done. A `WATCH` still set is the last release's to give back.
                forget(&mut this.id, &mut control);
                return Poll::Ready(());
            }
            if current & WATCH != 0 {
                break;
            }
            // Relaxed on success: the lock orders the waiters; see `unwatch`.
            match state.compare_exchange_weak(
                current,
                current | WATCH,
                Ordering::Relaxed,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        let id = match this.id {
            Some(id) => id,
            None => {
                let id = control.next_id;
                control.next_id += 1;
                this.id = Some(id);
                id
            }
        };
        match control.list.iter_mut().find(|(other, _)| *other == id) {
            Some((_, waker)) => waker.clone_from(cx.waker()),
            None => control.list.push((id, cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        if self.id.is_none() {
            return;
        }
        let inner = self.ledger.inner();
        let mut control = inner.cold.control.lock();
        forget(&mut self.id, &mut control);
        if control.list.is_empty() {
            inner.unwatch();
        }
    }
}

#[cfg(not(admission_loom))]
impl Drain {
    /// Blocks the thread until no permit is in flight (or the ledger is reopened).
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(0)?;
    /// ledger.drain().wait(); // nothing in flight: at once
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn wait(mut self) {
        let waker = Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        while Pin::new(&mut self).poll(&mut cx).is_pending() {
            std::thread::park();
        }
    }

    /// Blocks the thread until no permit is in flight (or the ledger is reopened), for
    /// at most `timeout`; whether it got there.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(1)?;
    /// let stuck = ledger.try_acquire()?;
    /// assert!(!ledger.drain().wait_timeout(Duration::from_millis(10)));
    /// drop(stuck);
    /// assert!(ledger.drain().wait_timeout(Duration::from_millis(10)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_timeout(mut self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let waker = Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if Pin::new(&mut self).poll(&mut cx).is_ready() {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            std::thread::park_timeout(deadline - now);
        }
    }
}

/// Wakes a thread parked in [`Drain::wait`].
#[cfg(not(admission_loom))]
struct Unpark(std::thread::Thread);

#[cfg(not(admission_loom))]
impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

impl fmt::Debug for Drain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drain")
            .field("in_flight", &self.ledger.in_flight())
            .field("waiting", &self.id.is_some())
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
    /// Records how the work under this permit went, for the ledger's
    /// [`AdaptiveLimit`](crate::AdaptiveLimit) (nothing happens if the ledger has none):
    /// its latency, from admission to whatever point the caller chose, and its outcome.
    /// Call it once, before or as the permit is dropped. Reads the clock once.
    ///
    /// The same as the limit's own [`record`](crate::AdaptiveLimit::record), without a
    /// handle to it: a permit reaches its ledger with no reference-count traffic.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use admission_core::adaptive::{AdaptiveLimit, Gradient, Outcome};
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(0)?;
    /// let _limit = AdaptiveLimit::builder(Gradient::default()).build(&ledger)?;
    /// let permit = ledger.try_acquire()?;
    /// let admitted = Instant::now();
    /// // ... the work ...
    /// permit.record(admitted.elapsed(), Outcome::Success);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn record(&self, latency: Duration, outcome: Outcome) {
        self.record_at(Instant::now(), latency, outcome);
    }

    /// [`record`](Self::record) at `now` on the limit's clock (see
    /// [`AdaptiveBuilder::epoch`](crate::adaptive::AdaptiveBuilder::epoch)).
    #[inline]
    pub fn record_at(&self, now: Instant, latency: Duration, outcome: Outcome) {
        // SAFETY: this permit holds a share of the ledger's count, so the allocation is
        // alive as long as `self` is; only shared access through atomics and mutexes.
        let inner = unsafe { self.inner.as_ref() };
        inner.record_at(now, latency, outcome);
    }

    /// Gives the permit's unit back to its ledger. Called only from `Drop`, so it runs
    /// exactly once.
    #[inline]
    fn release(&mut self) {
        // SAFETY: this permit added 1 to the word when it was made and gives it up here,
        // once (only `Drop` calls this); it never touches `inner` again.
        let prev = unsafe { raw::put(self.inner, 1) };
        if prev & !OWNER == WATCH | 1 {
            // This release took the count to zero while a drain waited.
            // SAFETY: as `last_out` requires: `WATCH` was set when this release took the
            // count from one to zero, so that share is now this thread's.
            unsafe { CountInner::last_out(self.inner) }
        }
    }
}

impl Drop for CountPermit {
    #[inline]
    fn drop(&mut self) {
        self.release();
    }
}

impl fmt::Debug for CountPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountPermit").finish_non_exhaustive()
    }
}

// SAFETY: the permit refers to a `CountInner`, whose shared state is atomics and a
// mutex (`Send + Sync`), and its only operation, the release in `Drop`, is an atomic
// decrement (and, for the last release under a drain, the mutex) that is correct on any
// thread.
unsafe impl Send for CountPermit {}
// SAFETY: `&CountPermit` offers only `record`, which touches the ledger's shared state
// through atomics and mutexes (`Sync`), correct from any thread.
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

    /// A waiting drain dropped with the last handle on one thread while the last permit
    /// is released on another, with no join between: the release may inherit the drain's
    /// share and take the lock after every handle is gone; it must unlock before it
    /// gives the share up. (loom cannot see an unlock after the free; Miri can, as a use
    /// after free: `.ci/run` runs the `two_threads` tests under Miri on eight schedules.)
    #[test]
    fn a_drain_and_the_last_handle_dropped_on_two_threads_while_the_last_permit_goes() {
        for _ in 0..if cfg!(miri) { 8 } else { 1_000 } {
            let ledger = CountLedger::new(2).unwrap();
            let permit = ledger.try_acquire().unwrap();
            let mut drain = ledger.drain();
            let poll = Pin::new(&mut drain).poll(&mut Context::from_waker(Waker::noop()));
            assert!(poll.is_pending());
            drop(ledger);
            let t = std::thread::spawn(move || drop(permit));
            drop(drain);
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
            "CountLedger { in_flight: 1, capacity: 3, closed: false }"
        );
        assert_eq!(format!("{p:?}"), "CountPermit { .. }");
    }

    #[test]
    fn every_class_follows_a_capacity_change_and_a_close() {
        use crate::Priority;
        let ledger = CountLedger::new(10).unwrap();
        let fill = |priority| {
            let mut held = Vec::new();
            while let Ok(permit) = ledger.try_acquire_as(priority) {
                held.push(permit);
            }
            held.len()
        };
        assert_eq!(fill(Priority::SHEDDABLE), 7);
        assert_eq!(fill(Priority::DEFAULT), 9);
        assert_eq!(fill(Priority::CRITICAL), 10);
        ledger.set_capacity(20).unwrap();
        assert_eq!(fill(Priority::SHEDDABLE), 14);
        assert_eq!(fill(Priority::DEFAULT), 18);
        ledger.set_unlimited();
        assert_eq!(ledger.try_acquire_as(Priority::SHEDDABLE).map(drop), Ok(()));
        ledger.close();
        for class in [Priority::CRITICAL, Priority::SHEDDABLE] {
            assert_eq!(ledger.try_acquire_as(class).unwrap_err(), Refused::Closed);
        }
        // Each fill ended with one refusal; then one of each closed.
        assert_eq!(ledger.refused_by_class()[..4], [2, 2, 3, 0]);
        assert_eq!(ledger.snapshot().refused, 7);
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

    /// A waker that counts its wakes.
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn counting_waker() -> (std::sync::Arc<Count>, Waker) {
        let count = std::sync::Arc::new(Count(0.into()));
        (count.clone(), Waker::from(count))
    }

    fn wakes(count: &Count) -> usize {
        count.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn poll(drain: &mut Drain, waker: &Waker) -> Poll<()> {
        Pin::new(drain).poll(&mut Context::from_waker(waker))
    }

    #[test]
    fn the_last_release_wakes_every_drain_and_only_the_last() {
        let ledger = CountLedger::new(4).unwrap();
        let (a, b) = (ledger.try_acquire().unwrap(), ledger.try_acquire().unwrap());
        let (wakes_1, waker_1) = counting_waker();
        let (wakes_2, waker_2) = counting_waker();
        let mut first = ledger.drain();
        let mut second = ledger.drain();
        assert!(poll(&mut first, &waker_1).is_pending());
        assert!(poll(&mut second, &waker_2).is_pending());
        assert_eq!(ledger.in_flight(), 2, "waiting is not counted as in flight");
        drop(a);
        assert_eq!(
            (wakes(&wakes_1), wakes(&wakes_2)),
            (0, 0),
            "one still in flight"
        );
        drop(b);
        assert_eq!((wakes(&wakes_1), wakes(&wakes_2)), (1, 1));
        assert!(poll(&mut first, &waker_1).is_ready());
        assert!(poll(&mut second, &waker_2).is_ready());
        // The bit the drains set is gone: after a reopening, admission is as before.
        ledger.reopen();
        let again: Vec<_> = (0..4).map(|_| ledger.try_acquire().unwrap()).collect();
        assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Count);
        drop(again);
    }

    #[test]
    fn a_drain_is_ready_at_once_with_nothing_in_flight_and_leaves_no_bit_behind() {
        let ledger = CountLedger::new(1).unwrap();
        let (wakes_1, waker) = counting_waker();
        let mut drain = ledger.drain();
        assert!(poll(&mut drain, &waker).is_ready());
        assert_eq!(wakes(&wakes_1), 0);
        ledger.reopen();
        drop(ledger.try_acquire().unwrap());
    }

    #[test]
    fn a_drain_dropped_while_waiting_stops_waiting_and_admission_resumes_on_reopen() {
        let ledger = CountLedger::new(2).unwrap();
        let held = ledger.try_acquire().unwrap();
        let (wakes_1, waker) = counting_waker();
        let mut drain = ledger.drain();
        assert!(poll(&mut drain, &waker).is_pending());
        drop(drain);
        assert!(
            ledger.is_closed(),
            "dropping the drain leaves the ledger closed"
        );
        drop(held);
        assert_eq!(wakes(&wakes_1), 0, "nobody waits any more");
        ledger.reopen();
        let _a = ledger.try_acquire().unwrap();
        let _b = ledger.try_acquire().unwrap();
        assert_eq!(ledger.in_flight(), 2);
    }

    #[test]
    fn reopening_ends_a_drain_and_admits_while_permits_are_still_held() {
        let ledger = CountLedger::new(2).unwrap();
        let held = ledger.try_acquire().unwrap();
        let (wakes_1, waker) = counting_waker();
        let mut drain = ledger.drain();
        assert!(poll(&mut drain, &waker).is_pending());
        ledger.reopen();
        assert_eq!(wakes(&wakes_1), 1, "the reopening woke the drain");
        assert!(poll(&mut drain, &waker).is_ready());
        let second = ledger.try_acquire().expect("open again, one slot free");
        drop((held, second, drain));
        assert_eq!(ledger.in_flight(), 0);
    }

    #[test]
    fn a_drain_polled_again_with_a_new_waker_wakes_the_new_one() {
        let ledger = CountLedger::new(2).unwrap();
        let held = ledger.try_acquire().unwrap();
        let (old, old_waker) = counting_waker();
        let (new, new_waker) = counting_waker();
        let mut drain = ledger.drain();
        assert!(poll(&mut drain, &old_waker).is_pending());
        assert!(poll(&mut drain, &new_waker).is_pending());
        drop(held);
        assert_eq!((wakes(&old), wakes(&new)), (0, 1));
    }

    #[test]
    fn closing_survives_capacity_changes_and_reopening_applies_the_latest() {
        let ledger = CountLedger::new(1).unwrap();
        ledger.close();
        ledger.set_capacity(3).unwrap();
        ledger.set_unlimited();
        ledger.set_capacity(2).unwrap();
        assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Closed);
        assert_eq!(ledger.capacity(), 2);
        ledger.reopen();
        let held: Vec<_> = (0..2).map(|_| ledger.try_acquire().unwrap()).collect();
        assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Count);
        drop(held);
    }

    #[test]
    fn a_blocking_wait_returns_only_after_the_last_release_and_a_timeout_says_so() {
        let ledger = CountLedger::new(1).unwrap();
        let permit = ledger.try_acquire().unwrap();
        assert!(!ledger
            .drain()
            .wait_timeout(std::time::Duration::from_millis(20)));
        let released = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let t = {
            let released = released.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                released.store(true, std::sync::atomic::Ordering::SeqCst);
                drop(permit);
            })
        };
        let drain = ledger.drain();
        assert_eq!(
            format!("{drain:?}"),
            "Drain { in_flight: 1, waiting: false }"
        );
        drain.wait();
        assert!(released.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(ledger.in_flight(), 0);
        t.join().unwrap();
    }

    #[test]
    fn admits_all_only_while_unlimited_and_open() {
        let ledger = CountLedger::new(0).unwrap();
        assert!(ledger.admits_all());
        ledger.set_capacity(5).unwrap();
        assert!(!ledger.admits_all(), "limited");
        ledger.set_unlimited();
        assert!(ledger.admits_all());
        ledger.close();
        assert!(!ledger.admits_all(), "closed");
        ledger.reopen();
        assert!(ledger.admits_all());
        assert!(!CountLedger::new(1).unwrap().admits_all());
    }

    /// The hand-over `unwatch` must respect, taken apart: a release has taken the count
    /// to zero with `WATCH` set (so `WATCH` is now that release's to give back) but has
    /// not given it back yet, and the last drain stops waiting in between. The drain must
    /// leave `WATCH` alone; the release then gives it back exactly once.
    #[test]
    fn a_drain_that_stops_waiting_leaves_an_inherited_watch_to_the_release() {
        let before = crate::raw::live::count();
        let ledger = CountLedger::new(2).unwrap();
        let permit = ledger.try_acquire().unwrap();
        let (_, waker) = counting_waker();
        let mut drain = ledger.drain();
        assert!(poll(&mut drain, &waker).is_pending());
        let state = &ledger.inner().hot.state;
        assert_eq!(state.load(Ordering::SeqCst), OWNER | WATCH | 1);
        // The release's decrement, without the rest of the release.
        let ptr = permit.inner;
        std::mem::forget(permit);
        state.fetch_sub(1, Ordering::SeqCst);
        drop(drain);
        assert_eq!(
            state.load(Ordering::SeqCst),
            OWNER | WATCH,
            "the inherited WATCH is the release's, not the drain's"
        );
        // The rest of the release: it gives WATCH back, once.
        // SAFETY: as `last_out` requires: the decrement above took the count from one to
        // zero with `WATCH` set, and `ptr` is not used again.
        unsafe { CountInner::last_out(ptr) };
        assert_eq!(ledger.inner().hot.state.load(Ordering::SeqCst), OWNER);
        drop(ledger);
        assert_eq!(crate::raw::live::count(), before, "freed once, not leaked");
    }

    #[test]
    fn a_drain_that_stops_waiting_with_permits_in_flight_takes_its_watch_back() {
        let ledger = CountLedger::new(2).unwrap();
        let permit = ledger.try_acquire().unwrap();
        let (_, waker) = counting_waker();
        let mut drain = ledger.drain();
        assert!(poll(&mut drain, &waker).is_pending());
        drop(drain);
        assert_eq!(ledger.inner().hot.state.load(Ordering::SeqCst), OWNER | 1);
        drop(permit);
        assert_eq!(ledger.inner().hot.state.load(Ordering::SeqCst), OWNER);
    }

    #[test]
    fn a_blocking_drain_returns_when_another_thread_releases_the_last_permit() {
        let ledger = CountLedger::new(2).unwrap();
        let permits: Vec<_> = (0..2).map(|_| ledger.try_acquire().unwrap()).collect();
        let drain = ledger.drain();
        let t = std::thread::spawn(move || drop(permits));
        assert!(drain.wait_timeout(std::time::Duration::from_secs(10)));
        t.join().unwrap();
        assert_eq!(ledger.in_flight(), 0);
    }

    #[test]
    fn the_last_permit_released_after_every_handle_and_a_waiting_drain_frees_once() {
        let before = crate::raw::live::count();
        let ledger = CountLedger::new(1).unwrap();
        let permit = ledger.try_acquire().unwrap();
        let (_, waker) = counting_waker();
        let mut drain = ledger.drain();
        assert!(poll(&mut drain, &waker).is_pending());
        drop(ledger);
        drop(drain);
        assert_eq!(crate::raw::live::count(), before + 1, "the permit keeps it");
        drop(permit);
        assert_eq!(crate::raw::live::count(), before);
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

    #[test]
    fn concurrent_sheddable_work_never_fills_more_than_its_share() {
        use crate::Priority;
        let ledger = CountLedger::new(10).unwrap();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let mut held = Vec::new();
                    for i in 0..if cfg!(miri) { 50 } else { 20_000 } {
                        if let Ok(p) = ledger.try_acquire_as(Priority::SHEDDABLE) {
                            held.push(p);
                        }
                        // Each thread wants three at once: twelve against a share of 7.
                        if held.len() == 3 || i % 5 == 0 {
                            held.clear();
                        }
                    }
                });
            }
        });
        let snap = ledger.snapshot();
        assert_eq!(snap.in_flight, 0);
        assert!(snap.high_water <= 7, "{}", snap.high_water);
        // The share is a threshold: critical work still gets the whole capacity.
        let all: Vec<_> = (0..10)
            .map(|_| ledger.try_acquire_as(Priority::CRITICAL).unwrap())
            .collect();
        assert_eq!(ledger.in_flight(), all.len() as u64);
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

    /// Wakes a model thread parked in `block_on`.
    struct Unpark(loom::thread::Thread);

    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }

    /// Polls `drain` to completion, parking the model thread between polls (a lost
    /// wake-up is a deadlock, which loom reports).
    fn block_on(mut drain: Drain) {
        let waker = Waker::from(std::sync::Arc::new(Unpark(loom::thread::current())));
        while Pin::new(&mut drain)
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
        {
            loom::thread::park();
        }
    }

    fn poll_once(drain: &mut Drain) -> Poll<()> {
        Pin::new(drain).poll(&mut Context::from_waker(Waker::noop()))
    }

    /// A drain waiting on one thread, the last permit released on another: the drain
    /// completes (it is woken, or sees zero), what was done under the permit happens
    /// before it completes, and whichever of the releasing thread and the handles goes
    /// last frees the ledger once, after every use.
    #[test]
    fn drain_woken_by_the_last_release_on_another_thread() {
        loom::model(|| {
            let ledger = CountLedger::new(2).unwrap();
            let permit = ledger.try_acquire().unwrap();
            let work = std::sync::Arc::new(loom::cell::UnsafeCell::new(0_u32));
            let drain = ledger.drain();
            let t = {
                let work = work.clone();
                loom::thread::spawn(move || {
                    // SAFETY: the only access until the permit is released.
                    work.with_mut(|w| unsafe { *w = 1 });
                    drop(permit);
                })
            };
            block_on(drain);
            // SAFETY: the drain completed: the writer's release happened before.
            assert_eq!(work.with(|w| unsafe { *w }), 1);
            assert_eq!(ledger.in_flight(), 0);
            drop(ledger);
            t.join().unwrap();
        });
    }

    /// The race the `WATCH` share exists for: a drain that has registered is dropped,
    /// with the last handle, while the last permit is released on another thread. The
    /// release may inherit the share and wake under the lock after every handle is gone;
    /// the ledger must be freed exactly once, after that.
    #[test]
    fn drain_cancelled_while_the_last_permit_drops() {
        loom::model(|| {
            let ledger = CountLedger::new(2).unwrap();
            let permit = ledger.try_acquire().unwrap();
            let mut drain = ledger.drain();
            assert!(poll_once(&mut drain).is_pending());
            drop(ledger);
            let t = loom::thread::spawn(move || drop(permit));
            drop(drain);
            t.join().unwrap();
        });
    }

    /// A reopening racing the last release under a waiting drain: the drain completes
    /// either way, and once the release is done the ledger admits to its capacity.
    #[test]
    fn reopen_racing_the_last_release_under_a_drain() {
        loom::model(|| {
            let ledger = CountLedger::new(1).unwrap();
            let permit = ledger.try_acquire().unwrap();
            let mut drain = ledger.drain();
            assert!(poll_once(&mut drain).is_pending());
            let t = loom::thread::spawn(move || drop(permit));
            ledger.reopen();
            assert!(
                poll_once(&mut drain).is_ready(),
                "reopened: no longer draining"
            );
            t.join().unwrap();
            let again = ledger.try_acquire().expect("open, nothing in flight");
            assert!(ledger.try_acquire().is_err(), "capacity 1");
            drop((again, drain));
        });
    }

    /// A close racing a capacity change (an operator, or a controller): whichever runs
    /// last, the ledger ends closed, and a reopening then applies the new capacity. The
    /// threshold is written from both settings under one lock, so no interleaving
    /// leaves the new capacity in force while closed.
    #[test]
    fn close_racing_set_capacity_stays_closed() {
        loom::model(|| {
            let ledger = CountLedger::new(1).unwrap();
            let setter = {
                let ledger = ledger.clone();
                loom::thread::spawn(move || ledger.set_capacity(3).unwrap())
            };
            ledger.close();
            setter.join().unwrap();
            assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Closed);
            ledger.reopen();
            let held: Vec<_> = (0..3).map(|_| ledger.try_acquire().unwrap()).collect();
            assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Count);
            drop(held);
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
