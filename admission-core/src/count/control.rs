//! The count ledger's controls: its capacity (by hand or by an adaptive limit), closing
//! and draining, and its readings.

use std::task::Waker;
use std::time::{Duration, Instant};

use super::{
    CapacityError, Control, CountLedger, Drain, Driver, HELD, MAX_CLASSES, Outcome, Refused,
    Snapshot, Steered, UNLIMITED, limit,
};
use crate::sync::Ordering;

impl CountLedger {
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
    pub(super) fn configure(&self, capacity: u64) {
        let inner = self.inner();
        let mut wake = Vec::new();
        {
            let mut control = inner.cold.control.lock();
            // Relaxed: read and written only under `control`.
            if inner.cold.driven.load(Ordering::Relaxed) {
                inner.cold.fixed.store(true, Ordering::Relaxed);
            }
            inner.cold.capacity.store(capacity, Ordering::Relaxed);
            inner.store_threshold();
            // A higher capacity has room for waiters.
            inner.grant(&mut control, &mut wake);
        }
        wake.into_iter().for_each(Waker::wake);
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
    pub(crate) fn steering(&self) -> &(impl Steered + use<>) {
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
        let mut wake = Vec::new();
        {
            let mut control = inner.cold.control.lock();
            inner.cold.closed.store(true, Ordering::Relaxed);
            inner.store_threshold();
            // Every acquisition waiting for a slot is refused, at once.
            inner.refuse_waiters(&mut control, Refused::Closed, &mut wake);
        }
        wake.into_iter().for_each(Waker::wake);
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
            capacity: crate::stats::configured(self.capacity()),
            high_water: inner.cold.stats.high_water(),
            refused: inner.cold.stats.refused(),
        }
    }

    /// Refusals of class-aware acquisitions ([`try_acquire_as`](Self::try_acquire_as),
    /// a gate's [`Claim::priority`](crate::Claim::priority)) by class, indexed by
    /// [`Priority::index`](crate::Priority::index): which class was shed, and how often. (Refusals of plain
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

    /// Refusals of retries ([`Priority::retry`](crate::Priority::retry)): of the refusals counted in
    /// [`refused_by_class`](Self::refused_by_class), those of retries.
    ///
    /// ```
    /// use admission_core::{CountLedger, Priority};
    ///
    /// let ledger = CountLedger::new(2)?;
    /// let _held = ledger.try_acquire()?;
    /// let _ = ledger.try_acquire_as(Priority::CRITICAL.retry(50)).unwrap_err();
    /// let _second = ledger.try_acquire_as(Priority::CRITICAL)?;
    /// assert_eq!((ledger.refused_retries(), ledger.refused_by_class()[0]), (1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refused_retries(&self) -> u64 {
        self.inner().cold.refused_retries.load(Ordering::Relaxed)
    }
}
