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
//! `AdmissionLayer::serve` closes at its head and idle bounds (2 s here; 30 s and 130 s
//! by default). Each request states its class in
//! `x-request-class` (critical, default, sheddable: 100%, 90% and 70% of the count
//! limit). The server's handlers keep their own count of what they hold, independent of
//! the ledgers. At the end two tables say what happened, and the process exits non-zero
//! if any bound broke, anything leaked, or any critical request was refused (the
//! critical traffic is sized to fit in the headroom the other classes may not fill).
//!
//! Built with the `metrics` feature (`--features metrics`), it installs a Prometheus
//! recorder first and prints the layer's Prometheus text at the end of the run.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use admission_tower::{
    AdmissionLayer, Classes, ConnectionLimits, MeteredBody, MinDataRate, PerKey, Priority,
    SlowClients, class, key,
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
use tower::Layer;

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
#[derive(Default)]
struct Inside {
    now: AtomicU64,
    max: AtomicU64,
    noisy_now: AtomicU64,
    noisy_max: AtomicU64,
}

impl Inside {
    fn enter(&self, noisy: bool) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        if noisy {
            let now = self.noisy_now.fetch_add(1, Ordering::SeqCst) + 1;
            self.noisy_max.fetch_max(now, Ordering::SeqCst);
        }
    }

    fn leave(&self, noisy: bool) {
        self.now.fetch_sub(1, Ordering::SeqCst);
        if noisy {
            self.noisy_now.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A handler's stake in a request: counted from the handler's start until its response
/// body ends or is dropped (the body's end comes before the layer releases the permit).
struct Stake {
    inside: Arc<Inside>,
    noisy: bool,
    done: bool,
}

impl Stake {
    fn new(inside: Arc<Inside>, noisy: bool) -> Self {
        inside.enter(noisy);
        Self {
            inside,
            noisy,
            done: false,
        }
    }

    fn end(&mut self) {
        if !std::mem::replace(&mut self.done, true) {
            self.inside.leave(self.noisy);
        }
    }
}

impl Drop for Stake {
    fn drop(&mut self) {
        self.end();
    }
}

/// A response body: chunks from a channel, or one buffer; ends the stake at its end.
struct AppBody {
    chunks: Either<mpsc::Receiver<Bytes>, Option<Bytes>>,
    stake: Option<Stake>,
}

impl Body for AppBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let next = match &mut self.chunks {
            Either::Left(rx) => match rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(chunk) => chunk,
            },
            Either::Right(once) => once.take(),
        };
        if next.is_none() {
            if let Some(stake) = &mut self.stake {
                stake.end();
            }
        }
        Poll::Ready(next.map(|chunk| Ok(Frame::data(chunk))))
    }
}

async fn handle(
    req: Request<MeteredBody<Incoming>>,
    inside: Arc<Inside>,
) -> Result<Response<AppBody>, Infallible> {
    let noisy = req.headers().get("x-client").is_some_and(|v| v == "noisy");
    // Liveness routes bypass admission, so they take no stake in the count.
    let guarded = !matches!(req.uri().path(), "/" | "/health");
    let stake = guarded.then(|| Stake::new(inside, noisy));
    let chunks = match req.uri().path() {
        "/stream" => {
            let (tx, rx) = mpsc::channel(2);
            tokio::spawn(async move {
                for i in 0..CHUNKS {
                    if tx.send(Bytes::from(format!("chunk {i}\n"))).await.is_err() {
                        return; // the client hung up
                    }
                    tokio::time::sleep(CHUNK_EVERY).await;
                }
            });
            Either::Left(rx)
        }
        "/upload" => {
            let n = match req.into_body().collect().await {
                Ok(body) => body.to_bytes().len(),
                Err(_) => 0,
            };
            Either::Right(Some(Bytes::from(n.to_string())))
        }
        "/download" => {
            let (tx, rx) = mpsc::channel(2);
            let chunk = Bytes::from(vec![b'x'; 64 << 10]);
            tokio::spawn(async move {
                for _ in 0..DOWNLOAD_CHUNKS {
                    if tx.send(chunk.clone()).await.is_err() {
                        return; // the connection was cut
                    }
                }
            });
            Either::Left(rx)
        }
        "/checkout" => {
            // The head at once, the receipt once the work is done.
            let (tx, rx) = mpsc::channel(1);
            tokio::spawn(async move {
                tokio::time::sleep(CHECKOUT_TAKES).await;
                let _ = tx.send(Bytes::from_static(b"paid")).await;
            });
            Either::Left(rx)
        }
        _ => Either::Right(Some(Bytes::from_static(b"ok"))),
    };
    Ok(Response::new(AppBody { chunks, stake }))
}

