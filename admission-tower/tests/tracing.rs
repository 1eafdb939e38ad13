//! The `tracing` feature on a real server: a debug event per refusal (never the key), and
//! one warning per saturation, re-armed only once the ledger has been well below its
//! limit again. (`cargo test -p admission-tower --features tracing`.)

#![cfg(feature = "tracing")]

mod support;

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use admission_tower::{AdmissionLayer, PerKey, key};
use http::StatusCode;
use support::{Seen, app, get, post, send, serve, text, with_header};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber, span};

/// Every event, as its level and its fields written out.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<(Level, String)>>>);

struct Fields<'a>(&'a mut String);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
}

impl Subscriber for Collector {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = String::new();
        event.record(&mut Fields(&mut fields));
        if fields.contains("admission") {
            self.0
                .lock()
                .unwrap()
                .push((*event.metadata().level(), fields));
        }
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

impl Collector {
    fn at(&self, level: Level) -> Vec<String> {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|(l, _)| *l == level)
            .map(|(_, f)| f.clone())
            .collect()
    }
}

#[tokio::test]
async fn each_refusal_is_a_debug_event_and_each_saturation_one_warning() {
    let collector = Collector::default();
    let _guard = tracing::subscriber::set_default(collector.clone());
    let layer = AdmissionLayer::builder()
        .name("edge")
        .count(2)
        .per_key(PerKey::new(
            8,
            key::header(http::HeaderName::from_static("x-tenant")),
        ))
        .build()
        .unwrap();
    let seen = Arc::new(Seen::default());
    let addr = serve(tower::Layer::layer(&layer, app(seen.clone()))).await;
    let stream = || with_header("/stream", "x-tenant", "secret-tenant");

    // Saturated: three refusals, one warning.
    let mut open = vec![send(addr, stream()).await, send(addr, stream()).await];
    for _ in 0..3 {
        let refused = send(addr, stream()).await;
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        text(refused).await;
    }
    assert_eq!(collector.at(Level::DEBUG).len(), 3);
    assert_eq!(
        collector.at(Level::WARN).len(),
        1,
        "flapping at the limit warns once"
    );

    // Well below again (one in flight of two), then saturated again: a second warning.
    seen.end_streams();
    for response in open.drain(..) {
        text(response).await;
    }
    let count = layer.gate().count().clone();
    support::eventually("idle", || count.in_flight() == 0).await;
    assert_eq!(send(addr, get("/")).await.status(), StatusCode::OK);
    open.push(send(addr, stream()).await);
    open.push(send(addr, stream()).await);
    for _ in 0..2 {
        text(send(addr, stream()).await).await;
    }
    let warnings = collector.at(Level::WARN);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[1].contains("name=\"edge\"") && warnings[1].contains("limit=2"));

    let refusals = collector.at(Level::DEBUG);
    assert_eq!(refusals.len(), 5);
    for event in &refusals {
        assert!(
            event.contains("dimension=\"count\"") && event.contains("status=503"),
            "{event}"
        );
        assert!(event.contains("name=\"edge\""), "{event}");
    }
    let all = collector.0.lock().unwrap();
    assert!(
        all.iter().all(|(_, f)| !f.contains("secret-tenant")),
        "a key was logged"
    );
    drop(all);
    seen.end_streams();
}

#[tokio::test]
async fn an_admission_near_the_limit_does_not_rearm_and_the_byte_budget_warns_once() {
    let collector = Collector::default();
    let _guard = tracing::subscriber::set_default(collector.clone());
    let layer = AdmissionLayer::builder()
        .name("edge")
        .count(4)
        .bytes(100)
        .build()
        .unwrap();
    let seen = Arc::new(Seen::default());
    let addr = serve(tower::Layer::layer(&layer, app(seen.clone()))).await;
    let count = layer.gate().count().clone();

    // At the limit: a refusal warns.
    let mut open = Vec::new();
    for _ in 0..4 {
        open.push(send(addr, get("/stream")).await);
    }
    text(send(addr, get("/stream")).await).await;
    assert_eq!(collector.at(Level::WARN).len(), 1);
    // One stream ends (3 of 4 in flight), one more is admitted: 4 of 4 is not well below
    // the limit, so the warning is not re-armed and the next refusal gives none.
    drop(seen.streams.lock().unwrap().remove(0));
    text(open.remove(0)).await;
    support::eventually("one released", || count.in_flight() == 3).await;
    open.push(send(addr, get("/stream")).await);
    text(send(addr, get("/stream")).await).await;
    let warnings = collector.at(Level::WARN);
    assert_eq!(warnings.len(), 1, "re-armed near the limit: {warnings:?}");
    seen.end_streams();
    for response in open.drain(..) {
        text(response).await;
    }
    support::eventually("idle", || count.in_flight() == 0).await;

    // The byte budget: 60 of 100 bytes held by an open stream, then two requests of 60
    // refused; the first warns, naming the budget, the second does not.
    open.push(send(addr, post("/stream", vec![b'x'; 60])).await);
    for _ in 0..2 {
        let refused = send(addr, post("/stream", vec![b'x'; 60])).await;
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        text(refused).await;
        let warnings = collector.at(Level::WARN);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[1].contains("byte budget") && warnings[1].contains("limit=100"),
            "{warnings:?}"
        );
    }
    seen.end_streams();
    for response in open.drain(..) {
        text(response).await;
    }
}
