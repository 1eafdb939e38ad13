//! Every row of the README's compatibility table: admission-tower in front of axum 0.7 and
//! 0.8 and tonic 0.12, 0.13 and 0.14 servers, admission-grpc in front of tonic 0.14, each
//! served on loopback and called by that version's own client, and tower-governor beside
//! it. In each, a call over the count is refused as the row says, and the slot is
//! released when the call holding it ends.

use std::net::SocketAddr;
use std::time::Duration;

use admission_tower::{AdmissionLayer, ConnectionLimits};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Waits (at most 5 s) until the layer's count holds `n`.
async fn in_flight(layer: &AdmissionLayer, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while layer.gate().count().in_flight() != n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "in flight: {} (waited for {n})",
            layer.gate().count().in_flight()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn loopback() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

type Pooled = Client<HttpConnector, Empty<Bytes>>;

/// A GET by hyper-util's pooled client: the status, `Retry-After` and the body.
async fn get(client: Pooled, addr: SocketAddr, path: &str) -> (StatusCode, Option<String>, Bytes) {
    let uri: http::Uri = format!("http://{addr}{path}").parse().unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client.get(uri))
        .await
        .expect("answered within 10 s")
        .unwrap();
    let status = response.status();
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .map(|value| value.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, retry_after, body)
}

/// An axum server behind a count of one: `/hold` holds its slot until released.
macro_rules! axum_row {
    ($name:ident, $axum:ident) => {
        #[tokio::test]
        async fn $name() {
            use $axum::Router;
            use $axum::routing::get as route;

            let layer = AdmissionLayer::builder().count(1).build().unwrap();
            let (release, released) = tokio::sync::watch::channel(false);
            let app = Router::new()
                .route(
                    "/hold",
                    route(move || {
                        let mut released = released.clone();
                        async move {
                            let _ = released.wait_for(|go| *go).await;
                            "held"
                        }
                    }),
                )
                .route("/", route(|| async { "ok" }))
                .layer(layer.clone());
            let (listener, addr) = loopback().await;
            tokio::spawn(async move { $axum::serve(listener, app).await.unwrap() });
            let client = Client::builder(TokioExecutor::new()).build_http();

            let held = tokio::spawn(get(client.clone(), addr, "/hold"));
            in_flight(&layer, 1).await;
            let (status, retry_after, _) = get(client.clone(), addr, "/").await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
            assert!(retry_after.is_some(), "a 503 says when to retry");

            release.send(true).unwrap();
            assert_eq!(held.await.unwrap().2, "held");
            in_flight(&layer, 0).await;
            assert_eq!(get(client, addr, "/").await.2, "ok");
        }
    };
}

axum_row!(axum_0_7_router_layer_sheds_with_503, axum07);
axum_row!(axum_0_8_router_layer_sheds_with_503, axum08);

/// Sends a GET on a raw connection and reads until the head ends or the server closes:
/// what came back, empty if the server closed the connection without answering.
async fn raw_get(stream: &mut TcpStream) -> String {
    let request = b"GET / HTTP/1.1\r\nhost: compat\r\n\r\n";
    if stream.write_all(request).await.is_err() {
        return String::new();
    }
    let mut read = Vec::new();
    let mut buf = [0; 1024];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("answered or closed within 10 s")
            .unwrap_or(0);
        read.extend_from_slice(&buf[..n]);
        if n == 0 || read.windows(4).any(|w| w == b"\r\n\r\n") {
            return String::from_utf8_lossy(&read).into_owned();
        }
    }
}

