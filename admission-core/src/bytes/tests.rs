//! The byte ledger's unit tests.

use super::*;

#[test]
fn growth_within_the_room_takes_what_there_is_and_counts_no_refusal() {
    let ledger = ByteLedger::with_max_charge(100, 60).unwrap();
    let other = ledger.try_charge(50).unwrap();
    let mut permit = ledger.try_charge(10).unwrap();
    assert_eq!(permit.grow_within(0), 0);
    assert_eq!(permit.grow_within(100), 40, "the room left");
    assert_eq!(permit.grow_within(1), 0, "none left");
    assert_eq!((permit.charged(), ledger.in_flight()), (50, 100));
    assert_eq!(ledger.snapshot().refused, 0);
    assert_eq!(ledger.snapshot().high_water, 100);
    drop(other);
    assert_eq!(
        permit.grow_within(100),
        10,
        "never past the maximum single charge"
    );
    assert_eq!(permit.charged(), 60);
}

#[test]
fn growth_within_the_room_takes_no_lone_request_exemption() {
    let ledger = ByteLedger::new(100).unwrap();
    let mut permit = ledger.try_charge(10).unwrap();
    assert_eq!(
        permit.grow_within(500),
        90,
        "ahead of need: within the budget"
    );
    permit.try_grow(50).unwrap(); // what is needed now: the only charge may pass it
    assert_eq!(permit.grow_within(1), 0);
    assert_eq!(ledger.in_flight(), 150);
    drop(permit);
    assert_eq!(ledger.in_flight(), 0);
}

/// The last permit and the last handle dropped on two threads at once, with no join
/// between them: whichever drop is last frees the ledger, and every use by the other
/// thread must happen before that free. Under Miri, weakening the release decrement
/// or the acquire load on the free path makes this a reported data race.
#[test]
fn the_last_permit_and_the_last_handle_dropped_on_two_threads_free_after_every_use() {
    for _ in 0..if cfg!(miri) { 8 } else { 1_000 } {
        let ledger = ByteLedger::new(100).unwrap();
        let permit = ledger.try_charge(10).unwrap();
        let t = std::thread::spawn(move || drop(permit));
        drop(ledger);
        t.join().unwrap();
    }
}

#[test]
fn bounds() {
    fn is_send_sync_unpin<T: Send + Sync + Unpin + 'static>() {}
    is_send_sync_unpin::<ByteLedger>();
    is_send_sync_unpin::<BytePermit>();
}

#[test]
fn charge_refuse_release_admit_again_and_back_to_zero() {
    let ledger = ByteLedger::new(100).unwrap();
    let a = ledger.try_charge(60).unwrap();
    assert_eq!(ledger.try_charge(41).unwrap_err(), Refused::Bytes);
    let b = ledger.try_charge(40).unwrap();
    assert_eq!(ledger.in_flight(), 100);
    drop(a);
    let c = ledger.try_charge(60).unwrap();
    drop((b, c));
    assert_eq!((ledger.in_flight(), ledger.permits()), (0, 0));
    assert_eq!(ledger.snapshot().refused, 1);
}

#[test]
fn a_lone_oversized_charge_is_admitted_and_the_next_refused() {
    let ledger = ByteLedger::new(100).unwrap();
    let big = ledger.try_charge(1_000).unwrap();
    assert_eq!(ledger.try_charge(1).unwrap_err(), Refused::Bytes);
    drop(big);
    assert_eq!(ledger.in_flight(), 0);
    let _small = ledger.try_charge(1).unwrap();
    assert_eq!(ledger.try_charge(1_000).unwrap_err(), Refused::Bytes);
}

#[test]
fn zero_byte_permits_do_not_end_the_lone_exemption() {
    let ledger = ByteLedger::new(100).unwrap();
    let _empty = ledger.try_charge(0).unwrap();
    let _big = ledger.try_charge(1_000).unwrap();
}

