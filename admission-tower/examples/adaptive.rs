//! An adaptive limit finding a real server's capacity, and following it:
//! `cargo run --release -p admission-tower --example adaptive`.
//!
//! A hyper server on 127.0.0.1 whose handler needs one of `CAPACITY` slots (a semaphore:
//! requests beyond it wait inside the server, as they would for a connection pool or a
//! worker) and holds it for a fixed service time. In front, an `AdmissionLayer` with a
//! `Gradient` adaptive limit, started at four times the capacity and told neither the
//! capacity nor the service time. Closed-loop clients, three times as many as the
//! capacity (a refused client waits 10 ms before trying again), in three phases:
//!
//! 1. steady overload for 6 s;
//! 2. bursts for 4 s: every client busy for half a second, idle for the next half;
//! 3. the server loses half its slots, and the overload goes on for 4 s.
//!
//! It prints the limit's trajectory every quarter second (the limit, what is in flight,
//! what waits inside the server, answers and refusals so far) and exits non-zero if the
//! limit's average over the settled part of each phase is not within 0.75x-1.5x of the
//! capacity then.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
/// The phases' ends, and from when each is judged (the limit's average from then on).
const STEADY: Duration = Duration::from_secs(6);
const BURSTS: Duration = Duration::from_secs(10);
const DROPPED: Duration = Duration::from_secs(14);
const JUDGED: [(&str, Duration, Duration, usize); 3] = [
    ("steady overload", Duration::from_secs(3), STEADY, CAPACITY),
    ("bursts", Duration::from_secs(6), BURSTS, CAPACITY),
    (
        "half the slots",
        Duration::from_secs(12),
        DROPPED,
        CAPACITY / 2,
    ),
];
/// In the bursts, each half second on, then off.
const BURST: Duration = Duration::from_millis(500);
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
    let app_slots = slots.clone();
    let tally = Arc::new(Tally::default());
    let server_tally = tally.clone();
    let app = tower::service_fn(move |_: Request<MeteredBody<Incoming>>| {
        let (slots, tally) = (app_slots.clone(), server_tally.clone());
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
    // Phase 3: half the slots go (taken as they come free, and never given back).
    let lost = slots.clone();
    let started = Instant::now();
    tokio::spawn(async move {
        tokio::time::sleep_until((started + BURSTS).into()).await;
        let taken = lost
            .acquire_many(CAPACITY as u32 / 2)
            .await
            .expect("never closed");
        taken.forget();
    });
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
    println!(
        "{CLIENTS} closed-loop clients: overload to {} s, bursts to {} s, then half the slots to {} s",
        STEADY.as_secs(),
        BURSTS.as_secs(),
        DROPPED.as_secs()
    );
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(CLIENTS)
        .build_http();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (client, tally) = (client.clone(), tally.clone());
        let uri: http::Uri = format!("http://{addr}/work").parse().expect("a uri");
        clients.push(tokio::spawn(async move {
            while started.elapsed() < DROPPED {
                let now = started.elapsed();
                if now >= STEADY && now < BURSTS {
                    // Off for every other half second.
                    let into = (now - STEADY).as_millis() % (2 * BURST.as_millis());
                    if into >= BURST.as_millis() {
                        let off = 2 * BURST.as_millis() - into;
                        tokio::time::sleep(Duration::from_millis(off as u64)).await;
                        continue;
                    }
                }
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
    let mut trajectory = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    while started.elapsed() < DROPPED {
        tick.tick().await;
        let snapshot = layer.snapshot();
        let limit = snapshot.gate.count.capacity.unwrap_or(0);
        let at = started.elapsed();
        println!(
            "  {:>5.2} s {:>6} {:>10} {:>15} {:>9} {:>9}",
            at.as_secs_f64(),
            limit,
            snapshot.gate.count.in_flight,
            tally.waiting.load(Ordering::Relaxed),
            tally.answered.load(Ordering::Relaxed),
            tally.shed.load(Ordering::Relaxed),
        );
        trajectory.push((at, limit as f64));
    }
    for client in clients {
        let _ = client.await;
    }

    println!();
    let mut converged = true;
    for (phase, from, to, capacity) in JUDGED {
        let judged: Vec<f64> = trajectory
            .iter()
            .filter(|(at, _)| *at >= from && *at < to)
            .map(|(_, limit)| *limit)
            .collect();
        let average = judged.iter().sum::<f64>() / judged.len().max(1) as f64;
        let ratio = average / capacity as f64;
        let ok = !judged.is_empty() && (0.75..=1.5).contains(&ratio);
        converged &= ok;
        println!(
            "{phase:<16} the limit averaged {average:5.1} from {} s to {} s: {ratio:.2}x the server's {capacity} slots{}",
            from.as_secs(),
            to.as_secs(),
            if ok { "" } else { "  (outside 0.75x-1.5x)" },
        );
    }
    if let Some(latency) = layer.snapshot().adaptive.and_then(|a| a.latency) {
        println!(
            "the limit's latency estimate: typical {:?}, no-load {:?} (service time {:?})",
            latency.typical,
            latency.no_load.unwrap_or_default(),
            SERVICE_TIME,
        );
    }
    if converged {
        println!("converged: within 0.75x-1.5x of the capacity in every phase");
        std::process::ExitCode::SUCCESS
    } else {
        eprintln!("did not converge in every phase");
        std::process::ExitCode::FAILURE
    }
}
