//! What the builder rules out: every setting that used to be silently ignored, undone or
//! surprising is now a build error that names it, or a behaviour tested here. (What the
//! types rule out is in `AdmissionBuilder`'s `compile_fail` examples.)

use std::convert::Infallible;
use std::error::Error as _;

use admission_tower::adaptive::{AdaptiveLimit, Gradient};
use admission_tower::{
    AdmissionLayer, BuildError, ConnectionLimits, Gate, Key, MeteredBody, PerKey, Refusals,
    Unkeyed, key,
};
use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, Service, ServiceExt};

type In = MeteredBody<Full<Bytes>>;

fn ok() -> impl Service<Request<In>, Response = Response<Full<Bytes>>, Error = Infallible> + Clone {
    tower::service_fn(|_: Request<In>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    })
}

fn tenant() -> impl Fn(&http::request::Parts) -> Option<Key> + Send + Sync + 'static {
    key::header(HeaderName::from_static("x-tenant"))
}

/// The statuses of `n` requests sent one after another, every response held.
async fn statuses(layer: &AdmissionLayer, tenant: Option<&str>, n: usize) -> Vec<StatusCode> {
    let service = layer.layer(ok());
    let mut held = Vec::new();
    for _ in 0..n {
        let mut request = Request::get("/");
        if let Some(tenant) = tenant {
            request = request.header("x-tenant", tenant);
        }
        let request = request.body(Full::default()).unwrap();
        held.push(service.clone().oneshot(request).await.unwrap());
    }
    held.iter().map(Response::status).collect()
}

#[test]
fn a_snapshot_says_none_for_no_limit_as_the_builder_does() {
    let layer = AdmissionLayer::builder()
        .max_request_bytes(1024)
        .per_key(PerKey::new(4, tenant()))
        .build()
        .unwrap();
    let gate = layer.snapshot().gate;
    assert_eq!(gate.count.capacity, None, "no count limit");
    assert_eq!(
        gate.bytes.unwrap().capacity,
        None,
        "a largest request, no budget"
    );
    let keyed = gate.keyed.unwrap();
    assert_eq!((keyed.cap, keyed.max_keys), (Some(4), None));
    assert!(format!("{gate:?}").contains("capacity: None"));
    let limited = AdmissionLayer::builder()
        .count(8)
        .bytes(4096)
        .build()
        .unwrap();
    let gate = limited.snapshot().gate;
    assert_eq!(
        (gate.count.capacity, gate.bytes.unwrap().capacity),
        (Some(8), Some(4096))
    );
}

#[test]
fn a_connection_bound_of_zero_is_an_error_that_names_it() {
    use std::time::Duration;
    let zero = Duration::ZERO;
    let second = Duration::from_secs(1);
    let with = |limits: ConnectionLimits| {
        AdmissionLayer::builder()
            .count(8)
            .connection_limits(limits)
            .build()
            .unwrap_err()
    };
    let default = ConnectionLimits::default();
    for (limits, name) in [
        (default.with_max_connections(Some(0)), "max_connections"),
        (default.with_max_per_address(Some(0)), "max_per_address"),
        (default.with_max_streams(Some(0)), "max_streams"),
        (default.with_head_within(Some(zero)), "head_within"),
        (default.with_idle(Some(zero)), "idle"),
        (default.with_ping(Some((zero, second))), "ping"),
        (default.with_ping(Some((second, zero))), "ping"),
    ] {
        let error = with(limits);
        assert_eq!(error, BuildError::ZeroConnectionLimit(name));
        assert!(
            error.to_string().contains(&format!("`{name}` of 0")),
            "{error}"
        );
    }
    // `None` is no bound, and 1 is a bound.
    let off = ConnectionLimits::off();
    assert!(
        AdmissionLayer::builder()
            .connection_limits(off)
            .build()
            .is_ok()
    );
    let ones = default
        .with_max_connections(Some(1))
        .with_max_per_address(Some(1))
        .with_max_streams(Some(1));
    assert!(
        AdmissionLayer::builder()
            .connection_limits(ones)
            .build()
            .is_ok()
    );
}

#[test]
fn the_error_for_a_zero_per_key_cap_says_what_to_do_with_a_number() {
    for what in ["per-key cap", "max_keys"] {
        let message = BuildError::ZeroLimit(what).to_string();
        assert!(message.contains("leave it out"), "{message}");
        assert!(
            !message.contains("None"),
            "{what} takes no `None`: {message}"
        );
    }
    let message = BuildError::ZeroLimit("count").to_string();
    assert!(message.contains("pass `None`"), "{message}");
}

