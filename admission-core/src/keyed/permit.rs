//! A key's permit, and its release: lock-free at home, under the lock away from it.

use crate::KeyState;
use std::fmt;
use std::ptr::NonNull;

use hashbrown::HashTable;

use super::entry::{Entry, home, lower_away};
#[cfg(test)]
use super::lock_count;
use super::{AWAY, BOXED, BUSY, COUNTED, HELD, KeyedInner};
use crate::raw;
use crate::sync::Ordering;

/// Whether a shard's table should give memory back: memory stays proportional to the
/// keys in flight after a burst of many keys. Tables of up to 64 entries are left alone,
/// and a table is shrunk (to twice its length: slack, so a key that comes and goes does
/// not rehash it each time) only when it is at most a quarter full.
fn worth_shrinking(capacity: usize, len: usize) -> bool {
    capacity > 64 && capacity > 4 * len
}

/// How many entries a table's allocation holds, tombstones included. (`capacity()` is
/// not it: a removal that leaves a tombstone does not give its slot back to the count of
/// free ones, so after a burst `capacity()` stays near `len()` while the allocation stays
/// as large as the burst made it, and a test on it would never shrink.) One control byte
/// per bucket beside each entry; seven eighths of the buckets are usable.
pub(super) fn usable<T>(table: &HashTable<T>) -> usize {
    let buckets = table.allocation_size() / (std::mem::size_of::<T>() + 1);
    buckets - buckets / 8
}

/// One of a key's permits in a [`KeyedLedger`](crate::KeyedLedger), released when dropped.
///
/// `'static` and `Send + Sync` (for `K: Send + Sync`); it may outlive every handle of
/// its ledger. It holds no copy of the key.
///
/// ```
/// use admission_core::KeyedLedger;
///
/// let ledger = KeyedLedger::new(1)?;
/// let permit = ledger.try_acquire(&"alice".to_string())?;
/// assert_eq!(permit.key(), "alice");
/// std::thread::spawn(move || drop(permit)).join().unwrap();
/// assert_eq!(ledger.keys(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "the permit is released as soon as it is dropped"]
pub struct KeyedPermit<K, S = KeyState> {
    pub(super) inner: NonNull<KeyedInner<K, S>>,
    pub(super) entry: NonNull<Entry<K>>,
}

impl<K, S> KeyedPermit<K, S> {
    /// The key this permit was taken for.
    ///
    /// ```
    /// use admission_core::KeyedLedger;
    ///
    /// let ledger = KeyedLedger::new(1)?;
    /// assert_eq!(*ledger.try_acquire(&7)?.key(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key(&self) -> &K {
        // SAFETY: this permit is counted in the entry's `held`, so the entry is neither
        // emptied nor freed before the permit's release (the ledger lives as long, see
        // `release`), and its key is not written meanwhile.
        unsafe { self.entry.as_ref().key() }
    }
}

impl<K, S> KeyedPermit<K, S> {
    /// Gives the permit's count back; empties its entry (and frees it, if it is an overflow
    /// entry) if that was its key's last. Called only from `Drop`, so it runs exactly once.
    #[inline]
    fn release(&mut self) {
        // SAFETY: the permit's count keeps the entry occupied, and so (an overflow entry is
        // freed and a slot's ledger dropped only once it is empty) alive.
        let e = unsafe { self.entry.as_ref() };
        let mut state = e.state.load(Ordering::Relaxed);
        loop {
            if state & HELD > 1 {
                // Not the key's last permit: one decrement. Release: this holder's reads
                // of the key happen before whoever empties the entry takes it out.
                match e.state.compare_exchange_weak(
                    state,
                    state - 1,
                    Ordering::Release,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return,
                    Err(actual) => state = actual,
                }
            } else if usize::from(e.place) != home(e.hash.load(Ordering::Relaxed))
                || state & AWAY != 0
            {
                // The last permit of an entry away from its home slot (an overflow entry's
                // place is none), or of a home with keys away (whose `AWAY` may change
                // meanwhile under the lock): emptied under the lock. (If `AWAY` changes
                // before the compare-exchange below, that fails, and this is read again.)
                return self.release_locked();
            } else {
                // The last permit of an entry in its home slot: `held` to zero and `BUSY`
                // in one compare-exchange, which makes this thread the slot's only writer
                // until it is empty. Acquire: every other holder's release decrement
                // happens before the key is moved out.
                let empty = state - 1;
                match e.state.compare_exchange_weak(
                    state,
                    empty | BUSY,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return self.empty_home(empty),
                    Err(actual) => state = actual,
                }
            }
        }
    }

