//! Refusal answers and the errors a refused body carries, checked as a handler or an
//! adapter sees them.

use std::error::Error;
use std::time::Duration;

use crate::support::{Hint, Script, Step, poll};
use admission_core::{ByteLedger, Refused};
use admission_http::{
    BodyRefused, MeteredBody, PermitBody, Refusal, RefusalBody, Refusals, RequestCharge,
};
use bytes::Bytes;
use http::StatusCode;

fn request() -> http::Request<()> {
    http::Request::get("/api/items").body(()).unwrap()
}

#[test]
fn retry_after_is_the_delay_rounded_up_to_whole_seconds() {
    let cases = [(0, 0), (1, 1), (999, 1), (1000, 1), (1001, 2), (2500, 3)];
    for (millis, secs) in cases {
        let refusals = Refusals::new().retry_after(Duration::from_millis(millis));
        assert_eq!(refusals.retry_delay(), Duration::from_millis(millis));
        assert_eq!(refusals.retry_after_secs(), secs, "{millis} ms");
    }
    let response = Refusals::new()
        .retry_after(Duration::from_secs(7))
        .respond(&request(), Refusal::Refused(Refused::Count));
    assert_eq!(response.headers()["retry-after"], "7");
}

#[test]
fn a_body_closure_shapes_the_body_and_a_response_closure_the_whole_answer() {
    let shaped =
        Refusals::new().body(|cx| RefusalBody::json(format!("{{\"path\":\"{}\"}}", cx.uri.path())));
    let response = shaped.respond(&request(), Refusal::Refused(Refused::Key));
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(response.body(), r#"{"path":"/api/items"}"#);

    let whole = shaped.response(|cx| {
        let mut response = http::Response::new(Bytes::from(cx.refusal.to_string()));
        *response.status_mut() = StatusCode::IM_A_TEAPOT;
        response
    });
    let response = whole.respond(&request(), Refusal::Refused(Refused::Bytes));
    assert_eq!(response.status(), StatusCode::IM_A_TEAPOT);
    assert_eq!(response.body(), "byte budget exhausted");
    assert_eq!(RefusalBody::text("busy").bytes(), "busy");
}

#[test]
fn a_refused_body_carries_the_configured_error_as_its_source() {
    let plain = Refusals::new();
    assert!(!plain.has_body_error());
    let refusals = plain
        .retry_after(Duration::from_millis(1500))
        .body_error(|cx| format!("{} retry in {:?}", cx.refused, cx.retry_delay).into());
    assert!(refusals.has_body_error());

    let ledger = ByteLedger::new(10).unwrap();
    let _others = ledger.try_charge(10).unwrap();
    let charge = RequestCharge::with_refusals(ledger.try_charge(0).unwrap(), &refusals);
    let script = Script::new(Hint::Never, [Step::Data("more than fits")]);
    let mut body = MeteredBody::new(script, charge.clone());
    assert_eq!(body.charge().map(RequestCharge::charged), Some(0));
    let std::task::Poll::Ready(Some(Err(err))) = poll(&mut body) else {
        panic!("the body must fail");
    };
    let refused = err.downcast_ref::<BodyRefused>().unwrap();
    assert_eq!(
        refused.to_string(),
        "request body refused: byte budget exhausted"
    );
    let source = refused.source().expect("the configured error");
    assert_eq!(
        source.to_string(),
        "byte budget exhausted retry in Some(1.5s)"
    );
    assert_eq!(charge.refused(), Some(Refused::Bytes));

    // Without a configured error, no source.
    assert!(BodyRefused::new(Refused::Bytes).source().is_none());
}

#[test]
fn a_permit_body_shows_its_permit_until_it_is_released() {
    let body = PermitBody::new(Script::new(Hint::Never, [Step::Data("x")]), 7_u8);
    assert_eq!(body.permit(), Some(&7));
}

#[test]
fn jitter_spreads_retry_delays_within_its_range() {
    use std::time::Duration;
    let (delay, jitter) = (Duration::from_millis(500), Duration::from_millis(1000));
    let refusals = admission_http::Refusals::new()
        .retry_after(delay)
        .retry_jitter(jitter);
    let request = http::Request::get("/").body(()).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..500 {
        let response = refusals.respond(
            &request,
            admission_http::Refusal::Refused(admission_core::Refused::Count),
        );
        let secs: u64 = response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=2).contains(&secs), "{secs}");
        seen.insert(secs);
    }
    assert_eq!(seen.len(), 2, "both whole seconds of the range are drawn");
    // Without jitter, the configured delay exactly.
    assert_eq!(admission_http::jittered(delay, Duration::ZERO), delay);
    let drawn: Vec<Duration> = (0..500)
        .map(|_| admission_http::jittered(delay, jitter))
        .collect();
    assert!(drawn.iter().all(|d| delay <= *d && *d <= delay + jitter));
    let below_mid = drawn.iter().filter(|d| **d < delay + jitter / 2).count();
    assert!(
        (150..=350).contains(&below_mid),
        "roughly uniform: {below_mid} of 500"
    );
}

