//! A response the client will not take holds nothing for long, on the wire: h2 clients
//! written frame by frame keep a stream's window at 0, open it a byte at a time, or
//! leave the connection's window at 0, and each such stream is reset after its grace
//! with its permits released, while an idle event stream and an honest slow reader are
//! kept; a response sent as one large chunk sits in h2's buffers a piece at a time, its
//! permits held until the stream ends, and nothing of it is left once it is reset.

#![cfg(all(feature = "serve", feature = "axum"))]

use std::net::SocketAddr;
use std::time::Duration;

use admission_http::MinDataRate;
use admission_tower::{AdmissionLayer, ConnectionLimits};
use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioExecutor;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::sleep;

#[path = "support/downloads.rs"]
mod downloads;
#[path = "support/events.rs"]
mod events;
use admission_testkit::h2;
use admission_testkit::heap;
admission_testkit::count_the_heap!();

use admission_testkit::{eventually, spawn_server};
use downloads::{BIG, CHUNK, CHUNKS};
use events::Heartbeats;
use h2::{INITIAL_WINDOW_SIZE, Log, ask, client, get_on, preface_with, slow_reader, window_update};

/// The requests the layer admits at once: as many as one attacking connection asks for.
const COUNT: usize = 8;

/// Held by the tests that measure the heap and those that move large responses, so
/// that one does not count the other's.
static HEAP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn app(layer: &AdmissionLayer) -> Router {
    downloads::routes()
        .route("/events", get(|| async { Body::new(Heartbeats::new()) }))
        .layer(layer.clone())
}

/// A server whose layer admits `COUNT` at once and whose streams must be taken at `rate`.
async fn serve_paced(rate: MinDataRate) -> (AdmissionLayer, SocketAddr) {
    let layer = AdmissionLayer::builder()
        .count(COUNT)
        .connection_limits(ConnectionLimits::default().with_min_send_rate(Some(rate)))
        .build()
        .unwrap();
    let app = app(&layer);
    let served = layer.clone();
    let addr = spawn_server(|listener| served.serve(listener, app).into_future()).await;
    (layer, addr)
}

/// 1 KiB/s after a second: the rate of the tests that stall.
fn rate() -> MinDataRate {
    MinDataRate::new(1024, Duration::from_secs(1))
}

/// Reads `stream` for `within`, answering pings and opening no window, until each of its
/// first `streams` streams has been reset: what it saw.
async fn until_reset(stream: &mut TcpStream, within: Duration, streams: u32) -> Log {
    let all_reset = move |log: &Log| ids(streams).all(|id| log.reset(id).is_some());
    client(stream, within, within, |_| Vec::new(), all_reset).await
}

/// The ids of the first `n` client streams.
fn ids(n: u32) -> impl Iterator<Item = u32> {
    (0..n).map(|i| 2 * i + 1)
}

/// A GET of `/` by hyper-util's pooled client over h2.
async fn served(addr: SocketAddr) -> StatusCode {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Empty<Bytes>>();
    let uri = format!("http://{addr}/").parse().unwrap();
    client.get(uri).await.unwrap().status()
}

#[tokio::test]
async fn a_zero_window_on_streamed_responses_gives_their_permits_back_after_the_grace() {
    let (layer, addr) = serve_paced(rate()).await;
    let mut attacker = ask(addr, 0, "/stream", COUNT as u32).await;
    eventually(
        "layer.snapshot().gate.count.in_flight == COUNT as u64",
        || layer.snapshot().gate.count.in_flight == COUNT as u64,
    )
    .await;
    assert_eq!(
        served(addr).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "all held"
    );

    let log = until_reset(&mut attacker, Duration::from_secs(5), COUNT as u32).await;
    for id in ids(COUNT as u32) {
        let reset = log
            .reset(id)
            .unwrap_or_else(|| panic!("stream {id} not reset: {log:?}"));
        // The grace (1 s) plus what the client could have taken of its first piece.
        assert!(
            reset < Duration::from_millis(2_500),
            "stream {id} reset at {reset:?}"
        );
        assert_eq!(log.data(id), 0, "a zero window takes nothing");
    }
    eventually("layer.snapshot().gate.count.in_flight == 0", || {
        layer.snapshot().gate.count.in_flight == 0
    })
    .await;
    assert_eq!(served(addr).await, StatusCode::OK, "others are served");
    assert!(!log.went_away(), "the connection itself is not ended");
}

