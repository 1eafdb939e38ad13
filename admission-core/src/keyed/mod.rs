//! The keyed ledger: at most `cap` permits in flight per key.
//!
//! Keys live in 64 shards, each a `parking_lot` mutex over a table of boxed *overflow*
//! entries, beside 32 inline *slots*. A key's *home* is the slot its hash picks; its
//! *window*, eight slots from there. An entry is occupied exactly while its key has a
//! permit in flight: the acquire that finds none makes it, the release that takes `held`
//! to zero empties it (no sweeper). An entry's `state` word:
//!
//! ```text
//!   bits 51-63   generation: how many times the slot was filled
//!   bits 35-50   AWAY: keys whose home this slot is, with their entry elsewhere
//!   bit 34       BOUNDED: max_keys bounds the keys (the slot's mark)
//!   bit 33       COUNTED: the entry holds a share of the ledger's word
//!   bit 32       BUSY: one thread is writing the slot's key (a fill or an emptying)
//!   bits 0-31    held: the key's permits in flight
//! ```
//!
//! The ledger's own word is its reference count (see `raw`): `OWNER` (bit 63, the
//! handles) and the entries with a share (bits 0-39), which `max_keys` is checked against.
//!
//! Invariants, and where each is kept:
//!
//! 1. **A key has at most one entry** (else its cap doubles). Without the lock an entry is
//!    made only in the key's home, only when the home is empty with `AWAY` zero (then the
//!    key is nowhere else), by one compare-exchange that claims it (`Entry::claim`). Every
//!    other entry is made under the shard lock, after a look that adds one to the home's
//!    `AWAY` (`LookAway`), which keeps lock-free claims of the home out until it ends; an
//!    entry away from home keeps that one until it is emptied (`locked.rs`).
//! 2. **A count is taken only on a live entry of the key, below its cap**: a lock-free
//!    acquire compare-exchanges `held` from the state it read before the hash (the
//!    generation catches a refill), then compares the key; another key's count is given
//!    back as a release (`probe.rs`).
//! 3. **The key is read only while `held > 0` or under `BUSY`**: a fill's writes are
//!    published by its release store, read by acquire loads; every release decrement is
//!    a release and the one to zero an acquire, so every holder's reads happen before the
//!    key is moved out (`permit.rs`).
//! 4. **No one waits on `BUSY` under a shard lock**: a look that meets a busy home (to add
//!    its one to `AWAY`, or to read it) lets go of the lock and waits without it. Taking
//!    one from `AWAY` never meets a busy slot: no fill starts at a home with keys away, and
//!    such a home's last release takes the lock. So fills and emptyings end with a store,
//!    as no one changes a busy slot's `AWAY` (`entry.rs`); a count a look takes is given
//!    back under the lock it holds (`give_back_locked`).
//! 5. **Memory follows the keys, and is freed once**: entries made under the lock take a
//!    share of the word; those made without it take one only in a `BOUNDED` slot, so a new
//!    key writes nothing shared while `max_keys` is unbounded (`keys()` reads every slot
//!    for those). `set_max_keys` and the last handle's drop give every entry a share
//!    (`settle`). A counted entry gives its share up before its key is gone for anyone
//!    else (under the lock, or while `BUSY`); whoever brings the word to zero first takes
//!    every shard lock and waits out every busy slot (`quiesce`), then frees.
//! 6. **A panic in user code** (`Hash`, `Eq`, `Clone`, `Drop` of the key, the hasher)
//!    leaves the ledger as if the call had not started: the hash and every clone come
//!    before anything is taken, a count taken to compare is a permit (released if `Eq`
//!    panics), the look's one in `AWAY` is a guard, and a key is dropped only after its
//!    release is complete (`panics.rs`).
//!
//! Each ordering's comment names what it pairs with; loom fails a model when any one of
//! them is weakened (`loom_models.rs`).

use std::fmt;
use std::hash::{BuildHasher, Hash};

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use crate::limit;
use crate::raw::{OWNER, Owner};
use crate::sync::{Arc, AtomicU32, AtomicU64, Mutex, Ordering, Track};
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

/// The largest per-key cap: what a key's `held` field holds, less the one count a look
/// under the lock may add (see `look`), 2^32 - 2.
const MAX_CAP: usize = (HELD - 1) as usize;

