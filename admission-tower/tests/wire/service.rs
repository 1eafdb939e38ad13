//! The service in-process: configuration, clones, dry run, hooks, dropped futures.

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use admission_tower::{
    AdmissionLayer, Key, MeteredBody, PerKey, Refusal, RefusalBody, Refusals, Refused,
};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body as _;
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service, ServiceExt};

type In = MeteredBody<Full<Bytes>>;

fn ok_service(
    calls: Arc<AtomicUsize>,
) -> impl Service<Request<In>, Response = Response<Full<Bytes>>, Error = Infallible> + Clone {
    tower::service_fn(move |_req: Request<In>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
    })
}

fn request(path: &str) -> Request<Full<Bytes>> {
    Request::get(path).body(Full::default()).unwrap()
}

#[tokio::test]
async fn an_off_layer_passes_requests_through_uncounted() {
    let layer = AdmissionLayer::off();
    assert!(layer.gate().bytes().is_none() && layer.gate().keyed().is_none());
    let calls = Arc::new(AtomicUsize::new(0));
    let service = layer.layer(ok_service(calls.clone()));
    let held: Vec<_> = futures_many(&service, 3).await;
    assert!(
        held.iter()
            .all(|r| r.status() == StatusCode::OK && !r.body().holds_permit())
    );
    assert_eq!(
        layer.snapshot().gate.count.in_flight,
        0,
        "nothing is counted"
    );
    // Its drain has nothing to wait for: documented.
    tokio::time::timeout(std::time::Duration::from_secs(5), layer.drain())
        .await
        .expect("an off layer's drain completes at once");
    // Closed, it refuses all the same.
    let refused = service.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // A limit set at run time applies to the requests after it.
    layer.reopen();
    layer.gate().count().set_capacity(1).unwrap();
    let first = service.clone().oneshot(request("/")).await.unwrap();
    assert!(first.body().holds_permit());
    let second = service.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn a_layer_built_without_limits_counts_so_a_drain_waits() {
    let builder = AdmissionLayer::builder();
    // Not because metrics time the permits: it counts on its own.
    #[cfg(feature = "metrics")]
    let builder = builder.metrics(false);
    let layer = builder.build().unwrap();
    let service = layer.layer(ok_service(Arc::default()));
    let held = futures_many(&service, 2).await;
    assert_eq!(layer.snapshot().gate.count.in_flight, 2);
    let mut drain = layer.drain();
    let wait = std::time::Duration::from_millis(50);
    assert!(
        tokio::time::timeout(wait, &mut drain).await.is_err(),
        "two in flight"
    );
    drop(held);
    tokio::time::timeout(std::time::Duration::from_secs(5), drain)
        .await
        .expect("the last body dropped, the drain is done");
}

/// `n` admitted responses of `service`, their bodies unread.
async fn futures_many<S>(service: &S, n: usize) -> Vec<S::Response>
where
    S: tower::Service<Request<Full<Bytes>>> + Clone,
    S::Error: std::fmt::Debug,
{
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(service.clone().oneshot(request("/")).await.unwrap());
    }
    out
}

#[test]
fn a_limit_the_ledgers_cannot_represent_is_an_error_not_a_panic() {
    assert!(AdmissionLayer::builder().bytes(u64::MAX).build().is_err());
    assert!(AdmissionLayer::builder().count(usize::MAX).build().is_err());
}

