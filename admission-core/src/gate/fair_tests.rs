//! Fair shares: the rule against a model, the keys it counts as active, and what it
//! costs a lone key (nothing).

use std::hash::{BuildHasher, Hasher};

use proptest::prelude::*;

use super::fair::{BITS, PERIOD};
use crate::{Claim, Gate, GatePermit, Key, Priority, Refused};

/// Places key `k` at bit `k + 1` of the fair shares' bitmap, so keys never share one:
/// the hash whose mix (`fair::mark`'s multiply) has `k + 1` in its top 13 bits.
#[derive(Clone, Copy, Default, Debug)]
struct Apart;

struct ApartHasher(u64);

/// The multiply's inverse modulo 2^64 (Newton's iteration doubles the bits right).
fn unmixed(mixed: u64) -> u64 {
    const MIX: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut inverse = MIX;
    for _ in 0..6 {
        inverse = inverse.wrapping_mul(2_u64.wrapping_sub(MIX.wrapping_mul(inverse)));
    }
    mixed.wrapping_mul(inverse)
}

impl Hasher for ApartHasher {
    fn finish(&self) -> u64 {
        unmixed((self.0 + 1) << 51)
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("keys are u64s")
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl BuildHasher for Apart {
    type Hasher = ApartHasher;
    fn build_hasher(&self) -> ApartHasher {
        ApartHasher(0)
    }
}

fn fair(count: usize, headroom_per_mille: u32) -> Gate<u64, Apart> {
    Gate::<u64>::builder()
        .hasher(Apart)
        .count(count)
        .fair_share(headroom_per_mille)
        .build()
        .unwrap()
}

fn claim(gate: &Gate<u64, Apart>, key: u64) -> Result<GatePermit<u64, Apart>, Refused> {
    gate.try_claim(Claim::new().key(&key))
}

#[test]
fn a_lone_key_may_take_the_whole_count() {
    let gate = fair(8, 500);
    let held: Vec<_> = (0..8).map(|_| claim(&gate, 1).unwrap()).collect();
    assert_eq!(
        claim(&gate, 1).unwrap_err(),
        Refused::Count,
        "full: the count refuses"
    );
    assert_eq!(gate.active_keys(), Some(1));
    drop(held);
}

#[test]
fn near_full_a_key_at_its_share_is_refused_and_one_below_it_admitted() {
    // 10 slots, 2 kept (200 per mille): a key at its share is refused once 8 are held.
    let gate = fair(10, 200);
    drop(claim(&gate, 2).unwrap()); // the light key has sent a request: it has work
    let heavy: Vec<_> = (0..8).map(|_| claim(&gate, 1).unwrap()).collect();
    assert_eq!(
        claim(&gate, 1).unwrap_err(),
        Refused::Key,
        "over its share of 5"
    );
    // The light key, between requests and holding none, takes the kept slots.
    let light: Vec<_> = (0..2).map(|_| claim(&gate, 2).unwrap()).collect();
    assert_eq!(
        claim(&gate, 2).unwrap_err(),
        Refused::Count,
        "and no more than the count"
    );
    assert_eq!(gate.snapshot().count.in_flight, 10);
    drop((heavy, light));
}

#[test]
fn a_key_below_its_share_turned_away_widens_the_headroom_for_a_generation_or_two() {
    // 10 slots, 1 kept at least (100 per mille).
    let gate = fair(10, 100);
    drop(claim(&gate, 2).unwrap());
    let mut heavy: Vec<_> = (0..9).map(|_| claim(&gate, 1).unwrap()).collect();
    assert_eq!(claim(&gate, 1).unwrap_err(), Refused::Key, "one slot kept");
    let light = claim(&gate, 2).unwrap();
    // The light key needed a second slot: one more is kept from now.
    assert_eq!(claim(&gate, 2).unwrap_err(), Refused::Count);
    drop((light, heavy.pop()));
    assert_eq!(claim(&gate, 1).unwrap_err(), Refused::Key, "two slots kept");
    // The generation of the shortfall ends: it had one, so the headroom stays wide.
    for _ in 0..PERIOD {
        drop(claim(&gate, 2).unwrap());
    }
    assert_eq!(claim(&gate, 1).unwrap_err(), Refused::Key, "still two kept");
    // A generation with none: back to one.
    for _ in 0..PERIOD {
        drop(claim(&gate, 2).unwrap());
    }
    heavy.push(claim(&gate, 1).expect("one slot kept again"));
    assert_eq!(claim(&gate, 1).unwrap_err(), Refused::Key);
}

#[test]
fn the_headroom_widens_to_half_the_count_and_no_further_and_narrows_as_far() {
    // 10 slots, at least 1 kept, at most 5.
    let gate = fair(10, 100);
    drop(claim(&gate, 2).unwrap());
    let heavy: Vec<_> = (0..5).map(|_| claim(&gate, 1).unwrap()).collect();
    let light: Vec<_> = (0..5).map(|_| claim(&gate, 2).unwrap()).collect();
    // A third key, holding none (below its share of 4), turned away by the full count
    // eleven times: the headroom grows by one each time up to half the count.
    assert_eq!(claim(&gate, 3).unwrap_err(), Refused::Count);
    for _ in 0..10 {
        assert_eq!(claim(&gate, 3).unwrap_err(), Refused::Count);
    }
    drop((heavy, light));
    // Kept: five. A key at its share (4 of 10 over three keys) is refused at five held.
    let kept = |gate: &Gate<u64, Apart>| {
        let held: Vec<_> = (0..10).map_while(|_| claim(gate, 1).ok()).collect();
        10 - held.len() as u64
    };
    assert_eq!(
        kept(&gate),
        10 - 5,
        "heavy held 5 of 10: five kept (its share is 4)"
    );
    // The generation of the shortfalls ends wide; four without one bring it back to one
    // slot (it had grown by four, whatever the number of shortfalls).
    for _ in 0..5 * PERIOD {
        drop(claim(&gate, 2).unwrap());
    }
    assert_eq!(kept(&gate), 10 - 9, "one kept");
}

#[test]
fn the_share_is_of_the_class_share_of_the_count() {
    let gate = fair(10, 100);
    drop(claim(&gate, 2).unwrap());
    let sheddable = Priority::SHEDDABLE; // half of the count
    let claim_as = |key: u64| gate.try_claim(Claim::new().key(&key).priority(sheddable));
    let threshold = sheddable.of(10);
    // Of the class's threshold, one slot is kept: held to its share (half) from then.
    let heavy: Vec<_> = (0..threshold - 1).map(|_| claim_as(1).unwrap()).collect();
    assert_eq!(claim_as(1).unwrap_err(), Refused::Key);
    assert!(claim_as(2).is_ok(), "the other key is below its share");
    drop(heavy);
}

#[test]
fn the_wait_is_held_to_the_shares_too() {
    let gate = fair(4, 250);
    gate.count().set_max_waiting(4);
    drop(claim(&gate, 2).unwrap());
    let heavy: Vec<_> = (0..3).map(|_| claim(&gate, 1).unwrap()).collect();
    let waited = std::pin::pin!(gate.claim(Claim::new().key(&1)));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(matches!(
        std::future::Future::poll(waited, &mut cx),
        std::task::Poll::Ready(Err(Refused::Key))
    ));
    drop(heavy);
}

#[test]
fn keys_are_active_for_one_to_two_generations_of_requests() {
    let gate = fair(1 << 20, 0);
    for key in 0..100 {
        drop(claim(&gate, key).unwrap());
    }
    assert_eq!(gate.active_keys(), Some(100));
    // The first generation ends: its keys are now the last generation's.
    for _ in 0..PERIOD - 100 {
        drop(claim(&gate, 0).unwrap());
    }
    assert_eq!(gate.active_keys(), Some(100), "the last generation's keys");
    // A generation of one key: the others are forgotten.
    for _ in 0..PERIOD {
        drop(claim(&gate, 0).unwrap());
    }
    assert_eq!(gate.active_keys(), Some(1), "forgotten two generations on");
}

#[test]
fn each_generation_s_bitmap_is_cleared_before_it_is_used_again() {
    let gate = fair(1 << 20, 0);
    let generation = |first_key: u64| {
        for n in 0..PERIOD {
            drop(claim(&gate, first_key + n % 50).unwrap());
        }
    };
    generation(0); // keys 0..50
    assert_eq!(gate.active_keys(), Some(50));
    generation(0); // the same 50
    assert_eq!(gate.active_keys(), Some(50));
    // Three generations of other keys: the first bitmap is used again, cleared.
    for first in [100, 200, 300] {
        generation(first);
        assert_eq!(
            gate.active_keys(),
            Some(50),
            "only the last generation's 50"
        );
    }
    // A generation of five keys: the fifty before it are forgotten.
    for n in 0..PERIOD {
        drop(claim(&gate, 400 + n % 5).unwrap());
    }
    assert_eq!(gate.active_keys(), Some(5), "the last generation's five");
}

#[test]
fn every_bit_set_reads_as_many_keys_not_as_infinitely_many() {
    let gate = fair(1 << 20, 0);
    // Keys at every bit of the bitmap (`Apart` places key k at bit k + 1, modulo).
    for key in 0..BITS + 100 {
        drop(claim(&gate, key).unwrap());
    }
    let active = gate.active_keys().unwrap();
    assert!((BITS..1_000_000).contains(&active), "{active}");
}

#[test]
fn the_gate_shows_its_fair_shares() {
    let shown = format!("{:?}", fair(10, 125));
    assert!(shown.contains("headroom: 125"), "{shown}");
}

#[test]
fn keys_that_share_a_bit_are_counted_near_their_number() {
    // The default key and hasher: keys fall on bits at random, some together.
    let gate = Gate::<Key>::builder()
        .count(1 << 20)
        .fair_share(0)
        .build()
        .unwrap();
    for tenant in 0..2_000 {
        let key = Key::from(format!("tenant-{tenant}").as_str());
        drop(gate.try_claim(Claim::new().key(&key)).unwrap());
    }
    let active = gate.active_keys().unwrap();
    assert!((1_900..=2_100).contains(&active), "{active} for 2,000 keys");
}

#[test]
fn a_headroom_above_a_thousand_per_mille_is_an_error() {
    assert!(
        Gate::<u64>::builder()
            .count(4)
            .fair_share(1001)
            .build()
            .is_err()
    );
    assert!(
        Gate::<u64>::builder()
            .count(4)
            .fair_share(1000)
            .build()
            .is_ok()
    );
}

#[derive(Debug, Clone)]
enum Op {
    Claim(u64),
    /// Releases the held permit at this index (modulo the number held).
    Release(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..4_u64).prop_map(Op::Claim),
        2 => any::<usize>().prop_map(Op::Release),
    ]
}

proptest! {
    /// Every claim answered as the rule says, computed plainly from what is held: the
    /// count first; then, within the headroom of full, a key at its share (the count over
    /// the keys seen, rounded up) refused; the headroom one slot wider for each key below
    /// its share a full count refused, up to half the count.
    #[test]
    fn claims_are_answered_as_the_model_says(
        count in 1..12_usize,
        headroom in 0..=1000_u32,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let gate = fair(count, headroom);
        let capacity = count as u64;
        let least = (capacity * u64::from(headroom)).div_ceil(1000).max(1);
        // Slots a full count's refusals of keys below their share added.
        let mut extra = 0;
        let mut held: Vec<(u64, GatePermit<u64, Apart>)> = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for op in ops {
            match op {
                Op::Claim(key) => {
                    seen.insert(key);
                    let total = held.len() as u64;
                    let mine = held.iter().filter(|(k, _)| *k == key).count() as u64;
                    let share = capacity.div_ceil(seen.len() as u64);
                    let kept = (least + extra).min((capacity / 2).max(least));
                    let expected = if total >= capacity {
                        if mine < share && kept < capacity / 2 {
                            extra += 1;
                        }
                        Err(Refused::Count)
                    } else if total + kept >= capacity && mine >= share {
                        Err(Refused::Key)
                    } else {
                        Ok(())
                    };
                    let got = claim(&gate, key);
                    prop_assert_eq!(got.as_ref().map(|_| ()).map_err(|e| *e), expected);
                    if let Ok(permit) = got {
                        held.push((key, permit));
                    }
                }
                Op::Release(at) => {
                    if !held.is_empty() {
                        let at = at % held.len();
                        drop(held.swap_remove(at));
                    }
                }
            }
            prop_assert_eq!(gate.count().in_flight(), held.len() as u64);
        }
    }
}