async fn serve(layer: AdmissionLayer, inside: Arc<Inside>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local address");
    let app = tower::service_fn(move |req| handle(req, inside.clone()));
    // Every connection held to the layer's `ConnectionLimits`.
    tokio::spawn(layer.serve(listener, layer.layer(app)).into_future());
    addr
}

#[derive(Debug, Clone, Copy)]
enum Holder {
    /// Sends a request head a byte every 200 ms.
    Trickler,
    /// Sends nothing.
    Silent,
    /// Sends one request, then nothing.
    KeptAlive,
}

/// A connection that holds its place doing nothing: how long until the server closed
/// it, if it did within 10 s.
async fn hold_a_connection(addr: SocketAddr, how: Holder) -> Option<Duration> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let mut buf = vec![0; 1024];
    if let Holder::KeptAlive = how {
        stream
            .write_all(b"GET /health HTTP/1.1\r\nhost: demo\r\n\r\n")
            .await
            .ok()?;
        let n = stream.read(&mut buf).await.ok()?;
        if !buf[..n].starts_with(b"HTTP/1.1 200") {
            return None;
        }
    }
    let start = Instant::now();
    let (mut read, mut write) = stream.into_split();
    let trickle = tokio::spawn(async move {
        if let Holder::Trickler = how {
            for byte in b"GET /health HTTP/1.1\r\nhost: demo\r\nx-slow: a byte at a time\r\n\r\n" {
                if write.write_all(&[*byte]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        std::future::pending::<()>().await;
    });
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(1..) = read.read(&mut buf).await {}
    })
    .await;
    trickle.abort();
    closed.ok().map(|()| start.elapsed())
}

/// How one client request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Outcome {
    Admitted,
    HungUp,
    Shed(u16),
    Failed,
}

/// What one priority class's requests met.
#[derive(Default, Clone)]
struct ClassTally {
    sent: u64,
    admitted: u64,
    shed: u64,
    failed: u64,
    latency: Vec<Duration>,
}

#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    outcomes: Mutex<HashMap<Outcome, u64>>,
    admitted_latency: Mutex<Vec<Duration>>,
    shed_latency: Mutex<Vec<Duration>>,
    by_class: Mutex<HashMap<&'static str, ClassTally>>,
}

impl Tally {
    fn record(&self, class: &'static str, outcome: Outcome, head_after: Option<Duration>) {
        {
            let mut by_class = self.by_class.lock().unwrap();
            let tally = by_class.entry(class).or_default();
            tally.sent += 1;
            match outcome {
                Outcome::Admitted | Outcome::HungUp => tally.admitted += 1,
                Outcome::Shed(_) => tally.shed += 1,
                Outcome::Failed => tally.failed += 1,
            }
            if let (Outcome::Admitted | Outcome::HungUp, Some(latency)) = (outcome, head_after) {
                tally.latency.push(latency);
            }
        }
        *self.outcomes.lock().unwrap().entry(outcome).or_default() += 1;
        if let Some(latency) = head_after {
            match outcome {
                Outcome::Shed(_) => self.shed_latency.lock().unwrap().push(latency),
                Outcome::Admitted | Outcome::HungUp => {
                    self.admitted_latency.lock().unwrap().push(latency)
                }
                Outcome::Failed => {}
            }
        }
    }

    fn count(&self, outcome: Outcome) -> u64 {
        self.outcomes
            .lock()
            .unwrap()
            .get(&outcome)
            .copied()
            .unwrap_or(0)
    }
}

