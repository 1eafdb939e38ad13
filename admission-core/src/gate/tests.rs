//! The gate's unit tests.

use super::*;

fn gate() -> Gate<u8> {
    Gate::builder()
        .count(2)
        .bytes(100)
        .max_request_bytes(200)
        .per_key(1)
        .build()
        .unwrap()
}

fn levels(gate: &Gate<u8>) -> (u64, u64, u64) {
    (
        gate.count().in_flight(),
        gate.bytes().unwrap().in_flight(),
        gate.keyed().unwrap().keys(),
    )
}

#[test]
fn bounds() {
    fn is_send_sync_unpin<T: Send + Sync + Unpin + 'static>() {}
    is_send_sync_unpin::<Gate<String>>();
    is_send_sync_unpin::<GatePermit<String>>();
}

#[test]
#[allow(clippy::clone_on_copy)] // the `Clone` impl itself is under test
fn a_claim_copied_or_cloned_asks_the_same() {
    let gate = gate();
    let key = 9_u8;
    let claim = Claim::new()
        .key(&key)
        .bytes(30)
        .priority(Priority::SHEDDABLE)
        .key_cap(2);
    let (first, second) = (claim.clone(), Claim::default().key(&key));
    let held = gate.try_claim(first).unwrap();
    assert_eq!(levels(&gate), (1, 30, 1));
    assert_eq!(
        gate.try_claim(second).unwrap_err(),
        Refused::Key,
        "default cap 1"
    );
    assert_eq!(
        gate.try_claim(claim).unwrap_err(),
        Refused::Class,
        "70% of 2 is 1"
    );
    assert_eq!(
        gate.snapshot().refused_by_class[Priority::SHEDDABLE.index()],
        1
    );
    drop(held);
}

#[test]
fn each_refusal_names_its_dimension_and_leaves_every_ledger_as_it_found_it() {
    let gate = gate();
    let held = gate.try_admit(Some(&1), 60).unwrap();
    let before = levels(&gate);
    assert_eq!(before, (1, 60, 1));

    assert_eq!(gate.try_admit(Some(&1), 10).unwrap_err(), Refused::Key);
    assert_eq!(levels(&gate), before);
    assert_eq!(gate.try_admit(Some(&2), 50).unwrap_err(), Refused::Bytes);
    assert_eq!(
        levels(&gate),
        before,
        "count and key were taken, then given back"
    );
    assert_eq!(
        gate.try_admit(Some(&2), 201).unwrap_err(),
        Refused::TooLarge
    );
    assert_eq!(levels(&gate), before);

    let second = gate.try_admit(None, 0).unwrap();
    assert_eq!(gate.try_admit(Some(&3), 0).unwrap_err(), Refused::Count);
    assert_eq!(levels(&gate), (2, 60, 1));
    drop((held, second));
    assert_eq!(levels(&gate), (0, 0, 0));
}

#[test]
fn too_large_is_answered_first_whatever_else_is_full_even_without_a_maximum() {
    let gate = Gate::<u8>::builder()
        .count(1)
        .bytes(100)
        .per_key(1)
        .build()
        .unwrap();
    let _held = gate.try_admit(Some(&1), 10).unwrap();
    let huge = ByteLedger::MAX_BUDGET + 1;
    // Count is full and key 1 is at its cap: neither may answer for a request that
    // no amount of waiting would admit.
    assert_eq!(
        gate.try_admit(Some(&1), huge).unwrap_err(),
        Refused::TooLarge
    );
    assert_eq!(gate.try_admit(None, huge).unwrap_err(), Refused::TooLarge);
    let snap = gate.snapshot();
    assert_eq!(snap.count.refused, 0);
    assert_eq!(snap.keyed.unwrap().refused_key, 0);
    assert_eq!(snap.bytes.unwrap().refused, 2);
}