/// The `held` field of an entry's state: a key's permits in flight. A key holds at most
/// `HELD - 1` at once whatever its cap (2^32 - 2; the last one is room for the count a
/// look under the lock takes, see `look`).
const HELD: u64 = (1 << 32) - 1;
/// Set in a slot's state by the one thread that writes the slot's key: from the
/// compare-exchange that claims an empty slot to the store that fills it, and from the
/// compare-exchange that takes its `held` to zero to the write that empties it. A
/// lock-free acquire passes a busy slot by; a look under the lock lets go of the lock and
/// waits for it without (`Raise::Busy`, `Look::Busy`), so a thread descheduled while it
/// holds `BUSY` holds up only the keys of that home; `settle` and the free wait for it.
const BUSY: u64 = 1 << 32;
/// Set in an entry's state while it holds a share of the ledger's word (see the module
/// docs): always for an entry made under the lock, for one made without it only in a
/// `BOUNDED` slot; and for every entry once the ledger's handles are gone.
const COUNTED: u64 = 1 << 33;
/// Set in every slot's state while `max_keys` bounds the keys: an entry made in the slot
/// without the lock then takes a share of the word, checked against the bound. A slot's
/// own mark, not a load of `max_keys`, so that the claim of the slot (a read-modify-write
/// of the same state) is ordered with `set_max_keys`' marking of it: either the claim sees
/// the mark, or the marking sees the claimed slot and counts its entry.
const BOUNDED: u64 = 1 << 34;
/// One in the `AWAY` field of a slot's state (bits 35 to 50): how many keys whose home
/// is this slot have their entry away from it (in another slot of their window, or in the
/// overflow table), plus any look under the lock for such a key in progress. While it is
/// above zero, no key is given an entry here without the lock.
const AWAY_ONE: u64 = 1 << 35;
/// The `AWAY` field.
const AWAY: u64 = 0xffff * AWAY_ONE;
/// One in the generation field of an entry's state (its top 13 bits): a slot's count of
/// fills, so that a lock-free acquire does not count on a refilled slot it took for the
/// one it read (and if it does after 2^13 fills, the key it compares next tells it).
const GENERATION: u64 = 1 << 51;
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
/// A key is usually admitted and released without a lock: one compare-exchange each way,
/// after the hash, whether it has work in flight already or is new. While `max_keys` is
/// unbounded, a new key writes nothing shared but its own slot (with a bound, each new
/// key and each key's last release also count it in one shared word).
///
/// The hasher is a type parameter as in `HashMap`; the default, [`KeyState`], is fast and
/// randomly seeded, so that clients cannot aim their keys at one slot (see it for the
/// choice, and for how to use SipHash instead).
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
pub struct KeyedLedger<K, S = KeyState> {
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
    /// Held while `max_keys` changes (see `settle`).
    config: Mutex<()>,
    hasher: S,
    shards: Box<[CachePadded<Shard<K>>; SHARDS]>,
    /// `SLOTS` inline entries for each shard.
    slots: Box<[[Entry<K>; SLOTS]; SHARDS]>,
    track: Track,
}

/// A permit and, when the acquisition gave its key an entry with a share of the word, the
/// number of such entries it brought the ledger to; or the refusal.
type Acquired<K, S> = Result<(KeyedPermit<K, S>, Option<u64>), Refused>;

