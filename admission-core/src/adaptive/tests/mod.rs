use std::sync::{Arc as StdArc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use super::*;
use crate::samples::{COUNT_BITS, COUNT_FULL, MAX_MICROS, MICROS_FULL, Shard};
use crate::sync::Ordering;

mod control;

/// An algorithm that keeps every window it is given and answers `next`.
#[derive(Debug, Clone)]
struct Recorder {
    windows: StdArc<StdMutex<Vec<Window>>>,
    next: u64,
}

impl Recorder {
    fn new(next: u64) -> (Self, StdArc<StdMutex<Vec<Window>>>) {
        let windows = StdArc::new(StdMutex::new(Vec::new()));
        let recorder = Self {
            windows: windows.clone(),
            next,
        };
        (recorder, windows)
    }
}

impl Algorithm for Recorder {
    fn update(&mut self, window: &Window) -> u64 {
        self.windows.lock().unwrap().push(*window);
        self.next
    }
}

const MS: Duration = Duration::from_millis(1);

fn build(algorithm: impl Algorithm, ledger: &CountLedger, epoch: Instant) -> AdaptiveLimit {
    AdaptiveLimit::builder(algorithm)
        .bounds(2, 100)
        .initial(10)
        .min_samples(3)
        .epoch(epoch)
        .build(ledger)
        .unwrap()
}

#[test]
fn a_window_closes_with_every_sample_it_was_given_and_sets_the_answer() {
    let ledger = CountLedger::new(0).unwrap();
    let epoch = Instant::now();
    let (recorder, windows) = Recorder::new(40);
    let limit = build(recorder, &ledger, epoch);
    assert_eq!(ledger.capacity(), 10, "starts at the initial limit");
    let held: Vec<_> = (0..4).map(|_| ledger.try_acquire().unwrap()).collect();
    limit.record_at(epoch + 10 * MS, 5 * MS, Outcome::Success);
    limit.record_at(epoch + 20 * MS, 7 * MS, Outcome::Overload);
    limit.record_at(epoch + 30 * MS, 9 * MS, Outcome::Gone);
    assert!(
        windows.lock().unwrap().is_empty(),
        "the window lasts 100 ms"
    );
    limit.record_at(epoch + 120 * MS, 3 * MS, Outcome::Success);
    let closed = windows.lock().unwrap().clone();
    assert_eq!(closed.len(), 1);
    let w = closed[0];
    assert_eq!(w.samples, 4);
    assert_eq!(w.latency_total, 24 * MS);
    assert_eq!((w.overloaded, w.dropped), (1, 1));
    assert_eq!(w.max_in_flight, 4);
    assert_eq!(w.limit, 10);
    assert_eq!(w.elapsed, 120 * MS);
    assert_eq!(
        ledger.capacity(),
        40,
        "the algorithm's answer is the capacity"
    );
    assert_eq!(limit.snapshot().windows, 1);
    assert_eq!(limit.snapshot().last, Some(w));
    drop(held);
}

/// A limit on `ledger` (from 10, within 2 to 100) whose windows of `window` close with
/// a single sample, and the windows its algorithm is given (it answers 40).
fn one_sample_windows(
    ledger: &CountLedger,
    epoch: Instant,
    window: Duration,
) -> (AdaptiveLimit, StdArc<StdMutex<Vec<Window>>>) {
    let (recorder, windows) = Recorder::new(40);
    let limit = AdaptiveLimit::builder(recorder)
        .bounds(2, 100)
        .initial(10)
        .min_samples(1)
        .window(window)
        .epoch(epoch)
        .build(ledger)
        .unwrap();
    (limit, windows)
}

/// A permit records on its ledger's limit with no handle to the limit, reading the
/// clock itself (`CountPermit::record`).
#[test]
fn a_permit_records_its_sample_on_its_ledgers_limit_at_the_time_it_reads() {
    let ledger = CountLedger::new(0).unwrap();
    let (limit, windows) = one_sample_windows(&ledger, Instant::now(), MS);
    let permit = ledger.try_acquire().unwrap();
    // The window (1 ms) is over by the time of the sample, which closes it.
    std::thread::sleep(2 * MS);
    permit.record(7 * MS, Outcome::Overload);
    let closed = windows.lock().unwrap().clone();
    assert_eq!(closed.len(), 1, "the sample reached the limit");
    let w = closed[0];
    assert_eq!((w.samples, w.latency_total, w.overloaded), (1, 7 * MS, 1));
    assert!(w.elapsed >= 2 * MS, "read at the time of the call");
    assert_eq!(ledger.capacity(), 40);
    drop((permit, limit));
}

/// A window closes at the first sample once it has lasted its length, that instant
/// included; a sample's latency is capped (at about three days) so that one sample
/// cannot overrun its shard's field.
#[test]
fn a_window_closes_at_its_length_and_a_huge_latency_is_capped() {
    let ledger = CountLedger::new(0).unwrap();
    let epoch = Instant::now();
    let (limit, windows) = one_sample_windows(&ledger, epoch, 100 * MS);
    limit.record_at(
        epoch + 100 * MS - Duration::from_nanos(1),
        MS,
        Outcome::Success,
    );
    assert!(windows.lock().unwrap().is_empty(), "a nanosecond short");
    limit.record_at(epoch + 100 * MS, Duration::MAX, Outcome::Success);
    let closed = windows.lock().unwrap().clone();
    assert_eq!(closed.len(), 1, "closed at exactly its length");
    assert_eq!(closed[0].elapsed, 100 * MS);
    let cap = Duration::from_micros((1 << 38) - 1);
    assert_eq!(closed[0].latency_total, MS + cap);
}

#[test]
fn a_window_waits_for_enough_samples_and_loses_none() {
    let ledger = CountLedger::new(0).unwrap();
    let epoch = Instant::now();
    let (recorder, windows) = Recorder::new(40);
    let limit = build(recorder, &ledger, epoch);
    limit.record_at(epoch + 150 * MS, MS, Outcome::Success);
    limit.record_at(epoch + 200 * MS, MS, Outcome::Success);
    assert!(
        windows.lock().unwrap().is_empty(),
        "two samples, three needed"
    );
    // A sample before the next look (an eighth of a window on) stays in its shard.
    limit.record_at(epoch + 201 * MS, MS, Outcome::Success);
    assert!(windows.lock().unwrap().is_empty());
    limit.record_at(epoch + 300 * MS, MS, Outcome::Success);
    let closed = windows.lock().unwrap().clone();
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0].samples, 4);
    assert_eq!(closed[0].elapsed, 300 * MS);
}

