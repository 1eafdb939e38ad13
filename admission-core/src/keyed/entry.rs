//! An entry's state word: the slot, its claim and fill, its `AWAY` count; the shard.

use std::mem::MaybeUninit;
use std::ptr::NonNull;

use hashbrown::HashTable;

use super::{AWAY, AWAY_ONE, BUSY, COUNTED, GENERATION, HELD, SLOTS, WINDOW};
use crate::sync::{AtomicU32, AtomicU64, Mutex, Ordering, Track, UnsafeCell, wait_while};

/// A key's entry: one of the shard's slots, or a boxed overflow entry in its table.
pub(super) struct Entry<K> {
    /// The generation, `AWAY`, `COUNTED`, `BUSY` and `held` (see each, and the module
    /// docs). `held` leaves zero only by a fill; it reaches zero under the lock for an
    /// overflow entry or an entry away from its home, and for an entry in its home slot by
    /// the compare-exchange that sets `BUSY`, without the lock.
    pub(super) state: AtomicU64,
    /// The key's hash. Written when the entry is filled, before its state; read by a
    /// lock-free acquire after an acquire load of the state, by the holder of one of its
    /// permits, or under the lock.
    pub(super) hash: AtomicU64,
    /// The slot's place among its shard's slots, or `BOXED` for an overflow entry (freed
    /// when emptied; a slot is kept). Never changes.
    pub(super) place: u8,
    /// The key, initialised exactly while `held > 0` (and while `BUSY` from the fill's
    /// write until the releaser's move out). Written only by the holder of `BUSY` (or
    /// under the lock, for an overflow entry); read by the holder of one of its permits, or
    /// under the lock for an entry whose last release takes the lock.
    pub(super) key: UnsafeCell<MaybeUninit<K>>,
    pub(super) _track: Track,
}

impl<K> Entry<K> {
    pub(super) fn empty() -> Self {
        Self {
            state: AtomicU64::new(0),
            hash: AtomicU64::new(0),
            place: BOXED,
            key: UnsafeCell::new(MaybeUninit::uninit()),
            _track: Track::new(),
        }
    }

