//! `KeyState`: the keyed ledgers' default hasher.

use std::fmt;
use std::hash::{BuildHasher, Hasher};

/// The keyed ledgers' default hasher ([`KeyedLedger`](crate::KeyedLedger), [`Gate`](crate::Gate)):
/// foldhash, seeded at random once per process and again per ledger.
///
/// A keyed ledger hashes its key on every acquisition, and keys usually come from
/// clients (a header, an address), so its hasher must be fast and must not let a client
/// aim keys at one slot. SipHash (the standard library's `RandomState`) resists the
/// strongest attacks but costs more than everything else the ledger does for a key that
/// has work in flight; foldhash costs a fraction of it, and with its random seeds a
/// client cannot compute colliding keys. What it gives up is resistance to an attacker
/// who studies a long-running process's timing to recover its seed (foldhash's own
/// caveat). Here such an attack buys little: the table holds only keys with work in
/// flight, so even keys that all collide cost each admission a scan of at most the
/// requests in flight (the count limit, and [`max_keys`](crate::KeyedLedger::set_max_keys)),
/// under one of 64 shard locks. For SipHash, pass the standard library's `RandomState`
/// to [`KeyedLedger::with_hasher`](crate::KeyedLedger::with_hasher) or
/// [`GateBuilder::hasher`](crate::GateBuilder::hasher).
///
/// ```
/// use std::hash::BuildHasher;
/// use admission_core::KeyState;
///
/// let state = KeyState::default();
/// assert_eq!(state.hash_one("alice"), state.hash_one("alice"));
/// assert_ne!(state.hash_one("alice"), KeyState::default().hash_one("alice"), "seeded per ledger");
/// ```
#[derive(Clone, Default)]
pub struct KeyState(foldhash::fast::RandomState);

impl KeyState {
    /// A hasher builder with a fresh seed.
    ///
    /// ```
    /// use std::hash::BuildHasher;
    /// use admission_core::KeyState;
    ///
    /// let state = KeyState::new();
    /// assert_eq!(state.hash_one(7_u64), state.hash_one(7_u64));
    /// ```
    pub fn new() -> Self {
        Self::default()
    }
}

impl BuildHasher for KeyState {
    type Hasher = KeyHasher;

    #[inline]
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(self.0.build_hasher())
    }
}

impl fmt::Debug for KeyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyState")
    }
}

/// The hasher [`KeyState`] builds.
///
/// ```
/// use std::hash::{BuildHasher, Hasher};
/// use admission_core::KeyState;
///
/// let state = KeyState::new();
/// let (mut a, mut b) = (state.build_hasher(), state.build_hasher());
/// a.write(b"alice");
/// b.write(b"alice");
/// assert_eq!(a.finish(), b.finish(), "one seed, one hash");
/// ```
#[derive(Clone)]
pub struct KeyHasher(foldhash::fast::FoldHasher<'static>);

impl Hasher for KeyHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0.finish()
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.0.write_u8(i);
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.0.write_u16(i);
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.0.write_u32(i);
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0.write_u64(i);
    }

    #[inline]
    fn write_u128(&mut self, i: u128) {
        self.0.write_u128(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.0.write_usize(i);
    }
}

impl fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyHasher")
    }
}

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use super::*;

    /// Every write the hasher takes reaches foldhash: values that differ hash apart,
    /// whatever the key type writes.
    #[test]
    fn every_write_reaches_the_hash() {
        let state = KeyState::new();
        assert_ne!(state.hash_one(1_u8), state.hash_one(2_u8));
        assert_ne!(state.hash_one(1_u16), state.hash_one(2_u16));
        assert_ne!(state.hash_one(1_u32), state.hash_one(2_u32));
        assert_ne!(state.hash_one(1_u64), state.hash_one(2_u64));
        assert_ne!(state.hash_one(1_u128), state.hash_one(2_u128));
        assert_ne!(state.hash_one(1_usize), state.hash_one(2_usize));
        assert_ne!(state.hash_one("a"), state.hash_one("b"), "bytes");
        assert_ne!(
            state.hash_one([0_u8; 0].as_slice()),
            state.hash_one([0_u8].as_slice())
        );
    }

    #[test]
    fn debug_output_shows_no_seed() {
        let state = KeyState::new();
        assert_eq!(format!("{state:?}"), "KeyState");
        assert_eq!(format!("{:?}", state.build_hasher()), "KeyHasher");
    }
}
