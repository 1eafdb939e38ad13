//! `AdmissionLayer::serve` on the wire: every connection bound. Heads trickled in,
//! stalled prefaces and handshakes, idle keep-alive and h2 connections are closed at
//! their bounds (and an event stream with heartbeats is not); connections from one
//! address stop at its cap while others are served; h2 streams over the cap are
//! refused, reset and CONTINUATION floods end their connection and leave nothing
//! behind; a graceful shutdown ends at its deadline; axum's `ConnectInfo` works.

#![cfg(all(feature = "serve", feature = "axum"))]

use std::net::SocketAddr;
use std::time::Duration;

use admission_tower::{AdmissionLayer, ConnectionLimits};
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::{Router, body::Body};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep, timeout};

#[path = "support/events.rs"]
mod events;
use admission_testkit::h2;
use admission_testkit::heap;
admission_testkit::count_the_heap!();

use admission_testkit::{eventually, spawn_server};
use events::Heartbeats;
use h2::{
    CONTINUATION, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PING, RST_STREAM, frame, frames,
    get_block, preface,
};

const BOUND: Duration = Duration::from_secs(1);

/// Limits with every timer at `BOUND`.
fn limits() -> ConnectionLimits {
    ConnectionLimits::default()
        .with_head_within(Some(BOUND))
        .with_idle(Some(BOUND))
}

/// Limits whose head bound alone is `BOUND` (the idle bound far off), so that what the
/// head bound closes is not closed by the idle bound instead.
fn head_only() -> ConnectionLimits {
    limits().with_idle(Some(BOUND * 10))
}

/// Limits whose idle bound alone is `BOUND`.
fn idle_only() -> ConnectionLimits {
    limits().with_head_within(Some(BOUND * 10))
}

fn app(layer: &AdmissionLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/peer",
            get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }),
        )
        .route(
            "/slow",
            get(|| async {
                sleep(Duration::from_millis(300)).await;
                "slow"
            }),
        )
        .route("/hang", get(std::future::pending::<&'static str>))
        .route("/events", get(|| async { Body::new(Heartbeats::new()) }))
        .layer(layer.clone())
}

/// Serves the test app with `layer` and its limits on `127.0.0.1:0`.
async fn layer_serve(layer: &AdmissionLayer) -> SocketAddr {
    let (app, layer) = (app(layer), layer.clone());
    spawn_server(|listener| layer.serve(listener, app).into_future()).await
}

fn layer(limits: ConnectionLimits) -> AdmissionLayer {
    AdmissionLayer::builder()
        .count(64)
        .connection_limits(limits)
        .build()
        .unwrap()
}

/// How long until the server closes `stream` (a read returns 0 or fails), if it does
/// within `within`; what the server sends meanwhile is read and dropped.
async fn closed_after(stream: &mut TcpStream, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0; 4096];
    timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return start.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

/// A head trickled one byte every 300 ms, from `addr`'s accept: how long until closed.
async fn trickle_a_head(addr: SocketAddr, within: Duration) -> Option<Duration> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let start = Instant::now();
    let writer = tokio::spawn(async move {
        for byte in b"GET / HTTP/1.1\r\nhost: a\r\nx-slow: yes\r\n\r\n" {
            if write.write_all(&[*byte]).await.is_err() {
                return;
            }
            sleep(Duration::from_millis(300)).await;
        }
    });
    let mut buf = [0; 256];
    let closed = timeout(within, async {
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => return start.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok();
    writer.abort();
    closed
}

#[tokio::test]
async fn a_head_trickled_in_is_closed_at_the_bound() {
    let layer = layer(head_only());
    let addr = layer_serve(&layer).await;
    let closed = trickle_a_head(addr, Duration::from_secs(5)).await;
    let after = closed.expect("closed within 5 s");
    assert!(
        after >= BOUND - Duration::from_millis(50) && after < BOUND * 2,
        "{after:?}"
    );
    // A second head on a kept-alive connection is timed from its first byte.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0; 256];
    let n = stream.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    sleep(BOUND / 2).await;
    stream.write_all(b"GET / HT").await.unwrap();
    let start = Instant::now();
    let after = closed_after(&mut stream, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        after > BOUND / 2 + Duration::from_millis(100),
        "idle time counted: {after:?}"
    );
    assert!(start.elapsed() < BOUND * 2);
    eventually("layer.connections().open() == 0", || {
        layer.connections().open() == 0
    })
    .await;
}

#[tokio::test]
async fn through_the_guard_the_same_trickle_keeps_its_connection() {
    // What `guard` cannot do, as its docs say: a listener sees the first byte, not the
    // head's end.
    let layer = layer(limits());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let make = app(&layer).into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(layer.guard(listener), make).await });
    assert_eq!(
        trickle_a_head(addr, BOUND * 3).await,
        None,
        "still open at 3 bounds"
    );
}