#[test]
fn a_limit_of_zero_is_an_error_that_names_it_and_none_is_no_limit() {
    let zero = |built: Result<AdmissionLayer, BuildError>| built.unwrap_err();
    assert_eq!(
        zero(AdmissionLayer::builder().count(0).build()),
        BuildError::ZeroLimit("count")
    );
    assert_eq!(
        zero(AdmissionLayer::builder().bytes(0).build()),
        BuildError::ZeroLimit("bytes")
    );
    assert_eq!(
        zero(AdmissionLayer::builder().max_request_bytes(0).build()),
        BuildError::ZeroLimit("max_request_bytes")
    );
    assert_eq!(
        zero(
            AdmissionLayer::builder()
                .per_key(PerKey::new(0, tenant()))
                .build()
        ),
        BuildError::ZeroLimit("per-key cap")
    );
    assert_eq!(
        zero(
            AdmissionLayer::builder()
                .per_key(PerKey::new(1, tenant()).max_keys(0))
                .build()
        ),
        BuildError::ZeroLimit("max_keys")
    );
    assert!(
        BuildError::ZeroLimit("count")
            .to_string()
            .contains("`count`")
    );
    let unlimited = AdmissionLayer::builder()
        .count(None)
        .bytes(None)
        .max_request_bytes(None)
        .build()
        .unwrap();
    let gate = unlimited.gate();
    assert!(gate.count().admits_all() && gate.bytes().is_none());
}

#[test]
fn a_fixed_count_beside_an_adaptive_limit_is_an_error() {
    let built = AdmissionLayer::builder()
        .count(64)
        .adaptive(AdaptiveLimit::builder(Gradient::default()))
        .build();
    assert_eq!(built.unwrap_err(), BuildError::CountAndAdaptive);
    // Invalid bounds: named here, the cause given once, by `source`.
    let error = AdmissionLayer::builder()
        .adaptive(AdaptiveLimit::builder(Gradient::default()).bounds(10, 5))
        .build()
        .unwrap_err();
    assert!(matches!(error, BuildError::Adaptive(_)), "{error:?}");
    let cause = error
        .source()
        .expect("the adaptive error beneath")
        .to_string();
    assert!(!error.to_string().contains(&cause), "{error}: {cause}");
}

#[test]
fn a_per_key_value_says_what_it_holds() {
    let debug = format!(
        "{:?}",
        PerKey::new(2, tenant())
            .max_keys(8)
            .unkeyed(Unkeyed::Exempt)
    );
    assert!(
        debug.starts_with("PerKey")
            && debug.contains("cap: Some(2)")
            && debug.contains("max_keys: Some(8)")
            && debug.contains("unkeyed: Exempt"),
        "{debug}"
    );
}

#[test]
fn a_per_key_value_must_fit_where_the_gate_comes_from() {
    let shared: Gate = Gate::builder().count(4).per_key(2).build().unwrap();
    let built = AdmissionLayer::from_gate(shared.clone())
        .per_key(PerKey::new(1, tenant()))
        .build();
    assert_eq!(built.unwrap_err(), BuildError::LimitsOnSharedGate);
    let built = AdmissionLayer::from_gate(shared.clone())
        .per_key(PerKey::gate_cap(tenant()).max_keys(8))
        .build();
    assert_eq!(built.unwrap_err(), BuildError::LimitsOnSharedGate);
    let built = AdmissionLayer::builder()
        .per_key(PerKey::gate_cap(tenant()))
        .build();
    assert_eq!(built.unwrap_err(), BuildError::NoKeyCap);
    let unkeyed: Gate = Gate::builder().count(4).build().unwrap();
    let built = AdmissionLayer::from_gate(unkeyed)
        .per_key(PerKey::gate_cap(tenant()))
        .build();
    assert_eq!(built.unwrap_err(), BuildError::NoKeyedLedger);
    // What fits: the extractor alone, the limits the gate's.
    let layer = AdmissionLayer::from_gate(shared)
        .per_key(PerKey::gate_cap(tenant()))
        .build()
        .unwrap();
    assert_eq!(layer.gate().keyed().unwrap().cap(), 2);
    for error in [
        BuildError::LimitsOnSharedGate,
        BuildError::NoKeyCap,
        BuildError::NoKeyedLedger,
        BuildError::CountAndAdaptive,
    ] {
        assert!(error.source().is_none() && !error.to_string().is_empty());
    }
}

