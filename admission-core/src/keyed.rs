//! The keyed ledger: at most `cap` permits in flight per key.
//!
//! # Design
//!
//! Keys live in a fixed number of shards, each a `parking_lot` mutex around a
//! `hashbrown::HashTable` of pointers to boxed entries `{ key, hash, held }`. An entry
//! exists exactly while its key has a permit in flight: the acquire that finds no entry
//! creates it, and the release that takes `held` to zero removes and frees it, both
//! under the shard lock. So there is never a second entry for a key (which would double
//! its cap), the table's size follows the keys with work in flight, and no background
//! sweeper is needed.
//!
//! Acquire: one hash, one short critical section (probe, compare `held` with the cap,
//! store `held + 1`). Release: the permit points at its entry and the entry stores its
//! hash, so the release locks the right shard and decrements without hashing or probing;
//! only the last release of a key probes (by the stored hash and the entry's address,
//! never by re-hashing or comparing keys) to remove it.
//!
//! Lifetime: as for the other ledgers (see `raw`), one word is the reference count:
//!
//! ```text
//!   bit 63      OWNER: the ledger's handles
//!   bits 40-62  reclaims in progress (each counts 1 here)
//!   bits 0-39   entries (keys with a permit in flight, or being admitted)
//! ```
//!
//! Each entry, not each permit, holds one share, so the word is touched only when a key
//! appears or disappears, never on the acquire and release of a key already present.
//! The entries field is also what `keys()` reads and what `max_keys` is checked against,
//! so it must drop in the same critical section that removes the entry: otherwise an
//! acquire of the same key, arriving between the removal and the decrement, would find
//! no entry yet still count the old one, and be refused by `max_keys` for a key that is
//! not there. But the last decrement may free the ledger, shard locks included, so it
//! cannot happen under a lock. The release therefore turns the entry's share into a
//! reclaim share in one addition under the lock (entries - 1, reclaims + 1: the word
//! never passes through zero), and gives the reclaim share up after unlocking.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::ptr::NonNull;

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use crate::limit;
use crate::raw::{self, Counted, Owner, OWNER};
use crate::sync::{Arc, AtomicU64, Mutex, Ordering, Track};
use crate::{CapacityError, Refused};

/// Number of shards: a power of two. More shards than cores keep two threads on
/// different keys from meeting on a lock; 64 cache-padded mutexes cost 8 KiB a ledger.
#[cfg(not(admission_loom))]
const SHARDS: usize = 64;
/// Under loom, two shards: models use one or two keys.
#[cfg(admission_loom)]
const SHARDS: usize = 2;

/// The largest per-key cap.
const MAX_CAP: usize = usize::MAX >> 2;

/// One reclaim in progress, in the word (see the module docs).
const RECLAIM: u64 = 1 << 40;
/// The entries field of the word.
const KEYS: u64 = RECLAIM - 1;
/// The largest `max_keys`: the entries field's maximum.
const MAX_KEYS: usize = KEYS as usize;

/// A limit on how many permits each key may hold at once.
///
/// For per-client fairness: one authenticated subject, client address or tenant cannot
/// take more than `cap` of the server's in-flight work, however fast it sends. Memory is
/// proportional to the keys that have a permit in flight now; an optional
/// [`max_keys`](Self::set_max_keys) bounds even that, so a client spraying fresh keys
/// cannot grow the table without limit.
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
    /// `OWNER` | reclaims in progress | entries (see the module docs).
    state: CachePadded<AtomicU64>,
    cap: AtomicU64,
    max_keys: AtomicU64,
    refused_key: AtomicU64,
    refused_table: AtomicU64,
    keys_high_water: AtomicU64,
    hasher: S,
    shards: Box<[Shard<K>]>,
    track: Track,
}

struct Entry<K> {
    key: K,
    hash: u64,
    /// Permits of this key in flight. Read and written only under the shard lock (an
    /// atomic only so that `&Entry` may be shared; plain loads and stores, never a
    /// read-modify-write).
    held: AtomicU64,
    _track: Track,
}

/// One lock and the entries of the keys that hash to it.
type Shard<K> = CachePadded<Mutex<HashTable<EntryPtr<K>>>>;

/// An entry's address as the shard table stores it. Only tables hold these, so an
/// `&EntryPtr` is reachable only through a locked shard.
struct EntryPtr<K>(NonNull<Entry<K>>);

