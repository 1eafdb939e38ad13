//! A panic in user code (the key's `Hash`, `Eq`, `Clone` or `Drop`, the hasher) leaves the
//! ledger as if the call had not started: no share of the word leaked, no home's `AWAY`
//! left raised, no slot left `BUSY`; a panic in the key's `Drop` during a release comes
//! after the release is complete. Each test provokes one trait's panic on one path, under
//! `catch_unwind`, then checks what a leak would break: the key count, `max_keys`
//! admission, the lock-free insert at that home, and that the ledger's memory and every
//! key are freed when the last handle and permit go.

use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::entry::home;
use super::*;
use crate::raw;

/// Which of the key's traits panics next (once), on this thread.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    Hash,
    Eq,
    Clone,
    Drop,
}

thread_local! {
    /// The fault armed, and how many calls of its trait pass before it fires.
    static FAULT: Cell<Option<(Fault, u32)>> = const { Cell::new(None) };
    /// Keys alive on this thread (made minus dropped).
    static LIVE: Cell<i64> = const { Cell::new(0) };
    /// A permit that a firing `Eq` drops before it panics.
    static STASH: std::cell::RefCell<Option<KeyedPermit<Touchy, Placed>>> = const { std::cell::RefCell::new(None) };
}

/// Whether `fault` fires at this call: then it is disarmed, and the caller panics.
fn fires(fault: Fault) -> bool {
    FAULT.with(|armed| match armed.get() {
        Some((armed_fault, 0)) if armed_fault == fault => {
            armed.set(None);
            true
        }
        Some((armed_fault, n)) if armed_fault == fault => {
            armed.set(Some((fault, n - 1)));
            false
        }
        _ => false,
    })
}

/// A key whose traits panic on demand, counting its instances.
#[derive(Debug)]
struct Touchy(u64);

impl Touchy {
    fn new(n: u64) -> Self {
        LIVE.with(|live| live.set(live.get() + 1));
        Touchy(n)
    }
}

impl Clone for Touchy {
    fn clone(&self) -> Self {
        assert!(!fires(Fault::Clone), "Clone panics");
        Touchy::new(self.0)
    }
}

impl PartialEq for Touchy {
    fn eq(&self, other: &Self) -> bool {
        if fires(Fault::Eq) {
            drop(STASH.with(|stash| stash.borrow_mut().take()));
            panic!("Eq panics");
        }
        self.0 == other.0
    }
}

impl Eq for Touchy {}

impl Hash for Touchy {
    fn hash<H: Hasher>(&self, state: &mut H) {
        assert!(!fires(Fault::Hash), "Hash panics");
        state.write_u64(self.0);
    }
}

impl Drop for Touchy {
    fn drop(&mut self) {
        LIVE.with(|live| live.set(live.get() - 1));
        assert!(!fires(Fault::Drop), "Drop panics");
    }
}

fn live_keys() -> i64 {
    LIVE.with(Cell::get)
}

/// A key whose home is slot `home` of shard 0.
fn at(home: u64, n: u64) -> Touchy {
    Touchy::new((home << 16) | n)
}

/// Runs `f` with `fault` armed, and says whether it panicked (disarming it either way).
fn panics_with<T>(fault: Fault, f: impl FnOnce() -> T) -> bool {
    panics_at(fault, 0, f)
}

/// `panics_with`, the fault firing at the call of its trait after `pass` calls.
fn panics_at<T>(fault: Fault, pass: u32, f: impl FnOnce() -> T) -> bool {
    FAULT.with(|armed| armed.set(Some((fault, pass))));
    let result = catch_unwind(AssertUnwindSafe(f));
    FAULT.with(|armed| armed.set(None));
    result.is_err()
}

