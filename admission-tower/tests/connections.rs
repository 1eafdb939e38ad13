//! Connections bounded before any request exists: connections that never send a request
//! head are closed and leave nothing behind, clients that stop reading a download are
//! cut and release their permits, and an idle event stream with heartbeats is left
//! alone. A hyper accept loop with `Connections::admit`; `axum::serve` through
//! `AdmissionLayer::guard` keeps `ConnectInfo`.

#![cfg(feature = "tokio")]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use admission_tower::{AdmissionLayer, ConnectionLimits, Connections, MinDataRate};
use bytes::Bytes;
use http::StatusCode;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use support::{Seen, app, get, next_chunk, send};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, sleep, timeout};
use tower::Layer;

use admission_testkit::heap;
admission_testkit::count_the_heap!();

use heap::live;

/// Serves the test app behind `layer` over HTTP/1.1, each connection guarded by
/// `connections`.
async fn serve_guarded(
    layer: &AdmissionLayer,
    connections: Connections,
) -> (SocketAddr, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let service = layer.layer(app(seen.clone()));
    let addr = admission_testkit::spawn_server(move |listener| async move {
        while let Ok((stream, _)) = listener.accept().await {
            let Some(io) = connections.admit(stream) else {
                continue; // over the cap: closed at once
            };
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(io), service)
                    .await;
            });
        }
    })
    .await;
    (addr, seen)
}