impl<K> EntryPtr<K> {
    /// The entry, for as long as the table (and so its lock guard) is borrowed.
    fn get(&self) -> &Entry<K> {
        // SAFETY: an entry is freed only after it is removed from its table, under the
        // table's lock; this `EntryPtr` is still in a table that the caller borrows
        // through that lock's guard, so the entry is live for the borrow.
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
}

impl<K, S> KeyedInner<K, S> {
    fn shard(&self, hash: u64) -> &Shard<K> {
        // Bits 32.. choose the shard; hashbrown uses the low bits for the bucket and the
        // top seven for its control bytes, so all three stay independent.
        &self.shards[(hash >> 32) as usize & (SHARDS - 1)]
    }
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
        let shards = (0..SHARDS)
            .map(|_| CachePadded::new(Mutex::new(HashTable::new())))
            .collect();
        let inner = KeyedInner {
            state: CachePadded::new(AtomicU64::new(OWNER)),
            cap: AtomicU64::new(cap),
            max_keys: AtomicU64::new(max_keys),
            refused_key: AtomicU64::new(0),
            refused_table: AtomicU64::new(0),
            keys_high_water: AtomicU64::new(0),
            hasher,
            shards,
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
    /// Never blocks beyond one short critical section on the key's shard. Allocates only
    /// when `key` has no permit in flight (its entry is created; the key is cloned).
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
        let mut table = inner.shard(hash).lock();
        if let Some(found) = table.find(hash, |e| e.get().key == *key) {
            let entry = found.get();
            let held = entry.held.load(Ordering::Relaxed);
            let cap = cap.unwrap_or_else(|| inner.cap.load(Ordering::Relaxed));
            if held >= cap {
                drop(table);
                inner.refused_key.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::Key);
            }
            // Relaxed load and store suffice: `held` is only accessed under the lock,
            // whose acquire and release order these accesses.
            entry.held.store(held + 1, Ordering::Relaxed);
            let permit = KeyedPermit {
                inner: self.owner.ptr(),
                entry: found.0,
            };
            return Ok((permit, None));
        }
        // A new key: take its entry's share of the word first, so `max_keys` is checked
        // across shards (and the entry keeps the ledger alive once it exists).
        let max_keys = inner.max_keys.load(Ordering::Relaxed);
        let mut current = inner.state.load(Ordering::Relaxed);
        let keys = loop {
            let keys = current & KEYS;
            if keys >= max_keys {
                drop(table);
                inner.refused_table.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::KeyTable);
            }
            // Relaxed: the increment is made through our live handle (see `raw`). `keys`
            // is below `MAX_KEYS` (checked against `max_keys`, or bounded by memory: every
            // entry is a live allocation), so `+ 1` stays in the entries field.
            match inner.state.compare_exchange_weak(
                current,
                current + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break keys + 1,
                Err(actual) => current = actual,
            }
        };
        let entry = raw::alloc(Entry {
            key: key.clone(),
            hash,
            held: AtomicU64::new(1),
            _track: Track::new(),
        });
        table.insert_unique(hash, EntryPtr(entry), |e| e.get().hash);
        let permit = KeyedPermit {
            inner: self.owner.ptr(),
            entry,
        };
        Ok((permit, Some(keys)))
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
        let table = inner.shard(hash).lock();
        table
            .find(hash, |e| e.get().key == *key)
            .map_or(0, |e| e.get().held.load(Ordering::Relaxed))
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
fn slots<T>(table: &HashTable<T>) -> usize {
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
// SAFETY: as above; every access to the tables and entries is under a shard lock.
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
        // SAFETY: this permit is counted in the entry's `held`, so the entry is not
        // removed or freed before the permit's release; the key is never mutated.
        &unsafe { self.entry.as_ref() }.key
    }

