//! The shard's locked paths: a key at its cap, away from home, or new where its home is taken.

use std::hash::{BuildHasher, Hash};
use std::ptr::NonNull;

use crate::sync::MutexGuard;

use hashbrown::HashTable;

use super::entry::{Entry, EntryPtr, LookAway, window_bits};
#[cfg(test)]
use super::lock_count;
use super::{
    AWAY_ONE, Acquired, BUSY, COUNTED, HELD, KeyedLedger, KeyedPermit, SLOTS, WINDOW, candidate,
};
use crate::Refused;
use crate::raw;
use crate::sync::Ordering;

/// What `find` found: a count on the key's home slot (as a permit) and the key's `held`
/// before it; the key's entry elsewhere (away from home, or in the overflow table); or
/// that it has none.
pub(super) enum Found<K, S> {
    Home(KeyedPermit<K, S>, u64),
    Entry(NonNull<Entry<K>>),
    Absent,
    /// The home is being filled or emptied: let go of the lock, wait, look again.
    Busy,
}

/// What a look at a home slot under the lock found: nothing, another key's entry by its
/// hash, a count taken on it whichever key it holds (as a permit) and its `held` before
/// the count; or a slot being filled or emptied, which may be the key's.
enum Look<K, S> {
    Empty,
    Other,
    Counted(KeyedPermit<K, S>, u64),
    Busy,
}

/// A count a look under the lock took on a home slot to compare its key: given back with
/// the lock held (`give_back_locked`) when dropped, by the code or by a panic in the key's
/// `Eq`, unless kept as the key's permit.
struct LookCount<K, S>(Option<KeyedPermit<K, S>>);

impl<K, S> LookCount<K, S> {
    fn key(&self) -> &K {
        self.0.as_ref().expect("a count until kept").key()
    }

    fn keep(mut self) -> KeyedPermit<K, S> {
        self.0.take().expect("kept once")
    }
}

impl<K, S> Drop for LookCount<K, S> {
    fn drop(&mut self) {
        if let Some(permit) = self.0.take() {
            permit.give_back_locked();
        }
    }
}

impl<K: Hash + Eq + Clone, S: BuildHasher> KeyedLedger<K, S> {
    /// `key`'s entry, under the lock whose guard `table` is, the caller's one in the
    /// home's `AWAY` keeping any key from being given an entry in the home without the lock
    /// meanwhile (or, for `in_flight`, a snapshot). The home slot's last permit is
    /// released without the lock, so its key is compared only under a count taken on it,
    /// as without the lock (see `look`); the count on the key's own home is returned as a
    /// permit. Entries away from home and overflow entries are released under the lock, so
    /// their keys are compared as they are. An overflow entry's address is the one its
    /// table holds (the allocation's own, which the entry's free needs), never one made
    /// from a borrow.
    pub(super) fn find(&self, table: &HashTable<EntryPtr<K>>, key: &K, hash: u64) -> Found<K, S> {
        let (shard, slots, start) = self.inner().window(hash);
        match self.look(&slots[start], hash) {
            Look::Empty | Look::Other => {}
            Look::Busy => return Found::Busy,
            Look::Counted(permit, held) => {
                // Given back under the lock if the key is another's, or if its `Eq` panics.
                let count = LookCount(Some(permit));
                if count.key() == key {
                    return Found::Home(count.keep(), held);
                }
            }
        }
        // Exact under the lock.
        let mut rest = window_bits(shard.away.load(Ordering::Relaxed), start) & !1;
        while rest != 0 {
            let entry = &slots[(start + rest.trailing_zeros() as usize) & (SLOTS - 1)];
            rest &= rest - 1;
            // SAFETY: an entry away from home is occupied while its bit is set, and its
            // last permit is released under the lock.
            if entry.hash.load(Ordering::Relaxed) == hash && unsafe { entry.key() } == key {
                return Found::Entry(NonNull::from(entry));
            }
        }
        if !table.is_empty() {
            let overflow = table.find(hash, |e| {
                // SAFETY: an overflow entry is occupied while in its table, and its last
                // permit is released under the lock.
                let found = unsafe { e.get().key() };
                found == key
            });
            if let Some(entry) = overflow {
                return Found::Entry(entry.0);
            }
        }
        Found::Absent
    }