#[test]
fn a_refusal_moves_only_the_refusing_dimensions_refusal_counter() {
    let gate = Gate::<u8>::builder()
        .count(10)
        .bytes(100)
        .per_key(1)
        .build()
        .unwrap();
    let _held = gate.try_admit(Some(&1), 60).unwrap();

    let before = gate.snapshot();
    assert_eq!(gate.try_admit(Some(&1), 10).unwrap_err(), Refused::Key);
    let mut expected = before;
    expected.keyed.as_mut().unwrap().refused_key += 1;
    assert_eq!(gate.snapshot(), expected, "a key refusal took a count slot");

    let before = gate.snapshot();
    assert_eq!(gate.try_admit(Some(&2), 50).unwrap_err(), Refused::Bytes);
    let mut expected = before;
    expected.bytes.as_mut().unwrap().refused += 1;
    assert_eq!(gate.snapshot(), expected, "a byte refusal counted its key");

    let full = Gate::<u8>::builder().count(1).per_key(1).build().unwrap();
    let _held = full.try_admit(Some(&1), 0).unwrap();
    let before = full.snapshot();
    assert_eq!(full.try_admit(Some(&2), 0).unwrap_err(), Refused::Count);
    let mut expected = before;
    expected.count.refused += 1;
    assert_eq!(full.snapshot(), expected, "a count refusal counted its key");
}

#[test]
fn a_key_hammering_at_its_cap_never_makes_another_key_refused() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let gate = Gate::<u8>::builder().count(2).per_key(1).build().unwrap();
    let _a = gate.try_admit(Some(&b'A'), 0).unwrap();
    let done = AtomicBool::new(false);
    let collateral = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                // Key while B is out, Count while B holds the last slot: both true.
                assert!(gate.try_admit(Some(&b'A'), 0).is_err());
            }
        });
        let collateral = (0..if cfg!(miri) { 200 } else { 100_000 })
            .filter(|_| gate.try_admit(Some(&b'B'), 0).is_err())
            .count();
        done.store(true, Ordering::Relaxed);
        collateral
    });
    assert_eq!(collateral, 0, "key B was refused for key A's refusals");
}

#[test]
fn a_gate_without_limits_counts_and_can_be_closed_and_drained() {
    let gate = Gate::<u8>::builder().build().unwrap();
    assert!(gate.bytes().is_none() && gate.keyed().is_none());
    let held: Vec<_> = (0..100).map(|_| gate.try_admit(None, 0).unwrap()).collect();
    assert_eq!(gate.snapshot().count.in_flight, 100);
    assert!(!gate.is_closed());
    let drain = gate.drain();
    assert!(gate.snapshot().closed && gate.is_closed());
    assert_eq!(gate.try_admit(Some(&1), 0).unwrap_err(), Refused::Closed);
    assert_eq!(gate.snapshot().count.refused, 1);
    drop(held);
    assert!(drain.wait_timeout(std::time::Duration::from_secs(5)));
    gate.reopen();
    assert!(!gate.is_closed());
    assert!(gate.try_admit(None, 0).is_ok());
}

#[test]
fn a_closed_gate_still_answers_too_large_first_and_takes_nothing() {
    // Too large stays first (retrying cannot help), closed comes before bytes and key.
    let gate = gate();
    gate.close();
    assert_eq!(
        gate.try_admit(Some(&1), 201).unwrap_err(),
        Refused::TooLarge
    );
    assert_eq!(gate.try_admit(Some(&1), 10).unwrap_err(), Refused::Closed);
    assert_eq!(gate.try_admit(None, 0).unwrap_err(), Refused::Closed);
    assert_eq!(levels(&gate), (0, 0, 0));
}

#[test]
fn the_byte_permit_taken_out_keeps_its_charge_and_the_rest_stays() {
    let gate = gate();
    let mut permit = gate.try_admit(Some(&1), 40).unwrap();
    assert_eq!(permit.bytes().map(BytePermit::charged), Some(40));
    let bytes = permit.take_bytes().expect("the gate has a byte dimension");
    assert!(permit.bytes().is_none(), "taken out");
    assert_eq!(bytes.charged(), 40);
    assert!(permit.take_bytes().is_none(), "taken once");
    drop(permit);
    assert_eq!(
        levels(&gate),
        (0, 40, 0),
        "count and key released, bytes held"
    );
    drop(bytes);
    assert_eq!(levels(&gate), (0, 0, 0));
}

#[test]
fn a_builder_shows_its_limits() {
    let builder = Gate::<u8>::builder().count(3).per_key(2);
    let shown = format!("{builder:?}");
    assert!(
        shown.starts_with("GateBuilder { limits: Limits {"),
        "{shown}"
    );
    assert!(
        shown.contains("count: 3") && shown.contains("per_key: 2"),
        "{shown}"
    );
}

