//! A server with every request and every connection bounded, in one page.
//!
//! `cargo run --release -p admission-tower --example serve [ADDRESS]` (default
//! `127.0.0.1:3000`), then `curl -i http://127.0.0.1:3000/`. Ctrl-C or SIGTERM stops
//! taking connections and lets admitted requests finish, for at most 30 s.

use std::net::SocketAddr;
use std::time::Duration;

use admission_tower::{AdmissionLayer, ConnectionLimits, PerKey, key};
use axum::{Router, routing::get};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address = std::env::args().nth(1);
    let address = address.as_deref().unwrap_or("127.0.0.1:3000");
    let admission = AdmissionLayer::builder()
        .count(512) // requests in flight; over it, 503 + Retry-After
        .bytes(256 << 20) // bytes their bodies buffer; a body over it alone, 413
        .per_key(PerKey::new(64, key::peer_ip(|peer: &SocketAddr| peer.ip()))) // 429
        // Connections: 10,000 in all and 100 from one address; the defaults bound the
        // rest (a request head within 30 s, 130 s idle, 100 h2 streams, slow readers).
        .connection_limits(
            ConnectionLimits::default()
                .with_max_connections(Some(10_000))
                .with_max_per_address(Some(100)),
        )
        .build()?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(admission.clone());

    let listener = tokio::net::TcpListener::bind(address).await?;
    eprintln!("serving on http://{}", listener.local_addr()?);
    let done = admission
        .serve(listener, app)
        .with_graceful_shutdown(stop_signal(), Duration::from_secs(30))
        .await;
    let cut = done.connections_cut();
    eprintln!("stopped; {cut} connections cut at the deadline");
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
