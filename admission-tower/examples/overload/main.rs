//! A real server under a real overload: `cargo run --release -p admission-tower --example overload`.
//!
//! A server on 127.0.0.1 (`AdmissionLayer::serve`) behind `AdmissionLayer` (count limit, byte budget with a
//! maximum request, a per-key cap, priority classes, `/health` bypassed) serves a
//! streaming endpoint whose bodies take a while, an upload endpoint and a short
//! `/checkout`. A burst of real clients, far above the limits, hits it: streams (some
//! hang up mid-stream), large uploads, too-large uploads, one noisy key, critical
//! checkouts, and liveness probes throughout; and, first, a wave of slow clients: uploads
//! that trickle and downloads whose clients stop reading, which the layer's `SlowClients`
//! and `ConnectionLimits` cut (with a 1 s grace period here, 5 s by default, so that the
//! run stays short), and connections that hold a place doing nothing (request heads
//! trickled a byte at a time, connections that send nothing, idle keep-alive), which
//! `AdmissionLayer::serve` closes at its head and idle bounds (2 s here;
//! `ConnectionLimits::HEAD_WITHIN` and `IDLE` by default). Each request states its class in
//! `x-request-class` (critical, default, sheddable: 100%, 90% and 70% of the count
//! limit). The server's handlers keep their own count of what they hold, independent of
//! the ledgers. At the end two tables say what happened, and the process exits non-zero
//! if any bound broke, anything leaked, or any critical request was refused (the
//! critical traffic is sized to fit in the headroom the other classes may not fill).
//!
//! Built with the `metrics` feature (`--features metrics`), it installs a Prometheus
//! recorder first and prints the layer's Prometheus text at the end of the run.

mod attack;
// The tests' h2 frames by hand, shared.
use admission_testkit::h2;
mod load;
mod report;
mod server;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use admission_tower::{
    AdmissionLayer, AdmissionSnapshot, Classes, ConnectionLimits, MeteredBody, MinDataRate, PerKey,
    Priority, SlowClients, class, key,
};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tower::Layer;

use attack::{SlowCuts, SlowWave};
use load::{Burst, ClassTally, Outcome, Probes, Tally};
use report::Run;
use server::{Inside, serve};

const COUNT_LIMIT: usize = 64;
const BYTE_BUDGET: u64 = 256 << 10;
const MAX_REQUEST: u64 = 64 << 10;
const PER_KEY: usize = 4;
const MAX_KEYS: usize = 1_000;

const STREAMS: usize = 600;
const HANGUP_EVERY: usize = 8; // every 8th stream client disconnects after one chunk
const NOISY: usize = 60;
const UPLOADS: usize = 40;
const UPLOAD_BYTES: usize = 48 << 10;
const TOO_LARGE: usize = 10;
/// Critical clients, each sending checkouts one after another through the burst: at
/// most this many critical requests are in flight, within the 7 slots of 64 (above the
/// default class's 57) that only critical work may use.
const CRITICAL_CLIENTS: usize = 4;
const CHECKOUT_TAKES: Duration = Duration::from_millis(20);
const CHUNKS: usize = 20;
const CHUNK_EVERY: Duration = Duration::from_millis(25);
const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);
/// The slow wave: uploads that declare 48 KiB and send a byte every 100 ms, and clients
/// that ask for a 16 MiB download and read none of it.
const TRICKLERS: usize = 4;
const STALLED: usize = 4;
/// And h2 clients that ask for the same download with their window at 0: the socket
/// stays writable, and each stream is reset after the grace period.
const ZERO_WINDOW: usize = 4;
const DOWNLOAD_CHUNKS: usize = 256;
/// The policy's grace periods in this run (the defaults are 5 s).
const GRACE: Duration = Duration::from_secs(1);
/// The wave's connections that hold a place doing nothing: request heads trickled a
/// byte every 200 ms, connections that send nothing, and keep-alive connections idle
/// after one request; all closed at the head and idle bound.
const HEAD_TRICKLERS: usize = 4;
const SILENT: usize = 4;
const KEPT_ALIVE: usize = 4;
const CONNECTION_BOUND: Duration = Duration::from_secs(2);