async fn client(addr: SocketAddr, request: Request<Full<Bytes>>, hang_up: bool, tally: Arc<Tally>) {
    tally.sent.fetch_add(1, Ordering::Relaxed);
    let class = match request
        .headers()
        .get("x-request-class")
        .map(|v| v.as_bytes())
    {
        Some(b"critical") => "critical",
        Some(b"sheddable") => "sheddable",
        _ => "default",
    };
    let run = async {
        let stream = TcpStream::connect(addr).await.ok()?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .ok()?;
        tokio::spawn(conn);
        let start = Instant::now();
        let mut response = sender.send_request(request).await.ok()?;
        let head_after = start.elapsed();
        let status = response.status();
        if status != StatusCode::OK {
            let body = response.into_body().collect().await.ok()?.to_bytes();
            // The default refusal body names the dimension: tell count from bytes.
            let code = match (status.as_u16(), body.starts_with(b"overloaded: byte")) {
                (503, true) => 5031,
                (code, _) => code,
            };
            return Some((Outcome::Shed(code), head_after));
        }
        if hang_up {
            let _ = response.body_mut().frame().await;
            return Some((Outcome::HungUp, head_after)); // drops the connection
        }
        response.into_body().collect().await.ok()?;
        Some((Outcome::Admitted, head_after))
    };
    match tokio::time::timeout(CLIENT_TIMEOUT, run).await {
        Ok(Some((outcome, latency))) => tally.record(class, outcome, Some(latency)),
        _ => tally.record(class, Outcome::Failed, None),
    }
}

