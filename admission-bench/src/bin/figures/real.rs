//! Figures from a real server on loopback: hyper, 10 workers of 10 ms behind a
//! semaphore, and an open-loop client (hyper-util's pooled client) that sends each
//! request at its scheduled time whatever the server does, and times it from then, so a
//! slow server cannot hide its queue. Clients give up at 1 s.
//!
//! Four servers, the same app: no limit; tower's `GlobalConcurrencyLimit` + `LoadShed`;
//! this layer shedding at once; this layer with the admission wait.

use std::convert::Infallible;
use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use admission_tower::{AdmissionLayer, Wait};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tower::{Layer, Service, ServiceBuilder};

use crate::plot::{BLUE, GREEN, ORANGE, RED};

type BoxError = Box<dyn Error + Send + Sync>;

pub(crate) const WORKERS: usize = 10;
const SERVICE: Duration = Duration::from_millis(10);
const GIVE_UP: Duration = Duration::from_secs(1);

/// The four servers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Server {
    NoLimit,
    Tower,
    Shed,
    Wait,
}

impl Server {
    pub(crate) const ALL: [Server; 4] =
        [Server::NoLimit, Server::Tower, Server::Shed, Server::Wait];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Server::NoLimit => "no limit",
            Server::Tower => "tower: concurrency limit + load shed",
            Server::Shed => "this layer, shedding at once",
            Server::Wait => "this layer, with the wait",
        }
    }

    pub(crate) fn short(self) -> &'static str {
        match self {
            Server::NoLimit => "no limit",
            Server::Tower => "tower",
            Server::Shed => "shed",
            Server::Wait => "wait",
        }
    }

    pub(crate) fn color(self) -> plotters::style::RGBColor {
        match self {
            Server::NoLimit => RED,
            Server::Tower => ORANGE,
            Server::Shed => BLUE,
            Server::Wait => GREEN,
        }
    }
}

/// What one run measured.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Run {
    /// Answered 200 within the give-up time, as a share of what could have been: the
    /// offered load or the workers' capacity, whichever is less.
    pub(crate) goodput: f64,
    /// The p99 latency of every request (answered, refused, or given up at 1 s), from its
    /// scheduled time, seconds.
    pub(crate) p99: f64,
}

/// The time each worker was held, added up (µs), and how many times.
type Held = Arc<(AtomicU64, AtomicU64)>;

/// The app: a worker for 10 ms.
fn app<B: Send + 'static>(
    held: Held,
) -> impl Service<Request<B>, Response = Response<Full<Bytes>>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ 'static {
    let slots = Arc::new(Semaphore::new(WORKERS));
    tower::service_fn(move |_: Request<B>| {
        let (slots, held) = (slots.clone(), held.clone());
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
    })
}

/// Serves `service` on loopback until the handle is aborted.
async fn listen<S, B>(service: S) -> (SocketAddr, JoinHandle<()>)
where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("an address");
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, task)
}

/// Starts `server` with its app.
async fn start(server: Server, held: Held) -> (SocketAddr, JoinHandle<()>) {
    match server {
        Server::NoLimit => listen(app::<Incoming>(held)).await,
        Server::Tower => {
            // tower's refusal is an error; answered 503, as a server would.
            let service = ServiceBuilder::new()
                .map_result(|result: Result<Response<Full<Bytes>>, BoxError>| {
                    Ok::<_, BoxError>(result.unwrap_or_else(|_| {
                        let mut response = Response::new(Full::new(Bytes::new()));
                        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                        response
                    }))
                })
                .load_shed()
                .layer(tower::limit::GlobalConcurrencyLimitLayer::new(WORKERS))
                .service(app::<Incoming>(held));
            listen(service).await
        }
        Server::Shed | Server::Wait => {
            let mut builder = AdmissionLayer::builder().count(WORKERS);
            if server == Server::Wait {
                builder = builder.wait(Wait::new(100, Duration::from_millis(100)));
            }
            let layer = builder.build().expect("valid limits");
            listen(layer.layer(app(held))).await
        }
    }
}

