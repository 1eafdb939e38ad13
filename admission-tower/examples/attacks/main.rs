//! Legitimate traffic beside every connection attack at once:
//! `cargo run --release -p admission-tower --example attacks` (`-- --short` for CI's form).
//!
//! A server on 127.0.0.1 (`AdmissionLayer::serve`, default `ConnectionLimits` with 50
//! connections per address; 128 requests in flight, 4 per client address) serves a
//! handler that takes 40 ms (a downstream call). Its capacity is measured with a closed
//! loop of real clients (hyper-util's pooled h2 client, from 64 loopback addresses);
//! then the same clients offer 80% of it on a fixed schedule, latency counted from each
//! request's scheduled time, twice: once quiet, and once with every attack running
//! beside it, each from loopback addresses of its own:
//!
//! - request heads trickled a byte a second, connections that send nothing, keep-alive
//!   connections idle after one request;
//! - h2 clients that keep every stream's window at 0 and ask for a download on every
//!   stream they may open, opening them again as they are reset;
//! - rapid reset: h2 connections that open and reset a thousand streams at once, again
//!   and again;
//! - an address that opens connections up to its cap and past it.
//!
//! It prints the legitimate clients' goodput and p99 for both runs and the process's
//! peak heap (server and clients: one process), and exits non-zero if the attacked
//! goodput falls below 95% of the quiet one, if p99 rises past 1.5x, or if the heap
//! under attack passes the quiet peak by more than the docs' bound for what the attacks
//! may hold (see `HEAP_BOUND`).

mod attack;
mod load;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use admission_tower::{AdmissionLayer, ConnectionLimits, PerKey, key};
use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use tokio::net::TcpListener;

// The tests' h2 frames by hand, and their heap counter, shared.
#[path = "../../tests/support/h2.rs"]
mod h2;
#[path = "../../tests/support/heap.rs"]
#[allow(dead_code)]
mod heap;

/// Requests in flight, and per client address.
const COUNT: usize = 128;
const PER_ADDRESS: usize = 4;
/// Connections per client address (as in the server setup).
const CONNECTIONS_PER_ADDRESS: usize = 50;
/// What a request's handler takes.
const WORK: Duration = Duration::from_millis(40);
/// The share of the measured capacity the legitimate clients offer.
const LOAD: f64 = 0.8;
/// Legitimate client addresses: 127.0.1.1 and on.
const CLIENTS: u8 = 64;

/// The heap the attacks may add over the quiet run's peak: what the docs bound, for the
/// attacks this run makes. Each zero-window stream h2 holds at most 96 KiB of (its send
/// buffer and two pieces), beside the chunk its handler has made (64 KiB at most here);
/// `ZERO_WINDOW_STREAMS` of them are open at once at most. Every other attack holds a
/// connection's buffers (hyper's read buffer for a head, at most 32 KiB of headers, and
/// its h2 state), at most `CONNECTION_BYTES` each for `ATTACK_CONNECTIONS` connections.
const HEAP_BOUND: usize =
    attack::ZERO_WINDOW_STREAMS * (96 + 64) * 1024 + attack::ATTACK_CONNECTIONS * CONNECTION_BYTES;
const CONNECTION_BYTES: usize = 64 * 1024;

/// A loopback address of the given group: 127.0.`group`.`host`.
fn loopback(group: u8, host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, group, host))
}

