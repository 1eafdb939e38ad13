//! The keyed ledger: at most `cap` permits in flight per key.
//!
//! # Design
//!
//! Keys live in a fixed number of shards. Each shard has a `parking_lot` mutex, 32 inline
//! *slots* (entries that live as long as the ledger) and, behind the mutex, a
//! `hashbrown::HashTable` of boxed *overflow* entries for keys whose slots were taken.
//! An entry is `{ state, hash, key }`, and `state` is one word: the top 24 bits the
//! entry's generation (how many times it was filled), the low 40 bits `held`, the key's
//! permits in flight. An entry is occupied exactly while its key has a permit in flight:
//! the acquire that finds no entry fills one (a free slot of the eight in the key's
//! window, else a new overflow entry), and the release that takes `held` to zero empties
//! it, both under the shard lock. So there is never a second entry for a key (which would
//! double its cap), memory beyond the fixed slots follows the keys with work in flight,
//! and no background sweeper is needed. Each shard keeps a mask of its occupied slots,
//! written under its lock: under the lock it is exact, so a search of the window reads
//! only the occupied slots and finds the first free one in the mask; without the lock it
//! is a hint of which slots to look at.
//!
//! The lock-free paths, for a key that already has an entry in a slot:
//!
//! - *Acquire* hashes the key and probes its window without the lock: the window's
//!   first slot, where keys most often are, then the others the mask shows occupied. At
//!   a slot whose `held` is above zero and whose hash is the key's, one compare-exchange
//!   `state -> state + 1`, from the state read before the hash, takes a permit; the
//!   generation makes it fail if the slot was emptied and refilled since. Only then is
//!   the key compared (the count keeps the entry from being emptied, so its key cannot
//!   change): if it is another key's, which takes two keys with equal 64-bit hashes, the
//!   count is given back as a permit's release. For that instant the other key counts one
//!   permit more than it holds, so an acquire of it might be refused; never admitted past
//!   its cap, which the compare-exchange checks on the very value it replaces.
//!   A key at its cap is refused under the lock, where its key can be compared first.
//! - *Release* of a permit that is not its key's last is one compare-exchange
//!   `held -> held - 1`. Only `held` going from 1 to 0 takes the lock, so a count never
//!   leaves or reaches zero outside it: under the lock, "occupied" (`held > 0`) is
//!   stable, and the key of an occupied entry may be read.
//!
//! Everything else (a key with no entry, an overflow entry, a key at its cap, `in_flight`)
//! takes the lock. The orderings: filling an entry writes the key and the hash, then
//! stores the new generation and `held = 1` with release; the lock-free acquire loads
//! the state with acquire (and reloads it with acquire when its compare-exchange fails),
//! so the hash it compares and the key it reads are that generation's (every later write
//! of `state` is a read-modify-write, in that store's release sequence, until the entry
//! is emptied). Emptying: every decrement is a release and the one that reaches zero an
//! acquire, so every holder's reads of the key happen before the key is taken out. loom
//! fails a model when any one of these is weakened.
//!
//! Lifetime: as for the other ledgers (see `raw`), one word is the reference count:
//!
//! ```text
//!   bit 63      OWNER: the ledger's handles
//!   bits 0-39   entries (keys with a permit in flight, or being admitted)
//! ```
//!
//! Each entry, not each permit, holds one share, so the word is touched only when a key
//! appears or disappears, never on the acquire and release of a key already present.
//! The entries field is also what `keys()` reads and what `max_keys` is checked against,
//! so it must drop in the same critical section that empties the entry: otherwise an
//! acquire of the same key, arriving between the emptying and the decrement, would find
//! no entry yet still count the old one, and be refused by `max_keys` for a key that is
//! not there. But once the entry's share is given up, another thread may bring the word
//! to zero and free the ledger, shard locks included, while this one still holds its
//! shard's lock. So whoever brings the word to zero takes and releases every shard lock
//! before the free (`quiesce`: 64 lock and unlock pairs, once in a ledger's life), which
//! waits out any such critical section and orders all of it before the free.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use crate::limit;
use crate::raw::{self, Counted, Owner, OWNER};
use crate::sync::{wait_while, Arc, AtomicU32, AtomicU64, Mutex, Ordering, Track, UnsafeCell};
use crate::{CapacityError, Refused};

/// Number of shards: a power of two. More shards than cores keep two threads on
/// different keys from meeting on a lock; 64 cache-padded mutexes cost 8 KiB a ledger.
#[cfg(not(admission_loom))]
const SHARDS: usize = 64;
/// Under loom, two shards: models use one or two keys.
#[cfg(admission_loom)]
const SHARDS: usize = 2;

/// Inline slots per shard (a power of two), and how many of them a key may use: its
/// window, starting at a slot chosen by its hash. 2,048 slots a ledger (64 KiB for `u64`
/// keys, 144 KiB for [`Key`](crate::Key)s, allocated once with the ledger): a thousand keys
/// in flight at once find a slot all but about one in two hundred times.
#[cfg(not(any(admission_loom, miri)))]
const SLOTS: usize = 32;
#[cfg(not(any(admission_loom, miri)))]
const WINDOW: usize = 8;
/// Under Miri, which interprets every slot's construction, four a shard.
#[cfg(all(miri, not(admission_loom)))]
const SLOTS: usize = 4;
#[cfg(all(miri, not(admission_loom)))]
const WINDOW: usize = 2;
/// Under loom, two slots a shard, both in every key's window.
#[cfg(admission_loom)]
const SLOTS: usize = 2;
#[cfg(admission_loom)]
const WINDOW: usize = 2;

/// The largest per-key cap.
const MAX_CAP: usize = usize::MAX >> 2;

/// The `held` field of an entry's state: a key's permits in flight. A key holds at most
/// this many at once whatever its cap (2^40 - 1: more permits than memory can hold).
const HELD: u64 = (1 << 40) - 1;
/// Set in a slot's state while the release of its key's last permit empties it, without
/// the lock: from the decrement of `held` to zero until the key is out and the entry no
/// longer counted. Only that releaser writes the slot meanwhile; anyone else who needs
/// the slot empty (a fill, a look for the same key under the lock, the free) waits.
const BUSY: u64 = HELD + 1;
/// One in the generation field of an entry's state (its top 23 bits): a slot's count of
/// fills, so that a lock-free acquire cannot mistake a refilled slot for the one it read.
const GENERATION: u64 = BUSY << 1;
/// Whether a lock-free acquire for a key of `hash` counts on an entry of hash `found`:
/// when the two are equal (then the key is compared once the count is taken), or under
/// loom always (`EVERY_SLOT`).
#[inline(always)]
fn candidate(found: u64, hash: u64) -> bool {
    EVERY_SLOT || found == hash
}

/// Under loom every occupied slot is a candidate, so that the models take the path where
/// an acquire counts on another key's entry and gives the count back (otherwise taken
/// only for two keys whose 64-bit hashes are equal).
const EVERY_SLOT: bool = cfg!(admission_loom);

/// The entries field of the word (see the module docs).
const KEYS: u64 = (1 << 40) - 1;
/// The largest `max_keys`: the entries field's maximum.
const MAX_KEYS: usize = KEYS as usize;

/// A limit on how many permits each key may hold at once.
///
/// For per-client fairness: one authenticated subject, client address or tenant cannot
/// take more than `cap` of the server's in-flight work, however fast it sends. Memory is
/// 2,048 entries allocated with the ledger (64 KiB for `u64` keys), and beyond them
/// proportional to the keys that have a permit in flight now; an optional
/// [`max_keys`](Self::set_max_keys) bounds even that, so a client spraying fresh keys
/// cannot grow the table without limit.
///
/// A key with work in flight is usually admitted and released without a lock: one
/// compare-exchange each way, after the hash.
///
/// The hasher is a type parameter as in `HashMap`; the default `RandomState` resists
/// hash flooding, which matters when keys come from clients.
///
/// # Examples
///
/// ```
/// use admission_core::{KeyedLedger, Refused};
///
/// let ledger = KeyedLedger::new(2)?;
/// let a1 = ledger.try_acquire(&"alice")?;
/// let a2 = ledger.try_acquire(&"alice")?;
/// assert_eq!(ledger.try_acquire(&"alice").unwrap_err(), Refused::Key);
/// let b1 = ledger.try_acquire(&"bob")?;
/// assert_eq!(ledger.keys(), 2);
///
/// drop((a1, a2, b1));
/// assert_eq!(ledger.keys(), 0, "entries go with their last permit");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KeyedLedger<K, S = RandomState> {
    owner: Arc<Owner<KeyedInner<K, S>>>,
}

impl<K, S> Clone for KeyedLedger<K, S> {
    fn clone(&self) -> Self {
        Self {
            owner: self.owner.clone(),
        }
    }
}

struct KeyedInner<K, S> {
    /// `OWNER` | entries (see the module docs).
    state: CachePadded<AtomicU64>,
    cap: AtomicU64,
    max_keys: AtomicU64,
    refused_key: AtomicU64,
    refused_table: AtomicU64,
    keys_high_water: AtomicU64,
    hasher: S,
    shards: Box<[CachePadded<Shard<K>>; SHARDS]>,
    /// `SLOTS` inline entries for each shard.
    slots: Box<[[Entry<K>; SLOTS]; SHARDS]>,
    track: Track,
}