    /// A home slot, under the shard lock (see `Look`). A slot being filled or emptied
    /// may be the key's (not there yet, or not gone nor uncounted yet): `Busy`, and the
    /// caller waits without the lock. The count is taken whatever the cap, to compare the
    /// key; it is never above `HELD` (caps stop at `HELD - 1`, and the lock holder takes
    /// one count at a time), and whoever holds the lock gives it back or keeps it as a
    /// permit below the cap before unlocking: a lock-free acquire that meets the count at
    /// the cap comes to the lock, and finds it gone.
    fn look(&self, entry: &Entry<K>, hash: u64) -> Look<K, S> {
        // Acquire: pairs with a fill's release (its key and hash are seen) and an
        // emptying's (the key's move out happens before a fill of the slot here).
        let mut state = entry.state.load(Ordering::Acquire);
        loop {
            if state & BUSY != 0 {
                return Look::Busy;
            }
            let held = state & HELD;
            if held == 0 {
                return Look::Empty;
            }
            if !candidate(entry.hash.load(Ordering::Relaxed), hash) {
                return Look::Other;
            }
            // Relaxed on success: the load of the very value replaced was an acquire;
            // acquire on failure, as the first load.
            match entry.state.compare_exchange_weak(
                state,
                state + 1,
                Ordering::Relaxed,
                Ordering::Acquire,
            ) {
                Ok(_) => return Look::Counted(self.permit_on(entry), held),
                Err(actual) => state = actual,
            }
        }
    }

