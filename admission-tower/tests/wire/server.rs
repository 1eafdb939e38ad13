//! The layer in front of a real hyper server on loopback, with a real hyper client.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::support::{
    Seen, app, eventually, get, next_chunk, post, send, serve, text, with_header,
};
use admission_tower::{AdmissionLayer, AdmissionSnapshot, Key, PerKey};
use bytes::Bytes;
use http::StatusCode;
use tower::Layer;

fn in_flight(layer: &AdmissionLayer) -> u64 {
    layer.gate().count().in_flight()
}

/// Every ledger of the layer reads zero.
fn assert_idle(layer: &AdmissionLayer) {
    let AdmissionSnapshot { gate, .. } = layer.snapshot();
    assert_eq!(gate.count.in_flight, 0, "count ledger");
    if let Some(bytes) = gate.bytes {
        assert_eq!(bytes.in_flight, 0, "byte ledger");
    }
    if let Some(keyed) = gate.keyed {
        assert_eq!(keyed.keys, 0, "keyed ledger");
    }
}

async fn start(layer: &AdmissionLayer) -> (std::net::SocketAddr, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let addr = serve(layer.layer(app(seen.clone()))).await;
    (addr, seen)
}

#[tokio::test]
async fn at_the_limit_the_next_request_gets_503_with_retry_after_and_neither_service_nor_body_is_touched()
 {
    let layer = AdmissionLayer::builder().count(1).build().unwrap();
    let (addr, seen) = start(&layer).await;

    let mut stream = send(addr, get("/stream")).await;
    assert_eq!(next_chunk(&mut stream).await.unwrap(), "first\n");
    assert_eq!(in_flight(&layer), 1);

    let refused = send(addr, post("/upload", vec![7; 10_000])).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(text(refused).await, "overloaded: count limit reached\n");
    assert_eq!(seen.calls(), 1, "the inner service was not called");
    assert_eq!(
        seen.bodies_read.load(Ordering::SeqCst),
        0,
        "the body was not read"
    );
    assert_eq!(layer.snapshot().gate.count.refused, 1);

    seen.end_streams();
    assert_eq!(next_chunk(&mut stream).await, None);
    eventually("the stream's permit is released", || in_flight(&layer) == 0).await;
    assert_idle(&layer);
}

