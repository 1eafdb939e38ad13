//! The count ledger: at most `capacity` permits in flight.
//!
//! # Design
//!
//! One 64-bit word holds the number of permits in flight below bit 63 and, in bit 63,
//! the presence of the ledger's handles (see `raw`). Acquiring is a bounded
//! compare-exchange loop on that word; releasing is one too, which fails if acquisitions
//! wait (bit 61, `QUEUE`: see `wait`), so that the release then hands its slot on. The
//! word is
//! also the allocation's reference count, so a permit is one pointer and costs no
//! reference-count traffic of its own.
//!
//! Why a compare-exchange loop rather than an optimistic add with roll-back: the add
//! never retries, but near the limit it makes the word overshoot for a moment, so a
//! concurrent acquirer can be refused although the limit was never really reached
//! (a spurious 503), and a snapshot can read more than the capacity. The loop retries
//! only when another thread changed the word between the load and the exchange, and
//! never refuses spuriously. The benches (`admission-bench`, group `count`) measure both.

use std::fmt;
use std::ptr::NonNull;
use std::task::Waker;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::limit::{self, UNLIMITED};
use crate::priority::{MAX_CLASSES, Priority};
use crate::raw::{self, Counted, OWNER, Owner};
use crate::samples::{Control, Driver, Outcome, Steered};
use crate::stats::{Snapshot, Stats};
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering, Track};
use crate::{CapacityError, Refused};

/// Set in the word while a [`Drain`] waits for the last permit. A share of the count in
/// its own right (see "Waiting for the last permit" on [`CountLedger::drain`]), and above
/// every threshold, so nothing is admitted while it is set.
const WATCH: u64 = 1 << 62;
/// Set in the word while acquisitions wait for a slot (see [`CountLedger::acquire`]).
/// Not a share of the count: whoever sets or clears it holds one. Above every threshold,
/// so that no acquisition passes the waiters, and a release that finds it hands its slot
/// on instead of giving it back.
const QUEUE: u64 = 1 << 61;
/// The permits-in-flight field of the word.
const HELD: u64 = QUEUE - 1;

/// A limit on how many permits are in flight at once.
///
/// Cloning the ledger gives another handle to the same limit. Permits are `'static`: a
/// permit keeps the ledger's state alive by itself, so handles may be dropped while
/// permits are still held. A capacity of 0 given to [`new`](Self::new) means unlimited:
/// the ledger still counts (so [`snapshot`](Self::snapshot) and [`drain`](Self::drain)
/// work) but never refuses unless closed.
///
/// What it bounds: the number of permits. It does not bound what each permit's holder
/// does (bytes buffered, time taken); pair it with a [`ByteLedger`](crate::ByteLedger)
/// for memory.
///
/// # Examples
///
/// ```
/// use admission_core::{CountLedger, Refused};
///
/// let ledger = CountLedger::new(2)?;
/// let a = ledger.try_acquire()?;
/// let b = ledger.try_acquire()?;
/// assert_eq!(ledger.try_acquire().unwrap_err(), Refused::Count);
///
/// drop(a);
/// let c = ledger.try_acquire()?;
/// assert_eq!(ledger.in_flight(), 2);
/// drop((b, c));
/// assert_eq!(ledger.in_flight(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Run-time control
///
/// [`set_capacity`](Self::set_capacity) changes the limit for the next acquisition (and
/// refuses 0, which in configuration means unlimited: removing the limit is
/// [`set_unlimited`](Self::set_unlimited), written out). [`close`](Self::close) refuses
/// everything new with [`Refused::Closed`] until [`reopen`](Self::reopen), whatever the
/// capacity is set to meanwhile: a close by an operator or at shutdown is never undone by
/// a later limit change. [`drain`](Self::drain) closes and waits for the last permit.
///
/// # Waiting (optional)
///
/// By default a full ledger refuses at once. [`set_max_waiting`](Self::set_max_waiting)
/// lets that many acquisitions wait for a slot ([`acquire`](Self::acquire), a future):
/// a release hands its slot straight to the next waiter (by class, then oldest first, or
/// newest first once the queue stands), and beyond the bound acquisitions are refused at
/// once as before. The future has no timer; bound it with your runtime's timeout.
///
/// # Cost, and the choice behind it
///
/// Acquiring is one compare-exchange on the ledger's word, releasing one more (which
/// fails while acquisitions wait, so that the release hands its slot on): no lock, no
/// allocation, and no reference-count traffic, because the ledger's admission word is
/// also its allocation's reference count (a permit is one pointer). What that costs
/// against `tokio::sync::Semaphore::try_acquire_owned` and against a bare
/// compare-exchange loop (the floor), in instructions and on the wall clock, is in
/// `admission-bench`'s README, measured in the run CI checks.
///
/// The trade-off: a compare-exchange loop retries when another thread changed the word
/// between its load and its exchange, where an optimistic add-then-roll-back never
/// retries. The optimistic add measures a little faster (the bench's `count` group has
/// both), but near the limit it makes the word overshoot
/// for a moment, so a concurrent acquirer can be refused although the limit was never
/// reached (a spurious 503), and snapshots can read more than the capacity. A spurious
/// refusal under load is exactly when it hurts, so this ledger retries.
///
/// # Memory ordering
///
/// Admission itself is a counter: an acquisition synchronises with nothing, and the
/// ledger makes no promise about the order of work done under different permits. (The
/// release decrement and the final free are ordered: every release is a `Release`
/// decrement and the one that frees makes an `Acquire` load of the word first, as `Arc`
/// does under ThreadSanitizer; weakening either fails the loom models and Miri.) A
/// [`Drain`] that resolves because nothing is in flight has made an `Acquire` read of
/// the last release: everything done under every permit happens before it returns.
#[derive(Clone)]
pub struct CountLedger {
    owner: Arc<Owner<CountInner>>,
}

