//! Baselines the benches compare against, and the ratio report.
//!
//! Everything here exists to be measured beside `admission`'s own types in one run; see
//! `benches/ledgers.rs` and the `report` binary.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;

/// Criterion estimates to a table of ratios; see the `report` binary.
pub mod report;

/// One whole call of a tower service, for the layer benches.
pub mod layer;

/// A virtual-time simulation of a server behind a limiter, for the `adaptive` binary.
pub mod sim;

/// The workspace README's examples, compiled and run as doctests (this crate is not
/// published, so it can depend on every adapter the README shows).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct WorkspaceReadme;

/// The floor: a bare compare-exchange acquire and an atomic-subtract release on one
/// padded word. No permit object, no lifetime management: nothing can be cheaper and
/// still refuse correctly.
#[derive(Debug)]
pub struct Floor {
    word: CachePadded<AtomicU64>,
    capacity: u64,
}

impl Floor {
    /// A counter admitting up to `capacity` units.
    pub fn new(capacity: u64) -> Self {
        Self {
            word: CachePadded::new(AtomicU64::new(0)),
            capacity,
        }
    }

    /// Takes `n` units if they fit.
    #[inline]
    pub fn try_acquire(&self, n: u64) -> bool {
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            if current + n > self.capacity {
                return false;
            }
            match self.word.compare_exchange_weak(
                current,
                current + n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    /// The optimistic alternative: add, and roll back if over.
    #[inline]
    pub fn try_acquire_optimistic(&self, n: u64) -> bool {
        if self.word.fetch_add(n, Ordering::Relaxed) + n > self.capacity {
            self.word.fetch_sub(n, Ordering::Release);
            false
        } else {
            true
        }
    }

    /// Gives `n` units back.
    #[inline]
    pub fn release(&self, n: u64) {
        self.word.fetch_sub(n, Ordering::Release);
    }
}

/// What an `Arc`-holding permit would cost: the floor plus a reference-count increment
/// on acquire and a decrement on release.
#[derive(Debug)]
pub struct ArcPermit(Arc<Floor>);

impl ArcPermit {
    /// Acquires one unit and clones the `Arc`.
    #[inline]
    pub fn try_acquire(floor: &Arc<Floor>) -> Option<ArcPermit> {
        floor.try_acquire(1).then(|| ArcPermit(floor.clone()))
    }
}

impl Drop for ArcPermit {
    fn drop(&mut self) {
        self.0.release(1);
    }
}
