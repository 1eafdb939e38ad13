//! The gate: any combination of the three ledgers, admitted all-or-nothing.

use std::hash::{BuildHasher, Hash};

use crate::sync::Arc;
use fair::Fair;

use crate::{
    ByteLedger, BytePermit, CapacityError, CountLedger, CountPermit, Key, KeyState, KeyedLedger,
    KeyedPermit, Priority, Refused,
};

/// Count, byte and per-key limits admitted together, all or nothing.
///
/// [`try_admit`](Self::try_admit) either returns one [`GatePermit`] holding a permit of
/// every configured dimension, or refuses and releases whatever it had taken before it
/// returns, so a refused call leaves every ledger as it found it. The refusal names the
/// dimension.
///
/// Order of the checks, which decides the reason a refusal names when several
/// dimensions would refuse: a charge above the maximum single request
/// ([`Refused::TooLarge`], whenever the gate has a byte dimension: the one answer that
/// retrying cannot change), then count, then bytes (global overload), then the key (one
/// client over its share). Count first keeps shedding under overload cheap: a saturated
/// server refuses after one load, before any lock or charge is taken.
///
/// No collateral refusals: the count and byte dimensions are checked by a load before
/// anything is taken, and only then is the key taken, the count acquired and the bytes
/// charged. So a request refused by one dimension holds nothing in another, even for a
/// moment, and cannot make a different request be refused; the one exception is a real
/// race at a real limit (a check that passed and a compare-exchange that then lost to a
/// concurrent admission), after which what was taken is given back before `try_admit`
/// returns. Statistics follow the same rule: a refusal moves only the refusing
/// dimension's refusal counter, and a request records its high-water marks only once
/// every dimension has admitted it. (In that same real race, a winner's mark can include
/// the loser's momentary reservation: the level did exist, for an instant.)
///
/// Every gate counts its requests in flight, with or without a count limit: that count is
/// what [`drain`](Self::drain) waits on and what [`close`](Self::close) shuts. The byte
/// and key dimensions exist only when configured.
///
/// Build with [`Gate::builder`] (0 sets no limit: the count is then unlimited, the byte
/// and key dimensions left out) or from existing ledgers with
/// [`Gate::from_ledgers`] (to share a ledger between gates). Cloning shares the ledgers:
/// an HTTP layer and a gRPC interceptor built from clones of one gate share one limit.
///
/// # Examples
///
/// ```
/// use admission_core::{Gate, Refused};
///
/// let gate = Gate::<String>::builder()
///     .count(100)
///     .bytes(64 << 20)
///     .max_request_bytes(8 << 20)
///     .per_key(2)
///     .build()?;
///
/// let alice = "alice".to_string();
/// let a = gate.try_admit(Some(&alice), 1024)?;
/// let b = gate.try_admit(Some(&alice), 1024)?;
/// assert_eq!(gate.try_admit(Some(&alice), 1024).unwrap_err(), Refused::Key);
/// assert_eq!(gate.try_admit(None, 9 << 20).unwrap_err(), Refused::TooLarge);
///
/// // The refusals left nothing behind.
/// let snap = gate.snapshot();
/// assert_eq!(snap.count.in_flight, 2);
/// assert_eq!(snap.bytes.unwrap().in_flight, 2048);
/// drop((a, b));
/// assert_eq!(gate.snapshot().count.in_flight, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Gate<K = Key, S = KeyState> {
    count: CountLedger,
    bytes: Option<ByteLedger>,
    keyed: Option<KeyedLedger<K, S>>,
    /// Fair shares between keys ([`GateBuilder::fair_share`]).
    fair: Option<Arc<Fair>>,
}

impl<K, S> Clone for Gate<K, S> {
    fn clone(&self) -> Self {
        Self {
            count: self.count.clone(),
            bytes: self.bytes.clone(),
            keyed: self.keyed.clone(),
            fair: self.fair.clone(),
        }
    }
}

impl<K: Hash + Eq + Clone> Gate<K, KeyState> {
    /// A builder with every limit disabled: the gate it builds counts requests in
    /// flight and refuses nothing (until closed, or given a limit at run time).
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<()>::builder().build()?;
    /// let _permit = gate.try_admit(None, 0)?;
    /// assert_eq!(gate.count().in_flight(), 1);
    /// assert_eq!(gate.count().capacity(), 0, "unlimited");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder() -> GateBuilder<K, KeyState> {
        GateBuilder {
            limits: Limits::default(),
            hasher: KeyState::new(),
            _key: std::marker::PhantomData,
        }
    }
}