struct CountInner {
    /// The admission word and the threshold it is checked against, read together on
    /// every acquire, share a cache line. The rest, written on cold paths, is on another
    /// line so a refusal storm does not slow admissions. (128-byte padding as
    /// `crossbeam_utils::CachePadded` chooses for x86_64 and aarch64: adjacent-line
    /// prefetch pairs lines.)
    hot: CachePadded<Hot>,
    cold: CachePadded<Cold>,
    track: Track,
}

struct Hot {
    /// `OWNER` | `WATCH` | permits in flight.
    state: AtomicU64,
    /// What an acquisition compares the permits in flight against: the capacity, 0 while
    /// closed, `HELD` (a count no acquisition reaches) for unlimited. Written only
    /// under `Cold::control`, from the capacity and the closed flag together, so a
    /// capacity change cannot undo a close.
    threshold: AtomicU64,
}

struct Cold {
    stats: Stats,
    /// Refusals of class-aware acquisitions, by class index.
    refused_by_class: [AtomicU64; MAX_CLASSES],
    /// Refusals of retries ([`Priority::retry`]), also counted by class.
    refused_retries: AtomicU64,
    /// The configured capacity in its stored form (`UNLIMITED` for none).
    capacity: AtomicU64,
    closed: AtomicBool,
    /// An [`AdaptiveLimit`](crate::AdaptiveLimit) drives the capacity.
    driven: AtomicBool,
    /// An operator set the capacity by hand while it was driven: the controller's
    /// changes are ignored until the limit is handed back.
    fixed: AtomicBool,
    /// The samples and the controller of an adaptive limit, from the first one on.
    driver: std::sync::OnceLock<Driver>,
    /// How many acquisitions may wait at once (0: none; see `wait`).
    max_waiting: AtomicU64,
    /// Serialises every change of the threshold, and holds the drains and the
    /// acquisitions waiting.
    control: Mutex<Waiters>,
}

