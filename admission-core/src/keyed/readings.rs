//! The ledger's limits and readings: keys, cap, `max_keys`, snapshot.

use super::{COUNTED, HELD, KEYS, KeyedLedger, KeyedSnapshot, MAX_CAP, MAX_KEYS};
use crate::sync::Ordering;
use crate::{CapacityError, limit};

impl<K, S> KeyedLedger<K, S> {
    /// Keys with at least one permit in flight now (the number of entries).
    ///
    /// The entries with a share of the ledger's word are counted there; while `max_keys`
    /// is unbounded, the entries made without the lock have none, and this reads every
    /// slot's state to count them (2,048 loads): a reading for a gauge or a test, not for a
    /// request's path. Each reading also updates the high-water mark (see
    /// [`KeyedSnapshot::keys_high_water`]).
    ///
    /// ```
    /// use admission_core::KeyedLedger;
    ///
    /// let ledger = KeyedLedger::new(1)?;
    /// let p = ledger.try_acquire(&"a")?;
    /// assert_eq!(ledger.keys(), 1);
    /// drop(p);
    /// assert_eq!(ledger.keys(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn keys(&self) -> u64 {
        let inner = self.owner.get();
        let without_share = (inner.slots.iter().flatten())
            .filter(|slot| {
                let state = slot.state.load(Ordering::Relaxed);
                state & HELD != 0 && state & COUNTED == 0
            })
            .count() as u64;
        let keys = (inner.state.load(Ordering::Relaxed) & KEYS) + without_share;
        self.observe(keys);
        keys
    }

    /// Records a number of keys an unobserved acquisition reached.
    pub(crate) fn observe(&self, keys: u64) {
        let high_water = &self.owner.get().keys_high_water;
        // Relaxed: a statistic; a plain load first keeps the common case write-free.
        if keys > high_water.load(Ordering::Relaxed) {
            high_water.fetch_max(keys, Ordering::Relaxed);
        }
    }

    /// The per-key cap in force; 0 means unlimited.
    ///
    /// ```
    /// use admission_core::KeyedLedger;
    ///
    /// assert_eq!(KeyedLedger::<u8>::new(0)?.cap(), 0);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn cap(&self) -> u64 {
        limit::decode(self.owner.get().cap.load(Ordering::Relaxed))
    }

    /// Changes the per-key cap for the next acquisition, to between 1 and
    /// [`MAX_CAP`](Self::MAX_CAP). Held permits are never revoked.
    ///
    /// # Errors
    ///
    /// [`CapacityError`] for 0 (which would remove the cap: that is
    /// [`set_cap_unlimited`](Self::set_cap_unlimited)) or above `MAX_CAP`; the cap is
    /// then unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::KeyedLedger;
    ///
    /// let ledger = KeyedLedger::new(2)?;
    /// let _a = ledger.try_acquire(&1)?;
    /// ledger.set_cap(1)?;
    /// assert!(ledger.try_acquire(&1).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_cap(&self, cap: usize) -> Result<(), CapacityError> {
        let cap = CapacityError::check_nonzero(cap as u64, MAX_CAP as u64)?;
        self.owner.get().cap.store(cap, Ordering::Relaxed);
        Ok(())
    }

    /// Removes the per-key cap (keys are still tracked, and `max_keys` still applies).
    ///
    /// ```
    /// use admission_core::KeyedLedger;
    ///
    /// let ledger = KeyedLedger::new(1)?;
    /// let _a = ledger.try_acquire(&1)?;
    /// ledger.set_cap_unlimited();
    /// assert!(ledger.try_acquire(&1).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_cap_unlimited(&self) {
        (self.owner.get().cap).store(limit::UNLIMITED, Ordering::Relaxed);
    }

    /// The most distinct keys with work in flight; 0 means unlimited.
    ///
    /// ```
    /// use admission_core::KeyedLedger;
    ///
    /// assert_eq!(KeyedLedger::<u8>::new(1)?.max_keys(), 0);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn max_keys(&self) -> u64 {
        limit::decode(self.owner.get().max_keys.load(Ordering::Relaxed))
    }

    /// Bounds how many distinct keys may have work in flight, between 1 and
    /// [`MAX_KEYS`](Self::MAX_KEYS); a new key past it is refused with
    /// [`Refused::KeyTable`](crate::Refused::KeyTable). The keys already in flight count against it.
    ///
    /// While a bound is set, each new key and each key's last release also count it in
    /// one word the ledger shares (a read-modify-write each way); without one, a new key's
    /// cycle writes nothing shared but its own slot. Setting a bound reads every slot
    /// (2,048), once.
    ///
    /// # Errors
    ///
    /// [`CapacityError`] for 0 (which would remove the bound: that is
    /// [`set_max_keys_unlimited`](Self::set_max_keys_unlimited)) or above `MAX_KEYS`;
    /// the bound is then unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::{KeyedLedger, Refused};
    ///
    /// let ledger = KeyedLedger::new(8)?;
    /// ledger.set_max_keys(1)?;
    /// let _a = ledger.try_acquire(&"a")?;
    /// assert!(ledger.try_acquire(&"a").is_ok(), "a known key is not new");
    /// assert_eq!(ledger.try_acquire(&"b").unwrap_err(), Refused::KeyTable);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_max_keys(&self, max_keys: usize) -> Result<(), CapacityError> {
        let max_keys = CapacityError::check_nonzero(max_keys as u64, MAX_KEYS as u64)?;
        let inner = self.owner.get();
        // One change of the bound at a time, so that the slots' marks follow the last.
        let _config = inner.config.lock();
        inner.max_keys.store(max_keys, Ordering::Relaxed);
        // Every slot marked bounded, and every entry made without a share of the word
        // given one, so that the bound counts the keys already in flight (see `settle`).
        inner.settle(Some(true), true);
        Ok(())
    }

    /// Removes the bound on distinct keys.
    ///
    /// ```
    /// use admission_core::KeyedLedger;
    ///
    /// let ledger = KeyedLedger::<u8>::new(1)?;
    /// ledger.set_max_keys(1)?;
    /// ledger.set_max_keys_unlimited();
    /// assert_eq!(ledger.max_keys(), 0);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn set_max_keys_unlimited(&self) {
        let inner = self.owner.get();
        let _config = inner.config.lock();
        inner.max_keys.store(limit::UNLIMITED, Ordering::Relaxed);
        inner.settle(Some(false), false);
    }

    /// A cheap reading of keys, limits, high-water mark and refusals.
    ///
    /// ```
    /// use admission_core::KeyedLedger;
    ///
    /// let ledger = KeyedLedger::new(1)?;
    /// let _a = ledger.try_acquire(&1)?;
    /// let _ = ledger.try_acquire(&1);
    /// let snap = ledger.snapshot();
    /// assert_eq!((snap.keys, snap.cap, snap.refused_key), (1, Some(1), 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot(&self) -> KeyedSnapshot {
        let inner = self.owner.get();
        KeyedSnapshot {
            keys: self.keys(),
            cap: crate::stats::configured(self.cap()),
            max_keys: crate::stats::configured(self.max_keys()),
            keys_high_water: inner.keys_high_water.load(Ordering::Relaxed),
            refused_key: inner.refused_key.load(Ordering::Relaxed),
            refused_table: inner.refused_table.load(Ordering::Relaxed),
        }
    }
}
