//! The adaptive limit in the layer, on a real server: what each request reports (latency
//! to the head or to the body's end, success, overload, dropped), the limit moving with
//! it, and who wins between the controller and an operator.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{ChannelBody, eventually, get, send, serve, text};
use admission_tower::adaptive::{AdaptiveLimit, Aimd, Algorithm, Window};
use admission_tower::{Adaptive, AdmissionLayer, MeteredBody, SampleAt};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use tokio::sync::mpsc;
use tower::Layer;

/// Keeps every window (one per sample: windows close at once) and answers `next`.
#[derive(Debug, Clone)]
struct Recorder {
    windows: Arc<Mutex<Vec<Window>>>,
    next: u64,
}

impl Recorder {
    /// A recorder answering 10, and the windows it keeps.
    fn new() -> (Self, Arc<Mutex<Vec<Window>>>) {
        let windows = Arc::new(Mutex::new(Vec::new()));
        let recorder = Recorder {
            windows: windows.clone(),
            next: 10,
        };
        (recorder, windows)
    }
}

impl Algorithm for Recorder {
    fn update(&mut self, window: &Window) -> u64 {
        self.windows.lock().unwrap().push(*window);
        self.next
    }
}

type AppBody = Either<Full<Bytes>, ChannelBody>;

/// `/ok` 200; `/fail` a 503 of the service's own; `/grpc` a trailers-only
/// `RESOURCE_EXHAUSTED`; `/slow-body` a head at once and a body that ends 200 ms later;
/// `/hang` never answers.
fn app() -> impl tower::Service<
    Request<MeteredBody<Incoming>>,
    Response = Response<AppBody>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(|req: Request<MeteredBody<Incoming>>| async move {
        let mut response = Response::new(Either::Left(Full::new(Bytes::from_static(b"ok"))));
        match req.uri().path() {
            "/fail" => *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE,
            "/grpc" => {
                response
                    .headers_mut()
                    .insert("grpc-status", "8".parse().unwrap());
            }
            "/slow-body" => {
                let (tx, rx) = mpsc::channel(1);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let _ = tx.send(Bytes::from_static(b"done")).await;
                });
                *response.body_mut() = Either::Right(ChannelBody::new(rx));
            }
            "/hang" => tokio::time::sleep(Duration::from_secs(60)).await,
            _ => {}
        }
        Ok::<_, Infallible>(response)
    })
}

fn recording(at: SampleAt) -> (AdmissionLayer, Arc<Mutex<Vec<Window>>>) {
    let (recorder, windows) = Recorder::new();
    let layer = AdmissionLayer::builder()
        .adaptive(
            Adaptive::new(
                AdaptiveLimit::builder(recorder)
                    .initial(10)
                    .window(Duration::ZERO)
                    .min_samples(1),
            )
            .sample_at(at),
        )
        .build()
        .unwrap();
    (layer, windows)
}

fn last(windows: &Mutex<Vec<Window>>) -> Option<Window> {
    windows.lock().unwrap().last().copied()
}

#[tokio::test]
async fn each_request_reports_its_latency_and_outcome() {
    let (layer, windows) = recording(SampleAt::Head);
    let addr = serve(layer.layer(app())).await;

    assert_eq!(text(send(addr, get("/ok")).await).await, "ok");
    let w = last(&windows).expect("a sample");
    assert_eq!((w.samples, w.overloaded, w.dropped), (1, 0, 0));
    assert_eq!(
        w.max_in_flight, 1,
        "taken while the request held its permit"
    );

    let response = send(addr, get("/fail")).await;
    assert_eq!(response.status(), 503);
    assert!(
        !response.headers().contains_key("retry-after"),
        "the service's own 503"
    );
    text(response).await;
    assert_eq!(
        last(&windows).unwrap().overloaded,
        1,
        "a 5xx is an overload"
    );

    text(send(addr, get("/grpc")).await).await;
    assert_eq!(
        last(&windows).unwrap().overloaded,
        1,
        "so is RESOURCE_EXHAUSTED"
    );

    // A client that goes away before the head: the request is dropped.
    let before = windows.lock().unwrap().len();
    let hung = tokio::time::timeout(Duration::from_millis(100), send(addr, get("/hang"))).await;
    assert!(hung.is_err());
    eventually("the dropped request's sample", || {
        windows.lock().unwrap().len() > before
    })
    .await;
    assert_eq!(last(&windows).unwrap().dropped, 1);
    assert_eq!(layer.snapshot().adaptive.unwrap().windows, 4);
}