/// The drains waiting for the last permit, each under the id it registered with, and the
/// acquisitions waiting for a slot.
struct Waiters {
    /// The clock the standing-queue rule reads (see `CountLedger::set_wait_clock`).
    clock: fn() -> Instant,
    list: Vec<(u64, Waker)>,
    next_id: u64,
    /// The acquisitions waiting, in the order they came (see `wait`).
    queue: std::collections::VecDeque<wait::Waiter>,
    /// Since when the queue has been waited in without a break (see `wait`): set when a
    /// waiter finds it empty after a break, kept while it empties for less than the
    /// interval.
    busy_since: Option<Instant>,
    /// When the queue last emptied, while it is empty.
    emptied_at: Option<Instant>,
    /// The standing-queue rule (see `CountLedger::set_standing_queue`): how long the queue
    /// must have been waited in without a break to stand, and how long a waiter may wait
    /// once it does.
    interval: Duration,
    target: Duration,
    /// The round being served, and the last place given in the turns (see `wait`).
    turn: (u64, u64),
    /// Each waiting flow's waiters and the place of its oldest, as last counted (see
    /// `turns`): kept, so that counting them under the lock allocates nothing once it
    /// has grown to the flows that wait.
    flows: std::collections::HashMap<Option<u64>, (usize, usize)>,
}

impl Default for Waiters {
    fn default() -> Self {
        Self {
            clock: Instant::now,
            list: Vec::new(),
            next_id: 0,
            queue: std::collections::VecDeque::new(),
            busy_since: None,
            emptied_at: None,
            interval: wait::INTERVAL,
            target: wait::TARGET,
            turn: (0, 0),
            flows: std::collections::HashMap::new(),
        }
    }
}

impl Counted for CountInner {
    fn word(&self) -> &AtomicU64 {
        &self.hot.state
    }

    fn track(&self) -> &Track {
        &self.track
    }
}

impl CountInner {
    /// Recomputes the threshold from the capacity and the closed flag. Called with
    /// `cold.control` held.
    fn store_threshold(&self) {
        let threshold = match (self.cold.closed.load(Ordering::Relaxed), self.capacity()) {
            (true, _) => 0,
            (false, UNLIMITED) => HELD,
            (false, capacity) => capacity,
        };
        // Relaxed: a plain setting, read by acquisitions as "the next acquisition" sees it.
        self.hot.threshold.store(threshold, Ordering::Relaxed);
    }

    fn capacity(&self) -> u64 {
        self.cold.capacity.load(Ordering::Relaxed)
    }

    /// The permits held now, with `WATCH` if a drain watches (the state word less its
    /// owner and queue bits). Relaxed: each caller says what its read may miss.
    #[inline(always)]
    fn held(&self) -> u64 {
        self.hot.state.load(Ordering::Relaxed) & !(OWNER | QUEUE)
    }

    /// What an acquisition of `priority`'s class (the whole threshold for none) compares
    /// the permits in flight against, from one read of the threshold word.
    #[inline(always)]
    fn threshold(&self, priority: Option<Priority>) -> u64 {
        // Relaxed: a plain setting (see `acquire`).
        let threshold = self.hot.threshold.load(Ordering::Relaxed);
        match priority {
            Some(priority) => priority.of(threshold),
            None => threshold,
        }
    }

