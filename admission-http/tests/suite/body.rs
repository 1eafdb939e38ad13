//! `PermitBody` releases on each path, and only there. Each test polls in place, so a
//! release that happened through `Drop` cannot make it pass.

use std::task::Poll;

use crate::support::{Hint, Script, ScriptError, Step, data, poll};
use admission_core::CountLedger;
use admission_http::PermitBody;
use http_body::{Body, SizeHint};
use http_body_util::BodyExt;

fn wrap(ledger: &CountLedger, script: Script) -> PermitBody<Script, admission_core::CountPermit> {
    PermitBody::new(script, ledger.try_acquire().unwrap())
}

#[test]
fn permit_is_held_across_frames_and_released_at_end_of_stream() {
    let ledger = CountLedger::new(1).unwrap();
    let mut body = wrap(
        &ledger,
        Script::new(Hint::Never, [Step::Data("a"), Step::Data("b")]),
    );
    assert_eq!(data(&mut body), "a");
    assert_eq!(ledger.in_flight(), 1);
    assert_eq!(data(&mut body), "b");
    assert_eq!(
        ledger.in_flight(),
        1,
        "the inner body has not said it ended"
    );
    assert!(matches!(poll(&mut body), Poll::Ready(None)));
    assert_eq!(ledger.in_flight(), 0);
    assert!(body.is_released());
    // Polling again after the end changes nothing.
    assert!(matches!(poll(&mut body), Poll::Ready(None)));
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn permit_is_released_on_an_error_frame_while_the_wrapper_is_alive() {
    let ledger = CountLedger::new(1).unwrap();
    let mut body = wrap(
        &ledger,
        Script::new(Hint::Never, [Step::Data("a"), Step::Error]),
    );
    assert_eq!(data(&mut body), "a");
    assert_eq!(ledger.in_flight(), 1);
    assert!(matches!(
        poll(&mut body),
        Poll::Ready(Some(Err(ScriptError)))
    ));
    assert_eq!(ledger.in_flight(), 0);
    assert!(body.is_released());
}

#[test]
fn permit_is_released_right_after_the_last_frame_when_is_end_stream_turns_true() {
    let ledger = CountLedger::new(1).unwrap();
    let mut body = wrap(
        &ledger,
        Script::new(Hint::Accurate, [Step::Data("a"), Step::Data("b")]),
    );
    assert_eq!(data(&mut body), "a");
    assert_eq!(ledger.in_flight(), 1);
    assert_eq!(data(&mut body), "b");
    assert_eq!(ledger.in_flight(), 0, "released without a further poll");
    assert!(body.is_end_stream());
}

#[test]
fn permit_is_never_released_on_pending_even_when_is_end_stream_is_true() {
    let ledger = CountLedger::new(1).unwrap();
    let mut body = wrap(
        &ledger,
        Script::new(
            Hint::Always,
            [Step::Pending, Step::Pending, Step::Data("a")],
        ),
    );
    assert!(body.is_end_stream(), "the hint is wrong on purpose");
    assert!(poll(&mut body).is_pending());
    assert!(poll(&mut body).is_pending());
    assert_eq!(ledger.in_flight(), 1);
    assert!(!body.is_released());
    assert_eq!(data(&mut body), "a");
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn permit_is_released_when_the_body_is_dropped_mid_stream() {
    let ledger = CountLedger::new(1).unwrap();
    let mut body = wrap(
        &ledger,
        Script::new(Hint::Never, [Step::Data("a"), Step::Data("b")]),
    );
    assert_eq!(data(&mut body), "a");
    assert_eq!(ledger.in_flight(), 1);
    drop(body);
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn trailers_arrive_intact_and_end_the_stream() {
    let ledger = CountLedger::new(1).unwrap();
    let mut body = wrap(
        &ledger,
        Script::new(
            Hint::Accurate,
            [Step::Data("a"), Step::Trailers("grpc-status", "0")],
        ),
    );
    assert_eq!(data(&mut body), "a");
    let Poll::Ready(Some(Ok(frame))) = poll(&mut body) else {
        panic!("expected trailers");
    };
    let trailers = frame.into_trailers().expect("a trailers frame");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers.len(), 1);
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn size_hint_and_is_end_stream_are_the_inner_bodys() {
    let ledger = CountLedger::new(2).unwrap();
    let body = wrap(
        &ledger,
        Script::new(Hint::Never, [Step::Data("abc")]).with_size_hint(SizeHint::with_exact(3)),
    );
    assert_eq!(body.size_hint().exact(), Some(3));
    assert!(!body.is_end_stream());
    let body = wrap(&ledger, Script::new(Hint::Always, []));
    assert!(body.is_end_stream());
}

#[tokio::test]
async fn a_body_collected_by_value_releases_too() {
    // Beside the in-place tests above: `collect` consumes the body, so this passes
    // through `Drop` as well as end of stream; it shows the ordinary use, not the path.
    let ledger = CountLedger::new(1).unwrap();
    let body = wrap(
        &ledger,
        Script::new(Hint::Never, [Step::Data("a"), Step::Data("b")]),
    );
    let bytes = body.collect().await.unwrap().to_bytes();
    assert_eq!(bytes, "ab");
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn into_parts_hands_the_permit_over_and_into_inner_releases_it() {
    let ledger = CountLedger::new(2).unwrap();
    let body = wrap(&ledger, Script::new(Hint::Never, []));
    let (_inner, permit) = body.into_parts();
    assert_eq!(ledger.in_flight(), 1);
    drop(permit);
    let body = wrap(&ledger, Script::new(Hint::Never, []));
    let _inner = body.into_inner();
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn release_gives_the_permit_up_before_the_end() {
    let ledger = CountLedger::new(1).unwrap();
    let mut body = wrap(&ledger, Script::new(Hint::Never, [Step::Pending]));
    assert!(matches!(poll(&mut body), Poll::Pending));
    assert_eq!(ledger.in_flight(), 1);
    std::pin::Pin::new(&mut body).release();
    assert_eq!(
        ledger.in_flight(),
        0,
        "released in place, the body still alive"
    );
    assert!(body.is_released());
}
