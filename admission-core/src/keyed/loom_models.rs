//! The keyed ledger's loom models (`cargo xtask loom`).

use super::entry::home;
use super::*;

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

/// Every slot's count of keys away from it, and every shard's mask of entries away
/// from home, back at zero.
fn assert_nothing_away<S>(ledger: &KeyedLedger<u8, S>) {
    let inner = ledger.owner.get();
    let away = |e: &Entry<u8>| e.state.load(Ordering::Relaxed) & AWAY;
    assert!((inner.slots.iter().flatten()).all(|e| away(e) == 0));
    assert!(
        inner
            .shards
            .iter()
            .all(|s| s.away.load(Ordering::Relaxed) == 0)
    );
}

/// Two keys of one shard with the same home slot.
fn same_home() -> (u8, u8) {
    let place = |k: &u8| {
        let hash = fixed().hash_one(k);
        (KeyedInner::<u8, ()>::shard_index(hash), home(hash))
    };
    let b = (1..u8::MAX).find(|k| place(k) == place(&0)).unwrap();
    (0, b)
}

/// Two threads make the same new key at once, each without the lock if it can: one
/// claims the home slot, and the other counts on the entry it makes, or finds it under
/// the lock; never a second entry (cap 2: both are admitted, on one entry).
#[test]
fn keyed_two_threads_make_the_same_new_key_at_once() {
    loom::model(|| {
        let ledger = KeyedLedger::with_hasher(2, fixed()).unwrap();
        let other = acquire_on_another_thread(&ledger, 7);
        let mine = ledger.try_acquire(&7).unwrap();
        let theirs = other.join().unwrap();
        assert_eq!((ledger.in_flight(&7), ledger.keys()), (2, 1));
        drop((mine, theirs));
        assert_eq!(ledger.keys(), 0);
    });
}

/// A key whose home is taken is made away from it under the lock, while the home's
/// other key goes and the same key is made again on this thread, in the home if it
/// can, without the lock: whichever comes first, the key has one entry (cap 2: both
/// are admitted, on one entry), and every count of keys away goes back to zero.
#[test]
fn keyed_a_key_made_at_home_without_the_lock_racing_one_made_away_under_it() {
    let (taken, key) = same_home();
    loom::model(move || {
        let ledger = KeyedLedger::with_hasher(2, fixed()).unwrap();
        let first = ledger.try_acquire(&taken).unwrap();
        let other = acquire_on_another_thread(&ledger, key);
        drop(first);
        let mine = ledger.try_acquire(&key).unwrap();
        let theirs = other.join().unwrap();
        assert_eq!((ledger.in_flight(&key), ledger.keys()), (2, 1));
        drop((mine, theirs));
        assert_eq!(ledger.keys(), 0);
        assert_nothing_away(&ledger);
    });
}

/// A permit made without the lock (no share of the word: `max_keys` unbounded) is
/// released on one thread while the last handle drops on another: the handle's drop
/// gives the entry a share first if it is still there (or waits for its slot to be
/// empty), so the ledger lives until the release is done, and is freed once (loom
/// fails the model on a free racing a use, or a leak).
#[test]
fn keyed_the_last_handle_dropped_while_a_permit_without_a_share_is_released() {
    loom::model(|| {
        let ledger = KeyedLedger::with_hasher(1, fixed()).unwrap();
        let a = ledger.try_acquire(&1_u8).unwrap();
        let t = loom::thread::spawn(move || drop(a));
        drop(ledger);
        t.join().unwrap();
    });
}

/// A bound set while a new key is made without the lock on another thread: the key is
/// either made after the slot is marked (and counts itself against the bound) or
/// before (and the marking counts it), so a key made after `set_max_keys(1)` returns
/// is never admitted beside it.
#[test]
fn keyed_a_bound_set_while_a_key_is_made_without_the_lock_counts_it() {
    let shard = |k: &u8| KeyedInner::<u8, ()>::shard_index(fixed().hash_one(k));
    let first = 0_u8;
    let second = (1..u8::MAX).find(|k| shard(k) != shard(&first)).unwrap();
    loom::model(move || {
        let ledger = KeyedLedger::with_hasher(1, fixed()).unwrap();
        let other = {
            let ledger = ledger.clone();
            loom::thread::spawn(move || ledger.try_acquire(&first).ok())
        };
        ledger.set_max_keys(1).unwrap();
        let mine = ledger.try_acquire(&second).ok();
        let theirs = other.join().unwrap();
        assert!(
            !(mine.is_some() && theirs.is_some()),
            "two keys admitted under a bound of one"
        );
        // Every share the marking took is one an entry has, and gives back.
        let admitted = u64::from(mine.is_some()) + u64::from(theirs.is_some());
        assert_eq!(ledger.keys(), admitted);
        drop((mine, theirs));
        assert_eq!(ledger.keys(), 0);
    });
}

