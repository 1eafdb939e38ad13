//! Bursts against a server of fixed capacity, shed at once and with a bounded wait:
//! `cargo run --release -p admission-tower --example bursts`.
//!
//! A hyper server on 127.0.0.1 whose handler needs one of `WORKERS` slots (a semaphore)
//! for `SERVICE` each: a capacity of 1,000 requests a second. In front, an
//! `AdmissionLayer` with a count of `WORKERS` (the workers, no more), first shedding at
//! once, then with a [`Wait`] of `MAX_WAITING` waiters for at most `MAX_WAIT`. The load:
//! `BURST` requests at once every `PERIOD`, 2,000 a second on average, from hyper-util's
//! pooled client, for `RUN` after a short warm-up.
//!
//! It prints goodput (answers against the capacity: the workers over the mean time each
//! was held, which the timer's granularity makes a little over 10 ms) and the latency of
//! the answered requests for both, and exits non-zero if the wait serves less than 85% of
//! the capacity, or its p99 exceeds `MAX_WAIT` plus twice the service time.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use admission_tower::{AdmissionLayer, MeteredBody, Wait};
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

const WORKERS: usize = 10;
const SERVICE: Duration = Duration::from_millis(10);
const BURST: usize = 100;
const PERIOD: Duration = Duration::from_millis(50);
const WARM_UP: Duration = Duration::from_millis(500);
const RUN: Duration = Duration::from_secs(3);
const MAX_WAITING: usize = 100;
const MAX_WAIT: Duration = Duration::from_millis(100);

/// What one run measured.
struct Figures {
    /// The mean time a worker was held, seconds.
    service: f64,
    goodput: f64,
    shed: usize,
    p50: Duration,
    p99: Duration,
}

async fn run(layer: AdmissionLayer) -> Figures {
    let slots = Arc::new(Semaphore::new(WORKERS));
    // What each worker was held for, added up (µs), and how many: the timer's granularity
    // makes a 10 ms sleep last a little longer, and the capacity is what the workers did.
    let held = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let app_held = held.clone();
    let app = tower::service_fn(move |_: Request<MeteredBody<Incoming>>| {
        let (slots, held) = (slots.clone(), app_held.clone());
        async move {
            let slot = slots.acquire().await.expect("never closed");
            let start = Instant::now();
            tokio::time::sleep(SERVICE).await;
            held.0
                .fetch_add(start.elapsed().as_micros() as u64, Ordering::Relaxed);
            held.1.fetch_add(1, Ordering::Relaxed);
            drop(slot);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let service = layer.layer(app);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("an address");
    let server = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });

    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(BURST)
        .build_http();
    let uri: http::Uri = format!("http://{addr}/work").parse().expect("a uri");
    let started = Instant::now();
    let end = WARM_UP + RUN;
    let mut tick = tokio::time::interval(PERIOD);
    let mut requests = Vec::new();
    while started.elapsed() < end {
        tick.tick().await;
        let measured = started.elapsed() >= WARM_UP;
        for _ in 0..BURST {
            let (client, uri) = (client.clone(), uri.clone());
            requests.push(tokio::spawn(async move {
                let sent = Instant::now();
                let request = Request::get(uri).body(Full::default()).expect("a request");
                let response = client.request(request).await.expect("an answer");
                let status = response.status();
                let _ = response.into_body().collect().await;
                (measured, status, sent.elapsed())
            }));
        }
    }
    let mut latencies = Vec::new();
    let mut shed = 0;
    for request in requests {
        let (measured, status, latency) = request.await.expect("the request's task");
        if !measured {
            continue;
        }
        if status == StatusCode::OK {
            latencies.push(latency);
        } else {
            shed += 1;
        }
    }
    server.abort();
    latencies.sort();
    let at = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
    let service =
        held.0.load(Ordering::Relaxed) as f64 / 1e6 / held.1.load(Ordering::Relaxed).max(1) as f64;
    let capacity = WORKERS as f64 / service * RUN.as_secs_f64();
    Figures {
        service,
        goodput: latencies.len() as f64 / capacity,
        shed,
        p50: at(0.5),
        p99: at(0.99),
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    println!(
        "a server of {WORKERS} workers, {} ms each (about 1,000 requests a second); {BURST} requests at once every {} ms;",
        SERVICE.as_millis(),
        PERIOD.as_millis()
    );
    println!(
        "the layer's count at {WORKERS}; measured for {} s after {} ms",
        RUN.as_secs(),
        WARM_UP.as_millis()
    );
    let shed_layer = AdmissionLayer::builder()
        .count(WORKERS)
        .build()
        .expect("a layer");
    let wait_layer = AdmissionLayer::builder()
        .count(WORKERS)
        .wait(Wait::new(MAX_WAITING, MAX_WAIT))
        .build()
        .expect("a layer");
    let shed = run(shed_layer).await;
    let waited = run(wait_layer).await;
    println!();
    println!(
        "  {:<34} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "", "goodput", "shed", "p50", "p99", "service"
    );
    for (name, figures) in [
        ("shed at once".to_string(), &shed),
        (
            format!("wait ({MAX_WAITING} waiters, {} ms)", MAX_WAIT.as_millis()),
            &waited,
        ),
    ] {
        println!(
            "  {:<34} {:>7.1}% {:>8} {:>6.1}ms {:>6.1}ms {:>7.2}ms",
            name,
            figures.goodput * 100.0,
            figures.shed,
            figures.p50.as_secs_f64() * 1e3,
            figures.p99.as_secs_f64() * 1e3,
            figures.service * 1e3
        );
    }
    let bound = MAX_WAIT + 2 * SERVICE;
    println!();
    let goodput_ok = waited.goodput >= 0.85;
    let p99_ok = waited.p99 <= bound;
    println!(
        "the wait serves {:.1}% of capacity (want >= 85%): {}",
        waited.goodput * 100.0,
        if goodput_ok { "MET" } else { "MISSED" }
    );
    println!(
        "its p99 is {:.1} ms (want <= {} ms, the longest wait plus twice the service time): {}",
        waited.p99.as_secs_f64() * 1e3,
        bound.as_millis(),
        if p99_ok { "MET" } else { "MISSED" }
    );
    if goodput_ok && p99_ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
