//! Property tests: random sequences of operations on real ledgers, checked step by step
//! against a plain sequential reference model.

use std::collections::HashMap;

use admission_core::{
    ByteLedger, BytePermit, Claim, Classes, CountLedger, CountPermit, Gate, GatePermit,
    KeyedLedger, KeyedPermit, MAX_CLASSES, Priority, Refused,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Acquire,
    /// A count acquisition of the standard class at this index.
    AcquireAs(usize),
    Charge(u64),
    Grow(usize, u64),
    Shrink(usize, u64),
    AcquireKey(u8),
    Admit(Option<u8>, u64),
    /// A gate claim: key, bytes, class (standard index), the key's own cap.
    Claim(Option<u8>, u64, Option<usize>, Option<u64>),
    Drop(usize),
    SetCapacity(usize),
    SetBudget(u64),
    SetCap(usize),
    /// Removes one limit at run time: 0 count, 1 budget, 2 per-key cap.
    SetUnlimited(u8),
    Close,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Acquire),
        4 => (0..3_usize).prop_map(Op::AcquireAs),
        4 => (0..120_u64).prop_map(Op::Charge),
        3 => (any::<usize>(), 0..80_u64).prop_map(|(i, n)| Op::Grow(i, n)),
        2 => (any::<usize>(), 0..80_u64).prop_map(|(i, n)| Op::Shrink(i, n)),
        4 => (0..4_u8).prop_map(Op::AcquireKey),
        4 => (proptest::option::of(0..4_u8), 0..120_u64).prop_map(|(k, n)| Op::Admit(k, n)),
        4 => (
            proptest::option::of(0..4_u8),
            0..120_u64,
            proptest::option::of(0..3_usize),
            proptest::option::of(prop_oneof![0..4_u64, Just(u64::MAX)]),
        )
            .prop_map(|(k, n, class, cap)| Op::Claim(k, n, class, cap)),
        8 => any::<usize>().prop_map(Op::Drop),
        1 => (0..12_usize).prop_map(Op::SetCapacity),
        1 => (0..300_u64).prop_map(Op::SetBudget),
        1 => (0..4_usize).prop_map(Op::SetCap),
        1 => (0..3_u8).prop_map(Op::SetUnlimited),
        1 => Just(Op::Close),
        1 => Just(Op::Reopen),
    ]
}

