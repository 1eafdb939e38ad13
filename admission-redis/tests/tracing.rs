//! The `tracing` feature: a warning when a replica goes on its fallback, one event when it
//! rejoins, a debug event when a key's grant falls short, each with the cap's name.
//! (`cargo test -p admission-redis --features tracing`.)

#![cfg(feature = "tracing")]

mod support;

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission_redis::FleetCap;
use support::{Redis, Replica, Running, eventually_within, get, load};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber, span};

/// The events of admission-redis, as their level and their fields written out.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<(Level, String)>>>);

struct Fields<'a>(&'a mut String);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
}

impl Subscriber for Collector {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target().starts_with("admission_redis")
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = String::new();
        event.record(&mut Fields(&mut fields));
        let level = *event.metadata().level();
        self.0.lock().unwrap().push((level, fields));
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

impl Collector {
    fn at(&self, level: Level) -> Vec<String> {
        let events = self.0.lock().unwrap();
        let at = events.iter().filter(|(l, _)| *l == level);
        at.map(|(_, fields)| fields.clone()).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_says_when_it_falls_back_rejoins_and_is_refused_a_grant() {
    let Some(mut redis) = Redis::start("tracing") else {
        return;
    };
    let events = Collector::default();
    tracing::subscriber::set_global_default(events.clone()).unwrap();
    let build = |name: &str| {
        FleetCap::builder(redis.client(), 2)
            .ttl(Duration::from_millis(600))
            .prefix("traced")
            .name(name)
            .build()
            .unwrap()
    };
    let running = Arc::new(Running::default());
    let a = Replica::start(build("a"), running.clone(), Duration::from_millis(400)).await;
    let b = Replica::start(build("b"), running, Duration::from_millis(400)).await;
    let addr = a.addr;

    // a holds the cap with requests in flight: b's grant falls short.
    let busy = load(
        std::slice::from_ref(&addr),
        2,
        "acme",
        Duration::from_millis(100),
    );
    let refused = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        get(b.addr, "acme").await
    };
    let (_, refused) = tokio::join!(busy, refused);
    assert_eq!(refused, http::StatusCode::TOO_MANY_REQUESTS);
    let short = events.at(Level::DEBUG);
    assert!(
        short
            .iter()
            .any(|e| e.contains("name=\"b\"") && e.contains("wanted=")),
        "{short:?}"
    );
    assert!(
        !short.iter().any(|e| e.contains("acme")),
        "never the key: {short:?}"
    );
    assert!(events.at(Level::WARN).is_empty(), "nothing amiss yet");

    redis.stop();
    let _ = load(&[a.addr], 1, "globex", Duration::from_millis(150)).await;
    eventually_within("a warning", Duration::from_secs(2), || {
        !events.at(Level::WARN).is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // b's heartbeat fails too
    let warned = events.at(Level::WARN);
    let of = |name: &str| {
        let name = format!("name=\"{name}\"");
        warned
            .iter()
            .filter(|e| e.contains(&name) && e.contains("reason="))
            .count()
    };
    assert_eq!(
        (of("a"), of("b")),
        (1, 1),
        "one warning a fallback: {warned:?}"
    );

    redis.restart();
    eventually_within("both back", Duration::from_secs(3), || {
        events.at(Level::INFO).len() == 2
    })
    .await;
    assert!(events.at(Level::INFO)[0].contains("fleet cap: Redis answers again"));
    assert_eq!(events.at(Level::WARN).len(), 2);
}