/// The draw behind the jitter: both ends of the range reached, every value about equally
/// often, and each draw independent of the one before (so retries spread, not cluster).
/// Bounds at seven standard deviations: a fair generator never fails them.
#[test]
fn jitter_draws_every_value_of_its_range_evenly_and_independently() {
    use admission_http::jittered;
    use std::time::Duration;
    let delay = Duration::from_secs(1);
    let ends: std::collections::BTreeSet<_> = (0..1000)
        .map(|_| jittered(delay, Duration::from_nanos(1)))
        .collect();
    assert_eq!(ends.len(), 2, "0 and 1 ns of jitter: {ends:?}");
    let draws: Vec<usize> = (0..20_000)
        .map(|_| (jittered(delay, Duration::from_nanos(9)) - delay).as_nanos() as usize)
        .collect();
    let mut values = [0; 10];
    let mut pairs = [[0; 10]; 10];
    for (i, &value) in draws.iter().enumerate() {
        values[value] += 1;
        if let Some(&next) = draws.get(i + 1) {
            pairs[value][next] += 1;
        }
    }
    assert!(
        values.iter().all(|n| (1700..=2300).contains(n)),
        "{values:?}"
    );
    assert!(
        pairs.iter().flatten().all(|n| (100..=300).contains(n)),
        "{pairs:?}"
    );
}

fn call(content_type: &str) -> http::Request<()> {
    http::Request::post("/pkg.Service/Method")
        .header(http::header::CONTENT_TYPE, content_type)
        .body(())
        .unwrap()
}

/// A gRPC call's refusal is trailers-only: HTTP 200, the status in its headers, no body.
#[test]
fn a_grpc_call_is_refused_trailers_only_with_the_code_its_retry_policy_reads() {
    // A body shape is for HTTP clients: a gRPC client could not decode it.
    let refusals = Refusals::new()
        .retry_after(Duration::from_millis(1500))
        .body(|_| RefusalBody::json("{}"));
    let cases = [
        (Refusal::Refused(Refused::Count), "14", Some("1500")),
        (Refusal::Refused(Refused::Key), "14", Some("1500")),
        (Refusal::Refused(Refused::TooLarge), "8", None),
        (Refusal::InvalidContentLength, "3", None),
    ];
    for (refusal, code, pushback) in cases {
        let response = refusals.respond(&call("application/grpc"), refusal);
        assert_eq!(response.status(), StatusCode::OK, "{refusal}");
        let headers = response.headers();
        assert_eq!(headers["content-type"], "application/grpc");
        assert_eq!(headers["grpc-status"], code, "{refusal}");
        assert_eq!(
            headers["grpc-message"],
            format!("admission refused: {refusal}").as_str()
        );
        assert_eq!(
            headers
                .get("grpc-retry-pushback-ms")
                .map(|v| v.to_str().unwrap()),
            pushback,
            "{refusal}"
        );
        assert_eq!(headers.contains_key("retry-after"), pushback.is_some());
        assert!(response.body().is_empty(), "{refusal}");
    }
}

