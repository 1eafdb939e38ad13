//! A body read ahead while its request waits (`ReadAhead`): bounded, a failure seen, and
//! given back intact (`MeteredBody::replay`), metered as it is given.

use std::task::{Context, Poll, Waker};

use crate::support::{Hint, Script, Step, data, poll};
use admission_core::{ByteLedger, Refused};
use admission_http::{MeteredBody, ReadAhead, RequestCharge};
use http_body::Body;

fn poll_failed<B: Body + Unpin>(ahead: &mut ReadAhead<B>) -> Poll<()> {
    ahead.poll_failed(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn a_body_that_fails_while_read_ahead_is_reported() {
    let steps = [Step::Data("ab"), Step::Pending, Step::Error];
    let mut ahead = ReadAhead::new(Script::new(Hint::Never, steps), 1024);
    assert_eq!(poll_failed(&mut ahead), Poll::Pending);
    assert_eq!(ahead.read(), 2);
    assert_eq!(poll_failed(&mut ahead), Poll::Ready(()));
    assert_eq!(poll_failed(&mut ahead), Poll::Ready(()), "and stays failed");
}

#[test]
fn reading_ahead_stops_at_the_limit() {
    let steps = [
        Step::Data("abc"),
        Step::Data("def"),
        Step::Data("ghi"),
        Step::Error,
    ];
    let mut ahead = ReadAhead::new(Script::new(Hint::Never, steps), 4);
    assert_eq!(poll_failed(&mut ahead), Poll::Pending);
    assert_eq!(
        ahead.read(),
        6,
        "up to the limit, and at most one frame past it"
    );
    assert_eq!(
        poll_failed(&mut ahead),
        Poll::Pending,
        "the rest is not read: its failure is not seen"
    );
    assert!(!ahead.ended());
    let (body, read) = ahead.split();
    let mut replayed = MeteredBody::unmetered(body).replay(read);
    assert_eq!(data(&mut replayed), "abc");
    assert_eq!(data(&mut replayed), "def");
    assert!(
        !replayed.is_end_stream(),
        "what was read is given; the body goes on"
    );
    assert_eq!(data(&mut replayed), "ghi", "then the body's own");
    assert!(matches!(poll(&mut replayed), Poll::Ready(Some(Err(_)))));
}

#[test]
fn a_body_read_to_its_end_is_given_back_whole_with_its_trailers_and_nothing_after() {
    let steps = [
        Step::Data("he"),
        Step::Data("llo"),
        Step::Trailers("x-sum", "1"),
        Step::Data("never read"),
    ];
    let script = Script::new(Hint::Never, steps);
    // The body says it ended after its trailers: what follows is never read.
    let mut ahead = ReadAhead::new(EndsAfter(script, |f| f.is_trailers()), 1024);
    assert_eq!(poll_failed(&mut ahead), Poll::Pending);
    assert!(ahead.ended());
    let (body, read) = ahead.split();

    let ledger = ByteLedger::new(100).unwrap();
    let charge = RequestCharge::new(ledger.try_charge(0).unwrap());
    let mut replayed = MeteredBody::new(body, charge.clone()).replay(read);
    assert!(!replayed.is_end_stream());
    assert_eq!(replayed.size_hint().exact(), Some(5));
    assert_eq!(ledger.in_flight(), 0, "nothing charged before it is given");
    assert_eq!(data(&mut replayed), "he");
    assert_eq!(ledger.in_flight(), 2, "charged as it is given");
    assert_eq!(replayed.size_hint().exact(), Some(3), "what is left of it");
    assert_eq!(data(&mut replayed), "llo");
    match poll(&mut replayed) {
        Poll::Ready(Some(Ok(frame))) => assert_eq!(frame.trailers_ref().unwrap()["x-sum"], "1"),
        _ => panic!("the trailers"),
    }
    assert!(replayed.is_end_stream());
    assert!(matches!(poll(&mut replayed), Poll::Ready(None)));
    assert!(matches!(poll(&mut replayed), Poll::Ready(None)));
    assert_eq!(charge.charged(), 5);
}

#[test]
fn a_replayed_body_is_refused_by_the_budget_as_if_it_had_just_arrived() {
    let steps = [Step::Data("hello")];
    let mut ahead = ReadAhead::new(Script::new(Hint::Accurate, steps), 1024);
    assert_eq!(poll_failed(&mut ahead), Poll::Pending);
    let (body, read) = ahead.split();
    let ledger = ByteLedger::new(4).unwrap();
    let _other = ledger.try_charge(1).unwrap();
    let charge = RequestCharge::new(ledger.try_charge(0).unwrap());
    let mut replayed = MeteredBody::new(body, charge.clone()).replay(read);
    assert!(matches!(poll(&mut replayed), Poll::Ready(Some(Err(_)))));
    assert_eq!(charge.refused(), Some(Refused::Bytes));
}

/// Replays what `ahead` read into a metered body that keeps what is left unread, and drops
/// it, as a handler that does not read its body does: the charge that holds the rest.
fn dropped_by_its_handler<B: Body + Send + Unpin + 'static>(ahead: ReadAhead<B>) -> RequestCharge
where
    B::Data: Send + Sync,
{
    let (body, read) = ahead.split();
    let ledger = ByteLedger::new(100).unwrap();
    let charge = RequestCharge::new(ledger.try_charge(0).unwrap());
    drop(
        MeteredBody::new(body, charge.clone())
            .keep_unread()
            .replay(read),
    );
    charge
}

#[test]
fn a_partly_read_body_dropped_by_its_handler_is_kept_and_read_on() {
    let steps = [
        Step::Data("ab"),
        Step::Pending,
        Step::Pending,
        Step::Data("c"),
        Step::Error,
    ];
    let mut ahead = ReadAhead::new(Script::new(Hint::Never, steps), 1024);
    assert_eq!(poll_failed(&mut ahead), Poll::Pending);
    let charge = dropped_by_its_handler(ahead);
    let mut cx = Context::from_waker(Waker::noop());
    assert_eq!(charge.poll_unread(&mut cx), Poll::Pending);
    assert_eq!(
        charge.poll_unread(&mut cx),
        Poll::Ready(false),
        "the client went"
    );
}

#[test]
fn a_body_read_ahead_to_its_end_and_dropped_is_not_kept() {
    let steps = [Step::Data("ab"), Step::Error];
    let mut ahead = ReadAhead::new(EndsAfter(Script::new(Hint::Never, steps), |_| true), 1024);
    assert_eq!(poll_failed(&mut ahead), Poll::Pending);
    assert!(ahead.ended());
    let charge = dropped_by_its_handler(ahead);
    let mut cx = Context::from_waker(Waker::noop());
    assert_eq!(charge.poll_unread(&mut cx), Poll::Ready(true));
}

/// A body whose `is_end_stream` turns true once it has sent a frame that `last` picks.
struct EndsAfter(Script, fn(&http_body::Frame<bytes::Bytes>) -> bool);

impl Body for EndsAfter {
    type Data = bytes::Bytes;
    type Error = crate::support::ScriptError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let frame = std::pin::Pin::new(&mut self.0).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &frame {
            if (self.1)(f) {
                self.0 = Script::new(Hint::Always, []);
            }
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }
}

/// A body that ended while read ahead ends where its frames do, whatever the body itself
/// says of its end afterwards.
#[test]
fn a_body_read_ahead_to_its_end_ends_with_its_last_frame() {
    let mut ahead = ReadAhead::new(Script::new(Hint::Never, [Step::Data("ab")]), 1024);
    assert_eq!(poll_failed(&mut ahead), Poll::Pending);
    assert!(ahead.ended(), "it returned its end");
    let (body, read) = ahead.split();
    let mut replayed = MeteredBody::unmetered(body).replay(read);
    assert!(!replayed.is_end_stream());
    assert_eq!(data(&mut replayed), "ab");
    assert!(replayed.is_end_stream(), "though the body never says so");
}

#[test]
fn debug_output_names_what_was_read() {
    let mut ahead = ReadAhead::new(Script::new(Hint::Never, [Step::Data("ab")]), 1024);
    assert_eq!(poll_failed(&mut ahead), Poll::Pending);
    let shown = format!("{ahead:?}");
    assert!(
        shown.contains("read: 2") && shown.contains("Ended"),
        "{shown}"
    );
    let (_, read) = ahead.split();
    let shown = format!("{read:?}");
    assert!(
        shown.contains("frames: 1") && shown.contains("ended: true"),
        "{shown}"
    );
}
