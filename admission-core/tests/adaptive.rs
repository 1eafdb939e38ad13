//! Property tests of the adaptive limit, through its public recording path on a virtual
//! clock: whatever the samples, the limit stays within its bounds; under sustained rising
//! latency it falls; with sustained headroom it rises.

use std::time::{Duration, Instant};

use admission_core::adaptive::{AdaptiveLimit, Aimd, Algorithm, Gradient, Outcome};
use admission_core::{CountLedger, CountPermit};
use proptest::prelude::*;

const WINDOW: Duration = Duration::from_millis(100);
/// Samples per window in the direction tests, and the most windows in the bounds test:
/// fewer under Miri, which interprets every recording.
const SAMPLES: u32 = if cfg!(miri) { 10 } else { 50 };
const MAX_WINDOWS: usize = if cfg!(miri) { 6 } else { 40 };
/// The largest limit a test starts from, and the most permits a window holds (each one
/// acquired and released per window).
/// Windows of a shrinking server.
const WINDOWS: usize = 120;
const MAX_START: u64 = if cfg!(miri) { 40 } else { 500 };

/// Feeds one window of `samples` samples of `latency` and `outcome`, with the ledger
/// holding `in_flight` permits, and closes it. Returns the limit after.
struct Feeder {
    ledger: CountLedger,
    limit: AdaptiveLimit,
    epoch: Instant,
    now: Duration,
}

impl Feeder {
    fn new(algorithm: Box<dyn Algorithm>, min: u64, max: u64, initial: u64) -> Self {
        let ledger = CountLedger::new(0).unwrap();
        let epoch = Instant::now();
        let limit = AdaptiveLimit::builder(algorithm)
            .bounds(min, max)
            .initial(initial)
            .min_samples(10)
            .epoch(epoch)
            .build(&ledger)
            .unwrap();
        Self {
            ledger,
            limit,
            epoch,
            now: Duration::ZERO,
        }
    }

    fn window(&mut self, samples: u32, latency: Duration, outcome: Outcome, in_flight: u64) -> u64 {
        self.window_over(samples, WINDOW, latency, outcome, in_flight)
    }

    /// `window`, its samples spread over `elapsed` (at least a window: the shortest
    /// that closes).
    fn window_over(
        &mut self,
        samples: u32,
        elapsed: Duration,
        latency: Duration,
        outcome: Outcome,
        in_flight: u64,
    ) -> u64 {
        let held: Vec<CountPermit> = (0..in_flight)
            .map_while(|_| self.ledger.try_acquire().ok())
            .collect();
        let elapsed = elapsed.max(WINDOW);
        for _ in 0..samples {
            self.now += elapsed / samples;
            self.limit
                .record_at(self.epoch + self.now, latency, outcome);
        }
        // Past the window's end, so it closes.
        self.now += WINDOW / 100;
        self.limit
            .record_at(self.epoch + self.now, latency, outcome);
        drop(held);
        self.limit.limit()
    }
}

fn algorithm() -> impl Strategy<Value = (Box<dyn Algorithm>, &'static str)> {
    prop_oneof![
        Just(()).prop_map(|()| (
            Box::new(Gradient::default()) as Box<dyn Algorithm>,
            "gradient"
        )),
        Just(()).prop_map(|()| (Box::new(Aimd::default()) as Box<dyn Algorithm>, "aimd")),
    ]
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        8 => Just(Outcome::Success),
        1 => Just(Outcome::Overload),
        1 => Just(Outcome::Gone),
    ]
}

/// The limit a `Gradient` started at `initial` ends at (and the first it answered, and
/// the server's concurrency then), over `WINDOWS` windows of a server whose concurrency
/// shrinks by `shrink` a window at the same service time (`base` µs): at any limit above
/// it, latency rises (queueing), and keeps rising.
fn shrinking(base: u64, shrink: f64, initial: u64) -> (u64, u64, f64) {
    let mut feeder = Feeder::new(Box::new(Gradient::default()), 1, 10_000, initial);
    let mut capacity = initial as f64;
    let window = |feeder: &mut Feeder, limit: u64, capacity: f64| {
        let latency = base as f64 * (limit as f64 / capacity).max(1.0);
        let runs = (limit as f64).min(capacity);
        let elapsed = Duration::from_micros((SAMPLES as f64 * latency / runs) as u64);
        let latency = Duration::from_micros(latency as u64);
        feeder.window_over(SAMPLES, elapsed, latency, Outcome::Success, limit)
    };
    let start = window(&mut feeder, initial, capacity);
    let mut limit = start;
    // (A window of 50 answers from a server running hundreds lasts a fraction of a
    // latency: the gradient acts once per round of one and a half latencies, so
    // this runs for a few dozen of them.)
    for _ in 0..WINDOWS {
        capacity = (capacity * shrink).max(1.0);
        limit = window(&mut feeder, limit, capacity);
    }
    // The server's concurrency is now at most 0.95^WINDOWS of what it was.
    (start, limit, capacity)
}

