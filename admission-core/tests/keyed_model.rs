//! Property test of the keyed ledger with its keys crowded together: random sequences of
//! acquisitions (with the ledger's cap or one of their own), releases in any order and
//! run-time limit changes, checked step by step against a map of counts.
//!
//! With `RandomState` a handful of keys never meet: each has a shard and a window of its
//! own. Here the hashers put every key in one shard, so keys share windows, fill them and
//! spill into the shard's overflow table, slots are emptied and refilled by other keys
//! while keys sit in the table, and (with `COLLIDE`) distinct keys have equal hashes, so
//! that a lock-free acquire counts on another key's slot and gives the count back.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use admission_core::{KeyedLedger, KeyedPermit, Refused};
use proptest::prelude::*;

/// Keys in play: more than a window's slots and more than a shard's, so every place a
/// key can live is used.
const KEYS: u8 = 40;

/// Every key's hash in shard 0, its window starting at one of four neighbouring slots
/// (overlapping windows), its hash otherwise its value folded to `distinct` values:
/// `CROWD` keeps every key's own, `COLLIDE` leaves five, so equal hashes abound.
#[derive(Clone)]
struct Fold {
    distinct: u64,
}

const CROWD: Fold = Fold { distinct: u64::MAX };
const COLLIDE: Fold = Fold { distinct: 5 };

struct Folded {
    value: u64,
    distinct: u64,
}

impl Hasher for Folded {
    fn finish(&self) -> u64 {
        // Bits 32 to 37 choose the shard (0 here), bits 16 to 20 the window's first slot;
        // the key's own value above and below them.
        let v = self.value % self.distinct;
        (v & 0xffff) | (v % 4) << 16 | (v & 0xff_ffff) << 40
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.value = self.value.wrapping_mul(31).wrapping_add(u64::from(b));
        }
    }
}

impl BuildHasher for Fold {
    type Hasher = Folded;
    fn build_hasher(&self) -> Folded {
        Folded {
            value: 0,
            distinct: self.distinct,
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// With the ledger's cap.
    Acquire(u8),
    /// With a cap of the caller's (`try_acquire_with_cap`).
    AcquireWithCap(u8, u64),
    /// Drops the permit at this index (modulo those held).
    Drop(usize),
    /// 0: unlimited.
    SetCap(usize),
    /// 0: unlimited.
    SetMaxKeys(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..KEYS).prop_map(Op::Acquire),
        2 => (0..KEYS, prop_oneof![0..4_u64, Just(u64::MAX)])
            .prop_map(|(k, cap)| Op::AcquireWithCap(k, cap)),
        8 => any::<usize>().prop_map(Op::Drop),
        1 => (0..4_usize).prop_map(Op::SetCap),
        1 => prop_oneof![Just(0_usize), 1..30_usize].prop_map(Op::SetMaxKeys),
    ]
}

/// The reference: each key's count, the cap (0: none) and the bound on keys (0: none).
#[derive(Default)]
struct Model {
    counts: HashMap<u8, u64>,
    cap: u64,
    max_keys: u64,
}

impl Model {
    fn keys(&self) -> u64 {
        self.counts.values().filter(|&&n| n > 0).count() as u64
    }

    /// What an acquisition of `key` under `cap` (`None`: no cap) should get.
    fn admit(&mut self, key: u8, cap: Option<u64>) -> Result<(), Refused> {
        let held = self.counts.get(&key).copied().unwrap_or(0);
        if cap.is_some_and(|cap| held >= cap) {
            return Err(Refused::Key);
        }
        if held == 0 && self.max_keys != 0 && self.keys() >= self.max_keys {
            return Err(Refused::KeyTable);
        }
        *self.counts.entry(key).or_default() += 1;
        Ok(())
    }
}

fn run<S: BuildHasher>(hasher: S, ops: Vec<Op>) {
    let ledger = KeyedLedger::with_hasher(2, hasher).unwrap();
    let mut model = Model {
        cap: 2,
        ..Model::default()
    };
    let mut held: Vec<KeyedPermit<u8, S>> = Vec::new();
    for op in ops {
        match op {
            Op::Acquire(key) => {
                let want = model.admit(key, (model.cap != 0).then_some(model.cap));
                let got = ledger.try_acquire(&key);
                assert_eq!(got.as_ref().map(|_| ()), want.as_ref().copied(), "{key}");
                held.extend(got);
            }
            Op::AcquireWithCap(key, cap) => {
                let want = model.admit(key, (cap != u64::MAX).then_some(cap));
                let got = ledger.try_acquire_with_cap(&key, cap);
                assert_eq!(got.as_ref().map(|_| ()), want.as_ref().copied(), "{key}");
                held.extend(got);
            }
            Op::Drop(i) if !held.is_empty() => {
                let permit = held.swap_remove(i % held.len());
                let key = *permit.key();
                drop(permit);
                *model.counts.get_mut(&key).unwrap() -= 1;
            }
            Op::Drop(_) => {}
            Op::SetCap(0) => {
                ledger.set_cap_unlimited();
                model.cap = 0;
            }
            Op::SetCap(cap) => {
                ledger.set_cap(cap).unwrap();
                model.cap = cap as u64;
            }
            Op::SetMaxKeys(0) => {
                ledger.set_max_keys_unlimited();
                model.max_keys = 0;
            }
            Op::SetMaxKeys(n) => {
                ledger.set_max_keys(n).unwrap();
                model.max_keys = n as u64;
            }
        }
        for key in 0..KEYS {
            let want = model.counts.get(&key).copied().unwrap_or(0);
            assert_eq!(ledger.in_flight(&key), want, "key {key}");
        }
        assert_eq!(ledger.keys(), model.keys());
        assert_eq!(
            (ledger.cap(), ledger.max_keys()),
            (model.cap, model.max_keys)
        );
        for permit in &held {
            assert!(model.counts[permit.key()] > 0);
        }
    }
    // Half the permits go with the handle alive, every key with its last permit; the
    // other half outlive the handle (and the last of them frees the ledger).
    let rest = held.split_off(held.len() / 2);
    for permit in held {
        *model.counts.get_mut(permit.key()).unwrap() -= 1;
    }
    assert_eq!(ledger.keys(), model.keys());
    drop(ledger);
    drop(rest);
}

/// Operations per case: fewer under Miri, which interprets every step of every one.
const MAX_OPS: usize = if cfg!(miri) { 24 } else { 200 };

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 256 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn crowded_keys_follow_the_reference_model(ops in proptest::collection::vec(op(), 1..MAX_OPS)) {
        run(CROWD, ops);
    }

    #[test]
    fn keys_with_equal_hashes_follow_the_reference_model(
        ops in proptest::collection::vec(op(), 1..MAX_OPS),
    ) {
        run(COLLIDE, ops);
    }
}
