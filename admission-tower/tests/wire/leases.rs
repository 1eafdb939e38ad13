//! Per-key caps leased from elsewhere ([`Leases`]), on a real server: a request its key's
//! lease refuses asks it to grow once, holding nothing meanwhile, and is admitted on what
//! it then holds or refused 429.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{Seen, app, next_chunk, send, serve, with_header};
use admission_tower::admission_core::KeyedLedger;
use admission_tower::{AdmissionLayer, BuildError, Key, Leases, LeasesTaken, PerKey, Wait, key};
use http::StatusCode;

/// Leases kept in a map: each grow adds one slot, up to `most`, after `delay`.
#[derive(Default)]
struct Granted {
    caps: Mutex<HashMap<Key, usize>>,
    most: usize,
    delay: Duration,
    grows: AtomicUsize,
    attached: Mutex<Option<KeyedLedger<Key>>>,
}

impl Leases for Granted {
    fn cap(&self, key: &Key) -> usize {
        self.caps.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    fn grow(&self, key: &Key) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        self.grows.fetch_add(1, Ordering::SeqCst);
        let mut caps = self.caps.lock().unwrap();
        let cap = caps.entry(*key).or_default();
        *cap = (*cap + 1).min(self.most);
        Box::pin(tokio::time::sleep(self.delay))
    }

    fn attach(&self, keyed: &KeyedLedger<Key>, _layer: &str) -> Result<(), LeasesTaken> {
        let mut attached = self.attached.lock().unwrap();
        if attached.is_some() {
            return Err(LeasesTaken);
        }
        *attached = Some(keyed.clone());
        Ok(())
    }
}

#[test]
fn leases_given_to_a_second_layer_fail_its_build() {
    let leases = Arc::new(Granted::default());
    let per_key = || {
        PerKey::new(16, key::header(http::HeaderName::from_static("x-tenant")))
            .leased(leases.clone())
    };
    let first = AdmissionLayer::builder().per_key(per_key()).build();
    assert!(first.is_ok());
    let second = AdmissionLayer::builder().per_key(per_key()).build();
    let error = second.unwrap_err();
    assert_eq!(error, BuildError::LeasesTaken);
    assert!(error.to_string().contains("another layer"), "{error}");
}

fn tenant(name: &str) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    with_header("/stream", "x-tenant", name)
}

/// A layer of `count` slots (waiting up to 10 s for one, with `wait`) whose per-tenant
/// caps are leased from `leases`.
fn leased(leases: Arc<dyn Leases>, count: usize, wait: bool) -> AdmissionLayer {
    let per_key =
        PerKey::new(16, key::header(http::HeaderName::from_static("x-tenant"))).leased(leases);
    let builder = AdmissionLayer::builder().count(count).per_key(per_key);
    let builder = if wait {
        builder.wait(Wait::new(4, Duration::from_secs(10)))
    } else {
        builder
    };
    builder.build().unwrap()
}