async fn serve() -> (AdmissionLayer, SocketAddr) {
    let by_address = key::peer_ip(|addr: &SocketAddr| addr.ip());
    let layer = AdmissionLayer::builder()
        .count(COUNT)
        .per_key(PerKey::new(PER_ADDRESS, by_address))
        .connection_limits(
            ConnectionLimits::default().with_max_per_address(Some(CONNECTIONS_PER_ADDRESS)),
        )
        .build()
        .expect("valid limits");
    let app = Router::new()
        .route(
            "/work",
            get(|| async {
                tokio::time::sleep(WORK).await;
                "done"
            }),
        )
        .route(
            "/download",
            get(|| async {
                let chunks =
                    (0..256).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![7; 64 << 10])));
                Body::from_stream(tokio_stream::iter(chunks))
            }),
        )
        .layer(layer.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(layer.serve(listener, app).into_future());
    (layer, addr)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let short = std::env::args().any(|arg| arg == "--short");
    // Long enough, short or not, for the zero-window streams to be reset (5 s).
    let run = if short {
        Duration::from_secs(5)
    } else {
        Duration::from_secs(15)
    };
    let (layer, addr) = serve().await;
    println!("admission attack run: server on http://{addr}");
    println!(
        "limits: {COUNT} in flight, {PER_ADDRESS} per client address, {CONNECTIONS_PER_ADDRESS} connections per address, the default connection bounds (send rate 240 B/s after 5 s)"
    );
    let clients = std::sync::Arc::new(load::Clients::new(addr, CLIENTS));
    let capacity = clients.capacity(COUNT, Duration::from_secs(2)).await;
    let rate = capacity * LOAD;
    println!(
        "capacity: {capacity:.0} requests/s (closed loop, {COUNT} at once, {} ms each); offered: {rate:.0}/s ({:.0}%) for {} s a run\n",
        WORK.as_millis(),
        LOAD * 100.0,
        run.as_secs()
    );

    heap::peak();
    let quiet = clients.offer(rate, run).await;
    let quiet_heap = heap::peak();
    eprintln!("quiet run done");

    let attacks = attack::Attacks::start(addr);
    // The attacks take hold before the measured load comes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let attacked = clients.offer(rate, run).await;
    let attacked_heap = heap::peak();
    let seen = attacks.stop().await;
    eprintln!("attacked run done");

    println!("{:<28} {:>12} {:>12}", "", "quiet", "attacked");
    println!(
        "{:<28} {:>12.0} {:>12.0}",
        "offered (requests/s)", quiet.offered, attacked.offered
    );
    println!(
        "{:<28} {:>12.0} {:>12.0}",
        "goodput (200 OK/s)", quiet.goodput, attacked.goodput
    );
    println!(
        "{:<28} {:>12} {:>12}",
        "refused (429, 503)", quiet.refused, attacked.refused
    );
    println!(
        "{:<28} {:>12} {:>12}",
        "failed", quiet.failed, attacked.failed
    );
    println!(
        "{:<28} {:>12.1} {:>12.1}",
        "p50 (ms)", quiet.p50_ms, attacked.p50_ms
    );
    println!(
        "{:<28} {:>12.1} {:>12.1}",
        "p99 (ms)", quiet.p99_ms, attacked.p99_ms
    );
    println!(
        "{:<28} {:>12.1} {:>12.1}",
        "peak heap (MiB)",
        quiet_heap as f64 / (1 << 20) as f64,
        attacked_heap as f64 / (1 << 20) as f64
    );
    println!("\nthe attacks, as they saw the server:\n{seen}");

    let goodput = attacked.goodput / quiet.goodput;
    let p99 = attacked.p99_ms / quiet.p99_ms;
    let added = attacked_heap.saturating_sub(quiet_heap);
    println!(
        "attacked against quiet: goodput {:.1}%, p99 {p99:.2}x, heap +{:.1} MiB (bound {:.1} MiB)",
        goodput * 100.0,
        added as f64 / (1 << 20) as f64,
        HEAP_BOUND as f64 / (1 << 20) as f64
    );
    let mut broken = Vec::new();
    if goodput < 0.95 {
        broken.push(format!(
            "attacked goodput {:.1}% of quiet (< 95%)",
            goodput * 100.0
        ));
    }
    if p99 > 1.5 {
        broken.push(format!("attacked p99 {p99:.2}x quiet (> 1.5x)"));
    }
    if added > HEAP_BOUND {
        broken.push(format!(
            "the attacks added {added} bytes of heap (> {HEAP_BOUND})"
        ));
    }
    if attacked.failed > 0 {
        broken.push(format!(
            "{} legitimate requests failed under attack",
            attacked.failed
        ));
    }
    if let Some(wrong) = seen.wrong() {
        broken.push(wrong);
    }
    if layer.snapshot().gate.count.in_flight > COUNT as u64 {
        broken.push("more in flight than the count limit".to_owned());
    }
    if broken.is_empty() {
        println!("every attack held; legitimate traffic kept its goodput and latency.");
        std::process::ExitCode::SUCCESS
    } else {
        for b in broken {
            eprintln!("BROKEN: {b}");
        }
        std::process::ExitCode::FAILURE
    }
}
