//! The drain: woken by the last release, dropped, reopened, waited on by a thread.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use super::{CountInner, CountLedger, Drain, OWNER, Refused, WATCH};
use crate::sync::Ordering;

/// A waker that counts its wakes.
struct Count(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Count {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn counting_waker() -> (std::sync::Arc<Count>, Waker) {
    let count = std::sync::Arc::new(Count(0.into()));
    (count.clone(), Waker::from(count))
}

fn wakes(count: &Count) -> usize {
    count.0.load(std::sync::atomic::Ordering::SeqCst)
}

fn poll(drain: &mut Drain, waker: &Waker) -> Poll<()> {
    Pin::new(drain).poll(&mut Context::from_waker(waker))
}

#[test]
fn the_last_release_wakes_every_drain_and_only_the_last() {
    let ledger = CountLedger::new(4).unwrap();
    let (a, b) = (ledger.try_acquire().unwrap(), ledger.try_acquire().unwrap());
    let (wakes_1, waker_1) = counting_waker();
    let (wakes_2, waker_2) = counting_waker();
    let mut first = ledger.drain();
    let mut second = ledger.drain();
    assert!(poll(&mut first, &waker_1).is_pending());
    assert!(poll(&mut second, &waker_2).is_pending());
    assert_eq!(ledger.in_flight(), 2, "waiting is not counted as in flight");
    drop(a);
    assert_eq!(
        (wakes(&wakes_1), wakes(&wakes_2)),
        (0, 0),
        "one still in flight"
    );
    drop(b);
    assert_eq!((wakes(&wakes_1), wakes(&wakes_2)), (1, 1));
    assert!(poll(&mut first, &waker_1).is_ready());
    assert!(poll(&mut second, &waker_2).is_ready());
    // The bit the drains set is gone: after a reopening, admission is as before.
    ledger.reopen();
    let again: Vec<_> = (0..4).map(|_| ledger.try_acquire().unwrap()).collect();
    assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Count);
    drop(again);
}

#[test]
fn a_drain_is_ready_at_once_with_nothing_in_flight_and_leaves_no_bit_behind() {
    let ledger = CountLedger::new(1).unwrap();
    let (wakes_1, waker) = counting_waker();
    let mut drain = ledger.drain();
    assert!(poll(&mut drain, &waker).is_ready());
    assert_eq!(wakes(&wakes_1), 0);
    ledger.reopen();
    drop(ledger.try_acquire().unwrap());
}

#[test]
fn a_drain_dropped_while_waiting_stops_waiting_and_admission_resumes_on_reopen() {
    let ledger = CountLedger::new(2).unwrap();
    let held = ledger.try_acquire().unwrap();
    let (wakes_1, waker) = counting_waker();
    let mut drain = ledger.drain();
    assert!(poll(&mut drain, &waker).is_pending());
    drop(drain);
    assert!(
        ledger.is_closed(),
        "dropping the drain leaves the ledger closed"
    );
    drop(held);
    assert_eq!(wakes(&wakes_1), 0, "nobody waits any more");
    ledger.reopen();
    let _a = ledger.try_acquire().unwrap();
    let _b = ledger.try_acquire().unwrap();
    assert_eq!(ledger.in_flight(), 2);
}

#[test]
fn reopening_ends_a_drain_and_admits_while_permits_are_still_held() {
    let ledger = CountLedger::new(2).unwrap();
    let held = ledger.try_acquire().unwrap();
    let (wakes_1, waker) = counting_waker();
    let mut drain = ledger.drain();
    assert!(poll(&mut drain, &waker).is_pending());
    ledger.reopen();
    assert_eq!(wakes(&wakes_1), 1, "the reopening woke the drain");
    assert!(poll(&mut drain, &waker).is_ready());
    let second = ledger.try_acquire().expect("open again, one slot free");
    drop((held, second, drain));
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn a_drain_polled_again_with_a_new_waker_wakes_the_new_one() {
    let ledger = CountLedger::new(2).unwrap();
    let held = ledger.try_acquire().unwrap();
    let (old, old_waker) = counting_waker();
    let (new, new_waker) = counting_waker();
    let mut drain = ledger.drain();
    assert!(poll(&mut drain, &old_waker).is_pending());
    assert!(poll(&mut drain, &new_waker).is_pending());
    drop(held);
    assert_eq!((wakes(&old), wakes(&new)), (0, 1));
}

#[test]
fn closing_survives_capacity_changes_and_reopening_applies_the_latest() {
    let ledger = CountLedger::new(1).unwrap();
    ledger.close();
    ledger.set_capacity(3).unwrap();
    ledger.set_unlimited();
    ledger.set_capacity(2).unwrap();
    assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Closed);
    assert_eq!(ledger.capacity(), 2);
    ledger.reopen();
    let held: Vec<_> = (0..2).map(|_| ledger.try_acquire().unwrap()).collect();
    assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Count);
    drop(held);
}

