//! The keyed ledger's unit tests: where entries go (home, window, overflow table),
//! which paths take the lock, and memory as keys come and go.

use super::entry::home;
use super::*;
use crate::raw;
use permit::usable;

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
    // The first key's entry, in its home, was made without the lock and with no share
    // of the word: the last handle gave it one, so the ledger lives for it.
    assert_eq!(
        raw::live::count(),
        before + 1,
        "the ledger lives for the home key"
    );
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
        let before = lock_count::so_far();
        f();
        lock_count::so_far() - before
    };
    let mut first = None;
    // A new key whose home slot is free: its entry is made there without the lock.
    assert_eq!(
        locks(&mut || first = Some(ledger.try_acquire(&7).unwrap())),
        0
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
    // The slot is free again: the key comes back, still without the lock.
    assert_eq!(
        locks(&mut || first = Some(ledger.try_acquire(&7).unwrap())),
        0
    );
    assert_eq!((ledger.keys(), ledger.in_flight(&7)), (1, 1));
}

/// The `AWAY` field of shard 0's slot `place`.
fn away<K, S>(ledger: &KeyedLedger<K, S>, place: usize) -> u64 {
    (ledger.owner.get().slots[0][place]
        .state
        .load(Ordering::Relaxed)
        & AWAY)
        / AWAY_ONE
}

#[test]
fn keys_away_from_home_are_counted_there_and_keep_new_keys_to_the_lock() {
    let ledger = KeyedLedger::with_hasher(2, Constant).unwrap();
    let locks = |f: &mut dyn FnMut()| {
        let before = lock_count::so_far();
        f();
        lock_count::so_far() - before
    };
    let mask = || ledger.inner().shards[0].away.load(Ordering::Relaxed);
    // Every key's home is slot 0. The first is made there without the lock; the
    // second finds the home taken and is made in the window's next slot, under it.
    let mut held = Vec::new();
    assert_eq!(
        locks(&mut || held.push(ledger.try_acquire(&0_u64).unwrap())),
        0
    );
    assert_eq!((mask(), away(&ledger, 0)), (0, 0));
    assert_eq!(locks(&mut || held.push(ledger.try_acquire(&1).unwrap())), 1);
    assert_eq!((mask(), away(&ledger, 0)), (0b10, 1));
    // A second permit of the key away from home, and its release (not the last: no
    // lock).
    let mut extra = Some(ledger.try_acquire(&1).unwrap());
    assert_eq!(ledger.in_flight(&1), 2);
    assert_eq!(locks(&mut || drop(extra.take())), 0);
    assert_eq!((ledger.in_flight(&1), ledger.keys(), mask()), (1, 2, 0b10));
    // The rest of the window, then the overflow table: each away from home.
    for k in 2..WINDOW as u64 + 2 {
        held.push(ledger.try_acquire(&k).unwrap());
    }
    assert_eq!(mask(), (1 << WINDOW) - 2);
    assert_eq!(away(&ledger, 0), WINDOW as u64 + 1);
    assert_eq!(shards(&ledger)[0].0, 2, "two keys in the table");
    // The home empties under the lock while keys of it are away (a look under the lock
    // may change its `AWAY` meanwhile); a new key does not take it without the lock (it
    // cannot know, without it, that it has no entry away), but takes it under it.
    let mut home = Some(held.remove(0));
    assert_eq!(locks(&mut || drop(home.take())), 1);
    assert_eq!(ledger.in_flight(&0), 0);
    let mut again = None;
    assert_eq!(
        locks(&mut || again = Some(ledger.try_acquire(&99).unwrap())),
        1
    );
    assert_eq!(
        away(&ledger, 0),
        WINDOW as u64 + 1,
        "the look's one went back"
    );
    assert_eq!(occupied(&ledger)[0], WINDOW);
    // A key away from home releases under the lock, and takes its one with it.
    let mut second = Some(held.remove(0));
    assert_eq!(locks(&mut || drop(second.take())), 1);
    assert_eq!(
        (mask(), away(&ledger, 0)),
        ((1 << WINDOW) - 4, WINDOW as u64)
    );
    held.clear();
    drop(again);
    assert_eq!((mask(), away(&ledger, 0), ledger.keys()), (0, 0, 0));
    // With no key away, a new key is made in its home without the lock again.
    assert_eq!(
        locks(&mut || held = vec![ledger.try_acquire(&5).unwrap()]),
        0
    );
}

/// Hashes a `u64` key to itself with the bits that choose the shard and the home
/// cleared: every key lands in slot 0 of shard 0, with a hash of its own.
#[derive(Clone, Default)]
struct HomeZero;

impl std::hash::BuildHasher for HomeZero {
    type Hasher = Spread;
    fn build_hasher(&self) -> Spread {
        Spread(0)
    }
}

struct Spread(u64);

