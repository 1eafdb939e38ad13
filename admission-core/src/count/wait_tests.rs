//! The wait for a slot: order, bounds, cancellation, and the hooks that grant.

use std::sync::Arc as StdArc;
use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
use std::task::Wake;

use super::*;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A waker that counts its wakes.
#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: StdArc<Self>) {
        self.0.fetch_add(1, StdOrdering::SeqCst);
    }
}

fn wakes(count: &StdArc<Count>) -> usize {
    count.0.load(StdOrdering::SeqCst)
}

/// Polls `acquire` once with `waker`.
fn poll(acquire: &mut Acquire, waker: &Waker) -> Poll<Result<CountPermit, Refused>> {
    Pin::new(acquire).poll(&mut Context::from_waker(waker))
}

fn noop(acquire: &mut Acquire) -> Poll<Result<CountPermit, Refused>> {
    poll(acquire, Waker::noop())
}

fn ledger(capacity: usize, max_waiting: usize) -> CountLedger {
    let ledger = CountLedger::new(capacity).unwrap();
    ledger.set_max_waiting(max_waiting);
    ledger
}

#[test]
fn with_no_waiting_allowed_a_full_ledger_refuses_at_once() {
    let ledger = CountLedger::new(1).unwrap();
    assert_eq!(ledger.max_waiting(), 0, "the default");
    let _held = ledger.try_acquire().unwrap();
    assert!(matches!(
        noop(&mut ledger.acquire()),
        Poll::Ready(Err(Refused::Count))
    ));
    assert_eq!(ledger.snapshot().refused, 1);
    assert_eq!(ledger.waiting(), 0);
}

#[test]
fn a_free_slot_is_taken_at_once_and_counted() {
    let ledger = ledger(2, 4);
    let permit = noop(&mut ledger.acquire());
    assert!(matches!(permit, Poll::Ready(Ok(_))));
    assert_eq!(ledger.in_flight(), 1);
    assert_eq!(ledger.snapshot().high_water, 1);
    drop(permit);
    assert_eq!(ledger.in_flight(), 0);
}

/// A release hands its slot to the oldest waiter, which is woken; the slot is never free
/// in between (a plain acquisition cannot take it first).
#[test]
fn a_release_hands_its_slot_to_the_oldest_waiter_and_wakes_it() {
    let ledger = ledger(1, 4);
    let held = ledger.try_acquire().unwrap();
    let (a_wakes, b_wakes) = (StdArc::new(Count::default()), StdArc::new(Count::default()));
    let (a_waker, b_waker) = (Waker::from(a_wakes.clone()), Waker::from(b_wakes.clone()));
    let (mut a, mut b) = (ledger.acquire(), ledger.acquire());
    assert!(poll(&mut a, &a_waker).is_pending());
    assert!(poll(&mut b, &b_waker).is_pending());
    assert_eq!(ledger.waiting(), 2);

    drop(held);
    assert_eq!(ledger.in_flight(), 1, "passed on, not given back");
    assert!(ledger.try_acquire().is_err(), "and not free for a moment");
    assert_eq!((wakes(&a_wakes), wakes(&b_wakes)), (1, 0));
    let Poll::Ready(Ok(first)) = poll(&mut a, &a_waker) else {
        panic!("the oldest is served first");
    };
    assert!(poll(&mut b, &b_waker).is_pending());
    assert_eq!(ledger.waiting(), 1);

    drop(first);
    assert_eq!(wakes(&b_wakes), 1);
    let Poll::Ready(Ok(second)) = poll(&mut b, &b_waker) else {
        panic!("then the next");
    };
    assert_eq!(ledger.waiting(), 0);
    drop(second);
    assert_eq!(ledger.in_flight(), 0);
    assert!(ledger.try_acquire().is_ok(), "no trace of the queue");
}

#[test]
fn beyond_max_waiting_an_acquisition_is_refused_at_once() {
    let ledger = ledger(1, 2);
    let _held = ledger.try_acquire().unwrap();
    let (mut a, mut b, mut c) = (ledger.acquire(), ledger.acquire(), ledger.acquire());
    assert!(noop(&mut a).is_pending());
    assert!(noop(&mut b).is_pending());
    assert!(matches!(noop(&mut c), Poll::Ready(Err(Refused::Count))));
    assert_eq!(
        ledger.snapshot().refused,
        1,
        "only the one refused is counted"
    );
    assert_eq!(ledger.waiting(), 2);
}

