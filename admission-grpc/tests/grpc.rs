//! A real tonic server on loopback behind the admission layer (or an interceptor), and
//! real tonic and hyper clients.

mod support;

use std::time::Duration;

use admission_core::Gate;
use admission_grpc::{AdmissionInterceptor, RefusalCode, is_health_check, refusals, refusals_with};
use admission_tower::AdmissionLayer;
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::{Batch, State, ack, channel, eventually, hold, put, serve};
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic_types::StatusExt;

const RETRY: Duration = Duration::from_millis(250);

fn grpc_layer(count: usize, code: RefusalCode) -> AdmissionLayer {
    AdmissionLayer::builder()
        .count(count)
        .bypass(is_health_check)
        .refusals(refusals_with(code).retry_after(RETRY))
        .build()
        .unwrap()
}

fn byte_layer(budget: Option<u64>, max: Option<u64>, code: RefusalCode) -> AdmissionLayer {
    AdmissionLayer::builder()
        .bytes(budget)
        .max_request_bytes(max)
        .bypass(is_health_check)
        .refusals(refusals_with(code).retry_after(RETRY))
        .build()
        .unwrap()
}

/// Asserts `status` is the retryable refusal `code` with pushback and `RetryInfo`.
fn assert_retryable(status: &tonic::Status, code: Code, reason: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(status.message(), format!("admission refused: {reason}"));
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "250"
    );
    let retry = status.get_details_retry_info().expect("RetryInfo");
    assert_eq!(retry.retry_delay, Some(RETRY));
}

/// Asserts `status` is a request too large: `RESOURCE_EXHAUSTED` without a retry hint.
fn assert_too_large(status: &tonic::Status) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), "admission refused: request too large");
    assert!(status.metadata().get("grpc-retry-pushback-ms").is_none());
    assert!(status.get_details_retry_info().is_none());
}

async fn start(layer: &AdmissionLayer, state: &std::sync::Arc<State>) -> std::net::SocketAddr {
    let (layer, batch) = (layer.clone(), Batch(state.clone()));
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    serve(move |incoming| async move {
        let _reporter = reporter; // the health service answers while this lives
        Server::builder()
            .layer(layer)
            .add_service(health)
            .add_service(batch)
            .serve_with_incoming(incoming)
            .await
    })
    .await
}

fn in_flight(layer: &AdmissionLayer) -> u64 {
    layer.gate().count().in_flight()
}

#[tokio::test]
async fn a_saturated_unary_method_fails_at_once_with_resource_exhausted_and_retry_info() {
    let layer = grpc_layer(1, RefusalCode::ResourceExhausted);
    let state = State::new(1000);
    let addr = start(&layer, &state).await;
    let channel = channel(addr).await;

    let held = layer.gate().count().try_acquire().unwrap();
    let status = put(&channel, "work", &[]).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "admission refused: count limit reached");
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "250"
    );
    let retry = status
        .get_details_retry_info()
        .expect("RetryInfo in the details");
    assert_eq!(retry.retry_delay, Some(RETRY));
    assert_eq!(state.calls(), 0, "the handler did not run");

    drop(held);
    assert_eq!(put(&channel, "work", &[]).await.unwrap().status, 1);
    assert_eq!(state.calls(), 1);
    eventually("idle", || in_flight(&layer) == 0).await;
}

#[tokio::test]
async fn the_unavailable_option_yields_unavailable() {
    let layer = grpc_layer(1, RefusalCode::Unavailable);
    let state = State::new(1000);
    let addr = start(&layer, &state).await;
    let channel = channel(addr).await;

    let held = layer.gate().count().try_acquire().unwrap();
    let status = put(&channel, "work", &[]).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.get_details_retry_info().unwrap().retry_delay,
        Some(RETRY)
    );
    drop(held);
    assert_eq!(in_flight(&layer), 0);
}

