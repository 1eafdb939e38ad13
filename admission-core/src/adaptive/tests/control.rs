//! Who sets the limit: the bounds, an operator's hand, a close, the overload latency,
//! the latency estimate, and the waiters a raise grants.

use std::time::{Duration, Instant};

use super::*;
use crate::Refused;

#[test]
fn the_answer_is_clamped_into_the_bounds() {
    for (answer, expected) in [(0, 2), (1, 2), (1000, 100), (50, 50)] {
        let ledger = CountLedger::new(0).unwrap();
        let epoch = Instant::now();
        let limit = build(Recorder::new(answer).0, &ledger, epoch);
        for at in [10, 20, 130] {
            limit.record_at(epoch + at * MS, MS, Outcome::Success);
        }
        assert_eq!(ledger.capacity(), expected, "answer {answer}");
    }
}

#[test]
fn bounds_that_cannot_hold_and_a_second_controller_are_errors() {
    let ledger = CountLedger::new(0).unwrap();
    for (min, max) in [(0, 10), (10, 9), (1, u64::MAX)] {
        let err = AdaptiveLimit::builder(Aimd::default())
            .bounds(min, max)
            .build(&ledger)
            .unwrap_err();
        assert_eq!(err, AdaptiveError::Bounds { min, max });
        assert!(err.to_string().contains("bounds"));
    }
    let first = AdaptiveLimit::builder(Aimd::default())
        .initial(500)
        .bounds(1, 64)
        .build(&ledger)
        .unwrap();
    assert_eq!(ledger.capacity(), 64, "the initial limit is clamped");
    let second = AdaptiveLimit::builder(Aimd::default()).build(&ledger);
    assert_eq!(second.unwrap_err(), AdaptiveError::AlreadyDriven);
    let clone = first.clone();
    drop(first);
    assert_eq!(
        AdaptiveLimit::builder(Aimd::default())
            .build(&ledger)
            .unwrap_err(),
        AdaptiveError::AlreadyDriven,
        "a clone still drives it"
    );
    drop(clone);
    assert!(
        AdaptiveLimit::builder(Aimd::default())
            .build(&ledger)
            .is_ok()
    );
}

#[test]
fn a_capacity_set_by_hand_stays_until_it_is_handed_back() {
    let ledger = CountLedger::new(0).unwrap();
    let epoch = Instant::now();
    let (recorder, windows) = Recorder::new(40);
    let limit = build(recorder, &ledger, epoch);
    ledger.set_capacity(7).unwrap();
    assert!(limit.snapshot().fixed);
    let mut at = 0;
    let mut window = |limit: &AdaptiveLimit| {
        for _ in 0..3 {
            at += 50;
            limit.record_at(epoch + at * MS, MS, Outcome::Success);
        }
    };
    window(&limit);
    assert_eq!(limit.snapshot().windows, 1, "the window still closes");
    assert!(
        windows.lock().unwrap().is_empty(),
        "without asking the algorithm"
    );
    assert_eq!(ledger.capacity(), 7);
    limit.resume();
    window(&limit);
    assert_eq!(ledger.capacity(), 40);
    assert_eq!(
        windows.lock().unwrap()[0].limit,
        7,
        "it starts from the capacity in force"
    );
    limit.set_fixed(9).unwrap();
    window(&limit);
    assert_eq!(ledger.capacity(), 9);
    ledger.set_unlimited();
    window(&limit);
    assert_eq!(ledger.capacity(), 0, "unlimited by hand is fixed too");
}

#[test]
fn a_close_overrides_the_controller_until_reopened() {
    let ledger = CountLedger::new(0).unwrap();
    let epoch = Instant::now();
    let limit = build(Recorder::new(50).0, &ledger, epoch);
    ledger.close();
    for at in [10, 20, 130] {
        limit.record_at(epoch + at * MS, MS, Outcome::Success);
    }
    assert_eq!(ledger.capacity(), 50);
    assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Closed);
    assert!(
        !limit.snapshot().fixed,
        "a close is not a capacity set by hand"
    );
    ledger.reopen();
    let held: Vec<_> = (0..50).map(|_| ledger.try_acquire().unwrap()).collect();
    assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Count);
    drop(held);
}

