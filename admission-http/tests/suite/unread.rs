//! What a handler drops unfinished is kept and read on (`MeteredBody::keep_unread`),
//! so whoever holds the charge sees a client that goes away; what was finished or
//! refused is not kept.

use std::task::{Context, Poll, Waker};

use crate::support::{Hint, Script, Step, poll};
use admission_core::ByteLedger;
use admission_http::{MeteredBody, RequestCharge};

fn poll_unread(charge: &RequestCharge) -> Poll<bool> {
    charge.poll_unread(&mut Context::from_waker(Waker::noop()))
}

fn dropped_by_the_handler(script: Script) -> RequestCharge {
    let ledger = ByteLedger::new(100).unwrap();
    let charge = RequestCharge::new(ledger.try_charge(10).unwrap());
    drop(MeteredBody::new(script, charge.clone()).keep_unread());
    charge
}

#[test]
fn with_nothing_kept_nothing_is_left_unread() {
    let charge = RequestCharge::new(ByteLedger::new(10).unwrap().try_charge(1).unwrap());
    assert_eq!(poll_unread(&charge), Poll::Ready(true));
}

#[test]
fn an_unfinished_body_is_read_on_and_discarded_to_its_end() {
    let steps = [
        Step::Pending,
        Step::Data("x"),
        Step::Data("y"),
        Step::Pending,
    ];
    let charge = dropped_by_the_handler(Script::new(Hint::Never, steps));
    assert_eq!(poll_unread(&charge), Poll::Pending);
    assert_eq!(
        poll_unread(&charge),
        Poll::Pending,
        "two frames read, then a wait"
    );
    assert_eq!(poll_unread(&charge), Poll::Ready(true), "the body ended");
    assert_eq!(
        poll_unread(&charge),
        Poll::Ready(true),
        "and nothing is left"
    );
}

#[test]
fn a_client_that_goes_away_fails_the_body_that_was_kept() {
    let steps = [Step::Pending, Step::Data("x"), Step::Error];
    let charge = dropped_by_the_handler(Script::new(Hint::Never, steps));
    assert_eq!(poll_unread(&charge), Poll::Pending);
    assert_eq!(poll_unread(&charge), Poll::Ready(false));
    assert_eq!(poll_unread(&charge), Poll::Ready(true), "reported once");
}

#[test]
fn a_body_that_says_it_ended_is_not_kept() {
    // Were it kept, its error would be read as a client gone.
    let charge = dropped_by_the_handler(Script::new(Hint::Always, [Step::Error]));
    assert_eq!(poll_unread(&charge), Poll::Ready(true));
}

#[test]
fn a_refused_body_is_not_kept() {
    let ledger = ByteLedger::new(4).unwrap();
    let _other = ledger.try_charge(4).unwrap();
    let charge = RequestCharge::new(ledger.try_charge(0).unwrap());
    let script = Script::new(Hint::Never, [Step::Data("hello"), Step::Error]);
    let mut body = MeteredBody::new(script, charge.clone()).keep_unread();
    assert!(
        matches!(poll(&mut body), Poll::Ready(Some(Err(_)))),
        "refused"
    );
    drop(body);
    assert_eq!(poll_unread(&charge), Poll::Ready(true));
}

#[test]
fn a_body_dropped_without_keep_unread_is_not_kept() {
    let ledger = ByteLedger::new(100).unwrap();
    let charge = RequestCharge::new(ledger.try_charge(10).unwrap());
    drop(MeteredBody::new(
        Script::new(Hint::Never, [Step::Error]),
        charge.clone(),
    ));
    assert_eq!(poll_unread(&charge), Poll::Ready(true));
}