#[tokio::test]
async fn a_streaming_body_is_sampled_at_the_head_by_default_or_at_its_end() {
    let (head, at_head) = recording(SampleAt::Head);
    let (end, at_end) = recording(SampleAt::BodyEnd);
    for (layer, windows, sampled_at_head) in [(head, at_head, true), (end, at_end, false)] {
        let addr = serve(layer.layer(app())).await;
        let mut response = send(addr, get("/slow-body")).await;
        assert_eq!(
            last(&windows).is_some(),
            sampled_at_head,
            "recorded with the head, or not before the body ends"
        );
        while response.body_mut().frame().await.is_some() {}
        eventually("the sample", || last(&windows).is_some()).await;
        let latency = last(&windows).unwrap().latency_total;
        if sampled_at_head {
            assert!(latency < Duration::from_millis(150), "{latency:?}");
        } else {
            assert!(latency >= Duration::from_millis(200), "{latency:?}");
        }
    }
}

#[tokio::test]
async fn overloads_lower_the_limit_and_a_busy_server_raises_it() {
    let layer = AdmissionLayer::builder()
        .adaptive(
            AdaptiveLimit::builder(Aimd::default().backoff(0.5))
                .initial(16)
                .window(Duration::ZERO)
                .min_samples(1),
        )
        .build()
        .unwrap();
    let addr = serve(layer.layer(app())).await;
    for _ in 0..3 {
        text(send(addr, get("/fail")).await).await;
    }
    assert_eq!(
        layer.snapshot().gate.count.capacity,
        Some(2),
        "16 halved three times"
    );
    // Samples taken with half the limit or more in use: it grows by one for each.
    let held = send(addr, get("/slow-body")).await;
    assert_eq!(layer.snapshot().adaptive.unwrap().limit, 3);
    text(send(addr, get("/ok")).await).await;
    assert_eq!(layer.snapshot().adaptive.unwrap().limit, 4);
    drop(held);
}

#[tokio::test]
async fn an_operators_limit_stays_until_handed_back_and_a_close_wins() {
    let (layer, windows) = recording(SampleAt::Head);
    let addr = serve(layer.layer(app())).await;
    layer.gate().count().set_capacity(3).unwrap();
    text(send(addr, get("/ok")).await).await;
    let snapshot = layer.snapshot().adaptive.unwrap();
    assert!(snapshot.fixed);
    assert_eq!((snapshot.limit, snapshot.windows), (3, 1));
    assert!(
        windows.lock().unwrap().is_empty(),
        "the controller is not asked"
    );

    layer.adaptive().unwrap().resume();
    layer.close();
    let refused = send(addr, get("/ok")).await;
    assert_eq!(refused.status(), 503);
    layer.reopen();
    text(send(addr, get("/ok")).await).await;
    assert_eq!(
        layer.snapshot().gate.count.capacity,
        Some(10),
        "back in the controller's hands"
    );
}

#[tokio::test]
async fn a_service_error_is_an_overload() {
    use tower::ServiceExt;
    let (layer, windows) = recording(SampleAt::Head);
    let failing = tower::service_fn(|_: Request<MeteredBody<Full<Bytes>>>| async {
        Err::<Response<Full<Bytes>>, _>("broken")
    });
    let result = layer
        .layer(failing)
        .oneshot(Request::new(Full::default()))
        .await;
    assert!(result.is_err());
    let w = last(&windows).unwrap();
    assert_eq!((w.samples, w.overloaded), (1, 1));
}

#[tokio::test]
async fn a_request_the_layer_refuses_mid_stream_is_not_a_sample() {
    let (recorder, windows) = Recorder::new();
    let layer = AdmissionLayer::builder()
        .adaptive(
            AdaptiveLimit::builder(recorder)
                .window(Duration::ZERO)
                .min_samples(1),
        )
        .bytes(64 << 10)
        .max_request_bytes(1024)
        .build()
        .unwrap();
    let seen = Arc::new(crate::support::Seen::default());
    let addr = serve(layer.layer(crate::support::app(seen.clone()))).await;
    // A chunked upload past the maximum on its second chunk: the handler reads the body,
    // and the layer answers 413 in place of what the handler made of the error.
    let (tx, rx) = mpsc::channel(2);
    tx.send(Bytes::from(vec![0; 800])).await.unwrap();
    tx.send(Bytes::from(vec![0; 800])).await.unwrap();
    drop(tx);
    let request = Request::post("/upload").body(ChannelBody::new(rx)).unwrap();
    let response = send(addr, request).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    text(response).await;
    assert_eq!(
        seen.body_errors.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    assert!(
        windows.lock().unwrap().is_empty(),
        "the layer's refusal is not the service's latency"
    );
    assert_eq!(layer.snapshot().adaptive.unwrap().windows, 0);
}
