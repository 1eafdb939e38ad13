//! The driver: where a driven ledger's permits add their samples, and the window's close.

use super::{Algorithm, BUCKETS, COUNT_BITS, MAX_MICROS, Outcome, Spread, Window, micros, nanos};

use std::cell::Cell;

use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU32, AtomicU64, Mutex, Ordering};

/// What a driven ledger keeps for its controller, reachable from its permits (so that a
/// permit can record a sample with no reference-count traffic): the shards samples are
/// added to, and the controller itself. Made by the first controller of the ledger and
/// kept for later ones.
pub(crate) struct Driver {
    /// The clock's origin (the first controller's epoch).
    pub(crate) epoch: Instant,
    pub(crate) shards: Box<[CachePadded<Shard>]>,
    /// Nanoseconds since `epoch` at which the open window may close.
    pub(crate) deadline: AtomicU64,
    /// Microseconds from which a success counts as an overload (`u64::MAX`: never).
    pub(crate) overload_after: AtomicU64,
    /// The controller; `None` once its last handle is gone.
    pub(crate) control: Mutex<Option<Control>>,
    /// The latency estimate as of the last window's close (see `adaptive::LatencyEstimate`):
    /// microseconds (`u64::MAX`: none yet), and the close, in nanoseconds since `epoch`.
    pub(crate) typical: AtomicU64,
    pub(crate) no_load: AtomicU64,
    pub(crate) as_of: AtomicU64,
}

/// What a window accumulates on one shard.
pub(crate) struct Shard {
    /// Samples (low `COUNT_BITS`) and their latencies in microseconds (the rest).
    pub(crate) packed: AtomicU64,
    pub(crate) overloaded: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) max_in_flight: AtomicU64,
    /// Samples squared, and their squares (see [`Spread`]).
    pub(crate) squared: AtomicU64,
    pub(crate) squared_micros: AtomicU64,
    pub(crate) squares: AtomicU64,
    pub(crate) buckets: [AtomicU32; BUCKETS],
}

pub(crate) const COUNT: u64 = (1 << COUNT_BITS) - 1;

/// A shard whose fields reach half their room hands its samples to the open window early.
pub(crate) const COUNT_FULL: u64 = 1 << (COUNT_BITS - 1);

pub(crate) const MICROS_FULL: u64 = 1 << (64 - COUNT_BITS - 1);

// One sample cannot overrun the latency field, even from just below the mark.
const _: () = assert!(MAX_MICROS < MICROS_FULL);