    /// `try_acquire_unobserved` under the shard lock: a key at its cap, away from its
    /// home, or with no entry and a home that is taken or that the lock-free path could
    /// not claim. Out of line, so that the lock-free path stays small.
    #[inline(never)]
    pub(super) fn acquire_locked(&self, key: &K, hash: u64, cap: u64) -> Acquired<K, S> {
        let inner = self.inner();
        #[cfg(test)]
        lock_count::count();
        let (shard, slots, start) = inner.window(hash);
        let home = &slots[start];
        loop {
            let table = shard.table.lock();
            // The look's one in the home's `AWAY` keeps lock-free claims of the home out
            // until it ends (invariant 1); it goes back when `away` drops, a panic in `Eq`
            // or `Clone` included. (A home with 2^16 - 1 keys away has no room for it, but
            // its `AWAY` is above zero all the same: then only the home will do.)
            let Some(away) = LookAway::raise(home) else {
                // Waited for without the lock, so that the shard's other keys are served
                // meanwhile; then the look starts over.
                drop(table);
                home.unbusy(Ordering::Relaxed);
                continue;
            };
            let done = match self.find(&table, key, hash) {
                Found::Absent => return self.create(table, key, hash, away),
                Found::Busy => {
                    drop(away);
                    drop(table);
                    // Waited for without the lock, so that the shard's other keys are
                    // served meanwhile; then the look starts over.
                    home.unbusy(Ordering::Relaxed);
                    continue;
                }
                Found::Home(permit, held) if held < cap => Ok((permit, None)),
                Found::Home(permit, _) => {
                    // At its cap: the count taken to compare the key goes back before
                    // unlock.
                    permit.give_back_locked();
                    Err(Refused::Key)
                }
                Found::Entry(found) => {
                    // SAFETY: found under the lock, which is still held.
                    let entry = unsafe { found.as_ref() };
                    // Under the lock this entry's `held` stays above zero (its last release
                    // takes the lock), but lock-free acquires and releases may move it
                    // meanwhile. Relaxed: the key is ordered by the lock, and this count
                    // orders nothing for anyone.
                    let below_cap = |state: u64| (state & HELD < cap).then_some(state + 1);
                    match entry
                        .state
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, below_cap)
                    {
                        Ok(_) => Ok((
                            KeyedPermit {
                                inner: self.owner.ptr(),
                                entry: found,
                            },
                            None,
                        )),
                        Err(_) => Err(Refused::Key),
                    }
                }
            };
            drop(away);
            drop(table);
            if done.is_err() {
                inner.refused_key.fetch_add(1, Ordering::Relaxed);
            }
            return done;
        }
    }

    /// A new entry for `key`, which has none, under the lock (`table`'s guard) and the
    /// caller's one in the home's `AWAY` (`away`): in the home if it is empty (the one goes
    /// back), else in the first empty slot of the window (the one stays, for as long as the
    /// entry is away from home), else in the overflow table (likewise). Made under the
    /// lock, the entry always takes a share of the word, checked against `max_keys`.
    fn create(
        &self,
        mut table: MutexGuard<'_, HashTable<EntryPtr<K>>>,
        key: &K,
        hash: u64,
        away: LookAway<'_, K>,
    ) -> Acquired<K, S> {
        let inner = self.inner();
        let (shard, slots, start) = inner.window(hash);
        // Cloned before anything is taken: a panic here leaves the ledger as it was (the
        // look's one goes back with `away`).
        let key = key.clone();
        let refuse = |away, table| {
            drop(away);
            drop(table);
            inner.refused_table.fetch_add(1, Ordering::Relaxed);
            Err(Refused::KeyTable)
        };
        // Without the look's one in the home's `AWAY` (see `acquire_locked`), there is no
        // room to count an entry away from home: only the home will do.
        let places = if away.counted { WINDOW } else { 1 };
        let Some(keys) = inner.count_new_key(inner.max_keys.load(Ordering::Relaxed)) else {
            return refuse(away, table);
        };
        let permit = |entry| {
            let permit = KeyedPermit {
                inner: self.owner.ptr(),
                entry,
            };
            Ok((permit, Some(keys)))
        };
        // The home, then the rest of the window. A slot is claimed as without the lock,
        // which may claim the rest of the window for keys of their own homes; not the
        // home, whose `AWAY` this look holds above zero. Acquire: pairs with an emptying's
        // release, so the key's move out happens before the fill (the claim is relaxed: it
        // replaces the very value loaded).
        for i in 0..places {
            let place = (start + i) & (SLOTS - 1);
            let slot = &slots[place];
            let seen = slot.state.load(Ordering::Acquire);
            if seen & (HELD | BUSY) != 0
                || slot
                    .state
                    .compare_exchange(seen, seen | BUSY, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            if i == 0 {
                // The look's one goes back with the fill: the key is at home.
                let one = if away.counted { AWAY_ONE } else { 0 };
                // SAFETY: `BUSY` is ours, set on the empty `seen`.
                unsafe { slot.fill(key, hash, seen, one, COUNTED) };
            } else {
                // SAFETY: as above.
                unsafe { slot.fill(key, hash, seen, 0, COUNTED) };
                let mask = shard.away.load(Ordering::Relaxed);
                shard.away.store(mask | 1 << place, Ordering::Relaxed);
            }
            away.keep();
            return permit(NonNull::from(slot));
        }
        if !away.counted {
            // The home was taken meanwhile (its key made without the lock before the look).
            inner.state.fetch_sub(1, Ordering::Relaxed);
            return refuse(away, table);
        }
        let mut new = Entry::empty();
        new.fill_new(key, hash);
        let entry = raw::alloc(new);
        table.insert_unique(hash, EntryPtr(entry), |e| {
            e.get().hash.load(Ordering::Relaxed)
        });
        away.keep();
        permit(entry)
    }
}