/// A waiter of a more important class is served first, and one with room in its share is
/// admitted at once, past the waiters of a less important class.
#[test]
fn classes_are_served_in_order_and_a_class_with_room_does_not_wait() {
    let ledger = ledger(10, 8);
    let held: Vec<_> = (0..7)
        .map(|_| ledger.try_acquire_as(Priority::SHEDDABLE).unwrap())
        .collect();
    // SHEDDABLE's share (7) is in flight: it waits; DEFAULT (9) has room.
    let mut sheddable = ledger.acquire_as(Priority::SHEDDABLE);
    assert!(noop(&mut sheddable).is_pending());
    let Poll::Ready(Ok(default)) = noop(&mut ledger.acquire_as(Priority::DEFAULT)) else {
        panic!("room in its share: at once");
    };
    let _default2 = ledger.try_acquire_as(Priority::DEFAULT).unwrap();
    // Now 9 in flight: DEFAULT waits too, behind the SHEDDABLE waiter in time.
    let mut waits_default = ledger.acquire_as(Priority::DEFAULT);
    assert!(noop(&mut waits_default).is_pending());

    drop(default);
    // 8 in flight with the slot free: DEFAULT (share 9) may take it, SHEDDABLE (7) not.
    assert!(matches!(noop(&mut waits_default), Poll::Ready(Ok(_))));
    assert!(noop(&mut sheddable).is_pending());
    drop(held);
    assert!(matches!(noop(&mut sheddable), Poll::Ready(Ok(_))));
}

#[test]
fn a_waiter_dropped_while_waiting_leaves_no_trace() {
    let ledger = ledger(1, 1);
    let held = ledger.try_acquire().unwrap();
    let mut a = ledger.acquire();
    assert!(noop(&mut a).is_pending());
    drop(a);
    assert_eq!(ledger.waiting(), 0);
    let word = ledger.inner().hot.state.load(Ordering::Relaxed);
    assert_eq!(word & QUEUE, 0, "the last waiter out clears the bit");
    drop(held);
    assert_eq!(ledger.in_flight(), 0, "given back, with no one to take it");
    let mut b = ledger.acquire();
    assert!(
        matches!(noop(&mut b), Poll::Ready(Ok(_))),
        "room for a waiter again"
    );
}

/// Granted a slot but dropped before it was polled again: the slot goes on to the next
/// waiter, or back to the ledger.
#[test]
fn a_waiter_dropped_after_its_grant_passes_the_slot_on() {
    let ledger = ledger(1, 2);
    let held = ledger.try_acquire().unwrap();
    let (mut a, mut b) = (ledger.acquire(), ledger.acquire());
    assert!(noop(&mut a).is_pending());
    assert!(noop(&mut b).is_pending());
    drop(held); // to `a`
    drop(a); // never polled: on to `b`
    assert_eq!(ledger.in_flight(), 1);
    let Poll::Ready(Ok(permit)) = noop(&mut b) else {
        panic!("the slot went on to the next waiter");
    };
    drop(permit);
    assert_eq!(ledger.in_flight(), 0);

    let held = ledger.try_acquire().unwrap();
    let mut c = ledger.acquire();
    assert!(noop(&mut c).is_pending());
    drop(held);
    drop(c);
    assert_eq!(
        ledger.in_flight(),
        0,
        "and back to the ledger with no one waiting"
    );
    assert!(ledger.try_acquire().is_ok());
}

#[test]
fn a_close_refuses_every_waiter_and_a_drain_completes() {
    let ledger = ledger(1, 2);
    let held = ledger.try_acquire().unwrap();
    let count = StdArc::new(Count::default());
    let waker = Waker::from(count.clone());
    let mut a = ledger.acquire();
    assert!(poll(&mut a, &waker).is_pending());
    let mut drain = ledger.drain();
    assert_eq!(wakes(&count), 1, "woken by the close");
    assert!(matches!(
        poll(&mut a, &waker),
        Poll::Ready(Err(Refused::Closed))
    ));
    assert!(matches!(
        noop(&mut ledger.acquire()),
        Poll::Ready(Err(Refused::Closed))
    ));
    assert!(
        Pin::new(&mut drain)
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending()
    );
    drop(held);
    assert!(
        Pin::new(&mut drain)
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_ready()
    );
}