/// A key's entry: one of the shard's slots, or a boxed overflow entry in its table.
struct Entry<K> {
    /// The generation, `BUSY` and `held` (see `GENERATION`, `BUSY`, `HELD` and the module
    /// docs). `held` leaves zero only under the shard lock; it reaches zero under the lock
    /// for an overflow entry, and for a slot by the compare-exchange that sets `BUSY`.
    state: AtomicU64,
    /// The key's hash. Written when the entry is filled, under the shard lock, before its
    /// state; read by a lock-free acquire after an acquire load of the state, by the
    /// holder of one of its permits, or under the lock.
    hash: AtomicU64,
    /// The slot's place among its shard's slots, or `BOXED` for an overflow entry (freed
    /// when emptied; a slot is kept). Never changes.
    place: u8,
    /// The key, initialised exactly while `held > 0` (and, in a slot, while `BUSY`, until
    /// its releaser moves it out). Written only under the shard lock with the slot empty;
    /// read under the lock, or by a holder of one of its permits.
    key: UnsafeCell<MaybeUninit<K>>,
    _track: Track,
}

impl<K> Entry<K> {
    fn empty() -> Self {
        Self {
            state: AtomicU64::new(0),
            hash: AtomicU64::new(0),
            place: BOXED,
            key: UnsafeCell::new(MaybeUninit::uninit()),
            _track: Track::new(),
        }
    }

    /// The key.
    ///
    /// # Safety
    ///
    /// The entry is occupied (`held > 0`) and stays so for the borrow: the caller holds
    /// one of its permits (a count in `held`), or holds the shard lock meanwhile.
    unsafe fn key(&self) -> &K {
        // SAFETY: the key is initialised while `held > 0` and written only when
        // `held == 0` under the lock; the caller keeps `held > 0` for `'a`, and that
        // this read sees the initialised key is ordered by the lock or by the acquire
        // that took the caller's count (see the module docs).
        self.key.with(|key| unsafe { (*key).assume_init_ref() })
    }

    /// Fills an empty slot with `key` and one permit.
    ///
    /// # Safety
    ///
    /// Under the shard lock, with `held == 0`.
    unsafe fn fill(&self, key: K, hash: u64) {
        debug_assert_eq!(self.state.load(Ordering::Relaxed) & (HELD | BUSY), 0);
        // SAFETY: empty under the lock: no permit holder reads the key, no releaser moves
        // one out (the last did so before the store, seen by an acquire under this lock or
        // an earlier one, that ended `BUSY`), and no lock-free acquire can count on the
        // entry before the store below.
        self.key.with_mut(|slot| unsafe { (*slot).write(key) });
        self.hash.store(hash, Ordering::Relaxed);
        // The next generation (wrapping in its field), one permit. Release: a lock-free
        // acquire that loads this state sees the hash, and one that counts on it the key.
        let generation = self.state.load(Ordering::Relaxed) & !(HELD | BUSY);
        self.state
            .store(generation.wrapping_add(GENERATION) | 1, Ordering::Release);
    }
}

/// One lock, the overflow entries of the keys that hash to it, and which of its slots
/// are occupied.
struct Shard<K> {
    /// Bit `i` is set while slot `i` is occupied, and may stay set a while after: the
    /// fill sets it under the lock, the last release empties a slot without the lock and
    /// leaves it, and whoever next looks at the window under the lock clears it. Written
    /// only under the lock, where a clear bit means an empty slot (a slot is filled only
    /// under the lock) and a set bit a slot to look at; read without the lock only as a
    /// hint of which slots to look at (a slot filled or emptied meanwhile is found so by
    /// its own state, or else under the lock).
    occupied: AtomicU32,
    table: Mutex<HashTable<EntryPtr<K>>>,
}

/// The `place` of an overflow entry.
const BOXED: u8 = u8::MAX;

/// The window's slots among `occupied` (bit `i` for the window's `i`-th slot), from
/// the slot at `start`.
#[inline(always)]
fn window_bits(occupied: u32, start: usize) -> u32 {
    let twice = u64::from(occupied) | u64::from(occupied) << SLOTS;
    (twice >> start) as u32 & ((1 << WINDOW) - 1)
}

/// The inverse of `window_bits`: the shard's slots (bit `place`) that the window bits
/// `bits` from `start` stand for.
fn shard_bits(bits: u32, start: usize) -> u32 {
    let wide = u64::from(bits) << start;
    (wide | wide >> SLOTS) as u32 & (u32::MAX >> (32 - SLOTS))
}

/// An overflow entry's address as the shard table stores it. Only tables hold these, so
/// an `&EntryPtr` is reachable only through a locked shard.
struct EntryPtr<K>(NonNull<Entry<K>>);

impl<K> EntryPtr<K> {
    /// The entry, for as long as the table (and so its lock guard) is borrowed.
    fn get(&self) -> &Entry<K> {
        // SAFETY: an overflow entry is freed only after it is removed from its table,
        // under the table's lock; this `EntryPtr` is still in a table that the caller
        // borrows through that lock's guard, so the entry is live for the borrow.
        unsafe { self.0.as_ref() }
    }
}

impl<K, S> Counted for KeyedInner<K, S> {
    fn word(&self) -> &AtomicU64 {
        &self.state
    }

    fn track(&self) -> &Track {
        &self.track
    }

    /// A releaser gives up its entry's share under its shard lock, or while its slot is
    /// `BUSY` (see the module docs): taking each lock once, and seeing each slot not busy,
    /// waits out any such step still running. Acquire: the releaser's store that ends
    /// `BUSY` is its last use of the ledger, and happens before the free.
    fn quiesce(&self) {
        for shard in self.shards.iter() {
            drop(shard.table.lock());
        }
        for slot in self.slots.iter().flatten() {
            wait_while(|| slot.state.load(Ordering::Acquire) & BUSY != 0);
        }
    }
}

impl<K, S> KeyedInner<K, S> {
    fn shard_index(hash: u64) -> usize {
        // Bits 32.. choose the shard; hashbrown uses the low bits for the bucket and the
        // top seven for its control bytes, the window starts at bits 16.., and the tag is
        // the top 24: the shard stays independent of all of them.
        (hash >> 32) as usize & (SHARDS - 1)
    }

    fn shard(&self, hash: u64) -> &CachePadded<Shard<K>> {
        &self.shards[Self::shard_index(hash)]
    }

    /// The slots a key may use: `WINDOW` of its shard's, from the one at the place this
    /// returns. The `i`-th is at `(start + i) % SLOTS`.
    #[inline(always)]
    fn window(&self, hash: u64) -> (&CachePadded<Shard<K>>, &[Entry<K>; SLOTS], usize) {
        let index = Self::shard_index(hash);
        let start = (hash >> 16) as usize & (SLOTS - 1);
        (&self.shards[index], &self.slots[index], start)
    }
}

/// What a lock-free look at one slot found: a permit on the key's entry, the key at its
/// cap (refused under the lock), or another key's entry or none.
enum Probe<K, S> {
    Permit(KeyedPermit<K, S>),
    AtCap,
    Other,
}

/// What `find` found: a count on the key's slot (as a permit) and the key's `held` before
/// it, the key's overflow entry, or that it has none (and the place of its first free
/// slot).
enum Found<K, S> {
    Slot(KeyedPermit<K, S>, u64),
    Boxed(NonNull<Entry<K>>),
    Absent(Option<usize>),
}

/// What a look at one slot under the lock found: nothing (once any release emptying it is
/// done), another key's entry by its hash, or a count taken on it whichever key it holds
/// (as a permit) and its `held` before the count.
enum Look<K, S> {
    Empty,
    Other,
    Counted(KeyedPermit<K, S>, u64),
}

impl<K: Hash + Eq + Clone> KeyedLedger<K, RandomState> {
    /// A ledger admitting at most `cap` permits per key; 0 means unlimited per key.
    ///
    /// # Errors
    ///
    /// [`CapacityError`] if `cap` is above [`MAX_CAP`](Self::MAX_CAP).
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::KeyedLedger;
    ///
    /// let ledger = KeyedLedger::<u64>::new(4)?;
    /// assert_eq!(ledger.cap(), 4);
    /// assert!(KeyedLedger::<u64>::new(usize::MAX).is_err());
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn new(cap: usize) -> Result<Self, CapacityError> {
        Self::with_hasher(cap, RandomState::new())
    }
}

impl<K: Hash + Eq + Clone, S: BuildHasher> KeyedLedger<K, S> {
    /// The largest per-key cap a keyed ledger accepts.
    pub const MAX_CAP: usize = MAX_CAP;

    /// The largest `max_keys` a keyed ledger accepts: 2^40 - 1.
    pub const MAX_KEYS: usize = MAX_KEYS;

