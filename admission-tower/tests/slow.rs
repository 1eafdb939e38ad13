//! Slow clients on the wire, against an axum server configured as the overload
//! demonstration is: tricklers are cut and cannot pin the byte budget, while legitimate
//! uploads, fast or slow, go through.

use std::net::SocketAddr;
use std::time::Duration;

use admission_tower::{AdmissionLayer, SlowClients};
use axum::body::Bytes;
use axum::routing::post;
use axum::Router;
use http::StatusCode;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{sleep, timeout, Instant};

const BUDGET: u64 = 256 << 10;

/// The demonstration's limits, and the given slow-client policy.
fn layer(slow: SlowClients) -> AdmissionLayer {
    AdmissionLayer::builder()
        .count(64)
        .bytes(BUDGET)
        .max_request_bytes(64 << 10)
        .per_key(
            4,
            admission_http::key::header(http::HeaderName::from_static("x-api-key")),
        )
        .slow_clients(slow)
        .build()
        .unwrap()
}

/// `POST /upload` answers with the length it read.
async fn serve(layer: &AdmissionLayer) -> SocketAddr {
    let app = Router::new()
        .route(
            "/upload",
            post(|body: Bytes| async move { body.len().to_string() }),
        )
        .layer(layer.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A raw client that declares `declared` bytes, then sends `chunk` bytes every
/// `every`, until the server answers or closes; returns the status line it read, if any.
async fn trickle(
    addr: SocketAddr,
    key: String,
    declared: u64,
    chunk: usize,
    every: Duration,
) -> Option<String> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /upload HTTP/1.1\r\nhost: test\r\nx-api-key: {key}\r\ncontent-length: {declared}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let sender = tokio::spawn(async move {
        let mut sent = 0;
        while sent < declared {
            sleep(every).await;
            let n = (chunk as u64).min(declared - sent);
            if write.write_all(&vec![b'x'; n as usize]).await.is_err() {
                return;
            }
            sent += n;
        }
    });
    let mut answer = Vec::new();
    let mut buf = [0; 1024];
    while !answer.windows(2).any(|w| w == b"\r\n") {
        match read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    sender.abort();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.lines().next().map(str::to_owned)
}

/// One upload of `body` on a connection of its own, with a hyper client.
async fn upload(addr: SocketAddr, key: String, body: Vec<u8>) -> StatusCode {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = http::Request::post("/upload")
        .header("x-api-key", key)
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .expect("answered within 10 s")
        .unwrap();
    let status = response.status();
    let _ = response.into_body().collect().await;
    status
}

/// Twenty 1 KiB uploads from twenty keys of their own: how many were admitted.
async fn legitimate_uploads(addr: SocketAddr, round: usize) -> usize {
    let uploads = (0..20).map(|i| upload(addr, format!("user-{round}-{i}"), vec![1; 1024]));
    let statuses = futures_join(uploads).await;
    statuses.iter().filter(|s| **s == StatusCode::OK).count()
}

async fn futures_join<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_tricklers_cannot_deny_other_uploads_and_are_answered_408() {
    let layer = layer(SlowClients::default());
    let addr = serve(&layer).await;
    let start = Instant::now();
    let tricklers: Vec<_> = (0..4)
        .map(|i| {
            tokio::spawn(trickle(
                addr,
                format!("trickler-{i}"),
                64 << 10,
                1,
                Duration::from_millis(500),
            ))
        })
        .collect();
    sleep(Duration::from_millis(300)).await;
    let bytes = layer.gate().bytes().unwrap().clone();
    let held = bytes.in_flight();
    assert!(
        held <= 4 * 1_200 + 16,
        "four tricklers hold the grace period's worth each, not 64 KiB: {held}"
    );
    assert_eq!(
        legitimate_uploads(addr, 0).await,
        20,
        "every other upload is admitted"
    );

    for trickler in tricklers {
        let status = trickler.await.unwrap();
        assert_eq!(status.as_deref(), Some("HTTP/1.1 408 Request Timeout"));
    }
    let cut_after = start.elapsed();
    assert!(
        cut_after < Duration::from_secs(7),
        "cut within the grace period plus a second or so: {cut_after:?}"
    );
    assert_eq!(layer.snapshot().too_slow, 4);
    assert_eq!(legitimate_uploads(addr, 1).await, 20);
    let deadline = Instant::now() + Duration::from_secs(5);
    while bytes.in_flight() != 0 || layer.gate().count().in_flight() != 0 {
        assert!(Instant::now() < deadline, "the ledgers return to zero");
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_policy_four_tricklers_hold_the_whole_budget() {
    // What the policy prevents, measured the same way: the attack works on a layer
    // without it.
    let layer = layer(SlowClients::off());
    let addr = serve(&layer).await;
    let tricklers: Vec<_> = (0..4)
        .map(|i| {
            tokio::spawn(trickle(
                addr,
                format!("trickler-{i}"),
                64 << 10,
                1,
                Duration::from_millis(500),
            ))
        })
        .collect();
    sleep(Duration::from_millis(300)).await;
    assert_eq!(layer.gate().bytes().unwrap().in_flight(), BUDGET);
    assert_eq!(legitimate_uploads(addr, 0).await, 0);
    for trickler in tricklers {
        trickler.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_trickle_holds_a_count_permit_no_longer_than_the_grace_period() {
    // A count limit alone: the body is timed all the same.
    let layer = AdmissionLayer::builder().count(1).build().unwrap();
    let app = Router::new()
        .route(
            "/upload",
            post(|body: Bytes| async move { body.len().to_string() }),
        )
        .layer(layer.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, std::io::Error>>(1);
    tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"x"))))
        .await
        .unwrap();
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let request = http::Request::post("/upload").body(body).unwrap();
    let start = Instant::now();
    let response = timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .expect("answered")
        .unwrap();
    assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(response.headers()["connection"], "close");
    assert!(response.headers().get("retry-after").is_none());
    assert!(start.elapsed() < Duration::from_secs(6));
    drop(tx);
    assert_eq!(
        layer.gate().count().in_flight(),
        0,
        "its permit went with the answer"
    );
    assert_eq!(
        upload(addr, "next".into(), vec![1; 10]).await,
        StatusCode::OK
    );
}
