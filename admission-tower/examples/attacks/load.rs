//! The legitimate clients: hyper-util's pooled h2 client, one per loopback address, and
//! the two loads they make (a closed loop for the capacity, a fixed schedule for a run).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use super::loopback;

/// How long a legitimate request may take before it counts as failed.
const TIMEOUT: Duration = Duration::from_secs(10);

/// One pooled client per address.
pub(crate) struct Clients {
    uri: Uri,
    clients: Vec<Client<HttpConnector, Empty<Bytes>>>,
}

/// What one run of the schedule gave.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) offered: f64,
    pub(crate) goodput: f64,
    /// Answered 429 or 503 (a client address at its cap, the count limit full).
    pub(crate) refused: u64,
    /// Answered otherwise, or not in time.
    pub(crate) failed: u64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
}

impl Clients {
    /// A client on each of 127.0.1.1 to 127.0.1.`count`.
    pub(crate) fn new(addr: SocketAddr, count: u8) -> Self {
        let clients = (1..=count)
            .map(|host| {
                let mut http = HttpConnector::new();
                http.set_local_address(Some(loopback(1, host)));
                Client::builder(TokioExecutor::new())
                    .http2_only(true)
                    .build(http)
            })
            .collect();
        Self {
            uri: format!("http://{addr}/work").parse().expect("a URI"),
            clients,
        }
    }

    /// One GET by client `i`: its status, if it got one in time.
    async fn get(&self, i: usize) -> Option<StatusCode> {
        let client = &self.clients[i % self.clients.len()];
        let request = async {
            let response = client.get(self.uri.clone()).await.ok()?;
            let status = response.status();
            response.into_body().collect().await.ok()?;
            Some(status)
        };
        tokio::time::timeout(TIMEOUT, request).await.ok().flatten()
    }

    /// Requests a second served by `workers` clients each sending one request after
    /// another for `within`.
    pub(crate) async fn capacity(self: &Arc<Self>, workers: usize, within: Duration) -> f64 {
        let ok = Arc::new(AtomicU64::new(0));
        let end = Instant::now() + within;
        let tasks: Vec<_> = (0..workers)
            .map(|i| {
                let (clients, ok) = (self.clone(), ok.clone());
                tokio::spawn(async move {
                    while Instant::now() < end {
                        if clients.get(i).await == Some(StatusCode::OK) {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
        ok.load(Ordering::Relaxed) as f64 / within.as_secs_f64()
    }

    /// `rate` requests a second for `within`, each sent at its scheduled time whatever
    /// the server does, its latency counted from that time.
    pub(crate) async fn offer(self: &Arc<Self>, rate: f64, within: Duration) -> Outcome {
        let n = (rate * within.as_secs_f64()) as usize;
        let start = Instant::now();
        let mut tasks = Vec::with_capacity(n);
        for i in 0..n {
            let at = start + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(at).await;
            let clients = self.clone();
            tasks.push(tokio::spawn(async move {
                let status = clients.get(i).await;
                (status, at.elapsed())
            }));
        }
        let mut latencies = Vec::with_capacity(n);
        let (mut refused, mut failed) = (0, 0);
        for task in tasks {
            match task.await {
                Ok((Some(StatusCode::OK), latency)) => latencies.push(latency),
                Ok((Some(StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE), _)) => {
                    refused += 1
                }
                _ => failed += 1,
            }
        }
        latencies.sort();
        let quantile = |q: f64| {
            latencies
                .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
                .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
        };
        Outcome {
            offered: n as f64 / within.as_secs_f64(),
            goodput: latencies.len() as f64 / within.as_secs_f64(),
            refused,
            failed,
            p50_ms: quantile(0.5),
            p99_ms: quantile(0.99),
        }
    }
}
