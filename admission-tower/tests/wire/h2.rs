//! HTTP/2 refusals reach clients as refusals: a refused request's small body is read
//! before the answer, so the server does not reset a stream the client is still
//! sending on. Checked with curl (nghttp2) and with hyper's HTTP/2 client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::support::{Seen, app};
use admission_tower::AdmissionLayer;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tower::Layer;

const TRIES: usize = 60;

/// The layer at a count of 1, over HTTP/2 only, with one `/stream` holding the slot.
async fn full_server() -> (SocketAddr, AdmissionLayer, Arc<Seen>) {
    let layer = AdmissionLayer::builder().count(1).build().unwrap();
    let seen = Arc::new(Seen::default());
    let service = layer.layer(app(seen.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, layer, seen)
}

/// An HTTP/2 connection with hyper's client.
async fn h2_client(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

/// An HTTP/2 connection, and a `/stream` on it that holds the server's one slot.
async fn hold_the_slot(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    http::Response<hyper::body::Incoming>,
) {
    let mut sender = h2_client(addr).await;
    let stream = http::Request::get("http://test/stream")
        .body(Full::default())
        .unwrap();
    let held = sender.send_request(stream).await.unwrap();
    (sender, held)
}

fn upload(n: usize) -> http::Request<Full<Bytes>> {
    http::Request::post("http://test/upload")
        .body(Full::new(Bytes::from(vec![b'x'; n])))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hypers_h2_client_reads_every_refusal_of_a_small_upload() {
    let (addr, layer, seen) = full_server().await;
    let (mut sender, held) = hold_the_slot(addr).await;
    assert_eq!(layer.gate().count().in_flight(), 1);
    for _ in 0..TRIES {
        let response = tokio::time::timeout(
            Duration::from_secs(5),
            sender.send_request(upload(32 << 10)),
        )
        .await
        .expect("answered")
        .expect("a refusal, not a reset stream");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            response.headers().get("connection").is_none(),
            "no connection header on h2"
        );
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "overloaded: count limit reached\n");
    }
    assert_eq!(layer.snapshot().gate.count.refused, TRIES as u64);
    seen.end_streams();
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curls_h2_client_reads_every_refusal_of_a_small_upload() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: curl is not installed");
        return;
    }
    let (addr, layer, seen) = full_server().await;
    let (_sender, held) = hold_the_slot(addr).await;
    let file = std::env::temp_dir().join(format!("admission-h2-{}.bin", std::process::id()));
    std::fs::write(&file, vec![b'x'; 32 << 10]).unwrap();
    let url = format!("http://{addr}/upload");
    let mut failures = Vec::new();
    for _ in 0..TRIES {
        let output = tokio::process::Command::new("curl")
            .args([
                "-sS",
                "--http2-prior-knowledge",
                "--max-time",
                "5",
                "-o",
                "/dev/null",
            ])
            .args(["-w", "%{http_code}", "--data-binary"])
            .arg(format!("@{}", file.display()))
            .arg(&url)
            .output()
            .await
            .unwrap();
        let code = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() || code != "503" {
            failures.push((
                output.status.code(),
                code,
                String::from_utf8_lossy(&output.stderr).into_owned(),
            ));
        }
    }
    std::fs::remove_file(&file).unwrap();
    assert!(
        failures.is_empty(),
        "{} of {TRIES} tries failed: {:?}",
        failures.len(),
        failures.first()
    );
    assert_eq!(layer.snapshot().gate.count.refused, TRIES as u64);
    seen.end_streams();
    drop(held);
}