    /// The refusal of an acquisition the threshold turned away: closed, or full. Counted,
    /// unless `waits` and the ledger is full rather than closed: its caller waits for a
    /// slot next, and the request is counted where that wait ends.
    #[cold]
    fn refuse(&self, priority: Option<Priority>, waits: bool) -> Refused {
        let refused = if self.cold.closed.load(Ordering::Relaxed) {
            Refused::Closed
        } else if priority.is_some() && self.held() < self.threshold(None) {
            // The class's share is in flight, not the capacity (Relaxed: which of the two
            // names the refusal, nothing more).
            Refused::Class
        } else {
            Refused::Count
        };
        if !waits || refused == Refused::Closed {
            self.cold.stats.refuse();
            if let Some(priority) = priority {
                // Relaxed: statistics.
                if let Some(class) = self.cold.refused_by_class.get(priority.index()) {
                    class.fetch_add(1, Ordering::Relaxed);
                }
                if priority.is_retry() {
                    self.cold.refused_retries.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        refused
    }

    /// Takes `WATCH` out of the word if permits are still in flight: the last drain stopped
    /// waiting before the last release. With none in flight, `WATCH` belongs to the
    /// release that took the count to zero (see [`CountPermit::release`]) and is left to
    /// it. Called with `cold.control` held.
    fn unwatch(&self) {
        let state = &self.hot.state;
        let mut current = state.load(Ordering::Relaxed);
        // Relaxed: the bit is a share of the count, but the word stays above zero with
        // or without it (permits are in flight), so nothing is ordered for the lifetime
        // protocol; who may take it is decided under the control lock.
        while current & WATCH != 0 && current & HELD != 0 {
            match state.compare_exchange_weak(
                current,
                current & !WATCH,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
    }

    /// The rest of the release that took the count from one to zero while `WATCH` was
    /// set: wakes every drain, then gives `WATCH` back.
    ///
    /// # Safety
    ///
    /// `ptr` is a live `CountInner` whose word held `WATCH` when the caller's own release
    /// took the count to zero. That `WATCH` is then the caller's to give up: nothing can
    /// acquire while it is set, and drains and `reopen` take it only while permits are
    /// in flight. The caller does not use `ptr` afterwards.
    #[cold]
    #[inline(never)]
    unsafe fn last_out(ptr: NonNull<CountInner>) {
        let waiters = {
            // SAFETY: the `WATCH` share keeps the cell alive until the `put` below.
            let inner = unsafe { ptr.as_ref() };
            let mut control = inner.cold.control.lock();
            std::mem::take(&mut control.list)
        };
        // SAFETY: the `WATCH` share, given up once, after the lock guard is gone.
        unsafe { raw::put(ptr, WATCH) };
        // The wakers were moved out: waking touches nothing of the ledger's.
        for (_, waker) in waiters {
            waker.wake();
        }
    }
}

impl CountInner {
    #[inline]
    fn record_at(&self, now: Instant, latency: Duration, outcome: Outcome) {
        if let Some(driver) = self.cold.driver.get() {
            driver.record(self, now, latency, outcome);
        }
    }
}

impl Steered for CountInner {
    fn in_flight(&self) -> u64 {
        // Relaxed: a statistic.
        self.hot.state.load(Ordering::Relaxed) & HELD
    }

    fn capacity(&self) -> u64 {
        limit::decode(CountInner::capacity(self))
    }

    fn is_fixed(&self) -> bool {
        // Relaxed: a setting.
        self.cold.fixed.load(Ordering::Relaxed)
    }

    /// The controller's setting: applied unless an operator fixed the capacity by hand.
    /// A close (or drain) stays in force either way.
    fn steer(&self, capacity: u64) {
        let mut wake = Vec::new();
        {
            let mut control = self.cold.control.lock();
            // Relaxed: read and written only under `control`.
            if !self.cold.fixed.load(Ordering::Relaxed) {
                self.cold.capacity.store(capacity, Ordering::Relaxed);
                self.store_threshold();
                // A limit that grew has room for waiters.
                self.grant(&mut control, &mut wake);
            }
        }
        wake.into_iter().for_each(Waker::wake);
    }
}

impl fmt::Debug for CountLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountLedger")
            .field("in_flight", &self.in_flight())
            .field("capacity", &self.capacity())
            .field("closed", &self.is_closed())
            .finish()
    }
}

mod acquire;
mod control;
mod drain;
mod permit;
mod turns;
mod wait;
mod wait_settings;

pub use drain::Drain;
pub use permit::CountPermit;
pub use wait::Acquire;

#[cfg(all(test, not(admission_loom)))]
mod drain_tests;

#[cfg(all(test, not(admission_loom)))]
mod tests;

// Out of Miri: the turns are plain code under the lock, and the unsafe release and hand-off
// they go through are `wait_tests`' under Miri already.
#[cfg(all(test, not(admission_loom), not(miri)))]
mod turn_tests;
#[cfg(all(test, not(admission_loom)))]
mod wait_tests;

#[cfg(all(test, admission_loom))]
mod loom_models;