/// axum 0.8 only: the connection guard is an `axum::serve::Listener`, a trait axum 0.7
/// does not have.
#[tokio::test]
async fn axum_0_8_guarded_listener_closes_connections_over_the_cap() {
    let layer = AdmissionLayer::builder()
        .count(8)
        .connection_limits(ConnectionLimits::default().with_max_connections(Some(1)))
        .build()
        .unwrap();
    let app = axum08::Router::new()
        .route("/", axum08::routing::get(|| async { "ok" }))
        .layer(layer.clone());
    let (listener, addr) = loopback().await;
    let connections = layer.connections().clone();
    tokio::spawn(async move { axum08::serve(layer.guard(listener), app).await.unwrap() });

    let mut first = TcpStream::connect(addr).await.unwrap();
    assert!(raw_get(&mut first).await.starts_with("HTTP/1.1 200"));
    assert_eq!(
        connections.open(),
        1,
        "the first connection stays open, idle"
    );
    let mut second = TcpStream::connect(addr).await.unwrap();
    assert_eq!(
        raw_get(&mut second).await,
        "",
        "over the cap: closed unanswered"
    );

    drop(first);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while connections.open() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the closed connection's slot"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert!(raw_get(&mut third).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn axum_0_8_served_by_the_layer_with_connect_info() {
    use axum08::extract::ConnectInfo;

    let layer = count_of_one();
    let app = axum08::Router::new()
        .route(
            "/peer",
            axum08::routing::get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
                peer.to_string()
            }),
        )
        .layer(layer.clone());
    let (listener, addr) = loopback().await;
    tokio::spawn(layer.serve(listener, app).into_future());
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let local = stream.local_addr().unwrap().to_string();
    stream
        .write_all(b"GET /peer HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let answer = raw_get_answer(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with(&local), "{answer}");
}

/// Reads what comes on `stream` until the end of a short response.
async fn raw_get_answer(stream: &mut TcpStream) -> String {
    let mut buf = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// tonic 0.14's routes, served by `AdmissionLayer::serve` (h2 prior knowledge, as tonic's
/// client speaks), behind admission-grpc's refusals.
#[tokio::test]
async fn tonic_0_14_served_by_the_layer_sheds_as_resource_exhausted() {
    use health014::pb::HealthCheckRequest;
    use health014::pb::health_client::HealthClient;

    let layer = AdmissionLayer::builder()
        .count(1)
        .refusals(admission_grpc::refusals())
        .build()
        .unwrap();
    let (reporter, service) = health014::server::health_reporter();
    reporter
        .set_service_status("", health014::ServingStatus::Serving)
        .await;
    let routes = tonic014::service::Routes::new(service);
    let (listener, addr) = loopback().await;
    let served = layer.serve(listener, tower::Layer::layer(&layer, routes));
    tokio::spawn(served.into_future());
    let channel = tonic014::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let ask = || HealthCheckRequest {
        service: String::new(),
    };
    let watch = client.watch(ask()).await.unwrap().into_inner();
    in_flight(&layer, 1).await;
    let refused = client.check(ask()).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic014::Code::ResourceExhausted,
        "{refused:?}"
    );
    drop(watch);
    in_flight(&layer, 0).await;
    assert_eq!(client.check(ask()).await.unwrap().into_inner().status, 1);
}

/// A tonic server (health service) behind `$layer`, a count of one (and `$inner`, a layer
/// between it and tonic's router): a `Watch` stream holds the slot until the client drops
/// it, and a `Check` meanwhile fails with `$code`.
macro_rules! tonic_row {
    ($name:ident, $tonic:ident, $health:ident, $layer:expr, $code:ident $(, $inner:expr)?) => {
        #[tokio::test]
        async fn $name() {
            use $health::pb::HealthCheckRequest;
            use $health::pb::health_client::HealthClient;

            let layer: AdmissionLayer = $layer;
            // (`&mut self` before tonic-health 0.14.)
            #[allow(unused_mut)]
            let (mut reporter, service) = $health::server::health_reporter();
            reporter
                .set_service_status("", $health::ServingStatus::Serving)
                .await;
            let (listener, addr) = loopback().await;
            tokio::spawn(
                $tonic::transport::Server::builder()
                    .layer(layer.clone())
                    $(.layer($inner))?
                    .add_service(service)
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(
                        listener,
                    )),
            );
            let channel = $tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut client = HealthClient::new(channel);
            let ask = || HealthCheckRequest {
                service: String::new(),
            };

            let watch = client.watch(ask()).await.unwrap().into_inner();
            in_flight(&layer, 1).await;
            let refused = client.check(ask()).await.unwrap_err();
            assert_eq!(refused.code(), $tonic::Code::$code, "{refused:?}");
            assert_eq!(refused.message(), "admission refused: count limit reached");

            drop(watch);
            in_flight(&layer, 0).await;
            assert_eq!(client.check(ask()).await.unwrap().into_inner().status, 1);
        }
    };
}