/// No slot of the ledger is `BUSY`, and no home has keys away but those that are.
fn assert_settled(ledger: &KeyedLedger<Touchy, Placed>) {
    let inner = ledger.inner();
    for (s, slots) in inner.slots.iter().enumerate() {
        let away_mask = inner.shards[s].away.load(Ordering::Relaxed);
        let table = inner.shards[s].table.lock();
        for (place, slot) in slots.iter().enumerate() {
            let state = slot.state.load(Ordering::Relaxed);
            assert_eq!(state & BUSY, 0, "slot {s}/{place} left busy");
            // Keys whose home is this slot and whose entry is elsewhere.
            let mut away = 0;
            for (other, entry) in slots.iter().enumerate() {
                let held = entry.state.load(Ordering::Relaxed) & HELD != 0;
                let hash = entry.hash.load(Ordering::Relaxed);
                if held && away_mask & 1 << other != 0 && home(hash) == place {
                    away += 1;
                }
            }
            for e in table.iter() {
                if home(e.get().hash.load(Ordering::Relaxed)) == place {
                    away += 1;
                }
            }
            assert_eq!((state & AWAY) / AWAY_ONE, away, "slot {s}/{place}'s AWAY");
        }
    }
}

/// After a fault: the ledger counts `keys`, admits exactly up to a bound of `keys + 1`,
/// makes a new key at the home `home` without the lock once that home is free, and frees
/// its memory and every key when it and `held` go.
fn assert_whole(ledger: KeyedLedger<Touchy, Placed>, held: Vec<KeyedPermit<Touchy, Placed>>) {
    assert_settled(&ledger);
    let keys = held.len() as u64;
    assert_eq!(ledger.keys(), keys, "keys counted");
    ledger.set_max_keys(keys as usize + 1).unwrap();
    let one_more = ledger
        .try_acquire(&at(20, 1))
        .expect("room for one more key");
    assert_eq!(
        ledger.try_acquire(&at(21, 1)).unwrap_err(),
        Refused::KeyTable,
        "and no more"
    );
    drop(one_more);
    ledger.set_max_keys_unlimited();
    drop(held);
    assert_settled(&ledger);
    assert_eq!(ledger.keys(), 0);
    // Every home free again: a new key at home 7 takes no lock.
    let before = lock_count::so_far();
    drop(ledger.try_acquire(&at(7, 99)).unwrap());
    assert_eq!(
        lock_count::so_far(),
        before,
        "a new key at home 7 took the lock"
    );
    drop(ledger);
}

/// The test body, with the ledger's memory and the keys counted around it.
fn counted(test: impl FnOnce()) {
    let (cells, keys) = (raw::live::count(), live_keys());
    test();
    assert_eq!(raw::live::count(), cells, "the ledger's memory freed");
    assert_eq!(live_keys(), keys, "every key dropped");
}

#[test]
fn a_panicking_hash_or_hasher_changes_nothing() {
    counted(|| {
        let ledger = KeyedLedger::with_hasher(2, Placed::default()).unwrap();
        let a = ledger.try_acquire(&at(7, 1)).unwrap();
        assert!(panics_with(Fault::Hash, || ledger.try_acquire(&at(7, 1))));
        assert!(panics_with(Fault::Hash, || ledger.try_acquire(&at(8, 1))));
        assert!(panics_with(Fault::Hash, || ledger.in_flight(&at(7, 1))));
        assert_eq!(ledger.in_flight(&at(7, 1)), 1);
        drop(a);
        assert_whole(ledger, Vec::new());
    });
}

#[test]
fn a_panicking_clone_of_a_new_key_at_home_leaves_the_home_free() {
    counted(|| {
        let ledger = KeyedLedger::with_hasher(2, Placed::default()).unwrap();
        // Unbounded, then bounded: the lock-free insert, without and with a share.
        assert!(panics_with(Fault::Clone, || ledger.try_acquire(&at(7, 1))));
        assert_settled(&ledger);
        ledger.set_max_keys(4).unwrap();
        assert!(panics_with(Fault::Clone, || ledger.try_acquire(&at(7, 1))));
        ledger.set_max_keys_unlimited();
        assert_whole(ledger, Vec::new());
    });
}

