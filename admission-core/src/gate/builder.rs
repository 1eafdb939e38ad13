//! `GateBuilder`: a gate's limits, set once.

use std::hash::{BuildHasher, Hash};

use super::{ByteLedger, CapacityError, CountLedger, Fair, Gate, KeyedLedger};
use crate::sync::Arc;

/// Configuration of a [`Gate`](crate::Gate); 0 sets no limit (the count is still kept; a byte or key
/// dimension with no limit is left out).
///
/// ```
/// use admission_core::Gate;
///
/// let gate = Gate::<u64>::builder().count(0).per_key(4).max_keys(10_000).build()?;
/// assert_eq!(gate.count().capacity(), 0, "counted, not limited");
/// assert_eq!(gate.keyed().unwrap().max_keys(), 10_000);
/// # Ok::<(), admission_core::CapacityError>(())
/// ```
#[derive(Clone)]
pub struct GateBuilder<K, S> {
    pub(super) limits: Limits,
    pub(super) hasher: S,
    pub(super) _key: std::marker::PhantomData<fn(K)>,
}

/// The numbers of a [`GateBuilder`], apart from its types; 0 disables a dimension.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Limits {
    count: usize,
    bytes: u64,
    max_request_bytes: u64,
    per_key: usize,
    max_keys: usize,
    track_keys: bool,
    /// Fair shares' headroom, per mille of the count.
    fair_share: Option<u32>,
}

