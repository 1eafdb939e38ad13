//! The wait for a count slot, on the wire: served when a slot frees, refused beyond the
//! waiters, after `max_wait`, before a client deadline it cannot meet, at a drain; and a
//! client that hangs up leaves nothing waiting. HTTP/1.1 and HTTP/2, with hyper's clients.
#![cfg(feature = "tokio")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::support::{Seen, app, eventually, get, next_chunk, send, serve, text, with_header};
use admission_tower::{AdmissionLayer, PerKey, Wait};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tower::Layer;

/// A server behind `layer`; `/stream` holds its slot until `seen.end_streams()`.
async fn server(layer: &AdmissionLayer) -> (SocketAddr, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let addr = serve(layer.layer(app(seen.clone()))).await;
    (addr, seen)
}

/// A `/stream` request that holds the count's one slot (its response has begun, its
/// body stays open) until `seen.end_streams()` or until it is dropped.
async fn hold(addr: SocketAddr) -> http::Response<hyper::body::Incoming> {
    let mut holder = send(addr, get("/stream")).await;
    assert_eq!(next_chunk(&mut holder).await.unwrap(), "first\n");
    holder
}

fn waiting(layer: &AdmissionLayer) -> usize {
    layer.gate().count().waiting()
}

fn wait(max_waiting: usize, max_wait: Duration) -> AdmissionLayer {
    AdmissionLayer::builder()
        .count(1)
        .wait(Wait::new(max_waiting, max_wait))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_request_that_finds_the_count_full_waits_and_is_served_when_a_slot_frees() {
    let layer = wait(4, Duration::from_secs(5));
    let (addr, seen) = server(&layer).await;
    let holder = hold(addr).await;
    let waiter = tokio::spawn(async move { send(addr, get("/")).await });
    eventually("the second request waits", || waiting(&layer) == 1).await;
    assert_eq!(
        seen.calls(),
        1,
        "the inner service is not called while it waits"
    );
    seen.end_streams();
    let answered = waiter.await.unwrap();
    assert_eq!(answered.status(), StatusCode::OK);
    assert_eq!(text(answered).await, "ok");
    drop(holder);
    assert_eq!(waiting(&layer), 0);
    eventually("nothing in flight", || {
        layer.gate().count().in_flight() == 0
    })
    .await;
    let waits = layer.snapshot().wait;
    assert_eq!((waits.admitted, waits.timed_out, waits.deadline), (1, 0, 0));
    assert!(waits.waited_micros > 0);
}

#[tokio::test]
async fn beyond_the_waiters_a_request_is_refused_at_once() {
    let layer = wait(1, Duration::from_secs(5));
    let (addr, seen) = server(&layer).await;
    let _holder = hold(addr).await;
    let _waiter = tokio::spawn(async move { send(addr, get("/")).await });
    eventually("one waits", || waiting(&layer) == 1).await;
    let refused = send(addr, get("/")).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(layer.snapshot().wait.timed_out, 0, "it never waited");
    assert_eq!(
        layer.snapshot().gate.count.refused,
        1,
        "a full queue's refusal is counted once"
    );
    seen.end_streams();
}

#[tokio::test]
async fn a_wait_that_runs_out_is_refused_and_leaves_nothing_waiting() {
    let layer = wait(4, Duration::from_millis(100));
    let (addr, seen) = server(&layer).await;
    let _holder = hold(addr).await;
    let started = tokio::time::Instant::now();
    let refused = send(addr, get("/")).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "it waited first"
    );
    assert_eq!(waiting(&layer), 0);
    assert_eq!(layer.gate().count().in_flight(), 1, "the holder's alone");
    let waits = layer.snapshot().wait;
    assert_eq!((waits.admitted, waits.timed_out, waits.deadline), (0, 1, 0));
    seen.end_streams();
}