#[test]
fn growth_is_checked_and_the_only_charge_may_grow_past_the_budget() {
    let ledger = ByteLedger::new(100).unwrap();
    let mut other = ledger.try_charge(0).unwrap();
    let mut only = ledger.try_charge(10).unwrap();
    only.try_grow(500).unwrap();
    assert_eq!((only.charged(), ledger.in_flight()), (510, 510));
    assert_eq!(other.try_grow(1).unwrap_err(), Refused::Bytes);
    assert_eq!(other.charged(), 0);
    assert_eq!(
        ledger.try_charge(0).unwrap_err(),
        Refused::Bytes,
        "over the budget, nothing new is admitted"
    );
    drop(only);
    other.try_grow(100).unwrap();
    assert_eq!(ledger.in_flight(), 100);
}

#[test]
fn a_permit_that_is_not_the_only_charge_may_not_grow_past_the_budget() {
    let ledger = ByteLedger::new(100).unwrap();
    let _a = ledger.try_charge(10).unwrap();
    let mut b = ledger.try_charge(10).unwrap();
    assert_eq!(b.try_grow(81).unwrap_err(), Refused::Bytes);
    b.try_grow(80).unwrap();
    assert_eq!(ledger.in_flight(), 100);
}

#[test]
fn growth_within_the_budget_beside_other_charges() {
    let ledger = ByteLedger::new(100).unwrap();
    let _a = ledger.try_charge(30).unwrap();
    let mut b = ledger.try_charge(30).unwrap();
    b.try_grow(40).unwrap();
    assert_eq!(b.try_grow(1).unwrap_err(), Refused::Bytes);
    assert_eq!(ledger.in_flight(), 100);
}

#[test]
fn shrink_gives_back_part_of_the_charge_early() {
    let ledger = ByteLedger::new(100).unwrap();
    let mut a = ledger.try_charge(100).unwrap();
    assert_eq!(a.shrink(30), 30);
    assert_eq!(ledger.in_flight(), 70);
    let b = ledger.try_charge(30).unwrap();
    assert_eq!(a.shrink(0), 0);
    assert_eq!(a.shrink(u64::MAX), 70);
    assert_eq!(a.charged(), 0);
    drop((a, b));
    assert_eq!((ledger.in_flight(), ledger.permits()), (0, 0));
}

#[test]
fn max_charge_refuses_too_large_even_when_idle_and_on_growth() {
    let ledger = ByteLedger::new(100).unwrap();
    ledger.set_max_charge(50).unwrap();
    assert_eq!(ledger.try_charge(51).unwrap_err(), Refused::TooLarge);
    let mut p = ledger.try_charge(50).unwrap();
    assert_eq!(p.try_grow(1).unwrap_err(), Refused::TooLarge);
    assert_eq!(p.try_grow(u64::MAX).unwrap_err(), Refused::TooLarge);
    assert_eq!(p.charged(), 50);
    assert_eq!(ledger.snapshot().refused, 3);
    ledger.set_max_charge_unlimited();
    p.try_grow(1).unwrap();
}