fn count_of_one() -> AdmissionLayer {
    AdmissionLayer::builder().count(1).build().unwrap()
}

// tonic 0.12's router takes its own `BoxBody` only: the layer's metered request body is
// boxed back into one behind the layer.
tonic_row!(
    tonic_0_12_sheds_as_unavailable,
    tonic012,
    health012,
    count_of_one(),
    Unavailable,
    tower::util::MapRequestLayer::new(|request: http::Request<_>| {
        request.map(tonic012::body::boxed)
    })
);
tonic_row!(
    tonic_0_13_sheds_as_unavailable,
    tonic013,
    health013,
    count_of_one(),
    Unavailable
);
tonic_row!(
    tonic_0_14_sheds_as_unavailable,
    tonic014,
    health014,
    count_of_one(),
    Unavailable
);
tonic_row!(
    tonic_0_14_with_admission_grpc_sheds_as_resource_exhausted,
    tonic014,
    health014,
    AdmissionLayer::builder()
        .count(1)
        .refusals(admission_grpc::refusals())
        .build()
        .unwrap(),
    ResourceExhausted
);

/// A rate limiter beside the layer (the README's rate-limit row): tower-governor outside,
/// admission inside. A client over its rate is answered 429 by the governor before it
/// takes a slot (admission never sees it); a request within its rate, over the count,
/// is answered 503 by admission.
#[tokio::test]
async fn tower_governor_in_front_answers_the_rate_and_admission_the_count() {
    use axum08::routing::get as route;
    use tower_governor::GovernorLayer;
    use tower_governor::governor::GovernorConfigBuilder;

    let layer = count_of_one();
    // Three requests a client, then one a minute: the fourth is over the rate.
    let rate = GovernorConfigBuilder::default()
        .per_second(60)
        .burst_size(3)
        .finish()
        .unwrap();
    let (release, released) = tokio::sync::watch::channel(false);
    let app = axum08::Router::new()
        .route(
            "/hold",
            route(move || {
                let mut released = released.clone();
                async move {
                    let _ = released.wait_for(|go| *go).await;
                    "held"
                }
            }),
        )
        .route("/", route(|| async { "ok" }))
        .layer(layer.clone())
        .layer(GovernorLayer::new(rate));
    let (listener, addr) = loopback().await;
    // `serve` hands the peer address to the governor's key extractor (`ConnectInfo`).
    tokio::spawn(layer.serve(listener, app).into_future());
    let client = Client::builder(TokioExecutor::new()).build_http();

    let held = tokio::spawn(get(client.clone(), addr, "/hold"));
    in_flight(&layer, 1).await;
    let (status, retry_after, _) = get(client.clone(), addr, "/").await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "within the rate, over the count"
    );
    assert!(retry_after.is_some());
    release.send(true).unwrap();
    assert_eq!(held.await.unwrap().2, "held");
    in_flight(&layer, 0).await;
    assert_eq!(get(client.clone(), addr, "/").await.0, StatusCode::OK);

    let refused = layer.gate().snapshot().count.refused;
    let (status, retry_after, _) = get(client, addr, "/").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "over the rate");
    assert!(retry_after.is_some(), "the governor says when to retry");
    assert_eq!(
        layer.gate().snapshot().count.refused,
        refused,
        "admission never saw it"
    );
}