    /// A ledger with a given hasher builder, as `HashMap::with_hasher`.
    ///
    /// # Errors
    ///
    /// [`CapacityError`] if `cap` is above [`MAX_CAP`](Self::MAX_CAP).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::collections::hash_map::RandomState;
    /// use admission_core::KeyedLedger;
    ///
    /// let ledger = KeyedLedger::<String, _>::with_hasher(1, RandomState::new())?;
    /// let _p = ledger.try_acquire(&"tenant-a".to_string())?;
    /// assert_eq!(ledger.in_flight(&"tenant-a".to_string()), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_hasher(cap: usize, hasher: S) -> Result<Self, CapacityError> {
        Self::with_limits(cap, 0, hasher)
    }

    /// A ledger with a per-key `cap` (0: unlimited), at most `max_keys` distinct keys
    /// with work in flight (0: no bound), and a hasher builder.
    ///
    /// # Errors
    ///
    /// [`CapacityError`] if `cap` is above [`MAX_CAP`](Self::MAX_CAP) or `max_keys`
    /// above [`MAX_KEYS`](Self::MAX_KEYS).
    ///
    /// ```
    /// use std::collections::hash_map::RandomState;
    /// use admission_core::{KeyedLedger, Refused};
    ///
    /// let ledger = KeyedLedger::with_limits(4, 1, RandomState::new())?;
    /// let _a = ledger.try_acquire(&"a")?;
    /// assert_eq!(ledger.try_acquire(&"b").unwrap_err(), Refused::KeyTable);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_limits(cap: usize, max_keys: usize, hasher: S) -> Result<Self, CapacityError> {
        let cap = encode_limit(cap)?;
        let max_keys = limit::encode(max_keys as u64, MAX_KEYS as u64)?;
        let shards = boxed_array(|_| {
            CachePadded::new(Shard {
                occupied: AtomicU32::new(0),
                table: Mutex::new(HashTable::new()),
            })
        });
        let slots = boxed_array(|_| {
            std::array::from_fn(|place| Entry {
                place: place as u8,
                ..Entry::empty()
            })
        });
        let inner = KeyedInner {
            state: CachePadded::new(AtomicU64::new(OWNER)),
            cap: AtomicU64::new(cap),
            max_keys: AtomicU64::new(max_keys),
            refused_key: AtomicU64::new(0),
            refused_table: AtomicU64::new(0),
            keys_high_water: AtomicU64::new(0),
            hasher,
            shards,
            slots,
            track: Track::new(),
        };
        Ok(Self {
            owner: Arc::new(Owner::new(inner)),
        })
    }

    #[inline]
    fn inner(&self) -> &KeyedInner<K, S> {
        self.owner.get()
    }

    /// Takes one permit for `key` if it holds fewer than `cap`, else refuses at once.
    ///
    /// Never blocks beyond one short critical section on the key's shard, and takes none
    /// when `key` already has a permit in flight in one of its slots (one compare-exchange).
    /// A new key is cloned into a free slot, or, when its slots are taken, into an entry
    /// of its own (the only allocation).
    ///
    /// # Errors
    ///
    /// [`Refused::Key`] when `key` is at its cap; [`Refused::KeyTable`] when `key` is new
    /// and [`max_keys`](Self::set_max_keys) keys already have work in flight.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::{KeyedLedger, Refused};
    ///
    /// let ledger = KeyedLedger::new(1)?;
    /// let _a = ledger.try_acquire(&10_u32)?;
    /// assert_eq!(ledger.try_acquire(&10).unwrap_err(), Refused::Key);
    /// assert!(ledger.try_acquire(&11).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire(&self, key: &K) -> Result<KeyedPermit<K, S>, Refused> {
        let (permit, keys) = self.try_acquire_unobserved(key, None)?;
        if let Some(keys) = keys {
            self.observe(keys);
        }
        Ok(permit)
    }

    /// Takes one permit for `key` if it holds fewer than `cap`, the cap chosen for this
    /// key by the caller (a tenant's tier: a paying tenant 32, a free one 4) in place of
    /// the ledger's [`cap`](Self::cap); else refuses at once. The same table, the same
    /// reclaim guarantees, the same `max_keys`.
    ///
    /// `cap` is the cap itself: 0 admits nothing for this key (a blocked tenant), and
    /// `u64::MAX` is no cap. Each acquisition checks the cap it is given: after a key's
    /// tier changes, its permits in flight are kept and count against the new cap.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::{KeyedLedger, Refused};
    ///
    /// let ledger = KeyedLedger::new(1)?; // the default tier
    /// let tier = |tenant: &str| if tenant.starts_with("paid-") { 3 } else { 1 };
    /// let paid: Vec<_> = (0..3).map(|_| ledger.try_acquire_with_cap(&"paid-a", tier("paid-a"))).collect::<Result<_, _>>()?;
    /// assert_eq!(ledger.try_acquire_with_cap(&"paid-a", 3).unwrap_err(), Refused::Key);
    /// let _free = ledger.try_acquire_with_cap(&"free-b", tier("free-b"))?;
    /// assert_eq!(ledger.try_acquire_with_cap(&"free-b", 1).unwrap_err(), Refused::Key);
    /// # drop(paid);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire_with_cap(&self, key: &K, cap: u64) -> Result<KeyedPermit<K, S>, Refused> {
        let (permit, keys) = self.try_acquire_unobserved(key, Some(cap))?;
        if let Some(keys) = keys {
            self.observe(keys);
        }
        Ok(permit)
    }

    /// Takes a permit on `key`'s slot without the lock, if it has one, is below `cap`,
    /// and nothing is in the way (see the module docs); `None` sends the caller to the
    /// lock. Never refuses: a key at its cap is refused under the lock.
    #[inline]
    fn acquire_slot(&self, key: &K, hash: u64, cap: u64) -> Option<KeyedPermit<K, S>> {
        let (shard, slots, start) = self.inner().window(hash);
        // The window's first slot, where a key finds a free slot most often, before the
        // shard's mask of the others (a hint: see `Shard::occupied`).
        match self.acquire_on(&slots[start], key, hash, cap) {
            Probe::Permit(permit) => return Some(permit),
            Probe::AtCap => return None,
            Probe::Other => {}
        }
        let mut rest = window_bits(shard.occupied.load(Ordering::Relaxed), start) & !1;
        while rest != 0 {
            let entry = &slots[(start + rest.trailing_zeros() as usize) & (SLOTS - 1)];
            rest &= rest - 1;
            match self.acquire_on(entry, key, hash, cap) {
                Probe::Permit(permit) => return Some(permit),
                Probe::AtCap => return None,
                Probe::Other => {}
            }
        }
        None
    }

    /// A permit on `entry` if it holds `key` below `cap`, without the lock.
    #[inline(always)]
    fn acquire_on(&self, entry: &Entry<K>, key: &K, hash: u64, cap: u64) -> Probe<K, S> {
        // Acquire: the hash read next is this generation's (or a later one's, and then
        // the state has moved on and the compare-exchange fails), and so is the key read
        // once the count is taken.
        let mut state = entry.state.load(Ordering::Acquire);
        loop {
            let held = state & HELD;
            if held == 0 || !candidate(entry.hash.load(Ordering::Relaxed), hash) {
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
        let permit = KeyedPermit {
            inner: self.owner.ptr(),
            entry: NonNull::from(entry),
        };
        if permit.key() == key {
            return Probe::Permit(permit);
        }
        // Another key's entry (their hashes are equal): give the count back, as its
        // permit.
        give_back(permit);
        Probe::Other
    }

    /// `try_acquire` without recording the keys high-water mark: the permit and, when it
    /// created the key's entry, the number of keys it brought the ledger to (see
    /// `CountLedger::try_acquire_unobserved`), against `cap` if given, else the ledger's
    /// cap. A refusal is counted here.
    #[inline]
    pub(crate) fn try_acquire_unobserved(
        &self,
        key: &K,
        cap: Option<u64>,
    ) -> Result<(KeyedPermit<K, S>, Option<u64>), Refused> {
        let inner = self.inner();
        if cap == Some(0) {
            // A key given no share at all: refused before its entry could be created.
            inner.refused_key.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::Key);
        }
        let hash = inner.hasher.hash_one(key);
        // One below `HELD`: room for the count `look` takes to compare a key at its cap.
        let cap = cap
            .unwrap_or_else(|| inner.cap.load(Ordering::Relaxed))
            .min(HELD - 1);
        match self.acquire_slot(key, hash, cap) {
            Some(permit) => Ok((permit, None)),
            None => self.acquire_locked(key, hash, cap),
        }
    }

    /// `key`'s entry, or else the place of the first free slot of its window, under the
    /// lock whose guard `table` is. A slot's last permit is released without the lock, so
    /// a slot's key is compared only under a count taken on it, as without the lock (see
    /// `look`); the count on the key's own slot is returned as a permit. An overflow
    /// entry's address is the one its table holds (the allocation's own, which the entry's
    /// free needs), never one made from a borrow.
    fn find(&self, table: &HashTable<EntryPtr<K>>, key: &K, hash: u64) -> Found<K, S> {
        let (shard, slots, start) = self.inner().window(hash);
        // Under the lock, a clear bit is an empty slot; a set one is looked at.
        let occupied = shard.occupied.load(Ordering::Relaxed);
        let mut rest = window_bits(occupied, start);
        let (mut live, mut emptied) = (0_u32, 0_u32);
        // Slots found emptied since their bits were set: their bits are cleared, so that
        // lock-free acquires pass them by again.
        let clear = |emptied: u32| {
            if emptied != 0 {
                let emptied = shard_bits(emptied, start);
                shard
                    .occupied
                    .store(occupied & !emptied, Ordering::Relaxed);
            }
        };
        while rest != 0 {
            let i = rest.trailing_zeros();
            rest &= rest - 1;
            match self.look(&slots[(start + i as usize) & (SLOTS - 1)], hash) {
                Look::Empty => emptied |= 1 << i,
                Look::Other => live |= 1 << i,
                Look::Counted(permit, held) => {
                    if permit.key() == key {
                        clear(emptied);
                        return Found::Slot(permit, held);
                    }
                    give_back(permit);
                    live |= 1 << i;
                }
            }
        }
        clear(emptied);
        if !table.is_empty() {
            let overflow = table.find(hash, |e| {
                // SAFETY: an overflow entry is occupied while in its table, and its last
                // permit is released under the lock.
                let found = unsafe { e.get().key() };
                found == key
            });
            if let Some(entry) = overflow {
                return Found::Boxed(entry.0);
            }
        }
        let free = !live & ((1 << WINDOW) - 1);
        Found::Absent((free != 0).then(|| (start + free.trailing_zeros() as usize) & (SLOTS - 1)))
    }

    /// One slot of a key's window, under the shard lock (see `Look`). A slot being
    /// emptied is waited for: it may be the key's, which is not gone (nor its entry
    /// uncounted) until the slot is empty. The count is taken whatever the cap, to compare
    /// the key; it is never above `HELD` (caps stop at `HELD - 1`, and the lock holder
    /// takes one count at a time), and whoever holds the lock gives it back or keeps it as
    /// a permit below the cap before unlocking: a lock-free acquire that meets the count
    /// at the cap comes to the lock, and finds it gone.
    fn look(&self, entry: &Entry<K>, hash: u64) -> Look<K, S> {
        // Acquire: a releaser's move of the key out happens before a fill of the slot
        // here, and a lock-free release before the key is compared.
        let mut state = entry.state.load(Ordering::Acquire);
        loop {
            if state & BUSY != 0 {
                wait_while(|| {
                    state = entry.state.load(Ordering::Acquire);
                    state & BUSY != 0
                });
            }
            let held = state & HELD;
            if held == 0 {
                return Look::Empty;
            }
            if !candidate(entry.hash.load(Ordering::Relaxed), hash) {
                return Look::Other;
            }
            match entry.state.compare_exchange_weak(
                state,
                state + 1,
                Ordering::Relaxed,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    let permit = KeyedPermit {
                        inner: self.owner.ptr(),
                        entry: NonNull::from(entry),
                    };
                    return Look::Counted(permit, held);
                }
                Err(actual) => state = actual,
            }
        }
    }

    /// `try_acquire_unobserved` under the shard lock: a key without an entry in a slot,
    /// or at its cap. Out of line, so that the lock-free path stays small.
    #[inline(never)]
    fn acquire_locked(
        &self,
        key: &K,
        hash: u64,
        cap: u64,
    ) -> Result<(KeyedPermit<K, S>, Option<u64>), Refused> {
        let inner = self.inner();
        let permit = |entry| KeyedPermit {
            inner: self.owner.ptr(),
            entry,
        };
        #[cfg(test)]
        locked::count();
        let shard = inner.shard(hash);
        let mut table = shard.table.lock();
        let free = match self.find(&table, key, hash) {
            Found::Absent(free) => free,
            Found::Slot(permit, held) => {
                if held < cap {
                    return Ok((permit, None));
                }
                // At its cap: the count taken to compare the key goes back before unlock.
                give_back(permit);
                drop(table);
                inner.refused_key.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::Key);
            }
            Found::Boxed(found) => {
                // SAFETY: found under the lock, which is still held.
                let entry = unsafe { found.as_ref() };
                // Under the lock an overflow entry's `held` stays above zero, but lock-free
                // releases that are not its last may move it meanwhile. Relaxed: the key is
                // ordered by the lock, and this count orders nothing for anyone.
                let below_cap = |state: u64| (state & HELD < cap).then_some(state + 1);
                if entry
                    .state
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, below_cap)
                    .is_err()
                {
                    drop(table);
                    inner.refused_key.fetch_add(1, Ordering::Relaxed);
                    return Err(Refused::Key);
                }
                return Ok((permit(found), None));
            }
        };
        // A new key: take its entry's share of the word first, so `max_keys` is checked
        // across shards (and the entry keeps the ledger alive once it exists).
        // Relaxed: the increment is made through our live handle (see `raw`). `keys` is
        // below `MAX_KEYS` (checked against `max_keys`, or bounded by memory: every entry
        // holds a key), so `+ 1` stays in the entries field.
        let max_keys = inner.max_keys.load(Ordering::Relaxed);
        let below_max = |word: u64| (word & KEYS < max_keys).then_some(word + 1);
        let keys = match inner
            .state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, below_max)
        {
            Ok(word) => (word & KEYS) + 1,
            Err(_) => {
                drop(table);
                inner.refused_table.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::KeyTable);
            }
        };
        let entry = match free {
            Some(place) => {
                let slot = &inner.slots[KeyedInner::<K, S>::shard_index(hash)][place];
                // SAFETY: under the lock, and the slot is empty (found so under this
                // lock, not busy: `held` leaves zero only under the lock).
                unsafe { slot.fill(key.clone(), hash) };
                let occupied = shard.occupied.load(Ordering::Relaxed);
                shard
                    .occupied
                    .store(occupied | 1 << place, Ordering::Relaxed);
                NonNull::from(slot)
            }
            None => {
                let entry = raw::alloc(Entry::empty());
                // SAFETY: a new entry, not yet shared.
                unsafe { entry.as_ref().fill(key.clone(), hash) };
                table.insert_unique(hash, EntryPtr(entry), |e| {
                    e.get().hash.load(Ordering::Relaxed)
                });
                entry
            }
        };
        Ok((permit(entry), Some(keys)))
    }

    /// Permits held for `key` now.
    ///
    /// ```
    /// use admission_core::KeyedLedger;
    ///
    /// let ledger = KeyedLedger::new(3)?;
    /// let _p = ledger.try_acquire(&'k')?;
    /// assert_eq!((ledger.in_flight(&'k'), ledger.in_flight(&'j')), (1, 0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_flight(&self, key: &K) -> u64 {
        let inner = self.inner();
        let hash = inner.hasher.hash_one(key);
        let table = inner.shard(hash).table.lock();
        match self.find(&table, key, hash) {
            Found::Slot(permit, held) => {
                give_back(permit);
                held
            }
            // SAFETY: found under the lock, which is still held.
            Found::Boxed(entry) => unsafe { entry.as_ref() }.state.load(Ordering::Relaxed) & HELD,
            Found::Absent(_) => 0,
        }
    }
}

