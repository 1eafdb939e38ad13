//! One replica of a fleet whose API keys are each capped across every replica, in a page:
//! `AdmissionLayer::serve`, a `FleetCap` on Redis, Prometheus metrics, and a shutdown that
//! gives the replica's leases back.
//!
//! `REDIS_URL=redis://127.0.0.1/ cargo run --release -p admission-redis --example fleet
//! [ADDRESS]` (default `127.0.0.1:3000`), on as many replicas as you like, then
//! `curl -i -H 'x-api-key: acme' http://127.0.0.1:3000/` and
//! `curl http://127.0.0.1:3000/metrics`. Ctrl-C or SIGTERM stops taking connections, lets
//! admitted requests finish (30 s at most), then gives the replica's leases back.

use std::time::Duration;

use admission_redis::FleetCap;
use admission_tower::{AdmissionLayer, key};
use axum::{Router, routing::get};
use http::HeaderName;
use metrics_exporter_prometheus::PrometheusBuilder;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address = std::env::args().nth(1);
    let address = address.as_deref().unwrap_or("127.0.0.1:3000");
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1/".into());
    let prometheus = PrometheusBuilder::new().install_recorder()?;

    // Each API key: at most 16 requests in flight across every replica. `replicas`: the
    // most replicas that may start while Redis is down (each then holds a key to 16 / 4);
    // without it, such a replica refuses keyed requests until Redis answers.
    let fleet = FleetCap::builder(redis::Client::open(url)?, 16)
        .replicas(4)
        .build()?;
    let admission = AdmissionLayer::builder()
        .name("api") // the `name` label of the layer's and the fleet cap's series
        .count(512) // this replica's own bound: 503 + Retry-After over it
        .per_key(fleet.per_key(key::header(HeaderName::from_static("x-api-key")))) // 429
        .build()?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(admission.clone())
        // Outside the layer: a scrape is never refused.
        .route(
            "/metrics",
            get(move || std::future::ready(prometheus.render())),
        );

    let listener = tokio::net::TcpListener::bind(address).await?;
    eprintln!("serving on http://{}", listener.local_addr()?);
    admission
        .serve(listener, app)
        .with_graceful_shutdown(stop_signal(), Duration::from_secs(30))
        .await;
    // The last request has finished: the other replicas may take this one's slots now,
    // rather than when its leases expire.
    fleet.release().await;
    Ok(())
}

/// Ctrl-C, or SIGTERM where there is one (what an orchestrator sends).
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler");
        tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    drop(tokio::signal::ctrl_c().await);
}