    /// Gives the permit back; removes the key's entry if this was its last permit.
    /// Called only from `Drop`, so it runs exactly once.
    fn release(&mut self) {
        // SAFETY: the permit's entry is in the table (its `held` counts this permit), and
        // the entry holds a share of the ledger's word, so the ledger is live.
        let inner = unsafe { self.inner.as_ref() };
        // SAFETY: as in `key`.
        let entry = unsafe { self.entry.as_ref() };
        let mut table = inner.shard(entry.hash).lock();
        // Under the lock: see `try_acquire` for why relaxed accesses suffice.
        let held = entry.held.load(Ordering::Relaxed);
        debug_assert!(held >= 1, "a keyed permit outlived its entry's count");
        if held > 1 {
            entry.held.store(held - 1, Ordering::Relaxed);
            return;
        }
        // The key's last permit: remove the entry in the same critical section, so no
        // acquirer ever sees a key with two entries or an entry on its way out.
        let target = self.entry;
        match table.find_entry(entry.hash, |e| e.0 == target) {
            Ok(found) => {
                found.remove();
            }
            Err(_) => unreachable!("a held permit's entry is always in its shard"),
        }
        // The key is gone from the table, so it leaves the entries field now, in the
        // same critical section: an acquire of the same key that follows this unlock
        // must not count it. Its share of the word becomes a reclaim share (entries - 1,
        // reclaims + 1 in one addition, `keys >= 1` so nothing borrows across fields),
        // so the word stays above zero and the ledger, with the lock held here, stays
        // alive until `put` below. Relaxed: the total share is unchanged, so this
        // orders nothing for the lifetime protocol; `held` and the table are ordered by
        // the lock.
        inner.state.fetch_add(RECLAIM - 1, Ordering::Relaxed);
        if worth_shrinking(slots(&table), table.len()) {
            let len = table.len();
            table.shrink_to(len * 2, |e| e.get().hash);
        }
        drop(table);
        // SAFETY: the entry is out of the table, its last permit is this one, and nothing
        // else refers to it; it came from `raw::alloc`. The key is dropped outside the lock.
        drop(unsafe { Box::from_raw(self.entry.as_ptr()) });
        #[cfg(test)]
        raw::live::change(-1);
        // SAFETY: the reclaim share taken above, given up once, here; `inner` is not used
        // after this line.
        unsafe { raw::put(self.inner, RECLAIM) };
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

    #[test]
    fn the_last_reference_frees_the_ledger_and_each_entry() {
        let before = raw::live::count();
        let ledger = KeyedLedger::new(2).unwrap();
        assert_eq!(raw::live::count(), before + 1);
        let a = ledger.try_acquire(&"a").unwrap();
        let a2 = ledger.try_acquire(&"a").unwrap();
        let b = ledger.try_acquire(&"b").unwrap();
        assert_eq!(raw::live::count(), before + 3, "the ledger and two entries");
        drop(ledger);
        drop(a);
        assert_eq!(raw::live::count(), before + 3);
        drop(a2);
        assert_eq!(raw::live::count(), before + 2, "entry a freed");
        drop(b);
        assert_eq!(raw::live::count(), before, "entry b and the ledger freed");
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
        let capacity: usize = inner.shards.iter().map(|s| s.lock().capacity()).sum();
        assert!(capacity <= SHARDS * 8, "table capacity {capacity}");

        // A burst of many keys at once, then release: the tables shrink back.
        let burst: Vec<_> = (0..burst_size)
            .map(|k| ledger.try_acquire(&k).unwrap())
            .collect();
        assert_eq!(ledger.keys(), burst_size);
        drop(burst);
        assert_eq!(ledger.keys(), 0);
        let capacity: usize = inner.shards.iter().map(|s| s.lock().capacity()).sum();
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

    /// Entries per shard, each shard table's capacity, and the bytes it has allocated.
    fn shards<K, S>(ledger: &KeyedLedger<K, S>) -> Vec<(usize, usize, usize)> {
        let inner = ledger.owner.get();
        inner
            .shards
            .iter()
            .map(|s| {
                let table = s.lock();
                (table.len(), slots(&table), table.allocation_size())
            })
            .collect()
    }

    #[test]
    fn keys_spread_over_every_shard() {
        let ledger = KeyedLedger::new(1).unwrap();
        let keys = SHARDS as u64 * 100;
        let held: Vec<_> = (0..keys).map(|k| ledger.try_acquire(&k).unwrap()).collect();
        let lens: Vec<usize> = shards(&ledger).into_iter().map(|(len, ..)| len).collect();
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
        // 100 keys that all land in shard 0.
        let keys: Vec<u64> = (0..)
            .filter(|k| (hasher.hash_one(k) >> 32) as usize & (SHARDS - 1) == 0)
            .take(100)
            .collect();
        let mut held: Vec<_> = keys
            .iter()
            .map(|k| ledger.try_acquire(k).unwrap())
            .collect();
        let (mut len, mut capacity, mut allocated) = shards(&ledger)[0];
        assert_eq!(len, 100);
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

    /// The last release of a key drops the ledger's last share while another thread
    /// drops the last handle; the reclaim share keeps the ledger (and the shard lock
    /// being released) alive until after the unlock, and everything is freed once.
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