impl<K, S> KeyedLedger<K, S> {
    /// Keys with at least one permit in flight now (the number of entries).
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
        self.owner.get().state.load(Ordering::Relaxed) & KEYS
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
    /// [`Refused::KeyTable`].
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
        self.owner.get().max_keys.store(max_keys, Ordering::Relaxed);
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
        (self.owner.get().max_keys).store(limit::UNLIMITED, Ordering::Relaxed);
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
    /// assert_eq!((snap.keys, snap.cap, snap.refused_key), (1, 1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot(&self) -> KeyedSnapshot {
        let inner = self.owner.get();
        KeyedSnapshot {
            keys: self.keys(),
            cap: self.cap(),
            max_keys: self.max_keys(),
            keys_high_water: inner.keys_high_water.load(Ordering::Relaxed),
            refused_key: inner.refused_key.load(Ordering::Relaxed),
            refused_table: inner.refused_table.load(Ordering::Relaxed),
        }
    }
}

/// Drops a permit a lock-free acquire took on another key's entry: rare (two keys with
/// equal hashes), so out of line, where it costs the hot path nothing.
#[cold]
#[inline(never)]
fn give_back<K, S>(permit: KeyedPermit<K, S>) {
    drop(permit);
}

/// `[f(0), .., f(N - 1)]` on the heap, never on the stack.
fn boxed_array<T, const N: usize>(f: impl FnMut(usize) -> T) -> Box<[T; N]> {
    let all: Box<[T]> = (0..N).map(f).collect();
    match all.try_into() {
        Ok(array) => array,
        Err(_) => unreachable!("N elements were collected"),
    }
}

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
fn usable<T>(table: &HashTable<T>) -> usize {
    let buckets = table.allocation_size() / (std::mem::size_of::<T>() + 1);
    buckets - buckets / 8
}

fn encode_limit(value: usize) -> Result<u64, CapacityError> {
    limit::encode(value as u64, MAX_CAP as u64)
}

impl<K, S> fmt::Debug for KeyedLedger<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLedger")
            .field("keys", &self.keys())
            .field("cap", &self.cap())
            .finish()
    }
}

// SAFETY: the inner state is atomics, `S` (shared, so `Sync` is required) and tables of
// entries that own a `K` each and are freed on whichever thread releases the last permit:
// hence `K: Send + Sync`, as `Arc<Mutex<HashMap<K, _>>>` shared across threads requires.
unsafe impl<K: Send + Sync, S: Send + Sync> Send for KeyedInner<K, S> {}
// SAFETY: as above; the tables are accessed only under their shard lock, and an entry's
// key is written only under the lock while no one may read it (see the module docs).
unsafe impl<K: Send + Sync, S: Send + Sync> Sync for KeyedInner<K, S> {}

