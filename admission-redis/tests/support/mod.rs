//! A real `redis-server` started by the test, replicas served on loopback, and a load of
//! real clients.

#![allow(dead_code, unreachable_pub, missing_docs)]

mod redis_server;
mod topology;

// Each test file uses some of them.
#[allow(unused_imports)]
pub use redis_server::Redis;
#[allow(unused_imports)]
pub use topology::{Cluster, Sentinels};

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use admission_redis::FleetCap;
use admission_tower::{AdmissionLayer, MeteredBody, key};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::task::JoinSet;

/// What the handlers of every replica count together: requests running now, and the most
/// ever at once.
#[derive(Default)]
pub struct Running {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Running {
    pub fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    pub fn now(&self) -> usize {
        self.now.load(Ordering::SeqCst)
    }

    /// Starts counting the most again from what runs now.
    pub fn reset(&self) {
        self.most.store(self.now(), Ordering::SeqCst);
    }
}

/// One replica: a layer whose per-key cap is `fleet`'s, over a handler that counts itself
/// in `running` for `service`, served on loopback until dropped.
pub struct Replica {
    pub addr: SocketAddr,
    pub fleet: FleetCap,
    pub layer: AdmissionLayer,
    tasks: JoinSet<()>,
}

impl Replica {
    pub async fn start(fleet: FleetCap, running: Arc<Running>, service: Duration) -> Self {
        let tenant = key::header(http::HeaderName::from_static("x-tenant"));
        let layer = AdmissionLayer::builder()
            .count(1024)
            .per_key(fleet.per_key(tenant))
            .build()
            .expect("a layer");
        let app = tower::service_fn(move |_: Request<MeteredBody<Incoming>>| {
            let running = running.clone();
            async move {
                let now = running.now.fetch_add(1, Ordering::SeqCst) + 1;
                running.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(service).await;
                running.now.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        });
        let service = tower::Layer::layer(&layer, app);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let service = TowerToHyperService::new(service.clone());
                connections.spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            fleet,
            layer,
            tasks,
        }
    }

    /// Stops serving at once, its connections cut (a replica that dies: its leases are
    /// not given back).
    pub fn kill(mut self) {
        self.tasks.abort_all();
    }
}

/// What a load got back.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub ok: usize,
    pub refused: usize,
    pub failed: usize,
    pub slowest: Duration,
}

/// `clients` clients, each sending requests of tenant `tenant` one after another for
/// `duration`, client `i` to `targets[i % targets.len()]`.
pub async fn load(
    targets: &[SocketAddr],
    clients: usize,
    tenant: &'static str,
    duration: Duration,
) -> Tally {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut tasks = JoinSet::new();
    for i in 0..clients {
        let (client, addr) = (client.clone(), targets[i % targets.len()]);
        tasks.spawn(async move {
            let mut tally = Tally::default();
            let end = Instant::now() + duration;
            while Instant::now() < end {
                let request = Request::get(format!("http://{addr}/"))
                    .header("x-tenant", tenant)
                    .body(Full::default())
                    .unwrap();
                let sent = Instant::now();
                match client.request(request).await {
                    Ok(response) => {
                        let status = response.status();
                        let _ = response.into_body().collect().await;
                        match status {
                            StatusCode::OK => tally.ok += 1,
                            StatusCode::TOO_MANY_REQUESTS => {
                                tally.refused += 1;
                                // A client told to back off does, a little.
                                tokio::time::sleep(Duration::from_millis(2)).await;
                            }
                            _ => tally.failed += 1,
                        }
                    }
                    Err(_) => tally.failed += 1,
                }
                tally.slowest = tally.slowest.max(sent.elapsed());
            }
            tally
        });
    }
    let mut total = Tally::default();
    while let Some(tally) = tasks.join_next().await {
        let tally = tally.unwrap();
        total.ok += tally.ok;
        total.refused += tally.refused;
        total.failed += tally.failed;
        total.slowest = total.slowest.max(tally.slowest);
    }
    total
}

/// One request of tenant `tenant` to `addr`: its status, once its body has ended.
pub async fn get(addr: SocketAddr, tenant: &str) -> StatusCode {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let request = Request::get(format!("http://{addr}/"))
        .header("x-tenant", tenant)
        .body(Full::default())
        .unwrap();
    let response = client.request(request).await.expect("an answer");
    let status = response.status();
    let _ = response.into_body().collect().await;
    status
}

#[allow(unused_imports)] // Not every test file waits.
pub use admission_testkit::eventually_within;

/// A TCP proxy to Redis that can be cut (every connection dropped, new ones closed at
/// once) and healed: a network partition between one replica and Redis.
pub struct Partition {
    pub port: u16,
    cut: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Partition {
    pub async fn to(redis_port: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = cut.clone();
        let task = tokio::spawn(async move {
            let mut links = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((mut client, _)) = accepted else { return };
                        if flag.load(Ordering::SeqCst) {
                            continue; // dropped: closed at once
                        }
                        let flag = flag.clone();
                        links.spawn(async move {
                            let Ok(mut server) =
                                tokio::net::TcpStream::connect(("127.0.0.1", redis_port)).await
                            else {
                                return;
                            };
                            let copy = tokio::io::copy_bidirectional(&mut client, &mut server);
                            let watch = async {
                                while !flag.load(Ordering::SeqCst) {
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                }
                            };
                            tokio::select! { _ = copy => {}, () = watch => {} }
                        });
                    }
                    Some(_) = links.join_next() => {}
                }
            }
        });
        Self { port, cut, task }
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).unwrap()
    }

    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.task.abort();
    }
}
