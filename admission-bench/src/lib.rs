//! Baselines the benches compare against, and the ratio report.
//!
//! Everything here exists to be measured beside `admission`'s own types in one run; see
//! `benches/ledgers.rs` and the `report` binary.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// Criterion estimates to a table of ratios; see the `report` binary.
pub mod report;

/// One whole call of a tower service, for the layer benches.
pub mod layer;

/// A virtual-time simulation of a server behind a limiter, for the `adaptive` binary.
pub mod sim;

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

/// The keyed floor: what any keyed limit with a flood-resistant hash must do for a key
/// that already has work in flight, and nothing more. It hashes the key with the standard
/// library's `RandomState` (the default on both sides of the keyed comparison), finds the
/// key's counter in a fixed open-addressed table, takes a unit with one compare-exchange
/// and gives it back with one subtraction. No lock, no permit object, no entry to create
/// or reclaim, keys placed once and never removed: nothing that keeps a key's cap, memory
/// and lifetime correct can be cheaper.
#[derive(Debug)]
pub struct KeyedFloor {
    hasher: admission_core::KeyState,
    /// Each key beside its counter, unpadded, as a real table would lay them out (a
    /// slot padded to a cache line makes the table 8x larger and the floor slower).
    slots: Box<[(u64, AtomicU64)]>,
    capacity: u64,
}

impl KeyedFloor {
    /// A table holding `keys` (`0..keys`), each admitting up to `capacity` units.
    pub fn new(keys: u64, capacity: u64) -> Self {
        let hasher = admission_core::KeyState::new();
        // At most half full, so a probe ends within a slot or two.
        let len = (keys as usize * 2).next_power_of_two();
        let mut slots: Vec<Option<u64>> = vec![None; len];
        for key in 0..keys {
            let mut at = std::hash::BuildHasher::hash_one(&hasher, key) as usize & (len - 1);
            while slots[at].is_some() {
                at = (at + 1) & (len - 1);
            }
            slots[at] = Some(key);
        }
        let slots = slots
            .into_iter()
            // A free slot holds a key no lookup asks for.
            .map(|key| (key.unwrap_or(u64::MAX), AtomicU64::new(0)))
            .collect();
        Self {
            hasher,
            slots,
            capacity,
        }
    }

    /// The counter of `key`, which must be one of the table's keys.
    #[inline]
    fn find(&self, key: u64) -> &AtomicU64 {
        let mask = self.slots.len() - 1;
        let mut at = std::hash::BuildHasher::hash_one(&self.hasher, key) as usize & mask;
        loop {
            let (held, floor) = &self.slots[at];
            if *held == key {
                return floor;
            }
            at = (at + 1) & mask;
        }
    }

    /// Takes one unit for `key` if it fits, and gives it back: one admission's cycle.
    #[inline]
    pub fn cycle(&self, key: u64) -> bool {
        let held = self.find(key);
        let current = held.load(Ordering::Relaxed);
        let admitted = current < self.capacity
            && held
                .compare_exchange(current, current + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        if admitted {
            held.fetch_sub(1, Ordering::Release);
        }
        admitted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The floors refuse as the ledgers do, so that a bench of them measures a limit.
    #[test]
    fn the_floors_admit_up_to_their_capacity_and_release() {
        let floor = Arc::new(Floor::new(3));
        assert!(floor.try_acquire(2) && floor.try_acquire(1));
        assert!(!floor.try_acquire(1), "3 of 3 held");
        floor.release(1);
        assert!(!floor.try_acquire_optimistic(2), "2 of 1 free");
        assert!(
            floor.try_acquire_optimistic(1),
            "the refused add was rolled back"
        );
        floor.release(3);
        let permits: Vec<_> = (0..3).map(|_| ArcPermit::try_acquire(&floor)).collect();
        assert!(permits.iter().all(Option::is_some));
        assert!(ArcPermit::try_acquire(&floor).is_none());
        drop(permits);
        assert_eq!(Arc::strong_count(&floor), 1);
        assert!(floor.try_acquire(3), "every permit gave its unit back");
        let optimistic = Floor::new(3);
        assert!(optimistic.try_acquire_optimistic(1));
        assert!(!optimistic.try_acquire_optimistic(3), "1 + 3 of 3");
    }

    #[test]
    fn the_keyed_floor_finds_every_key_its_own_counter() {
        let table = KeyedFloor::new(1000, 1);
        assert!((0..1000).all(|key| table.cycle(key)));
        let counters: std::collections::HashSet<_> = (0..1000)
            .map(|key| table.find(key) as *const AtomicU64)
            .collect();
        assert_eq!(counters.len(), 1000);
        // A held unit is this key's alone; the cycle gives its own back.
        table.find(7).store(1, Ordering::Relaxed);
        assert!(!table.cycle(7) && table.cycle(8));
        assert_eq!(table.find(8).load(Ordering::Relaxed), 0);
        let none = KeyedFloor::new(10, 0);
        assert!((0..10).all(|key| !none.cycle(key)));
    }
}