/// A read of a [`KeyedLedger`]. Fields are read one by one with relaxed ordering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct KeyedSnapshot {
    /// Keys with at least one permit in flight.
    pub keys: u64,
    /// Per-key cap; 0 means unlimited.
    pub cap: u64,
    /// Bound on distinct keys; 0 means unlimited.
    pub max_keys: u64,
    /// The most keys seen with work in flight at once.
    pub keys_high_water: u64,
    /// Acquisitions refused because the key was at its cap.
    pub refused_key: u64,
    /// Acquisitions refused because the table held `max_keys` keys.
    pub refused_table: u64,
}

/// One of a key's permits in a [`KeyedLedger`], released when dropped.
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
pub struct KeyedPermit<K, S = RandomState> {
    inner: NonNull<KeyedInner<K, S>>,
    entry: NonNull<Entry<K>>,
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
            } else if e.place == BOXED {
                // An overflow entry's last permit: out of its table, under the lock.
                return self.release_locked();
            } else {
                // A slot's last permit: `held` to zero and `BUSY` in one compare-exchange,
                // which makes this thread the slot's only writer until it is empty.
                // Acquire: every other holder's release decrement happens before the key
                // is moved out.
                match e.state.compare_exchange_weak(
                    state,
                    (state - 1) | BUSY,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return self.empty_slot(state - 1),
                    Err(actual) => state = actual,
                }
            }
        }
    }

    /// Empties the slot whose `held` this permit has just taken to zero (its state is
    /// now `empty | BUSY`), and gives up the entry's share of the word; no lock. Out of
    /// line, so that the release of a permit that is not its key's last stays small.
    #[inline(never)]
    fn empty_slot(&mut self, empty: u64) {
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
        // The key leaves the entries field before the slot stops being busy: an acquire of
        // the same key waits for the slot under the lock (see `find`), so it never counts
        // the key twice nor refuses it for `max_keys` on its own account. This gives up
        // the entry's share, so another thread may now bring the word to zero, but its
        // free waits for the slot to stop being busy (`quiesce`), and the store below
        // orders this thread's uses before that free. Release: so that the free's quiesce,
        // after its acquire load of the word, sees this slot busy (or empty again), never
        // as it was before this release.
        let word = inner_ref.state.fetch_sub(1, Ordering::Release);
        // The slot's bit in its shard's mask, cleared while the slot is busy (it cannot be
        // filled, and its bit set, before the store below), so that lock-free acquires pass
        // the slot by again. Relaxed: without the lock the mask is a hint.
        let shard = inner_ref.shard(e.hash.load(Ordering::Relaxed));
        shard.occupied.fetch_and(!(1 << e.place), Ordering::Relaxed);
        // The last use of the ledger's memory: under loom, a free that does not wait for
        // the store below races this.
        inner_ref.track.touch();
        // Empty, not busy: the slot may be filled again (under the lock). Release: the key
        // moved out above happens before the next fill writes another, and this thread's
        // every use of the ledger before its free.
        e.state.store(empty, Ordering::Release);
        if word == 1 {
            // SAFETY: this decrement brought the word to zero; `inner` is not used after.
            unsafe { raw::free(inner) };
        }
        drop(key);
    }

    /// `release` of an overflow entry's permit under the shard lock: perhaps the key's last.
    /// Out of line, so that the lock-free path stays small.
    #[inline(never)]
    fn release_locked(&mut self) {
        #[cfg(test)]
        locked::count();
        let (inner, entry) = (self.inner, self.entry);
        // SAFETY: as in `release`.
        let e = unsafe { entry.as_ref() };
        // SAFETY: the occupied entry's share keeps the ledger alive until its decrement
        // below, and `quiesce` until this thread unlocks.
        let inner_ref = unsafe { inner.as_ref() };
        let hash = e.hash.load(Ordering::Relaxed);
        debug_assert_eq!(e.place, BOXED, "a slot is emptied without the lock");
        let shard = inner_ref.shard(hash);
        let mut table = shard.table.lock();
        // Perhaps the last: under the lock `held` cannot reach zero by anyone else's hand
        // (this permit's count is in it), but lock-free acquires and releases may still move
        // it, so one decrement, and what it replaced says whether it was the last. AcqRel: a
        // release as above, and the decrement to zero an acquire, so that every other
        // holder's release is ordered before the key is taken out.
        let state = e.state.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(
            state & HELD >= 1,
            "a keyed permit outlived its entry's count"
        );
        if state & HELD > 1 {
            return;
        }
        // The key's last permit: empty the entry in the same critical section, so no acquirer
        // ever sees a key with two entries or an entry on its way out.
        // SAFETY: `held` is zero under the lock: no permit holder or lock-free acquire reads
        // the key, and every earlier read is ordered before this one (above). The entry is
        // empty from here, so the key is moved out exactly once.
        let key = e.key.with_mut(|key| unsafe { (*key).assume_init_read() });
        match table.find_entry(hash, |p| p.0 == entry) {
            Ok(found) => {
                found.remove();
            }
            Err(_) => unreachable!("an occupied overflow entry is always in its shard"),
        }
        // The key is gone, so it leaves the entries field now, in the same critical section:
        // an acquire of the same key that follows this unlock must not count it. This gives
        // up the entry's share of the word, so another thread may now bring the word to zero
        // and free the ledger, but not before this thread unlocks: whoever frees it takes
        // every shard lock first (`quiesce`). Relaxed: that lock orders everything this
        // thread did before its unlock (and, through the decrement of `held` above, every
        // other holder's use of this entry) before the free.
        let word = inner_ref.state.fetch_sub(1, Ordering::Relaxed);
        if worth_shrinking(usable(&table), table.len()) {
            let len = table.len();
            table.shrink_to(len * 2, |e| e.get().hash.load(Ordering::Relaxed));
        }
        // The last use of the ledger's memory but the unlock: under loom, a free that does
        // not wait for the unlock races this.
        inner_ref.track.touch();
        drop(table);
        // The key is dropped outside the lock.
        drop(key);
        // SAFETY: the overflow entry is out of its table and empty, and nothing refers to it
        // any more (its last count was this one); it came from `raw::alloc`.
        drop(unsafe { Box::from_raw(entry.as_ptr()) });
        #[cfg(test)]
        raw::live::change(-1);
        if word == 1 {
            // SAFETY: this decrement brought the word to zero; `inner` is not used after.
            unsafe { raw::free(inner) };
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

/// Unit tests count this thread's acquisitions and releases that took the shard lock, to
/// see which path an operation took.
#[cfg(test)]
mod locked {
    use std::cell::Cell;

    thread_local!(static LOCKED: Cell<u64> = const { Cell::new(0) });

    pub(super) fn count() {
        LOCKED.with(|locked| locked.set(locked.get() + 1));
    }

    /// Operations on this thread that took a shard lock so far.
    #[cfg_attr(admission_loom, allow(dead_code))] // The loom build has no unit tests.
    pub(super) fn so_far() -> u64 {
        LOCKED.with(Cell::get)
    }
}

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use super::*;

    /// The last permit and the last handle dropped on two threads at once, with no join
    /// between them: whichever drop is last frees the ledger, and every use by the other
    /// thread must happen before that free. Under Miri, weakening the release decrement
    /// or the acquire load on the free path makes this a reported data race.
    #[test]
    fn the_last_permit_and_the_last_handle_dropped_on_two_threads_free_after_every_use() {
        for _ in 0..if cfg!(miri) { 8 } else { 1_000 } {
            let ledger = KeyedLedger::new(2).unwrap();
            let permit = ledger.try_acquire(&1_u8).unwrap();
            let t = std::thread::spawn(move || drop(permit));
            drop(ledger);
            t.join().unwrap();
        }
    }

    #[test]
    fn bounds() {
        fn is_send_sync_unpin<T: Send + Sync + Unpin + 'static>() {}
        is_send_sync_unpin::<KeyedLedger<String>>();
        is_send_sync_unpin::<KeyedPermit<String>>();
    }

    #[test]
    fn per_key_cap_refuses_one_key_and_admits_another() {
        let ledger = KeyedLedger::new(2).unwrap();
        let a = [
            ledger.try_acquire(&1).unwrap(),
            ledger.try_acquire(&1).unwrap(),
        ];
        assert_eq!(ledger.try_acquire(&1).unwrap_err(), Refused::Key);
        let b = ledger.try_acquire(&2).unwrap();
        assert_eq!((ledger.in_flight(&1), ledger.in_flight(&2)), (2, 1));
        drop(a);
        assert_eq!(ledger.keys(), 1);
        drop(b);
        assert_eq!(ledger.keys(), 0);
        assert_eq!(ledger.snapshot().refused_key, 1);
        assert_eq!(ledger.snapshot().keys_high_water, 2);
    }

    #[test]
    fn zero_cap_means_unlimited_per_key() {
        let ledger = KeyedLedger::new(0).unwrap();
        let held: Vec<_> = (0..100)
            .map(|_| ledger.try_acquire(&"k").unwrap())
            .collect();
        assert_eq!(ledger.in_flight(&"k"), 100);
        drop(held);
        assert_eq!(ledger.keys(), 0);
    }

    #[test]
    fn max_keys_refuses_new_keys_only() {
        let ledger = KeyedLedger::new(5).unwrap();
        ledger.set_max_keys(2).unwrap();
        let _a = ledger.try_acquire(&"a").unwrap();
        let b = ledger.try_acquire(&"b").unwrap();
        assert_eq!(ledger.try_acquire(&"c").unwrap_err(), Refused::KeyTable);
        let _a2 = ledger.try_acquire(&"a").unwrap();
        drop(b);
        let _c = ledger.try_acquire(&"c").unwrap();
        assert_eq!(ledger.snapshot().refused_table, 1);
    }

    #[test]
    fn limits_the_ledger_cannot_represent_are_errors() {
        assert!(KeyedLedger::<u8>::new(usize::MAX).is_err());
        let ledger = KeyedLedger::<u8>::new(1).unwrap();
        assert!(ledger.set_cap(usize::MAX).is_err());
        assert!(ledger.set_max_keys(usize::MAX).is_err());
        assert_eq!((ledger.cap(), ledger.max_keys()), (1, 0));
    }

    /// A key that counts its clones: `Arc::strong_count` of its token, less the test's.
    #[derive(Debug, Clone)]
    struct Counted(u64, #[allow(dead_code)] std::sync::Arc<()>);

    impl PartialEq for Counted {
        fn eq(&self, other: &Self) -> bool {
            self.0 == other.0
        }
    }

    impl Eq for Counted {}

    impl std::hash::Hash for Counted {
        fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
            self.0.hash(state);
        }
    }

    /// A hasher with fixed keys, so a test can choose keys that share a window.
    fn fixed() -> std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher> {
        Default::default()
    }

    /// `n` keys of one shard and one window (under `fixed()`).
    fn one_window(n: usize) -> Vec<u64> {
        let place = |k: &u64| {
            let hash = fixed().hash_one(k);
            (
                KeyedInner::<u64, ()>::shard_index(hash),
                (hash >> 16) as usize & (SLOTS - 1),
            )
        };
        let first = place(&0);
        (0..).filter(|k| place(k) == first).take(n).collect()
    }

    #[test]
    fn the_last_reference_frees_the_ledger_and_each_entry_and_key() {
        let token = std::sync::Arc::new(());
        let clones = || std::sync::Arc::strong_count(&token) - 1;
        // WINDOW keys fill a window's slots; one more goes to an overflow entry.
        let keys: Vec<Counted> = one_window(WINDOW + 1)
            .into_iter()
            .map(|k| Counted(k, token.clone()))
            .collect();
        let ours = keys.len();
        let before = raw::live::count();
        let ledger = KeyedLedger::with_hasher(2, fixed()).unwrap();
        assert_eq!(raw::live::count(), before + 1, "the ledger, slots and all");
        let mut held: Vec<_> = keys
            .iter()
            .map(|k| ledger.try_acquire(k).unwrap())
            .collect();
        let again = ledger.try_acquire(&keys[0]).unwrap();
        let overflow = held.pop().unwrap();
        assert_eq!(raw::live::count(), before + 2, "one overflow entry");
        assert_eq!(clones(), ours * 2, "a clone of each key in its entry");
        drop(ledger);
        drop(overflow);
        assert_eq!(raw::live::count(), before + 1, "the overflow entry freed");
        assert_eq!(clones(), ours * 2 - 1, "its key dropped");
        let first = held.remove(0);
        drop(held);
        assert_eq!(clones(), ours + 1, "slots emptied, but the first key's");
        drop(first);
        assert_eq!(clones(), ours + 1, "the first key still has a permit");
        drop(again);
        assert_eq!(clones(), ours, "every key dropped");
        assert_eq!(
            raw::live::count(),
            before,
            "the ledger freed with its last permit"
        );
    }

    #[test]
    fn a_key_with_work_in_flight_in_a_slot_is_admitted_and_released_without_the_lock() {
        let ledger = KeyedLedger::new(3).unwrap();
        let locks = |f: &mut dyn FnMut()| {
            let before = locked::so_far();
            f();
            locked::so_far() - before
        };
        let mut first = None;
        // A new key: its entry is filled under the lock.
        assert_eq!(
            locks(&mut || first = Some(ledger.try_acquire(&7).unwrap())),
            1
        );
        let mut second = None;
        assert_eq!(
            locks(&mut || second = Some(ledger.try_acquire(&7).unwrap())),
            0
        );
        let mut third = None;
        assert_eq!(
            locks(&mut || third = Some(ledger.try_acquire(&7).unwrap())),
            0
        );
        // At its cap: refused under the lock, where the key is compared.
        assert_eq!(locks(&mut || assert!(ledger.try_acquire(&7).is_err())), 1);
        // No release takes the lock, the key's last (which empties its slot) included.
        assert_eq!(locks(&mut || drop(third.take())), 0);
        assert_eq!(locks(&mut || drop(second.take())), 0);
        assert_eq!(locks(&mut || drop(first.take())), 0);
        assert_eq!(ledger.keys(), 0);
        assert_eq!(occupied(&ledger).iter().sum::<usize>(), 0);
        // The slot is free again: the key comes back (under the lock, as a new key).
        assert_eq!(locks(&mut || first = Some(ledger.try_acquire(&7).unwrap())), 1);
        assert_eq!((ledger.keys(), ledger.in_flight(&7)), (1, 1));
    }

    #[test]
    fn a_slot_emptied_without_the_lock_keeps_its_bit_until_a_look_under_the_lock() {
        let ledger = KeyedLedger::with_hasher(2, Constant).unwrap();
        let mask = || ledger.inner().shards[0].occupied.load(Ordering::Relaxed);
        let held: Vec<_> = (0..4_u64).map(|k| ledger.try_acquire(&k).unwrap()).collect();
        assert_eq!(mask(), 0b1111);
        drop(held);
        assert_eq!(mask(), 0b1111, "the last releases take no lock, nor clear their bits");
        assert_eq!(occupied(&ledger)[0], 0);
        // A look at the window under the lock finds the slots empty and clears their bits,
        // so lock-free acquires pass them by again.
        assert_eq!(ledger.in_flight(&9), 0);
        assert_eq!(mask(), 0);
        // A key in the window's second slot: its bit is set, the first slot's clear.
        let held: Vec<_> = (0..2_u64).map(|k| ledger.try_acquire(&k).unwrap()).collect();
        let [first, second] = <[_; 2]>::try_from(held).ok().unwrap();
        drop(first);
        assert_eq!(ledger.in_flight(&1), 1);
        assert_eq!(mask(), 0b10);
        drop(second);
    }

    #[test]
    fn a_lock_free_acquire_passes_over_other_keys_slots_in_its_window() {
        let ledger = KeyedLedger::with_hasher(2, fixed()).unwrap();
        let keys = one_window(2);
        // The first key fills the window's first slot and is at its cap; the second is
        // in the next slot. Its acquire passes the first key's slot by its hash: were it
        // to stop there (at a key at its cap), it would go to the lock.
        let full = [
            ledger.try_acquire(&keys[0]).unwrap(),
            ledger.try_acquire(&keys[0]).unwrap(),
        ];
        let second = ledger.try_acquire(&keys[1]).unwrap();
        let before = locked::so_far();
        let again = ledger.try_acquire(&keys[1]).unwrap();
        assert_eq!(locked::so_far(), before, "the second key took the lock");
        assert_eq!(ledger.in_flight(&keys[1]), 2);
        drop((full, second, again));
    }

    /// Every key hashes to 0: one shard, one window, one hash.
    #[derive(Clone, Default)]
    struct Constant;

    impl std::hash::BuildHasher for Constant {
        type Hasher = Zero;
        fn build_hasher(&self) -> Zero {
            Zero
        }
    }

    struct Zero;

    impl std::hash::Hasher for Zero {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, _: &[u8]) {}
    }

    #[test]
    fn keys_with_equal_hashes_are_told_apart_in_slots_and_in_the_table() {
        let ledger = KeyedLedger::with_hasher(2, Constant).unwrap();
        // More keys than a window has slots: the rest go to the table.
        let keys = 0..WINDOW as u64 + 4;
        let first: Vec<_> = keys
            .clone()
            .map(|k| ledger.try_acquire(&k).unwrap())
            .collect();
        // Each second acquire counts on the keys' slots before its own (and gives those
        // counts back): every key ends with exactly its own two.
        let second: Vec<_> = keys
            .clone()
            .map(|k| ledger.try_acquire(&k).unwrap())
            .collect();
        for k in keys.clone() {
            assert_eq!(ledger.in_flight(&k), 2, "key {k}");
            assert_eq!(ledger.try_acquire(&k).unwrap_err(), Refused::Key);
            assert_eq!(*second[k as usize].key(), k);
        }
        assert_eq!(shards(&ledger)[0].0, 4, "four keys in the table");
        drop(first);
        for k in keys.clone() {
            assert_eq!(ledger.in_flight(&k), 1, "key {k}");
        }
        drop(second);
        assert_eq!(ledger.keys(), 0);
        assert_eq!(occupied(&ledger)[0], 0);
    }

    #[test]
    fn a_key_past_its_windows_slots_is_served_from_the_overflow_table() {
        let ledger = KeyedLedger::with_hasher(2, fixed()).unwrap();
        let keys = one_window(WINDOW + 2);
        let held: Vec<_> = keys
            .iter()
            .map(|k| ledger.try_acquire(k).unwrap())
            .collect();
        let index = KeyedInner::<u64, ()>::shard_index(fixed().hash_one(keys[0]));
        assert_eq!(shards(&ledger)[index].0, 2, "two keys in the table");
        // Both kinds count, cap and release alike.
        for key in [keys[0], keys[WINDOW + 1]] {
            let second = ledger.try_acquire(&key).unwrap();
            assert_eq!(ledger.try_acquire(&key).unwrap_err(), Refused::Key);
            assert_eq!(ledger.in_flight(&key), 2);
            drop(second);
            assert_eq!(ledger.in_flight(&key), 1);
        }
        assert_eq!(ledger.keys(), WINDOW as u64 + 2);
        drop(held);
        assert_eq!(ledger.keys(), 0);
        assert_eq!(shards(&ledger)[index].0, 0);
        // A slot freed while a key is in the table: the key is still found there, never
        // given a second entry in the slot (which would double its cap).
        let mut slot_keys: Vec<_> = keys[..WINDOW]
            .iter()
            .map(|k| ledger.try_acquire(k).unwrap())
            .collect();
        let in_table = ledger.try_acquire(&keys[WINDOW]).unwrap();
        drop(slot_keys.remove(0));
        let again = ledger.try_acquire(&keys[WINDOW]).unwrap();
        assert_eq!(ledger.try_acquire(&keys[WINDOW]).unwrap_err(), Refused::Key);
        assert_eq!(ledger.in_flight(&keys[WINDOW]), 2);
        assert_eq!(ledger.keys(), WINDOW as u64);
        assert_eq!(shards(&ledger)[index].0, 1);
        drop((in_table, again, slot_keys));
        assert_eq!(ledger.keys(), 0);
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn limits_reaching_the_reference_bit_cannot_be_represented() {
        assert!(KeyedLedger::<u8>::new(usize::MAX >> 1).is_err());
        assert!(KeyedLedger::<u8>::new((1 << 62) - 1).is_ok());
        let ledger = KeyedLedger::<u8>::new(1).unwrap();
        assert!(ledger.set_max_keys(1 << 62).is_err());
        assert!(ledger.set_cap(usize::MAX >> 1).is_err());
    }

    #[test]
    fn debug_output_names_the_state() {
        let ledger = KeyedLedger::new(2).unwrap();
        let p = ledger.try_acquire(&7_u8).unwrap();
        assert_eq!(format!("{ledger:?}"), "KeyedLedger { keys: 1, cap: 2 }");
        assert_eq!(format!("{p:?}"), "KeyedPermit { key: 7 }");
    }

    #[test]
    fn a_permit_outliving_every_handle_releases_safely() {
        let ledger = KeyedLedger::new(1).unwrap();
        let a = ledger.try_acquire(&"a".to_string()).unwrap();
        let b = ledger.try_acquire(&"b".to_string()).unwrap();
        drop(ledger);
        assert_eq!(a.key(), "a");
        drop(a);
        drop(b);
    }

    #[test]
    fn a_million_distinct_keys_leave_the_table_empty_and_small() {
        let ledger = KeyedLedger::new(1).unwrap();
        let inner = ledger.inner();
        // Miri interprets every step: fewer keys there, the same shape.
        let (keys, burst_size) = if cfg!(miri) {
            (2_000_u64, 1_000_u64)
        } else {
            (1_000_000, 100_000)
        };
        for key in 0..keys {
            drop(ledger.try_acquire(&key).unwrap());
        }
        assert_eq!(ledger.keys(), 0);
        let capacity: usize = inner.shards.iter().map(|s| s.table.lock().capacity()).sum();
        assert!(capacity <= SHARDS * 8, "table capacity {capacity}");

        // A burst of many keys at once, then release: the tables shrink back.
        let burst: Vec<_> = (0..burst_size)
            .map(|k| ledger.try_acquire(&k).unwrap())
            .collect();
        assert_eq!(ledger.keys(), burst_size);
        drop(burst);
        assert_eq!(ledger.keys(), 0);
        let capacity: usize = inner.shards.iter().map(|s| s.table.lock().capacity()).sum();
        assert!(
            capacity <= SHARDS * 128,
            "table capacity {capacity} after burst"
        );
    }

    /// A key whose drop takes a while, to widen any gap between removing a key's entry
    /// and forgetting it (the key is dropped outside the shard lock).
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct SlowToDrop(u8);

    impl Drop for SlowToDrop {
        fn drop(&mut self) {
            for _ in 0..200 {
                std::hint::spin_loop();
            }
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_key_being_reclaimed_is_never_counted_twice_nor_refused_by_max_keys() {
        let ledger = KeyedLedger::new(2).unwrap();
        ledger.set_max_keys(1).unwrap();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let key = SlowToDrop(7);
                    for _ in 0..if cfg!(miri) { 50 } else { 20_000 } {
                        // Two threads, cap 2: one key, never refused for any reason.
                        let permit = ledger.try_acquire(&key).unwrap();
                        assert!(ledger.keys() <= 1, "one key counted {}", ledger.keys());
                        drop(permit);
                    }
                });
            }
        });
        assert_eq!(ledger.keys(), 0);
        assert_eq!(ledger.snapshot().keys_high_water, 1);
    }

    /// Occupied slots of each shard, checked against the shard's mask of them (which may
    /// still show slots emptied since, never miss an occupied one).
    fn occupied<K, S>(ledger: &KeyedLedger<K, S>) -> Vec<usize> {
        let inner = ledger.owner.get();
        (inner.slots.iter().zip(inner.shards.iter()))
            .map(|(slots, shard)| {
                let live = (slots.iter().enumerate())
                    .filter(|(_, e)| e.state.load(Ordering::Relaxed) & HELD != 0)
                    .fold(0, |mask, (place, _)| mask | 1 << place);
                let mask = shard.occupied.load(Ordering::Relaxed);
                assert_eq!(mask & live, live, "occupied slots missing from the mask");
                live.count_ones() as usize
            })
            .collect()
    }

    /// Overflow entries per shard, each shard table's capacity, and the bytes it has
    /// allocated.
    fn shards<K, S>(ledger: &KeyedLedger<K, S>) -> Vec<(usize, usize, usize)> {
        let inner = ledger.owner.get();
        inner
            .shards
            .iter()
            .map(|s| {
                let table = s.table.lock();
                (table.len(), usable(&table), table.allocation_size())
            })
            .collect()
    }

    #[test]
    fn keys_spread_over_every_shard() {
        let ledger = KeyedLedger::new(1).unwrap();
        let keys = SHARDS as u64 * 100;
        let held: Vec<_> = (0..keys).map(|k| ledger.try_acquire(&k).unwrap()).collect();
        // Every slot is taken (the windows start all over each block), and every key's
        // slot is in its own shard's block.
        assert!(occupied(&ledger).iter().all(|&n| n == SLOTS));
        let inner = ledger.inner();
        for (i, slot) in inner.slots.iter().flatten().enumerate() {
            if slot.state.load(Ordering::Relaxed) & HELD != 0 {
                let hash = slot.hash.load(Ordering::Relaxed);
                assert_eq!(KeyedInner::<u64, ()>::shard_index(hash), i / SLOTS);
            }
        }
        let lens: Vec<usize> = (shards(&ledger).into_iter().zip(occupied(&ledger)))
            .map(|((len, ..), slots)| len + slots)
            .collect();
        let (min, max) = (*lens.iter().min().unwrap(), *lens.iter().max().unwrap());
        // 100 a shard on average; a fair hash keeps every shard within a factor of two.
        assert!(
            min >= 50 && max <= 200,
            "keys per shard from {min} to {max}"
        );
        drop(held);
    }

    #[test]
    fn a_shard_returns_memory_as_its_keys_go_but_keeps_slack_and_small_tables() {
        let ledger = KeyedLedger::new(1).unwrap();
        let hasher = &ledger.inner().hasher;
        // 132 keys that all land in shard 0: 100 or more in its table.
        let keys: Vec<u64> = (0..)
            .filter(|k| (hasher.hash_one(k) >> 32) as usize & (SHARDS - 1) == 0)
            .take(100 + SLOTS)
            .collect();
        let mut held: Vec<_> = keys
            .iter()
            .map(|k| ledger.try_acquire(k).unwrap())
            .collect();
        let (mut len, mut capacity, mut allocated) = shards(&ledger)[0];
        assert_eq!(len + occupied(&ledger)[0], 100 + SLOTS);
        assert!(len >= 100, "{len} in the table");
        let mut shrunk = 0;
        while let Some(permit) = held.pop() {
            drop(permit);
            let before = (capacity, allocated);
            (len, capacity, allocated) = shards(&ledger)[0];
            if before.0 <= 64 {
                assert_eq!(allocated, before.1, "a small table is never shrunk");
            } else if allocated != before.1 {
                shrunk += 1;
                // Slack is kept, so a key that comes and goes does not rehash each time.
                assert!(capacity >= 2 * len, "shrunk to {capacity} for {len} keys");
            }
            // Memory follows the keys: never more than four times what is held, past
            // a small table.
            assert!(
                capacity <= 64 || capacity <= 4 * len,
                "{capacity} for {len} keys"
            );
        }
        assert!(
            shrunk >= 1,
            "the table never gave memory back: {len} {capacity} {allocated}"
        );
        assert!(capacity <= 64, "{capacity} left for no keys");
    }

    #[test]
    fn concurrent_threads_never_exceed_a_keys_cap() {
        let ledger = KeyedLedger::new(2).unwrap();
        std::thread::scope(|s| {
            for t in 0..4_u64 {
                let ledger = &ledger;
                s.spawn(move || {
                    for i in 0..if cfg!(miri) { 50 } else { 20_000_u64 } {
                        let key = (i + t) % 3;
                        if let Ok(p) = ledger.try_acquire(&key) {
                            assert!(ledger.in_flight(&key) <= 2);
                            drop(p);
                        }
                    }
                });
            }
        });
        assert_eq!(ledger.keys(), 0);
    }
}