/// How requests are sent: `count` at once every `every`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Schedule {
    pub(crate) every: Duration,
    pub(crate) count: usize,
}

impl Schedule {
    /// Evenly, `rate` a second (in steps of a millisecond or more).
    pub(crate) fn even(rate: f64) -> Self {
        let every = Duration::from_secs_f64((1.0 / rate).max(0.001));
        let count = (rate * every.as_secs_f64()).round().max(1.0) as usize;
        Self { every, count }
    }
}

/// Runs `schedule` against `server` for `warmup` and then `measured`.
pub(crate) async fn run(
    server: Server,
    schedule: Schedule,
    warmup: Duration,
    measured: Duration,
) -> Run {
    let held: Held = Arc::default();
    let (addr, task) = start(server, held.clone()).await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1_000)
        .build_http();
    let uri: http::Uri = format!("http://{addr}/").parse().expect("a uri");
    let started = Instant::now();
    let mut requests = Vec::new();
    let mut tick = 0u32;
    while started.elapsed() < warmup + measured {
        // Open loop: each batch at its scheduled time, late or not.
        let due = started + schedule.every * tick;
        tokio::time::sleep_until(due.into()).await;
        tick += 1;
        let counted = due >= started + warmup;
        for _ in 0..schedule.count {
            let (client, uri) = (client.clone(), uri.clone());
            requests.push(tokio::spawn(async move {
                let request = Request::get(uri).body(Full::default()).expect("a request");
                let answer = tokio::time::timeout(GIVE_UP, async {
                    let response = client.request(request).await.ok()?;
                    let status = response.status();
                    response.into_body().collect().await.ok()?;
                    Some(status)
                })
                .await;
                let ok = matches!(answer, Ok(Some(StatusCode::OK)));
                (counted, ok, due.elapsed().min(GIVE_UP), Instant::now())
            }));
        }
    }
    // Goodput: the answers in time that came within the measured seconds (whenever their
    // requests were sent), over what the server could answer in those seconds. Counting
    // the answers to the requests sent in them instead would count a queue's last second
    // of work after the seconds end, and read over 100%.
    let (window, mut ok, mut latencies) = (warmup..warmup + measured, 0usize, Vec::new());
    for request in requests {
        let (counted, answered, latency, at) = request.await.expect("the request's task");
        ok += usize::from(answered && window.contains(&at.duration_since(started)));
        if counted {
            latencies.push(latency.as_secs_f64());
        }
    }
    task.abort();
    let service =
        held.0.load(Ordering::Relaxed) as f64 / 1e6 / held.1.load(Ordering::Relaxed).max(1) as f64;
    // What could have been answered: the offered load or the capacity, whichever is less.
    let capacity = WORKERS as f64 / service.max(SERVICE.as_secs_f64());
    let offered = schedule.count as f64 / schedule.every.as_secs_f64();
    let possible = offered.min(capacity) * measured.as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let p99 = latencies
        .get(((latencies.len() as f64 - 1.0) * 0.99).round() as usize)
        .copied()
        .unwrap_or(0.0);
    Run {
        goodput: ok as f64 / possible,
        p99,
    }
}

/// The workers' capacity, requests a second, as the timer lets them run.
pub(crate) async fn capacity() -> f64 {
    let held: Held = Arc::default();
    let (addr, task) = start(Server::NoLimit, held.clone()).await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let uri: http::Uri = format!("http://{addr}/").parse().expect("a uri");
    let until = Instant::now() + Duration::from_millis(500);
    let mut loops = Vec::new();
    for _ in 0..WORKERS {
        let (client, uri) = (client.clone(), uri.clone());
        loops.push(tokio::spawn(async move {
            while Instant::now() < until {
                let request = Request::get(uri.clone())
                    .body(Full::default())
                    .expect("a request");
                if let Ok(response) = client.request(request).await {
                    let _ = response.into_body().collect().await;
                }
            }
        }));
    }
    for one in loops {
        let _ = one.await;
    }
    task.abort();
    let service =
        held.0.load(Ordering::Relaxed) as f64 / 1e6 / held.1.load(Ordering::Relaxed).max(1) as f64;
    WORKERS as f64 / service.max(SERVICE.as_secs_f64())
}

