//! `Claim`: what one admission asks of a gate.

use super::Priority;

/// What one request asks of a [`Gate`](crate::Gate) ([`Gate::try_claim`](crate::Gate::try_claim)): a key, a byte charge, a
/// priority class and a cap for its key, each optional. Built by chaining; `Copy`.
///
/// ```
/// use admission_core::{Claim, Priority};
///
/// let tenant = 42_u64;
/// let claim = Claim::new().key(&tenant).bytes(4096).priority(Priority::DEFAULT).key_cap(8);
/// # let _ = claim;
/// ```
#[derive(Debug)]
pub struct Claim<'a, K> {
    pub(super) key: Option<&'a K>,
    pub(super) bytes: u64,
    pub(super) total: u64,
    pub(super) priority: Option<Priority>,
    pub(super) key_cap: Option<u64>,
    pub(super) waits: bool,
    pub(super) flow: Option<u64>,
    pub(super) seats: u32,
}

impl<K> Clone for Claim<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Claim<'_, K> {}

impl<K> Default for Claim<'_, K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a, K> Claim<'a, K> {
    /// A claim of one request: no key, no bytes, no class (the whole capacity), the
    /// gate's per-key cap.
    pub const fn new() -> Self {
        Self {
            key: None,
            bytes: 0,
            total: 0,
            priority: None,
            key_cap: None,
            waits: false,
            flow: None,
            seats: 1,
        }
    }

    /// The caller waits for a count slot ([`Gate::claim`](super::Gate::claim)) if this
    /// claim, with [`Gate::try_claim`](super::Gate::try_claim), finds the count full:
    /// that refusal is then not counted in the count ledger's `refused` (see
    /// [`CountLedger::try_acquire_before_wait`](crate::CountLedger::try_acquire_before_wait)).
    ///
    /// ```
    /// use admission_core::{Claim, Gate};
    ///
    /// let gate = Gate::<()>::builder().count(1).build()?;
    /// let held = gate.try_claim(Claim::new())?;
    /// assert!(gate.try_claim(Claim::new().before_wait()).is_err());
    /// assert_eq!(gate.snapshot().count.refused, 0);
    /// # drop(held);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn before_wait(mut self) -> Self {
        self.waits = true;
        self
    }

    /// The request's key, for the per-key dimension (ignored by a gate without one).
    pub const fn key(mut self, key: &'a K) -> Self {
        self.key = Some(key);
        self
    }

    /// The bytes to charge now (ignored by a gate without a byte dimension).
    pub const fn bytes(mut self, bytes: u64) -> Self {
        self.bytes = bytes;
        self
    }

    /// The request's whole size, when only part of it is charged now ([`bytes`](Self::bytes))
    /// and the rest as it arrives: a total above the maximum single charge is refused as
    /// [`Refused::TooLarge`](crate::Refused::TooLarge) at once, whatever is charged now.
    ///
    /// ```
    /// use admission_core::{Claim, Gate, Refused};
    ///
    /// let gate = Gate::<()>::builder().bytes(1 << 20).max_request_bytes(64 << 10).build()?;
    /// let too_large = Claim::new().bytes(1_000).total(100 << 10);
    /// assert_eq!(gate.try_claim(too_large).unwrap_err(), Refused::TooLarge);
    /// let permit = gate.try_claim(Claim::new().bytes(1_000).total(48 << 10))?;
    /// assert_eq!(permit.bytes().unwrap().charged(), 1_000, "the rest is charged as it comes");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn total(mut self, bytes: u64) -> Self {
        self.total = bytes;
        self
    }

    /// The request's class: the count dimension admits it only below the class's share
    /// of the capacity in force (see [`Priority`]).
    pub const fn priority(mut self, priority: Priority) -> Self {
        self.priority = Some(priority);
        self
    }

    /// The cap of this request's key, in place of the gate's per-key cap (see
    /// [`KeyedLedger::try_acquire_with_cap`](crate::KeyedLedger::try_acquire_with_cap): 0 admits nothing, `u64::MAX` is no cap).
    /// Needs a key dimension ([`GateBuilder::per_key`](crate::GateBuilder::per_key), or
    /// [`GateBuilder::track_keys`](crate::GateBuilder::track_keys) for keys with no default cap).
    pub const fn key_cap(mut self, cap: u64) -> Self {
        self.key_cap = Some(cap);
        self
    }

    /// The count slots the request takes: 1 by default; more for a request that costs
    /// more than most (a listing beside a lookup), at most the count (its class's share
    /// of it, with a [`priority`](Self::priority)), so that any request can be admitted
    /// alone; 0 is taken as 1. Its seats are taken all at once or not at once: refused
    /// ([`Refused::Count`](crate::Refused::Count)) unless every one is free. In the wait
    /// ([`Gate::claim`](super::Gate::claim)) it waits for its first seat and then takes
    /// the rest at once, or is refused. The count's in-flight reading counts seats.
    ///
    /// ```
    /// use admission_core::{Claim, Gate, Refused};
    ///
    /// let gate = Gate::<()>::builder().count(4).build()?;
    /// let listing = gate.try_claim(Claim::new().seats(3))?;
    /// assert_eq!((listing.seats(), gate.count().in_flight()), (3, 3));
    /// assert_eq!(gate.try_claim(Claim::new().seats(2)).unwrap_err(), Refused::Count);
    /// let lookup = gate.try_claim(Claim::new())?;
    /// drop((listing, lookup));
    /// let everything = gate.try_claim(Claim::new().seats(100))?;
    /// assert_eq!(everything.seats(), 4, "no more than the count");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn seats(mut self, seats: u32) -> Self {
        self.seats = seats;
        self
    }

    /// The flow the request waits in if it waits for a count slot
    /// ([`Gate::claim`](super::Gate::claim)): waiting flows take turns at the slots that
    /// free (see [`Acquire::in_flow`](crate::Acquire::in_flow)). A client's or a tenant's
    /// number: the key's hash, say. Ignored by [`Gate::try_claim`](super::Gate::try_claim).
    ///
    /// ```
    /// use admission_core::{Claim, Gate};
    /// # let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    /// use std::future::Future;
    /// use std::pin::pin;
    ///
    /// let gate = Gate::<()>::builder().count(1).build()?;
    /// gate.count().set_max_waiting(8);
    /// let held = gate.try_claim(Claim::new())?;
    /// let mut heavy_1 = pin!(gate.claim(Claim::new().flow(1)));
    /// let mut heavy_2 = pin!(gate.claim(Claim::new().flow(1)));
    /// let mut light = pin!(gate.claim(Claim::new().flow(2)));
    /// for waiter in [heavy_1.as_mut(), heavy_2.as_mut(), light.as_mut()] {
    ///     assert!(waiter.poll(&mut cx).is_pending());
    /// }
    /// drop(held);
    /// let first = heavy_1.as_mut().poll(&mut cx);
    /// assert!(first.is_ready());
    /// drop(first);
    /// let second = light.as_mut().poll(&mut cx);
    /// assert!(second.is_ready(), "flow 2's turn before flow 1's second");
    /// assert!(heavy_2.as_mut().poll(&mut cx).is_pending());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn flow(mut self, flow: u64) -> Self {
        self.flow = Some(flow);
        self
    }
}
