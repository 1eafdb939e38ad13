//! An adaptive limit finding a real server's capacity:
//! `cargo run --release -p admission-tower --example adaptive`.
//!
//! A hyper server on 127.0.0.1 whose handler needs one of `CAPACITY` slots (a semaphore:
//! requests beyond it wait inside the server, as they would for a connection pool or a
//! worker) and holds it for a fixed service time. In front, an `AdmissionLayer` with a
//! `Gradient` adaptive limit, started at four times the capacity and told neither the
//! capacity nor the service time. Closed-loop clients, three times as many as the
//! capacity, keep it overloaded for a few seconds (a refused client waits 10 ms before
//! trying again).
//!
//! It prints the limit's trajectory every quarter second (the limit, what is in flight,
//! what waits inside the server, answers and refusals so far) and exits non-zero if the
//! limit's average over the last seconds of the overload is not within 0.75x-1.5x of the
//! capacity.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use admission_tower::adaptive::{AdaptiveLimit, Gradient};
use admission_tower::{AdmissionLayer, MeteredBody};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::Layer;

const CAPACITY: usize = 32;
const SERVICE_TIME: Duration = Duration::from_millis(20);
const START_AT: u64 = 4 * CAPACITY as u64;
const CLIENTS: usize = 3 * CAPACITY;
const OVERLOAD: Duration = Duration::from_secs(6);
/// The limit's average is judged over the overload after this.
const SETTLED: Duration = Duration::from_secs(3);
const SHED_PAUSE: Duration = Duration::from_millis(10);

#[derive(Default)]
struct Tally {
    answered: AtomicU64,
    shed: AtomicU64,
    waiting: AtomicU64,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let layer = AdmissionLayer::builder()
        .adaptive(
            AdaptiveLimit::builder(Gradient::default())
                .bounds(1, 10_000)
                .initial(START_AT),
        )
        .build()
        .expect("a valid layer");

    let slots = Arc::new(Semaphore::new(CAPACITY));
    let tally = Arc::new(Tally::default());
    let server_tally = tally.clone();
    let app = tower::service_fn(move |_: Request<MeteredBody<Incoming>>| {
        let (slots, tally) = (slots.clone(), server_tally.clone());
        async move {
            tally.waiting.fetch_add(1, Ordering::Relaxed);
            let slot = slots.acquire().await.expect("never closed");
            tally.waiting.fetch_sub(1, Ordering::Relaxed);
            tokio::time::sleep(SERVICE_TIME).await;
            drop(slot);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let service = layer.layer(app);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });

    println!(
        "a server of {CAPACITY} slots, {} ms each; the adaptive limit (Gradient) starts at {START_AT};",
        SERVICE_TIME.as_millis()
    );
    println!("{CLIENTS} closed-loop clients for {} s", OVERLOAD.as_secs());
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(CLIENTS)
        .build_http();
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (client, tally) = (client.clone(), tally.clone());
        let uri: http::Uri = format!("http://{addr}/work").parse().expect("a uri");
        clients.push(tokio::spawn(async move {
            while started.elapsed() < OVERLOAD {
                let request = Request::get(uri.clone())
                    .body(Full::default())
                    .expect("a request");
                let Ok(response) = client.request(request).await else {
                    continue;
                };
                let status = response.status();
                let _ = response.into_body().collect().await;
                if status == StatusCode::OK {
                    tally.answered.fetch_add(1, Ordering::Relaxed);
                } else {
                    tally.shed.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(SHED_PAUSE).await;
                }
            }
        }));
    }

    println!();
    println!("  time    limit  in flight  waiting inside  answered      shed");
    let mut settled = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    while started.elapsed() < OVERLOAD {
        tick.tick().await;
        let snapshot = layer.snapshot();
        let limit = snapshot.gate.count.capacity;
        println!(
            "  {:>4.2} s {:>6} {:>10} {:>15} {:>9} {:>9}",
            started.elapsed().as_secs_f64(),
            limit,
            snapshot.gate.count.in_flight,
            tally.waiting.load(Ordering::Relaxed),
            tally.answered.load(Ordering::Relaxed),
            tally.shed.load(Ordering::Relaxed),
        );
        if started.elapsed() >= SETTLED {
            settled.push(limit as f64);
        }
    }
    for client in clients {
        let _ = client.await;
    }

    let average = settled.iter().sum::<f64>() / settled.len().max(1) as f64;
    let ratio = average / CAPACITY as f64;
    let noload = layer
        .snapshot()
        .adaptive
        .and_then(|a| a.last)
        .and_then(|w| w.mean_latency());
    println!();
    println!(
        "the limit averaged {average:.1} after {} s: {ratio:.2}x the server's {CAPACITY} slots (last window's mean latency {:?})",
        SETTLED.as_secs(),
        noload.unwrap_or_default(),
    );
    if (0.75..=1.5).contains(&ratio) {
        println!("converged: within 0.75x-1.5x of the capacity");
        std::process::ExitCode::SUCCESS
    } else {
        eprintln!("did not converge: {ratio:.2}x is outside 0.75x-1.5x of the capacity");
        std::process::ExitCode::FAILURE
    }
}