enum Held {
    // Held only to be dropped: its release is what the model checks.
    Count(#[allow(dead_code)] CountPermit),
    Bytes(BytePermit),
    Key(KeyedPermit<u8>),
    Gate(GatePermit<u8>),
}

/// The reference: what a sequential reading of DESIGN.md says each ledger holds.
#[derive(Default, Debug)]
struct Model {
    capacity: u64,
    budget: u64,
    cap: u64,
    closed: bool,
    count: u64,
    /// Bytes per live byte permit (direct or through the gate), by id.
    charges: HashMap<usize, u64>,
    keys: HashMap<u8, u64>,
    /// The highest count and byte levels reached: what the high-water marks must read.
    count_high: u64,
    bytes_high: u64,
    /// Count refusals of class-aware acquisitions, by class index.
    refused_by_class: [u64; MAX_CLASSES],
}

impl Model {
    fn bytes(&self) -> u64 {
        self.charges.values().sum()
    }
    fn count_ok(&self) -> bool {
        !self.closed && (self.capacity == 0 || self.count < self.capacity)
    }
    /// A class is admitted below its share of the capacity, rounded down.
    fn class_ok(&self, priority: Option<Priority>) -> bool {
        let Some(priority) = priority else {
            return self.count_ok();
        };
        let share = self.capacity * u64::from(priority.share()) / 100;
        !self.closed && (self.capacity == 0 || self.count < share)
    }
    /// Why the count ledger refuses an acquisition of `priority`, when it does: closed, a
    /// class at its share below the capacity, or the capacity.
    fn count_refusal(&self, priority: Option<Priority>) -> Refused {
        if self.closed {
            Refused::Closed
        } else if priority.is_some_and(|p| p.share() < 100) && self.count_ok() {
            Refused::Class
        } else {
            Refused::Count
        }
    }
    fn charge_ok(&self, n: u64) -> bool {
        let charged = self.bytes();
        self.budget == 0 || charged == 0 || charged + n <= self.budget
    }
    fn grow_ok(&self, id: usize, n: u64) -> bool {
        let charged = self.bytes();
        let others = charged - self.charges[&id];
        self.budget == 0 || others == 0 || charged + n <= self.budget
    }
    fn key_ok(&self, key: u8) -> bool {
        self.key_ok_with(key, None)
    }
    /// Against the key's own cap if the claim gives one (0: nothing), else the ledger's.
    fn key_ok_with(&self, key: u8, cap: Option<u64>) -> bool {
        let held = self.keys.get(&key).copied().unwrap_or(0);
        match cap {
            Some(cap) => held < cap,
            None => self.cap == 0 || held < self.cap,
        }
    }
    fn add_key(&mut self, key: u8) {
        *self.keys.entry(key).or_default() += 1;
    }
    fn remove_key(&mut self, key: u8) {
        let n = self.keys.get_mut(&key).unwrap();
        *n -= 1;
        if *n == 0 {
            self.keys.remove(&key);
        }
    }
}

struct World {
    count: CountLedger,
    bytes: ByteLedger,
    keyed: KeyedLedger<u8>,
    gate: Gate<u8>,
    held: Vec<(usize, Held)>,
    next_id: usize,
    model: Model,
}

impl World {
    fn new() -> Self {
        let count = CountLedger::new(3).unwrap();
        let bytes = ByteLedger::new(200).unwrap();
        let keyed = KeyedLedger::new(2).unwrap();
        let gate = Gate::from_ledgers(count.clone(), Some(bytes.clone()), Some(keyed.clone()));
        Self {
            count,
            bytes,
            keyed,
            gate,
            held: Vec::new(),
            next_id: 0,
            model: Model {
                capacity: 3,
                budget: 200,
                cap: 2,
                ..Model::default()
            },
        }
    }

