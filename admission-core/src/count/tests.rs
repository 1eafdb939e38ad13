//! The count ledger's unit tests.

use super::*;
use std::future::Future;
use std::pin::Pin;
use std::task::Context;

/// The last permit and the last handle dropped on two threads at once, with no join
/// between them: whichever drop is last frees the ledger, and every use by the other
/// thread must happen before that free. Under Miri, weakening the release decrement
/// or the acquire load on the free path makes this a reported data race.
#[test]
fn the_last_permit_and_the_last_handle_dropped_on_two_threads_free_after_every_use() {
    for _ in 0..if cfg!(miri) { 8 } else { 1_000 } {
        let ledger = CountLedger::new(2).unwrap();
        let permit = ledger.try_acquire().unwrap();
        let t = std::thread::spawn(move || drop(permit));
        drop(ledger);
        t.join().unwrap();
    }
}

/// A waiting drain dropped with the last handle on one thread while the last permit
/// is released on another, with no join between: the release may inherit the drain's
/// share and take the lock after every handle is gone; it must unlock before it
/// gives the share up. (loom cannot see an unlock after the free; Miri can, as a use
/// after free: `.ci/run` runs the `two_threads` tests under Miri on eight schedules.)
#[test]
fn a_drain_and_the_last_handle_dropped_on_two_threads_while_the_last_permit_goes() {
    for _ in 0..if cfg!(miri) { 8 } else { 1_000 } {
        let ledger = CountLedger::new(2).unwrap();
        let permit = ledger.try_acquire().unwrap();
        let mut drain = ledger.drain();
        let poll = Pin::new(&mut drain).poll(&mut Context::from_waker(Waker::noop()));
        assert!(poll.is_pending());
        drop(ledger);
        let t = std::thread::spawn(move || drop(permit));
        drop(drain);
        t.join().unwrap();
    }
}

#[test]
fn bounds() {
    fn is_send_sync_unpin<T: Send + Sync + Unpin + 'static>() {}
    is_send_sync_unpin::<CountLedger>();
    is_send_sync_unpin::<CountPermit>();
    assert_eq!(
        std::mem::size_of::<CountPermit>(),
        std::mem::size_of::<usize>()
    );
}

#[test]
fn acquire_refuse_release_admit_again_and_back_to_zero() {
    let ledger = CountLedger::new(2).unwrap();
    let a = ledger.try_acquire().unwrap();
    let b = ledger.try_acquire().unwrap();
    assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Count);
    assert_eq!(ledger.in_flight(), 2);
    drop(a);
    assert_eq!(ledger.in_flight(), 1);
    let c = ledger.try_acquire().unwrap();
    drop(b);
    drop(c);
    assert_eq!(ledger.in_flight(), 0);
    assert_eq!(ledger.snapshot().refused, 1);
    assert_eq!(ledger.snapshot().high_water, 2);
}