#[test]
fn a_capacity_that_rises_grants_the_waiters_it_has_room_for() {
    let ledger = ledger(1, 4);
    let _held = ledger.try_acquire().unwrap();
    let mut waiters: Vec<_> = (0..3).map(|_| ledger.acquire()).collect();
    for waiter in &mut waiters {
        assert!(noop(waiter).is_pending());
    }
    ledger.set_capacity(3).unwrap();
    assert_eq!(ledger.in_flight(), 3);
    assert_eq!(ledger.waiting(), 1);
    let first = noop(&mut waiters[0]);
    let second = noop(&mut waiters[1]);
    assert!(matches!(
        (&first, &second),
        (Poll::Ready(Ok(_)), Poll::Ready(Ok(_)))
    ));
    assert!(noop(&mut waiters[2]).is_pending());
    ledger.set_unlimited();
    assert!(matches!(noop(&mut waiters[2]), Poll::Ready(Ok(_))));
    assert_eq!(ledger.waiting(), 0);
}

thread_local! {
    /// A virtual clock for the standing-queue rule: this thread's offset from `BASE`.
    static NOW: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

static BASE: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

fn virtual_now() -> Instant {
    *BASE + NOW.with(std::cell::Cell::get)
}

fn advance(by: Duration) {
    NOW.with(|now| now.set(now.get() + by));
}

/// Once the queue has been waited in for 100 ms without a break it stands: the newest
/// waiter is served first; once it empties it drains in order again.
#[test]
fn a_standing_queue_serves_the_newest_first() {
    let ledger = ledger(1, 4);
    ledger.set_wait_clock(virtual_now);
    let held = ledger.try_acquire().unwrap();
    let mut old = ledger.acquire();
    assert!(noop(&mut old).is_pending());
    advance(wait::INTERVAL - Duration::from_millis(1));
    let mut new = ledger.acquire();
    assert!(noop(&mut new).is_pending());
    // Not standing yet: the oldest.
    drop(held);
    let first = noop(&mut old);
    assert!(
        matches!(first, Poll::Ready(Ok(_))),
        "not standing yet: the oldest first"
    );
    let mut newer = ledger.acquire();
    assert!(noop(&mut newer).is_pending());
    advance(Duration::from_millis(1));
    // Waited in for 100 ms without a break: standing, the newest first.
    drop(first);
    let second = noop(&mut newer);
    assert!(
        matches!(second, Poll::Ready(Ok(_))),
        "standing: the newest first"
    );
    assert!(noop(&mut new).is_pending());
    drop(second);
    let third = noop(&mut new);
    assert!(matches!(third, Poll::Ready(Ok(_))));
    assert_eq!(ledger.waiting(), 0);
}

#[test]
fn the_standing_queue_rule_is_meta_s_by_default_and_settable() {
    let ledger = ledger(1, 4);
    let ms = Duration::from_millis;
    assert_eq!(ledger.standing_queue(), (ms(100), ms(5)));
    ledger.set_standing_queue(ms(7), ms(2));
    assert_eq!(ledger.standing_queue(), (ms(7), ms(2)));
}

/// Once the queue stands, a newer waiter refuses the waiters of its class (and less
/// important ones) that have waited the target; it refuses none before the queue stands,
/// none younger than the target, and none of a more important class.
#[test]
fn a_standing_queue_refuses_waiters_past_the_target_as_newer_ones_come() {
    let ledger = ledger(1, 8);
    ledger.set_wait_clock(virtual_now);
    let ms = Duration::from_millis;
    ledger.set_standing_queue(ms(40), ms(3));
    let held = ledger.try_acquire().unwrap();
    let mut first = ledger.acquire_as(Priority::DEFAULT);
    assert!(noop(&mut first).is_pending());
    advance(ms(39));
    let mut second = ledger.acquire_as(Priority::DEFAULT);
    assert!(noop(&mut second).is_pending());
    assert!(
        noop(&mut first).is_pending(),
        "not standing yet: it keeps its place"
    );
    let mut critical = ledger.acquire_as(Priority::CRITICAL);
    assert!(noop(&mut critical).is_pending());
    advance(ms(2));
    // Standing since 40 ms: `first` (41 ms) goes; `second` (2 ms) is younger than the
    // target; `critical` is of a more important class.
    let mut third = ledger.acquire_as(Priority::DEFAULT);
    assert!(noop(&mut third).is_pending());
    assert!(matches!(noop(&mut first), Poll::Ready(Err(Refused::Count))));
    assert!(noop(&mut second).is_pending());
    assert!(noop(&mut critical).is_pending());
    advance(ms(3));
    let mut sheddable = ledger.acquire_as(Priority::SHEDDABLE);
    assert!(noop(&mut sheddable).is_pending());
    assert!(
        noop(&mut second).is_pending(),
        "a less important one refuses nothing"
    );
    advance(ms(3));
    let mut fourth = ledger.acquire_as(Priority::DEFAULT);
    assert!(noop(&mut fourth).is_pending());
    assert!(matches!(
        noop(&mut second),
        Poll::Ready(Err(Refused::Count))
    ));
    assert!(matches!(noop(&mut third), Poll::Ready(Err(Refused::Count))));
    assert!(matches!(
        noop(&mut sheddable),
        Poll::Ready(Err(Refused::Count))
    ));
    assert!(noop(&mut critical).is_pending());
    assert_eq!(ledger.waiting(), 2, "the critical one and the newest");
    drop(held);
    let served = noop(&mut critical);
    assert!(
        matches!(served, Poll::Ready(Ok(_))),
        "the most important class first"
    );
    assert_eq!(ledger.in_flight(), 1);
}

/// A queue that empties for less than the interval still stands; one that stays empty
/// for the interval begins again.
#[test]
fn a_queue_stands_until_it_has_stayed_empty_for_the_interval() {
    let ledger = ledger(1, 8);
    ledger.set_wait_clock(virtual_now);
    let ms = Duration::from_millis;
    ledger.set_standing_queue(ms(40), ms(3));
    let held = ledger.try_acquire().unwrap();
    let mut a = ledger.acquire();
    assert!(noop(&mut a).is_pending());
    advance(ms(50));
    drop(a); // empty, standing
    advance(ms(39));
    let mut b = ledger.acquire();
    assert!(noop(&mut b).is_pending());
    advance(ms(3));
    let mut c = ledger.acquire();
    assert!(noop(&mut c).is_pending());
    assert!(
        matches!(noop(&mut b), Poll::Ready(Err(Refused::Count))),
        "emptied for 39 ms: it still stood"
    );
    drop(c);
    advance(ms(40));
    let mut d = ledger.acquire();
    assert!(noop(&mut d).is_pending());
    advance(ms(39));
    let mut e = ledger.acquire();
    assert!(noop(&mut e).is_pending());
    assert!(
        noop(&mut d).is_pending(),
        "emptied for 40 ms: it began again"
    );
    drop(held);
}

/// The interval set is the one the newest-first rule reads.
#[test]
fn a_shorter_interval_makes_the_queue_stand_sooner() {
    let ledger = ledger(1, 4);
    ledger.set_wait_clock(virtual_now);
    // A target longer than the test: only the order is at stake.
    ledger.set_standing_queue(Duration::from_millis(10), Duration::from_secs(1));
    let held = ledger.try_acquire().unwrap();
    let mut old = ledger.acquire();
    assert!(noop(&mut old).is_pending());
    advance(Duration::from_millis(10));
    let mut new = ledger.acquire();
    assert!(noop(&mut new).is_pending());
    drop(held);
    let newest = noop(&mut new);
    assert!(
        matches!(newest, Poll::Ready(Ok(_))),
        "standing after 10 ms: the newest"
    );
    assert!(noop(&mut old).is_pending());
}

/// The ledger is freed once the last handle, permit and waiter are gone, in any order.
#[test]
fn waiters_keep_the_ledger_alive_and_free_it_with_the_last() {
    let before = crate::raw::live::count();
    let ledger = ledger(1, 2);
    let held = ledger.try_acquire().unwrap();
    let mut a = ledger.acquire();
    assert!(noop(&mut a).is_pending());
    drop(ledger);
    drop(held);
    let Poll::Ready(Ok(permit)) = noop(&mut a) else {
        panic!("granted after the handle went");
    };
    drop(a);
    assert_eq!(crate::raw::live::count(), before + 1, "the permit keeps it");
    drop(permit);
    assert_eq!(crate::raw::live::count(), before);
}

/// Waiters and releases on several threads: every waiter is served once, and the ledger
/// ends empty.
#[test]
fn waiters_on_threads_are_each_served_once() {
    let ledger = ledger(2, 64);
    // No waiter gives way to a newer one, however slowly the threads run (under Miri a
    // wait can outlast the default rule's 100 ms and 5 ms).
    ledger.set_standing_queue(Duration::from_secs(3600), Duration::from_secs(3600));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let ledger = ledger.clone();
            std::thread::spawn(move || {
                for _ in 0..if cfg!(miri) { 5 } else { 500 } {
                    let permit = block_on(ledger.acquire()).unwrap();
                    assert!(ledger.in_flight() <= 2);
                    drop(permit);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(ledger.in_flight(), 0);
    assert_eq!(ledger.waiting(), 0);
    assert!(ledger.try_acquire().is_ok());
}

/// Parks the thread until `future` is ready.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: StdArc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(StdArc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}