impl Shard {
    pub(crate) fn new() -> Self {
        Self {
            packed: AtomicU64::new(0),
            overloaded: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            max_in_flight: AtomicU64::new(0),
            squared: AtomicU64::new(0),
            squared_micros: AtomicU64::new(0),
            squares: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// Adds one sample; whether the shard is filling up. `in_flight` is read for every
    /// eighth sample of the shard's window (the first included): the ledger's word is
    /// the line every admission and release writes, and a maximum over a window of
    /// dozens of samples needs no more.
    #[inline]
    pub(crate) fn add(
        &self,
        micros: u64,
        outcome: Outcome,
        in_flight: impl FnOnce() -> u64,
    ) -> bool {
        // Relaxed throughout: statistics, read whole by the window's `take`; every add is
        // a read-modify-write, so each sample is in exactly one window.
        let before = self
            .packed
            .fetch_add(1 | (micros << COUNT_BITS), Ordering::Relaxed);
        match outcome {
            Outcome::Success => {}
            Outcome::Overload => {
                self.overloaded.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Gone => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.buckets[Spread::bucket(micros)].fetch_add(1, Ordering::Relaxed);
        if before & 7 == 0 {
            self.squared.fetch_add(1, Ordering::Relaxed);
            self.squared_micros
                .fetch_add(micros.min(Spread::CAP_MICROS), Ordering::Relaxed);
            self.squares
                .fetch_add(Spread::square(micros), Ordering::Relaxed);
            let in_flight = in_flight();
            if in_flight > self.max_in_flight.load(Ordering::Relaxed) {
                self.max_in_flight.fetch_max(in_flight, Ordering::Relaxed);
            }
        }
        before & COUNT >= COUNT_FULL || before >> COUNT_BITS >= MICROS_FULL
    }

    /// Moves the shard's samples into `window`.
    pub(crate) fn take(&self, window: &mut Window) {
        let packed = self.packed.swap(0, Ordering::Relaxed);
        window.samples += packed & COUNT;
        window.latency_total += Duration::from_micros(packed >> COUNT_BITS);
        window.overloaded += self.overloaded.swap(0, Ordering::Relaxed);
        window.dropped += self.dropped.swap(0, Ordering::Relaxed);
        let in_flight = self.max_in_flight.swap(0, Ordering::Relaxed);
        window.max_in_flight = window.max_in_flight.max(in_flight);
        window.spread.samples += self.squared.swap(0, Ordering::Relaxed);
        window.spread.total += self.squared_micros.swap(0, Ordering::Relaxed);
        window.spread.squares += u128::from(self.squares.swap(0, Ordering::Relaxed));
        for (bucket, count) in window.spread.buckets.iter_mut().zip(&self.buckets) {
            *bucket += count.swap(0, Ordering::Relaxed);
        }
    }
}

/// The state the window's closer works on.
pub(crate) struct Control {
    pub(crate) algorithm: Box<dyn Algorithm>,
    /// The open window's samples, gathered from the shards so far.
    pub(crate) pending: Window,
    /// When the open window opened, in nanoseconds since the epoch.
    pub(crate) opened: u64,
    pub(crate) window: u64,
    pub(crate) min_samples: u64,
    pub(crate) bounds: (u64, u64),
    pub(crate) windows: u64,
    pub(crate) last: Option<Window>,
    /// The windows' mean latency, averaged (seconds).
    pub(crate) typical: Option<f64>,
}

/// What the driver needs of the ledger it drives.
pub(crate) trait Steered {
    fn in_flight(&self) -> u64;
    /// The capacity in force (0 for unlimited).
    fn capacity(&self) -> u64;
    fn is_fixed(&self) -> bool;
    fn steer(&self, capacity: u64);
}

impl Driver {
    pub(crate) fn new(epoch: Instant) -> Self {
        Self {
            epoch,
            shards: (0..shard_count())
                .map(|_| CachePadded::new(Shard::new()))
                .collect(),
            deadline: AtomicU64::new(u64::MAX),
            overload_after: AtomicU64::new(u64::MAX),
            control: Mutex::new(None),
            typical: AtomicU64::new(u64::MAX),
            no_load: AtomicU64::new(u64::MAX),
            as_of: AtomicU64::new(0),
        }
    }

    /// Installs a controller whose clock starts at `epoch`.
    pub(crate) fn install(&self, control: Control, epoch: Instant, overload_after: u64) {
        let mut slot = self.control.lock();
        // Samples left from an earlier controller are not this one's.
        let mut stale = Window::default();
        for shard in self.shards.iter() {
            shard.take(&mut stale);
        }
        let now = nanos(epoch.saturating_duration_since(self.epoch));
        let control = slot.insert(control);
        control.opened = now;
        // Relaxed: settings read as hints on the recording path.
        self.overload_after.store(overload_after, Ordering::Relaxed);
        self.deadline
            .store(now.saturating_add(control.window), Ordering::Relaxed);
    }

    /// Removes the controller: samples are then dropped as they are gathered.
    pub(crate) fn uninstall(&self) {
        *self.control.lock() = None;
    }

    #[inline]
    pub(crate) fn record(
        &self,
        ledger: &impl Steered,
        now: Instant,
        latency: Duration,
        outcome: Outcome,
    ) {
        let micros = micros(latency);
        // Relaxed: a setting.
        let outcome = match outcome {
            Outcome::Success if micros >= self.overload_after.load(Ordering::Relaxed) => {
                Outcome::Overload
            }
            outcome => outcome,
        };
        let shard = &self.shards[shard_index() & (self.shards.len() - 1)];
        let full = shard.add(micros, outcome, || ledger.in_flight());
        let now = nanos(now.saturating_duration_since(self.epoch));
        // Relaxed: a hint; the closer checks again under the lock.
        if full || now >= self.deadline.load(Ordering::Relaxed) {
            self.close_window(ledger, now);
        }
    }

    /// Gathers the shards and, if the window has lasted long enough with enough samples,
    /// closes it: the algorithm's answer becomes the ledger's capacity.
    #[cold]
    pub(crate) fn close_window(&self, ledger: &impl Steered, now: u64) {
        // Never wait: another thread is closing this window.
        let Some(mut control) = self.control.try_lock() else {
            return;
        };
        let Some(control) = control.as_mut() else {
            let mut stale = Window::default();
            for shard in self.shards.iter() {
                shard.take(&mut stale);
            }
            return;
        };
        for shard in self.shards.iter() {
            shard.take(&mut control.pending);
        }
        let elapsed = now.saturating_sub(control.opened);
        if elapsed < control.window || control.pending.samples < control.min_samples {
            // Relaxed: a hint (see `record`). Look again after a slice of a window.
            let next = now.max(control.opened + control.window) + control.window / 8;
            self.deadline.store(next, Ordering::Relaxed);
            return;
        }
        let mut window = std::mem::take(&mut control.pending);
        window.limit = ledger.capacity();
        window.elapsed = Duration::from_nanos(elapsed);
        if !ledger.is_fixed() {
            let (min, max) = control.bounds;
            ledger.steer(control.algorithm.update(&window).clamp(min, max));
        }
        control.windows += 1;
        if let Some(mean) = window.mean_latency() {
            // A weight of a quarter: about the last four windows.
            let mean = mean.as_secs_f64();
            let typical = control
                .typical
                .map_or(mean, |typical| typical + TYPICAL_WEIGHT * (mean - typical));
            control.typical = Some(typical);
            // Relaxed: each field a reading on its own (see `LatencyEstimate`).
            self.typical
                .store(micros(Duration::from_secs_f64(typical)), Ordering::Relaxed);
            let no_load = control.algorithm.no_load_latency().map_or(u64::MAX, micros);
            self.no_load.store(no_load, Ordering::Relaxed);
            self.as_of.store(now, Ordering::Relaxed);
        }
        control.last = Some(window);
        control.opened = now;
        self.deadline
            .store(now.saturating_add(control.window), Ordering::Relaxed);
    }
}

/// The weight of each window's mean latency in the typical latency.
const TYPICAL_WEIGHT: f64 = 0.25;

/// The latency estimate as the driver's atomics hold it.
pub(crate) struct Estimate {
    pub(crate) typical: Duration,
    pub(crate) no_load: Option<Duration>,
    pub(crate) as_of: Instant,
}

impl Driver {
    pub(crate) fn latency(&self) -> Option<Estimate> {
        // Relaxed: statistics (see `adaptive::LatencyEstimate`).
        let typical = self.typical.load(Ordering::Relaxed);
        if typical == u64::MAX {
            return None;
        }
        let no_load = self.no_load.load(Ordering::Relaxed);
        Some(Estimate {
            typical: Duration::from_micros(typical),
            no_load: (no_load != u64::MAX).then(|| Duration::from_micros(no_load)),
            as_of: self.epoch + Duration::from_nanos(self.as_of.load(Ordering::Relaxed)),
        })
    }
}

/// Shards: four per core, rounded up to a power of two (at most 256), so that threads
/// numbered in turn rarely share one.
pub(crate) fn shard_count() -> usize {
    if cfg!(admission_loom) {
        return 2;
    }
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .saturating_mul(4)
        .min(256)
        .next_power_of_two()
}

/// This thread's shard, before masking: threads are numbered as they first record.
#[inline]
pub(crate) fn shard_index() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|index| match index.get() {
        usize::MAX => {
            // Relaxed: a spreading hint, not a protocol.
            let next = NEXT.fetch_add(1, Ordering::Relaxed) % 1024;
            index.set(next);
            next
        }
        known => known,
    })
}