/// A key's last permit in its home goes (the slot busy while its key is moved out)
/// while another thread's lock-free acquire of the same key looks at the slot: the
/// acquire counts on the entry before the release (which then is not the last), or
/// finds the slot emptied and makes the entry again; never counts on a slot being
/// emptied (cap 3, so no cap sends it to the lock instead).
#[test]
fn keyed_a_home_entrys_last_release_racing_a_lock_free_acquire_of_it() {
    loom::model(|| {
        let ledger = KeyedLedger::with_hasher(3, fixed()).unwrap();
        let mine = ledger.try_acquire(&7_u8).unwrap();
        let other = acquire_on_another_thread(&ledger, 7);
        drop(mine);
        let theirs = other.join().unwrap();
        assert_eq!((ledger.in_flight(&7), ledger.keys()), (1, 1));
        assert_eq!(*theirs.key(), 7);
        drop(theirs);
        assert_eq!(ledger.keys(), 0);
    });
}

/// A key away from its home (taken by another key): its last permit goes, under the
/// lock, while another thread's lock-free acquire counts on the entry. If the count
/// comes first, the release finds it under the lock and is not the last; else the
/// acquire finds the key gone and makes its entry again. Either way one permit, on one
/// entry, and every count of keys away back to zero at the end.
#[test]
fn keyed_an_away_entrys_last_release_racing_a_lock_free_acquire_of_it() {
    let (taken, key) = same_home();
    loom::model(move || {
        let ledger = KeyedLedger::with_hasher(3, fixed()).unwrap();
        let home = ledger.try_acquire(&taken).unwrap();
        let away = ledger.try_acquire(&key).unwrap();
        let other = acquire_on_another_thread(&ledger, key);
        drop(away);
        let theirs = other.join().unwrap();
        assert_eq!((ledger.in_flight(&key), ledger.keys()), (1, 2));
        assert_eq!(*theirs.key(), key);
        drop((theirs, home));
        assert_eq!(ledger.keys(), 0);
        assert_nothing_away(&ledger);
    });
}

/// A home's key releases its last permit while the last permit of a key of the same home,
/// made away from it, is released under the lock, taking one from the home's `AWAY`. The
/// home's release takes the lock too while a key of it is away, so the two never meet on
/// a busy slot: emptied without the lock, its store would write back the `AWAY` it read,
/// and the home would never take a key without the lock again.
#[test]
fn keyed_an_away_keys_last_release_and_its_homes_last_release() {
    let (at_home, away) = same_home();
    loom::model(move || {
        let ledger = KeyedLedger::with_hasher(1, fixed()).unwrap();
        let home_permit = ledger.try_acquire(&at_home).unwrap();
        let away_permit = ledger.try_acquire(&away).unwrap();
        let other = loom::thread::spawn(move || drop(away_permit));
        drop(home_permit);
        other.join().unwrap();
        assert_eq!(ledger.keys(), 0);
        assert_nothing_away(&ledger);
    });
}

/// A key is made at home without the lock (the slot busy while it is filled) while a key
/// of the same home is made under the lock: the look does not add its one to a busy home's
/// `AWAY` (the fill's store would overwrite it), lets go of the lock and waits, then looks
/// again; it never counts on a half-made entry.
#[test]
fn keyed_a_look_under_the_lock_meets_a_home_being_filled() {
    let (first, second) = same_home();
    loom::model(move || {
        let ledger = KeyedLedger::with_hasher(1, fixed()).unwrap();
        let held = ledger.try_acquire(&second).unwrap();
        drop(held);
        let other = {
            let ledger = ledger.clone();
            loom::thread::spawn(move || ledger.try_acquire(&first).map(drop).is_ok())
        };
        let mine = ledger.try_acquire(&second);
        assert!(other.join().unwrap());
        assert!(mine.is_ok());
        drop(mine);
        assert_eq!(ledger.keys(), 0);
        assert_nothing_away(&ledger);
    });
}

/// The protocol of a leased cap (admission-tower's `Leases`, admission-redis's give-back):
/// the cap is lowered to what is in flight under a lock, then `in_flight` read again,
/// and the larger of the two is what the lessor is told this server holds; a request
/// reads the cap, takes its permit against it, reads the cap again and lets the permit
/// go if the key's count exceeds it. One request running, one arriving, one lowering:
/// the permits kept never exceed what the lessor is told, whatever the interleaving.
#[test]
fn keyed_a_cap_lowered_as_a_permit_is_taken_never_keeps_more_than_it_reports() {
    loom::model(|| {
        use loom::sync::RwLock;
        let ledger = KeyedLedger::with_hasher(4, fixed()).unwrap();
        let cap = Arc::new(RwLock::new(2_u64));
        let running = ledger.try_acquire_with_cap(&7_u8, 2).unwrap();
        let arriving = {
            let (ledger, cap) = (ledger.clone(), cap.clone());
            loom::thread::spawn(move || {
                let read = *cap.read().unwrap();
                let permit = ledger.try_acquire_with_cap(&7, read).ok()?;
                let now = *cap.read().unwrap();
                (ledger.in_flight(&7) <= now).then_some(permit)
            })
        };
        let first = ledger.in_flight(&7);
        let kept = {
            let mut cap = cap.write().unwrap();
            *cap = (*cap).min(first);
            *cap
        };
        let told = kept.max(ledger.in_flight(&7));
        let arrived = arriving.join().unwrap();
        let held = 1 + u64::from(arrived.is_some());
        assert!(held <= told, "{held} kept, {told} reported");
        assert_eq!(ledger.in_flight(&7), held);
        drop(running);
    });
}