#[test]
fn a_shard_near_its_room_hands_its_samples_over_early() {
    let ledger = CountLedger::new(0).unwrap();
    let epoch = Instant::now();
    let (recorder, windows) = Recorder::new(40);
    let limit = build(recorder, &ledger, epoch);
    // Each sample carries the largest latency a sample can: without the early hand-over
    // the shard's latency field would overflow after four.
    let huge = Duration::from_micros(MAX_MICROS);
    for i in 0..20 {
        limit.record_at(epoch + i * MS, Duration::MAX, Outcome::Success);
    }
    limit.record_at(epoch + 200 * MS, Duration::ZERO, Outcome::Success);
    let w = windows.lock().unwrap()[0];
    assert_eq!(w.samples, 21);
    assert_eq!(w.latency_total, huge * 20);
}

#[test]
fn samples_from_many_threads_are_each_counted_once() {
    const PER_THREAD: u64 = if cfg!(miri) { 100 } else { 1000 };
    let ledger = CountLedger::new(0).unwrap();
    let epoch = Instant::now();
    let (recorder, windows) = Recorder::new(40);
    let limit = AdaptiveLimit::builder(recorder)
        .window(Duration::ZERO)
        .min_samples(1)
        .epoch(epoch)
        .build(&ledger)
        .unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let limit = limit.clone();
            std::thread::spawn(move || {
                for _ in 0..PER_THREAD {
                    limit.record(Duration::from_micros(3), Outcome::Success);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    limit.record_at(
        Instant::now() + Duration::from_secs(1),
        Duration::ZERO,
        Outcome::Success,
    );
    let windows = windows.lock().unwrap();
    let samples: u64 = windows.iter().map(|w| w.samples).sum();
    let total: Duration = windows.iter().map(|w| w.latency_total).sum();
    assert_eq!(samples, 4 * PER_THREAD + 1);
    assert_eq!(total, Duration::from_micros(3 * 4 * PER_THREAD));
}

#[test]
fn debug_names_the_limit() {
    let ledger = CountLedger::new(0).unwrap();
    let limit = AdaptiveLimit::builder(Gradient::default())
        .build(&ledger)
        .unwrap();
    let debug = format!("{limit:?}");
    assert!(
        debug.contains("limit: 20") && debug.contains("fixed: false"),
        "{debug}"
    );
}

#[test]
fn a_permit_records_through_its_ledger_whatever_handles_are_left() {
    let ledger = CountLedger::new(0).unwrap();
    let epoch = Instant::now();
    let (recorder, windows) = Recorder::new(40);
    let limit = AdaptiveLimit::builder(recorder)
        .min_samples(1)
        .epoch(epoch)
        .build(&ledger)
        .unwrap();
    let first = ledger.try_acquire().unwrap();
    let second = ledger.try_acquire().unwrap();
    drop(ledger);
    first.record_at(epoch + 200 * MS, 3 * MS, Outcome::Overload);
    let w = last_window(&windows);
    assert_eq!((w.samples, w.overloaded, w.max_in_flight), (1, 1, 2));
    assert_eq!(limit.limit(), 40, "set through the permit's ledger");
    drop(first);
    // With the controller gone too, a permit's sample goes nowhere, and its release
    // frees the ledger.
    drop(limit);
    second.record_at(epoch + 400 * MS, MS, Outcome::Success);
    assert_eq!(windows.lock().unwrap().len(), 1);
    drop(second);
}

fn last_window(windows: &StdMutex<Vec<Window>>) -> Window {
    *windows.lock().unwrap().last().expect("a window")
}

#[test]
fn a_window_adds_up_its_samples() {
    let mut window = Window::new(10, 100 * MS);
    assert_eq!(window.mean_latency(), None);
    assert_eq!(window.overload_share(), 0.0);
    window.add(2 * MS, Outcome::Success, 4);
    window.add(4 * MS, Outcome::Overload, 5);
    window.add(6 * MS, Outcome::Gone, 3);
    window.add(Duration::from_nanos(1500), Outcome::Success, 1);
    assert_eq!(window.samples, 4);
    assert_eq!(window.latency_total, 12 * MS + Duration::from_micros(1));
    assert_eq!((window.overloaded, window.dropped), (1, 1));
    assert_eq!(window.max_in_flight, 5);
    assert_eq!(window.overload_share(), 0.5);
    assert_eq!(window.throughput(), 40.0);
    assert!(!window.app_limited(), "5 of 10 is half the limit: used");
    window.max_in_flight = 4;
    assert!(window.app_limited());
}

#[test]
fn a_shard_says_it_is_filling_up_from_half_its_room() {
    let shard = Shard::new();
    let add = |packed: u64| {
        shard.packed.store(packed, Ordering::Relaxed);
        shard.add(1, Outcome::Success, || 0)
    };
    assert!(!add(COUNT_FULL - 1));
    assert!(add(COUNT_FULL));
    assert!(!add((MICROS_FULL - 1) << COUNT_BITS));
    assert!(add(MICROS_FULL << COUNT_BITS));
}

/// The window's quantiles and spread, as an `Algorithm` of the user's own reads them: a
/// queue (40 ms more for every request) moves the quartiles alike, so the interquartile
/// range stands while the coefficient of variation narrows.
#[test]
fn a_window_s_quantiles_and_spread_read_a_queue_as_a_shift() {
    let empty = Window::new(8, Duration::from_millis(100));
    assert_eq!(empty.latency_quantile(0.5), None);
    assert_eq!(empty.latency_interquartile_range(), None);
    assert_eq!(empty.bucketed_latency_cv(), None);
    let window = |wait: u64| {
        let mut w = Window::new(8, Duration::from_millis(100));
        for ms in 1..=100 {
            w.add(Duration::from_millis(ms + wait), Outcome::Success, 1);
        }
        w
    };
    let (quiet, queued) = (window(0), window(40));
    let ms = |d: Option<Duration>| d.unwrap().as_secs_f64() * 1e3;
    // Within an eighth of a doubling.
    assert!((ms(quiet.latency_quantile(0.25)) - 25.0).abs() < 25.0 / 8.0);
    assert!((ms(quiet.latency_quantile(0.75)) - 75.0).abs() < 75.0 / 8.0);
    assert!((ms(queued.latency_quantile(0.25)) - 65.0).abs() < 65.0 / 8.0);
    let (a, b) = (
        ms(quiet.latency_interquartile_range()),
        ms(queued.latency_interquartile_range()),
    );
    assert!(
        (a - 50.0).abs() < 10.0 && (b - 50.0).abs() < 10.0,
        "{a} {b}"
    );
    let (a, b) = (
        quiet.bucketed_latency_cv().unwrap(),
        queued.bucketed_latency_cv().unwrap(),
    );
    // 29/50.5 and 29/90.5, each within a bucket's error.
    assert!(
        (a - 0.57).abs() < 0.05 && (b - 0.32).abs() < 0.05,
        "{a} {b}"
    );
    // Out of range, a share is taken as its nearest end.
    assert_eq!(quiet.latency_quantile(2.0), quiet.latency_quantile(1.0));
}

/// The spread a window's closer gathers from the shards is the spread of the latencies
/// recorded: a window of unequal latencies has a coefficient of variation, read from its
/// sampled squares and from its buckets alike.
#[test]
fn a_closed_window_carries_the_spread_of_its_samples() {
    let ledger = CountLedger::new(0).unwrap();
    let epoch = Instant::now();
    let (recorder, windows) = Recorder::new(40);
    let limit = build(recorder, &ledger, epoch);
    for i in 1..=24 {
        limit.record_at(epoch + i * 5 * MS, i * MS, Outcome::Success);
    }
    let closed = windows.lock().unwrap()[0];
    let cv = closed.latency_cv().unwrap();
    let bucketed = closed.bucketed_latency_cv().unwrap();
    // Latencies of 1 to 20 ms, evenly: a CV of about 0.55 (a sample of them reads near it).
    assert!((0.2..1.0).contains(&cv), "{cv}");
    assert!((0.4..0.7).contains(&bucketed), "{bucketed}");
}