#[tokio::test]
async fn a_zero_window_on_one_large_chunk_holds_its_permits_and_then_nothing() {
    let _heap = HEAP.lock().await;
    let (layer, addr) = serve_paced(rate()).await;
    // A first round makes the runtime's, the server's and h2's one-time allocations.
    let mut first = ask(addr, 0, "/big", 1).await;
    let _ = until_reset(&mut first, Duration::from_secs(5), 1).await;
    drop(first);
    eventually("layer.connections().open() == 0", || {
        layer.connections().open() == 0
    })
    .await;
    let before = heap::live();

    let streams = 4;
    let mut attacker = ask(addr, 0, "/big", streams).await;
    eventually(
        "layer.snapshot().gate.count.in_flight == u64::from(streams)",
        || layer.snapshot().gate.count.in_flight == u64::from(streams),
    )
    .await;
    sleep(Duration::from_millis(300)).await;
    let held = heap::live() - before;
    assert!(
        held > (BIG * 7 / 2) as isize,
        "the handlers' chunks: {held}"
    );
    assert_eq!(
        layer.snapshot().gate.count.in_flight,
        u64::from(streams),
        "the permits are held while the chunks wait on the client"
    );

    let log = until_reset(&mut attacker, Duration::from_secs(5), streams).await;
    assert!(ids(streams).all(|id| log.reset(id).is_some()), "{log:?}");
    eventually("layer.snapshot().gate.count.in_flight == 0", || {
        layer.snapshot().gate.count.in_flight == 0
    })
    .await;
    // Nothing of the chunks is left, with the connection still open.
    eventually("heap::live() - before < 1 << 20", || {
        heap::live() - before < 1 << 20
    })
    .await;
    drop(attacker);
}

#[tokio::test]
async fn what_h2_buffers_of_a_stream_is_bounded_when_its_socket_is_not_read() {
    let _heap = HEAP.lock().await;
    let (layer, addr) = serve_paced(rate()).await;
    // A first round makes the one-time allocations.
    for round in 0..2 {
        let before = heap::live();
        // Windows wide open, and a socket that takes little and is never read.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stalled = socket.connect(addr).await.unwrap();
        let mut bytes = preface_with(&[(INITIAL_WINDOW_SIZE, 16 << 20)]);
        bytes.extend(window_update(0, 64 << 20));
        let streams = COUNT as u32;
        for id in ids(streams) {
            bytes.extend(get_on(id, "/stream"));
        }
        stalled.write_all(&bytes).await.unwrap();
        eventually(
            "layer.snapshot().gate.count.in_flight == u64::from(streams)",
            || layer.snapshot().gate.count.in_flight == u64::from(streams),
        )
        .await;
        sleep(Duration::from_millis(300)).await;
        let grown = heap::live() - before;
        // The docs' bound: what h2 buffers (96 KiB) and the handler's chunk in hand
        // (64 KiB) a stream, and the connection's own buffers.
        let bound = streams as isize * (96 + 64) * 1024 + (256 << 10);
        if round == 1 {
            assert!(
                grown <= bound,
                "{grown} bytes for {streams} streams (bound {bound})"
            );
        }
        drop(stalled);
        eventually("layer.snapshot().gate.count.in_flight == 0", || {
            layer.snapshot().gate.count.in_flight == 0
        })
        .await;
    }
}

