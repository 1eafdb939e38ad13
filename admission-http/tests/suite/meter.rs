//! Request-body metering: declared lengths, the maximum, streamed growth, bad headers.

use std::task::Poll;

use crate::support::{Hint, Script, Step, Unread, data, poll};
use admission_core::{ByteLedger, Refused};
use admission_http::{BodyRefused, PermitBody, Refusal, Refusals, RequestMeter};
use http::{Request, StatusCode};

fn meter(budget: u64, max: u64) -> (ByteLedger, RequestMeter) {
    let ledger = ByteLedger::with_max_charge(budget, max).unwrap();
    (ledger.clone(), RequestMeter::new(ledger))
}

fn post<B>(length: Option<&str>, body: B) -> Request<B> {
    let mut builder = Request::post("/upload");
    if let Some(length) = length {
        builder = builder.header("content-length", length);
    }
    builder.body(body).unwrap()
}

#[test]
fn a_declared_length_is_charged_before_the_body_is_read_and_held_until_the_response_ends() {
    let (ledger, meter) = meter(1000, 0);
    let admitted = meter.admit(post(Some("300"), Unread)).unwrap();
    let (request, charge) = (admitted.request, admitted.charge);
    assert_eq!(ledger.in_flight(), 300, "charged with the body unread");

    // The handler drops the request; the response still holds the charge.
    drop(request);
    let mut response = PermitBody::new(Script::new(Hint::Never, [Step::Data("ok")]), charge);
    assert_eq!(ledger.in_flight(), 300);
    assert_eq!(data(&mut response), "ok");
    assert_eq!(ledger.in_flight(), 300);
    assert!(matches!(poll(&mut response), Poll::Ready(None)));
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn a_request_above_the_maximum_is_refused_with_413_without_reading_its_body() {
    let (ledger, meter) = meter(1000, 500);
    let request = post(Some("501"), Unread);
    let refusal = meter.charge(request.headers()).unwrap_err();
    assert_eq!(refusal, Refusal::Refused(Refused::TooLarge));
    let response = Refusals::new().respond(&request, refusal);
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(response.headers().get("retry-after").is_none());
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn a_declared_length_over_the_remaining_budget_is_refused_with_503() {
    let (ledger, meter) = meter(1000, 0);
    let _held = ledger.try_charge(800).unwrap();
    let request = post(Some("300"), Unread);
    let refusal = meter.charge(request.headers()).unwrap_err();
    assert_eq!(refusal, Refusal::Refused(Refused::Bytes));
    let response = Refusals::new().respond(&request, refusal);
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(ledger.in_flight(), 800);
}

#[test]
fn a_streamed_body_is_charged_frame_by_frame_and_refused_midway_with_the_error_reaching_the_reader()
{
    let (ledger, meter) = meter(100, 0);
    let other = ledger.try_charge(20).unwrap();
    let script = Script::new(
        Hint::Never,
        [
            Step::Data("0123456789"),
            Step::Pending,
            Step::Data("x"),
            Step::Data(LONG),
        ],
    );
    let admitted = meter.admit(post(None, script)).unwrap();
    let (request, charge) = (admitted.request, admitted.charge);
    let mut body = request.into_body();
    assert_eq!(
        ledger.in_flight(),
        20,
        "nothing charged before data arrives"
    );
    assert_eq!(data(&mut body), "0123456789");
    assert_eq!(ledger.in_flight(), 30);
    assert!(poll(&mut body).is_pending());
    assert_eq!(data(&mut body), "x");
    assert_eq!((ledger.in_flight(), charge.charged()), (31, 11));
    assert_eq!(charge.refused(), None, "not refused while it fits");

    let Poll::Ready(Some(Err(err))) = poll(&mut body) else {
        panic!("the refusal must reach the reader as a body error");
    };
    let refused = err.downcast_ref::<BodyRefused>().expect("a BodyRefused");
    assert_eq!(refused.refused(), Refused::Bytes);
    assert_eq!(
        charge.refused(),
        Some(Refused::Bytes),
        "the charge tells whoever answers the request"
    );
    assert_eq!(ledger.in_flight(), 31, "the refused frame was not charged");
    assert!(
        matches!(poll(&mut body), Poll::Ready(None)),
        "the body ends after a refusal"
    );

    drop((body, charge, other));
    assert_eq!(ledger.in_flight(), 0);
}

const LONG: &str = "this frame is longer than the seventy bytes left in the budget of the ledger";

#[test]
fn a_body_longer_than_declared_is_charged_for_the_excess() {
    let (ledger, meter) = meter(1000, 0);
    let script = Script::new(Hint::Never, [Step::Data("abc"), Step::Data("defgh")]);
    let admitted = meter.admit(post(Some("4"), script)).unwrap();
    let (request, charge) = (admitted.request, admitted.charge);
    let mut body = request.into_body();
    assert_eq!(ledger.in_flight(), 4);
    assert_eq!(data(&mut body), "abc");
    assert_eq!(ledger.in_flight(), 4, "within what was declared");
    assert_eq!(data(&mut body), "defgh");
    assert_eq!((ledger.in_flight(), charge.charged()), (8, 8));
    drop((body, charge));
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn a_streamed_body_past_the_maximum_fails_as_too_large() {
    let (ledger, meter) = meter(1000, 5);
    let script = Script::new(Hint::Never, [Step::Data("abc"), Step::Data("def")]);
    let admitted = meter.admit(post(None, script)).unwrap();
    let (request, charge) = (admitted.request, admitted.charge);
    let mut body = request.into_body();
    assert_eq!(data(&mut body), "abc");
    let Poll::Ready(Some(Err(err))) = poll(&mut body) else {
        panic!("expected an error");
    };
    assert_eq!(
        err.downcast_ref::<BodyRefused>().unwrap().refused(),
        Refused::TooLarge
    );
    drop((body, charge));
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn a_malformed_content_length_is_answered_400_never_a_panic() {
    let (ledger, meter) = meter(1000, 0);
    for bad in [
        "abc",
        "-1",
        "+5",
        "1.5",
        "",
        " ",
        "99999999999999999999999",
        "0x10",
    ] {
        let request = Request::post("/")
            .header("content-length", bad)
            .body(Unread)
            .unwrap();
        let refusal = meter.charge(request.headers()).unwrap_err();
        assert_eq!(refusal, Refusal::InvalidContentLength, "{bad:?}");
        let response = Refusals::new().respond(&request, refusal);
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }
    let two = Request::post("/")
        .header("content-length", "5")
        .header("content-length", "6")
        .body(Unread)
        .unwrap();
    assert_eq!(meter.admit(two).unwrap_err(), Refusal::InvalidContentLength);
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn an_inner_body_error_passes_through_as_a_box_error() {
    let (ledger, meter) = meter(1000, 0);
    let admitted = meter
        .admit(post(None, Script::new(Hint::Never, [Step::Error])))
        .unwrap();
    let (request, charge) = (admitted.request, admitted.charge);
    let mut body = request.into_body();
    let Poll::Ready(Some(Err(err))) = poll(&mut body) else {
        panic!("expected the inner error");
    };
    assert!(err.downcast_ref::<crate::support::ScriptError>().is_some());
    drop((body, charge));
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn a_metered_body_reports_the_inner_hints_until_it_fails_and_then_its_end() {
    use http_body::{Body, SizeHint};
    let (ledger, meter) = meter(1000, 3);
    let script = Script::new(Hint::Never, [Step::Data("ab"), Step::Data("cd")])
        .with_size_hint(SizeHint::with_exact(4));
    let admitted = meter.admit(post(None, script)).unwrap();
    let (request, charge) = (admitted.request, admitted.charge);
    let mut body = request.into_body();
    assert!(!body.is_end_stream());
    assert_eq!(body.size_hint().exact(), Some(4));
    assert_eq!(data(&mut body), "ab");
    assert_eq!(body.seen(), 2);
    assert!(matches!(poll(&mut body), Poll::Ready(Some(Err(_)))));
    assert_eq!(body.seen(), 4);
    assert!(body.is_end_stream(), "a failed body has ended");
    assert_eq!(body.size_hint().exact(), Some(0));
    drop((body, charge));

    let admitted = meter
        .admit(post(None, Script::new(Hint::Always, [])))
        .unwrap();
    let request = admitted.request;
    assert!(request.body().is_end_stream(), "the inner body's end");
    assert_eq!(ledger.in_flight(), 0);
}

#[test]
fn the_default_refusal_body_says_overloaded_only_for_retryable_refusals() {
    let request = Request::get("/").body(()).unwrap();
    let refusals = Refusals::new();
    let body = |r| refusals.respond(&request, r).into_body();
    assert_eq!(
        body(Refusal::Refused(Refused::Bytes)),
        "overloaded: byte budget exhausted\n"
    );
    assert_eq!(
        body(Refusal::Refused(Refused::TooLarge)),
        "request too large\n"
    );
    assert_eq!(
        body(Refusal::InvalidContentLength),
        "invalid content-length\n"
    );
}

#[test]
fn debug_output_names_the_state() {
    let (_ledger, meter) = meter(1000, 0);
    let admitted = meter.admit(post(Some("2"), Unread)).unwrap();
    let (request, charge) = (admitted.request, admitted.charge);
    assert!(format!("{charge:?}").contains("charged: 2"));
    assert!(format!("{:?}", request.body()).contains("metered: true"));
    let body = PermitBody::new(Unread, ());
    assert!(format!("{body:?}").contains("released: false"));
    assert!(format!("{:?}", Refusals::new()).contains("retry_delay: 1s"));
}

#[test]
fn a_body_that_sends_exactly_what_it_declared_is_never_refused_afterwards() {
    // Everything it sends was charged up front, so even a budget lowered below what is
    // held now cannot fail it.
    let (ledger, meter) = meter(100, 0);
    let admitted = meter
        .admit(post(
            Some("5"),
            Script::new(Hint::Never, [Step::Data("abcde")]),
        ))
        .unwrap();
    let other = ledger.try_charge(5).unwrap();
    ledger.set_budget(1).unwrap();
    let mut body = admitted.request.into_body();
    assert_eq!(data(&mut body), "abcde");
    assert!(matches!(poll(&mut body), Poll::Ready(None)));
    drop((body, admitted.charge, other));
    assert_eq!(ledger.in_flight(), 0);
}