#[test]
fn zero_capacity_means_unlimited_but_still_counted() {
    let ledger = CountLedger::new(0).unwrap();
    let permits: Vec<_> = (0..1000).map(|_| ledger.try_acquire().unwrap()).collect();
    assert_eq!(ledger.in_flight(), 1000);
    assert_eq!(ledger.capacity(), 0);
    drop(permits);
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn capacities_the_ledger_cannot_represent_are_errors_not_panics() {
    for capacity in [usize::MAX, usize::MAX - 1, CountLedger::MAX_CAPACITY + 1] {
        let err = CountLedger::new(capacity).unwrap_err();
        assert_eq!(err.requested(), capacity as u64);
    }
    let ledger = CountLedger::new(CountLedger::MAX_CAPACITY).unwrap();
    assert!(ledger.set_capacity(usize::MAX).is_err());
    assert_eq!(ledger.capacity(), CountLedger::MAX_CAPACITY as u64);
    let _p = ledger.try_acquire().unwrap();
}

#[test]
#[cfg(target_pointer_width = "64")]
fn a_capacity_reaching_the_reference_bit_cannot_be_represented() {
    assert!(CountLedger::new(usize::MAX >> 1).is_err());
    assert!(CountLedger::new(1 << 62).is_err());
    // Below the drain's bit (62) is the waiters' (61): the count is what is below both.
    assert!(CountLedger::new(1 << 61).is_err());
    assert!(CountLedger::new((1 << 61) - 1).is_ok());
}

#[test]
fn debug_output_names_the_state() {
    let ledger = CountLedger::new(3).unwrap();
    let p = ledger.try_acquire().unwrap();
    assert_eq!(
        format!("{ledger:?}"),
        "CountLedger { in_flight: 1, capacity: 3, closed: false }"
    );
    assert_eq!(format!("{p:?}"), "CountPermit { .. }");
}

#[test]
fn every_class_follows_a_capacity_change_and_a_close() {
    use crate::Priority;
    let ledger = CountLedger::new(10).unwrap();
    let fill = |priority| {
        let mut held = Vec::new();
        while let Ok(permit) = ledger.try_acquire_as(priority) {
            held.push(permit);
        }
        held.len()
    };
    assert_eq!(fill(Priority::SHEDDABLE), 7);
    assert_eq!(fill(Priority::DEFAULT), 9);
    assert_eq!(fill(Priority::CRITICAL), 10);
    ledger.set_capacity(20).unwrap();
    assert_eq!(fill(Priority::SHEDDABLE), 14);
    assert_eq!(fill(Priority::DEFAULT), 18);
    ledger.set_unlimited();
    assert_eq!(ledger.try_acquire_as(Priority::SHEDDABLE).map(drop), Ok(()));
    ledger.close();
    for class in [Priority::CRITICAL, Priority::SHEDDABLE] {
        assert_eq!(ledger.try_acquire_as(class).unwrap_err(), Refused::Closed);
    }
    // Each fill ended with one refusal; then one of each closed.
    assert_eq!(ledger.refused_by_class()[..4], [2, 2, 3, 0]);
    assert_eq!(ledger.snapshot().refused, 7);
}

#[test]
fn a_retry_is_shed_below_its_class_and_counted_once_as_a_retry() {
    use crate::Priority;
    let ledger = CountLedger::new(10).unwrap();
    let retry = Priority::DEFAULT.retry(50); // 45%: 4 of 10
    let mut held: Vec<_> = (0..4)
        .map(|_| ledger.try_acquire_as(retry).unwrap())
        .collect();
    assert_eq!(ledger.try_acquire_as(retry).unwrap_err(), Refused::Class);
    // The class's first attempts still have their 90%.
    held.extend((0..5).map(|_| ledger.try_acquire_as(Priority::DEFAULT).unwrap()));
    assert_eq!(
        ledger.try_acquire_as(Priority::DEFAULT).unwrap_err(),
        Refused::Class
    );
    let _critical = ledger.try_acquire_as(Priority::CRITICAL).unwrap();
    assert_eq!(ledger.try_acquire_as(retry).unwrap_err(), Refused::Count);
    // Refusals of the class: two retries and a first attempt; of retries, two.
    assert_eq!(ledger.refused_by_class()[..3], [0, 3, 0]);
    assert_eq!(ledger.refused_retries(), 2);
    assert_eq!(ledger.snapshot().refused, 3);
    // A retry refused before a wait is counted where the wait ends, as any.
    assert_eq!(
        ledger.try_acquire_before_wait(Some(retry)).unwrap_err(),
        Refused::Count
    );
    assert_eq!(ledger.refused_retries(), 2);
    drop(held);
    assert!(ledger.try_acquire_as(retry).is_ok());
}

#[test]
fn lowering_capacity_refuses_new_work_and_lets_held_permits_drain() {
    let ledger = CountLedger::new(3).unwrap();
    let held: Vec<_> = (0..3).map(|_| ledger.try_acquire().unwrap()).collect();
    ledger.set_capacity(1).unwrap();
    let mut held = held.into_iter();
    drop(held.next());
    assert!(ledger.try_acquire().is_err(), "2 held, capacity 1");
    drop(held.next());
    assert!(ledger.try_acquire().is_err(), "1 held, capacity 1");
    drop(held.next());
    let p = ledger.try_acquire().unwrap();
    assert!(ledger.try_acquire().is_err());
    drop(p);
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn raising_capacity_admits_more_at_once() {
    let ledger = CountLedger::new(1).unwrap();
    let _a = ledger.try_acquire().unwrap();
    assert!(ledger.try_acquire().is_err());
    ledger.set_capacity(2).unwrap();
    let _b = ledger.try_acquire().unwrap();
}

#[test]
fn the_last_reference_frees_the_ledger_whichever_it_is() {
    let before = crate::raw::live::count();
    let ledger = CountLedger::new(1).unwrap();
    let permit = ledger.try_acquire().unwrap();
    assert_eq!(crate::raw::live::count(), before + 1);
    drop(ledger);
    assert_eq!(crate::raw::live::count(), before + 1, "the permit keeps it");
    drop(permit);
    assert_eq!(crate::raw::live::count(), before, "the permit was the last");

    let ledger = CountLedger::new(1).unwrap();
    drop(ledger.try_acquire().unwrap());
    assert_eq!(crate::raw::live::count(), before + 1, "the handle keeps it");
    drop(ledger);
    assert_eq!(crate::raw::live::count(), before, "the handle was the last");
}

#[test]
fn a_permit_outliving_every_handle_releases_safely() {
    let ledger = CountLedger::new(1).unwrap();
    let clone = ledger.clone();
    let permit = ledger.try_acquire().unwrap();
    drop(ledger);
    assert_eq!(clone.in_flight(), 1);
    drop(clone);
    drop(permit);
}

#[test]
fn clones_share_one_limit() {
    let ledger = CountLedger::new(1).unwrap();
    let clone = ledger.clone();
    let _p = ledger.try_acquire().unwrap();
    assert_eq!(clone.try_acquire().unwrap_err(), Refused::Count);
}

#[test]
fn admits_all_only_while_unlimited_and_open() {
    let ledger = CountLedger::new(0).unwrap();
    assert!(ledger.admits_all());
    ledger.set_capacity(5).unwrap();
    assert!(!ledger.admits_all(), "limited");
    ledger.set_unlimited();
    assert!(ledger.admits_all());
    ledger.close();
    assert!(!ledger.admits_all(), "closed");
    ledger.reopen();
    assert!(ledger.admits_all());
    assert!(!CountLedger::new(1).unwrap().admits_all());
}

/// The hand-over `unwatch` must respect, taken apart: a release has taken the count
/// to zero with `WATCH` set (so `WATCH` is now that release's to give back) but has
/// not given it back yet, and the last drain stops waiting in between. The drain must
/// leave `WATCH` alone; the release then gives it back exactly once.
#[test]
fn concurrent_threads_never_exceed_the_capacity() {
    let ledger = CountLedger::new(3).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..if cfg!(miri) { 50 } else { 20_000 } {
                    if let Ok(p) = ledger.try_acquire() {
                        assert!(ledger.in_flight() <= 3);
                        drop(p);
                    }
                }
            });
        }
    });
    assert_eq!(ledger.in_flight(), 0);
    assert!(ledger.snapshot().high_water <= 3);
}

#[test]
fn concurrent_sheddable_work_never_fills_more_than_its_share() {
    use crate::Priority;
    let ledger = CountLedger::new(10).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let mut held = Vec::new();
                for i in 0..if cfg!(miri) { 50 } else { 20_000 } {
                    if let Ok(p) = ledger.try_acquire_as(Priority::SHEDDABLE) {
                        held.push(p);
                    }
                    // Each thread wants three at once: twelve against a share of 7.
                    if held.len() == 3 || i % 5 == 0 {
                        held.clear();
                    }
                }
            });
        }
    });
    let snap = ledger.snapshot();
    assert_eq!(snap.in_flight, 0);
    assert!(snap.high_water <= 7, "{}", snap.high_water);
    // The share is a threshold: critical work still gets the whole capacity.
    let all: Vec<_> = (0..10)
        .map(|_| ledger.try_acquire_as(Priority::CRITICAL).unwrap())
        .collect();
    assert_eq!(ledger.in_flight(), all.len() as u64);
}