    /// Empties the home slot whose `held` this permit has just taken to zero (`empty`, now
    /// with `BUSY`), without the lock, and gives up the entry's share of the word if it
    /// has one. Out of line, so that the release of a permit that is not its key's last
    /// stays small.
    #[inline(never)]
    fn empty_home(&mut self, empty: u64) {
        let (inner, entry) = (self.inner, self.entry);
        // SAFETY: `BUSY` keeps the slot from being filled, and so (the ledger is freed only
        // once no slot is busy) the ledger alive, until the store below.
        let e = unsafe { entry.as_ref() };
        // SAFETY: as above.
        let inner_ref = unsafe { inner.as_ref() };
        // SAFETY: `held` is zero and `BUSY` is ours: no permit holder or lock-free acquire
        // reads the key, and every earlier read is ordered before this one (the acquire
        // above). Nobody else moves it out: the key is moved out exactly once.
        let key = e.key.with_mut(|key| unsafe { (*key).assume_init_read() });
        // The share goes while the slot is still busy, so an acquire of the key waits for
        // it and never counts the key twice (invariant 5). Release: pairs with the free's
        // acquire load of the word, whose `quiesce` then waits out this busy slot. An entry
        // without a share has none to give up (the last handle's `close` waits for it).
        let word = if empty & COUNTED != 0 {
            inner_ref.state.fetch_sub(1, Ordering::Release)
        } else {
            0
        };
        // The last use of the ledger's memory: under loom, a free that does not wait for
        // the store below races this.
        inner_ref.track.touch();
        // Empty, not busy: the slot may be filled again. Release: pairs with the next
        // claim's acquire load (the key moved out above happens before the next fill
        // writes another) and with the free's acquire (this thread's every use of the
        // ledger happens before it). A store: the home had no key away (else the release
        // took the lock), and no one adds to a busy slot's `AWAY` (`raise_away`).
        e.state.store(empty & !COUNTED, Ordering::Release);
        if word == 1 {
            // SAFETY: this decrement brought the word to zero; `inner` is not used after.
            unsafe { raw::free(inner) };
        }
        drop(key);
    }

    /// `release` of a permit of an entry away from its home (in another slot of its window
    /// or in the overflow table) under the shard lock: perhaps the key's last. Out of line,
    /// so that the lock-free path stays small.
    #[inline(never)]
    fn release_locked(&mut self) {
        #[cfg(test)]
        lock_count::count();
        let (inner, entry) = (self.inner, self.entry);
        // SAFETY: as in `release`.
        let e = unsafe { entry.as_ref() };
        // SAFETY: the occupied entry's share keeps the ledger alive until its decrement
        // below, and `quiesce` until this thread unlocks.
        let inner_ref = unsafe { inner.as_ref() };
        let hash = e.hash.load(Ordering::Relaxed);
        // Read now: once this thread unlocks, a slot may be freed with the ledger.
        let boxed = e.place == BOXED;
        // A home's own entry comes here when keys of the home are away (see `release`).
        let at_home = !boxed && usize::from(e.place) == home(hash);
        let (shard, slots, start) = inner_ref.window(hash);
        let mut table = shard.table.lock();
        // Perhaps the last: under the lock `held` cannot reach zero by anyone else's hand
        // (this permit's count is in it), but lock-free acquires and releases may still
        // move it. A decrement that is not the last is a release, as in `release`; the one
        // to zero an acquire, so that every other holder's release is ordered before the
        // key is taken out. A slot's goes to `BUSY` with it: a lock-free claim of the
        // slot, for a key whose home it is, must wait until the key is out.
        let empty = if boxed {
            let state = e.state.fetch_sub(1, Ordering::AcqRel);
            debug_assert!(
                state & HELD >= 1,
                "a keyed permit outlived its entry's count"
            );
            if state & HELD > 1 {
                return;
            }
            state
        } else {
            match give_back_count(e) {
                Some(empty) => empty,
                None => return,
            }
        };
        // The key's last permit: the entry is emptied in this critical section, so no one
        // under the lock sees a key with two entries or an entry on its way out.
        // SAFETY: `held` is zero, and `BUSY` ours for a slot (an overflow entry is reached
        // only under the lock): no one else reads the key, every earlier read is ordered
        // before this one (above), and it is moved out exactly once.
        let key = e.key.with_mut(|key| unsafe { (*key).assume_init_read() });
        if boxed {
            match table.find_entry(hash, |p| p.0 == entry) {
                Ok(found) => {
                    found.remove();
                }
                Err(_) => unreachable!("an occupied overflow entry is always in its shard"),
            }
            if worth_shrinking(usable(&table), table.len()) {
                let len = table.len();
                table.shrink_to(len * 2, |e| e.get().hash.load(Ordering::Relaxed));
            }
        } else {
            if !at_home {
                let away = shard.away.load(Ordering::Relaxed);
                shard.away.store(away & !(1 << e.place), Ordering::Relaxed);
            }
            // Release: as in `empty_home`. A store: every change of `AWAY` is made under
            // the lock, which this thread holds.
            e.state.store(empty & !COUNTED, Ordering::Release);
        }
        if !at_home {
            // The key's entry is gone, so it is no longer away from home.
            lower_away(&slots[start]);
        }
        // The share goes in the same critical section, so an acquire of the key after this
        // unlock does not count it. Relaxed: a free that follows takes every shard lock
        // first (`quiesce`), which orders all of this before it. (A home's own entry made
        // without the lock while `max_keys` was unbounded has none to give up.)
        debug_assert!(
            at_home || empty & COUNTED != 0,
            "an entry away from home has a share"
        );
        let word = if empty & COUNTED != 0 {
            inner_ref.state.fetch_sub(1, Ordering::Relaxed)
        } else {
            0
        };
        // The last use of the ledger's memory but the unlock: under loom, a free that does
        // not wait for the unlock races this.
        inner_ref.track.touch();
        drop(table);
        if boxed {
            // SAFETY: the overflow entry is out of its table and empty, and nothing refers
            // to it any more (its last count was this one); it came from `raw::alloc`.
            drop(unsafe { Box::from_raw(entry.as_ptr()) });
            #[cfg(test)]
            raw::live::change(-1);
        }
        if word == 1 {
            // SAFETY: this decrement brought the word to zero; `inner` is not used after.
            unsafe { raw::free(inner) };
        }
        // The key is dropped last, outside the lock: a panic in its `Drop` comes after the
        // release is complete.
        drop(key);
    }
}