#[tokio::test]
async fn a_server_stream_holds_its_permit_until_it_ends_and_a_cancel_frees_it() {
    let layer = grpc_layer(2, RefusalCode::ResourceExhausted);
    let state = State::new(1000);
    let addr = start(&layer, &state).await;
    let channel = channel(addr).await;

    let mut stream = hold(&channel).await.unwrap();
    assert_eq!(stream.message().await.unwrap().unwrap().status, 1);
    assert_eq!(
        in_flight(&layer),
        1,
        "held after the response head, while it streams"
    );
    let tx = state.streams.lock().unwrap()[0].clone();
    tx.send(Ok(tonic_health::pb::HealthCheckResponse { status: 2 }))
        .await
        .unwrap();
    assert_eq!(stream.message().await.unwrap().unwrap().status, 2);
    assert_eq!(in_flight(&layer), 1);
    drop(tx);
    state.end_streams();
    assert!(
        stream.message().await.unwrap().is_none(),
        "the stream ended"
    );
    eventually("released at the end of the stream", || {
        in_flight(&layer) == 0
    })
    .await;

    let mut cancelled = hold(&channel).await.unwrap();
    assert!(cancelled.message().await.unwrap().is_some());
    assert_eq!(in_flight(&layer), 1);
    drop(cancelled); // the client cancels mid-stream
    eventually("the cancel frees the permit", || in_flight(&layer) == 0).await;
    state.end_streams();
}

#[tokio::test]
async fn the_health_service_answers_while_other_methods_are_saturated() {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let layer = grpc_layer(1, RefusalCode::ResourceExhausted);
    let state = State::new(1000);
    let addr = start(&layer, &state).await;
    let channel = channel(addr).await;

    let mut stream = hold(&channel).await.unwrap();
    assert!(stream.message().await.unwrap().is_some());
    let status = put(&channel, "work", &[]).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    for _ in 0..3 {
        let reply = HealthClient::new(channel.clone())
            .check(HealthCheckRequest::default())
            .await
            .unwrap();
        assert_eq!(reply.into_inner().status, 1);
    }
    assert_eq!(in_flight(&layer), 1, "health checks hold nothing");
    drop(stream);
    state.end_streams();
    eventually("idle", || in_flight(&layer) == 0).await;
}

#[tokio::test]
async fn the_interceptor_refuses_by_key_and_the_permit_reaches_the_handler() {
    let gate: Gate = Gate::builder().count(8).per_key(1).build().unwrap();
    let interceptor = AdmissionInterceptor::new(gate.clone())
        .key(admission_grpc::key::metadata("x-subject"))
        .retry_after(RETRY);
    let state = State::new(1000);
    let batch = InterceptedService::new(Batch(state.clone()), interceptor);
    let addr = serve(move |incoming| {
        Server::builder()
            .add_service(batch)
            .serve_with_incoming(incoming)
    })
    .await;
    let channel = channel(addr).await;

    let busy = gate
        .keyed()
        .unwrap()
        .try_acquire(&admission_core::Key::from("alice"))
        .unwrap();
    let status = put(&channel, "w", &[("x-subject", "alice")])
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "admission refused: per-key limit reached");
    assert_eq!(
        status.get_details_retry_info().unwrap().retry_delay,
        Some(RETRY)
    );
    assert_eq!(state.calls(), 0);

    put(&channel, "w", &[("x-subject", "bob")]).await.unwrap();
    assert_eq!(state.calls(), 1);
    assert_eq!(
        state.with_permit.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the handler saw the permit in its request's extensions"
    );
    drop(busy);
    eventually("the handler's permit is released", || {
        gate.count().in_flight() == 0 && gate.keyed().unwrap().keys() == 0
    })
    .await;
}

#[tokio::test]
async fn a_charge_refused_inside_a_handler_reports_resource_exhausted_with_retry_info() {
    let layer = grpc_layer(8, RefusalCode::ResourceExhausted);
    let state = State::new(100);
    let addr = start(&layer, &state).await;
    let channel = channel(addr).await;

    assert_eq!(put(&channel, &"x".repeat(60), &[]).await.unwrap().status, 1);
    let busy = state.decoded.try_charge(60).unwrap();
    let status = put(&channel, &"x".repeat(60), &[]).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "admission refused: byte budget exhausted");
    assert_eq!(
        status.get_details_retry_info().unwrap().retry_delay,
        Some(Duration::from_millis(300))
    );
    assert_eq!(state.calls(), 2, "the handler ran and refused");
    drop(busy);
    assert_eq!(state.decoded.in_flight(), 0);
    eventually("idle", || in_flight(&layer) == 0).await;
}