/// A case the property below once found: the rounds of a queue that rose within each
/// round spread a little (a CV of 0.11-0.17), as much as the first samples had, and
/// while the estimate was unconfirmed they were read as the service's, not a queue: the
/// estimate followed the queue up and the limit held at 23 for a server of 1. Only a
/// spread wider than an exponential's is read so.
#[cfg_attr(miri, ignore)]
#[test]
fn the_gradient_falls_under_a_server_that_shrinks_fast_from_32() {
    let (start, limit, capacity) = shrinking(7564, 0.820_639_854_729_709_4, 32);
    assert!(
        limit * 3 <= start * 2,
        "{start} -> {limit} (a server of {capacity:.1})"
    );
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 64 },
        // No regression file: Miri's isolation has no working directory to find it in.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_limit_stays_within_its_bounds(
        (algorithm, _) in algorithm(),
        min in 1u64..20,
        span in 0u64..200,
        initial in 0u64..MAX_START,
        windows in prop::collection::vec((10u32..60, 1u64..100_000, outcome(), 0u64..MAX_START), 1..MAX_WINDOWS),
    ) {
        let max = min + span;
        let mut feeder = Feeder::new(algorithm, min, max, initial);
        prop_assert!((min..=max).contains(&feeder.limit.limit()));
        for (samples, micros, outcome, in_flight) in windows {
            let limit = feeder.window(samples, Duration::from_micros(micros), outcome, in_flight);
            prop_assert!((min..=max).contains(&limit), "{limit} outside {min}..={max}");
        }
    }

    // The algorithms' arithmetic, not memory: Miri runs the bounds property, which
    // drives the same driver code, and leaves these to the native run (their rounds
    // need more samples than Miri's budget gives them).
    #[cfg_attr(miri, ignore)]
    #[test]
    fn the_gradient_falls_under_sustained_rising_latency(
        base in 1_000u64..50_000,
        shrink in 0.7f64..0.95,
        initial in 32u64..MAX_START,
    ) {
        // A server whose concurrency shrinks window after window at the same service
        // time: at any limit above it, latency rises (queueing), and keeps rising. (A
        // latency that rose at every limit alike would be a slower service, which the
        // probes rightly take as the new no-load latency.)
        //
        // From 32 permits up. Below, a server losing up to 30% a window is down to one
        // slot within about nine windows, while a probe's descent takes two windows a
        // step: a probe then measures a latency that queued more than the last one and
        // takes it as a slower service, and the limit can end near 16 with a server of 1
        // (a sweep of starts 20..160 by shrinks 0.005 apart failed at starts 20 to 29
        // only; with the domain from 20, this property failed about one run in 200).
        // The server obeys Little's law: a window of `SAMPLES` answers lasts as long as
        // the server takes to give them, `SAMPLES` × the latency / what it runs at once.
        let (start, limit, capacity) = shrinking(base, shrink, initial);
        prop_assert!(limit * 3 <= start * 2, "{start} -> {limit} (a server of {capacity:.1})");
    }

    // The algorithms' arithmetic, not memory: Miri runs the bounds property, which
    // drives the same driver code, and leaves these to the native run (their rounds
    // need more samples than Miri's budget gives them).
    #[cfg_attr(miri, ignore)]
    #[test]
    fn the_gradient_and_aimd_rise_with_sustained_headroom(
        (algorithm, name) in algorithm(),
        base in 1_000u64..50_000,
        initial in 4u64..MAX_START / 2,
    ) {
        let mut feeder = Feeder::new(algorithm, 1, 10_000, initial);
        // Every permit in use, latency flat at the no-load latency: room to grow.
        let mut limit = initial;
        for _ in 0..12 {
            limit = feeder.window(SAMPLES, Duration::from_micros(base), Outcome::Success, limit);
        }
        prop_assert!(limit > initial, "{name}: {initial} -> {limit}");
    }
}