/// An upload that declares 48 KiB and sends a byte every 100 ms: the status line it is
/// answered with, and after how long.
async fn trickler(addr: SocketAddr, key: String) -> Option<(String, Duration)> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let head = format!(
        "POST /upload HTTP/1.1\r\nhost: demo\r\nx-client: {key}\r\ncontent-length: {UPLOAD_BYTES}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.ok()?;
    let start = Instant::now();
    let (mut read, mut write) = stream.into_split();
    let sender = tokio::spawn(async move {
        for _ in 0..UPLOAD_BYTES {
            if write.write_all(b"x").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut answer = vec![0; 64];
    let n = tokio::time::timeout(CLIENT_TIMEOUT, read.read(&mut answer))
        .await
        .ok()?
        .ok()?;
    sender.abort();
    let line = String::from_utf8_lossy(&answer[..n])
        .lines()
        .next()?
        .to_owned();
    Some((line, start.elapsed()))
}

/// A download whose client reads nothing (a small receive window, so the kernel buffers
/// little): whether the server cut the connection before sending it all, and when.
async fn stalled_reader(addr: SocketAddr, key: String) -> Option<Duration> {
    let socket = TcpSocket::new_v4().ok()?;
    socket.set_recv_buffer_size(4096).ok()?;
    let mut stream = socket.connect(addr).await.ok()?;
    let head = format!("GET /download HTTP/1.1\r\nhost: demo\r\nx-client: {key}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.ok()?;
    let start = Instant::now();
    tokio::time::sleep(GRACE * 3).await; // reads nothing
    // Then reads what is left: a cut connection ends long before the 16 MiB.
    let mut buf = vec![0; 64 << 10];
    let mut total = 0;
    let read_all = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => total += n,
            }
        }
    };
    let ended = tokio::time::timeout(Duration::from_secs(5), read_all)
        .await
        .is_ok();
    (ended && total < DOWNLOAD_CHUNKS * (64 << 10)).then(|| start.elapsed())
}

fn make_request(path: &str, key: &str, class: &str, body: Option<usize>) -> Request<Full<Bytes>> {
    let builder = Request::builder()
        .uri(path)
        .header("x-client", key)
        .header("x-request-class", class);
    match body {
        Some(n) => builder
            .method("POST")
            .body(Full::new(Bytes::from(vec![b'x'; n]))),
        None => builder.body(Full::default()),
    }
    .expect("a valid request")
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort();
    let rank = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[rank]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

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
        .connections(
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
        "slow wave first: {TRICKLERS} uploads trickling a byte every 100 ms, {STALLED} clients reading none of a 16 MiB download (cut below 240 B/s after {} s)",
        GRACE.as_secs()
    );
    println!(
        "  and {HEAD_TRICKLERS} request heads trickling a byte every 200 ms, {SILENT} connections that send nothing, {KEPT_ALIVE} idle after one request (closed at {} s)\n",
        CONNECTION_BOUND.as_secs()
    );

    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let tricklers: Vec<_> = (0..TRICKLERS)
        .map(|i| tokio::spawn(trickler(addr, format!("trickler-{i}"))))
        .collect();
    let stalled: Vec<_> = (0..STALLED)
        .map(|i| tokio::spawn(stalled_reader(addr, format!("stalled-{i}"))))
        .collect();
    let holders: Vec<_> = [Holder::Trickler; HEAD_TRICKLERS]
        .into_iter()
        .chain([Holder::Silent; SILENT])
        .chain([Holder::KeptAlive; KEPT_ALIVE])
        .map(|how| tokio::spawn(hold_a_connection(addr, how)))
        .collect();
    // The slow wave holds its permits before the burst comes.
    while layer.gate().count().in_flight() < (TRICKLERS + STALLED) as u64
        && started.elapsed() < Duration::from_secs(2)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut clients = Vec::new();
    // First the noisy client, which meets its cap before the rest comes: on a loaded
    // machine the burst would otherwise fill the count limit first, and its sheddable
    // requests would all be shed by count, never reaching the per-client cap...
    for _ in 0..NOISY {
        let request = make_request("/stream", "noisy", "sheddable", None);
        clients.push(tokio::spawn(client(addr, request, false, tally.clone())));
    }
    let keyed = layer.gate().keyed().expect("a per-client cap").clone();
    while keyed.snapshot().refused_key < (NOISY - PER_KEY) as u64
        && started.elapsed() < Duration::from_secs(5)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // ...then the uploads and the too-large uploads, all at once...
    for u in 0..UPLOADS {
        let key = format!("uploader-{u}");
        let request = make_request("/upload", &key, "default", Some(UPLOAD_BYTES));
        clients.push(tokio::spawn(client(addr, request, false, tally.clone())));
    }
    for t in 0..TOO_LARGE {
        let size = MAX_REQUEST as usize * 2;
        let request = make_request("/upload", &format!("big-{t}"), "default", Some(size));
        clients.push(tokio::spawn(client(addr, request, false, tally.clone())));
    }
    // ...then the streams, in waves of 40 every 100 ms.
    let waves = tokio::spawn({
        let tally = tally.clone();
        async move {
            let mut streams = Vec::new();
            for i in 0..STREAMS {
                let key = format!("client-{}", i % 100);
                let class = if i % 3 == 0 { "default" } else { "sheddable" };
                let request = make_request("/stream", &key, class, None);
                let hang_up = i % HANGUP_EVERY == 0;
                streams.push(tokio::spawn(client(addr, request, hang_up, tally.clone())));
                if i % 40 == 39 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            for s in streams {
                let _ = s.await;
            }
        }
    });
    clients.push(waves);
    // Critical checkouts throughout the burst, each client one at a time.
    let burst_over = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut checkouts = Vec::new();
    for c in 0..CRITICAL_CLIENTS {
        let (tally, burst_over) = (tally.clone(), burst_over.clone());
        checkouts.push(tokio::spawn(async move {
            let mut n = 0;
            while !burst_over.load(Ordering::Relaxed) {
                let key = format!("buyer-{c}-{n}");
                let request = make_request("/checkout", &key, "critical", None);
                client(addr, request, false, tally.clone()).await;
                n += 1;
            }
        }));
    }

    // Liveness probes while the burst runs, and a progress line every 250 ms.
    let (mut probes, mut probes_ok, mut probe_latency) = (0_u64, 0_u64, Vec::new());
    let mut last_report = Instant::now();
    let count = layer.gate().count().clone();
    while clients.iter().any(|c| !c.is_finished()) {
        probes += 1;
        let start = Instant::now();
        let probe = tokio::time::timeout(Duration::from_secs(2), async {
            let stream = TcpStream::connect(addr).await.ok()?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .ok()?;
            tokio::spawn(conn);
            let request = Request::get("/health")
                .body(Full::<Bytes>::default())
                .ok()?;
            let response = sender.send_request(request).await.ok()?;
            (response.status() == StatusCode::OK).then_some(())
        })
        .await;
        if let Ok(Some(())) = probe {
            probes_ok += 1;
            probe_latency.push(start.elapsed());
        }
        if last_report.elapsed() >= Duration::from_millis(250) {
            last_report = Instant::now();
            println!(
                "  t={:>4.2}s  sent {:>4}  in flight {:>2}/{COUNT_LIMIT}  admitted {:>4}  shed {:>4}  probes {probes_ok}/{probes}",
                started.elapsed().as_secs_f64(),
                tally.sent.load(Ordering::Relaxed),
                count.in_flight(),
                tally.count(Outcome::Admitted) + tally.count(Outcome::HungUp),
                tally.count(Outcome::Shed(503))
                    + tally.count(Outcome::Shed(5031))
                    + tally.count(Outcome::Shed(429))
                    + tally.count(Outcome::Shed(413)),
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for c in clients {
        let _ = c.await;
    }
    let mut cut_408 = Vec::new();
    for t in tricklers {
        if let Ok(Some((line, after))) = t.await {
            if line.starts_with("HTTP/1.1 408") {
                cut_408.push(after);
            }
        }
    }
    let mut cut_stalled = Vec::new();
    for s in stalled {
        if let Ok(Some(after)) = s.await {
            cut_stalled.push(after);
        }
    }
    let mut closed_holders = Vec::new();
    for h in holders {
        if let Ok(Some(after)) = h.await {
            closed_holders.push(after);
        }
    }
    burst_over.store(true, Ordering::Relaxed);
    for c in checkouts {
        let _ = c.await;
    }
    let elapsed = started.elapsed();

    // Let the server finish dropping what the last clients left, then read the ledgers.
    let settle = Instant::now();
    let idle = |s: &admission_tower::AdmissionSnapshot| {
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
    let snap = layer.snapshot();
    let (count_s, bytes_s, keyed_s) = (
        snap.gate.count,
        snap.gate.bytes.expect("bytes"),
        snap.gate.keyed.expect("keyed"),
    );

    let admitted = tally.count(Outcome::Admitted);
    let hung_up = tally.count(Outcome::HungUp);
    let (s503, s503b, s429, s413) = (
        tally.count(Outcome::Shed(503)),
        tally.count(Outcome::Shed(5031)),
        tally.count(Outcome::Shed(429)),
        tally.count(Outcome::Shed(413)),
    );
    let failed = tally.count(Outcome::Failed);
    let other: u64 = tally
        .outcomes
        .lock()
        .unwrap()
        .iter()
        .filter(|(o, _)| matches!(o, Outcome::Shed(c) if ![503, 5031, 429, 413].contains(c)))
        .map(|(_, n)| n)
        .sum();
    let mut admitted_lat = tally.admitted_latency.lock().unwrap().clone();
    let mut shed_lat = tally.shed_latency.lock().unwrap().clone();
    let app_max = inside.max.load(Ordering::SeqCst);
    let noisy_max = inside.noisy_max.load(Ordering::SeqCst);

    println!("\n  {:<34} result", "what");
    println!("  {:-<34} {:-<44}", "", "");
    println!(
        "  {:<34} {}",
        "requests sent",
        tally.sent.load(Ordering::Relaxed)
    );
    println!(
        "  {:<34} {admitted} completed + {hung_up} hung up mid-stream",
        "admitted (200)"
    );
    println!("  {:<34} {s503}", "shed 503 (count limit)");
    println!("  {:<34} {s503b}", "shed 503 (byte budget)");
    println!("  {:<34} {s429}", "shed 429 (per-client cap)");
    println!("  {:<34} {s413}", "shed 413 (request too large)");
    println!("  {:<34} {failed} failed, {other} other statuses", "errors");
    let slowest = |cuts: &[Duration]| {
        cuts.iter()
            .max()
            .map_or("-".into(), |d| format!("{:.2} s", d.as_secs_f64()))
    };
    println!(
        "  {:<34} {} / {TRICKLERS} answered 408, the last after {}",
        "slow uploads cut",
        cut_408.len(),
        slowest(&cut_408)
    );
    println!(
        "  {:<34} {} / {STALLED} cut before the end of the download",
        "stalled readers cut",
        cut_stalled.len(),
    );
    let holders = HEAD_TRICKLERS + SILENT + KEPT_ALIVE;
    println!(
        "  {:<34} {} / {holders} closed, the last after {}",
        "connections holding a place idle",
        closed_holders.len(),
        slowest(&closed_holders)
    );
    println!(
        "  {:<34} {}",
        "request bodies cut (snapshot)", snap.too_slow
    );
    println!(
        "  {:<34} {} / {COUNT_LIMIT} (handlers saw {app_max})",
        "in-flight high-water: count", count_s.high_water
    );
    println!(
        "  {:<34} {} / {} KiB budget, {} KiB max request",
        "in-flight high-water: bytes",
        format_args!("{:.1} KiB", bytes_s.high_water as f64 / 1024.0),
        BYTE_BUDGET >> 10,
        MAX_REQUEST >> 10
    );
    println!(
        "  {:<34} {noisy_max} / {PER_KEY} (keys at once: {})",
        "in-flight high-water: noisy client", keyed_s.keys_high_water
    );
    println!(
        "  {:<34} {probes_ok}/{probes} answered 200, p99 {}",
        "liveness probes during the burst",
        ms(percentile(&mut probe_latency, 0.99))
    );
    println!(
        "  {:<34} p50 {}  p99 {}",
        "latency to head: admitted",
        ms(percentile(&mut admitted_lat, 0.50)),
        ms(percentile(&mut admitted_lat, 0.99))
    );
    println!(
        "  {:<34} p50 {}  p99 {}",
        "latency to head: shed",
        ms(percentile(&mut shed_lat, 0.50)),
        ms(percentile(&mut shed_lat, 0.99))
    );
    println!(
        "  {:<34} count {}, bytes {}, keys {}",
        "ledgers after the run", count_s.in_flight, bytes_s.in_flight, keyed_s.keys
    );
    println!("  {:<34} {:.2} s", "wall time", elapsed.as_secs_f64());

    println!(
        "\n  {:<10} {:>6} {:>9} {:>6} {:>12}  count limit refused",
        "class", "sent", "admitted", "shed", "p99 to head"
    );
    println!(
        "  {:-<10} {:->6} {:->9} {:->6} {:->12}  {:-<20}",
        "", "", "", "", "", ""
    );
    let by_class = tally.by_class.lock().unwrap().clone();
    let shed_by_class = layer.shed_by_class();
    for (name, refused) in &shed_by_class {
        let mut row = by_class.get(name).cloned().unwrap_or_default();
        println!(
            "  {:<10} {:>6} {:>9} {:>6} {:>12}  {refused}",
            name,
            row.sent,
            row.admitted,
            row.shed,
            ms(percentile(&mut row.latency, 0.99)),
        );
    }

    #[cfg(feature = "metrics")]
    {
        layer.record_gauges();
        println!("\nthe layer's Prometheus text (metrics feature):\n");
        print!("{}", prometheus.render());
    }

    let mut broken = Vec::new();
    if count_s.high_water > COUNT_LIMIT as u64 || app_max > COUNT_LIMIT as u64 {
        broken.push("the count limit was exceeded");
    }
    if bytes_s.high_water > BYTE_BUDGET.max(MAX_REQUEST) {
        broken.push("the byte budget was exceeded beyond the lone-request exemption");
    }
    if noisy_max > PER_KEY as u64 {
        broken.push("the per-client cap was exceeded");
    }
    if count_s.in_flight != 0 || bytes_s.in_flight != 0 || keyed_s.keys != 0 {
        broken.push("a ledger did not return to zero (a leak)");
    }
    if inside.now.load(Ordering::SeqCst) != 0 {
        broken.push("a handler's response was never finished or dropped");
    }
    if probes_ok != probes {
        broken.push("a liveness probe was not answered");
    }
    if failed != 0 || other != 0 {
        broken.push("a client request failed or got an unexpected status");
    }
    if s503 == 0 || s503b == 0 || s429 == 0 || s413 != TOO_LARGE as u64 {
        broken.push("the burst did not exercise every refusal");
    }
    if cut_408.len() != TRICKLERS || snap.too_slow != TRICKLERS as u64 {
        broken.push("a trickling upload was not cut with 408");
    }
    if cut_408.iter().any(|after| *after > GRACE * 3) {
        broken.push("a trickling upload held its permits past the grace period");
    }
    if closed_holders.len() != HEAD_TRICKLERS + SILENT + KEPT_ALIVE {
        broken.push("a connection doing nothing was not closed");
    }
    if closed_holders
        .iter()
        .any(|after| *after > CONNECTION_BOUND + GRACE)
    {
        broken.push("a connection doing nothing held its place past its bound");
    }
    if connections.open() != 0 {
        broken.push("a connection was left open at the end");
    }
    if cut_stalled.len() != STALLED {
        broken.push("a client that stopped reading was not cut");
    }
    let critical = by_class.get("critical").cloned().unwrap_or_default();
    if critical.shed != 0 || critical.failed != 0 {
        broken.push("a critical request was refused");
    }
    if critical.admitted == 0 {
        broken.push("no critical request was sent");
    }
    let sheddable = by_class.get("sheddable").cloned().unwrap_or_default();
    let default = by_class.get("default").cloned().unwrap_or_default();
    let shed_share = |c: &ClassTally| c.shed as f64 / c.sent.max(1) as f64;
    if shed_share(&sheddable) <= shed_share(&default) {
        broken.push("sheddable traffic was not shed more than default traffic");
    }
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