impl std::hash::Hasher for Spread {
    fn finish(&self) -> u64 {
        (self.0 & 0xffff) | (self.0 >> 16) << 48
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

#[test]
#[cfg_attr(miri, ignore = "65,536 keys: too slow interpreted")]
fn a_home_with_as_many_keys_away_as_it_counts_refuses_one_more() {
    // Every key's home is slot 0 of shard 0: one key there, then keys away from it
    // until its `AWAY` is at its maximum, 2^16 - 1. (Distinct hashes otherwise, so the
    // overflow table stays fast.)
    let ledger = KeyedLedger::with_hasher(1, HomeZero).unwrap();
    let most = AWAY / AWAY_ONE;
    let mut held: Vec<_> = (0..=most)
        .map(|k| ledger.try_acquire(&k).unwrap())
        .collect();
    assert_eq!(away(&ledger, 0), most);
    assert_eq!(
        ledger.try_acquire(&(most + 1)).unwrap_err(),
        Refused::KeyTable
    );
    assert_eq!(ledger.snapshot().refused_table, 1);
    // Keys already in flight are still found, and refused only by their cap.
    assert_eq!(ledger.try_acquire(&most).unwrap_err(), Refused::Key);
    assert_eq!(ledger.try_acquire(&0).unwrap_err(), Refused::Key);
    // With the home free, a new key is made there (under the lock).
    drop(held.remove(0));
    held.push(ledger.try_acquire(&(most + 1)).unwrap());
    assert_eq!((ledger.in_flight(&(most + 1)), away(&ledger, 0)), (1, most));
    assert_eq!(
        ledger.try_acquire(&(most + 2)).unwrap_err(),
        Refused::KeyTable
    );
    drop(held);
    assert_eq!((ledger.keys(), away(&ledger, 0)), (0, 0));
    drop(ledger.try_acquire(&(most + 1)).unwrap());
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
    let before = lock_count::so_far();
    let again = ledger.try_acquire(&keys[1]).unwrap();
    assert_eq!(lock_count::so_far(), before, "the second key took the lock");
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
fn a_million_distinct_keys_leave_the_table_empty_and_small() {
    let ledger = KeyedLedger::new(1).unwrap();
    let inner = ledger.inner();
    // Miri interprets every step: fewer keys there, the same shape.
    let (keys, burst_size) = if cfg!(miri) {
        (1_000_u64, 500_u64)
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

/// Occupied slots of each shard, checked against the shard's mask of the entries
/// away from their home (exact when nothing is in flight).
fn occupied<K, S>(ledger: &KeyedLedger<K, S>) -> Vec<usize> {
    let inner = ledger.owner.get();
    (inner.slots.iter().zip(inner.shards.iter()))
        .map(|(slots, shard)| {
            let mut live = 0_u32;
            let mut away = 0_u32;
            for (place, e) in slots.iter().enumerate() {
                if e.state.load(Ordering::Relaxed) & HELD != 0 {
                    live |= 1 << place;
                    if home(e.hash.load(Ordering::Relaxed)) != place {
                        away |= 1 << place;
                    }
                }
            }
            assert_eq!(shard.away.load(Ordering::Relaxed), away);
            live.count_ones() as usize
        })
        .collect()
}

/// Overflow entries per shard, each shard table's capacity, and the bytes it has
/// allocated.
fn shards<K, S>(ledger: &KeyedLedger<K, S>) -> Vec<(usize, usize, usize)> {
    (0..SHARDS).map(|i| shard(ledger, i)).collect()
}

/// One shard's part of [`shards`].
fn shard<K, S>(ledger: &KeyedLedger<K, S>, i: usize) -> (usize, usize, usize) {
    let table = ledger.owner.get().shards[i].table.lock();
    (table.len(), usable(&table), table.allocation_size())
}

#[test]
#[cfg_attr(
    miri,
    ignore = "6,400 keys held at once: five minutes interpreted, and the spread is no memory question"
)]
fn keys_spread_over_every_shard() {
    // A fixed hasher: with a random one, one run in twenty left a shard's block with a
    // free slot (fewer of its keys than slots reach it), which says nothing of the spread.
    let ledger = KeyedLedger::with_hasher(1, fixed()).unwrap();
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
    let (mut len, mut capacity, mut allocated) = shard(&ledger, 0);
    assert_eq!(len + occupied(&ledger)[0], 100 + SLOTS);
    assert!(len >= 100, "{len} in the table");
    let mut shrunk = 0;
    while let Some(permit) = held.pop() {
        drop(permit);
        let before = (capacity, allocated);
        (len, capacity, allocated) = shard(&ledger, 0);
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

/// A window that runs past its shard's last slot goes on at the first: a key made away
/// from a home in the last slot, in the first slot, is found there without the lock.
#[test]
fn a_window_that_wraps_past_the_last_slot_is_searched_without_the_lock() {
    let ledger = KeyedLedger::with_hasher(2, Placed::default()).unwrap();
    let last = (SLOTS as u64 - 1) << 16;
    let _at_home = ledger.try_acquire(&(last | 1)).unwrap();
    let away = ledger.try_acquire(&(last | 2)).unwrap();
    assert_eq!(
        ledger.inner().shards[0].away.load(Ordering::Relaxed),
        1,
        "in slot 0"
    );
    let before = lock_count::so_far();
    let again = ledger.try_acquire(&(last | 2)).unwrap();
    assert_eq!(
        lock_count::so_far(),
        before,
        "the wrapped window was searched"
    );
    drop((away, again));
}