#[tokio::test]
async fn the_refusal_is_trailers_only_on_the_wire() {
    let layer = grpc_layer(1, RefusalCode::ResourceExhausted);
    let state = State::new(1000);
    let addr = start(&layer, &state).await;
    let held = layer.gate().count().try_acquire().unwrap();

    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    // One gRPC message frame: uncompressed, empty protobuf.
    let request = http::Request::post(format!("http://{addr}{}", support::PUT))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(&[
            0, 0, 0, 0, 0,
        ])))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .unwrap()
        .unwrap();

    assert_eq!(response.status(), 200);
    let headers = response.headers();
    assert_eq!(headers["content-type"], "application/grpc");
    assert_eq!(headers["grpc-status"], "8");
    assert_eq!(
        headers["grpc-message"],
        "admission%20refused:%20count%20limit%20reached"
    );
    assert_eq!(headers["grpc-retry-pushback-ms"], "250");
    assert!(headers.contains_key("grpc-status-details-bin"));
    assert!(
        response.body().is_end_stream(),
        "END_STREAM on the HEADERS frame: nothing follows"
    );
    let collected = response.into_body().collect().await.unwrap();
    assert!(collected.trailers().is_none(), "no trailers frame");
    assert!(collected.to_bytes().is_empty(), "no DATA frame");
    assert_eq!(state.calls(), 0);
    drop(held);
    assert_eq!(in_flight(&layer), 0);
}

#[tokio::test]
async fn a_unary_request_refused_by_the_byte_budget_as_it_streams_gets_the_refusal_code_with_retry_info()
 {
    for code in [RefusalCode::ResourceExhausted, RefusalCode::Unavailable] {
        let layer = byte_layer(Some(1_000), None, code);
        let state = State::new(1_000_000);
        let addr = start(&layer, &state).await;
        let channel = channel(addr).await;
        let budget = layer.gate().bytes().unwrap().clone();

        // tonic sends no content-length: the charge comes as the message arrives.
        let others = budget.try_charge(900).unwrap();
        let status = put(&channel, &"x".repeat(200), &[]).await.unwrap_err();
        assert_retryable(&status, code.code(), "byte budget exhausted");
        assert_eq!(state.calls(), 0, "the handler never saw the request");

        drop(others);
        assert_eq!(
            put(&channel, &"x".repeat(200), &[]).await.unwrap().status,
            1
        );
        eventually("idle", || budget.in_flight() == 0).await;
    }
}

#[tokio::test]
async fn a_unary_request_too_large_as_it_streams_gets_resource_exhausted_without_retry_hint() {
    let layer = byte_layer(None, Some(500), RefusalCode::Unavailable);
    let state = State::new(1_000_000);
    let addr = start(&layer, &state).await;
    let channel = channel(addr).await;

    let status = put(&channel, &"x".repeat(600), &[]).await.unwrap_err();
    assert_too_large(&status);
    assert_eq!(
        put(&channel, &"x".repeat(400), &[]).await.unwrap().status,
        1
    );
    let bytes = layer.gate().bytes().unwrap().clone();
    eventually("idle", || bytes.in_flight() == 0).await;
}

#[tokio::test]
async fn a_bidi_stream_that_answered_first_ends_with_the_refusal_status_when_its_body_is_refused() {
    let layer = byte_layer(Some(1_000), Some(700), RefusalCode::ResourceExhausted);
    let state = State::new(1_000_000);
    let addr = start(&layer, &state).await;
    let channel = channel(addr).await;
    let budget = layer.gate().bytes().unwrap().clone();

    // Over the budget on the third message: two acknowledgements, then the refusal.
    let others = budget.try_charge(600).unwrap();
    let (tx, acks) = ack(&channel).await;
    let mut acks = acks.unwrap();
    for payload in ["a".repeat(100), "b".repeat(100)] {
        tx.send(payload).await.unwrap();
        assert_eq!(acks.message().await.unwrap().unwrap().status, 100);
    }
    tx.send("c".repeat(300)).await.unwrap();
    let status = acks.message().await.unwrap_err();
    assert_retryable(&status, Code::ResourceExhausted, "byte budget exhausted");
    drop((tx, acks, others));

    // Past the maximum size on the second message.
    let (tx, acks) = ack(&channel).await;
    let mut acks = acks.unwrap();
    tx.send("a".repeat(400)).await.unwrap();
    assert_eq!(acks.message().await.unwrap().unwrap().status, 400);
    tx.send("b".repeat(400)).await.unwrap();
    assert_too_large(&acks.message().await.unwrap_err());
    drop(acks);
    eventually("idle", || budget.in_flight() == 0).await;
}

