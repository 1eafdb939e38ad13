//! Taking a count permit: the ledger's constructor and its acquisitions, without a wait.

use crossbeam_utils::CachePadded;

use super::{Cold, CountInner, CountLedger, CountPermit, HELD, Hot, QUEUE, Waiters};
use crate::limit;
use crate::priority::Priority;
use crate::raw::{OWNER, Owner};
use crate::stats::Stats;
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering, Track};
use crate::{CapacityError, Refused};

impl CountLedger {
    /// The largest capacity a count ledger accepts.
    pub const MAX_CAPACITY: usize = usize::MAX >> 3;

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
                refused_retries: AtomicU64::new(0),
                capacity: AtomicU64::new(capacity),
                closed: AtomicBool::new(false),
                driven: AtomicBool::new(false),
                fixed: AtomicBool::new(false),
                driver: std::sync::OnceLock::new(),
                max_waiting: AtomicU64::new(0),
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
    pub(super) fn inner(&self) -> &CountInner {
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
        let (permit, level) = self.admit(None, false)?;
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
    /// [`Refused::Class`] when the class's share is in flight (below the capacity),
    /// [`Refused::Count`] at the capacity, [`Refused::Closed`] while
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
    /// assert_eq!(ledger.try_acquire_as(Priority::SHEDDABLE).unwrap_err(), Refused::Class);
    /// let critical: Vec<_> = (0..3).map(|_| ledger.try_acquire_as(Priority::CRITICAL)).collect::<Result<_, _>>()?;
    /// assert_eq!(ledger.in_flight(), 10);
    /// # drop((sheddable, critical));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_as(&self, priority: Priority) -> Result<CountPermit, Refused> {
        let (permit, level) = self.admit(Some(priority), false)?;
        self.inner().cold.stats.observe(level);
        Ok(permit)
    }

    /// [`try_acquire`](Self::try_acquire) (or, with a class, [`try_acquire_as`](Self::try_acquire_as))
    /// for a caller that, refused because the count is full, waits for a slot next
    /// ([`acquire`](Self::acquire)): that refusal is not counted in the snapshot's
    /// `refused` or in [`refused_by_class`](Self::refused_by_class), since it is not what
    /// became of the request. Count where the wait ends: `acquire` counts a refusal for a
    /// full queue itself. A closed ledger's refusal is counted, as it is not waited on.
    ///
    /// # Errors
    ///
    /// As `try_acquire`.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(1)?;
    /// let held = ledger.try_acquire_before_wait(None)?;
    /// assert!(ledger.try_acquire_before_wait(None).is_err());
    /// assert_eq!(ledger.snapshot().refused, 0, "the caller waits next: not a refusal yet");
    /// assert!(ledger.try_acquire().is_err());
    /// assert_eq!(ledger.snapshot().refused, 1);
    /// # drop(held);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_before_wait(
        &self,
        priority: Option<Priority>,
    ) -> Result<CountPermit, Refused> {
        let (permit, level) = self.admit(priority, true)?;
        self.inner().cold.stats.observe(level);
        Ok(permit)
    }

    /// `try_acquire` without recording the high-water mark: the permit and the level it
    /// brought the ledger to, for a caller (the gate) that records it only once every
    /// other dimension has admitted too. A refusal is counted here, unless `waits` (see
    /// [`try_acquire_before_wait`](Self::try_acquire_before_wait)).
    #[inline]
    pub(crate) fn try_acquire_unobserved(
        &self,
        priority: Option<Priority>,
        waits: bool,
    ) -> Result<(CountPermit, u64), Refused> {
        self.admit(priority, waits)
    }

    /// The acquisition, for a class (its share of the threshold) or for none (the whole
    /// threshold). Always inlined, so that the plain path, whose `priority` is a constant
    /// `None`, compiles to exactly the compare against the threshold.
    #[inline(always)]
    pub(super) fn admit(
        &self,
        priority: Option<Priority>,
        waits: bool,
    ) -> Result<(CountPermit, u64), Refused> {
        let inner = self.inner();
        // Relaxed: the threshold is a plain setting; an acquisition racing a change may
        // see either value, which is the documented "next acquisition" semantics. A
        // class's threshold is derived from this one read, so it is the old or the new
        // setting's, never a mix.
        let threshold = inner.threshold(priority);
        let mut current = inner.hot.state.load(Ordering::Relaxed);
        loop {
            // `WATCH`, when set, is above every threshold: nothing is admitted. `QUEUE`
            // is not looked at (see `wait`).
            let held = current & !(OWNER | QUEUE);
            if held >= threshold {
                return Err(inner.refuse(priority, waits));
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
    pub(crate) fn check(&self, priority: Option<Priority>, waits: bool) -> Result<(), Refused> {
        let inner = self.inner();
        // Relaxed: advisory; the compare-exchange that follows decides.
        let held = inner.held();
        if held >= inner.threshold(priority) {
            return Err(inner.refuse(priority, waits));
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
}

impl CountLedger {
    /// Permits in flight now, and what an acquisition of `priority`'s class compares them
    /// against (its share of the capacity; the capacity for none; 0 while closed): two
    /// loads, for a caller that weighs how full the ledger is (the gate's fair shares).
    #[inline]
    pub(crate) fn room(&self, priority: Option<Priority>) -> (u64, u64) {
        let inner = self.inner();
        (self.in_flight(), inner.threshold(priority))
    }
}
