//! `GatePermit`: what one admission holds, released when dropped.

use super::{BytePermit, CountPermit, Key, KeyedPermit};

use crate::KeyState;

/// What a [`Gate`](crate::Gate) granted: one permit per configured dimension, all released on drop.
#[must_use = "the admission is released as soon as it is dropped"]
#[derive(Debug)]
pub struct GatePermit<K = Key, S = KeyState> {
    pub(super) count: CountPermit,
    pub(super) bytes: Option<BytePermit>,
    pub(super) keyed: Option<KeyedPermit<K, S>>,
    /// The seats beyond the first ([`Claim::seats`](super::Claim::seats)).
    pub(super) seats: Vec<CountPermit>,
}

impl<K, S> GatePermit<K, S> {
    /// The count permit (every admission holds one).
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<()>::builder().count(1).build()?;
    /// let permit = gate.try_admit(None, 0)?;
    /// let _count: &admission_core::CountPermit = permit.count();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn count(&self) -> &CountPermit {
        &self.count
    }

    /// The byte permit, if the gate has a byte ledger.
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<()>::builder().bytes(100).build()?;
    /// assert_eq!(gate.try_admit(None, 7)?.bytes().unwrap().charged(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bytes(&self) -> Option<&BytePermit> {
        self.bytes.as_ref()
    }

    /// The byte permit, to grow or shrink it as a body streams.
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<()>::builder().bytes(100).build()?;
    /// let mut permit = gate.try_admit(None, 0)?;
    /// permit.bytes_mut().unwrap().try_grow(60)?;
    /// assert_eq!(gate.bytes().unwrap().in_flight(), 60);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bytes_mut(&mut self) -> Option<&mut BytePermit> {
        self.bytes.as_mut()
    }

    /// Takes the byte permit out, to hold it elsewhere (a request body that grows it,
    /// shared with the response that ends it). The rest of the admission is unchanged.
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<()>::builder().count(1).bytes(100).build()?;
    /// let mut permit = gate.try_admit(None, 30)?;
    /// let bytes = permit.take_bytes().unwrap();
    /// assert!(permit.bytes().is_none());
    /// drop(permit);
    /// assert_eq!(gate.bytes().unwrap().in_flight(), 30, "still held by `bytes`");
    /// drop(bytes);
    /// assert_eq!(gate.bytes().unwrap().in_flight(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn take_bytes(&mut self) -> Option<BytePermit> {
        self.bytes.take()
    }

    /// The count slots this admission holds ([`Claim::seats`](super::Claim::seats)).
    pub fn seats(&self) -> u64 {
        1 + self.seats.len() as u64
    }

    /// The count permits of the seats beyond the first, taken out (to be held apart from
    /// the rest; [`into_parts`](Self::into_parts) releases any left).
    pub fn take_seats(&mut self) -> Vec<CountPermit> {
        std::mem::take(&mut self.seats)
    }

    /// The permit taken apart: count, bytes (if the gate has a byte ledger and it was not
    /// taken out) and key (if the gate has a per-key limit and a key was given), to hold
    /// each where it belongs. Each is released when dropped.
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<u8>::builder().count(2).per_key(1).build()?;
    /// let (count, bytes, keyed) = gate.try_admit(Some(&7), 0)?.into_parts();
    /// assert!(bytes.is_none() && keyed.is_some());
    /// drop(count);
    /// assert_eq!(gate.count().in_flight(), 0);
    /// assert_eq!(gate.keyed().unwrap().keys(), 1, "the key is still held");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_parts(self) -> (CountPermit, Option<BytePermit>, Option<KeyedPermit<K, S>>) {
        (self.count, self.bytes, self.keyed)
    }

    /// The keyed permit, if the gate has a per-key limit and a key was given.
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<u8>::builder().per_key(1).build()?;
    /// assert_eq!(gate.try_admit(Some(&3), 0)?.keyed().unwrap().key(), &3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn keyed(&self) -> Option<&KeyedPermit<K, S>> {
        self.keyed.as_ref()
    }
}