/// Two services on one tonic server, each behind limits of its own (`NamedAdmission`):
/// one full does not refuse the other, and one draining answers `UNAVAILABLE` while the
/// other still answers `RESOURCE_EXHAUSTED` for its own limit.
#[tokio::test]
async fn two_services_on_one_server_keep_limits_of_their_own() {
    use admission_grpc::NamedAdmission;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let batch_limit = AdmissionLayer::builder()
        .count(1)
        .refusals(refusals().retry_after(RETRY))
        .build()
        .unwrap();
    let health_limit = AdmissionLayer::builder()
        .count(2)
        .refusals(refusals())
        .build()
        .unwrap();
    let state = State::new(1000);
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let (batch, health) = (
        NamedAdmission::new(&batch_limit, Batch(state.clone())),
        NamedAdmission::new(&health_limit, health),
    );
    let addr = serve(move |incoming| {
        Server::builder()
            .add_service(batch)
            .add_service(health)
            .serve_with_incoming(incoming)
    })
    .await;
    let channel = channel(addr).await;
    let check = || {
        let mut client = HealthClient::new(channel.clone());
        async move { client.check(HealthCheckRequest::default()).await }
    };

    // Batch's one slot is held by a stream: Batch refuses, Health answers.
    let stream = hold(&channel).await.unwrap();
    let status = put(&channel, "w", &[]).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "admission refused: count limit reached");
    assert_eq!(check().await.unwrap().into_inner().status, 1);
    assert_eq!(health_limit.snapshot().gate.count.high_water, 1);
    assert_eq!(batch_limit.snapshot().gate.count.refused, 1);

    // Health drains (its server is going away): UNAVAILABLE, with pushback. Batch is
    // unaffected and still refuses for its own limit.
    let drain = health_limit.drain();
    let status = check().await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "admission refused: closed to new work");
    assert!(status.metadata().get("grpc-retry-pushback-ms").is_some());
    drain.await;
    let status = put(&channel, "w", &[]).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);

    drop(stream);
    state.end_streams();
    eventually("batch's slot is free", || {
        batch_limit.snapshot().gate.count.in_flight == 0
    })
    .await;
    put(&channel, "w", &[]).await.unwrap();
    assert_eq!(state.calls(), 1);
}

#[tokio::test]
async fn a_call_stating_a_sheddable_class_is_shed_first_and_a_critical_one_is_served() {
    use admission_grpc::class::METADATA;
    use admission_tower::{Classes, Priority, class};

    let classes = Classes::standard();
    let layer = AdmissionLayer::builder()
        .count(10)
        .priority(classes, class::header(class::HEADER, Priority::DEFAULT))
        .bypass(is_health_check)
        .refusals(refusals().retry_after(RETRY))
        .build()
        .unwrap();
    let state = State::new(1000);
    let addr = start(&layer, &state).await;
    let channel = channel(addr).await;

    // Seven in flight: the sheddable share (70% of 10) is used up.
    let held: Vec<_> = (0..7)
        .map(|_| layer.gate().count().try_acquire().unwrap())
        .collect();
    let status = put(&channel, "prefetch", &[(METADATA, "sheddable")])
        .await
        .unwrap_err();
    assert_retryable(
        &status,
        Code::ResourceExhausted,
        "priority class share reached",
    );
    assert_eq!(state.calls(), 0, "the handler did not run");
    put(&channel, "checkout", &[(METADATA, "critical")])
        .await
        .unwrap();
    put(&channel, "browse", &[]).await.unwrap(); // no class stated: the default (90%)
    assert_eq!(
        layer.refused_by_class(),
        [("critical", 0), ("default", 0), ("sheddable", 1)]
    );
    drop(held);
    eventually("idle", || in_flight(&layer) == 0).await;
}