#[cfg(all(test, admission_loom))]
mod loom_models {
    use super::*;

    /// A hasher with fixed keys. loom replays executions and needs each to take the same
    /// path, so a key must land in the same shard every time (`RandomState` would not).
    fn fixed() -> std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher> {
        Default::default()
    }

    /// Invariant 4: two threads on one key with cap 1 (acquire, release, reclaim of the
    /// entry, re-creation) never hold two permits, and the table ends empty.
    #[test]
    fn keyed_acquire_release_reclaim_on_one_key_never_exceeds_the_cap() {
        loom::model(|| {
            let ledger = KeyedLedger::with_hasher(1, fixed()).unwrap();
            let other = {
                let ledger = ledger.clone();
                loom::thread::spawn(move || {
                    let p = ledger.try_acquire(&7_u8);
                    assert!(ledger.in_flight(&7) <= 1);
                    drop(p);
                    ledger.try_acquire(&7).is_ok()
                })
            };
            let mine = ledger.try_acquire(&7_u8);
            assert!(ledger.in_flight(&7) <= 1);
            drop(mine);
            other.join().unwrap();
            assert_eq!(ledger.keys(), 0);
            assert_eq!(ledger.in_flight(&7), 0);
        });
    }

    /// Reclaim racing a re-acquire of the same key under `max_keys(1)`: the release
    /// that removes the entry forgets the key before another acquire can see the table
    /// without it, so the re-acquire is never refused (cap 2: never by the key either).
    #[test]
    fn keyed_reclaim_racing_a_reacquire_of_the_same_key_under_max_keys() {
        loom::model(|| {
            let ledger = KeyedLedger::with_hasher(2, fixed()).unwrap();
            ledger.set_max_keys(1).unwrap();
            let first = ledger.try_acquire(&7_u8).unwrap();
            let t = loom::thread::spawn(move || drop(first));
            let second = ledger.try_acquire(&7_u8);
            assert!(second.is_ok(), "refused {:?}", second.unwrap_err());
            assert!(ledger.keys() <= 1);
            t.join().unwrap();
            assert_eq!(ledger.keys(), 1);
            drop(second);
            assert_eq!(ledger.keys(), 0);
        });
    }

