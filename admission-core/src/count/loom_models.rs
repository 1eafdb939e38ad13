//! The count ledger's loom models (`cargo xtask loom`).

use super::*;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Three threads contend for two permits: never more than two held, zero at the end,
/// and the ledger is freed (loom fails the model on a leak).
#[test]
fn count_acquire_release_never_exceeds_capacity() {
    const CAPACITY: usize = 2;
    loom::model(|| {
        let ledger = CountLedger::new(CAPACITY).unwrap();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let ledger = ledger.clone();
                loom::thread::spawn(move || {
                    let permit = ledger.try_acquire();
                    assert!(ledger.in_flight() <= CAPACITY as u64);
                    drop(permit);
                })
            })
            .collect();
        let main = ledger.try_acquire();
        assert!(ledger.in_flight() <= CAPACITY as u64);
        drop(main);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(ledger.in_flight(), 0);
    });
}

/// A permit dropped on another thread after the last handle frees the ledger once.
#[test]
fn count_permit_dropped_after_last_handle_frees_once() {
    loom::model(|| {
        let ledger = CountLedger::new(2).unwrap();
        let a = ledger.try_acquire().unwrap();
        let b = ledger.try_acquire().unwrap();
        let t = loom::thread::spawn(move || drop(a));
        drop(ledger);
        drop(b);
        t.join().unwrap();
    });
}

/// Wakes a model thread parked in `block_on`.
struct Unpark(loom::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `drain` to completion, parking the model thread between polls (a lost
/// wake-up is a deadlock, which loom reports).
fn block_on(mut drain: Drain) {
    let waker = Waker::from(std::sync::Arc::new(Unpark(loom::thread::current())));
    while Pin::new(&mut drain)
        .poll(&mut Context::from_waker(&waker))
        .is_pending()
    {
        loom::thread::park();
    }
}

fn poll_once(drain: &mut Drain) -> Poll<()> {
    Pin::new(drain).poll(&mut Context::from_waker(Waker::noop()))
}

/// A drain waiting on one thread, the last permit released on another: the drain
/// completes (it is woken, or sees zero), what was done under the permit happens
/// before it completes, and whichever of the releasing thread and the handles goes
/// last frees the ledger once, after every use.
#[test]
fn drain_woken_by_the_last_release_on_another_thread() {
    loom::model(|| {
        let ledger = CountLedger::new(2).unwrap();
        let permit = ledger.try_acquire().unwrap();
        let work = std::sync::Arc::new(loom::cell::UnsafeCell::new(0_u32));
        let drain = ledger.drain();
        let t = {
            let work = work.clone();
            loom::thread::spawn(move || {
                // SAFETY: the only access until the permit is released.
                work.with_mut(|w| unsafe { *w = 1 });
                drop(permit);
            })
        };
        block_on(drain);
        // SAFETY: the drain completed: the writer's release happened before.
        assert_eq!(work.with(|w| unsafe { *w }), 1);
        assert_eq!(ledger.in_flight(), 0);
        drop(ledger);
        t.join().unwrap();
    });
}

/// The race the `WATCH` share exists for: a drain that has registered is dropped,
/// with the last handle, while the last permit is released on another thread. The
/// release may inherit the share and wake under the lock after every handle is gone;
/// the ledger must be freed exactly once, after that.
#[test]
fn drain_cancelled_while_the_last_permit_drops() {
    loom::model(|| {
        let ledger = CountLedger::new(2).unwrap();
        let permit = ledger.try_acquire().unwrap();
        let mut drain = ledger.drain();
        assert!(poll_once(&mut drain).is_pending());
        drop(ledger);
        let t = loom::thread::spawn(move || drop(permit));
        drop(drain);
        t.join().unwrap();
    });
}

/// A reopening racing the last release under a waiting drain: the drain completes
/// either way, and once the release is done the ledger admits to its capacity.
#[test]
fn reopen_racing_the_last_release_under_a_drain() {
    loom::model(|| {
        let ledger = CountLedger::new(1).unwrap();
        let permit = ledger.try_acquire().unwrap();
        let mut drain = ledger.drain();
        assert!(poll_once(&mut drain).is_pending());
        let t = loom::thread::spawn(move || drop(permit));
        ledger.reopen();
        assert!(
            poll_once(&mut drain).is_ready(),
            "reopened: no longer draining"
        );
        t.join().unwrap();
        let again = ledger.try_acquire().expect("open, nothing in flight");
        assert!(ledger.try_acquire().is_err(), "capacity 1");
        drop((again, drain));
    });
}

/// A close racing a capacity change (an operator, or a controller): whichever runs
/// last, the ledger ends closed, and a reopening then applies the new capacity. The
/// threshold is written from both settings under one lock, so no interleaving
/// leaves the new capacity in force while closed.
#[test]
fn close_racing_set_capacity_stays_closed() {
    loom::model(|| {
        let ledger = CountLedger::new(1).unwrap();
        let setter = {
            let ledger = ledger.clone();
            loom::thread::spawn(move || ledger.set_capacity(3).unwrap())
        };
        ledger.close();
        setter.join().unwrap();
        assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Closed);
        ledger.reopen();
        let held: Vec<_> = (0..3).map(|_| ledger.try_acquire().unwrap()).collect();
        assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Count);
        drop(held);
    });
}