#[tokio::test]
async fn the_guard_holds_the_per_address_cap_too() {
    let far = Some(BOUND * 10);
    let layer = layer(limits().with_head_within(far).with_max_per_address(Some(1)));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let make = app(&layer).into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(layer.guard(listener), make).await });
    let mut first = connect_from([127, 0, 0, 2], addr).await;
    assert!(
        get_on(&mut first, "/peer")
            .await
            .starts_with("HTTP/1.1 200")
    );
    let mut second = connect_from([127, 0, 0, 2], addr).await;
    assert!(closed_after(&mut second, BOUND / 2).await.is_some());
    let mut other = connect_from([127, 0, 0, 3], addr).await;
    assert!(get_on(&mut other, "/").await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn a_stalled_h2_preface_or_handshake_is_closed_at_the_bound() {
    let layer = layer(head_only());
    let addr = layer_serve(&layer).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let after = closed_after(&mut stream, Duration::from_secs(5)).await;
    assert!(after.is_some_and(|after| after < BOUND * 2), "{after:?}");

    // A handshake (the shape of TLS: a record header, then the record) under the head
    // bound: a client that sends three bytes of it and stalls is closed.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls_addr = listener.local_addr().unwrap();
    let handshake = |mut io: admission_tower::GuardedIo<TcpStream>| async move {
        let mut header = [0; 5];
        io.read_exact(&mut header).await?;
        let mut record = vec![0; usize::from(u16::from_be_bytes([header[3], header[4]]))];
        io.read_exact(&mut record).await?;
        Ok(io)
    };
    let served = layer.serve(listener, app(&layer)).handshake(handshake);
    tokio::spawn(served.into_future());
    let mut stream = TcpStream::connect(tls_addr).await.unwrap();
    stream.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    let after = closed_after(&mut stream, Duration::from_secs(5)).await;
    assert!(
        after.is_some_and(|after| after >= BOUND - Duration::from_millis(50) && after < BOUND * 2),
        "{after:?}"
    );
    // One that completes it is served.
    let mut stream = TcpStream::connect(tls_addr).await.unwrap();
    stream
        .write_all(&[0x16, 0x03, 0x01, 0, 2, 1, 2])
        .await
        .unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0; 256];
    let n = stream.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
}

/// A connection from `from` (a loopback address of its own) to `addr`.
async fn connect_from(from: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    socket.connect(addr).await.unwrap()
}