#[tokio::test]
async fn clones_of_the_service_share_one_limit() {
    let layer = AdmissionLayer::builder().count(1).build().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut a = layer.layer(ok_service(calls.clone()));
    let mut b = a.clone();
    let mut c = layer.clone().layer(ok_service(calls.clone()));

    let held = a.ready().await.unwrap().call(request("/")).await.unwrap();
    let refused = b.ready().await.unwrap().call(request("/")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let refused = c.ready().await.unwrap().call(request("/")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(held.body().holds_permit());
    drop(held);
    assert_eq!(layer.gate().count().in_flight(), 0);
}

#[tokio::test]
async fn a_malformed_content_length_is_answered_400_without_calling_the_service() {
    let layer = AdmissionLayer::builder().bytes(1000).build().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let service = layer.layer(ok_service(calls.clone()));
    let bad = Request::post("/")
        .header("content-length", "ten")
        .body(Full::default())
        .unwrap();
    let response = service.oneshot(bad).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(response.body().is_refusal());
    assert!(response.headers().get("retry-after").is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(layer.gate().bytes().unwrap().in_flight(), 0);
}

#[tokio::test]
async fn dry_run_admits_what_it_would_shed_and_reports_it() {
    let events = Arc::new(Mutex::new(Vec::new()));
    let log = events.clone();
    let layer = AdmissionLayer::builder()
        .count(1)
        .dry_run(true)
        .on_refusal(move |event| {
            log.lock().unwrap().push((
                event.request.uri.path().to_owned(),
                event.refusal,
                event.dry_run,
            ))
        })
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let service = layer.layer(ok_service(calls.clone()));
    let held = service.clone().oneshot(request("/a")).await.unwrap();
    let over = service.clone().oneshot(request("/b")).await.unwrap();
    assert_eq!(over.status(), StatusCode::OK, "admitted anyway");
    assert!(
        !over.body().holds_permit(),
        "over the limit, it holds nothing"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(layer.snapshot().would_shed, 1);
    assert_eq!(
        *events.lock().unwrap(),
        vec![("/b".to_owned(), Refusal::Refused(Refused::Count), true)]
    );
    drop((held, over));
    assert_eq!(layer.gate().count().in_flight(), 0);
}

#[tokio::test]
async fn the_refusal_hook_sees_every_refusal_and_the_body_closure_shapes_it() {
    let seen = Arc::new(AtomicUsize::new(0));
    let hook = seen.clone();
    let layer = AdmissionLayer::builder()
        .count(1)
        .refusals(
            Refusals::new()
                .retry_after(std::time::Duration::from_secs(7))
                .body(|cx| RefusalBody::json(format!(r#"{{"path":"{}"}}"#, cx.uri.path()))),
        )
        .on_refusal(move |_| {
            hook.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    let service = layer.layer(ok_service(Arc::default()));
    let _held = service.clone().oneshot(request("/x")).await.unwrap();
    let refused = service.oneshot(request("/y")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "7");
    assert_eq!(refused.headers()["content-type"], "application/json");
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, r#"{"path":"/y"}"#);
    assert_eq!(seen.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_response_future_dropped_before_it_resolves_releases_its_permit() {
    let layer = AdmissionLayer::builder().count(1).build().unwrap();
    let gate = tokio::sync::Notify::new();
    let gate = Arc::new(gate);
    let wait = gate.clone();
    let slow = tower::service_fn(move |_req: Request<In>| {
        let wait = wait.clone();
        async move {
            wait.notified().await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    });
    let mut service = layer.layer(slow);
    let future = service.call(request("/"));
    {
        let mut future = pin!(future);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(future.as_mut().poll(&mut cx).is_pending());
        assert_eq!(layer.gate().count().in_flight(), 1);
    }
    assert_eq!(layer.gate().count().in_flight(), 0);
}

#[tokio::test]
async fn an_inner_service_error_releases_the_permit() {
    let layer = AdmissionLayer::builder().count(1).build().unwrap();
    let failing = tower::service_fn(|_req: Request<In>| async {
        Err::<Response<Full<Bytes>>, _>("inner failure")
    });
    let mut service = layer.layer(failing);
    let future = service.call(request("/"));
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready(Err(err)) = future.as_mut().poll(&mut cx) else {
        panic!("the inner error passes through");
    };
    assert_eq!(err, "inner failure");
    assert_eq!(
        layer.gate().count().in_flight(),
        0,
        "released while the future is alive"
    );
}

#[tokio::test]
async fn a_cap_chosen_per_key_replaces_the_default_cap() {
    let layer = AdmissionLayer::builder()
        .per_key(
            PerKey::new(1, |_: &http::request::Parts| Some(Key::from("tenant")))
                .cap_by(|_, _| Some(2)),
        )
        .build()
        .unwrap();
    assert_eq!(layer.gate().keyed().map(|keyed| keyed.cap()), Some(1));
    let service = layer.layer(ok_service(Arc::default()));
    let held = futures_many(&service, 2).await;
    assert!(held.iter().all(|r| r.body().holds_permit()));
    let over = service.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[test]
fn a_layer_and_its_builder_say_what_they_hold() {
    use admission_tower::BuildError;
    use admission_tower::{Classes, Priority};
    use std::error::Error as _;
    let plain = AdmissionLayer::builder().count(3).dry_run(true);
    let debug = format!("{plain:?}");
    assert!(
        debug.starts_with("AdmissionBuilder") && debug.contains("dry_run: true"),
        "{debug}"
    );
    let plain = plain.build().unwrap();
    assert!(plain.classes().is_none(), "no classes were given");
    let debug = format!("{plain:?}");
    assert!(
        debug.starts_with("AdmissionLayer") && debug.contains("capacity: Some(3)"),
        "{debug}"
    );
    let classes = Classes::new([("interactive", 100), ("batch", 50)]).unwrap();
    let classed = AdmissionLayer::builder()
        .count(4)
        .priority(classes, |_, _| Priority::DEFAULT)
        .build()
        .unwrap();
    let names: Vec<_> = classed
        .classes()
        .unwrap()
        .iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(names, ["interactive", "batch"]);
    // A build error names its cause.
    let error = AdmissionLayer::builder()
        .count(usize::MAX)
        .build()
        .unwrap_err();
    assert!(matches!(error, BuildError::Capacity(_)));
    let cause = error.source().unwrap().to_string();
    assert!(
        !error.to_string().contains(&cause),
        "the cause is said once: {error}"
    );
    assert!(BuildError::LimitsOnSharedGate.source().is_none());
}

/// What a server reads of a response body before and while sending it (`is_end_stream`
/// decides whether a body follows the head, `size_hint` the `Content-Length`), for each
/// of the body's three kinds: admitted (holding the permit), passed through (bypassed,
/// holding nothing) and a refusal.
#[tokio::test]
async fn each_kind_of_response_body_reports_its_length_end_and_kind() {
    let layer = AdmissionLayer::builder()
        .count(1)
        .bypass(|head| head.uri.path() == "/health")
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let service = layer.layer(ok_service(calls));
    let admitted = service.clone().oneshot(request("/")).await.unwrap();
    let refused = service.clone().oneshot(request("/")).await.unwrap();
    let passed = service.clone().oneshot(request("/health")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The refusal's text, exactly: its length is the response's `Content-Length`.
    let text = refused.body().size_hint().exact().unwrap();
    assert!(text > 0 && !refused.body().is_end_stream());
    for (body, kind, holds) in [
        (admitted.body(), "admitted", true),
        (passed.body(), "body", false),
        (refused.body(), "refused", false),
    ] {
        assert_eq!(body.is_refusal(), kind == "refused", "{kind}");
        assert_eq!(body.holds_permit(), holds, "{kind}");
        assert_eq!(
            format!("{body:?}"),
            format!("ResponseBody {{ kind: {kind:?}, holds_permit: {holds} }}")
        );
    }
    // The service's `Full` body of two bytes, seen through either wrapper.
    for body in [admitted.body(), passed.body()] {
        assert_eq!(body.size_hint().exact(), Some(2));
        assert!(!body.is_end_stream());
    }
    let (_, refused) = refused.into_parts();
    let bytes = refused.collect().await.unwrap().to_bytes();
    assert_eq!(bytes.len() as u64, text);
    let (_, admitted) = admitted.into_parts();
    let mut admitted = pin!(admitted);
    assert_eq!(
        admitted
            .frame()
            .await
            .unwrap()
            .unwrap()
            .into_data()
            .unwrap(),
        "ok"
    );
    assert!(admitted.is_end_stream() && !admitted.holds_permit());
}