#[test]
fn a_panicking_clone_under_the_lock_leaks_no_share_and_no_away() {
    counted(|| {
        // Every key one hash: the first is at home, the next ones are made under the lock
        // (away in the window, then in the overflow table).
        let ledger = KeyedLedger::with_hasher(2, Placed { same: true }).unwrap();
        let mut held = vec![ledger.try_acquire(&Touchy::new(1)).unwrap()];
        for n in 2..=10 {
            assert!(panics_with(Fault::Clone, || ledger.try_acquire(&Touchy::new(n))));
            assert_settled(&ledger);
            held.push(ledger.try_acquire(&Touchy::new(n)).unwrap());
        }
        let overflow = ledger.inner().shards[0].table.lock().len();
        assert!(overflow > 0, "the last keys went to the overflow table");
        // Bounded, the same.
        ledger.set_max_keys(20).unwrap();
        assert!(panics_with(Fault::Clone, || ledger.try_acquire(&Touchy::new(11))));
        ledger.set_max_keys_unlimited();
        drop(held);
        let ledger = {
            // `assert_whole` places its keys by home: give it a ledger that does.
            assert_settled(&ledger);
            assert_eq!(ledger.keys(), 0);
            ledger
        };
        drop(ledger);
        let ledger = KeyedLedger::with_hasher(2, Placed::default()).unwrap();
        assert_whole(ledger, Vec::new());
    });
}

#[test]
fn a_panicking_eq_under_the_lock_leaves_no_away_raised() {
    counted(|| {
        let ledger = KeyedLedger::with_hasher(2, Placed { same: true }).unwrap();
        let first = ledger.try_acquire(&Touchy::new(1)).unwrap();
        let second = ledger.try_acquire(&Touchy::new(2)).unwrap();
        // A third key compares against the home's key and the second's without the lock
        // (two calls of `Eq`), then, under the lock, against the home's key again: there
        // it panics, with the look's one in the home's `AWAY`.
        let before = lock_count::so_far();
        assert!(panics_at(Fault::Eq, 2, || ledger.try_acquire(&Touchy::new(3))));
        assert_eq!(
            lock_count::so_far(),
            before + 1,
            "the panic came under the lock"
        );
        assert_settled(&ledger);
        assert_eq!(ledger.keys(), 2);
        assert_eq!(
            (
                ledger.in_flight(&Touchy::new(1)),
                ledger.in_flight(&Touchy::new(2))
            ),
            (1, 1)
        );
        drop((first, second));
        assert_settled(&ledger);
        drop(ledger);
        let ledger = KeyedLedger::with_hasher(2, Placed::default()).unwrap();
        // The lock-free path compares too: a key of the same hash as one at home.
        let a = ledger.try_acquire(&at(7, 1)).unwrap();
        assert!(panics_with(Fault::Eq, || ledger.try_acquire(&at(7, 1))));
        assert_eq!(
            ledger.in_flight(&at(7, 1)),
            1,
            "the count taken to compare went back"
        );
        assert_whole(ledger, vec![a]);
    });
}

/// The count a look under the lock takes on the home to compare keys is that entry's last
/// when its key's own permit goes meanwhile (here: dropped by the panicking `Eq` itself):
/// given back on unwind, it empties the entry under the lock the look holds, without taking
/// that lock again.
#[test]
fn a_panicking_eq_under_the_lock_gives_back_a_last_count_without_relocking() {
    counted(|| {
        let ledger = KeyedLedger::with_hasher(2, Placed { same: true }).unwrap();
        let first = ledger.try_acquire(&Touchy::new(1)).unwrap();
        let second = ledger.try_acquire(&Touchy::new(2)).unwrap();
        STASH.with(|stash| *stash.borrow_mut() = Some(first));
        assert!(panics_at(Fault::Eq, 2, || ledger.try_acquire(&Touchy::new(3))));
        assert_settled(&ledger);
        assert_eq!(ledger.keys(), 1, "the first key's entry emptied");
        assert_eq!(ledger.in_flight(&Touchy::new(1)), 0);
        drop(second);
        assert_settled(&ledger);
        drop(ledger);
        assert_whole(
            KeyedLedger::with_hasher(2, Placed::default()).unwrap(),
            Vec::new(),
        );
    });
}

