//! loom models of the adaptive limit's protocols: samples recorded on two threads while
//! either closes windows (each sample counted once), an operator fixing the capacity
//! while the controller sets it (the operator's value stays), and a controller dropped
//! while a window closes (no deadlock; the ledger free for the next).

use std::sync::{Arc as StdArc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use loom::thread;

use super::*;

#[derive(Debug)]
struct Sum(StdArc<StdMutex<(u64, Duration)>>, u64);

impl Algorithm for Sum {
    fn update(&mut self, window: &Window) -> u64 {
        let mut sum = self.0.lock().unwrap();
        sum.0 += window.samples;
        sum.1 += window.latency_total;
        self.1
    }
}

/// A limit on `ledger` that closes a window at every sample and answers `answer`, adding
/// what it sees to `sum`.
fn driven(
    ledger: &CountLedger,
    epoch: Instant,
    sum: StdArc<StdMutex<(u64, Duration)>>,
    answer: u64,
) -> AdaptiveLimit {
    AdaptiveLimit::builder(Sum(sum, answer))
        .window(Duration::ZERO)
        .min_samples(1)
        .epoch(epoch)
        .build(ledger)
        .unwrap()
}

#[test]
fn samples_recorded_while_windows_close_are_each_counted_once() {
    loom::model(|| {
        let sum = StdArc::new(StdMutex::new((0, Duration::ZERO)));
        let ledger = CountLedger::new(0).unwrap();
        let epoch = Instant::now();
        let limit = driven(&ledger, epoch, sum.clone(), 5);
        let other = limit.clone();
        let t = thread::spawn(move || {
            other.record_at(epoch, Duration::from_micros(1), Outcome::Success);
            other.record_at(epoch, Duration::from_micros(2), Outcome::Success);
        });
        limit.record_at(epoch, Duration::from_micros(4), Outcome::Success);
        t.join().unwrap();
        // Whatever closed when, a last close gathers what is left.
        limit.close_window(u64::MAX / 2);
        let (samples, total) = *sum.lock().unwrap();
        assert_eq!(samples, 3);
        assert_eq!(total, Duration::from_micros(7));
    });
}

#[test]
fn an_operators_capacity_outlasts_a_concurrent_controller() {
    loom::model(|| {
        let sum = StdArc::new(StdMutex::new((0, Duration::ZERO)));
        let ledger = CountLedger::new(0).unwrap();
        let epoch = Instant::now();
        let limit = driven(&ledger, epoch, sum, 9);
        let operator = ledger.clone();
        let t = thread::spawn(move || operator.set_capacity(3).unwrap());
        limit.record_at(epoch, Duration::from_micros(1), Outcome::Success);
        t.join().unwrap();
        assert_eq!(ledger.capacity(), 3);
        assert!(limit.snapshot().fixed);
    });
}

#[test]
fn a_controller_dropped_while_a_window_closes_neither_deadlocks_nor_lingers() {
    loom::model(|| {
        let sum = StdArc::new(StdMutex::new((0, Duration::ZERO)));
        let ledger = CountLedger::new(0).unwrap();
        let epoch = Instant::now();
        let limit = driven(&ledger, epoch, sum, 9);
        let recorder = ledger.clone();
        let t = thread::spawn(move || {
            recorder.record_at(epoch, Duration::from_micros(1), Outcome::Success);
        });
        drop(limit);
        t.join().unwrap();
        // Whichever came first, the ledger is free for another controller, which then
        // drives it.
        let next = driven(&ledger, epoch, StdArc::default(), 4);
        next.record_at(epoch, Duration::from_micros(1), Outcome::Success);
        assert_eq!(ledger.capacity(), 4);
    });
}
