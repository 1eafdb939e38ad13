//! Seats: a claim of several count slots, all or none, against a model; and in the wait.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use proptest::prelude::*;

use crate::{Claim, Gate, GatePermit, Refused};

#[test]
fn a_claim_waits_for_its_first_seat_then_takes_the_rest_or_is_refused() {
    let gate = Gate::<()>::builder().count(3).build().unwrap();
    gate.count().set_max_waiting(4);
    let mut cx = Context::from_waker(Waker::noop());
    let first = gate.try_claim(Claim::new().seats(2)).unwrap();
    let other = gate.try_claim(Claim::new()).unwrap();
    let mut wide = pin!(gate.claim(Claim::new().seats(2)));
    assert!(
        wide.as_mut().poll(&mut cx).is_pending(),
        "the count is full: it waits"
    );
    drop(first); // two free: the first for the waiter, the second taken at once
    let Poll::Ready(Ok(wide_permit)) = wide.as_mut().poll(&mut cx) else {
        panic!("admitted with both seats")
    };
    assert_eq!((wide_permit.seats(), gate.count().in_flight()), (2, 3));
    // One free, for a two-seat waiter: its first seat comes, the second cannot.
    drop(other);
    let mut refused = pin!(gate.claim(Claim::new().seats(3)));
    // Room for its first seat at once; not for the third.
    assert!(matches!(
        refused.as_mut().poll(&mut cx),
        Poll::Ready(Err(Refused::Count))
    ));
    assert_eq!(gate.count().in_flight(), 2, "its first seat went back");
    drop(wide_permit);
    assert_eq!(gate.count().in_flight(), 0);
}

#[test]
fn seats_taken_out_are_held_apart_and_released_with_their_permits() {
    let gate = Gate::<()>::builder().count(4).build().unwrap();
    let mut permit = gate.try_claim(Claim::new().seats(3)).unwrap();
    let seats = permit.take_seats();
    assert_eq!((seats.len(), permit.seats()), (2, 1));
    let (count, _, _) = permit.into_parts();
    assert_eq!(gate.count().in_flight(), 3);
    drop(seats);
    assert_eq!(gate.count().in_flight(), 1);
    drop(count);
    assert_eq!(gate.count().in_flight(), 0);
}

#[derive(Debug, Clone)]
enum Op {
    Claim(u32),
    Release(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..7_u32).prop_map(Op::Claim),
        any::<usize>().prop_map(Op::Release),
    ]
}

proptest! {
    /// Each claim admitted exactly when all its seats (at least one, at most the count) are
    /// free, and the count reads the seats held.
    #[test]
    fn claims_take_all_their_seats_or_none(
        count in 1..9_usize,
        with_key in any::<bool>(),
        ops in prop::collection::vec(op(), 1..50),
    ) {
        let gate = Gate::<u8>::builder().count(count).per_key(64).build().unwrap();
        let capacity = count as u64;
        let mut held: Vec<(u64, GatePermit<u8>)> = Vec::new();
        for op in ops {
            match op {
                Op::Claim(seats) => {
                    let wanted = u64::from(seats.max(1)).min(capacity);
                    let in_flight: u64 = held.iter().map(|(n, _)| n).sum();
                    let claim = Claim::new().seats(seats);
                    let claim = if with_key { claim.key(&1) } else { claim };
                    let got = gate.try_claim(claim);
                    prop_assert_eq!(got.is_ok(), in_flight + wanted <= capacity);
                    if let Ok(permit) = got {
                        prop_assert_eq!(permit.seats(), wanted);
                        held.push((wanted, permit));
                    }
                }
                Op::Release(at) => {
                    if !held.is_empty() {
                        let at = at % held.len();
                        drop(held.swap_remove(at));
                    }
                }
            }
            let in_flight: u64 = held.iter().map(|(n, _)| n).sum();
            prop_assert_eq!(gate.count().in_flight(), in_flight);
        }
    }
}