#[tokio::test]
async fn a_key_refused_by_its_lease_is_admitted_once_it_grows_and_refused_past_it() {
    let leases = Arc::new(Granted {
        most: 2,
        delay: Duration::from_millis(20),
        ..Granted::default()
    });
    let layer = leased(leases.clone(), 8, false);
    let keyed = layer.gate().keyed().unwrap().clone();
    assert!(
        leases.attached.lock().unwrap().is_some(),
        "the layer attached its ledger"
    );
    let seen = Arc::new(Seen::default());
    let addr = serve(tower::Layer::layer(&layer, app(seen.clone()))).await;

    // No lease yet: the first request asks for one and is admitted on it; the second too.
    let mut held = Vec::new();
    for expected in 1..=2 {
        let mut response = send(addr, tenant("acme")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(next_chunk(&mut response).await.unwrap(), "first\n");
        held.push(response);
        assert_eq!(leases.grows.load(Ordering::SeqCst), expected);
        assert_eq!(keyed.in_flight(&Key::from("acme")), expected as u64);
    }
    // The lease cannot grow past 2: asked once more, then 429, with nothing held.
    let refused = send(addr, tenant("acme")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(leases.grows.load(Ordering::SeqCst), 3);
    assert_eq!(layer.gate().count().in_flight(), 2);
    assert_eq!(
        seen.calls(),
        2,
        "the refused request never reached the handler"
    );
    // Another key has its own lease; a key with room asks nothing.
    let mut other = send(addr, tenant("globex")).await;
    assert_eq!(next_chunk(&mut other).await.unwrap(), "first\n");
    assert_eq!(leases.grows.load(Ordering::SeqCst), 4);
    drop(held.pop());
    crate::support::eventually("a slot freed", || keyed.in_flight(&Key::from("acme")) == 1).await;
    let mut again = send(addr, tenant("acme")).await;
    assert_eq!(next_chunk(&mut again).await.unwrap(), "first\n");
    assert_eq!(
        leases.grows.load(Ordering::SeqCst),
        4,
        "within its lease: no grow"
    );
    drop((held, other, again));
    crate::support::eventually("every permit back", || {
        layer.gate().count().in_flight() == 0
    })
    .await;
}

#[tokio::test]
async fn a_request_whose_lease_grew_waits_for_a_count_slot_as_any() {
    let leases = Arc::new(Granted {
        most: 4,
        ..Granted::default()
    });
    let layer = leased(leases.clone(), 1, true);
    let seen = Arc::new(Seen::default());
    let addr = serve(tower::Layer::layer(&layer, app(seen.clone()))).await;
    // Another tenant holds the one count slot.
    let mut holder = send(addr, tenant("globex")).await;
    assert_eq!(next_chunk(&mut holder).await.unwrap(), "first\n");
    // acme's lease grows; it then finds the count full and waits, then is served.
    let waiter = tokio::spawn(async move { send(addr, tenant("acme")).await });
    crate::support::eventually("it waits", || layer.gate().count().waiting() == 1).await;
    assert_eq!(leases.grows.load(Ordering::SeqCst), 2);
    seen.end_streams();
    drop(holder);
    let mut served = waiter.await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    assert_eq!(next_chunk(&mut served).await.unwrap(), "first\n");
}

/// Leases whose cap is lowered from `before` to `after` once read `lower_after` times, or
/// once `lowered`: a lease taken back between the read of its cap and the request's
/// permit.
struct Lowered {
    before: usize,
    after: usize,
    reads: AtomicUsize,
    lower_after: usize,
    lowered: std::sync::atomic::AtomicBool,
    grows: AtomicUsize,
}

impl Lowered {
    fn new(before: usize, after: usize, lower_after: usize) -> Self {
        Self {
            before,
            after,
            reads: AtomicUsize::new(0),
            lower_after,
            lowered: Default::default(),
            grows: AtomicUsize::new(0),
        }
    }
}

impl Leases for Lowered {
    fn cap(&self, _: &Key) -> usize {
        let read = self.reads.fetch_add(1, Ordering::SeqCst);
        if read < self.lower_after && !self.lowered.load(Ordering::SeqCst) {
            self.before
        } else {
            self.after
        }
    }

    fn grow(&self, _: &Key) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        self.grows.fetch_add(1, Ordering::SeqCst);
        Box::pin(std::future::ready(()))
    }

    fn attach(&self, _: &KeyedLedger<Key>, _: &str) -> Result<(), LeasesTaken> {
        Ok(())
    }
}

#[tokio::test]
async fn a_lease_lowered_as_a_request_is_admitted_lets_it_go() {
    // Read once for the claim (4 slots), then lowered to 0 before the second read.
    let leases = Arc::new(Lowered::new(4, 0, 1));
    let layer = leased(leases.clone(), 8, false);
    let seen = Arc::new(Seen::default());
    let addr = serve(tower::Layer::layer(&layer, app(seen.clone()))).await;
    let refused = send(addr, tenant("acme")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(seen.calls(), 0, "let go before the handler");
    assert_eq!(
        leases.grows.load(Ordering::SeqCst),
        1,
        "refused by its lease, it asked the lease to grow"
    );
    assert_eq!(layer.gate().count().in_flight(), 0);
    assert_eq!(layer.gate().keyed().unwrap().keys(), 0);

    // Lowered, but not below what is in flight: the request stays.
    let kept = Arc::new(Lowered::new(4, 1, 1));
    let layer = leased(kept.clone(), 8, false);
    let addr = serve(tower::Layer::layer(&layer, app(seen.clone()))).await;
    let mut admitted = send(addr, tenant("acme")).await;
    assert_eq!(admitted.status(), StatusCode::OK);
    assert_eq!(next_chunk(&mut admitted).await.unwrap(), "first\n");
    assert_eq!(kept.grows.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_lease_lowered_while_a_request_waits_for_a_count_slot_lets_it_go() {
    let leases = Arc::new(Lowered::new(4, 0, usize::MAX));
    let layer = leased(leases.clone(), 1, true);
    let seen = Arc::new(Seen::default());
    let addr = serve(tower::Layer::layer(&layer, app(seen.clone()))).await;
    let mut holder = send(addr, tenant("globex")).await;
    assert_eq!(next_chunk(&mut holder).await.unwrap(), "first\n");
    // acme waits for the count slot with a claim on a lease of 4, which is then taken.
    let waiter = tokio::spawn(async move { send(addr, tenant("acme")).await });
    crate::support::eventually("it waits", || layer.gate().count().waiting() == 1).await;
    leases.lowered.store(true, Ordering::SeqCst);
    seen.end_streams();
    drop(holder);
    let refused = waiter.await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(seen.calls(), 1, "only the holder reached the handler");
    crate::support::eventually("nothing held", || layer.gate().count().in_flight() == 0).await;
}
