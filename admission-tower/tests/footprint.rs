//! What a connection and a request in flight hold on the heap beside their bodies, served
//! by `AdmissionLayer::serve` behind the layer: the figures `MemoryShare`'s docs give for
//! choosing a byte budget, checked here against the bounds the docs state.

#![cfg(all(feature = "serve", feature = "axum"))]

use admission_testkit::heap;
admission_testkit::count_the_heap!();

use std::time::Duration;

use admission_tower::AdmissionLayer;
use axum::Router;
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::sleep;

const N: usize = 200;

async fn settle() -> isize {
    sleep(Duration::from_millis(200)).await;
    heap::live()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_holds_under_48_kib_idle_or_with_a_request_in_flight() {
    let layer = AdmissionLayer::builder()
        .count(10_000)
        .bytes(1 << 30)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/hang", get(std::future::pending::<&'static str>))
        .layer(layer.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(layer.serve(listener, app).into_future());
    // Warm up: one-time allocations.
    let mut warm = TcpStream::connect(addr).await.unwrap();
    warm.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let _ = warm.read(&mut [0; 512]).await.unwrap();
    drop(warm);

    let before = settle().await;
    let mut idle = Vec::new();
    for _ in 0..N {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
            .await
            .unwrap();
        let _ = stream.read(&mut [0; 512]).await.unwrap();
        idle.push(stream);
    }
    let connection = (settle().await - before) / N as isize;

    let mut hanging = Vec::new();
    for stream in &mut idle {
        stream
            .write_all(b"GET /hang HTTP/1.1\r\nhost: a\r\n\r\n")
            .await
            .unwrap();
        hanging.push(());
    }
    while layer.snapshot().gate.count.in_flight < N as u64 {
        sleep(Duration::from_millis(5)).await;
    }
    let busy = (settle().await - before) / N as isize;
    println!(
        "heap held: {connection} bytes an idle HTTP/1.1 connection, {busy} bytes one with a request in flight"
    );
    // The bound `MemoryShare`'s docs state.
    assert!(connection > 0 && connection < 48 << 10, "{connection}");
    assert!(busy > 0 && busy < 48 << 10, "{busy}");
}