/// The refusal hook sees how long a refused request waited.
#[tokio::test]
async fn the_refusal_hook_sees_the_wait() {
    let seen_waits = Arc::new(std::sync::Mutex::new(Vec::new()));
    let hook_waits = seen_waits.clone();
    let layer = AdmissionLayer::builder()
        .count(1)
        .wait(Wait::new(4, Duration::from_millis(50)))
        .on_refusal(move |event| hook_waits.lock().unwrap().push(event.waited))
        .build()
        .unwrap();
    let (addr, seen) = server(&layer).await;
    let _holder = hold(addr).await;
    assert_eq!(
        send(addr, get("/")).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let waits = seen_waits.lock().unwrap().clone();
    assert_eq!(waits.len(), 1);
    assert!(waits[0] >= Duration::from_millis(50), "{waits:?}");
    seen.end_streams();
}

/// A client whose deadline (less the time to answer) leaves no time to wait is refused at
/// once, not made to wait for an answer it would not see.
#[tokio::test]
async fn a_client_deadline_too_close_to_meet_is_refused_at_once() {
    let layer = AdmissionLayer::builder()
        .count(1)
        .wait(
            Wait::new(4, Duration::from_secs(5))
                .deadline_header(http::HeaderName::from_static("x-timeout-ms"))
                .service_time(Duration::from_millis(50)),
        )
        .build()
        .unwrap();
    let (addr, seen) = server(&layer).await;
    let _holder = hold(addr).await;
    let started = tokio::time::Instant::now();
    let refused = send(addr, with_header("/", "x-timeout-ms", "20")).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(started.elapsed() < Duration::from_secs(2), "at once");
    // A deadline with room waits, for at most the room: 150 ms - 50 ms.
    let started = tokio::time::Instant::now();
    let refused = send(addr, with_header("/", "x-timeout-ms", "150")).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(100) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    let waits = layer.snapshot().wait;
    assert_eq!((waits.timed_out, waits.deadline), (1, 1));
    seen.end_streams();
}

#[tokio::test]
async fn a_client_that_hangs_up_while_waiting_leaves_nothing_waiting() {
    let layer = wait(4, Duration::from_secs(30));
    let (addr, seen) = server(&layer).await;
    let holder = hold(addr).await;
    let waiter = tokio::spawn(async move { send(addr, get("/")).await });
    eventually("it waits", || waiting(&layer) == 1).await;
    // The client goes away: its connection closes, and the server drops the request.
    waiter.abort();
    eventually("the waiter leaves the queue", || waiting(&layer) == 0).await;
    seen.end_streams();
    drop(holder);
    eventually("nothing in flight", || {
        layer.gate().count().in_flight() == 0
    })
    .await;
    assert_eq!(seen.calls(), 1, "the hung-up request was never served");
}

#[tokio::test]
async fn a_drain_refuses_every_waiter_at_once() {
    let layer = wait(4, Duration::from_secs(30));
    let (addr, seen) = server(&layer).await;
    let holder = hold(addr).await;
    let waiter = tokio::spawn(async move { send(addr, get("/")).await });
    eventually("it waits", || waiting(&layer) == 1).await;
    let drain = layer.drain();
    let refused = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("refused at once")
        .unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        layer.snapshot().wait.timed_out,
        0,
        "refused by the drain, not by time"
    );
    seen.end_streams();
    drop(holder);
    tokio::time::timeout(Duration::from_secs(5), drain)
        .await
        .expect("drained");
}

/// A key at its cap is refused at once (429), never queued: one client cannot fill the
/// queue.
#[tokio::test]
async fn a_key_at_its_cap_never_waits() {
    let layer = AdmissionLayer::builder()
        .count(1)
        .per_key(PerKey::new(
            1,
            admission_tower::key::header(http::HeaderName::from_static("x-client")),
        ))
        .wait(Wait::new(4, Duration::from_secs(5)))
        .build()
        .unwrap();
    let (addr, seen) = server(&layer).await;
    let hold = http::Request::get("/stream")
        .header("x-client", "a")
        .body(Full::<Bytes>::default())
        .unwrap();
    let mut holder = send(addr, hold).await;
    next_chunk(&mut holder).await;
    let same = send(addr, with_header("/", "x-client", "a")).await;
    assert_eq!(same.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(waiting(&layer), 0);
    seen.end_streams();
}

/// Over HTTP/2, on one connection: a waiting stream is served once the slot frees.
#[tokio::test]
async fn over_http2_a_waiting_stream_is_served() {
    let layer = wait(4, Duration::from_secs(5));
    let seen = Arc::new(Seen::default());
    let addr = crate::support::serve_on(layer.layer(app(seen.clone())), true).await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut holder = sender.send_request(get("/stream")).await.unwrap();
    let first = holder.body_mut().frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "first\n");
    let mut second = sender.clone();
    let waiter = tokio::spawn(async move { second.send_request(get("/")).await.unwrap() });
    eventually("the stream waits", || waiting(&layer) == 1).await;
    seen.end_streams();
    let answered = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("served")
        .unwrap();
    assert_eq!(answered.status(), StatusCode::OK);
}

#[tokio::test]
async fn each_waiter_is_counted_once_where_its_wait_ended() {
    let layer = wait(4, Duration::from_millis(300));
    crate::support::three_waiters(&layer).await;
    let snapshot = layer.snapshot();
    let waits = snapshot.wait;
    assert_eq!((waits.admitted, waits.timed_out, waits.deadline), (1, 1, 0));
    assert_eq!(snapshot.gone, 1, "the waiter whose client hung up");
    assert_eq!(
        snapshot.gate.count.refused, 0,
        "no waiter is a refusal of the count ledger's"
    );
}
