//! The keyed ledger's unit tests: its API, limits and lifetime.

use super::entry::home;
use super::*;
use std::collections::hash_map::RandomState;

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
}

#[test]
fn the_keys_high_water_mark_follows_readings_unbounded_and_every_new_key_bounded() {
    // Unbounded: new keys are not counted as they come, so the mark is what readings
    // saw: two keys came and went unread, then one was read.
    let ledger = KeyedLedger::new(1).unwrap();
    drop([
        ledger.try_acquire(&1).unwrap(),
        ledger.try_acquire(&2).unwrap(),
    ]);
    let three = ledger.try_acquire(&3).unwrap();
    assert_eq!(ledger.snapshot().keys_high_water, 1);
    drop(three);
    assert_eq!(ledger.snapshot().keys_high_water, 1);
    // Bounded: every new key is counted, and the mark follows them unread.
    ledger.set_max_keys(10).unwrap();
    drop([
        ledger.try_acquire(&1).unwrap(),
        ledger.try_acquire(&2).unwrap(),
    ]);
    assert_eq!(ledger.snapshot().keys_high_water, 2);
}

#[test]
fn a_new_key_at_home_takes_no_lock_and_says_how_many_keys_only_while_they_are_bounded() {
    // The acquisition a gate makes (it records the keys high-water mark itself).
    let ledger = KeyedLedger::with_hasher(1, fixed()).unwrap();
    let place = |k: &u64| {
        let hash = ledger.inner().hasher.hash_one(k);
        (KeyedInner::<u64, ()>::shard_index(hash), home(hash))
    };
    assert!(place(&1) != place(&2) && place(&2) != place(&3) && place(&1) != place(&3));
    let before = lock_count::so_far();
    // Unbounded: the new entry takes no share of the word, so it counts no keys.
    let (one, keys) = ledger.try_acquire_unobserved(&1, None).unwrap();
    assert_eq!(keys, None);
    // Bounded: it takes a share, checked against the bound: the keys it brings the
    // ledger to, or a refusal at the bound; neither under the lock.
    ledger.set_max_keys(2).unwrap();
    let (two, keys) = ledger.try_acquire_unobserved(&2, None).unwrap();
    assert_eq!(keys, Some(2));
    assert_eq!(
        ledger.try_acquire_unobserved(&3, None).unwrap_err(),
        Refused::KeyTable
    );
    assert_eq!(
        lock_count::so_far(),
        before,
        "a new key at home took the lock"
    );
    assert_eq!((*one.key(), *two.key()), (1, 2));
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
fn a_bound_counts_the_keys_in_flight_and_can_be_set_again_and_removed() {
    // A fixed hasher: whether a new key finds its home free (made without the lock,
    // without a share) or not (made under the lock, with one) is then the same in
    // every run. (With a random one, a key of 4..8 sharing a home failed 2 runs in 300.)
    let fixed =
        std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
    let ledger = KeyedLedger::with_limits(2, 0, fixed).unwrap();
    let counted = || ledger.inner().state.load(Ordering::Relaxed) & KEYS;
    // Unbounded, two keys are made without a share of the word.
    let a = ledger.try_acquire(&1).unwrap();
    let b = ledger.try_acquire(&2).unwrap();
    assert_eq!((ledger.keys(), counted()), (2, 0));
    // A bound counts them: a third key is one too many. Set again, the same.
    ledger.set_max_keys(2).unwrap();
    assert_eq!(counted(), 2);
    assert_eq!(ledger.try_acquire(&3).unwrap_err(), Refused::KeyTable);
    ledger.set_max_keys(2).unwrap();
    assert_eq!(ledger.try_acquire(&3).unwrap_err(), Refused::KeyTable);
    drop(b);
    let c = ledger.try_acquire(&3).unwrap();
    assert_eq!(ledger.try_acquire(&4).unwrap_err(), Refused::KeyTable);
    // Removed with keys in flight: they keep their permits (and shares), and new keys
    // are made without a share again.
    ledger.set_max_keys_unlimited();
    assert_eq!((ledger.in_flight(&1), ledger.in_flight(&3)), (1, 1));
    let more: Vec<_> = (4..8).map(|k| ledger.try_acquire(&k).unwrap()).collect();
    assert_eq!((ledger.keys(), counted()), (6, 2));
    drop((a, c, more));
    assert_eq!((ledger.keys(), counted()), (0, 0));
    // A bound given at construction holds from the first key.
    let ledger = KeyedLedger::with_limits(1, 1, RandomState::new()).unwrap();
    let _a = ledger.try_acquire(&1).unwrap();
    assert_eq!(ledger.try_acquire(&2).unwrap_err(), Refused::KeyTable);
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
fn limits_beyond_what_a_key_or_the_word_holds_cannot_be_represented() {
    // A cap is what one key's `held` field holds (less the look's one): 2^32 - 2.
    assert_eq!(KeyedLedger::<u8>::MAX_CAP, (1 << 32) - 2);
    assert!(KeyedLedger::<u8>::new(KeyedLedger::<u8>::MAX_CAP).is_ok());
    assert!(KeyedLedger::<u8>::new(KeyedLedger::<u8>::MAX_CAP + 1).is_err());
    assert!(KeyedLedger::<u8>::new(usize::MAX >> 1).is_err());
    let ledger = KeyedLedger::<u8>::new(1).unwrap();
    assert!(ledger.set_max_keys(1 << 62).is_err());
    assert!(ledger.set_cap(KeyedLedger::<u8>::MAX_CAP + 1).is_err());
    assert_eq!(ledger.cap(), 1, "unchanged by the refused setting");
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