    fn id(&mut self) -> usize {
        self.next_id += 1;
        self.next_id
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Acquire => {
                let expect = self.model.count_ok();
                match self.count.try_acquire() {
                    Ok(p) => {
                        assert!(expect, "admitted above the capacity");
                        self.model.count += 1;
                        let id = self.id();
                        self.held.push((id, Held::Count(p)));
                    }
                    Err(e) => {
                        assert!(!expect, "refused with room");
                        assert_eq!(e, self.model.count_refusal(None));
                    }
                }
            }
            Op::AcquireAs(class) => {
                let (_, priority) = Classes::standard().iter().nth(class).unwrap();
                let expect = self.model.class_ok(Some(priority));
                match self.count.try_acquire_as(priority) {
                    Ok(p) => {
                        assert!(expect, "{priority:?} admitted above its share");
                        self.model.count += 1;
                        let id = self.id();
                        self.held.push((id, Held::Count(p)));
                    }
                    Err(e) => {
                        assert!(!expect, "{priority:?} refused below its share");
                        assert_eq!(e, self.model.count_refusal(Some(priority)));
                        self.model.refused_by_class[class] += 1;
                    }
                }
            }
            Op::Charge(n) => {
                let expect = self.model.charge_ok(n);
                match self.bytes.try_charge(n) {
                    Ok(p) => {
                        assert!(expect, "charge admitted over the budget");
                        let id = self.id();
                        self.model.charges.insert(id, n);
                        self.held.push((id, Held::Bytes(p)));
                    }
                    Err(e) => {
                        assert!(!expect, "charge refused with room");
                        assert_eq!(e, Refused::Bytes);
                    }
                }
            }
            Op::Grow(i, n) | Op::Shrink(i, n) => {
                let grow = matches!(op, Op::Grow(..));
                let Some(slot) = self.pick_bytes(i) else {
                    return;
                };
                let id = self.held[slot].0;
                let expect = self.model.grow_ok(id, n);
                let permit = match &mut self.held[slot].1 {
                    Held::Bytes(p) => p,
                    Held::Gate(g) => g.bytes_mut().unwrap(),
                    _ => unreachable!(),
                };
                if grow {
                    match permit.try_grow(n) {
                        Ok(()) => {
                            assert!(expect, "growth admitted over the budget");
                            *self.model.charges.get_mut(&id).unwrap() += n;
                        }
                        Err(e) => {
                            assert!(!expect, "growth refused with room");
                            assert_eq!(e, Refused::Bytes);
                        }
                    }
                } else {
                    let had = self.model.charges[&id];
                    assert_eq!(permit.shrink(n), n.min(had));
                    *self.model.charges.get_mut(&id).unwrap() -= n.min(had);
                }
                assert_eq!(permit.charged(), self.model.charges[&id]);
            }
            Op::AcquireKey(key) => {
                let expect = self.model.key_ok(key);
                match self.keyed.try_acquire(&key) {
                    Ok(p) => {
                        assert!(expect);
                        self.model.add_key(key);
                        let id = self.id();
                        self.held.push((id, Held::Key(p)));
                    }
                    Err(e) => {
                        assert!(!expect);
                        assert_eq!(e, Refused::Key);
                    }
                }
            }
            Op::Admit(key, n) | Op::Claim(key, n, _, _) => {
                let (class, key_cap) = match op {
                    Op::Claim(_, _, class, cap) => (class, cap),
                    _ => (None, None),
                };
                let priority = class.map(|c| Classes::standard().iter().nth(c).unwrap().1);
                // The reason named: global overload (count, then bytes) before one
                // key's share. A refusal changes nothing but the refusing dimension's
                // refusal counter: no high-water mark sees a refused request.
                let refusal = if !self.model.class_ok(priority) {
                    Some(self.model.count_refusal(priority))
                } else if !self.model.charge_ok(n) {
                    Some(Refused::Bytes)
                } else if key.is_some_and(|k| !self.model.key_ok_with(k, key_cap)) {
                    Some(Refused::Key)
                } else {
                    None
                };
                let before = self.gate.snapshot();
                let result = match op {
                    Op::Claim(..) => {
                        let mut claim = Claim::new().bytes(n);
                        if let Some(k) = &key {
                            claim = claim.key(k);
                        }
                        if let Some(p) = priority {
                            claim = claim.priority(p);
                        }
                        if let Some(cap) = key_cap {
                            claim = claim.key_cap(cap);
                        }
                        self.gate.try_claim(claim)
                    }
                    _ => self.gate.try_admit(key.as_ref(), n),
                };
                if let (Some(c), Some(Refused::Count | Refused::Class | Refused::Closed)) =
                    (class, refusal)
                {
                    self.model.refused_by_class[c] += 1;
                }
                if let Some(refused) = refusal {
                    let after = self.gate.snapshot();
                    let (b, a) = (before.count, after.count);
                    assert_eq!(a.high_water, b.high_water);
                    let by_count =
                        matches!(refused, Refused::Count | Refused::Class | Refused::Closed);
                    assert_eq!(a.refused, b.refused + u64::from(by_count));
                    let (b, a) = (before.bytes.unwrap(), after.bytes.unwrap());
                    assert_eq!(a.high_water, b.high_water);
                    assert_eq!(a.refused, b.refused + u64::from(refused == Refused::Bytes));
                    let (b, a) = (before.keyed.unwrap(), after.keyed.unwrap());
                    assert_eq!(a.keys_high_water, b.keys_high_water);
                    assert_eq!(
                        a.refused_key,
                        b.refused_key + u64::from(refused == Refused::Key)
                    );
                }
                match (result, refusal) {
                    (Ok(p), None) => {
                        self.model.count += 1;
                        if let Some(k) = key {
                            self.model.add_key(k);
                        }
                        let id = self.id();
                        self.model.charges.insert(id, n);
                        self.held.push((id, Held::Gate(p)));
                    }
                    (Err(e), Some(r)) => assert_eq!(e, r),
                    (got, want) => panic!("gate: got {got:?}, model wants {want:?}"),
                }
            }
            Op::Drop(i) => {
                if self.held.is_empty() {
                    return;
                }
                let (id, held) = self.held.swap_remove(i % self.held.len());
                match held {
                    Held::Count(_) => self.model.count -= 1,
                    Held::Bytes(_) => {
                        self.model.charges.remove(&id);
                    }
                    Held::Key(p) => self.model.remove_key(*p.key()),
                    Held::Gate(p) => {
                        self.model.count -= 1;
                        self.model.charges.remove(&id);
                        if let Some(k) = p.keyed() {
                            self.model.remove_key(*k.key());
                        }
                    }
                }
            }
            // A run-time 0 is an error that changes nothing: it never removes a limit.
            Op::SetCapacity(0) => assert!(self.count.set_capacity(0).unwrap_err().is_zero()),
            Op::SetCapacity(c) => {
                self.count.set_capacity(c).unwrap();
                self.model.capacity = c as u64;
            }
            Op::SetBudget(0) => assert!(self.bytes.set_budget(0).unwrap_err().is_zero()),
            Op::SetBudget(b) => {
                self.bytes.set_budget(b).unwrap();
                self.model.budget = b;
            }
            Op::SetCap(0) => assert!(self.keyed.set_cap(0).unwrap_err().is_zero()),
            Op::SetCap(c) => {
                self.keyed.set_cap(c).unwrap();
                self.model.cap = c as u64;
            }
            Op::SetUnlimited(0) => {
                self.count.set_unlimited();
                self.model.capacity = 0;
            }
            Op::SetUnlimited(1) => {
                self.bytes.set_budget_unlimited();
                self.model.budget = 0;
            }
            Op::SetUnlimited(_) => {
                self.keyed.set_cap_unlimited();
                self.model.cap = 0;
            }
            // Closing survives every limit change above until the reopening.
            Op::Close => {
                self.gate.close();
                self.model.closed = true;
            }
            Op::Reopen => {
                self.count.reopen();
                self.model.closed = false;
            }
        }
        self.model.count_high = self.model.count_high.max(self.model.count);
        self.model.bytes_high = self.model.bytes_high.max(self.model.bytes());
        self.check();
    }