/// Raises this process's soft limit on open files to `want` (within the hard limit):
/// 2,000 connections are 4,000 descriptors, client and server ends in one process.
fn raise_open_files(want: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit for the kernel to fill and to read.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < want {
            limit.rlim_cur = want.min(limit.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

fn policy() -> ConnectionLimits {
    ConnectionLimits::default()
        .with_head_within(Some(Duration::from_secs(1)))
        .with_min_send_rate(Some(MinDataRate::new(240, Duration::from_secs(1))))
}

/// Whether the server closed `stream` (read returns 0 or an error) within `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0; 64];
    matches!(
        timeout(within, stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_send_a_head_are_closed_and_leave_the_heap_as_it_was() {
    let layer = AdmissionLayer::builder().count(64).build().unwrap();
    // A first-byte bound long enough for 2,000 connections to be made and accepted on a
    // busy machine before the first of them is closed.
    let connections = Connections::new(policy().with_head_within(Some(Duration::from_secs(5))));
    let (addr, _seen) = serve_guarded(&layer, connections.clone()).await;
    // Warm up: the runtime's and the server's one-time allocations.
    assert_eq!(send(addr, get("/")).await.status(), StatusCode::OK);
    sleep(Duration::from_millis(100)).await;
    let before = live();

    raise_open_files(8_192);
    let mut silent = Vec::new();
    for _ in 0..2_000 {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while connections.open() < 2_000 {
        assert!(
            Instant::now() < deadline,
            "accepted: {}",
            connections.open()
        );
        sleep(Duration::from_millis(10)).await;
    }
    let during = live();
    assert!(
        during > before + 1_000_000,
        "2,000 connections take memory: {before} -> {during}"
    );
    // The server keeps answering others meanwhile.
    assert_eq!(send(addr, get("/")).await.status(), StatusCode::OK);

    // After the first-byte bound (5 s here, 30 s by default), every one is closed.
    for stream in &mut silent {
        assert!(closed_within(stream, Duration::from_secs(10)).await);
    }
    drop(silent);
    let deadline = Instant::now() + Duration::from_secs(5);
    while connections.open() != 0 {
        assert!(
            Instant::now() < deadline,
            "still open: {}",
            connections.open()
        );
        sleep(Duration::from_millis(10)).await;
    }
    sleep(Duration::from_millis(100)).await;
    let after = live();
    assert!(
        after < before + 256 * 1024,
        "the heap returns to where it was: {before} -> {during} -> {after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_its_request_in_time_is_served() {
    let layer = AdmissionLayer::builder().count(4).build().unwrap();
    let (addr, _seen) = serve_guarded(&layer, Connections::new(policy())).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    sleep(Duration::from_millis(500)).await;
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0; 256];
    let n = timeout(Duration::from_secs(3), stream.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_stop_reading_a_download_are_cut_and_others_are_served() {
    let layer = AdmissionLayer::builder().count(80).build().unwrap();
    let (addr, seen) = serve_guarded(&layer, Connections::new(policy())).await;
    // 64 clients open a stream and never read it, while the server has 1 MiB for each.
    let mut stalled = Vec::new();
    for _ in 0..64 {
        // A small receive window, so that the kernel buffers little of what is sent.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stream = socket.connect(addr).await.unwrap();
        stream
            .write_all(b"GET /stream HTTP/1.1\r\nhost: t\r\n\r\n")
            .await
            .unwrap();
        stalled.push(stream);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while seen.streams.lock().unwrap().len() < 64 {
        assert!(Instant::now() < deadline);
        sleep(Duration::from_millis(10)).await;
    }
    let senders: Vec<_> = seen.streams.lock().unwrap().drain(..).collect();
    let start = Instant::now();
    let chunk = Bytes::from(vec![b'x'; 64 << 10]);
    for tx in senders {
        let chunk = chunk.clone();
        tokio::spawn(async move {
            // 16 MiB each: far more than the connection buffers.
            for _ in 0..256 {
                if tx.send(chunk.clone()).await.is_err() {
                    return;
                }
            }
            std::future::pending::<()>().await; // and the stream stays open
        });
    }
    assert_eq!(layer.gate().count().in_flight(), 64);
    // Other clients are served all along.
    assert_eq!(send(addr, get("/")).await.status(), StatusCode::OK);
    // Cut once the grace period (1 s here, 5 s by default) passes with nothing taken.
    let deadline = Instant::now() + Duration::from_secs(5);
    while layer.gate().count().in_flight() != 0 {
        assert!(
            Instant::now() < deadline,
            "{} held",
            layer.gate().count().in_flight()
        );
        sleep(Duration::from_millis(10)).await;
    }
    let cut_after = start.elapsed();
    assert!(
        cut_after >= Duration::from_secs(1),
        "not before the grace period: {cut_after:?}"
    );
    assert_eq!(send(addr, get("/")).await.status(), StatusCode::OK);
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_event_stream_with_heartbeats_is_not_cut() {
    let layer = AdmissionLayer::builder().count(4).build().unwrap();
    let (addr, seen) = serve_guarded(&layer, Connections::new(policy())).await;
    let mut stream = send(addr, get("/stream")).await;
    assert_eq!(next_chunk(&mut stream).await.unwrap(), "first\n");
    let tx = seen.streams.lock().unwrap().pop().unwrap();
    // 3 s, three times the grace period, with a heartbeat every 500 ms, read as it comes.
    for _ in 0..6 {
        sleep(Duration::from_millis(500)).await;
        tx.send(Bytes::from_static(b":\n")).await.unwrap();
        assert_eq!(next_chunk(&mut stream).await.unwrap(), ":\n");
    }
    assert_eq!(layer.gate().count().in_flight(), 1, "still streaming");
    drop(tx);
    assert_eq!(next_chunk(&mut stream).await, None);
}

#[tokio::test]
async fn over_the_cap_a_connection_is_closed_at_once() {
    let layer = AdmissionLayer::builder().count(4).build().unwrap();
    let connections = Connections::new(policy().with_max_connections(Some(2)));
    let (addr, _seen) = serve_guarded(&layer, connections.clone()).await;
    let _a = TcpStream::connect(addr).await.unwrap();
    let _b = TcpStream::connect(addr).await.unwrap();
    let mut over = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut over, Duration::from_millis(500)).await);
    assert_eq!(connections.open(), 2);
}

#[cfg(feature = "axum")]
#[tokio::test]
async fn axum_serve_through_the_guard_keeps_connect_info_for_a_peer_key() {
    use axum::Router;
    use axum::routing::get as route_get;

    let admission = AdmissionLayer::builder()
        .count(8)
        .per_key(admission_tower::PerKey::new(
            1,
            admission_http::key::peer_ip(|info: &axum::extract::ConnectInfo<SocketAddr>| {
                info.0.ip()
            }),
        ))
        .connection_limits(policy().with_max_connections(Some(4)))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", route_get(|| async { "ok" }))
        .route(
            "/slow",
            route_get(|| async {
                sleep(Duration::from_millis(400)).await;
                "slow"
            }),
        )
        .layer(admission.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let guarded = admission.guard(listener);
    tokio::spawn(async move {
        axum::serve(
            guarded,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap()
    });
    assert_eq!(send(addr, get("/")).await.status(), StatusCode::OK);
    // The peer's address is each request's key: a second request from it while the
    // first is in flight is over its cap of 1.
    let first = tokio::spawn(async move { send(addr, get("/slow")).await.status() });
    sleep(Duration::from_millis(100)).await;
    assert_eq!(
        send(addr, get("/slow")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(first.await.unwrap(), StatusCode::OK);
    // A silent connection through the guard is closed after the first-byte bound.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(3)).await);
}

#[tokio::test]
async fn a_request_head_bound_is_hyper_utils_and_composes_with_the_guard() {
    // The guard sees bytes, not requests: a client that sends the start of a head and
    // stalls is past the first-byte bound. hyper's `header_read_timeout` (with a timer)
    // bounds the head, in the same accept loop.
    let layer = AdmissionLayer::builder().count(4).build().unwrap();
    let connections = Connections::new(policy().with_head_within(Some(Duration::from_secs(30))));
    let service = layer.layer(app(Arc::new(Seen::default())));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let Some(io) = connections.admit(stream) else {
                continue;
            };
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(Duration::from_millis(500))
                    .serve_connection(TokioIo::new(io), service)
                    .await;
            });
        }
    });
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(b"GET / HTTP/1.1\r\nhost:").await.unwrap();
    assert!(closed_within(&mut stream, Duration::from_secs(3)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_slowly_but_above_the_rate_is_not_cut() {
    let layer = AdmissionLayer::builder().count(4).build().unwrap();
    let (addr, seen) = serve_guarded(&layer, Connections::new(policy())).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 << 10).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    stream
        .write_all(b"GET /stream HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while seen.streams.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline);
        sleep(Duration::from_millis(10)).await;
    }
    let tx = seen.streams.lock().unwrap().pop().unwrap();
    // 16 MiB, more than the kernel buffers, for a client that takes at most 64 KiB every
    // 10 ms: far above 240 B/s, with the server's writes waiting on it all along, for
    // several grace periods.
    let chunk = Bytes::from(vec![b'x'; 64 << 10]);
    tokio::spawn(async move {
        for _ in 0..256 {
            if tx.send(chunk.clone()).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0; 64 << 10];
    let mut total = 0;
    let start = Instant::now();
    while total < 16 << 20 {
        let n = timeout(Duration::from_secs(3), stream.read(&mut buf))
            .await
            .expect("the server keeps sending")
            .unwrap();
        assert_ne!(n, 0, "cut after {total} bytes and {:?}", start.elapsed());
        total += n;
        sleep(Duration::from_millis(10)).await;
    }
    assert!(
        start.elapsed() > Duration::from_secs(2),
        "several grace periods"
    );
}

#[test]
fn a_guarded_connection_says_what_it_wraps() {
    let connections = Connections::new(ConnectionLimits::default());
    let guarded = connections.admit("io").unwrap();
    assert!(format!("{guarded:?}").starts_with("GuardedIo { io: \"io\""));
}

/// A guarded connection over an in-memory pipe of 1 KiB, whose server side writes until
/// it fails (returning when, and why), and the client side.
fn writes_into_a_pipe() -> (
    tokio::task::JoinHandle<(Instant, std::io::ErrorKind)>,
    tokio::io::DuplexStream,
) {
    let connections = Connections::new(policy());
    let (server, client) = tokio::io::duplex(1024);
    let mut server = connections.admit(server).unwrap();
    let writer = tokio::spawn(async move {
        let chunk = [b'x'; 4096];
        loop {
            if let Err(err) = server.write_all(&chunk).await {
                return (Instant::now(), err.kind());
            }
        }
    });
    (writer, client)
}

#[tokio::test]
async fn what_a_client_took_buys_no_more_than_the_grace_period_of_patience() {
    // An in-memory pipe of 1 KiB: the server's writes wait on every read. The client
    // takes 512 B every 10 ms (51 KB/s, far above 240 B/s) for 2 s, then stops.
    let (writer, mut client) = writes_into_a_pipe();
    let mut buf = [0; 512];
    let reading = Instant::now();
    while reading.elapsed() < Duration::from_secs(2) {
        client.read_exact(&mut buf).await.unwrap();
        sleep(Duration::from_millis(10)).await;
    }
    let stopped = Instant::now();
    let (cut, kind) = timeout(Duration::from_secs(5), writer)
        .await
        .expect("cut")
        .unwrap();
    assert_eq!(kind, std::io::ErrorKind::TimedOut);
    let after = cut - stopped;
    assert!(
        after < Duration::from_millis(1_500),
        "cut {after:?} after the client stopped: the grace period (1 s), not what 100 KB earned"
    );
}

#[tokio::test]
async fn a_client_that_reads_below_the_rate_is_cut_though_it_reads() {
    // 16 B every 100 ms is 160 B/s: each wait spends more patience than the bytes taken
    // in it earn back (at 240 B/s), so the grace period (1 s) runs out in about 3 s.
    let (writer, mut client) = writes_into_a_pipe();
    let start = Instant::now();
    let mut buf = [0; 16];
    while !writer.is_finished() {
        assert!(start.elapsed() < Duration::from_secs(8), "not cut");
        let _ = timeout(Duration::from_millis(50), client.read_exact(&mut buf)).await;
        sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(writer.await.unwrap().1, std::io::ErrorKind::TimedOut);
    assert!(
        start.elapsed() > Duration::from_secs(2),
        "not before its patience ran out"
    );
}

#[tokio::test]
async fn a_guarded_connection_passes_flushes_shutdowns_and_vectored_writes_on() {
    let connections = Connections::new(policy());
    let (server, mut client) = tokio::io::duplex(1024);
    let mut server = connections
        .admit(tokio::io::BufWriter::new(server))
        .unwrap();
    let bufs = [std::io::IoSlice::new(b""), std::io::IoSlice::new(b"abc")];
    assert_eq!(server.write_vectored(&bufs).await.unwrap(), 3);
    server.flush().await.unwrap();
    let mut read = [0; 3];
    timeout(Duration::from_secs(1), client.read_exact(&mut read))
        .await
        .expect("flushed through")
        .unwrap();
    assert_eq!(&read, b"abc");
    server.shutdown().await.unwrap();
    let mut rest = Vec::new();
    timeout(Duration::from_secs(1), client.read_to_end(&mut rest))
        .await
        .expect("shut down through")
        .unwrap();
    assert!(rest.is_empty());
}
