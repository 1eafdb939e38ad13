//! The wait's turns across flows: round robin between flows, a full queue shared, a
//! standing queue's refusals kept within a flow; and, as a property, no backlogged flow
//! served twice while another waits.

use std::time::Duration;

use proptest::prelude::*;

use std::time::Instant;

use crate::{Acquire, CountLedger, CountPermit, Priority, Refused};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

fn poll(acquire: &mut Acquire) -> Poll<Result<CountPermit, Refused>> {
    Pin::new(acquire).poll(&mut Context::from_waker(Waker::noop()))
}

/// A ledger of one slot, held, with room for `max_waiting` waiters and a queue that does
/// not come to stand within a test.
fn full(max_waiting: usize) -> (CountLedger, CountPermit) {
    let ledger = CountLedger::new(1).unwrap();
    ledger.set_max_waiting(max_waiting);
    ledger.set_standing_queue(Duration::from_secs(3600), Duration::from_millis(5));
    let held = ledger.try_acquire().unwrap();
    (ledger, held)
}

thread_local! {
    /// The clock of the test on this thread (each test polls on its own thread).
    static NOW: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

fn set_now(at: Instant) {
    NOW.with(|now| now.set(Some(at)));
}

/// A ledger of one slot with room for eight waiters whose wait reads this thread's test
/// clock, set to the returned instant.
fn on_the_test_clock() -> (CountLedger, Instant) {
    let start = Instant::now();
    set_now(start);
    let ledger = CountLedger::new(1).unwrap();
    ledger.set_max_waiting(8);
    ledger.set_wait_clock(|| NOW.with(|now| now.get().expect("set")));
    (ledger, start)
}

/// Queues a waiter in `flow` (pending: the ledger is full).
fn queue(ledger: &CountLedger, flow: u64) -> Acquire {
    let mut waiter = ledger.acquire().in_flow(flow);
    assert!(
        poll(&mut waiter).is_pending(),
        "the ledger is full: it waits"
    );
    waiter
}

/// The first of `waiters` gave its place to a newcomer (refused); the rest still wait.
fn first_gave_way(waiters: &mut [Acquire]) {
    assert!(matches!(
        poll(&mut waiters[0]),
        Poll::Ready(Err(Refused::Count))
    ));
    assert!(waiters[1..].iter_mut().all(|w| poll(w).is_pending()));
}

/// Releases `held`, and returns which of `waiters` (by index) was handed the slot, with
/// the slot's permit.
fn next(held: CountPermit, waiters: &mut [(u64, Acquire)]) -> (usize, CountPermit) {
    drop(held);
    let mut granted = waiters
        .iter_mut()
        .enumerate()
        .filter_map(|(at, (_, waiter))| match poll(waiter) {
            Poll::Ready(Ok(permit)) => Some((at, permit)),
            Poll::Ready(Err(refused)) => panic!("waiter {at} refused: {refused:?}"),
            Poll::Pending => None,
        });
    let one = granted.next().expect("a waiter is handed the slot");
    assert!(granted.next().is_none(), "one slot, one waiter");
    one
}

#[test]
fn flows_take_turns_whatever_their_number_of_waiters() {
    let (ledger, mut held) = full(16);
    let mut waiters: Vec<(u64, Acquire)> = (0..4).map(|_| (1, queue(&ledger, 1))).collect();
    waiters.extend((0..2).map(|_| (2, queue(&ledger, 2))));
    let mut order = Vec::new();
    for _ in 0..6 {
        let (at, permit) = next(held, &mut waiters);
        order.push(waiters.remove(at).0);
        held = permit;
    }
    assert_eq!(order, [1, 2, 1, 2, 1, 1], "alternating while both wait");
}

#[test]
fn a_flow_that_comes_to_wait_goes_before_the_flow_just_served() {
    let (ledger, held) = full(16);
    let mut waiters: Vec<(u64, Acquire)> = (0..3).map(|_| (1, queue(&ledger, 1))).collect();
    let (at, held) = next(held, &mut waiters);
    assert_eq!(waiters.remove(at).0, 1);
    waiters.push((2, queue(&ledger, 2)));
    let (at, _held) = next(held, &mut waiters);
    assert_eq!(waiters[at].0, 2, "flow 1 was just served: flow 2's turn");
}

#[test]
fn classes_come_before_turns() {
    let ledger = CountLedger::new(10).unwrap();
    ledger.set_max_waiting(16);
    let mut held: Vec<CountPermit> = (0..10).map(|_| ledger.try_acquire().unwrap()).collect();
    // Flow 2's turn comes first, but its waiter's class is less important (it may fill
    // 7 of the 10 slots).
    let mut sheddable = ledger.acquire_as(Priority::SHEDDABLE).in_flow(2);
    assert!(poll(&mut sheddable).is_pending());
    let mut first = queue(&ledger, 1);
    let mut second = queue(&ledger, 1);
    held.pop();
    let Poll::Ready(Ok(one)) = poll(&mut first) else {
        panic!("the more important class first")
    };
    held.pop();
    let Poll::Ready(Ok(two)) = poll(&mut second) else {
        panic!("and its next waiter, while the less important class has no room")
    };
    assert!(poll(&mut sheddable).is_pending());
    drop((one, two, held));
}

#[test]
fn without_flows_the_oldest_is_served_first_as_before() {
    let (ledger, mut held) = full(16);
    let mut waiters: Vec<(u64, Acquire)> = (0..4)
        .map(|i| {
            let mut waiter = ledger.acquire();
            assert!(poll(&mut waiter).is_pending());
            (i, waiter)
        })
        .collect();
    for expected in 0..4 {
        let (at, permit) = next(held, &mut waiters);
        assert_eq!(waiters.remove(at).0, expected);
        held = permit;
    }
}

#[test]
fn in_a_full_queue_a_flow_with_fewer_waiters_takes_the_place_of_the_most_crowded() {
    let (ledger, _held) = full(4);
    let mut heavy: Vec<Acquire> = (0..3).map(|_| queue(&ledger, 1)).collect();
    let _light = queue(&ledger, 2);
    assert_eq!(ledger.waiting(), 4, "full");
    // Flow 1's fourth is refused: it has the most already.
    let mut more = ledger.acquire().in_flow(1);
    assert!(matches!(poll(&mut more), Poll::Ready(Err(Refused::Count))));
    // Flow 3 (none waiting) takes the place of flow 1's oldest.
    let _third = queue(&ledger, 3);
    first_gave_way(&mut heavy);
    assert_eq!(ledger.waiting(), 4);
    // Flows 1, 2, 3 hold 2, 1, 1: flow 2's second would have as many as the most, and is
    // refused; flow 4's first takes the place of flow 1's older.
    let mut light2 = ledger.acquire().in_flow(2);
    assert!(matches!(
        poll(&mut light2),
        Poll::Ready(Err(Refused::Count))
    ));
    let _fourth = queue(&ledger, 4);
    assert!(matches!(
        poll(&mut heavy[1]),
        Poll::Ready(Err(Refused::Count))
    ));
    assert!(poll(&mut heavy[2]).is_pending());
    // An acquisition with no flow never takes another's place.
    let mut plain = ledger.acquire();
    assert!(matches!(poll(&mut plain), Poll::Ready(Err(Refused::Count))));
}

#[test]
fn a_standing_queue_refuses_only_the_old_waiters_of_the_newcomers_flow() {
    let (ledger, start) = on_the_test_clock();
    let _held = ledger.try_acquire().unwrap();
    let mut old_1 = queue(&ledger, 1);
    let mut old_2 = queue(&ledger, 2);
    // The queue has stood for its interval, and both have waited past the target.
    set_now(start + Duration::from_millis(200));
    let _new_1 = queue(&ledger, 1);
    assert!(matches!(poll(&mut old_1), Poll::Ready(Err(Refused::Count))));
    assert!(
        poll(&mut old_2).is_pending(),
        "another flow's waiter keeps its place"
    );
    // A flow with fewer waiters than the mean does not stand, though the queue does: its
    // old waiter keeps its place as its newer one comes, and is served first.
    let mut heavy = vec![_new_1];
    heavy.extend((0..4).map(|_| queue(&ledger, 1)));
    let mut first_3 = queue(&ledger, 3);
    set_now(start + Duration::from_millis(250));
    let mut second_3 = queue(&ledger, 3);
    assert!(
        poll(&mut first_3).is_pending(),
        "waited 50 ms, but its flow does not stand"
    );
    // Flow 1 stands: its newest is served first, in flow 1's turn; then flow 2's.
    drop(_held);
    let served = poll(&mut heavy[4]);
    assert!(
        heavy[..4]
            .iter_mut()
            .all(|waiter| poll(waiter).is_pending())
    );
    let Poll::Ready(Ok(permit)) = served else {
        panic!("flow 1's newest served first")
    };
    drop(permit);
    let Poll::Ready(Ok(permit)) = poll(&mut old_2) else {
        panic!("flow 2 served next")
    };
    drop(permit);
    let served = poll(&mut first_3);
    assert!(
        matches!(served, Poll::Ready(Ok(_))),
        "oldest first in flow 3"
    );
    assert!(poll(&mut second_3).is_pending());
}

#[test]
fn of_two_flows_as_crowded_the_one_that_came_first_gives_way() {
    for first in [1, 2] {
        let second = 3 - first;
        let (ledger, _held) = full(4);
        // Interleaved, `first`'s oldest ahead: two waiters each.
        let mut earlier = vec![queue(&ledger, first)];
        let mut later = vec![queue(&ledger, second)];
        earlier.push(queue(&ledger, first));
        later.push(queue(&ledger, second));
        // Flow 3's newcomer takes the place of the oldest waiter of the two.
        let _third = queue(&ledger, 3);
        first_gave_way(&mut earlier);
        assert!(
            later.iter_mut().all(|w| poll(w).is_pending()),
            "{second} kept both"
        );
    }
}

#[test]
fn in_a_full_queue_the_most_crowded_flow_gives_way_wherever_it_waits() {
    let (ledger, held) = full(4);
    let mut first = queue(&ledger, 1);
    let mut light = queue(&ledger, 2);
    let mut heavy: Vec<Acquire> = (0..2).map(|_| queue(&ledger, 1)).collect();
    // Flow 1's first is handed the slot but not yet polled: it holds its share.
    drop(held);
    heavy.push(queue(&ledger, 1));
    assert_eq!(
        ledger.waiting(),
        4,
        "full: flow 2 first, then flow 1's three"
    );
    // A newcomer of flow 3 takes the place of flow 1's oldest still waiting: not flow
    // 2's (the first waiting in the queue), nor flow 1's granted one.
    let _third = queue(&ledger, 3);
    assert!(poll(&mut light).is_pending(), "flow 2 keeps its place");
    let Poll::Ready(Ok(_granted)) = poll(&mut first) else {
        panic!("the granted waiter keeps its slot")
    };
    first_gave_way(&mut heavy);
    assert_eq!(ledger.in_flight(), 1);
}

#[test]
fn two_flows_of_as_many_waiters_both_stand() {
    let (ledger, start) = on_the_test_clock();
    // It stands once waited in for 10 ms; a waiter may wait 50 ms.
    ledger.set_standing_queue(Duration::from_millis(10), Duration::from_millis(50));
    let held = ledger.try_acquire().unwrap();
    let mut waiters = Vec::new();
    for flow in [1, 2, 1, 2, 1, 2] {
        waiters.push((flow, queue(&ledger, flow)));
    }
    set_now(start + Duration::from_millis(20));
    // Three of six, in two flows: each has its share, so each stands and is served
    // newest first: flow 1's third, then flow 2's third.
    let (at, held) = next(held, &mut waiters);
    assert_eq!(at, 4, "flow 1's newest");
    drop(waiters.remove(at));
    let (at, _held) = next(held, &mut waiters);
    assert_eq!(at, 4, "flow 2's newest");
}

#[derive(Debug, Clone)]
enum Op {
    /// A waiter of this flow queues.
    Wait(u64),
    /// The held slot is released, to the next waiter.
    Release,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![(0..4_u64).prop_map(Op::Wait), Just(Op::Release)]
}

proptest! {
    /// Against the rule's meaning rather than its steps: while two flows both wait, the
    /// slots handed to them differ by at most one; a flow that comes to wait is served
    /// before any flow already waiting is served twice; within a flow, the oldest first.
    #[test]
    fn no_waiting_flow_is_served_twice_while_another_waits(ops in prop::collection::vec(op(), 1..80)) {
        let (ledger, held) = full(1_000);
        let mut held = Some(held);
        // (flow, its waiter's number within the flow, the waiter)
        let mut waiters: Vec<(u64, u64, Acquire)> = Vec::new();
        let mut queued = [0_u64; 4];
        let mut served_in_flow = [0_u64; 4];
        // Grants to each flow since both of a pair last began to wait together.
        let mut since = [[0_i64; 4]; 4];
        for op in ops {
            match op {
                Op::Wait(flow) => {
                    let waiting = |f: u64| waiters.iter().any(|(g, _, _)| *g == f);
                    if !waiting(flow) {
                        // It begins to wait: its count against every other flow restarts.
                        since[flow as usize] = [0; 4];
                        for row in &mut since {
                            row[flow as usize] = 0;
                        }
                    }
                    waiters.push((flow, queued[flow as usize], queue(&ledger, flow)));
                    queued[flow as usize] += 1;
                }
                Op::Release => {
                    let Some(permit) = held.take() else { continue };
                    if waiters.is_empty() {
                        drop(permit);
                        held = Some(ledger.try_acquire().unwrap());
                        continue;
                    }
                    let waiting: Vec<u64> = (0..4)
                        .filter(|f| waiters.iter().any(|(g, _, _)| g == f))
                        .collect();
                    let mut plain: Vec<(u64, Acquire)> = Vec::new();
                    let mut numbers = Vec::new();
                    for (flow, number, waiter) in waiters.drain(..) {
                        numbers.push(number);
                        plain.push((flow, waiter));
                    }
                    let (at, permit) = next(permit, &mut plain);
                    let flow = plain[at].0;
                    prop_assert_eq!(numbers[at], served_in_flow[flow as usize], "oldest first within a flow");
                    served_in_flow[flow as usize] += 1;
                    for &other in &waiting {
                        if other != flow {
                            since[flow as usize][other as usize] += 1;
                            since[other as usize][flow as usize] -= 1;
                            prop_assert!(
                                since[flow as usize][other as usize] <= 1,
                                "flow {} served twice while flow {} waited", flow, other
                            );
                        }
                    }
                    let _ = plain.remove(at);
                    numbers.remove(at);
                    waiters = plain
                        .into_iter()
                        .zip(numbers)
                        .map(|((flow, waiter), number)| (flow, number, waiter))
                        .collect();
                    held = Some(permit);
                }
            }
        }
    }
}