#[tokio::test]
async fn an_adaptive_limit_learns_overload_from_a_handlers_resource_exhausted() {
    use admission_core::adaptive::{AdaptiveLimit, Aimd};
    let layer = AdmissionLayer::builder()
        .adaptive(
            AdaptiveLimit::builder(Aimd::default().backoff(0.5))
                .initial(16)
                .window(Duration::ZERO)
                .min_samples(1),
        )
        .bypass(is_health_check)
        .build()
        .unwrap();
    // The handler charges the decoded request against 8 bytes of its own: one that does
    // not fit gets RESOURCE_EXHAUSTED from the handler, a trailers-only response.
    let state = State::new(8);
    let addr = start(&layer, &state).await;
    let channel = channel(addr).await;
    let windows = |layer: &AdmissionLayer| layer.snapshot().adaptive.unwrap().windows;

    put(&channel, "fits", &[]).await.unwrap();
    eventually("a sample", || windows(&layer) == 1).await;
    let snapshot = layer.snapshot().adaptive.unwrap();
    assert_eq!(snapshot.last.unwrap().overloaded, 0);
    assert_eq!(
        snapshot.limit, 16,
        "one call in flight does not use the limit: no growth"
    );

    // (A lone charge is admitted however large: hold one, so the next is refused.)
    let _held = state.decoded.try_charge(4).unwrap();
    let status = put(&channel, "much more than eight", &[])
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    eventually("a sample", || windows(&layer) == 2).await;
    let snapshot = layer.snapshot().adaptive.unwrap();
    assert_eq!(
        snapshot.last.unwrap().overloaded,
        1,
        "the handler's overload"
    );
    assert_eq!(snapshot.limit, 8, "halved");

    // Another error code is the caller's problem, not overload.
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let request = tonic::Request::new(tonic_health::pb::HealthCheckRequest::default());
    let path = http::uri::PathAndQuery::from_static("/admission.test.Batch/Nope");
    let codec = tonic_prost::ProstCodec::<
        tonic_health::pb::HealthCheckRequest,
        tonic_health::pb::HealthCheckResponse,
    >::default();
    let status = grpc.unary(request, path, codec).await.unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented);
    eventually("a sample", || windows(&layer) == 3).await;
    assert_eq!(
        layer.snapshot().adaptive.unwrap().last.unwrap().overloaded,
        0
    );
}

/// An inner service that is never ready.
#[derive(Debug, Clone)]
struct NeverReady;

impl<B> tower::Service<http::Request<B>> for NeverReady {
    type Response = http::Response<http_body_util::Empty<bytes::Bytes>>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Pending
    }

    fn call(&mut self, _: http::Request<B>) -> Self::Future {
        unreachable!("never ready, never called")
    }
}

#[test]
fn the_small_parts_do_what_they_say() {
    use admission_grpc::{HandlerPermit, NamedAdmission, class};
    use std::task::{Context, Poll, Waker};
    use tonic::service::Interceptor;
    use tower::Service;

    // The class convention, on the client's side: the metadata entry, or an error and
    // the request unchanged.
    let mut request = tonic::Request::new(());
    class::set(&mut request, "sheddable").unwrap();
    assert_eq!(
        request.metadata().get(class::METADATA).unwrap(),
        "sheddable"
    );
    let mut plain = tonic::Request::new(());
    assert!(class::set(&mut plain, "bad\nclass").is_err());
    assert!(plain.metadata().is_empty());

    // A service behind limits of its own is ready when the service is.
    let layer = AdmissionLayer::builder().count(1).build().unwrap();
    let mut named = NamedAdmission::new(&layer, NeverReady);
    let mut cx = Context::from_waker(Waker::noop());
    let ready: Poll<Result<(), _>> =
        Service::<http::Request<http_body_util::Empty<bytes::Bytes>>>::poll_ready(
            &mut named, &mut cx,
        );
    assert!(ready.is_pending());
    let debug = format!("{named:?}");
    assert!(
        debug.starts_with("NamedAdmission(") && debug.contains("NeverReady"),
        "{debug}"
    );

    // The interceptor and the permit it hands the handler say what they are.
    let gate: Gate = Gate::builder().count(2).build().unwrap();
    let mut interceptor = AdmissionInterceptor::new(gate.clone()).retry_after(RETRY);
    let debug = format!("{interceptor:?}");
    assert!(
        debug.starts_with("AdmissionInterceptor") && debug.contains("retry_after: 250ms"),
        "{debug}"
    );
    let admitted = interceptor.call(tonic::Request::new(())).unwrap();
    let permit = admitted.extensions().get::<HandlerPermit>().unwrap();
    assert_eq!(format!("{permit:?}"), "HandlerPermit { .. }");
    assert_eq!(gate.count().in_flight(), 1);
}

