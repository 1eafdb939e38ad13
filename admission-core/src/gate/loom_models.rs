//! The gate's loom models (`cargo xtask loom`).

use super::*;

/// A hasher with fixed keys. loom replays executions and needs each to take the same
/// path, so a key must land in the same shard every time (`RandomState` would not).
fn fixed() -> std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher> {
    Default::default()
}

/// No collateral refusals: key 1 is at its cap and a second request for it is
/// refused, while key 2 is admitted on the one count slot left. The refused request
/// never holds that slot, so key 2 is admitted in every interleaving (with the
/// count taken before the key, key 2 is refused in some).
#[test]
fn gate_key_refusal_never_takes_the_count_slot_another_key_needs() {
    loom::model(|| {
        let gate = Gate::<u8>::builder()
            .hasher(fixed())
            .count(2)
            .per_key(1)
            .build()
            .unwrap();
        let held = gate.try_admit(Some(&1), 0).unwrap();
        let other = {
            let gate = gate.clone();
            loom::thread::spawn(move || gate.try_admit(Some(&1), 0).unwrap_err())
        };
        let mine = gate.try_admit(Some(&2), 0);
        // Key if it went first, Count if key 2 already holds the last slot.
        let theirs = other.join().unwrap();
        assert!(matches!(theirs, Refused::Key | Refused::Count));
        assert!(mine.is_ok(), "key 2 refused {:?}", mine.unwrap_err());
        assert_eq!(gate.count().snapshot().high_water, 2);
        drop((held, mine));
    });
}

/// Two requests race for a byte budget that fits one: both may pass the checks, so
/// a loser with a key takes its key and a count slot before its charge fails. It
/// gives both back (the gate's rollback), and the keys high-water mark never saw it:
/// marks record only complete admissions.
#[test]
fn gate_race_at_the_byte_budget_leaves_no_trace_of_the_loser_in_high_water_marks() {
    loom::model(|| {
        let gate = Gate::<u8>::builder()
            .hasher(fixed())
            .count(3)
            .bytes(100)
            .per_key(1)
            .build()
            .unwrap();
        let _first = gate.try_admit(None, 1).unwrap();
        let keyed = {
            let gate = gate.clone();
            loom::thread::spawn(move || gate.try_admit(Some(&1), 60).ok())
        };
        let unkeyed = gate.try_admit(None, 60).ok();
        let keyed = keyed.join().unwrap();
        assert_eq!(unkeyed.is_some() as u8 + keyed.is_some() as u8, 1);
        let snap = gate.snapshot();
        let keys_high_water = snap.keyed.unwrap().keys_high_water;
        assert_eq!(
            keys_high_water,
            keyed.is_some() as u64,
            "the loser's key counted"
        );
        assert_eq!(snap.bytes.unwrap().high_water, 61);
        assert_eq!(snap.bytes.unwrap().refused, 1);
        // Rolled back: the count and the key hold only the admitted requests.
        assert_eq!(snap.count.in_flight, 2);
        assert_eq!(snap.keyed.unwrap().keys, keyed.is_some() as u64);
    });
}

/// Invariant 3 under concurrency: two requests for one key (cap 1) through a gate
/// with room for both on count; the refused one gives its count permit back, so the
/// count ledger ends equal to the admissions still held.
#[test]
fn gate_refused_by_its_second_dimension_leaves_the_first_unchanged() {
    loom::model(|| {
        let gate = Gate::<u8>::builder()
            .hasher(fixed())
            .count(2)
            .per_key(1)
            .build()
            .unwrap();
        let other = {
            let gate = gate.clone();
            loom::thread::spawn(move || gate.try_admit(Some(&1), 0).ok())
        };
        let mine = gate.try_admit(Some(&1), 0).ok();
        let theirs = other.join().unwrap();
        let admitted = mine.is_some() as u64 + theirs.is_some() as u64;
        assert_eq!(admitted, 1);
        assert_eq!(gate.count().in_flight(), admitted);
        drop((mine, theirs));
        assert_eq!(gate.count().in_flight(), 0);
        assert_eq!(gate.keyed().unwrap().keys(), 0);
    });
}

/// Fair shares' marks: two keys that fall in one word both set their bits and count two
/// keys; one key marked by two threads at once counts one (each bit counted by the one
/// `fetch_or` that set it).
#[test]
fn fair_share_marks_count_each_key_once_whatever_the_interleaving() {
    loom::model(|| {
        let fair = Arc::new(Fair::new(100));
        // Hashes whose mix lands on bits 1 and 2 of the first word, and 1 again.
        let (a, b) = (hash_at(1), hash_at(2));
        let other = {
            let fair = fair.clone();
            loom::thread::spawn(move || {
                fair.mark(a);
                fair.mark(b);
            })
        };
        fair.mark(b);
        fair.mark(a);
        other.join().unwrap();
        assert_eq!(fair.active(), 2);
    });
}

/// The hash that `Fair::mark` places at `bit`.
fn hash_at(bit: u64) -> u64 {
    const MIX: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut inverse = MIX;
    for _ in 0..6 {
        inverse = inverse.wrapping_mul(2_u64.wrapping_sub(MIX.wrapping_mul(inverse)));
    }
    (bit << (64 - fair::BITS.trailing_zeros())).wrapping_mul(inverse)
}