#[test]
fn grpc_is_told_by_its_content_type_and_grpc_web_is_not_grpc() {
    let refused = |content_type| {
        Refusals::new()
            .respond(&call(content_type), Refusal::Refused(Refused::Count))
            .status()
    };
    for grpc in [
        "application/grpc",
        "application/grpc+proto",
        "application/grpc;v=1",
    ] {
        assert_eq!(refused(grpc), StatusCode::OK, "{grpc}");
    }
    for other in [
        "application/grpc-web",
        "application/grpcx",
        "application/json",
    ] {
        assert_eq!(refused(other), StatusCode::SERVICE_UNAVAILABLE, "{other}");
    }
    assert_eq!(
        Refusals::new()
            .respond(&request(), Refusal::Refused(Refused::Count))
            .status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[test]
fn a_response_closure_answers_grpc_calls_too() {
    let refusals = Refusals::new().response(|cx| {
        let mut response = http::Response::new(Bytes::from_static(b"mine"));
        *response.status_mut() = cx.status;
        response
    });
    let response = refusals.respond(&call("application/grpc"), Refusal::Refused(Refused::Count));
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.body(), "mine");
}

/// The default body names the cause: a 429 is one client over its share, not an
/// overloaded server; a 503 is the server's limit.
#[test]
fn the_default_body_names_the_cause_of_each_refusal() {
    let request = http::Request::get("/").body(()).unwrap();
    let body = |refused| {
        let response = Refusals::new().respond(&request, Refusal::Refused(refused));
        (
            response.status(),
            String::from_utf8(response.body().to_vec()).unwrap(),
        )
    };
    assert_eq!(
        body(Refused::Key),
        (
            http::StatusCode::TOO_MANY_REQUESTS,
            "too many requests from this client: per-key limit reached\n".to_owned()
        )
    );
    assert_eq!(
        body(Refused::Count),
        (
            http::StatusCode::SERVICE_UNAVAILABLE,
            "overloaded: count limit reached\n".to_owned()
        )
    );
    assert_eq!(body(Refused::TooLarge).1, "request too large\n");
}

/// The one gRPC mapping: a closed server is `UNAVAILABLE` whatever the overload code, any
/// other retryable refusal the overload code, one no retry helps `RESOURCE_EXHAUSTED`, a
/// malformed length `INVALID_ARGUMENT`; and the trailers-only answer carries it.
#[test]
fn every_refusal_maps_to_one_grpc_code() {
    use admission_http::{INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE, grpc_code};
    for overload in [UNAVAILABLE, RESOURCE_EXHAUSTED] {
        let code = |refused| grpc_code(Refusal::Refused(refused), overload);
        assert_eq!(code(Refused::Closed), UNAVAILABLE);
        for retryable in [Refused::Count, Refused::Class, Refused::Bytes, Refused::Key] {
            assert_eq!(code(retryable), overload, "{retryable:?}");
        }
        assert_eq!(code(Refused::TooLarge), RESOURCE_EXHAUSTED);
        assert_eq!(code(Refused::TooSlow), RESOURCE_EXHAUSTED);
        assert_eq!(
            grpc_code(Refusal::InvalidContentLength, overload),
            INVALID_ARGUMENT
        );
    }
    let call = http::Request::post("/pkg.Service/Method")
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let grpc_status = |refusal| {
        Refusals::new().respond(&call, refusal).headers()["grpc-status"]
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(grpc_status(Refusal::Refused(Refused::Closed)), "14");
    assert_eq!(grpc_status(Refusal::Refused(Refused::TooLarge)), "8");
    assert_eq!(grpc_status(Refusal::InvalidContentLength), "3");
}

/// How much of a refused body is discarded: 64 KiB within 1 s unless set.
#[test]
fn discard_limits_are_the_default_or_what_was_set() {
    let limits = Refusals::new().discard_limits();
    assert_eq!(
        (limits.max_bytes, limits.within),
        (64 << 10, Duration::from_secs(1))
    );
    let limits = Refusals::new()
        .discard(1024, Duration::from_millis(200))
        .discard_limits();
    assert_eq!(
        (limits.max_bytes, limits.within),
        (1024, Duration::from_millis(200))
    );
}
