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
//! Then the attacks open nothing more, and after a zero-window stream's allowance (its
//! 5 s grace and a second) the permits still held are counted: held past the allowance.
//!
//! It prints the legitimate clients' goodput and p99 for both runs and the process's
//! peak heap (server and clients: one process), and exits non-zero if the attacked
//! goodput falls below 95% of the quiet one, if p99 rises past 1.5x, if any permit is
//! held past its allowance, if the heap under attack passes the quiet peak by more than
//! the docs' bound for what the attacks may hold (see `HEAP_BOUND`), or if the server
//! missed a connection bound.
//!
//! `-- --axum-serve` runs the same layer and app under `axum::serve` instead, which has
//! no connection bounds: it prints the same table and checks the legitimate clients'
//! goodput and latency, the count limit, and that no permit is held past its allowance
//! (the layer's own response body keeps the send rate). `-- --no-address-caps` turns off
//! the caps per client address (4 requests, and under `serve` 50 connections), to show
//! what they are for: without them one client with many streams takes every slot it can
//! for a grace period at a time.

mod suite;

use std::time::Duration;

use suite::{CONNECTIONS_PER_ADDRESS, COUNT, LOAD, PER_ADDRESS, Server, WORK, attack};

// The tests' heap counter, shared.
use admission_testkit::heap;
admission_testkit::count_the_heap!();

/// The heap the attacks may add over the quiet run's peak: what the docs bound, for the
/// attacks this run makes. Each zero-window stream h2 holds at most 96 KiB of (its send
/// buffer and two pieces), beside the chunk its handler has made (64 KiB at most here);
/// `ZERO_WINDOW_STREAMS` of them are open at once at most. Every other attack holds a
/// connection's buffers (hyper's read buffer for a head, at most 32 KiB of headers, and
/// its h2 state), at most `CONNECTION_BYTES` each for `ATTACK_CONNECTIONS` connections.
const HEAP_BOUND: usize =
    attack::ZERO_WINDOW_STREAMS * (96 + 64) * 1024 + attack::ATTACK_CONNECTIONS * CONNECTION_BYTES;
const CONNECTION_BYTES: usize = 64 * 1024;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let short = std::env::args().any(|arg| arg == "--short");
    // Long enough, short or not, for the zero-window streams to be reset (5 s).
    let run = if short {
        Duration::from_secs(5)
    } else {
        Duration::from_secs(15)
    };
    let server = if std::env::args().any(|arg| arg == "--axum-serve") {
        Server::AxumServe
    } else {
        Server::Serve
    };
    let capped = !std::env::args().any(|arg| arg == "--no-address-caps");
    println!("admission attack run: {}", server.name());
    let per_address = match (capped, server) {
        (false, _) => ", no caps per client address".to_owned(),
        (true, Server::Serve) => format!(
            ", {PER_ADDRESS} per client address, {CONNECTIONS_PER_ADDRESS} connections per address"
        ),
        (true, Server::AxumServe) => format!(", {PER_ADDRESS} per client address"),
    };
    println!(
        "limits: {COUNT} in flight{per_address}, responses taken at 240 B/s after 5 s{}",
        match server {
            Server::Serve => ", the default connection bounds",
            Server::AxumServe => ", no connection bounds",
        }
    );
    let compared = suite::compare(server, capped, run, heap::peak).await;
    let suite::Compared {
        addr,
        capacity,
        quiet,
        attacked,
        quiet_heap,
        attacked_heap,
        seen,
        over_count,
        held_past_allowance,
    } = compared;
    println!(
        "server on http://{addr}; capacity: {capacity:.0} requests/s (closed loop, {COUNT} at once, {} ms each); offered: {:.0}/s ({:.0}%) for {} s a run\n",
        WORK.as_millis(),
        capacity * LOAD,
        LOAD * 100.0,
        run.as_secs()
    );

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
    println!(
        "permits held past a zero-window stream's allowance, once the attacks opened nothing more: {held_past_allowance}"
    );

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
    if added > HEAP_BOUND && server == Server::Serve {
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
    if let (Some(wrong), Server::Serve) = (seen.wrong(), server) {
        broken.push(wrong);
    }
    if held_past_allowance > 0 {
        broken.push(format!(
            "{held_past_allowance} permits held past their allowance"
        ));
    }
    if over_count {
        broken.push("more in flight than the count limit".to_owned());
    }
    if broken.is_empty() {
        match (server, seen.wrong()) {
            (Server::AxumServe, Some(unbounded)) => println!(
                "legitimate traffic kept its goodput and latency, and no permit was held past its allowance; what axum::serve left unbounded: {unbounded} (their permits gone)"
            ),
            _ => println!("every attack held; legitimate traffic kept its goodput and latency."),
        }
        std::process::ExitCode::SUCCESS
    } else {
        for b in broken {
            eprintln!("BROKEN: {b}");
        }
        std::process::ExitCode::FAILURE
    }
}