impl<K: Hash + Eq + Clone> KeyedLedger<K, KeyState> {
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
        Self::with_hasher(cap, KeyState::new())
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
    /// use std::hash::RandomState; // SipHash, in place of the default `KeyState`
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
    /// use std::hash::RandomState;
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
                away: AtomicU32::new(0),
                table: Mutex::new(HashTable::new()),
            })
        });
        let bounded = if max_keys == limit::UNLIMITED {
            0
        } else {
            BOUNDED
        };
        let slots = boxed_array(|_| {
            std::array::from_fn(|place| Entry {
                state: AtomicU64::new(bounded),
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
            config: Mutex::new(()),
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
    /// Never blocks beyond one short critical section on the key's shard (or on its slot,
    /// while another thread fills or empties it), and takes none when `key` has a permit
    /// in flight in one of its slots, or is new and its home slot is free (one
    /// compare-exchange). A new key is cloned into a free slot, or, when its slots are
    /// taken, into an entry of its own (the only allocation).
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
        self.try_acquire_observed(key, None)
    }

    /// Takes one permit for `key` if it holds fewer than `cap`, the cap chosen for this
    /// key by the caller (a tenant's tier: a paying tenant 32, a free one 4) in place of
    /// the ledger's [`cap`](Self::cap); else refuses at once. The same table, the same
    /// reclaim guarantees, the same `max_keys`.
    ///
    /// `cap` is the cap itself: 0 admits nothing for this key (a blocked tenant), and a
    /// cap above [`MAX_CAP`](Self::MAX_CAP) (`u64::MAX`, say) is no cap beyond what one
    /// key can hold at once, `MAX_CAP`. Each acquisition checks the cap it is given: after a key's
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
        self.try_acquire_observed(key, Some(cap))
    }

    /// `try_acquire` against `cap` if given, else the ledger's cap. A key with a permit in
    /// flight returns from the probe, without the slower paths' results passing through
    /// it (which would be merged in memory, and the permit read back from there).
    #[inline]
    fn try_acquire_observed(
        &self,
        key: &K,
        cap: Option<u64>,
    ) -> Result<KeyedPermit<K, S>, Refused> {
        let (hash, cap) = self.prepare(key, cap)?;
        match self.probe(key, hash, cap) {
            Fast::Permit(permit) => Ok(permit),
            fast => self.acquire_slow_observed(key, hash, cap, fast),
        }
    }

    /// `acquire_slow`, recording the keys high-water mark. Out of line (see
    /// `try_acquire_observed`).
    #[inline(never)]
    fn acquire_slow_observed(
        &self,
        key: &K,
        hash: u64,
        cap: u64,
        fast: Fast<K, S>,
    ) -> Result<KeyedPermit<K, S>, Refused> {
        let (permit, keys) = self.acquire_slow(key, hash, cap, fast)?;
        if let Some(keys) = keys {
            self.observe(keys);
        }
        Ok(permit)
    }

    /// `try_acquire` without recording the keys high-water mark: the permit and, when it
    /// created the key's entry with a share of the word, the number of keys it brought
    /// the ledger to (see `CountLedger::try_acquire_unobserved`), against `cap` if given,
    /// else the ledger's cap. A refusal is counted here.
    #[inline]
    pub(crate) fn try_acquire_unobserved(&self, key: &K, cap: Option<u64>) -> Acquired<K, S> {
        let (hash, cap) = self.prepare(key, cap)?;
        match self.probe(key, hash, cap) {
            Fast::Permit(permit) => Ok((permit, None)),
            fast => self.acquire_slow(key, hash, cap, fast),
        }
    }

    /// The key's hash and the cap to check (`cap` if given, else the ledger's), or the
    /// refusal of a key given a cap of 0.
    #[inline(always)]
    fn prepare(&self, key: &K, cap: Option<u64>) -> Result<(u64, u64), Refused> {
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
        Ok((hash, cap))
    }

    /// `key`'s hash under this ledger's hasher.
    #[inline]
    pub(crate) fn hash(&self, key: &K) -> u64 {
        self.inner().hasher.hash_one(key)
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
        loop {
            let table = inner.shard(hash).table.lock();
            return match self.find(&table, key, hash) {
                Found::Home(permit, held) => {
                    permit.give_back_locked();
                    held
                }
                Found::Entry(entry) => {
                    // SAFETY: found under the lock, which is still held.
                    unsafe { entry.as_ref() }.state.load(Ordering::Relaxed) & HELD
                }
                Found::Absent => 0,
                Found::Busy => {
                    // As in `acquire_locked`: waited for without the lock.
                    drop(table);
                    inner.home(hash).unbusy(Ordering::Relaxed);
                    continue;
                }
            };
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
    /// Per-key cap; `None`: no cap.
    pub cap: Option<u64>,
    /// Bound on distinct keys; `None`: no bound.
    pub max_keys: Option<u64>,
    /// The most keys seen with work in flight at once: by every new key while `max_keys`
    /// bounds the keys (each is counted as it comes), otherwise by the readings of
    /// [`keys`](KeyedLedger::keys) and [`snapshot`](KeyedLedger::snapshot) (a new key is
    /// then made without any shared write, and counted only when read).
    pub keys_high_water: u64,
    /// Acquisitions refused because the key was at its cap.
    pub refused_key: u64,
    /// Acquisitions refused because the table held `max_keys` keys.
    pub refused_table: u64,
}

/// Unit tests count this thread's acquisitions and releases that took the shard lock, to
/// see which path an operation took.
#[cfg(test)]
mod lock_count {
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

mod entry;
mod hash;
mod inner;
mod locked;
mod permit;
mod probe;
mod readings;

use entry::{BOXED, Entry, Shard};
pub use hash::{KeyHasher, KeyState};
use locked::Found;
pub use permit::KeyedPermit;
use probe::Fast;

/// A hasher with fixed keys, so that a test or a model places its keys the same way in
/// every run (loom replays executions, which must each take the same path).
#[cfg(test)]
fn fixed() -> std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher> {
    Default::default()
}

#[cfg(all(test, not(admission_loom)))]
use test_hashers::Placed;

/// Hashers that place keys where a test wants them.
#[cfg(all(test, not(admission_loom)))]
mod test_hashers {
    use std::hash::{BuildHasher, Hasher};

    /// A hasher that gives every key the value it writes, so a test places keys: `home` in
    /// bits 16.., the shard in bits 32.. (see `home` and `shard_index`); `same` gives every key
    /// one hash, so that all share a home and every key after the first takes the lock.
    #[derive(Clone, Copy, Default)]
    pub(super) struct Placed {
        pub(super) same: bool,
    }

    pub(super) struct PlacedHasher(u64, bool);

    impl Hasher for PlacedHasher {
        fn finish(&self) -> u64 {
            if self.1 { 7 << 16 } else { self.0 }
        }
        fn write(&mut self, bytes: &[u8]) {
            for &b in bytes {
                self.0 = self.0 << 8 | u64::from(b);
            }
        }
        fn write_u64(&mut self, n: u64) {
            self.0 = n;
        }
    }

    impl BuildHasher for Placed {
        type Hasher = PlacedHasher;
        fn build_hasher(&self) -> PlacedHasher {
            PlacedHasher(0, self.same)
        }
    }
}

#[cfg(all(test, not(admission_loom)))]
mod tests;

#[cfg(all(test, not(admission_loom)))]
mod placement_tests;

#[cfg(all(test, not(admission_loom)))]
mod panics;

#[cfg(all(test, admission_loom))]
mod loom_models;