impl<K, S> std::fmt::Debug for GateBuilder<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GateBuilder")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone, S: BuildHasher> GateBuilder<K, S> {
    /// The same configuration for another key type, for code that learns the key type
    /// after the other limits (a middleware builder whose per-key method takes the key
    /// extractor, say).
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<()>::builder().count(4).with_key_type::<String>().per_key(1).build()?;
    /// assert_eq!(gate.count().capacity(), 4);
    /// assert!(gate.try_admit(Some(&"k".to_string()), 0).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_key_type<K2: Hash + Eq + Clone>(self) -> GateBuilder<K2, S> {
        GateBuilder {
            limits: self.limits,
            hasher: self.hasher,
            _key: std::marker::PhantomData,
        }
    }

    /// At most `capacity` requests in flight; 0 sets no count limit (requests are
    /// still counted).
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<()>::builder().count(2).build()?;
    /// assert_eq!(gate.count().capacity(), 2);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn count(mut self, capacity: usize) -> Self {
        self.limits.count = capacity;
        self
    }

    /// At most `budget` bytes charged in flight; 0 disables the budget.
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<()>::builder().bytes(4096).build()?;
    /// assert_eq!(gate.bytes().unwrap().budget(), 4096);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn bytes(mut self, budget: u64) -> Self {
        self.limits.bytes = budget;
        self
    }

    /// Refuse any single charge above `max` as [`Refused::TooLarge`](crate::Refused::TooLarge); 0 sets no maximum.
    /// Configures a byte ledger (unlimited budget) even when `bytes` is 0.
    ///
    /// ```
    /// use admission_core::{Gate, Refused};
    ///
    /// let gate = Gate::<()>::builder().max_request_bytes(10).build()?;
    /// assert_eq!(gate.try_admit(None, 11).unwrap_err(), Refused::TooLarge);
    /// assert_eq!(gate.bytes().unwrap().budget(), 0, "no budget, only a maximum");
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn max_request_bytes(mut self, max: u64) -> Self {
        self.limits.max_request_bytes = max;
        self
    }

    /// At most `cap` requests in flight per key; 0 disables the key dimension.
    ///
    /// ```
    /// use admission_core::{Gate, Refused};
    ///
    /// let gate = Gate::<&str>::builder().per_key(1).build()?;
    /// let _a = gate.try_admit(Some(&"a"), 0)?;
    /// assert_eq!(gate.try_admit(Some(&"a"), 0).unwrap_err(), Refused::Key);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn per_key(mut self, cap: usize) -> Self {
        self.limits.per_key = cap;
        self
    }

    /// Keeps the key dimension even when [`per_key`](Self::per_key) is 0 (no default
    /// cap): for caps chosen per key ([`Claim::key_cap`](crate::Claim::key_cap): tenant tiers) and `max_keys`.
    ///
    /// ```
    /// use admission_core::{Claim, Gate, Refused};
    ///
    /// let gate = Gate::<&str>::builder().track_keys().build()?;
    /// let _free = gate.try_claim(Claim::new().key(&"free").key_cap(1))?;
    /// assert_eq!(gate.try_claim(Claim::new().key(&"free").key_cap(1)).unwrap_err(), Refused::Key);
    /// let _other = gate.try_admit(Some(&"free"), 0)?; // no tier given: no cap
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn track_keys(mut self) -> Self {
        self.limits.track_keys = true;
        self
    }

    /// Fair shares between keys: while no more than the headroom's slots are free, a
    /// request whose key holds its share or more is refused
    /// ([`Refused::Key`](crate::Refused::Key)), so the last free slots go to the keys
    /// below their share. The headroom is at least `headroom_per_mille` thousandths of the
    /// count (rounded up, at least one slot); each key below its share that finds the
    /// count full widens it by one slot, and each generation (below) in which none did
    /// narrows it by one (8,192 claims with a key), within half the count.
    ///
    /// A key's share is the count (its class's share of it, with a
    /// [`Claim::priority`](crate::Claim::priority)) over the keys with work, rounded up:
    /// keys that sent a request among roughly the last 8,192 to 16,384 with a key, whether
    /// or not one is in flight. A lone key may use the whole count.
    ///
    /// Tracks keys (as [`track_keys`](Self::track_keys)) if no per-key cap does. It costs
    /// each claim with a key one shared increment, a hash and a bit set, and 3 KiB,
    /// whatever the number of keys. The wait ([`Gate::claim`](crate::Gate::claim)) is
    /// held to it too; for turns between keys in the wait, see [`Claim::flow`](crate::Claim::flow).
    ///
    /// # Errors
    ///
    /// `build` fails with a [`CapacityError`] if `headroom_per_mille` is above 1,000.
    ///
    /// ```
    /// use admission_core::{Claim, Gate, Refused};
    ///
    /// let gate = Gate::<&str>::builder().count(4).fair_share(250).build()?;
    /// // Alone, a key may take the whole count.
    /// let heavy: Vec<_> = (0..3).map(|_| gate.try_claim(Claim::new().key(&"heavy"))).collect::<Result<_, _>>()?;
    /// drop(heavy);
    /// let light = gate.try_claim(Claim::new().key(&"light"))?;
    /// // Two keys with work: a share of 2 each. With one slot free (the headroom), a key at
    /// // its share is refused, one below it admitted.
    /// let heavy: Vec<_> = (0..2).map(|_| gate.try_claim(Claim::new().key(&"heavy"))).collect::<Result<_, _>>()?;
    /// assert_eq!(gate.try_claim(Claim::new().key(&"heavy")).unwrap_err(), Refused::Key);
    /// let light_2 = gate.try_claim(Claim::new().key(&"light"))?;
    /// # drop((heavy, light, light_2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fair_share(mut self, headroom_per_mille: u32) -> Self {
        self.limits.fair_share = Some(headroom_per_mille);
        self
    }

    /// At most `max_keys` distinct keys with work in flight; 0 sets no bound.
    ///
    /// ```
    /// use admission_core::{Gate, Refused};
    ///
    /// let gate = Gate::<u8>::builder().per_key(4).max_keys(1).build()?;
    /// let _a = gate.try_admit(Some(&1), 0)?;
    /// assert_eq!(gate.try_admit(Some(&2), 0).unwrap_err(), Refused::KeyTable);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.limits.max_keys = max_keys;
        self
    }

    /// The hasher builder for keys, as `HashMap::with_hasher`.
    ///
    /// ```
    /// use std::collections::hash_map::RandomState;
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<u8>::builder().per_key(1).hasher(RandomState::new()).build()?;
    /// assert!(gate.keyed().is_some());
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn hasher<S2: BuildHasher>(self, hasher: S2) -> GateBuilder<K, S2> {
        GateBuilder {
            limits: self.limits,
            hasher,
            _key: std::marker::PhantomData,
        }
    }

    /// A gate over the ledgers these limits describe, each checked against what its
    /// ledger represents (the dimensions left out are not built at all).
    ///
    /// # Errors
    ///
    /// [`CapacityError`] if any value is beyond what its ledger represents.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// assert!(Gate::<()>::builder().bytes(u64::MAX).build().is_err());
    /// ```
    pub fn build(self) -> Result<Gate<K, S>, CapacityError> {
        let Limits {
            count,
            bytes,
            max_request_bytes,
            per_key,
            max_keys,
            track_keys,
            fair_share,
        } = self.limits;
        let fair = fair_share
            .map(|headroom| CapacityError::check(u64::from(headroom), 1000))
            .transpose()?
            .map(|headroom| Arc::new(Fair::new(headroom as u32)));
        let count = CountLedger::new(count)?;
        let bytes = match (bytes, max_request_bytes) {
            (0, 0) => None,
            (budget, max) => Some(ByteLedger::with_max_charge(budget, max)?),
        };
        let keyed = match (per_key, track_keys || fair.is_some()) {
            (0, false) => None,
            (cap, _) => Some(KeyedLedger::with_limits(cap, max_keys, self.hasher)?),
        };
        Ok(Gate {
            count,
            bytes,
            keyed,
            fair,
        })
    }
}
