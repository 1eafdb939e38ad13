//! Adaptive concurrency: a count limit that finds the server's concurrency itself, and
//! follows it when it changes.
//!
//! Every static count limit is a guess: too high and the server queues inside (latency
//! climbs, work times out after it was paid for), too low and it sheds work it could have
//! served. An [`AdaptiveLimit`] drives a [`CountLedger`]'s capacity from what the work
//! admitted under it reports: its latency and its [`Outcome`].
//!
//! ```
//! use std::time::Instant;
//! use admission_core::adaptive::{AdaptiveLimit, Gradient, Outcome};
//! use admission_core::CountLedger;
//!
//! let ledger = CountLedger::new(0)?;
//! let _limit = AdaptiveLimit::builder(Gradient::default()).bounds(4, 5_000).build(&ledger)?;
//!
//! // Per request: admit, work, report.
//! let permit = ledger.try_acquire()?;
//! let admitted = Instant::now();
//! // ... the work ...
//! permit.record(admitted.elapsed(), Outcome::Success);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Choosing an algorithm
//!
//! - [`Gradient`] (the default choice): compares each round's mean latency with a
//!   no-load latency it measures itself (by short probes below the knee), and keeps the
//!   limit just above the concurrency the server really has (10% plus √limit above it),
//!   where it is busy all the time and its queue stays short. For servers whose work
//!   waits on a bounded resource (a pool, a dependency's concurrency, CPU). Told neither
//!   the server's concurrency nor its service time, started far below and far above, it
//!   meets the targets of `admission-bench`'s simulator (`cargo run --release -p
//!   admission-bench --bin adaptive`: goodput at least 98% of capacity, p99 latency within
//!   1.25x of the best static limit's, p99 time queued inside the server under one service
//!   time, the limit within 0.75x-1.5x of a new capacity 2 s after it changes) across
//!   exponential and heavy-tailed service times, 8 to 500 workers, 1 ms to 200 ms, bursts,
//!   steps and capacity changes, except where its docs say it is slow to follow
//!   (mixtures of very unequal requests, a service slowing little by little, the second
//!   after capacity comes back from a quarter); the bench README lists every figure.
//! - [`Aimd`]: grows while nothing fails, backs off on failures (overload answers, errors,
//!   clients giving up). For services that report overload themselves, or whose requests
//!   vary so much that latency says little. It learns of a queue only when the queue
//!   makes work fail, so a limit that is too high is never lowered while nothing errors:
//!   pair it with a latency threshold ([`AdaptiveBuilder::overload_latency`]).
//! - Your own: [`Algorithm`] is one method, from a [`Window`] of samples to the next limit.
//!
//! [`AdaptiveLimit::latency`] gives the limit's estimate of how long an admitted request
//! takes now (recent windows' mean latency, and the algorithm's no-load latency), and when
//! it was taken.
//!
//! # Where a sample ends
//!
//! Latency runs from admission to a point the adapter chooses. `admission-tower` ends it
//! at the response head by default: a streaming response (server-sent events, a gRPC
//! stream, a download to a slow client) would otherwise read as a server slowing down;
//! it can end at the body's end instead, for services whose work is in the body. Work
//! that ends without a response (the client went away) is [`Outcome::Gone`].
//!
//! # Bounds, windows, and who wins
//!
//! The limit stays within [`AdaptiveBuilder::bounds`] (default 1 to 10 000), whatever the
//! algorithm says: the minimum is what a struggling server is still sent. A window closes
//! at the first sample after it has lasted [`AdaptiveBuilder::window`] (100 ms) with at
//! least [`AdaptiveBuilder::min_samples`] (50): a slow server has longer windows. An
//! operator's `close` or `drain` of the ledger overrides the controller; an operator's
//! `set_capacity` takes the limit out of its hands until [`AdaptiveLimit::resume`].
//!
//! # Design
//!
//! Admission is untouched: the [`CountLedger`] still admits with one compare-exchange
//! against its capacity, and an [`AdaptiveLimit`] changes that capacity between windows,
//! through the same path an operator's `set_capacity` takes (so held permits are never
//! revoked and priority classes follow the new limit at once).
//!
//! Recording a sample must not serialise the releases: each thread adds its samples to
//! its own shard (cache-padded; four per core), with one `fetch_add` of the latency and
//! the count packed together, so a window takes each sample whole or not at all; the
//! permits in flight are read for one sample in eight. Whichever recording finds the
//! window's time up closes it under a `try_lock` (the others walk on, never waiting):
//! it gathers the shards and hands the window to the [`Algorithm`], whose answer,
//! clamped into the bounds, becomes the ledger's capacity. The shards live in the
//! ledger's allocation, so a permit records through its ledger
//! ([`CountPermit::record`](crate::CountPermit::record)) with no reference-count traffic.
//! What a sample adds to an acquire and release, and the two clock reads a real sample
//! takes, are measured by `admission-bench` (group `adaptive`; its README has the figures
//! and the bound CI checks).
//!
//! Every atomic here is relaxed: the samples are statistics (each read-modify-write puts a
//! sample in exactly one window, whatever the ordering), the window's state is under a
//! mutex, and the capacity changes through the ledger's control lock. loom models check
//! that samples recorded on two threads while windows close are each counted once
//! (swapping a shard's word as a load and a store loses samples and fails it), and that
//! an operator's capacity outlasts a controller setting it at the same time (dropping the
//! check fails it), and that a controller dropped while a window closes neither deadlocks
//! nor lingers (a window's closer takes the limit's lock and then the ledger's; removing
//! the controller while holding the ledger's lock deadlocks in that model).

use std::fmt;

use crate::count::CountLedger;

mod aimd;
mod builder;
mod gradient;
mod limit;

pub use crate::samples::{Algorithm, Outcome, Window};
pub(crate) use crate::samples::{Control, Spread};
pub use aimd::Aimd;
pub use builder::AdaptiveBuilder;
pub use gradient::Gradient;
#[doc(hidden)]
#[cfg(any(test, feature = "ablation"))]
pub use gradient::Mechanism;
pub use limit::{AdaptiveLimit, AdaptiveSnapshot, LatencyEstimate};

/// Why an [`AdaptiveLimit`] could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdaptiveError {
    /// The bounds are empty (minimum above maximum), start at 0, or end above
    /// [`CountLedger::MAX_CAPACITY`].
    Bounds {
        /// The minimum asked for.
        min: u64,
        /// The maximum asked for.
        max: u64,
    },
    /// Another [`AdaptiveLimit`] drives this ledger already.
    AlreadyDriven,
}

impl fmt::Display for AdaptiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bounds { min, max } => write!(
                f,
                "adaptive limit bounds {min}..={max} are invalid: need 1 <= min <= max <= {}",
                CountLedger::MAX_CAPACITY
            ),
            Self::AlreadyDriven => f.write_str("another adaptive limit drives this count ledger"),
        }
    }
}

impl std::error::Error for AdaptiveError {}

#[cfg(all(test, not(admission_loom)))]
mod tests;

// Arithmetic on model windows, no unsafe code: not worth Miri's hundredfold slowdown.
#[cfg(all(test, not(admission_loom), not(miri)))]
mod algorithm_tests;

#[cfg(all(test, admission_loom))]
mod loom_tests;
