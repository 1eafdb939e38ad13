//! Retries shed first, on a real server: a hyper server on loopback behind the layer,
//! responses held open so that the ledger's level is the test's.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{Seen, app, get, next_chunk, send, serve, text};
use admission_tower::{AdmissionLayer, Classes, Priority, Retries, Wait, class};
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;

/// A request for `path` of class `class` (none if empty), a retry if `retry`.
fn request(path: &str, class: &str, retry: bool) -> Request<Full<bytes::Bytes>> {
    let mut request = Request::get(path);
    if !class.is_empty() {
        request = request.header("x-request-class", class);
    }
    if retry {
        request = request.header("grpc-previous-rpc-attempts", "1");
    }
    request.body(Full::default()).unwrap()
}

/// Opens a held `/stream` response; its status if refused.
async fn open(
    addr: SocketAddr,
    class: &str,
    retry: bool,
) -> Result<http::Response<Incoming>, StatusCode> {
    let mut response = send(addr, request("/stream", class, retry)).await;
    match response.status() {
        StatusCode::OK => {
            assert_eq!(next_chunk(&mut response).await.unwrap(), "first\n");
            Ok(response)
        }
        status => {
            assert!(response.headers().contains_key("retry-after"));
            Err(status)
        }
    }
}

type Events = Arc<Mutex<Vec<(Option<Priority>, Option<String>, bool)>>>;

/// A layer of a count of 10 over `builder`'s other settings, shedding gRPC retries first,
/// its refusal events kept.
fn layer_of(
    builder: admission_tower::AdmissionBuilder,
    retries: Retries,
) -> (AdmissionLayer, Events) {
    let events = Events::default();
    let seen = events.clone();
    let layer = builder
        .count(10)
        .retries(retries)
        .on_refusal(move |event| {
            let class = event.class.map(str::to_owned);
            seen.lock()
                .unwrap()
                .push((event.priority, class, event.retry));
        })
        .build()
        .unwrap();
    (layer, events)
}

#[tokio::test]
async fn a_retry_is_shed_before_a_first_attempt_of_its_class() {
    let classes = Classes::standard();
    let classify = class::header(class::HEADER, Priority::DEFAULT);
    let builder = AdmissionLayer::builder().priority(classes, classify);
    let (layer, events) = layer_of(builder, Retries::grpc());
    let addr = serve(tower::Layer::layer(&layer, app(Arc::new(Seen::default())))).await;
    let count = layer.gate().count().clone();

    // Retries of the default class may fill 80% of its 90%: 7 of 10.
    let mut held = Vec::new();
    while let Ok(response) = open(addr, "default", true).await {
        held.push(response);
    }
    assert_eq!(count.in_flight(), 7, "default retries refused at 72%");
    // At 7, a critical retry is admitted (80%: 8), then a first attempt of the class.
    held.push(open(addr, "critical", true).await.unwrap());
    held.push(open(addr, "default", false).await.unwrap());
    // At 9, the default class is full for first attempts too; a critical first attempt
    // takes the last slot.
    let refused = send(addr, request("/", "default", true)).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        text(refused).await,
        "overloaded: priority class share reached\n"
    );
    assert_eq!(
        open(addr, "critical", true).await.unwrap_err(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    held.push(open(addr, "critical", false).await.unwrap());
    assert_eq!(count.in_flight(), 10);

    // Four refusals, each counted once: by class, and of those, retries.
    let snapshot = layer.snapshot().gate;
    assert_eq!(snapshot.refused_by_class[..3], [1, 2, 0]);
    assert_eq!(snapshot.refused_retries, 3);
    assert_eq!(snapshot.count.refused, 3);
    let named = |p: Priority, n: &str, retry| (Some(p.retry(80)), Some(n.to_owned()), retry);
    assert_eq!(
        events.lock().unwrap()[..],
        [
            named(Priority::DEFAULT, "default", true),
            named(Priority::DEFAULT, "default", true),
            named(Priority::CRITICAL, "critical", true),
        ]
    );
    drop(held);
    crate::support::eventually("every permit released", || count.in_flight() == 0).await;
}

#[tokio::test]
async fn without_classes_a_retry_is_shed_at_its_share_of_the_count() {
    let retries = Retries::grpc().share(50);
    assert_eq!(format!("{retries:?}"), "Retries { share: 50, .. }");
    let (layer, events) = layer_of(AdmissionLayer::builder(), retries);
    let addr = serve(tower::Layer::layer(&layer, app(Arc::new(Seen::default())))).await;
    let count = layer.gate().count().clone();
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(open(addr, "", false).await.unwrap());
    }
    // At half the count, retries are shed; first attempts fill the rest.
    assert_eq!(
        open(addr, "", true).await.unwrap_err(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    for _ in 0..5 {
        held.push(open(addr, "", false).await.unwrap());
    }
    assert_eq!(count.in_flight(), 10);
    drop(held.pop());
    crate::support::eventually("a permit released", || count.in_flight() == 9).await;
    assert!(
        open(addr, "", true).await.is_err(),
        "9 in flight: above 50%"
    );
    // A header that says no earlier attempt (or says nothing a number can be read from)
    // is a first attempt.
    for value in ["0", "many"] {
        let first = crate::support::with_header("/stream", "grpc-previous-rpc-attempts", value);
        let mut first = send(addr, first).await;
        assert_eq!(first.status(), StatusCode::OK, "{value}");
        assert_eq!(next_chunk(&mut first).await.unwrap(), "first\n");
        drop(first);
        crate::support::eventually("its permit released", || count.in_flight() == 9).await;
    }
    // Without classes, the events name none, and say retry.
    assert_eq!(
        events.lock().unwrap()[..],
        [(None, None, true), (None, None, true)]
    );
    assert_eq!(layer.snapshot().gate.refused_retries, 2);
    drop(held);
    crate::support::eventually("every permit released", || count.in_flight() == 0).await;
    assert!(
        open(addr, "", true).await.is_ok(),
        "an idle server admits a retry"
    );
}

#[tokio::test]
async fn a_retry_never_waits_and_is_counted_once() {
    // Retries may fill the whole count here: what differs is only that they do not wait.
    let wait = Wait::new(16, Duration::from_secs(60));
    let (layer, events) = layer_of(
        AdmissionLayer::builder().wait(wait),
        Retries::grpc().share(100),
    );
    let seen = Arc::new(Seen::default());
    let addr = serve(tower::Layer::layer(&layer, app(seen.clone()))).await;
    let count = layer.gate().count().clone();
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(open(addr, "", false).await.unwrap());
    }
    // A first attempt waits (up to a minute); a retry is refused at once.
    let first = tokio::spawn(async move { send(addr, get("/")).await });
    crate::support::eventually("the first attempt waits", || count.waiting() == 1).await;
    let retry = tokio::time::timeout(Duration::from_secs(5), send(addr, request("/", "", true)))
        .await
        .expect("a retry is refused without waiting");
    assert_eq!(retry.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(text(retry).await, "overloaded: count limit reached\n");
    seen.end_streams();
    let first = first.await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(text(first).await, "ok");

    // Counted once, where it was refused: by the ledger, as a retry; no wait ended.
    let snapshot = layer.snapshot();
    assert_eq!(snapshot.gate.count.refused, 1);
    assert_eq!(snapshot.gate.refused_retries, 1);
    assert_eq!((snapshot.wait.admitted, snapshot.wait.timed_out), (1, 0));
    assert_eq!(events.lock().unwrap()[..], [(None, None, true)]);
    drop(held);
}