#[tokio::test]
async fn requests_without_a_key_share_one_cap_unless_exempt() {
    let shared = AdmissionLayer::builder()
        .per_key(PerKey::new(2, tenant()))
        .build()
        .unwrap();
    assert_eq!(
        statuses(&shared, None, 3).await,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ],
        "leaving the header out is no way around the cap"
    );
    assert_eq!(shared.gate().keyed().unwrap().cap(), 2);

    let exempt = AdmissionLayer::builder()
        .per_key(PerKey::new(2, tenant()).unkeyed(Unkeyed::Exempt))
        .build()
        .unwrap();
    assert_eq!(statuses(&exempt, None, 3).await, [StatusCode::OK; 3]);
    // A request with a key is capped either way.
    assert_eq!(
        statuses(&exempt, Some("acme"), 3).await,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

#[tokio::test]
async fn a_refusal_has_one_shape_the_last_one_set() {
    let grpc_like = |_: &admission_tower::RefusalContext<'_>| {
        let mut response = Response::new(Bytes::new());
        response.headers_mut().insert("grpc-status", 8.into());
        response
    };
    let text = |_: &admission_tower::RefusalContext<'_>| admission_tower::RefusalBody::text("busy");
    for (refusals, grpc) in [
        (Refusals::new().response(grpc_like).body(text), false),
        (Refusals::new().body(text).response(grpc_like), true),
    ] {
        let layer = AdmissionLayer::builder()
            .count(1)
            .refusals(refusals)
            .build()
            .unwrap();
        let service = layer.layer(ok());
        let _held = service.clone().oneshot(Request::new(Full::default())).await;
        let refused = service
            .oneshot(Request::new(Full::default()))
            .await
            .unwrap();
        assert_eq!(refused.headers().contains_key("grpc-status"), grpc);
        assert_eq!(refused.status() == StatusCode::SERVICE_UNAVAILABLE, !grpc);
    }
}

/// Priority classes are shares of the count: without a count they never refuse, and a
/// class whose share of the smallest count rounds to 0 would refuse every request of its
/// class with nothing in flight. Both are errors that name the class and the count to
/// reach; at that count, the build succeeds.
#[test]
fn priority_classes_that_could_never_or_always_refuse_are_errors() {
    use admission_tower::{Classes, Priority};
    let priority = |builder: admission_tower::AdmissionBuilder| {
        builder
            .priority(Classes::standard(), |_, _| Priority::DEFAULT)
            .build()
    };
    assert_eq!(
        priority(AdmissionLayer::builder()).unwrap_err(),
        BuildError::PriorityWithoutCount
    );
    let error = priority(AdmissionLayer::builder().count(1)).unwrap_err();
    assert_eq!(
        error,
        BuildError::ClassShareRoundsToZero {
            class: "default".into(),
            share: 90,
            limit: 1
        }
    );
    assert!(error.to_string().contains("at least 2"), "{error}");
    // sheddable (70%) rounds to 0 up to a count of 1 only: 2 × 70% = 1.4.
    assert!(priority(AdmissionLayer::builder().count(2)).is_ok());
    // An adaptive limit is checked at its minimum.
    let adaptive = |min| {
        AdmissionLayer::builder()
            .adaptive(AdaptiveLimit::builder(Gradient::default()).bounds(min, 100))
    };
    assert!(matches!(
        priority(adaptive(1)).unwrap_err(),
        BuildError::ClassShareRoundsToZero { limit: 1, .. }
    ));
    assert!(priority(adaptive(2)).is_ok());
    // A shared gate, at its count.
    let shared = |count| {
        let gate: Gate = Gate::builder().count(count).build().unwrap();
        AdmissionLayer::from_gate(gate)
            .priority(Classes::standard(), |_, _| Priority::DEFAULT)
            .build()
    };
    assert_eq!(shared(0).unwrap_err(), BuildError::PriorityWithoutCount);
    assert!(shared(2).is_ok());
}

