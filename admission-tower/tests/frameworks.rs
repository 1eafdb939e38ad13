//! The layer composes with axum's `Router::layer` and tonic's `Server::builder().layer`,
//! each served for real on loopback.

use std::time::Duration;

use admission_tower::AdmissionLayer;
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

async fn get_status(addr: std::net::SocketAddr, path: &str) -> (StatusCode, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = http::Request::get(path)
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .unwrap()
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn axum_router_layer_sheds_at_the_limit_and_bypasses_health() {
    let layer = AdmissionLayer::builder()
        .count(1)
        .bypass(|req| req.uri.path() == "/health")
        .build()
        .unwrap();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let release_rx = std::sync::Arc::new(tokio::sync::Mutex::new(Some(release_rx)));
    let app = Router::new()
        .route(
            "/slow",
            get(move || {
                let release_rx = release_rx.clone();
                async move {
                    let rx = release_rx.lock().await.take().unwrap();
                    let _ = rx.await;
                    "slow done"
                }
            }),
        )
        .route("/fast", get(|| async { "fast" }))
        .route("/health", get(|| async { "ok" }))
        .layer(layer.clone());

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let slow = tokio::spawn(get_status(addr, "/slow"));
    let count = layer.gate().count().clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while count.in_flight() == 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        get_status(addr, "/fast").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        get_status(addr, "/health").await,
        (StatusCode::OK, "ok".into())
    );

    release_tx.send(()).unwrap();
    assert_eq!(slow.await.unwrap(), (StatusCode::OK, "slow done".into()));
    assert_eq!(
        get_status(addr, "/fast").await,
        (StatusCode::OK, "fast".into())
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while count.in_flight() != 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn tonic_server_builder_layer_composes_and_serves_grpc() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let layer = AdmissionLayer::builder().count(8).build().unwrap();
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("demo", tonic_health::ServingStatus::Serving)
        .await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tokio_stream_from(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer.clone())
            .add_service(health)
            .serve_with_incoming(incoming),
    );

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let response = client
        .check(HealthCheckRequest {
            service: "demo".into(),
        })
        .await
        .unwrap();
    assert_eq!(response.into_inner().status(), ServingStatus::Serving);
    let count = layer.snapshot().gate.count;
    assert_eq!(count.high_water, 1, "the call went through the gate");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while layer.gate().count().in_flight() != 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// tonic's `serve_with_incoming` takes a stream of connections.
fn tokio_stream_from(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<TcpStream>> {
    tokio_stream::wrappers::TcpListenerStream::new(listener)
}