#[test]
fn a_panicking_drop_of_the_last_key_comes_after_its_release() {
    counted(|| {
        // At home (lock-free release) and away from home (under the lock).
        let ledger = KeyedLedger::with_hasher(2, Placed { same: true }).unwrap();
        let home_permit = ledger.try_acquire(&Touchy::new(1)).unwrap();
        let away_permit = ledger.try_acquire(&Touchy::new(2)).unwrap();
        ledger.set_max_keys(2).unwrap();
        assert!(panics_with(Fault::Drop, || drop(away_permit)));
        assert!(panics_with(Fault::Drop, || drop(home_permit)));
        assert_settled(&ledger);
        assert_eq!(ledger.keys(), 0);
        // Both keys' places and shares are free: two new keys fit the bound.
        let again = [
            ledger.try_acquire(&Touchy::new(3)).unwrap(),
            ledger.try_acquire(&Touchy::new(4)).unwrap(),
        ];
        drop(again);
        drop(ledger);
        // The last permit outliving the last handle: the free comes before the key's drop,
        // at home and in the overflow table (its entry freed too).
        let ledger = KeyedLedger::with_hasher(2, Placed::default()).unwrap();
        let last = ledger.try_acquire(&at(7, 1)).unwrap();
        drop(ledger);
        assert!(panics_with(Fault::Drop, || drop(last)));
        let ledger = KeyedLedger::with_hasher(2, Placed { same: true }).unwrap();
        let mut held: Vec<_> = (1..=WINDOW as u64 + 1)
            .map(|n| ledger.try_acquire(&Touchy::new(n)).unwrap())
            .collect();
        assert_eq!(ledger.inner().shards[0].table.lock().len(), 1);
        let in_table = held.pop().unwrap();
        drop(held);
        drop(ledger);
        assert!(panics_with(Fault::Drop, || drop(in_table)));
    });
}

/// A slot left `BUSY` by a thread descheduled in the middle of a fill or an emptying
/// (here: set by hand) holds up only the keys whose home it is. A thread that meets it
/// under the shard lock lets go of the lock while it waits, so that every other key of
/// the shard, at the lock or not, is served meanwhile.
#[test]
#[cfg_attr(miri, ignore = "timed: Miri runs it far slower than its bounds")]
fn a_busy_slot_holds_up_no_other_key_of_its_shard() {
    use std::sync::mpsc;
    use std::time::Duration;

    let ledger = KeyedLedger::with_hasher(1, Placed::default()).unwrap();
    let busy = &ledger.inner().slots[0][home(7 << 16)];
    busy.state.fetch_or(BUSY, Ordering::Relaxed);
    // A key of home 7 goes to the lock (its home is busy), and waits for the slot.
    let waiter = {
        let ledger = ledger.clone();
        std::thread::spawn(move || ledger.try_acquire(&at(7, 1)).map(drop).is_ok())
    };
    std::thread::sleep(Duration::from_millis(50));
    // A key of another home, at its cap: refused under the same shard's lock.
    assert_ne!(home(9 << 16), home(7 << 16));
    let other = ledger.try_acquire(&at(9, 1)).unwrap();
    let (done, answered) = mpsc::channel();
    let refuser = {
        let ledger = ledger.clone();
        std::thread::spawn(move || {
            let refused = ledger.try_acquire(&at(9, 1)).unwrap_err();
            let _ = done.send(refused);
        })
    };
    let answer = answered.recv_timeout(Duration::from_secs(2));
    // Let the waiter go whatever happened, so that the test ends.
    busy.state.fetch_and(!BUSY, Ordering::Relaxed);
    refuser.join().unwrap();
    assert!(
        waiter.join().unwrap(),
        "the waiter is served once the slot is free"
    );
    assert_eq!(
        answer.expect("another key of the shard was held up by the busy slot"),
        Refused::Key
    );
    drop(other);
}