/// What the handlers hold, counted by the handlers themselves.
#[tokio::main]
async fn main() -> std::process::ExitCode {
    // The recorder goes in before the layer is built: the layer registers its series
    // with the recorder installed at that moment.
    #[cfg(feature = "metrics")]
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("no other recorder installed");
    let layer = AdmissionLayer::builder()
        .name("overload-demo")
        .count(COUNT_LIMIT)
        .bytes(BYTE_BUDGET)
        .max_request_bytes(MAX_REQUEST)
        .per_key(
            PerKey::new(
                PER_KEY,
                key::header(http::HeaderName::from_static("x-client")),
            )
            .max_keys(MAX_KEYS),
        )
        .priority(
            Classes::standard(),
            class::header(class::HEADER, Priority::DEFAULT),
        )
        .bypass(|req| matches!(req.uri.path(), "/" | "/health"))
        .slow_clients(SlowClients::default().with_min_body_rate(MinDataRate::new(240, GRACE)))
        .connection_limits(
            ConnectionLimits::default()
                .with_min_send_rate(Some(MinDataRate::new(240, GRACE)))
                .with_head_within(Some(CONNECTION_BOUND))
                .with_idle(Some(CONNECTION_BOUND)),
        )
        .build()
        .expect("valid limits");
    let inside = Arc::new(Inside::default());
    let addr = serve(layer.clone(), inside.clone()).await;
    println!("admission overload demo: server on http://{addr}");
    println!(
        "limits: {COUNT_LIMIT} in flight, {} KiB of request bodies (one request at most {} KiB), {PER_KEY} per client; /health bypassed",
        BYTE_BUDGET >> 10,
        MAX_REQUEST >> 10
    );
    println!(
        "classes: critical may fill {COUNT_LIMIT}, default {}, sheddable {} (100%, 90%, 70%)",
        COUNT_LIMIT * 9 / 10,
        COUNT_LIMIT * 7 / 10
    );
    println!(
        "burst: {STREAMS} streaming clients ({CHUNKS} chunks, {} ms apart; every {HANGUP_EVERY}th hangs up; 2 in 3 sheddable), {NOISY} sheddable from one noisy client, {UPLOADS} uploads of {} KiB, {TOO_LARGE} too large, {CRITICAL_CLIENTS} critical clients checking out one after another\n",
        CHUNK_EVERY.as_millis(),
        UPLOAD_BYTES >> 10
    );
    println!(
        "slow wave first: {TRICKLERS} uploads trickling a byte every 100 ms, {STALLED} clients reading none of a 16 MiB download, {ZERO_WINDOW} more over h2 with their window at 0 (cut below 240 B/s after {} s)",
        GRACE.as_secs()
    );
    println!(
        "  and {HEAD_TRICKLERS} request heads trickling a byte every 200 ms, {SILENT} connections that send nothing, {KEPT_ALIVE} idle after one request (closed at {} s)\n",
        CONNECTION_BOUND.as_secs()
    );

    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let wave = SlowWave::start(addr);
    // The slow wave holds its permits before the burst comes.
    while layer.gate().count().in_flight() < (TRICKLERS + STALLED + ZERO_WINDOW) as u64
        && started.elapsed() < Duration::from_secs(2)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut burst = Burst::start(addr, &layer, &tally, started).await;
    let probes = load::probe_while(&burst, addr, &layer, &tally, started).await;
    burst.clients_done().await;
    let cuts = wave.cuts().await;
    burst.end().await;
    let elapsed = started.elapsed();

    // Let the server finish dropping what the last clients left, then read the ledgers.
    let settle = Instant::now();
    let idle = |s: &AdmissionSnapshot| {
        s.gate.count.in_flight == 0
            && s.gate.bytes.is_some_and(|b| b.in_flight == 0)
            && s.gate.keyed.is_some_and(|k| k.keys == 0)
    };
    let connections = layer.connections();
    while !(idle(&layer.snapshot()) && connections.open() == 0)
        && settle.elapsed() < Duration::from_secs(5)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut run = Run {
        tally,
        cuts,
        probes,
        snap: layer.snapshot(),
        elapsed,
        app_max: inside.max.load(Ordering::SeqCst),
        noisy_max: inside.noisy_max.load(Ordering::SeqCst),
        app_now: inside.now.load(Ordering::SeqCst),
        connections_open: connections.open(),
        refused_by_class: layer
            .refused_by_class()
            .into_iter()
            .map(|(name, refused)| (name.to_owned(), refused))
            .collect(),
    };
    report::print(&mut run);

    #[cfg(feature = "metrics")]
    {
        layer.record_gauges();
        println!("\nthe layer's Prometheus text (metrics feature):\n");
        print!("{}", prometheus.render());
    }

    let broken = report::broken(&run);
    if broken.is_empty() {
        println!("\nevery bound held; nothing leaked.");
        std::process::ExitCode::SUCCESS
    } else {
        for b in broken {
            eprintln!("BROKEN: {b}");
        }
        std::process::ExitCode::FAILURE
    }
}
