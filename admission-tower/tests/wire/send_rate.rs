//! Under the servers users already run (`axum::serve`, here), the layer's own response
//! body keeps the minimum send rate: a response the client does not take gives its
//! permits back after its allowance, whether it was never asked for (an h2 window of 0),
//! or asked for and then left (an HTTP/1.1 client that stops reading); an idle event
//! stream and an honest slow reader keep theirs, and a reader under the rate does not.

#![cfg(feature = "axum")]

use std::convert::Infallible;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use admission_tower::{
    AdmissionLayer, ConnectionLimits, MinDataRate, ResponseBody, SlowClients, Stalled,
};
use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioExecutor;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::time::sleep;
use tower::{Layer, ServiceExt};

#[path = "../support/downloads.rs"]
mod downloads;
#[path = "../support/events.rs"]
mod events;
use admission_testkit::h2;

use admission_testkit::{eventually, holds_within, spawn_server};
use events::Heartbeats;
use h2::{ask, slow_reader};

/// 1 KiB/s after a second: the rate of the tests that stall.
fn rate() -> MinDataRate {
    MinDataRate::new(1024, Duration::from_secs(1))
}

/// A layer that admits one request at a time, keeping `slow`.
fn one_at_a_time(slow: SlowClients) -> AdmissionLayer {
    AdmissionLayer::builder()
        .count(1)
        .slow_clients(slow)
        .build()
        .unwrap()
}

/// The response body of one request through `layer`, to a handler that answers `body()`
/// (not polled: a server would poll it).
async fn answered<B>(layer: &AdmissionLayer, body: fn() -> B) -> ResponseBody<B>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
{
    let service = layer.layer(tower::service_fn(move |_: http::Request<_>| async move {
        Ok::<_, Infallible>(http::Response::new(body()))
    }));
    let request = http::Request::new(Empty::<Bytes>::new());
    service.oneshot(request).await.unwrap().into_body()
}

/// 10,000 bytes in one frame.
fn ten_thousand() -> Full<Bytes> {
    Full::new(Bytes::from(vec![1; 10_000]))
}

fn app(layer: &AdmissionLayer) -> Router {
    downloads::routes()
        .route("/small", get(|| async { Body::from(vec![7u8; 4096]) }))
        .route("/events", get(|| async { Body::new(Heartbeats::new()) }))
        .route(
            "/idle",
            get(|| async {
                // One event, then nothing to say for as long as the client stays.
                let first = tokio_stream::once(Ok::<_, Infallible>(Bytes::from_static(b"hi\n")));
                Body::from_stream(tokio_stream::StreamExt::chain(
                    first,
                    tokio_stream::pending(),
                ))
            }),
        )
        .layer(layer.clone())
}

/// `axum::serve` of the app behind a layer that admits `count` at once and whose
/// responses must be taken at `rate`.
async fn axum_paced(count: usize, rate: MinDataRate) -> (AdmissionLayer, SocketAddr) {
    let layer = AdmissionLayer::builder()
        .count(count)
        .slow_clients(SlowClients::default().with_min_response_rate(rate))
        .build()
        .unwrap();
    let app = app(&layer);
    let addr = spawn_server(|listener| axum::serve(listener, app).into_future()).await;
    (layer, addr)
}

/// A GET of `/` by hyper-util's pooled client, over h2 if `h2`.
async fn status(addr: SocketAddr, h2: bool) -> StatusCode {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(h2)
        .build_http::<Empty<Bytes>>();
    let uri = format!("http://{addr}/").parse().unwrap();
    client.get(uri).await.unwrap().status()
}