#[test]
fn slow_successes_count_as_overloads_from_the_overload_latency() {
    let ledger = CountLedger::new(0).unwrap();
    let epoch = Instant::now();
    let (recorder, windows) = Recorder::new(40);
    let limit = AdaptiveLimit::builder(recorder)
        .min_samples(1)
        .overload_latency(50 * MS)
        .epoch(epoch)
        .build(&ledger)
        .unwrap();
    limit.record_at(epoch + MS, 49 * MS, Outcome::Success);
    limit.record_at(epoch + 2 * MS, 50 * MS, Outcome::Success);
    limit.record_at(epoch + 3 * MS, 80 * MS, Outcome::Gone);
    limit.record_at(epoch + 200 * MS, MS, Outcome::Success);
    let w = windows.lock().unwrap()[0];
    assert_eq!((w.samples, w.overloaded, w.dropped), (4, 1, 1));
}

#[test]
fn the_largest_bound_is_the_ledgers_largest_capacity() {
    let ledger = CountLedger::new(0).unwrap();
    let max = CountLedger::MAX_CAPACITY as u64;
    let limit = AdaptiveLimit::builder(Aimd::default())
        .bounds(max, max)
        .build(&ledger)
        .unwrap();
    assert_eq!(limit.limit(), max);
}

/// An algorithm that answers the limit in force and keeps a fixed no-load latency.
#[derive(Debug)]
struct NoLoad(Duration);

impl Algorithm for NoLoad {
    fn update(&mut self, window: &Window) -> u64 {
        window.limit
    }

    fn no_load_latency(&self) -> Option<Duration> {
        Some(self.0)
    }
}

#[test]
fn the_latency_estimate_averages_windows_and_says_when_it_was_taken() {
    let ledger = CountLedger::new(0).unwrap();
    let epoch = Instant::now();
    let limit = build(NoLoad(4 * MS), &ledger, epoch);
    assert_eq!(limit.latency(), None, "no window yet");
    // Three windows: means of 20 ms, then 40 ms twice.
    let mut now = epoch;
    for mean in [20, 40, 40] {
        for _ in 0..3 {
            now += 40 * MS;
            limit.record_at(now, mean * MS, Outcome::Success);
        }
    }
    let estimate = limit.latency().expect("windows closed");
    // 20, then 20 + (40 - 20) / 4 = 25, then 25 + (40 - 25) / 4 = 28.75.
    assert_eq!(estimate.typical, Duration::from_micros(28_750));
    assert_eq!(estimate.no_load, Some(4 * MS));
    assert_eq!(
        estimate.as_of, now,
        "the last window closed at the last sample"
    );
    assert_eq!(
        limit.snapshot().latency,
        Some(estimate),
        "and the snapshot shows it"
    );
}

#[test]
fn the_latency_estimate_has_no_no_load_figure_where_the_algorithm_keeps_none() {
    let ledger = CountLedger::new(0).unwrap();
    let epoch = Instant::now();
    let limit = build(Aimd::default(), &ledger, epoch);
    for i in 1..=4 {
        limit.record_at(epoch + 40 * i * MS, 10 * MS, Outcome::Success);
    }
    let estimate = limit.latency().expect("a window closed");
    assert_eq!(estimate.typical, 10 * MS);
    assert_eq!(estimate.no_load, None);
}

/// A limit the controller raises has room for the acquisitions waiting: they are granted
/// as the window closes.
#[test]
fn a_limit_the_controller_raises_grants_the_waiters() {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    let ledger = CountLedger::new(0).unwrap();
    ledger.set_max_waiting(4);
    let epoch = Instant::now();
    let (recorder, _) = Recorder::new(12);
    let limit = build(recorder, &ledger, epoch);
    let held: Vec<_> = (0..10).map(|_| ledger.try_acquire().unwrap()).collect();
    let mut waiter = ledger.acquire();
    let mut cx = Context::from_waker(Waker::noop());
    assert!(Pin::new(&mut waiter).poll(&mut cx).is_pending());
    for i in 1..=4 {
        limit.record_at(epoch + 40 * i * MS, 5 * MS, Outcome::Success);
    }
    assert_eq!(
        ledger.capacity(),
        12,
        "the window closed and the limit rose"
    );
    assert!(matches!(
        Pin::new(&mut waiter).poll(&mut cx),
        Poll::Ready(Ok(_))
    ));
    drop(held);
}
