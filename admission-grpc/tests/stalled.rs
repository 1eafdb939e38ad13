//! Under tonic's own server (`Server::builder().layer(..)`), a server-streaming call whose
//! client stops reading gives its permit back once it is past its allowance at the
//! minimum send rate, and the calls beside it are served.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use admission_grpc::{is_health_check, refusals};
use admission_tower::{AdmissionLayer, MinDataRate, SlowClients};
use support::{Batch, State, channel, pour, put, serve};
use tonic::Code;
use tonic::transport::{Endpoint, Server};

/// tonic's `Server` on `127.0.0.1:0` with the layer, admitting one call at a time, whose
/// responses must be taken at 64 KiB/s after a second: what a client's windows take at
/// once (64 KiB) banks a second beyond the grace, so a stalled stream's allowance is two
/// seconds.
async fn start() -> (AdmissionLayer, SocketAddr) {
    let rate = MinDataRate::new(64 * 1024, Duration::from_secs(1));
    let layer = AdmissionLayer::builder()
        .count(1)
        .bypass(is_health_check)
        .refusals(refusals())
        .slow_clients(SlowClients::default().with_min_response_rate(rate))
        .build()
        .unwrap();
    let batch = Batch(State::new(1000));
    let served = layer.clone();
    let addr = serve(move |incoming| async move {
        Server::builder()
            .layer(served)
            .add_service(batch)
            .serve_with_incoming(incoming)
            .await
    })
    .await;
    (layer, addr)
}

#[tokio::test]
async fn a_server_stream_whose_client_stops_reading_gives_its_permit_back() {
    let allowance = Duration::from_secs(2);
    let (layer, addr) = start().await;

    // A client that asks for the stream and never reads it, on h2's default windows.
    let stalled = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .unwrap();
    // The handler has far more to send than the windows take.
    let stream = pour(&stalled).await.unwrap();

    let other = channel(addr).await;
    let refused = put(&other, "work", &[]).await.unwrap_err();
    assert_eq!(
        refused.code(),
        Code::ResourceExhausted,
        "the stream holds the slot"
    );
    let start = Instant::now();
    loop {
        match put(&other, "work", &[]).await {
            Ok(_) => break,
            Err(status) => assert_eq!(status.code(), Code::ResourceExhausted),
        }
        assert!(start.elapsed() < 4 * allowance, "never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let served_after = start.elapsed();
    // The allowance, and the sweep's quarter second.
    assert!(
        served_after < allowance + Duration::from_secs(1),
        "{served_after:?}"
    );
    assert_eq!(layer.snapshot().stalled, 1);
    assert_eq!(layer.gate().count().in_flight(), 0);
    drop(stream);
}

#[tokio::test]
async fn a_server_stream_read_as_it_comes_keeps_its_permit() {
    let (layer, addr) = start().await;
    let reader = channel(addr).await;
    let mut stream = pour(&reader).await.unwrap();
    // Read for three allowances: a client that takes what it is sent is never cut.
    let start = Instant::now();
    let mut messages = 0_u64;
    while start.elapsed() < Duration::from_secs(6) {
        assert!(stream.message().await.unwrap().is_some());
        messages += 1;
    }
    assert!(messages > 1_000, "{messages}");
    assert_eq!(layer.snapshot().stalled, 0);
    assert_eq!(layer.gate().count().in_flight(), 1);
    drop(stream);
}