impl<K: Hash + Eq + Clone, S: BuildHasher> Gate<K, S> {
    /// A gate over existing ledgers (shared with whoever else holds them); `None`
    /// disables the byte or key dimension. (For no count limit, a `CountLedger::new(0)`.)
    ///
    /// ```
    /// use admission_core::{ByteLedger, CountLedger, Gate};
    ///
    /// let bytes = ByteLedger::new(1 << 20)?;
    /// let gate = Gate::<()>::from_ledgers(CountLedger::new(4)?, Some(bytes.clone()), None);
    /// let _held = gate.try_admit(None, 100)?;
    /// assert_eq!(bytes.in_flight(), 100);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_ledgers(
        count: CountLedger,
        bytes: Option<ByteLedger>,
        keyed: Option<KeyedLedger<K, S>>,
    ) -> Self {
        Self {
            count,
            bytes,
            keyed,
            fair: None,
        }
    }

    /// Admits one request carrying `bytes` for `key` on every configured dimension, or
    /// refuses and leaves every ledger unchanged.
    ///
    /// `key` is checked only when a per-key limit is configured; `None` (a request with
    /// no key, say unauthenticated) passes the key dimension. `bytes` is charged only
    /// when a byte ledger is configured; 0 gives a byte permit that can grow later.
    ///
    /// # Errors
    ///
    /// The [`Refused`] of the first dimension that refused ([`Refused::Closed`] while
    /// the gate is closed).
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::{Gate, Refused};
    ///
    /// let gate = Gate::<u32>::builder().count(1).per_key(1).build()?;
    /// let held = gate.try_admit(Some(&1), 0)?;
    /// assert_eq!(gate.try_admit(Some(&2), 0).unwrap_err(), Refused::Count);
    /// assert_eq!(gate.keyed().unwrap().keys(), 1, "key 2 left no entry behind");
    /// drop(held);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_admit(&self, key: Option<&K>, bytes: u64) -> Result<GatePermit<K, S>, Refused> {
        let claim = Claim {
            key,
            bytes,
            total: 0,
            priority: None,
            key_cap: None,
            waits: false,
            flow: None,
            seats: 1,
        };
        self.admit(claim)
    }

    /// Admits a [`Claim`]: a request with a key, a byte charge, a priority class and a
    /// per-key cap of its own, each optional. [`try_admit`](Self::try_admit) is the claim
    /// with a key and bytes only.
    ///
    /// The priority class bounds the count dimension at the class's share of the
    /// capacity in force; the key's cap replaces the gate's per-key cap for this claim.
    /// Everything else is as `try_admit`: all or nothing, no collateral refusals.
    ///
    /// # Errors
    ///
    /// The [`Refused`] of the first dimension that refused.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::{Claim, Gate, Priority, Refused};
    ///
    /// let gate = Gate::<&str>::builder().count(10).per_key(2).build()?;
    /// let held: Vec<_> = (0..7).map(|_| gate.try_claim(Claim::new().priority(Priority::SHEDDABLE))).collect::<Result<_, _>>()?;
    /// let shed = gate.try_claim(Claim::new().priority(Priority::SHEDDABLE)).unwrap_err();
    /// assert_eq!(shed, Refused::Class);
    /// let paying = Claim::new().key(&"tenant-a").key_cap(3).priority(Priority::CRITICAL);
    /// let _a = gate.try_claim(paying)?;
    /// assert_eq!(gate.snapshot().refused_by_class[Priority::SHEDDABLE.index()], 1);
    /// # drop(held);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_claim(&self, claim: Claim<'_, K>) -> Result<GatePermit<K, S>, Refused> {
        self.admit(claim)
    }

    /// [`try_claim`](Self::try_claim), but where the count is full and its ledger lets
    /// acquisitions wait ([`CountLedger::set_max_waiting`]), waits for a slot (see
    /// [`CountLedger::acquire`]). With no waiting allowed (the default) it is
    /// `try_claim`, at once.
    ///
    /// What never waits: a request too large for the byte budget, and a key at its cap
    /// (one client cannot fill the queue). The key's permit is taken before the wait and
    /// held through it, so a waiter counts against its client's cap; the bytes are
    /// charged once the count admits. A refusal at any point leaves nothing held. The
    /// future has no timer: bound it with your runtime's timeout, and drop it to stop
    /// waiting.
    ///
    /// # Errors
    ///
    /// As `try_claim`; [`Refused::Count`] also when the waiters are at their maximum, and
    /// [`Refused::Closed`] when the gate closes while the claim waits.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::task::{Context, Poll, Waker};
    /// use admission_core::{Claim, Gate};
    ///
    /// let gate = Gate::<u32>::builder().count(1).per_key(1).build()?;
    /// gate.count().set_max_waiting(8);
    /// let held = gate.try_claim(Claim::new().key(&1))?;
    /// let mut cx = Context::from_waker(Waker::noop());
    ///
    /// let mut waits = pin!(gate.claim(Claim::new().key(&2)));
    /// assert!(waits.as_mut().poll(&mut cx).is_pending(), "the count is full: it waits");
    /// let mut same_key = pin!(gate.claim(Claim::new().key(&1)));
    /// assert!(matches!(same_key.as_mut().poll(&mut cx), Poll::Ready(Err(_))), "a key at its cap never waits");
    /// drop(held);
    /// assert!(matches!(waits.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn claim(&self, claim: Claim<'_, K>) -> Result<GatePermit<K, S>, Refused> {
        if self.count.max_waiting() == 0 {
            return self.admit(claim);
        }
        let Claim {
            key,
            bytes,
            total,
            priority,
            key_cap,
            waits: _,
            flow,
            seats,
        } = claim;
        let key_cap = self.fair_cap(key, key_cap, priority);
        if let Some(ledger) = &self.bytes {
            ledger.check_size(bytes.max(total))?;
        }
        let keyed = self
            .keyed
            .as_ref()
            .zip(key)
            .map(|(ledger, key)| ledger.try_acquire_unobserved(key, key_cap))
            .transpose()?;
        let count = match priority {
            Some(priority) => self.count.acquire_as(priority),
            None => self.count.acquire(),
        };
        let count = match flow {
            Some(flow) => count.in_flow(flow),
            None => count,
        }
        .await?;
        // The rest of its seats at once, or the first goes on to the next waiter.
        let (seats, _) = self.more_seats(seats, priority, false)?;
        let charged = self
            .bytes
            .as_ref()
            .map(|ledger| ledger.try_charge_unobserved(bytes))
            .transpose()?;
        Ok(self.observed(count, keyed, charged, seats))
    }

    /// Every dimension admitted: only now do the high-water marks of the keys and the
    /// bytes see it (the count's is its caller's), and the permits make one.
    #[inline(always)]
    fn observed(
        &self,
        count: CountPermit,
        keyed: Option<(KeyedPermit<K, S>, Option<u64>)>,
        charged: Option<(BytePermit, u64)>,
        seats: Vec<CountPermit>,
    ) -> GatePermit<K, S> {
        let keyed = keyed.map(|(permit, keys)| {
            if let (Some(ledger), Some(keys)) = (&self.keyed, keys) {
                ledger.observe(keys);
            }
            permit
        });
        let bytes = charged.map(|(permit, level)| {
            if let Some(ledger) = &self.bytes {
                ledger.observe(level);
            }
            permit
        });
        GatePermit {
            count,
            bytes,
            keyed,
            seats,
        }
    }

    #[inline(always)]
    fn admit(&self, claim: Claim<'_, K>) -> Result<GatePermit<K, S>, Refused> {
        let Claim {
            key,
            bytes,
            total,
            priority,
            key_cap,
            waits,
            flow: _,
            seats,
        } = claim;
        let key_cap = self.fair_cap(key, key_cap, priority);
        let keyed = self.keyed.as_ref().zip(key);
        if keyed.is_none() && self.bytes.is_none() && seats <= 1 {
            // Count alone: one compare-exchange, nothing to check ahead.
            let (count, level) = self.count.try_acquire_unobserved(priority, waits)?;
            self.count.observe(level);
            return Ok(GatePermit {
                count,
                bytes: None,
                keyed: None,
                seats: Vec::new(),
            });
        }
        // Checks first, by loads: the reason a refusal names, before anything is taken.
        if let Some(ledger) = &self.bytes {
            ledger.check_size(bytes.max(total))?;
        }
        (self.count.check(priority, waits)).map_err(|refused| self.full(key, priority, refused))?;
        if let Some(ledger) = &self.bytes {
            ledger.check_room(bytes)?;
        }
        // Then take. Each `?` drops the permits taken so far: that is the all-or-nothing.
        let keyed = keyed
            .map(|(ledger, key)| ledger.try_acquire_unobserved(key, key_cap))
            .transpose()?;
        let (count, level) = self.count.try_acquire_unobserved(priority, waits)?;
        let (seats, seated) = self.more_seats(seats, priority, waits)?;
        let charged = self
            .bytes
            .as_ref()
            .map(|ledger| ledger.try_charge_unobserved(bytes))
            .transpose()?;
        // Every dimension admitted: only now do the high-water marks see it.
        self.count.observe(level.max(seated));
        Ok(self.observed(count, keyed, charged, seats))
    }
}

mod builder;
mod claim;
mod fair;
mod ledgers;
mod permit;
mod shares;

pub use builder::GateBuilder;
use builder::Limits;
pub use claim::Claim;
pub use ledgers::GateSnapshot;
pub use permit::GatePermit;

#[cfg(all(test, not(admission_loom)))]
mod tests;

// Out of Miri: fair shares are atomics and arithmetic with no unsafe beneath (the keyed and
// count ledgers they claim through are under Miri in their own tests).
#[cfg(all(test, not(admission_loom), not(miri)))]
mod fair_tests;

// Out of Miri: seats are claims of the count ledger's permits, under Miri in its own tests.
#[cfg(all(test, not(admission_loom), not(miri)))]
mod seat_tests;

#[cfg(all(test, admission_loom))]
mod loom_models;