#[tokio::test]
async fn a_streaming_response_holds_its_permit_after_the_head_and_releases_it_at_the_end() {
    let layer = AdmissionLayer::builder().count(4).build().unwrap();
    let (addr, seen) = start(&layer).await;

    let mut stream = send(addr, get("/stream")).await;
    assert_eq!(
        stream.status(),
        StatusCode::OK,
        "the response future has resolved"
    );
    assert_eq!(next_chunk(&mut stream).await.unwrap(), "first\n");
    assert_eq!(in_flight(&layer), 1, "held while the body streams");

    let tx = seen.streams.lock().unwrap()[0].clone();
    tx.send(Bytes::from_static(b"second\n")).await.unwrap();
    assert_eq!(next_chunk(&mut stream).await.unwrap(), "second\n");
    assert_eq!(in_flight(&layer), 1);

    drop(tx);
    seen.end_streams();
    assert_eq!(next_chunk(&mut stream).await, None);
    eventually("released at the end of the body", || in_flight(&layer) == 0).await;
    assert_idle(&layer);
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_frees_its_permit() {
    let layer = AdmissionLayer::builder().count(1).build().unwrap();
    let (addr, seen) = start(&layer).await;

    let mut stream = send(addr, get("/stream")).await;
    assert_eq!(next_chunk(&mut stream).await.unwrap(), "first\n");
    assert_eq!(in_flight(&layer), 1);
    drop(stream); // closes the connection: the server drops the response body

    eventually("the disconnect releases the permit", || {
        in_flight(&layer) == 0
    })
    .await;
    let again = send(addr, get("/")).await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(text(again).await, "ok");
    drop(seen);
    eventually("idle", || in_flight(&layer) == 0).await;
    assert_idle(&layer);
}

#[tokio::test]
async fn liveness_routes_answer_200_while_every_other_route_is_saturated() {
    let layer = AdmissionLayer::builder()
        .count(1)
        .bypass(|req| matches!(req.uri.path(), "/" | "/health"))
        .build()
        .unwrap();
    let (addr, seen) = start(&layer).await;

    let mut stream = send(addr, get("/stream")).await;
    assert_eq!(next_chunk(&mut stream).await.unwrap(), "first\n");
    assert_eq!(
        send(addr, get("/work")).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    for path in ["/health", "/", "/health"] {
        let probe = send(addr, get(path)).await;
        assert_eq!(probe.status(), StatusCode::OK, "{path}");
        assert_eq!(text(probe).await, "ok");
    }
    assert_eq!(in_flight(&layer), 1, "probes hold nothing");

    seen.end_streams();
    drop(stream);
    eventually("idle", || in_flight(&layer) == 0).await;
    assert_idle(&layer);
}

#[tokio::test]
async fn one_key_at_its_cap_gets_429_while_another_key_is_admitted() {
    let layer = AdmissionLayer::builder()
        .per_key(PerKey::new(1, |req| {
            req.headers.get("x-client")?.to_str().ok().map(Key::from)
        }))
        .build()
        .unwrap();
    let (addr, seen) = start(&layer).await;

    let mut held = send(addr, with_header("/stream", "x-client", "noisy")).await;
    assert_eq!(next_chunk(&mut held).await.unwrap(), "first\n");

    let refused = send(addr, with_header("/", "x-client", "noisy")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1");
    let other = send(addr, with_header("/", "x-client", "quiet")).await;
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(text(other).await, "ok");
    let anonymous = send(addr, get("/")).await;
    assert_eq!(anonymous.status(), StatusCode::OK, "no key, no key limit");
    text(anonymous).await;

    seen.end_streams();
    drop(held);
    eventually("the key's entry is reclaimed", || {
        layer.gate().keyed().unwrap().keys() == 0
    })
    .await;
    assert_idle(&layer);
}

#[tokio::test]
async fn a_body_above_the_maximum_gets_413_without_being_read() {
    let layer = AdmissionLayer::builder()
        .bytes(100_000)
        .max_request_bytes(1_000)
        .build()
        .unwrap();
    let (addr, seen) = start(&layer).await;

    let refused = send(addr, post("/upload", vec![1; 5_000])).await;
    assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(refused.headers().get("retry-after").is_none());
    assert_eq!(seen.calls(), 0);
    assert_eq!(seen.bodies_read.load(Ordering::SeqCst), 0);

    let fits = send(addr, post("/upload", vec![1; 1_000])).await;
    assert_eq!(fits.status(), StatusCode::OK);
    assert_eq!(text(fits).await, "1000");
    eventually("idle", || layer.gate().bytes().unwrap().in_flight() == 0).await;
    assert_idle(&layer);
}

#[tokio::test]
async fn concurrent_bodies_past_the_budget_get_503_and_a_lone_oversized_one_is_admitted() {
    let layer = AdmissionLayer::builder().bytes(1_000).build().unwrap();
    let (addr, seen) = start(&layer).await;
    let bytes = layer.gate().bytes().unwrap().clone();

    // The lone-request exemption: an idle server admits one request above the budget.
    let lone = send(addr, post("/upload", vec![1; 3_000])).await;
    assert_eq!(lone.status(), StatusCode::OK);
    assert_eq!(text(lone).await, "3000");
    eventually("idle after the lone request", || bytes.in_flight() == 0).await;

    // A streaming response holds its request's 800-byte charge until it ends...
    let held = http::Request::get("/stream")
        .header("content-length", "800")
        .body(http_body_util::Full::new(Bytes::from(vec![0; 800])))
        .unwrap();
    let mut held = send(addr, held).await;
    assert_eq!(next_chunk(&mut held).await.unwrap(), "first\n");
    assert_eq!(bytes.in_flight(), 800);
    // ...so a second 800-byte body is past the budget.
    let refused = send(addr, post("/upload", vec![2; 800])).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(
        seen.bodies_read.load(Ordering::SeqCst),
        1,
        "only the lone request's"
    );

    seen.end_streams();
    drop(held);
    eventually("the charge is released with the body", || {
        bytes.in_flight() == 0
    })
    .await;
    assert_idle(&layer);
}

/// Sends `/upload` with a chunked body of `chunks`, and returns the response.
async fn upload_chunked(
    addr: std::net::SocketAddr,
    chunks: &[usize],
) -> http::Response<hyper::body::Incoming> {
    let (tx, rx) = tokio::sync::mpsc::channel(chunks.len().max(1));
    for &n in chunks {
        tx.send(Bytes::from(vec![3; n])).await.unwrap();
    }
    drop(tx);
    // A channel-fed client body has no length: hyper sends it chunked.
    let request = http::Request::post("/upload")
        .body(crate::support::ChannelBody::new(rx))
        .unwrap();
    send(addr, request).await
}

#[tokio::test]
async fn a_chunked_body_refused_by_the_budget_mid_stream_gets_503_with_retry_after_not_the_handlers_answer()
 {
    let layer = AdmissionLayer::builder().bytes(1_000).build().unwrap();
    let (addr, seen) = start(&layer).await;
    let bytes = layer.gate().bytes().unwrap().clone();
    let other = bytes.try_charge(900).unwrap();

    let response = upload_chunked(addr, &[50, 100]).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(
        response.headers()["connection"],
        "close",
        "the rest of the body is unread"
    );
    assert_eq!(text(response).await, "overloaded: byte budget exhausted\n");
    assert_eq!(
        seen.body_errors.load(Ordering::SeqCst),
        1,
        "the handler saw the body fail, and its answer (507) was replaced"
    );
    assert_eq!(layer.snapshot().gate.bytes.unwrap().refused, 1);
    drop(other);
    eventually("idle", || bytes.in_flight() == 0).await;
    assert_idle(&layer);
}

#[tokio::test]
async fn a_chunked_body_past_the_maximum_mid_stream_gets_413_without_retry_after() {
    let layer = AdmissionLayer::builder()
        .max_request_bytes(100)
        .build()
        .unwrap();
    let (addr, seen) = start(&layer).await;

    let response = upload_chunked(addr, &[60, 60]).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(response.headers().get("retry-after").is_none());
    assert_eq!(text(response).await, "request too large\n");
    assert_eq!(seen.body_errors.load(Ordering::SeqCst), 1);

    let fits = upload_chunked(addr, &[60, 40]).await;
    assert_eq!(fits.status(), StatusCode::OK);
    assert_eq!(text(fits).await, "100");
    eventually("idle", || layer.gate().bytes().unwrap().in_flight() == 0).await;
    assert_idle(&layer);
}

/// A response body with nothing to send that reads the count ledger when it is dropped.
struct ReadsCountOnDrop {
    ledger: admission_core::CountLedger,
    read: Arc<std::sync::atomic::AtomicU64>,
}

impl http_body::Body for ReadsCountOnDrop {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(None)
    }
}

impl Drop for ReadsCountOnDrop {
    fn drop(&mut self) {
        self.read.store(self.ledger.in_flight(), Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_handlers_answer_replaced_by_a_mid_stream_refusal_is_dropped_before_its_permits() {
    let layer = AdmissionLayer::builder()
        .count(4)
        .bytes(1_000)
        .build()
        .unwrap();
    let read = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
    let (ledger, at_drop) = (layer.gate().count().clone(), read.clone());
    let handler = tower::service_fn(
        move |req: http::Request<admission_http::MeteredBody<hyper::body::Incoming>>| {
            let (ledger, read) = (ledger.clone(), at_drop.clone());
            async move {
                use http_body_util::BodyExt;
                assert!(
                    req.into_body().collect().await.is_err(),
                    "the body is refused"
                );
                let body = ReadsCountOnDrop { ledger, read };
                Ok::<_, std::convert::Infallible>(http::Response::new(body))
            }
        },
    );
    let addr = serve(layer.layer(handler)).await;
    let bytes = layer.gate().bytes().unwrap().clone();
    let other = bytes.try_charge(900).unwrap();

    let response = upload_chunked(addr, &[50, 100]).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        read.load(Ordering::SeqCst),
        1,
        "the handler's answer went while its request still held its count permit"
    );
    drop(other);
    eventually("idle", || bytes.in_flight() == 0 && in_flight(&layer) == 0).await;
    assert_idle(&layer);
}