#[tokio::test]
async fn a_window_opened_a_byte_at_a_time_is_reset() {
    let (layer, addr) = serve_paced(rate()).await;
    let mut attacker = ask(addr, 0, "/stream", 1).await;
    // 10 bytes a second, on the stream and the connection.
    let dribble = |_| [window_update(1, 1), window_update(0, 1)].concat();
    let log = client(
        &mut attacker,
        Duration::from_secs(6),
        Duration::from_millis(100),
        dribble,
        |log| log.reset(1).is_some(),
    )
    .await;
    let reset = log.reset(1).unwrap_or_else(|| panic!("not reset: {log:?}"));
    assert!(log.data(1) > 0, "the dribble was taken");
    assert!(reset < Duration::from_secs(3), "reset at {reset:?}");
    eventually("layer.snapshot().gate.count.in_flight == 0", || {
        layer.snapshot().gate.count.in_flight == 0
    })
    .await;
}

#[tokio::test]
async fn a_connection_window_left_at_zero_is_reset() {
    // 64 KiB/s: the connection's first window (64 KiB) earns a second beyond the grace.
    let (layer, addr) = serve_paced(MinDataRate::new(64 * 1024, Duration::from_secs(1))).await;
    // Every stream's window wide open; the connection's never opened past its first.
    let mut attacker = ask(addr, 16 << 20, "/stream", 1).await;
    let log = until_reset(&mut attacker, Duration::from_secs(6), 1).await;
    let reset = log.reset(1).unwrap_or_else(|| panic!("not reset: {log:?}"));
    assert_eq!(log.data(1), 65_535, "the connection's window, and no more");
    assert!(reset < Duration::from_secs(4), "reset at {reset:?}");
    eventually("layer.snapshot().gate.count.in_flight == 0", || {
        layer.snapshot().gate.count.in_flight == 0
    })
    .await;
}

#[tokio::test]
async fn an_idle_event_stream_is_kept_and_one_whose_heartbeats_cannot_go_is_reset() {
    let (layer, addr) = serve_paced(rate()).await;
    let mut reader = ask(addr, 65_535, "/events", 1).await;
    let log = client(
        &mut reader,
        Duration::from_secs(3),
        Duration::from_secs(1),
        |_| Vec::new(),
        |_| false,
    )
    .await;
    assert!(!log.any_reset(), "{log:?}");
    assert!(log.data(1) >= 10 * 3, "heartbeats came: {}", log.data(1));
    assert_eq!(layer.snapshot().gate.count.in_flight, 1, "still open");
    drop(reader);
    eventually("layer.snapshot().gate.count.in_flight == 0", || {
        layer.snapshot().gate.count.in_flight == 0
    })
    .await;

    let mut stalled = ask(addr, 0, "/events", 1).await;
    let log = until_reset(&mut stalled, Duration::from_secs(5), 1).await;
    let reset = log.reset(1).unwrap_or_else(|| panic!("not reset: {log:?}"));
    assert!(reset < Duration::from_millis(2_500), "reset at {reset:?}");
}

#[tokio::test]
async fn an_honest_slow_reader_is_kept_and_one_under_the_rate_is_reset() {
    let (_, addr) = serve_paced(MinDataRate::new(512, Duration::from_secs(1))).await;
    let (honest, under) = tokio::join!(
        slow_reader(addr, 1024, Duration::from_secs(6)),
        slow_reader(addr, 256, Duration::from_secs(10)),
    );
    assert!(honest.reset(1).is_none(), "the honest reader was reset");
    assert!(honest.data(1) >= 5 * 1024, "read {} bytes", honest.data(1));
    assert!(
        under.reset(1).is_some(),
        "the reader under the rate was kept"
    );
}

#[tokio::test]
async fn a_client_that_takes_its_responses_gets_them_whole() {
    let _heap = HEAP.lock().await;
    let (layer, addr) = serve_paced(rate()).await;
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Empty<Bytes>>();
    for (path, len) in [("/stream", CHUNK * CHUNKS), ("/big", BIG), ("/", 2)] {
        let uri = format!("http://{addr}{path}").parse().unwrap();
        let response = client.get(uri).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), len, "{path}");
    }
    eventually("layer.snapshot().gate.count.in_flight == 0", || {
        layer.snapshot().gate.count.in_flight == 0
    })
    .await;
}
