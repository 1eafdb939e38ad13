//! The layer composes with axum's `Router::layer` and tonic's `Server::builder().layer`,
//! each served for real on loopback.

use std::time::Duration;

use admission_tower::{AdmissionLayer, PerKey};
use axum::Router;
use axum::routing::get;
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
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

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

/// The ready-made extractors on a real axum server: by client address from axum's
/// `ConnectInfo`, and by API key from a header; a key over its cap gets 429 + `Retry-After`
/// while other keys (and a request with no key) are served.
#[tokio::test]
async fn axum_per_client_caps_by_peer_address_and_by_api_key() {
    use admission_tower::key;
    use axum::extract::ConnectInfo;
    use std::net::SocketAddr;

    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let slow = move || {
        let mut release = release_rx.clone();
        async move {
            let _ = release.wait_for(|go| *go).await;
            "slow done"
        }
    };
    let routes = || {
        Router::new()
            .route("/slow", get(slow.clone()))
            .route("/fast", get(|| async { "fast" }))
    };
    let by_peer = AdmissionLayer::builder()
        .per_key(PerKey::new(
            1,
            key::peer_ip(|info: &ConnectInfo<SocketAddr>| info.0.ip()),
        ))
        .build()
        .unwrap();
    let by_api_key = AdmissionLayer::builder()
        .per_key(PerKey::new(
            1,
            key::header(http::HeaderName::from_static("x-api-key")),
        ))
        .build()
        .unwrap();
    let peer_addr = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = routes().layer(by_peer.clone());
        let make = app.into_make_service_with_connect_info::<SocketAddr>();
        tokio::spawn(async move { axum::serve(listener, make).await.unwrap() });
        addr
    };
    let key_addr = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = routes().layer(by_api_key.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    };

    // By address: one request in flight from 127.0.0.1, the next from it is refused.
    let held = tokio::spawn(get_status(peer_addr, "/slow"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while by_peer.snapshot().gate.keyed.unwrap().keys == 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (status, _) = get_status(peer_addr, "/fast").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);

    // By API key: k1 is at its cap, k2 and a request without a key are served.
    let request = |key: Option<&str>, path: &str| {
        let mut builder = http::Request::get(path);
        if let Some(key) = key {
            builder = builder.header("x-api-key", key);
        }
        builder
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    let send = |request: http::Request<_>| async move {
        let stream = TcpStream::connect(key_addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let response = sender.send_request(request).await.unwrap();
        let status = response.status();
        let retry_after = response.headers().get("retry-after").cloned();
        let _ = response.into_body().collect().await;
        (status, retry_after)
    };
    let k1 = tokio::spawn(send(request(Some("k1"), "/slow")));
    while by_api_key.snapshot().gate.keyed.unwrap().keys == 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (status, retry_after) = send(request(Some("k1"), "/fast")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after.unwrap(), "1");
    assert_eq!(send(request(Some("k2"), "/fast")).await.0, StatusCode::OK);
    assert_eq!(send(request(None, "/fast")).await.0, StatusCode::OK);

    release_tx.send(true).unwrap();
    assert_eq!(
        held.await.unwrap(),
        (StatusCode::OK, "slow done".to_owned())
    );
    assert_eq!(k1.await.unwrap().0, StatusCode::OK);
}