#[test]
fn a_gate_without_limits_admits_everything_and_holds_only_its_count() {
    let gate = Gate::<u8>::builder().build().unwrap();
    let permit = gate.try_admit(Some(&1), u64::MAX).unwrap();
    assert!(permit.bytes().is_none() && permit.keyed().is_none());
    assert_eq!(gate.count().in_flight(), 1);
}

#[test]
fn a_request_without_a_key_passes_the_key_dimension() {
    let gate = gate();
    let _a = gate.try_admit(None, 0).unwrap();
    let _b = gate.try_admit(None, 0).unwrap();
    assert_eq!(gate.keyed().unwrap().keys(), 0);
}

#[test]
fn max_request_bytes_without_a_budget_only_refuses_too_large() {
    let gate = Gate::<()>::builder().max_request_bytes(10).build().unwrap();
    let held: Vec<_> = (0..10).map(|_| gate.try_admit(None, 10).unwrap()).collect();
    assert_eq!(gate.try_admit(None, 11).unwrap_err(), Refused::TooLarge);
    assert_eq!(gate.snapshot().bytes.unwrap().refused, 1);
    drop(held);
}

mod waiting {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use crate::{Claim, Gate, Refused};

    fn cx() -> Context<'static> {
        Context::from_waker(Waker::noop())
    }

    /// Closed while it waits: refused, and its key's permit (held through the wait) is
    /// given back.
    #[test]
    fn a_claim_refused_while_it_waits_holds_nothing() {
        let gate = Gate::<u32>::builder().count(1).per_key(1).build().unwrap();
        gate.count().set_max_waiting(4);
        let held = gate.try_claim(Claim::new().key(&1)).unwrap();
        let mut waits = pin!(gate.claim(Claim::new().key(&2)));
        assert!(waits.as_mut().poll(&mut cx()).is_pending());
        assert_eq!(
            gate.keyed().unwrap().keys(),
            2,
            "the waiter holds its key's permit"
        );
        gate.close();
        assert!(matches!(
            waits.as_mut().poll(&mut cx()),
            Poll::Ready(Err(Refused::Closed))
        ));
        assert_eq!(gate.keyed().unwrap().keys(), 1, "given back");
        drop(held);
        assert_eq!(gate.count().in_flight(), 0);
    }

    /// Too large for the byte budget, or over its key's cap: refused at once, never queued.
    #[test]
    fn what_can_never_be_admitted_by_waiting_is_refused_at_once() {
        let gate = Gate::<u32>::builder()
            .count(1)
            .per_key(1)
            .bytes(100)
            .max_request_bytes(50)
            .build()
            .unwrap();
        gate.count().set_max_waiting(4);
        let held = gate.try_claim(Claim::new().key(&1)).unwrap();
        let too_large = pin!(gate.claim(Claim::new().key(&2).bytes(60))).poll(&mut cx());
        assert!(matches!(too_large, Poll::Ready(Err(Refused::TooLarge))));
        let same_key = pin!(gate.claim(Claim::new().key(&1))).poll(&mut cx());
        assert!(matches!(same_key, Poll::Ready(Err(Refused::Key))));
        assert_eq!(gate.count().waiting(), 0);
        drop(held);
    }

    /// Admitted by the count after its wait, refused by the bytes: the count's slot and
    /// the key's permit are given back (all or nothing).
    #[test]
    fn a_claim_the_bytes_refuse_after_its_wait_gives_back_its_slot() {
        let gate = Gate::<u32>::builder()
            .count(1)
            .per_key(1)
            .bytes(100)
            .build()
            .unwrap();
        gate.count().set_max_waiting(4);
        let held = gate.try_claim(Claim::new().key(&1).bytes(80)).unwrap();
        let mut waits = pin!(gate.claim(Claim::new().key(&2).bytes(40)));
        assert!(waits.as_mut().poll(&mut cx()).is_pending());
        // The count frees, the bytes do not.
        let (count, bytes, keyed) = held.into_parts();
        drop((count, keyed));
        assert!(matches!(
            waits.as_mut().poll(&mut cx()),
            Poll::Ready(Err(Refused::Bytes))
        ));
        assert_eq!(
            gate.count().in_flight(),
            0,
            "the slot it was handed went back"
        );
        assert_eq!(gate.keyed().unwrap().keys(), 0);
        drop(bytes);
    }
}