/// The wait for a count slot over gRPC: a call that finds the count full waits and is
/// served when the slot frees; one whose deadline (`grpc-timeout`) leaves no time to wait
/// and answer is refused at once with `RESOURCE_EXHAUSTED` and a retry hint, which the
/// client's retry policy retries (a `DEADLINE_EXCEEDED` would not be).
#[tokio::test]
async fn a_call_waits_for_a_slot_and_one_with_too_close_a_deadline_is_refused_at_once() {
    let layer = AdmissionLayer::builder()
        .count(1)
        .bypass(is_health_check)
        .refusals(refusals_with(RefusalCode::ResourceExhausted).retry_after(RETRY))
        .wait(
            admission_tower::Wait::new(4, Duration::from_secs(5))
                .service_time(Duration::from_millis(50)),
        )
        .build()
        .unwrap();
    let state = State::new(1000);
    let addr = start(&layer, &state).await;
    let channel = channel(addr).await;

    let held = layer.gate().count().try_acquire().unwrap();
    let waiting = {
        let channel = channel.clone();
        tokio::spawn(async move { put(&channel, "work", &[]).await })
    };
    eventually("the call waits", || layer.gate().count().waiting() == 1).await;
    assert_eq!(state.calls(), 0);

    let started = std::time::Instant::now();
    let status = put(&channel, "work", &[("grpc-timeout", "20m")])
        .await
        .unwrap_err();
    assert_retryable(&status, Code::ResourceExhausted, "count limit reached");
    assert!(started.elapsed() < Duration::from_secs(2), "at once");
    assert_eq!(layer.snapshot().wait.deadline, 1);

    drop(held);
    let served = waiting.await.unwrap().expect("served once the slot freed");
    assert_eq!(served.status, 1);
    assert_eq!(state.calls(), 1);
    eventually("idle", || in_flight(&layer) == 0).await;
    assert_eq!(layer.snapshot().wait.admitted, 1);
}

#[tokio::test]
async fn tonic_served_by_the_layers_serve_answers_calls_and_refuses_with_grpc_codes() {
    use tonic::service::Routes;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tower::Layer;

    let layer = grpc_layer(1, RefusalCode::ResourceExhausted);
    let state = State::new(1000);
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let routes = Routes::new(health).add_service(Batch(state.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        layer
            .serve(listener, layer.layer(routes))
            .with_graceful_shutdown(async move { drop(stopped.await) }, Duration::from_secs(1))
            .into_future(),
    );
    let channel = channel(addr).await;

    // A call is answered, one over the count is refused as gRPC refuses, and the
    // connection's bounds hold it (every call went over `serve`'s own h2).
    let mut stream = hold(&channel).await.unwrap();
    assert!(stream.message().await.unwrap().is_some());
    let status = put(&channel, "work", &[]).await.unwrap_err();
    assert_retryable(&status, Code::ResourceExhausted, "count limit reached");
    assert_eq!(
        layer.connections().open(),
        1,
        "one h2 connection, held by serve"
    );
    drop(stream);
    state.end_streams();
    eventually("idle", || in_flight(&layer) == 0).await;
    let reply = HealthClient::new(channel.clone())
        .check(HealthCheckRequest::default())
        .await
        .unwrap();
    assert_eq!(reply.into_inner().status, 1);

    stop.send(()).unwrap();
    let shutdown = server.await.unwrap();
    assert_eq!(shutdown.requests_cut(), 0);
    drop(reporter);
}

#[tokio::test]
async fn a_retry_says_so_in_its_metadata_and_is_shed_before_a_first_attempt() {
    let layer = AdmissionLayer::builder()
        .count(2)
        .retries(admission_tower::Retries::grpc())
        .refusals(refusals().retry_after(RETRY))
        .build()
        .unwrap();
    let state = State::new(1000);
    let addr = start(&layer, &state).await;
    let channel = channel(addr).await;

    // One of two in flight: a retry (80% of 2: 1) is shed, a first attempt is not.
    let held = layer.gate().count().try_acquire().unwrap();
    let retry = [("grpc-previous-rpc-attempts", "1")];
    let status = put(&channel, "again", &retry).await.unwrap_err();
    assert_retryable(
        &status,
        Code::ResourceExhausted,
        "priority class share reached",
    );
    assert_eq!(state.calls(), 0, "the handler did not run");
    assert_eq!(put(&channel, "first", &[]).await.unwrap().status, 1);
    drop(held);
    eventually("idle", || in_flight(&layer) == 0).await;
    assert_eq!(put(&channel, "again", &retry).await.unwrap().status, 1);
    assert_eq!(layer.snapshot().gate.refused_retries, 1);
}