#[test]
fn values_the_ledger_cannot_represent_are_errors_not_panics() {
    for v in [u64::MAX, u64::MAX - 1, ByteLedger::MAX_BUDGET + 1] {
        assert_eq!(ByteLedger::new(v).unwrap_err().requested(), v);
    }
    let ledger = ByteLedger::new(0).unwrap();
    assert!(ledger.set_budget(u64::MAX).is_err());
    assert!(ledger.set_max_charge(u64::MAX).is_err());
    assert_eq!(ledger.try_charge(u64::MAX).unwrap_err(), Refused::TooLarge);
    let mut p = ledger.try_charge(ByteLedger::MAX_BUDGET).unwrap();
    assert_eq!(p.try_grow(1).unwrap_err(), Refused::TooLarge);
    assert_eq!(
        ledger.try_charge(1).unwrap_err(),
        Refused::Bytes,
        "word is full"
    );
    drop(p);
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn the_maximum_charge_reads_back_as_set_and_zero_when_unset() {
    let ledger = ByteLedger::new(100).unwrap();
    assert_eq!(ledger.max_charge(), 0);
    ledger.set_max_charge(40).unwrap();
    assert_eq!(ledger.max_charge(), 40);
    ledger.set_max_charge_unlimited();
    assert_eq!(ledger.max_charge(), 0);
}

#[test]
#[cfg_attr(miri, ignore = "8 million permits: too many to interpret")]
fn the_permit_count_is_bounded_and_refuses_rather_than_overflowing() {
    let ledger = ByteLedger::new(0).unwrap();
    assert_eq!(ByteLedger::MAX_PERMITS, (1 << 23) - 1);
    let mut held: Vec<_> = (0..ByteLedger::MAX_PERMITS)
        .map(|_| ledger.try_charge(0).unwrap())
        .collect();
    assert_eq!(ledger.permits(), ByteLedger::MAX_PERMITS);
    assert_eq!(ledger.try_charge(0).unwrap_err(), Refused::Bytes);
    assert_eq!(ledger.try_charge(1).unwrap_err(), Refused::Bytes);
    held.pop();
    let last = ledger.try_charge(5).unwrap();
    assert_eq!(
        (ledger.permits(), ledger.in_flight()),
        (ByteLedger::MAX_PERMITS, 5)
    );
    drop((held, last));
    assert_eq!((ledger.permits(), ledger.in_flight()), (0, 0));
}

#[test]
fn growth_is_checked_at_its_exact_boundaries() {
    let ledger = ByteLedger::new(0).unwrap();
    ledger.set_max_charge(50).unwrap();
    let mut p = ledger.try_charge(40).unwrap();
    p.try_grow(10).unwrap();
    assert_eq!(p.charged(), 50, "growing to exactly the maximum is allowed");
    drop(p);

    ledger.set_max_charge_unlimited();
    let mut alone = ledger.try_charge(0).unwrap();
    alone.try_grow(ByteLedger::MAX_BUDGET).unwrap();
    drop(alone);

    let _other = ledger.try_charge(10).unwrap();
    let mut p = ledger.try_charge(0).unwrap();
    assert_eq!(
        p.try_grow(ByteLedger::MAX_BUDGET - 9).unwrap_err(),
        Refused::Bytes,
        "the word would overflow"
    );
    p.try_grow(ByteLedger::MAX_BUDGET - 10).unwrap();
    assert_eq!(ledger.in_flight(), ByteLedger::MAX_BUDGET);
}

#[test]
fn debug_output_names_the_state() {
    let ledger = ByteLedger::new(9).unwrap();
    let p = ledger.try_charge(4).unwrap();
    assert_eq!(
        format!("{ledger:?}"),
        "ByteLedger { in_flight: 4, budget: 9 }"
    );
    assert_eq!(format!("{p:?}"), "BytePermit { charged: 4 }");
}

#[test]
fn unlimited_budget_admits_everything_representable() {
    let ledger = ByteLedger::new(0).unwrap();
    let held: Vec<_> = (0..100)
        .map(|_| ledger.try_charge(1 << 30).unwrap())
        .collect();
    assert_eq!(ledger.in_flight(), 100 << 30);
    drop(held);
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn lowering_the_budget_refuses_new_charges_and_drains() {
    let ledger = ByteLedger::new(100).unwrap();
    let a = ledger.try_charge(50).unwrap();
    let b = ledger.try_charge(50).unwrap();
    ledger.set_budget(60).unwrap();
    drop(a);
    assert!(ledger.try_charge(20).is_err());
    let c = ledger.try_charge(10).unwrap();
    drop((b, c));
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn the_last_reference_frees_the_ledger() {
    let before = crate::raw::live::count();
    let ledger = ByteLedger::new(10).unwrap();
    let mut permit = ledger.try_charge(0).unwrap();
    drop(ledger);
    permit.try_grow(5).unwrap();
    permit.shrink(5);
    assert_eq!(
        crate::raw::live::count(),
        before + 1,
        "a zero-byte permit keeps it"
    );
    drop(permit);
    assert_eq!(crate::raw::live::count(), before);
}

#[test]
fn a_permit_outliving_every_handle_releases_safely() {
    let ledger = ByteLedger::new(10).unwrap();
    let mut permit = ledger.try_charge(5).unwrap();
    drop(ledger);
    permit.try_grow(100).unwrap();
    permit.shrink(3);
    drop(permit);
}