impl<K, S> KeyedPermit<K, S> {
    /// Gives back a count that a look under the lock took on the key's home slot to
    /// compare its key (see `look`), with the shard lock held by the caller: `release`
    /// would take that lock for a home with keys away, which the look's own one makes
    /// every home it looks at. If it was the entry's last count, the entry is emptied
    /// here, as `release_locked` would. The word does not reach zero: the caller holds a
    /// handle. Cold: the count is another key's (equal hashes), or a key at its cap.
    #[cold]
    #[inline(never)]
    pub(super) fn give_back_locked(self) {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: as in `release`; and the caller holds the shard lock, which every change
        // of `AWAY` takes.
        let e = unsafe { this.entry.as_ref() };
        // SAFETY: as above; the caller's handle keeps the ledger alive.
        let inner = unsafe { this.inner.as_ref() };
        let Some(empty) = give_back_count(e) else {
            return;
        };
        // SAFETY: `held` is zero and `BUSY` is ours: no one else reads the key, every earlier
        // read is ordered before this one, and it is moved out exactly once.
        let key = e.key.with_mut(|key| unsafe { (*key).assume_init_read() });
        // Release: as in `empty_home`; a store, as every change of `AWAY` takes the lock.
        e.state.store(empty & !COUNTED, Ordering::Release);
        if empty & COUNTED != 0 {
            // Relaxed: as in `release_locked`. Not the last share: the caller's handle.
            inner.state.fetch_sub(1, Ordering::Relaxed);
        }
        drop(key);
    }
}

/// Gives back one count of a slot's entry under the shard lock: `None` if it was not the
/// last, else the emptied state, with `BUSY` now the caller's (under the lock `held` cannot
/// reach zero by anyone else's hand, but lock-free acquires and releases may move it).
/// Release on a decrement that is not the last, acquire on the last: every other holder's
/// release is then ordered before the caller moves the key out.
fn give_back_count<K>(e: &Entry<K>) -> Option<u64> {
    let mut state = e.state.load(Ordering::Relaxed);
    loop {
        let less = state - 1;
        let (next, ordering) = if state & HELD > 1 {
            (less, Ordering::Release)
        } else {
            (less | BUSY, Ordering::Acquire)
        };
        match e
            .state
            .compare_exchange_weak(state, next, ordering, Ordering::Relaxed)
        {
            Ok(_) if next == less => return None,
            Ok(_) => return Some(less),
            Err(actual) => state = actual,
        }
    }
}

impl<K, S> Drop for KeyedPermit<K, S> {
    fn drop(&mut self) {
        self.release();
    }
}

impl<K: fmt::Debug, S> fmt::Debug for KeyedPermit<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedPermit")
            .field("key", self.key())
            .finish()
    }
}

// SAFETY: the permit may drop (and free its entry and key, or the whole ledger) on any
// thread, and gives out `&K`; the same bounds as `KeyedInner` apply.
unsafe impl<K: Send + Sync, S: Send + Sync> Send for KeyedPermit<K, S> {}

// SAFETY: `&KeyedPermit` gives out only `&K`.
unsafe impl<K: Send + Sync, S: Send + Sync> Sync for KeyedPermit<K, S> {}

// What the impls above rest on, checked by the compiler: the ledger's state is
// `Send + Sync` for every key and hasher that are (by `KeyedInner`'s impls, whose
// argument is beside them).
#[cfg(not(admission_loom))]
const fn shared<T: Send + Sync>() {}
#[cfg(not(admission_loom))]
#[allow(dead_code)] // Type-checked, never called: the check is that it compiles.
const fn inner_is_shared<K: Send + Sync, S: Send + Sync>() {
    shared::<KeyedInner<K, S>>();
}