    /// The last release of a key gives up its entry's share under its shard lock while
    /// another thread drops the last handle: whoever brings the word to zero takes every
    /// shard lock before the free, so the ledger (and the lock being released) lives
    /// until after the unlock, and everything is freed once.
    #[test]
    fn keyed_last_release_racing_the_last_handle_frees_after_unlocking() {
        loom::model(|| {
            let ledger = KeyedLedger::with_hasher(1, fixed()).unwrap();
            let a = ledger.try_acquire(&1_u8).unwrap();
            let b = ledger.try_acquire(&2_u8).unwrap();
            let t = loom::thread::spawn(move || drop(a));
            drop(b);
            drop(ledger);
            t.join().unwrap();
        });
    }

    /// The last permits of two keys in two shards dropped on two threads after the last
    /// handle: the release that brings the word to zero waits for the other to unlock its
    /// shard before the free.
    #[test]
    fn keyed_last_releases_in_two_shards_after_the_last_handle_free_after_both_unlock() {
        loom::model(|| {
            let shard = |k: &u8| KeyedInner::<u8, ()>::shard_index(fixed().hash_one(k));
            let other = (1..u8::MAX).find(|k| shard(k) != shard(&0)).unwrap();
            let ledger = KeyedLedger::with_hasher(1, fixed()).unwrap();
            let a = ledger.try_acquire(&0).unwrap();
            let b = ledger.try_acquire(&other).unwrap();
            drop(ledger);
            let t = loom::thread::spawn(move || drop(a));
            drop(b);
            t.join().unwrap();
        });
    }