/// `set_capacity` racing an acquisition: the new permit never makes the count exceed
/// the larger of the two capacities, and a held permit is never revoked.
#[test]
fn set_capacity_racing_acquisitions() {
    loom::model(|| {
        let ledger = CountLedger::new(2).unwrap();
        let held = ledger.try_acquire().unwrap();
        let setter = {
            let ledger = ledger.clone();
            loom::thread::spawn(move || ledger.set_capacity(1).unwrap())
        };
        let second = ledger.try_acquire();
        setter.join().unwrap();
        // Once the lowering is visible, `held` alone fills capacity 1.
        assert!(ledger.try_acquire().is_err());
        assert!(ledger.in_flight() <= 2);
        drop(second);
        drop(held);
        assert_eq!(ledger.in_flight(), 0);
        assert!(ledger.try_acquire().is_ok());
    });
}

/// Polls `acquire` to completion, parking the model thread between polls (a lost wake-up
/// is a deadlock, which loom reports).
fn acquire_blocking(mut acquire: Acquire) -> Result<CountPermit, Refused> {
    let waker = Waker::from(std::sync::Arc::new(Unpark(loom::thread::current())));
    loop {
        if let Poll::Ready(outcome) = Pin::new(&mut acquire).poll(&mut Context::from_waker(&waker))
        {
            return outcome;
        }
        loom::thread::park();
    }
}

/// A waiter queueing on one thread while the only permit is released on another: the
/// release either comes first in the word (and the waiter, having set `QUEUE`, takes the
/// freed slot itself) or finds `QUEUE` and hands the slot over; either way the waiter is
/// served (a lost wake-up deadlocks the model), never more than the capacity is held,
/// and the ledger ends empty and is freed. Without the waiter's own grant after it queues,
/// the first order loses the slot's wake-up and the model deadlocks.
#[test]
fn a_waiter_is_served_by_a_release_racing_its_queueing() {
    loom::model(|| {
        let ledger = CountLedger::new(1).unwrap();
        ledger.set_max_waiting(1);
        let permit = ledger.try_acquire().unwrap();
        let t = loom::thread::spawn(move || drop(permit));
        let served = acquire_blocking(ledger.acquire()).expect("served");
        assert_eq!(ledger.in_flight(), 1);
        drop(served);
        t.join().unwrap();
        assert_eq!(ledger.in_flight(), 0);
        assert_eq!(ledger.waiting(), 0);
        assert!(ledger.try_acquire().is_ok(), "no trace of the queue");
    });
}

/// A queued waiter dropped on one thread while the release that would serve it runs on
/// another: the slot is handed to the waiter and released again by its drop, or given
/// back because the waiter has gone; either way nothing stays held or queued, and the
/// last of the handle and the permit frees the ledger once.
#[test]
fn a_waiter_dropped_while_the_release_that_serves_it_runs() {
    loom::model(|| {
        let ledger = CountLedger::new(1).unwrap();
        ledger.set_max_waiting(1);
        let permit = ledger.try_acquire().unwrap();
        let mut waiter = ledger.acquire();
        assert!(
            Pin::new(&mut waiter)
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_pending()
        );
        let t = loom::thread::spawn(move || drop(permit));
        drop(waiter);
        t.join().unwrap();
        assert_eq!(ledger.in_flight(), 0);
        assert_eq!(ledger.waiting(), 0);
        assert_eq!(ledger.inner().hot.state.load(Ordering::Relaxed) & QUEUE, 0);
    });
}

/// Two waiters, two releases, on three threads: each waiter is served once, never above
/// the capacity.
#[test]
fn two_waiters_and_two_releases_on_three_threads() {
    loom::model(|| {
        let ledger = CountLedger::new(2).unwrap();
        ledger.set_max_waiting(2);
        let a = ledger.try_acquire().unwrap();
        let b = ledger.try_acquire().unwrap();
        let t = loom::thread::spawn(move || {
            drop(a);
            drop(b);
        });
        let other = {
            let ledger = ledger.clone();
            loom::thread::spawn(move || {
                let permit = acquire_blocking(ledger.acquire()).expect("served");
                assert!(ledger.in_flight() <= 2);
                drop(permit);
            })
        };
        let permit = acquire_blocking(ledger.acquire()).expect("served");
        assert!(ledger.in_flight() <= 2);
        drop(permit);
        t.join().unwrap();
        other.join().unwrap();
        assert_eq!(ledger.in_flight(), 0);
    });
}

/// A standing queue (interval and target of zero) whose older waiter is refused by a newer
/// one on another thread while the only permit is released on a third: the older is
/// served or refused, never both, the newer is always served (nothing newer came to take
/// its place), never above the capacity, and nothing stays held or queued. If the refusal
/// took a share, or a refused waiter could still be handed the slot, the count would end
/// above zero or the newer waiter would never be woken (a deadlock in the model).
#[test]
fn a_standing_queue_refuses_the_older_waiter_while_a_release_serves() {
    loom::model(|| {
        let ledger = CountLedger::new(1).unwrap();
        ledger.set_max_waiting(2);
        ledger.set_standing_queue(std::time::Duration::ZERO, std::time::Duration::ZERO);
        let permit = ledger.try_acquire().unwrap();
        let mut older = ledger.acquire();
        assert!(
            Pin::new(&mut older)
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_pending()
        );
        let release = loom::thread::spawn(move || drop(permit));
        let newer = {
            let ledger = ledger.clone();
            loom::thread::spawn(move || {
                let permit = acquire_blocking(ledger.acquire()).expect("the newer is served");
                assert_eq!(ledger.in_flight(), 1);
                drop(permit);
            })
        };
        match acquire_blocking(older) {
            Ok(permit) => {
                assert_eq!(ledger.in_flight(), 1);
                drop(permit);
            }
            Err(refused) => assert_eq!(refused, Refused::Count),
        }
        release.join().unwrap();
        newer.join().unwrap();
        assert_eq!(ledger.in_flight(), 0);
        assert_eq!(ledger.waiting(), 0);
        assert_eq!(ledger.inner().hot.state.load(Ordering::Relaxed) & QUEUE, 0);
    });
}