/// Retries are shed at a share of their class's share of the count: without a count
/// they never are, a share outside 1 to 100 means nothing, and a class whose retries'
/// share of the smallest count rounds to 0 would refuse them all with nothing in flight.
#[test]
fn retries_that_could_never_or_always_be_refused_are_errors() {
    use admission_tower::{Classes, Priority, Retries};
    let retries = |builder: admission_tower::AdmissionBuilder, share| {
        builder.retries(Retries::grpc().share(share)).build()
    };
    assert_eq!(
        retries(AdmissionLayer::builder(), 80).unwrap_err(),
        BuildError::RetriesWithoutCount
    );
    for share in [0, 101, 255] {
        let error = retries(AdmissionLayer::builder().count(8), share).unwrap_err();
        assert_eq!(error, BuildError::RetryShare(share));
        assert!(error.to_string().contains("between 1 and 100"), "{error}");
    }
    assert!(retries(AdmissionLayer::builder().count(100), 1).is_ok());
    assert!(retries(AdmissionLayer::builder().count(8), 100).is_ok());
    // Without classes, the one class may fill the count: 80% of 1 rounds to 0.
    let error = retries(AdmissionLayer::builder().count(1), 80).unwrap_err();
    assert_eq!(
        error,
        BuildError::RetryShareRoundsToZero {
            class: None,
            share: 80,
            limit: 1
        }
    );
    assert!(error.to_string().contains("at least 2"), "{error}");
    assert!(retries(AdmissionLayer::builder().count(2), 80).is_ok());
    // With classes, the least important's: half of sheddable's 70% is 35%, 0.7 at 2.
    let classed = |count| {
        AdmissionLayer::builder()
            .count(count)
            .priority(Classes::standard(), |_, _| Priority::DEFAULT)
    };
    let error = retries(classed(2), 50).unwrap_err();
    assert_eq!(
        error,
        BuildError::RetryShareRoundsToZero {
            class: Some("sheddable".into()),
            share: 35,
            limit: 2
        }
    );
    let message = error.to_string();
    assert!(
        message.contains("`sheddable`") && message.contains("at least 3"),
        "{message}"
    );
    assert!(retries(classed(3), 50).is_ok());
    // An adaptive limit is checked at its minimum, a shared gate at its count.
    let adaptive = |min| {
        AdmissionLayer::builder()
            .adaptive(AdaptiveLimit::builder(Gradient::default()).bounds(min, 100))
    };
    assert!(matches!(
        retries(adaptive(1), 80).unwrap_err(),
        BuildError::RetryShareRoundsToZero { limit: 1, .. }
    ));
    assert!(retries(adaptive(2), 80).is_ok());
    let shared = |count| {
        let gate: Gate = Gate::builder().count(count).build().unwrap();
        AdmissionLayer::from_gate(gate)
            .retries(Retries::grpc())
            .build()
    };
    assert_eq!(shared(0).unwrap_err(), BuildError::RetriesWithoutCount);
    assert!(shared(2).is_ok());
}

/// A wait needs a count to wait for, and room for one waiter for some time.
#[test]
fn a_wait_that_could_never_wait_is_an_error() {
    use admission_tower::Wait;
    use std::time::Duration;
    let ms = Duration::from_millis(10);
    assert_eq!(
        AdmissionLayer::builder()
            .bytes(1 << 20)
            .wait(Wait::new(8, ms))
            .build()
            .unwrap_err(),
        BuildError::WaitWithoutCount
    );
    assert_eq!(
        AdmissionLayer::builder()
            .count(4)
            .wait(Wait::new(0, ms))
            .build()
            .unwrap_err(),
        BuildError::EmptyWait("max_waiting")
    );
    assert_eq!(
        AdmissionLayer::builder()
            .count(4)
            .wait(Wait::new(8, Duration::ZERO))
            .build()
            .unwrap_err(),
        BuildError::EmptyWait("max_wait")
    );
    let adaptive = AdaptiveLimit::builder(Gradient::default());
    let layer = AdmissionLayer::builder()
        .adaptive(adaptive)
        .wait(Wait::new(8, ms))
        .build()
        .unwrap();
    assert_eq!(layer.gate().count().max_waiting(), 8);
    assert!(
        BuildError::EmptyWait("max_wait")
            .to_string()
            .contains("leave `wait` out")
    );
}

/// The READMEs state the connection bounds' defaults in words: the words are the
/// constants'.
#[test]
fn the_readmes_state_the_connection_defaults_the_constants_hold() {
    let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    let head = ConnectionLimits::HEAD_WITHIN.as_secs();
    let idle = ConnectionLimits::IDLE.as_secs();
    let streams = ConnectionLimits::MAX_STREAMS;
    let defaults = ConnectionLimits::default();
    assert_eq!(defaults.head_within(), Some(ConnectionLimits::HEAD_WITHIN));
    assert_eq!(defaults.idle(), Some(ConnectionLimits::IDLE));
    assert_eq!(defaults.ping(), Some(ConnectionLimits::PING));
    assert_eq!(defaults.max_streams(), Some(streams));
    assert_eq!(
        defaults.max_header_bytes(),
        ConnectionLimits::MAX_HEADER_BYTES
    );
    let root = words(include_str!("../../../README.md"));
    let said = format!("({head} s to a complete request head, {idle} s idle, {streams} streams");
    assert!(root.contains(&said), "the README does not say {said:?}");
    let crate_readme = words(include_str!("../../README.md"));
    for said in [
        format!("{head} s from the accept to a complete request head"),
        format!("{idle} s idle, {streams} h2 streams a connection"),
    ] {
        assert!(
            crate_readme.contains(&said),
            "admission-tower's README does not say {said:?}"
        );
    }
}