/// Asks for `/` until it is served: how long that took.
async fn served_after(addr: SocketAddr) -> Duration {
    let start = Instant::now();
    while status(addr, true).await != StatusCode::OK {
        assert!(start.elapsed() < Duration::from_secs(10), "never served");
        sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

/// Every permit of `count` held by an attacker that takes nothing: then another client
/// is served within the grace period plus a second, and the permits are counted stalled.
async fn held_and_given_back(layer: &AdmissionLayer, addr: SocketAddr, count: u64) {
    eventually("layer.snapshot().gate.count.in_flight == count", || {
        layer.snapshot().gate.count.in_flight == count
    })
    .await;
    assert_eq!(status(addr, true).await, StatusCode::SERVICE_UNAVAILABLE);
    let after = served_after(addr).await;
    assert!(after < rate().grace() + Duration::from_secs(1), "{after:?}");
    eventually("layer.snapshot().stalled == count", || {
        layer.snapshot().stalled == count
    })
    .await;
    assert_eq!(layer.snapshot().gate.count.in_flight, 0);
}

#[tokio::test]
async fn streamed_responses_on_a_zero_h2_window_give_their_permits_back() {
    let (layer, addr) = axum_paced(8, rate()).await;
    let _attacker = ask(addr, 0, "/stream", 8).await;
    held_and_given_back(&layer, addr, 8).await;
}

#[tokio::test]
async fn one_chunk_bodies_never_polled_give_their_permits_back() {
    let (layer, addr) = axum_paced(4, rate()).await;
    let _attacker = ask(addr, 0, "/big", 4).await;
    held_and_given_back(&layer, addr, 4).await;
}

/// `serve` of the app behind a layer that admits `count` at once, whose responses must be
/// taken at `rate`, and whose h2 streams are timed at `stream_rate` (if any).
async fn under_serve(
    count: usize,
    rate: MinDataRate,
    stream_rate: Option<MinDataRate>,
) -> (AdmissionLayer, SocketAddr) {
    let layer = AdmissionLayer::builder()
        .count(count)
        .slow_clients(SlowClients::default().with_min_response_rate(rate))
        .connection_limits(ConnectionLimits::default().with_min_send_rate(stream_rate))
        .build()
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(layer.serve(listener, app(&layer)).into_future());
    (layer, addr)
}

#[tokio::test]
async fn under_serve_with_its_stream_rate_off_the_layer_still_gives_the_permits_back() {
    let (layer, addr) = under_serve(4, rate(), None).await;
    let _attacker = ask(addr, 0, "/stream", 4).await;
    held_and_given_back(&layer, addr, 4).await;
}

#[tokio::test]
async fn under_serve_a_last_frame_waiting_on_the_client_holds_its_permits_until_the_reset() {
    // The layer hands `/small` (4 KiB) to the stream whole, as its last frame; the stream
    // hands it to h2 a piece at a time, on a window of 1 KiB the client never opens.
    let fast = MinDataRate::new(64 * 1024, Duration::from_secs(1));
    let (layer, addr) = under_serve(1, fast, Some(rate())).await;
    let mut reader = ask(addr, 1024, "/small", 1).await;
    eventually("layer.snapshot().gate.count.in_flight == 1", || {
        layer.snapshot().gate.count.in_flight == 1
    })
    .await;
    sleep(Duration::from_millis(500)).await;
    assert_eq!(
        layer.snapshot().gate.count.in_flight,
        1,
        "held while its last frame waits on the client"
    );
    let log = h2::client(
        &mut reader,
        Duration::from_secs(5),
        Duration::from_secs(5),
        |_| Vec::new(),
        |log| log.reset(1).is_some(),
    )
    .await;
    assert!(log.reset(1).is_some(), "the stream is reset: {log:?}");
    eventually("layer.snapshot().gate.count.in_flight == 0", || {
        layer.snapshot().gate.count.in_flight == 0
    })
    .await;
}

#[tokio::test]
async fn an_http1_client_that_stops_reading_gives_its_permits_back_with_its_socket_open() {
    // 64 KiB/s: what a client banks is a second beyond the grace, so the test is short.
    let rate = MinDataRate::new(64 * 1024, Duration::from_secs(1));
    let (layer, addr) = axum_paced(1, rate).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut reader = socket.connect(addr).await.unwrap();
    reader
        .write_all(b"GET /stream HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    eventually("layer.snapshot().gate.count.in_flight == 1", || {
        layer.snapshot().gate.count.in_flight == 1
    })
    .await;
    // Released while the client still holds its socket, never having read a byte.
    eventually("layer.snapshot().gate.count.in_flight == 0", || {
        layer.snapshot().gate.count.in_flight == 0
    })
    .await;
    assert_eq!(layer.snapshot().stalled, 1);
    assert_eq!(status(addr, false).await, StatusCode::OK);
    drop(reader);
}

#[tokio::test]
async fn an_idle_event_stream_and_a_reader_of_heartbeats_keep_their_permits() {
    let (layer, addr) = axum_paced(2, rate()).await;
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Empty<Bytes>>();
    let idle = client.get(format!("http://{addr}/idle").parse().unwrap());
    let mut idle = idle.await.unwrap().into_body();
    let first = idle.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "hi\n");
    let events = client.get(format!("http://{addr}/events").parse().unwrap());
    let mut events = events.await.unwrap().into_body();
    // Three grace periods: the idle stream waits on its handler, not on its client.
    let reading = async {
        let mut heartbeats = 0;
        while let Some(frame) = events.frame().await {
            frame.unwrap();
            heartbeats += 1;
        }
        heartbeats
    };
    let heartbeats = tokio::time::timeout(3 * rate().grace(), reading).await;
    assert!(heartbeats.is_err(), "the event stream ended");
    let snapshot = layer.snapshot();
    assert_eq!(snapshot.gate.count.in_flight, 2, "both still held");
    assert_eq!(snapshot.stalled, 0);
    drop((idle, events));
    eventually("layer.snapshot().gate.count.in_flight == 0", || {
        layer.snapshot().gate.count.in_flight == 0
    })
    .await;
}