    fn pick_bytes(&self, i: usize) -> Option<usize> {
        let slots: Vec<usize> = (0..self.held.len())
            .filter(|&s| matches!(self.held[s].1, Held::Bytes(_) | Held::Gate(_)))
            .collect();
        (!slots.is_empty()).then(|| slots[i % slots.len()])
    }

    fn check(&self) {
        let m = &self.model;
        assert_eq!(self.count.in_flight(), m.count);
        assert_eq!(self.count.is_closed(), m.closed);
        assert_eq!(self.count.capacity(), m.capacity);
        assert_eq!(self.bytes.budget(), m.budget);
        assert_eq!(self.keyed.cap(), m.cap);
        assert_eq!(self.bytes.in_flight(), m.bytes());
        assert_eq!(self.bytes.permits(), m.charges.len() as u64);
        assert_eq!(self.keyed.keys(), m.keys.len() as u64);
        assert_eq!(self.count.refused_by_class(), m.refused_by_class);
        assert_eq!(self.gate.snapshot().refused_by_class, m.refused_by_class);
        for key in 0..4 {
            assert_eq!(
                self.keyed.in_flight(&key),
                m.keys.get(&key).copied().unwrap_or(0)
            );
        }
    }
}

/// Operations per case: fewer under Miri, which interprets every step of every one.
const MAX_OPS: usize = if cfg!(miri) { 24 } else { 80 };

proptest! {
    // Under Miri every step is interpreted: a handful of cases, the same checks.
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 512 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn ledgers_follow_the_reference_model(ops in proptest::collection::vec(op(), 1..MAX_OPS)) {
        let mut world = World::new();
        for op in ops {
            world.step(op);
        }
        // Invariant 2: with every permit gone, every ledger reads zero and no key remains.
        world.held.clear();
        assert_eq!(world.count.in_flight(), 0);
        assert_eq!(world.bytes.in_flight(), 0);
        assert_eq!(world.bytes.permits(), 0);
        assert_eq!(world.keyed.keys(), 0);
        let snap = world.gate.snapshot();
        assert_eq!(snap.count.high_water, world.model.count_high);
        assert_eq!(snap.bytes.unwrap().high_water, world.model.bytes_high);
    }
}