async fn get_on(stream: &mut TcpStream, path: &str) -> String {
    let request = format!("GET {path} HTTP/1.1\r\nhost: a\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buf = vec![0; 1024];
    let n = timeout(Duration::from_secs(5), stream.read(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn connections_from_one_address_stop_at_its_cap_while_others_are_served() {
    // Timers far off: what closes the third connection is the cap.
    let far = Some(BOUND * 10);
    let layer = layer(
        limits()
            .with_head_within(far)
            .with_idle(far)
            .with_max_per_address(Some(2)),
    );
    let addr = layer_serve(&layer).await;
    let mut first = connect_from([127, 0, 0, 2], addr).await;
    let mut second = connect_from([127, 0, 0, 2], addr).await;
    assert!(get_on(&mut first, "/").await.starts_with("HTTP/1.1 200"));
    assert!(get_on(&mut second, "/").await.starts_with("HTTP/1.1 200"));
    let mut third = connect_from([127, 0, 0, 2], addr).await;
    let after = closed_after(&mut third, Duration::from_secs(1)).await;
    assert!(
        after.is_some(),
        "the third from 127.0.0.2 is closed at once"
    );
    // Another address is served, and sees its own address through `ConnectInfo`.
    let mut other = connect_from([127, 0, 0, 3], addr).await;
    let local = other.local_addr().unwrap();
    let answer = get_on(&mut other, "/peer").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with(&local.to_string()), "{answer}");
    let from_2: std::net::IpAddr = [127, 0, 0, 2].into();
    assert_eq!(layer.connections().open_from(from_2), 2);
    drop((first, second));
    eventually("layer.connections().open_from(from_2) == 0", || {
        layer.connections().open_from(from_2) == 0
    })
    .await;
    let mut again = connect_from([127, 0, 0, 2], addr).await;
    assert!(get_on(&mut again, "/").await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn idle_connections_are_closed_and_an_event_stream_is_not() {
    let layer = layer(idle_only());
    let addr = layer_serve(&layer).await;
    // HTTP/1.1 keep-alive, idle after one request.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    assert!(get_on(&mut idle, "/").await.starts_with("HTTP/1.1 200"));
    let after = closed_after(&mut idle, Duration::from_secs(5)).await;
    assert!(
        after.is_some_and(|after| after >= BOUND - Duration::from_millis(50) && after < BOUND * 2),
        "{after:?}"
    );

    // h2, idle after one request: the client's connection ends.
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let ended = tokio::spawn(async move {
        let start = Instant::now();
        let _ = connection.await;
        start.elapsed()
    });
    let request = Request::get("http://a/")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    drop(response);
    let after = timeout(Duration::from_secs(5), ended)
        .await
        .unwrap()
        .unwrap();
    assert!(
        after >= BOUND - Duration::from_millis(50) && after < BOUND * 3,
        "{after:?}"
    );

    // h2, idle after its client cancelled a request the handler never answered (the
    // request ends on the stream's task, not the connection's).
    let mut stream = h2_hanging(addr, &layer).await;
    stream
        .write_all(&frame(RST_STREAM, 0, 1, &[0, 0, 0, 8]))
        .await
        .unwrap();
    let start = Instant::now();
    let seen = answering_pings(&mut stream, Duration::from_secs(5)).await;
    let after = start.elapsed();
    assert!(
        after >= BOUND - Duration::from_millis(50) && after < BOUND * 3,
        "{after:?}"
    );
    // Closed gracefully: a GOAWAY that takes no more streams, a ping, and, once the
    // client has answered it, the last GOAWAY, naming the last stream taken (1).
    let goaways: Vec<&[u8]> = seen
        .iter()
        .filter(|(kind, ..)| *kind == GOAWAY)
        .map(|(.., payload)| &payload[..4])
        .collect();
    assert_eq!(goaways.last(), Some(&&[0, 0, 0, 1][..]), "{seen:?}");
    assert!(goaways.len() >= 2, "{seen:?}");

    // An event stream with heartbeats outlives three idle bounds.
    let mut events = TcpStream::connect(addr).await.unwrap();
    let answer = get_on(&mut events, "/events").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(closed_after(&mut events, BOUND * 3).await, None);
    drop(events);
    eventually("layer.connections().open() == 0", || {
        layer.connections().open() == 0
    })
    .await;
    eventually("layer.snapshot().gate.count.in_flight == 0", || {
        layer.snapshot().gate.count.in_flight == 0
    })
    .await;
}

#[tokio::test]
async fn a_head_over_the_header_cap_is_refused_and_one_under_it_served() {
    let layer = layer(limits().with_max_header_bytes(32 << 10));
    let addr = layer_serve(&layer).await;
    for (size, status) in [(20 << 10, "HTTP/1.1 200"), (40 << 10, "HTTP/1.1 431")] {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "GET / HTTP/1.1\r\nhost: a\r\nx-big: {}\r\n\r\n",
            "x".repeat(size)
        );
        let _ = stream.write_all(head.as_bytes()).await;
        let mut buf = vec![0; 256];
        let n = timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        assert!(
            buf[..n].starts_with(status.as_bytes()),
            "{size}: {:?}",
            String::from_utf8_lossy(&buf[..n])
        );
    }
    for (size, served) in [(20 << 10, true), (40 << 10, false)] {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(connection);
        let request = Request::get("http://a/")
            .header("x-big", "x".repeat(size))
            .body(Empty::<Bytes>::new())
            .unwrap();
        let answer = sender.send_request(request).await;
        let ok = answer.is_ok_and(|response| response.status() == StatusCode::OK);
        assert_eq!(ok, served, "h2, {size} bytes of headers");
    }
}

#[tokio::test]
async fn h2_streams_over_the_cap_are_refused_and_the_others_complete() {
    let layer = layer(limits().with_max_streams(Some(2)));
    let addr = layer_serve(&layer).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut bytes = preface();
    for id in [1, 3, 5, 7, 9] {
        bytes.extend(frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            id,
            &get_block("/slow"),
        ));
    }
    stream.write_all(&bytes).await.unwrap();
    let frames = frames(&mut stream, Duration::from_millis(1500)).await;
    let refused: Vec<u32> = frames
        .iter()
        .filter(|(kind, _, _, payload)| *kind == RST_STREAM && payload[..] == [0, 0, 0, 7])
        .map(|(_, _, id, _)| *id)
        .collect();
    let answered: Vec<u32> = frames
        .iter()
        .filter(|(kind, ..)| *kind == HEADERS)
        .map(|(_, _, id, _)| *id)
        .collect();
    assert_eq!(refused, [5, 7, 9], "{frames:?}");
    assert_eq!(answered, [1, 3]);
    assert_eq!(layer.snapshot().gate.count.high_water, 2);
}

#[tokio::test]
async fn an_h2_peer_that_stops_answering_pings_is_closed_and_its_streams_let_go() {
    let every = Duration::from_millis(300);
    let layer = layer(limits().with_ping(Some((every, every))));
    let addr = layer_serve(&layer).await;
    let mut stream = h2_hanging(addr, &layer).await;
    // Reads what comes (the pings among it) and answers none.
    let start = Instant::now();
    let seen = frames(&mut stream, Duration::from_secs(5)).await;
    let after = start.elapsed();
    assert!(
        seen.iter().any(|(kind, ..)| *kind == PING),
        "a ping: {seen:?}"
    );
    assert!(
        after >= every * 2 - Duration::from_millis(50) && after < Duration::from_secs(2),
        "{after:?}"
    );
    eventually("layer.snapshot().gate.count.in_flight == 0", || {
        layer.snapshot().gate.count.in_flight == 0
    })
    .await;
    eventually("layer.connections().open() == 0", || {
        layer.connections().open() == 0
    })
    .await;
}

/// An h2 connection by hand, with one request in flight that its handler never answers.
async fn h2_hanging(addr: SocketAddr, layer: &AdmissionLayer) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut bytes = preface();
    let get = get_block("/hang");
    bytes.extend(frame(HEADERS, END_STREAM | END_HEADERS, 1, &get));
    stream.write_all(&bytes).await.unwrap();
    eventually("layer.snapshot().gate.count.in_flight == 1", || {
        layer.snapshot().gate.count.in_flight == 1
    })
    .await;
    stream
}

/// Reads frames until the connection closes or `within` passes, answering each ping.
async fn answering_pings(stream: &mut TcpStream, within: Duration) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let log = h2::client(stream, within, within, |_| Vec::new(), |_| false).await;
    log.0
        .into_iter()
        .map(|seen| (seen.kind, seen.flags, seen.stream, seen.payload))
        .collect()
}

/// Whether a frame of `kind` with error `code` came on stream 0 (a GOAWAY).
fn went_away(frames: &[(u8, u8, u32, Vec<u8>)], code: u8) -> bool {
    frames
        .iter()
        .any(|(kind, _, _, payload)| *kind == GOAWAY && payload.get(7) == Some(&code))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_resets_and_continuations_end_their_connection_and_leave_nothing() {
    let layer = layer(limits());
    let addr = layer_serve(&layer).await;
    // Twice: the first round makes the runtime's and the server's one-time
    // allocations (h2's included); the second must leave the heap as it found it.
    let mut before = 0;
    for round in 0..2 {
        if round == 1 {
            before = heap::live();
        }
        flood(addr).await;
        // Another client is served, and nothing is left.
        let mut other = TcpStream::connect(addr).await.unwrap();
        assert!(get_on(&mut other, "/").await.starts_with("HTTP/1.1 200"));
        drop(other);
        eventually("layer.connections().open() == 0", || {
            layer.connections().open() == 0
        })
        .await;
        eventually("layer.snapshot().gate.count.in_flight == 0", || {
            layer.snapshot().gate.count.in_flight == 0
        })
        .await;
        sleep(Duration::from_millis(200)).await;
    }
    let grown = heap::live() - before;
    assert!(grown < 64 << 10, "the heap grew by {grown} bytes");
}

/// A rapid-reset flood and a CONTINUATION flood, each on a connection of its own, and
/// each ended by the server.
async fn flood(addr: SocketAddr) {
    // Rapid reset: 5,000 streams opened and reset at once.
    let mut attacker = TcpStream::connect(addr).await.unwrap();
    let mut bytes = preface();
    for i in 0..5_000u32 {
        let id = 2 * i + 1;
        bytes.extend(frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            id,
            &get_block("/slow"),
        ));
        bytes.extend(frame(RST_STREAM, 0, id, &[0, 0, 0, 8]));
    }
    let _ = attacker.write_all(&bytes).await;
    let seen = frames(&mut attacker, Duration::from_secs(5)).await;
    assert!(
        went_away(&seen, 0xb),
        "ENHANCE_YOUR_CALM: {:?}",
        seen.last()
    );

    // CONTINUATION flood: a header block that never ends.
    let mut attacker = TcpStream::connect(addr).await.unwrap();
    let mut bytes = preface();
    bytes.extend(frame(HEADERS, END_STREAM, 1, &get_block("/")));
    for _ in 0..10_000 {
        bytes.extend(frame(CONTINUATION, 0, 1, &[0x40, 1, b'x', 1, b'y']));
    }
    let _ = attacker.write_all(&bytes).await;
    let seen = frames(&mut attacker, Duration::from_secs(5)).await;
    assert!(
        seen.iter().any(|(kind, ..)| *kind == GOAWAY),
        "{:?}",
        seen.last()
    );
}

#[tokio::test]
async fn a_graceful_shutdown_ends_at_its_deadline_and_admitted_requests_complete() {
    let layer = layer(ConnectionLimits::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(
        layer
            .serve(listener, app(&layer))
            .with_graceful_shutdown(async move { drop(stopped.await) }, BOUND)
            .into_future(),
    );
    let mut idle = TcpStream::connect(addr).await.unwrap();
    assert!(get_on(&mut idle, "/").await.starts_with("HTTP/1.1 200"));
    let mut hung = TcpStream::connect(addr).await.unwrap();
    assert!(
        get_on(&mut hung, "/events")
            .await
            .starts_with("HTTP/1.1 200")
    );
    let slow = tokio::spawn(async move {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        get_on(&mut stream, "/slow").await
    });
    sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    stop.send(()).unwrap();

    tokio::task::yield_now().await;
    assert!(layer.snapshot().gate.closed, "the layer drains");
    let idle_after = closed_after(&mut idle, BOUND).await;
    assert!(
        idle_after.is_some_and(|after| after < BOUND / 2),
        "{idle_after:?}"
    );
    assert!(
        slow.await.unwrap().starts_with("HTTP/1.1 200"),
        "admitted, it completes"
    );
    let shutdown = timeout(BOUND * 3, server).await.unwrap().unwrap();
    let took = start.elapsed();
    assert!(took >= BOUND && took < BOUND * 2, "{took:?}");
    assert_eq!(
        (shutdown.connections_cut(), shutdown.requests_cut()),
        (1, 1)
    );
    assert!(
        closed_after(&mut hung, BOUND).await.is_some(),
        "the hung stream is cut"
    );
    eventually("layer.snapshot().gate.count.in_flight == 0", || {
        layer.snapshot().gate.count.in_flight == 0
    })
    .await;
    assert_eq!(layer.connections().open(), 0);
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test]
async fn a_hyper_util_pooled_client_is_served_over_http1_and_h2() {
    let layer = layer(limits());
    let addr = layer_serve(&layer).await;
    for h2 in [false, true] {
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .http2_only(h2)
            .build_http::<Empty<Bytes>>();
        let uri: http::Uri = format!("http://{addr}/peer").parse().unwrap();
        let response = client.get(uri).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let peer = response.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&peer).starts_with("127.0.0.1:"));
    }
}

#[cfg(unix)]
#[tokio::test]
async fn a_unix_socket_is_served_under_the_same_bounds() {
    let path = std::env::temp_dir().join(format!("admission-serve-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let layer = layer(idle_only());
    tokio::spawn(layer.serve(listener, app(&layer)).into_future());
    let mut stream = tokio::net::UnixStream::connect(&path).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0; 256];
    let n = stream.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    // Idle after it: closed at the bound.
    let start = Instant::now();
    let closed = timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0))), "{closed:?}");
    assert!(start.elapsed() >= BOUND - Duration::from_millis(50));
    let _ = std::fs::remove_file(&path);
}
