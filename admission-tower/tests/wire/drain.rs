//! Graceful drain on a real axum server, shut down in the middle of a burst, with hyper's
//! pooled client: every admitted request completes whole, every later one is refused
//! (503 + `Retry-After` + `connection: close`), and the drain completes only once the
//! last admitted response body has ended.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{ChannelBody, eventually};
use admission_tower::AdmissionLayer;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{mpsc, oneshot};

const CHUNK: &[u8] = b"chunk\n";
const CHUNKS: usize = 3;

#[derive(Default)]
struct Counters {
    /// Handler runs: admitted requests.
    started: AtomicUsize,
    /// Response bodies whose every chunk the handler has handed over.
    produced: AtomicUsize,
}

/// Answers at once with a body that streams `CHUNKS` chunks, 60 ms apart: the request
/// stays in flight (its permit held) until the last one is sent.
async fn slow(State(counters): State<Arc<Counters>>) -> Response<Body> {
    counters.started.fetch_add(1, Ordering::SeqCst);
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        for _ in 0..CHUNKS {
            tokio::time::sleep(Duration::from_millis(60)).await;
            if tx.send(Bytes::from_static(CHUNK)).await.is_err() {
                return;
            }
        }
        counters.produced.fetch_add(1, Ordering::SeqCst);
    });
    Response::new(Body::new(ChannelBody::new(rx)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_shut_down_mid_burst_finishes_every_admitted_request_and_refuses_the_rest() {
    let admission = AdmissionLayer::builder().count(64).build().unwrap();
    let counters = Arc::new(Counters::default());
    let app = Router::new()
        .route("/work", get(slow))
        .with_state(counters.clone())
        .layer(admission.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();

    // The shutdown signal: drain, then let axum's graceful shutdown close connections.
    // What the server had in flight, and had produced, when the drain completed:
    let (signal, signalled) = oneshot::channel::<()>();
    let at_drain = Arc::new(Mutex::new(None));
    let server = {
        let (admission, counters, at_drain) =
            (admission.clone(), counters.clone(), at_drain.clone());
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = signalled.await;
            admission.drain().await;
            let in_flight = admission.snapshot().gate.count.in_flight;
            let produced = counters.produced.load(Ordering::SeqCst);
            *at_drain.lock().unwrap() = Some((in_flight, produced));
        });
        tokio::spawn(async move { serve.await })
    };

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let url = format!("http://{addr}/work");
    let get = |client: &Client<_, Full<Bytes>>| {
        let request = Request::get(&url).body(Full::default()).unwrap();
        client.request(request)
    };

    // The first half of the burst, admitted and streaming.
    const ADMITTED: usize = 16;
    let mut streams = Vec::new();
    for _ in 0..ADMITTED {
        let response = get(&client);
        streams.push(tokio::spawn(async move {
            let response = response.await.expect("an admitted request is answered");
            let status = response.status();
            let body = response.into_body().collect().await.map(|b| b.to_bytes());
            (status, body)
        }));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    eventually("the first half is admitted", || {
        counters.started.load(Ordering::SeqCst) == ADMITTED
    })
    .await;
    assert_eq!(admission.snapshot().gate.count.in_flight, ADMITTED as u64);

    // Shutdown begins mid-burst: the second half is refused, each telling its client to
    // go elsewhere, while the first half still streams.
    signal.send(()).unwrap();
    eventually("the layer is closed", || admission.snapshot().gate.closed).await;
    for _ in 0..8 {
        let refused = get(&client).await.expect("a refusal, not a reset");
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.headers()["retry-after"], "1");
        assert_eq!(refused.headers()["connection"], "close");
        assert!(
            counters.produced.load(Ordering::SeqCst) < ADMITTED,
            "not mid-burst"
        );
    }

    // Every admitted request completes whole: none is cut off by the shutdown.
    for stream in streams {
        let (status, body) = stream.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body.expect("the body is not cut off"), CHUNK.repeat(CHUNKS));
    }
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server stops once drained")
        .unwrap()
        .unwrap();
    // The drain completed only when the last admitted body had ended, and no refused
    // request reached the handler.
    assert_eq!(*at_drain.lock().unwrap(), Some((0, ADMITTED)));
    assert_eq!(counters.started.load(Ordering::SeqCst), ADMITTED);
    assert_eq!(admission.snapshot().gate.count.refused, 8);
}

/// A drain given a deadline: an open stream keeps a plain drain pending for ever; the
/// deadline ends the wait, says what is still in flight, and leaves the layer closed.
/// Once the stream ends, the same call completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_with_a_deadline_reports_an_open_stream_and_completes_once_it_ends() {
    let admission = AdmissionLayer::builder().count(8).build().unwrap();
    let (tx, rx) = mpsc::channel::<Bytes>(1);
    let stream = Arc::new(Mutex::new(Some(rx)));
    let app = Router::new()
        .route(
            "/events",
            get(move || {
                let rx = stream.lock().unwrap().take().expect("one stream");
                async move { Response::new(Body::new(ChannelBody::new(rx))) }
            }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(admission.clone());
    let addr = crate::support::serve(app).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let get = |path: &str| {
        Request::get(format!("http://{addr}{path}"))
            .body(Full::default())
            .unwrap()
    };
    let events = client.request(get("/events")).await.unwrap();
    assert_eq!(events.status(), StatusCode::OK);

    let undrained = admission
        .drain_within(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert_eq!(undrained.requests, 1);
    assert!(undrained.to_string().contains("1 admitted"), "{undrained}");
    let refused = client.request(get("/")).await.unwrap();
    assert_eq!(
        refused.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "still closed"
    );

    drop(tx); // the stream ends
    let body = events.into_body().collect().await.unwrap().to_bytes();
    assert!(body.is_empty());
    admission
        .drain_within(Duration::from_secs(5))
        .await
        .expect("drained once the stream ended");
}
