//! Fair shares on the wire: a light client admitted while a heavy one is refused (no
//! wait), a lone client using the whole count, and waiting clients served in turn.

use std::net::SocketAddr;
use std::sync::Arc;
#[cfg(feature = "tokio")]
use std::time::Duration;

use crate::support::{Seen, app, eventually, next_chunk, send, serve, with_header};
use admission_tower::{AdmissionLayer, BuildError, FairShare, PerKey, key};
use http::{HeaderName, StatusCode};
use tower::Layer;

fn tenant() -> impl Fn(&http::request::Parts) -> Option<admission_tower::Key> + Send + Sync {
    key::header(HeaderName::from_static("x-tenant"))
}

async fn server(layer: &AdmissionLayer) -> (SocketAddr, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let addr = serve(layer.layer(app(seen.clone()))).await;
    (addr, seen)
}

/// A `/stream` request of `tenant` that holds its slot (its body stays open).
async fn hold(addr: SocketAddr, tenant: &str) -> http::Response<hyper::body::Incoming> {
    let mut held = send(addr, with_header("/stream", "x-tenant", tenant)).await;
    assert_eq!(held.status(), StatusCode::OK);
    assert_eq!(next_chunk(&mut held).await.unwrap(), "first\n");
    held
}

async fn status(addr: SocketAddr, tenant: &str) -> http::Response<hyper::body::Incoming> {
    send(addr, with_header("/", "x-tenant", tenant)).await
}

#[tokio::test]
async fn near_full_the_heavy_client_is_refused_429_and_the_light_one_admitted() {
    // 4 slots, 1 kept for clients below their share.
    let layer = AdmissionLayer::builder()
        .count(4)
        .fair_share(FairShare::by(tenant()).headroom(0.25))
        .build()
        .unwrap();
    let (addr, seen) = server(&layer).await;

    // Alone, the heavy client takes the whole count.
    let mut alone = Vec::new();
    for _ in 0..4 {
        alone.push(hold(addr, "heavy").await);
    }
    let full = status(addr, "heavy").await;
    assert_eq!(
        full.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "the count is full"
    );
    seen.end_streams();
    drop(alone);
    eventually("nothing in flight", || {
        layer.gate().count().in_flight() == 0
    })
    .await;

    // The light client has work (it sent a request), the heavy one fills to the headroom.
    assert_eq!(status(addr, "light").await.status(), StatusCode::OK);
    let mut heavy = Vec::new();
    for _ in 0..3 {
        heavy.push(hold(addr, "heavy").await);
    }
    let shed = status(addr, "heavy").await;
    assert_eq!(
        shed.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "over its share of 2"
    );
    assert!(shed.headers().contains_key(http::header::RETRY_AFTER));
    let light = hold(addr, "light").await;
    assert_eq!(layer.gate().count().in_flight(), 4);
    assert_eq!(layer.gate().active_keys(), Some(2));
    seen.end_streams();
    drop((heavy, light));
}

#[test]
fn fair_shares_that_cannot_work_are_build_errors() {
    let build = |builder: admission_tower::AdmissionBuilder| builder.build().unwrap_err();
    let no_key = build(
        AdmissionLayer::builder()
            .count(4)
            .fair_share(FairShare::per_key()),
    );
    let two_keys = build(
        AdmissionLayer::builder()
            .count(4)
            .per_key(PerKey::new(2, tenant()))
            .fair_share(FairShare::by(tenant())),
    );
    let no_count = build(AdmissionLayer::builder().fair_share(FairShare::by(tenant())));
    let headroom = build(
        AdmissionLayer::builder()
            .count(4)
            .fair_share(FairShare::by(tenant()).headroom(1.5)),
    );
    for error in [no_key, two_keys, no_count, headroom] {
        assert!(matches!(error, BuildError::FairShare(_)), "{error}");
    }
    // The per-key cap's key, with a cap of its own as well.
    assert!(
        AdmissionLayer::builder()
            .count(4)
            .per_key(PerKey::new(3, tenant()))
            .fair_share(FairShare::per_key())
            .build()
            .is_ok()
    );
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn with_a_wait_waiting_clients_are_served_in_turn() {
    use admission_tower::Wait;

    let layer = AdmissionLayer::builder()
        .count(1)
        .wait(Wait::new(8, Duration::from_secs(10)))
        .fair_share(FairShare::by(tenant()))
        .build()
        .unwrap();
    let (addr, seen) = server(&layer).await;
    let waiting = || layer.gate().count().waiting();
    let holder = hold(addr, "heavy").await;
    // Three of the heavy client's, then one of the light client's, wait in that order.
    let mut waiters = Vec::new();
    for (n, tenant) in ["heavy", "heavy", "heavy", "light"].into_iter().enumerate() {
        waiters.push((
            tenant,
            tokio::spawn(async move { hold(addr, tenant).await }),
        ));
        eventually("it waits", || waiting() == n + 1).await;
    }
    // Each slot freed goes to the next in turn: heavy (first to wait), light, heavy, heavy.
    let mut served = Vec::new();
    let mut responses = vec![holder];
    for left in (0..4).rev() {
        // The oldest holder's stream ends: its slot frees.
        drop(seen.streams.lock().unwrap().remove(0));
        responses.remove(0);
        eventually("the slot goes on", || waiting() == left).await;
        eventually("its waiter is answered", || {
            waiters.iter().any(|(_, waiter)| waiter.is_finished())
        })
        .await;
        let at = waiters
            .iter()
            .position(|(_, waiter)| waiter.is_finished())
            .expect("one waiter was served");
        let (tenant, waiter) = waiters.remove(at);
        assert!(
            waiters.iter().all(|(_, waiter)| !waiter.is_finished()),
            "one slot, one waiter"
        );
        responses.push(waiter.await.unwrap());
        served.push(tenant);
    }
    assert_eq!(served, ["heavy", "light", "heavy", "heavy"]);
    seen.end_streams();
}