    /// Claims this empty slot for a new entry, as it was seen (`seen`: empty, not busy,
    /// no key of it away): `BUSY`, in one compare-exchange, which fails if the slot changed.
    /// Expecting `AWAY` zero is what keeps a key from a second entry: a look under the lock
    /// for a key of this home adds one first. Relaxed: `seen` was loaded with acquire, so a
    /// releaser's move of the last key out happens before the fill.
    #[inline(always)]
    pub(super) fn claim(&self, seen: u64) -> bool {
        debug_assert_eq!(seen & (AWAY | HELD | BUSY | COUNTED), 0);
        self.state
            .compare_exchange(seen, seen | BUSY, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// The slot's state once no thread is filling or emptying it (see `BUSY`), loaded with
    /// `ordering`.
    pub(super) fn unbusy(&self, ordering: Ordering) -> u64 {
        let mut state = 0;
        wait_while(|| {
            state = self.state.load(ordering);
            state & BUSY != 0
        });
        state
    }

    /// The key.
    ///
    /// # Safety
    ///
    /// The entry is occupied (`held > 0`) and stays so for the borrow: the caller holds
    /// one of its permits (a count in `held`), or holds the shard lock meanwhile and the
    /// entry's last release takes the lock (an overflow entry, or one away from home).
    pub(super) unsafe fn key(&self) -> &K {
        // SAFETY: the key is initialised while `held > 0`, and written only by the holder
        // of `BUSY` (which needs `held == 0`) or, for an overflow entry, under the lock;
        // the caller keeps `held > 0` for as long as the returned borrow lives, and that
        // this read sees the initialised key is ordered by the lock or by the acquire that
        // took the caller's count (see the module docs).
        self.key.with(|key| unsafe { (*key).assume_init_ref() })
    }

    /// Fills the empty slot the caller claimed (`BUSY`, from `seen`) with `key` and one
    /// permit: the next generation, `AWAY` less `away` (a look under the lock that ends
    /// here gives its one back), `counted` (`COUNTED` or 0), `BUSY` ended.
    ///
    /// A store: nobody else changes the slot's state while it is filled. A lock-free fill
    /// claimed the slot with `AWAY` zero, and no one adds to a busy slot's `AWAY`
    /// (`raise_away`), so no one takes from it either; a fill under the lock holds the lock
    /// that every change of `AWAY` takes.
    ///
    /// # Safety
    ///
    /// The caller set `BUSY` on the slot, empty and without `COUNTED`, from `seen`.
    pub(super) unsafe fn fill(&self, key: K, hash: u64, seen: u64, away: u64, counted: u64) {
        debug_assert_eq!(seen & (HELD | BUSY | COUNTED), 0);
        // SAFETY: `BUSY` is the caller's: no permit holder reads the key, no releaser moves
        // one out (the last did so before it ended `BUSY`, which the caller's claim read
        // with acquire), and no lock-free acquire counts on the entry before the store
        // below.
        self.key.with_mut(|slot| unsafe { (*slot).write(key) });
        self.hash.store(hash, Ordering::Relaxed);
        // The next generation (wrapping in its field), the slot's `BOUNDED` and `AWAY`, one
        // permit. Release: pairs with a lock-free acquire's load of the state, which then
        // sees the hash (and, once it counts on the entry, the key).
        // The fields are disjoint and `seen`'s `held` and `COUNTED` are zero, so one sum
        // does it (the generation's carry falls off the top of the word).
        let state = seen
            .wrapping_add(GENERATION)
            .wrapping_add(counted | 1)
            .wrapping_sub(away);
        debug_assert_eq!(
            state,
            ((seen & !(AWAY | HELD)).wrapping_add(GENERATION))
                | ((seen & AWAY) - away)
                | counted
                | 1
        );
        self.state.store(state, Ordering::Release);
    }

    /// Fills a new overflow entry, not yet shared, with `key`, one permit and a share of
    /// the word.
    pub(super) fn fill_new(&mut self, key: K, hash: u64) {
        self.key.with_mut(|slot| {
            // SAFETY: the entry is this thread's alone.
            unsafe { (*slot).write(key) };
        });
        self.hash.store(hash, Ordering::Relaxed);
        self.state
            .store(GENERATION | COUNTED | 1, Ordering::Relaxed);
    }
}

/// One lock, the overflow entries of the keys that hash to it, and which of its slots
/// are occupied.
pub(super) struct Shard<K> {
    /// Bit `i` is set while slot `i` holds an entry away from its home (its key's window
    /// starts at another slot). Written only under the lock, where it is exact: such an
    /// entry is filled and emptied only under the lock. Read without the lock as a hint of
    /// which slots other than its home a key's acquire should look at.
    pub(super) away: AtomicU32,
    pub(super) table: Mutex<HashTable<EntryPtr<K>>>,
}

/// The `place` of an overflow entry.
pub(super) const BOXED: u8 = u8::MAX;

/// The window's slots among `occupied` (bit `i` for the window's `i`-th slot), from
/// the slot at `start`.
#[inline(always)]
pub(super) fn window_bits(occupied: u32, start: usize) -> u32 {
    let twice = u64::from(occupied) | u64::from(occupied) << SLOTS;
    (twice >> start) as u32 & ((1 << WINDOW) - 1)
}

/// An overflow entry's address as the shard table stores it. Only tables hold these, so
/// an `&EntryPtr` is reachable only through a locked shard.
pub(super) struct EntryPtr<K>(pub(super) NonNull<Entry<K>>);

impl<K> EntryPtr<K> {
    /// The entry, for as long as the table (and so its lock guard) is borrowed.
    pub(super) fn get(&self) -> &Entry<K> {
        // SAFETY: an overflow entry is freed only after it is removed from its table,
        // under the table's lock; this `EntryPtr` is still in a table that the caller
        // borrows through that lock's guard, so the entry is live for the borrow.
        unsafe { self.0.as_ref() }
    }
}

/// The slot at which a key's window starts, its home, among its shard's.
#[inline(always)]
pub(super) fn home(hash: u64) -> usize {
    (hash >> 16) as usize & (SLOTS - 1)
}

/// What `raise_away` did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Raise {
    /// One was added.
    Raised,
    /// `AWAY` is at its maximum: nothing was added.
    Full,
    /// The slot is being filled or emptied: nothing was added. The caller lets go of the
    /// lock, waits for the slot, and starts over.
    Busy,
}

/// Adds one to `home`'s `AWAY`, under the shard lock (where every change of `AWAY` is
/// made), unless the slot is busy: a fill ends with a store, which must not meet a change.
/// Relaxed: being a read-modify-write of the state is what orders it with a claim of the
/// slot (which expects `AWAY` zero); the rest is ordered by the lock.
pub(super) fn raise_away<K>(home: &Entry<K>) -> Raise {
    let mut state = home.state.load(Ordering::Relaxed);
    loop {
        if state & BUSY != 0 {
            return Raise::Busy;
        }
        if state & AWAY == AWAY {
            return Raise::Full;
        }
        match home.state.compare_exchange_weak(
            state,
            state + AWAY_ONE,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => return Raise::Raised,
            Err(actual) => state = actual,
        }
    }
}

/// Takes one from `home`'s `AWAY`, under the shard lock. The slot is not busy: it has a
/// key away (this one), so no fill starts in it without the lock, and its own key's last
/// release takes the lock (see `KeyedPermit::release`). Relaxed: as `raise_away`.
pub(super) fn lower_away<K>(home: &Entry<K>) {
    let before = home.state.fetch_sub(AWAY_ONE, Ordering::Relaxed);
    debug_assert_ne!(before & AWAY, 0);
    debug_assert_eq!(before & BUSY, 0);
}

/// A look's one in its key's home `AWAY` (see `acquire_locked`), given back when this is
/// dropped, by the code or by a panic in the key's `Eq` or `Clone` meanwhile, unless the
/// one is kept (`keep`). Made after the shard lock's guard, so that it is dropped first,
/// under the lock.
pub(super) struct LookAway<'a, K> {
    home: &'a Entry<K>,
    /// Whether the one was added (see `change_away`).
    pub(super) counted: bool,
}

impl<'a, K> LookAway<'a, K> {
    /// The look's one, or `None` if the home is busy (see `Raise::Busy`).
    pub(super) fn raise(home: &'a Entry<K>) -> Option<Self> {
        let counted = match raise_away(home) {
            Raise::Raised => true,
            Raise::Full => false,
            Raise::Busy => return None,
        };
        Some(Self { home, counted })
    }

    /// The one stays: for an entry made away from home, or given back by a fill at home.
    pub(super) fn keep(self) {
        std::mem::forget(self);
    }
}

impl<K> Drop for LookAway<'_, K> {
    fn drop(&mut self) {
        if self.counted {
            lower_away(self.home);
        }
    }
}