    /// Permits of two keys dropped on two threads after the last handle: the entries
    /// and the ledger are freed once (loom fails the model on a leak).
    #[test]
    fn keyed_permits_dropped_after_last_handle_free_everything_once() {
        loom::model(|| {
            let ledger = KeyedLedger::with_hasher(2, fixed()).unwrap();
            let a = ledger.try_acquire(&1_u8).unwrap();
            let b = ledger.try_acquire(&1_u8).unwrap();
            let c = ledger.try_acquire(&2_u8).unwrap();
            let t = loom::thread::spawn(move || drop((a, c)));
            drop(ledger);
            drop(b);
            t.join().unwrap();
        });
    }

    /// Two keys of one shard (under loom each key's slot is a `candidate` for the
    /// other's lock-free acquire).
    fn same_shard() -> (u8, u8) {
        let shard = |k: &u8| KeyedInner::<u8, ()>::shard_index(fixed().hash_one(k));
        let b = (1..u8::MAX).find(|k| shard(k) == shard(&0)).unwrap();
        (0, b)
    }

    /// A permit for `key`, taken on a thread of its own.
    fn acquire_on_another_thread<S: BuildHasher + Send + Sync + 'static>(
        ledger: &KeyedLedger<u8, S>,
        key: u8,
    ) -> loom::thread::JoinHandle<KeyedPermit<u8, S>> {
        let ledger = ledger.clone();
        loom::thread::spawn(move || ledger.try_acquire(&key).unwrap())
    }

    /// A lock-free acquire of one key counts on another key's slot and gives the count
    /// back, while that key's last permit is dropped on the other thread: whichever of
    /// the two decrements is last empties the slot (the key is read only under a count,
    /// and taken out only after every reader's release), and the keys end where they
    /// should.
    #[test]
    fn keyed_a_count_on_another_keys_slot_given_back_while_its_last_permit_drops() {
        let (a, b) = same_shard();
        loom::model(move || {
            let ledger = KeyedLedger::with_hasher(2, fixed()).unwrap();
            let held_a = ledger.try_acquire(&a).unwrap();
            let other = acquire_on_another_thread(&ledger, b);
            drop(held_a);
            let held_b = other.join().unwrap();
            assert_eq!((ledger.in_flight(&a), ledger.in_flight(&b)), (0, 1));
            assert_eq!(ledger.keys(), 1);
            drop(held_b);
            assert_eq!(ledger.keys(), 0);
        });
    }

    /// A lock-free acquire of a key racing the key's last release and the slot's reuse by
    /// another key: the acquire either counts on the key's own entry, or finds the slot
    /// refilled (and gives back any count it took there), and is admitted on a new entry;
    /// neither key is ever counted past its cap or twice.
    #[test]
    fn keyed_an_acquire_racing_the_keys_last_release_and_the_slots_reuse() {
        let (a, b) = same_shard();
        loom::model(move || {
            let ledger = KeyedLedger::with_hasher(2, fixed()).unwrap();
            let held_a = ledger.try_acquire(&a).unwrap();
            let other = acquire_on_another_thread(&ledger, a);
            drop(held_a);
            let held_b = ledger.try_acquire(&b).unwrap();
            // The other thread may be counting on this slot for a moment (it compares
            // the key after counting; outside loom, only for an equal 64-bit hash), never
            // past the cap.
            assert!((1..=2).contains(&ledger.in_flight(&b)));
            let again_a = other.join().unwrap();
            assert_eq!((ledger.in_flight(&a), ledger.in_flight(&b)), (1, 1));
            assert_eq!(ledger.keys(), 2);
            drop((again_a, held_b));
            assert_eq!(ledger.keys(), 0);
        });
    }

    /// `max_keys` across shards: one key held, two new keys in different shards race for
    /// the last of two slots. The slot is the word's, not a shard's: exactly one of them
    /// is admitted, and the other is refused `KeyTable`.
    #[test]
    fn keyed_two_new_keys_in_two_shards_race_for_the_last_slot() {
        // The shard a key lands in, as `KeyedInner::shard` chooses it.
        let shard = |k: &u8| (fixed().hash_one(k) >> 32) as usize & (SHARDS - 1);
        let first = (0..u8::MAX).find(|k| shard(k) == 0).unwrap();
        let second = (0..u8::MAX).find(|k| shard(k) == 1).unwrap();
        let held = (0..u8::MAX).find(|k| *k != first && *k != second).unwrap();
        loom::model(move || {
            let ledger = KeyedLedger::with_hasher(1, fixed()).unwrap();
            ledger.set_max_keys(2).unwrap();
            let _held = ledger.try_acquire(&held).unwrap();
            let other = {
                let ledger = ledger.clone();
                loom::thread::spawn(move || ledger.try_acquire(&second))
            };
            let mine = ledger.try_acquire(&first);
            let theirs = other.join().unwrap();
            assert_eq!(mine.is_ok() as u8 + theirs.is_ok() as u8, 1);
            assert_eq!(ledger.keys(), 2);
            let refused = mine.as_ref().err().or(theirs.as_ref().err());
            assert_eq!(refused, Some(&Refused::KeyTable));
            assert_eq!(ledger.snapshot().keys_high_water, 2);
        });
    }
}