/// The adaptive limit on a real server whose workers fall to a quarter and come back:
/// 32 slots of 40 ms, offered twice their capacity throughout (open
/// loop), `Gradient` started at four times the slots. Every 250 ms: (seconds, the
/// limit, the slots).
pub(crate) async fn adaptive(phase: Duration) -> Vec<(f64, f64, f64)> {
    use admission_core::adaptive::{AdaptiveLimit, Gradient};

    const SLOTS: usize = 32;
    const SLOW: Duration = Duration::from_millis(40);
    let slots = Arc::new(Semaphore::new(SLOTS));
    let workers = Arc::new(AtomicU64::new(SLOTS as u64));
    let app_slots = slots.clone();
    let app = tower::service_fn(move |_: Request<admission_tower::MeteredBody<Incoming>>| {
        let slots = app_slots.clone();
        async move {
            let slot = slots.acquire().await.expect("never closed");
            tokio::time::sleep(SLOW).await;
            drop(slot);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let limit = AdaptiveLimit::builder(Gradient::default())
        .bounds(1, 1_000)
        .initial(4 * SLOTS as u64);
    let layer = AdmissionLayer::builder()
        .adaptive(limit)
        .build()
        .expect("valid limits");
    let (addr, task) = listen(layer.layer(app)).await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1_000)
        .build_http();
    let uri: http::Uri = format!("http://{addr}/").parse().expect("a uri");
    let schedule = Schedule::even(2.0 * SLOTS as f64 / SLOW.as_secs_f64());
    let started = Instant::now();
    // The load: open loop, each batch at its time.
    let load = {
        let (client, uri) = (client.clone(), uri.clone());
        tokio::spawn(async move {
            let mut tick = 0u32;
            while started.elapsed() < 3 * phase {
                tokio::time::sleep_until((started + schedule.every * tick).into()).await;
                tick += 1;
                for _ in 0..schedule.count {
                    let (client, uri) = (client.clone(), uri.clone());
                    tokio::spawn(async move {
                        let request = Request::get(uri).body(Full::default()).expect("a request");
                        let _ = tokio::time::timeout(GIVE_UP, async {
                            if let Ok(response) = client.request(request).await {
                                let _ = response.into_body().collect().await;
                            }
                        })
                        .await;
                    });
                }
            }
        })
    };
    // The server: a quarter of its slots from the second phase, all of them from the third.
    let shrink = {
        let (slots, workers) = (slots.clone(), workers.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until((started + phase).into()).await;
            workers.store(SLOTS as u64 / 4, Ordering::Relaxed);
            let held = slots
                .acquire_many_owned((SLOTS - SLOTS / 4) as u32)
                .await
                .expect("never closed");
            tokio::time::sleep_until((started + 2 * phase).into()).await;
            workers.store(SLOTS as u64, Ordering::Relaxed);
            drop(held);
        })
    };
    let mut samples = Vec::new();
    let mut every = tokio::time::interval(Duration::from_millis(250));
    while started.elapsed() < 3 * phase {
        every.tick().await;
        let limit = layer.snapshot().gate.count.capacity.unwrap_or(0) as f64;
        let slots = workers.load(Ordering::Relaxed) as f64;
        samples.push((started.elapsed().as_secs_f64(), limit, slots));
    }
    let _ = load.await;
    let _ = shrink.await;
    task.abort();
    samples
}
