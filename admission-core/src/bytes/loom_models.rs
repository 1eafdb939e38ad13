//! The byte ledger's loom models (`cargo xtask loom`).

use super::*;

/// Invariant 5: two concurrent oversized charges on an empty ledger, exactly one is
/// admitted.
#[test]
fn concurrent_oversized_charges_on_an_empty_ledger_admit_exactly_one() {
    loom::model(|| {
        let ledger = ByteLedger::new(10).unwrap();
        let other = {
            let ledger = ledger.clone();
            loom::thread::spawn(move || ledger.try_charge(100).ok())
        };
        let mine = ledger.try_charge(100).ok();
        let theirs = other.join().unwrap();
        assert_eq!(mine.is_some() as u8 + theirs.is_some() as u8, 1);
        drop((mine, theirs));
        assert_eq!(ledger.in_flight(), 0);
    });
}

/// Growth racing a charge never takes the total past the budget unless one permit is
/// the only charge; the permits' drops on two threads, after the last handle, free
/// the ledger once.
#[test]
fn growth_racing_a_charge_respects_the_budget_and_frees_once() {
    loom::model(|| {
        let ledger = ByteLedger::new(10).unwrap();
        let mut grower = ledger.try_charge(4).unwrap();
        let other = {
            let ledger = ledger.clone();
            loom::thread::spawn(move || {
                let p = ledger.try_charge(4);
                let total = ledger.in_flight();
                assert!(total <= 10, "in flight {total}");
                p
            })
        };
        let grew = grower.try_grow(4).is_ok();
        assert!(ledger.in_flight() <= 10);
        let charged = other.join().unwrap();
        // 4 + 4 + 4 > 10: at most one of the grow and the charge succeeds.
        assert!(!(grew && charged.is_ok()));
        drop(ledger);
        let t = loom::thread::spawn(move || drop(charged));
        drop(grower);
        t.join().unwrap();
    });
}

/// A growth within the room racing a charge: it takes what room the charge leaves,
/// never more, and in flight never passes the budget.
#[test]
fn bytes_growth_within_the_room_racing_a_charge_stays_within_the_budget() {
    loom::model(|| {
        let ledger = ByteLedger::new(10).unwrap();
        let mut grower = ledger.try_charge(2).unwrap();
        let other = {
            let ledger = ledger.clone();
            loom::thread::spawn(move || ledger.try_charge(5).ok())
        };
        let grew = grower.grow_within(100);
        assert!(ledger.in_flight() <= 10);
        let charged = other.join().unwrap();
        let theirs = charged.as_ref().map_or(0, BytePermit::charged);
        // All the room there was when it grew: 8 before the charge, 3 after it.
        assert!(grew == 8 || grew == 3, "grew {grew}");
        assert_eq!(grower.charged(), 2 + grew);
        assert!(2 + grew + theirs <= 10);
        drop((grower, charged));
        assert_eq!(ledger.in_flight(), 0);
    });
}

/// The budget's exact boundary: 40 held, a charge of 30 racing a growth of 30 fills
/// 100 of 100 exactly (both admitted); a growth of 31 instead would pass it by one
/// byte (exactly one refused). In flight never exceeds the budget.
#[test]
fn bytes_exact_boundary_under_a_concurrent_charge_and_growth() {
    for (grow, both) in [(30, true), (31, false)] {
        loom::model(move || {
            let ledger = ByteLedger::new(100).unwrap();
            let mut grower = ledger.try_charge(40).unwrap();
            let other = {
                let ledger = ledger.clone();
                loom::thread::spawn(move || {
                    let p = ledger.try_charge(30).ok();
                    assert!(ledger.in_flight() <= 100);
                    p
                })
            };
            let grew = grower.try_grow(grow).is_ok();
            assert!(ledger.in_flight() <= 100);
            let charged = other.join().unwrap();
            if both {
                assert!(grew && charged.is_some(), "refused at exactly the budget");
            } else {
                assert_eq!(grew as u8 + charged.is_some() as u8, 1);
            }
            drop((grower, charged));
            assert_eq!(ledger.in_flight(), 0);
        });
    }
}

/// `shrink` racing a charge: the charge is admitted only against what the ledger
/// holds when it looks (60 held and 50 asked of 100: refused before the shrink of 30,
/// admitted after it), and every byte comes back exactly once.
#[test]
fn bytes_shrink_racing_a_charge_gives_back_exactly_what_it_says() {
    loom::model(|| {
        let ledger = ByteLedger::new(100).unwrap();
        let mut held = ledger.try_charge(60).unwrap();
        let shrinker = loom::thread::spawn(move || {
            assert_eq!(held.shrink(30), 30);
            held
        });
        let charged = ledger.try_charge(50).ok();
        assert!(ledger.in_flight() <= 100);
        let held = shrinker.join().unwrap();
        let expected = 30 + charged.as_ref().map_or(0, BytePermit::charged);
        assert_eq!(ledger.in_flight(), expected);
        drop((held, charged));
        assert_eq!((ledger.in_flight(), ledger.permits()), (0, 0));
    });
}

/// `shrink` racing a growth of another permit: the growth sees either level, never a
/// torn one, and both permits release exactly what they hold.
#[test]
fn bytes_shrink_racing_a_growth() {
    loom::model(|| {
        let ledger = ByteLedger::new(100).unwrap();
        let mut shrinking = ledger.try_charge(60).unwrap();
        let mut growing = ledger.try_charge(30).unwrap();
        let shrinker = loom::thread::spawn(move || {
            shrinking.shrink(20);
            shrinking
        });
        let grew = growing.try_grow(20).is_ok();
        let shrinking = shrinker.join().unwrap();
        assert_eq!(ledger.in_flight(), 40 + 30 + if grew { 20 } else { 0 });
        assert!(ledger.in_flight() <= 100);
        drop((shrinking, growing));
        assert_eq!(ledger.in_flight(), 0);
    });
}

/// `set_budget` and `set_max_charge` racing a charge: the charge sees the old or the
/// new limits, and once the setter is done, nothing new gets through above them;
/// what is held stays held.
#[test]
fn bytes_set_budget_and_set_max_charge_racing_a_charge() {
    loom::model(|| {
        let ledger = ByteLedger::new(100).unwrap();
        let held = ledger.try_charge(10).unwrap();
        let setter = {
            let ledger = ledger.clone();
            loom::thread::spawn(move || {
                ledger.set_budget(50).unwrap();
                ledger.set_max_charge(20).unwrap();
            })
        };
        let racing = ledger.try_charge(45);
        setter.join().unwrap();
        // Old limits: admitted (55 of 100). New budget: refused (55 of 50). New
        // maximum: too large (45 above 20).
        match &racing {
            Ok(p) => assert_eq!(p.charged(), 45),
            Err(refused) => assert!(matches!(refused, Refused::Bytes | Refused::TooLarge)),
        }
        assert_eq!(ledger.try_charge(21).unwrap_err(), Refused::TooLarge);
        if racing.is_ok() {
            assert_eq!(
                ledger.try_charge(1).unwrap_err(),
                Refused::Bytes,
                "55 of 50"
            );
        } else {
            assert_eq!(ledger.try_charge(20).map(|p| p.charged()), Ok(20));
            assert_eq!(ledger.try_charge(31).unwrap_err(), Refused::TooLarge);
        }
        assert_eq!(held.charged(), 10, "a lowered limit revokes nothing");
        drop((held, racing));
        assert_eq!(ledger.in_flight(), 0);
    });
}