#[tokio::test]
async fn a_reader_at_twice_the_rate_is_kept_and_one_at_half_is_cut() {
    // 64 KiB/s: what h2 buffers ahead of a reader (the connection's first window) banks
    // a second beyond the grace, so the reader at half the rate is cut within seconds.
    let rate = 64 * 1024;
    let (layer, addr) = axum_paced(2, MinDataRate::new(rate, Duration::from_secs(1))).await;
    let (honest, under) = tokio::join!(
        slow_reader(addr, 2 * rate as u32, Duration::from_secs(6)),
        slow_reader(addr, rate as u32 / 2, Duration::from_secs(10)),
    );
    assert!(honest.reset(1).is_none(), "the honest reader was cut");
    assert!(
        honest.data(1) >= 5 * 2 * rate as usize,
        "read {} bytes",
        honest.data(1)
    );
    // Cut: its permits went, and its stream was reset when hyper next asked the body.
    assert!(
        under.reset(1).is_some(),
        "the reader under the rate was kept"
    );
    assert_eq!(layer.snapshot().stalled, 1);
}

#[tokio::test]
async fn a_stalled_body_ends_in_an_error_that_says_so() {
    let layer = one_at_a_time(SlowClients::default().with_min_response_rate(rate()));
    let mut body = answered(&layer, || Full::new(Bytes::from_static(b"never taken"))).await;
    // Not asked for its first frame within the grace: the sweep takes the permit back.
    assert!(
        holds_within(Duration::from_secs(3), || !body.holds_permit()).await,
        "still held"
    );
    assert_eq!(layer.snapshot().gate.count.in_flight, 0);
    let error = body.frame().await.unwrap().unwrap_err();
    assert!(error.is::<Stalled>(), "{error}");
    assert_eq!(layer.snapshot().stalled, 1);
}

#[tokio::test]
async fn a_body_asked_for_in_time_is_never_cut_and_without_a_rate_nothing_is_timed() {
    for slow in [SlowClients::default(), SlowClients::off()] {
        let timed = one_at_a_time(slow.with_min_response_rate(rate()));
        let untimed = one_at_a_time(slow.without_min_response_rate());
        for (layer, timed) in [(timed, true), (untimed, false)] {
            let mut body = answered(&layer, ten_thousand).await;
            let mut pieces = Vec::new();
            while let Some(frame) = body.frame().await {
                pieces.push(frame.unwrap().into_data().unwrap().len());
            }
            assert_eq!(pieces.iter().sum::<usize>(), 10_000);
            // Timed, a frame larger than the grace is worth goes in pieces.
            assert_eq!(pieces.len() > 1, timed, "{pieces:?}");
            assert!(!body.holds_permit());
            assert_eq!(layer.snapshot().stalled, 0);
        }
    }
}

#[tokio::test]
async fn a_body_dropped_while_it_waits_on_its_client_releases_its_permits_at_once() {
    let layer = one_at_a_time(SlowClients::default().with_min_response_rate(rate()));
    let mut body = answered(&layer, ten_thousand).await;
    // Its first piece handed out: it waits on its client, its permits parked.
    let piece = body.frame().await.unwrap().unwrap();
    assert!(piece.data_ref().unwrap().len() < 10_000);
    assert!(body.holds_permit());
    assert_eq!(layer.snapshot().gate.count.in_flight, 1);
    drop(body); // the client went away
    assert_eq!(layer.snapshot().gate.count.in_flight, 0, "released at once");
    assert_eq!(layer.snapshot().stalled, 0, "not a stall");
}

#[tokio::test]
async fn an_inner_body_error_releases_the_permits_and_reaches_the_server_boxed() {
    let layer = one_at_a_time(SlowClients::default());
    let mut body = answered(&layer, || {
        let frames = [
            Ok(Bytes::from_static(b"a")),
            Err(std::io::Error::other("broke")),
        ];
        Body::from_stream(tokio_stream::iter(frames))
    })
    .await;
    assert!(body.frame().await.unwrap().is_ok());
    assert_eq!(layer.snapshot().gate.count.in_flight, 1);
    let error = body.frame().await.unwrap().unwrap_err();
    assert!(error.is::<axum::Error>(), "{error}");
    assert_eq!(
        layer.snapshot().gate.count.in_flight,
        0,
        "released at the error"
    );
    assert_eq!(layer.snapshot().stalled, 0);
}
