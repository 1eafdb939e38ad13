//! The lock-free acquire: a count on the key's entry, or a new entry in its home.

use std::hash::{BuildHasher, Hash};
use std::ptr::NonNull;

use super::entry::{Entry, window_bits};
use super::{
    AWAY, Acquired, BOUNDED, BUSY, COUNTED, HELD, KeyedLedger, KeyedPermit, SLOTS, candidate,
    give_back,
};
use crate::Refused;
use crate::sync::Ordering;

/// What a lock-free look at one slot found: a permit on the key's entry, the key at its
/// cap (refused under the lock), an empty slot (its state, not busy), or another key's
/// entry or a busy slot.
enum Probe<K, S> {
    Permit(KeyedPermit<K, S>),
    AtCap,
    Empty(u64),
    Other,
}

/// What `probe` found or made: a permit on the key's entry (an entry it found, or one it
/// made in an unbounded home); its home empty (`seen`, marked `BOUNDED`) with no key of it
/// away (a new entry there, checked against `max_keys`, without the lock); or a look under
/// the lock to make.
pub(super) enum Fast<K, S> {
    Permit(KeyedPermit<K, S>),
    Insert(u64),
    Lock,
}

impl<K: Hash + Eq + Clone, S: BuildHasher> KeyedLedger<K, S> {
    /// A permit on `entry` if it holds `key` below `cap`, without the lock.
    #[inline(always)]
    fn acquire_on(&self, entry: &Entry<K>, key: &K, hash: u64, cap: u64) -> Probe<K, S> {
        // Acquire: the hash read next is this generation's (or a later one's, and then
        // the state has moved on and the compare-exchange fails), and so is the key read
        // once the count is taken.
        let mut state = entry.state.load(Ordering::Acquire);
        loop {
            let held = state & HELD;
            if held == 0 {
                return if state & BUSY == 0 {
                    Probe::Empty(state)
                } else {
                    Probe::Other
                };
            }
            if !candidate(entry.hash.load(Ordering::Relaxed), hash) {
                return Probe::Other;
            }
            if held >= cap {
                return Probe::AtCap;
            }
            // Relaxed on success: the load of the very value replaced was an acquire (the
            // first load, or this one's failure), so the key the fill of this generation
            // wrote is seen. Acquire on failure, as the first load.
            match entry.state.compare_exchange_weak(
                state,
                state + 1,
                Ordering::Relaxed,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => state = actual,
            }
        }
        // The count just taken is a permit on this entry, whichever key it holds.
        let permit = self.permit_on(entry);
        if permit.key() == key {
            return Probe::Permit(permit);
        }
        // Another key's entry (their hashes are equal): give the count back, as its
        // permit.
        give_back(permit);
        Probe::Other
    }

    /// The lock-free look for `key`'s entry: its home first, where keys most often are,
    /// then the slots that the shard's mask shows holding entries away from home (a hint:
    /// see `Shard::away`).
    #[inline(always)]
    pub(super) fn probe(&self, key: &K, hash: u64, cap: u64) -> Fast<K, S> {
        let (shard, slots, start) = self.inner().window(hash);
        match self.acquire_on(&slots[start], key, hash, cap) {
            Probe::Permit(permit) => return Fast::Permit(permit),
            Probe::AtCap => return Fast::Lock,
            // An empty home and no key of it away: the key has no entry anywhere. Made
            // here if `max_keys` does not bound the home (nothing can refuse it then),
            // else by the slow path, which checks the bound.
            Probe::Empty(seen) if seen & AWAY == 0 => {
                return match seen & BOUNDED {
                    0 => self
                        .insert_home(key, hash, seen)
                        .map_or(Fast::Lock, Fast::Permit),
                    _ => Fast::Insert(seen),
                };
            }
            Probe::Empty(_) | Probe::Other => {}
        }
        let mut rest = window_bits(shard.away.load(Ordering::Relaxed), start) & !1;
        while rest != 0 {
            let entry = &slots[(start + rest.trailing_zeros() as usize) & (SLOTS - 1)];
            rest &= rest - 1;
            match self.acquire_on(entry, key, hash, cap) {
                Probe::Permit(permit) => return Fast::Permit(permit),
                Probe::AtCap => return Fast::Lock,
                Probe::Empty(_) | Probe::Other => {}
            }
        }
        Fast::Lock
    }

    /// What `probe` could not do: make the key's entry in its home, without the lock if
    /// the home is still as `probe` saw it, else under the lock.
    #[inline]
    pub(super) fn acquire_slow(
        &self,
        key: &K,
        hash: u64,
        cap: u64,
        fast: Fast<K, S>,
    ) -> Acquired<K, S> {
        match fast {
            Fast::Permit(permit) => Ok((permit, None)),
            Fast::Insert(seen) => match self.insert_home_bounded(key, hash, seen) {
                Some(done) => done,
                None => self.acquire_locked(key, hash, cap),
            },
            Fast::Lock => self.acquire_locked(key, hash, cap),
        }
    }

    /// Gives `key` an entry in its home slot without the lock, in a home that `max_keys`
    /// does not bound (`seen` has no `BOUNDED`): the slot was empty (`seen`) with no key of
    /// it away, so the key has no entry anywhere. One compare-exchange claims the slot
    /// (`BUSY`); the fill publishes it. The entry takes no share of the word, so nothing
    /// refuses it once the slot is claimed. `None` if the slot changed meanwhile (the
    /// caller goes to the lock). Part of the inlined `probe`, so that a new key's cycle
    /// passes no result through memory.
    #[inline(always)]
    fn insert_home(&self, key: &K, hash: u64, seen: u64) -> Option<KeyedPermit<K, S>> {
        let home = self.inner().home(hash);
        // Cloned before the claim, so that the slot is busy for as little as can be.
        let key = key.clone();
        if !home.claim(seen) {
            return None;
        }
        // SAFETY: `BUSY` is ours, set on the empty `seen`.
        unsafe { home.fill(key, hash, seen, 0, 0) };
        Some(self.permit_on(home))
    }

    /// `insert_home` in a home that `max_keys` bounds (`seen` has `BOUNDED`): the entry
    /// takes a share of the word, checked against `max_keys`, and is refused if the
    /// ledger is at it.
    #[inline]
    fn insert_home_bounded(&self, key: &K, hash: u64, seen: u64) -> Option<Acquired<K, S>> {
        let inner = self.inner();
        let home = inner.home(hash);
        let key = key.clone();
        // `seen` was loaded with acquire and carries the `BOUNDED` mark, so the bound that
        // `set_max_keys` stored before marking the slot is loaded here (see `settle`).
        if !home.claim(seen) {
            return None;
        }
        let Some(keys) = inner.count_new_key(inner.max_keys.load(Ordering::Relaxed)) else {
            // Nothing was written: the slot is as it was (no one changes a busy slot's
            // `AWAY` that was zero: see `raise_away`). Release: as a fill's.
            home.state.store(seen, Ordering::Release);
            inner.refused_table.fetch_add(1, Ordering::Relaxed);
            return Some(Err(Refused::KeyTable));
        };
        // SAFETY: `BUSY` is ours, set on the empty `seen`.
        unsafe { home.fill(key, hash, seen, 0, COUNTED) };
        Some(Ok((self.permit_on(home), Some(keys))))
    }

    /// A permit on `entry`, whose count the caller has just taken.
    #[inline(always)]
    pub(super) fn permit_on(&self, entry: &Entry<K>) -> KeyedPermit<K, S> {
        KeyedPermit {
            inner: self.owner.ptr(),
            entry: NonNull::from(entry),
        }
    }
}