#[test]
fn a_blocking_wait_returns_only_after_the_last_release_and_a_timeout_says_so() {
    let ledger = CountLedger::new(1).unwrap();
    let permit = ledger.try_acquire().unwrap();
    assert!(
        !ledger
            .drain()
            .wait_timeout(std::time::Duration::from_millis(20))
    );
    let released = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let t = {
        let released = released.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            released.store(true, std::sync::atomic::Ordering::SeqCst);
            drop(permit);
        })
    };
    let drain = ledger.drain();
    assert_eq!(
        format!("{drain:?}"),
        "Drain { in_flight: 1, waiting: false }"
    );
    drain.wait();
    assert!(released.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(ledger.in_flight(), 0);
    t.join().unwrap();
}

#[test]
fn a_drain_that_stops_waiting_leaves_an_inherited_watch_to_the_release() {
    let before = crate::raw::live::count();
    let ledger = CountLedger::new(2).unwrap();
    let permit = ledger.try_acquire().unwrap();
    let (_, waker) = counting_waker();
    let mut drain = ledger.drain();
    assert!(poll(&mut drain, &waker).is_pending());
    let state = &ledger.inner().hot.state;
    assert_eq!(state.load(Ordering::SeqCst), OWNER | WATCH | 1);
    // The release's decrement, without the rest of the release.
    let ptr = permit.inner;
    std::mem::forget(permit);
    state.fetch_sub(1, Ordering::SeqCst);
    drop(drain);
    assert_eq!(
        state.load(Ordering::SeqCst),
        OWNER | WATCH,
        "the inherited WATCH is the release's, not the drain's"
    );
    // The rest of the release: it gives WATCH back, once.
    // SAFETY: as `last_out` requires: the decrement above took the count from one to
    // zero with `WATCH` set, and `ptr` is not used again.
    unsafe { CountInner::last_out(ptr) };
    assert_eq!(ledger.inner().hot.state.load(Ordering::SeqCst), OWNER);
    drop(ledger);
    assert_eq!(crate::raw::live::count(), before, "freed once, not leaked");
}

#[test]
fn a_drain_that_stops_waiting_with_permits_in_flight_takes_its_watch_back() {
    let ledger = CountLedger::new(2).unwrap();
    let permit = ledger.try_acquire().unwrap();
    let (_, waker) = counting_waker();
    let mut drain = ledger.drain();
    assert!(poll(&mut drain, &waker).is_pending());
    drop(drain);
    assert_eq!(ledger.inner().hot.state.load(Ordering::SeqCst), OWNER | 1);
    drop(permit);
    assert_eq!(ledger.inner().hot.state.load(Ordering::SeqCst), OWNER);
}

#[test]
fn a_blocking_drain_returns_when_another_thread_releases_the_last_permit() {
    let ledger = CountLedger::new(2).unwrap();
    let permits: Vec<_> = (0..2).map(|_| ledger.try_acquire().unwrap()).collect();
    let drain = ledger.drain();
    let t = std::thread::spawn(move || drop(permits));
    assert!(drain.wait_timeout(std::time::Duration::from_secs(10)));
    t.join().unwrap();
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn the_last_permit_released_after_every_handle_and_a_waiting_drain_frees_once() {
    let before = crate::raw::live::count();
    let ledger = CountLedger::new(1).unwrap();
    let permit = ledger.try_acquire().unwrap();
    let (_, waker) = counting_waker();
    let mut drain = ledger.drain();
    assert!(poll(&mut drain, &waker).is_pending());
    drop(ledger);
    drop(drain);
    assert_eq!(crate::raw::live::count(), before + 1, "the permit keeps it");
    drop(permit);
    assert_eq!(crate::raw::live::count(), before);
}
