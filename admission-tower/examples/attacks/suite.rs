//! The run itself, against either server: the capacity, the quiet run, the attacked run.
//! The `attacks` example prints it; admission-bench's `figures` draws it (it includes
//! this file by path, with the modules below).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use admission_tower::{AdmissionLayer, ConnectionLimits, PerKey, key};
use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use bytes::Bytes;
use tokio::net::TcpListener;

#[path = "attack.rs"]
pub(crate) mod attack;
#[path = "load.rs"]
pub(crate) mod load;
// The tests' h2 frames by hand, shared.
use admission_testkit::h2;

/// Requests in flight, and per client address.
pub(crate) const COUNT: usize = 128;
pub(crate) const PER_ADDRESS: usize = 4;
/// Connections per client address (as in the server setup).
pub(crate) const CONNECTIONS_PER_ADDRESS: usize = 50;
/// What a request's handler takes.
pub(crate) const WORK: Duration = Duration::from_millis(40);
/// The share of the measured capacity the legitimate clients offer.
pub(crate) const LOAD: f64 = 0.8;
/// Legitimate client addresses: 127.0.1.1 and on.
const CLIENTS: u8 = 64;

/// A loopback address of the given group: 127.0.`group`.`host`.
fn loopback(group: u8, host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, group, host))
}

/// The server the run attacks: the same layer and app under each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Server {
    /// `AdmissionLayer::serve`, with the default `ConnectionLimits` and 50 connections an
    /// address.
    Serve,
    /// `axum::serve` with the layer and nothing else: no connection bounds.
    AxumServe,
}

impl Server {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Server::Serve => "AdmissionLayer::serve",
            Server::AxumServe => "axum::serve + the layer",
        }
    }

    /// Starts the server on 127.0.0.1, with the caps per client address (requests and,
    /// under `serve`, connections) if `capped`.
    async fn start(self, capped: bool) -> (AdmissionLayer, SocketAddr) {
        let builder = AdmissionLayer::builder().count(COUNT);
        let layer = match (self, capped) {
            (Server::Serve, true) => builder
                .per_key(PerKey::new(
                    PER_ADDRESS,
                    key::peer_ip(|addr: &SocketAddr| addr.ip()),
                ))
                .connection_limits(
                    ConnectionLimits::default().with_max_per_address(Some(CONNECTIONS_PER_ADDRESS)),
                ),
            (Server::Serve, false) => {
                builder.connection_limits(ConnectionLimits::default().with_max_per_address(None))
            }
            (Server::AxumServe, true) => builder.per_key(PerKey::new(
                PER_ADDRESS,
                key::peer_ip(|info: &ConnectInfo<SocketAddr>| info.0.ip()),
            )),
            (Server::AxumServe, false) => builder,
        }
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
        match self {
            Server::Serve => {
                tokio::spawn(layer.clone().serve(listener, app).into_future());
            }
            Server::AxumServe => {
                let app = app.into_make_service_with_connect_info::<SocketAddr>();
                tokio::spawn(async move { axum::serve(listener, app).await });
            }
        }
        (layer, addr)
    }
}

/// What a run gave: the capacity, and the legitimate clients' runs quiet and attacked.
pub(crate) struct Compared {
    pub(crate) addr: SocketAddr,
    pub(crate) capacity: f64,
    pub(crate) quiet: load::Outcome,
    pub(crate) attacked: load::Outcome,
    /// The process's peak heap through each run, as `peak` read it.
    pub(crate) quiet_heap: usize,
    pub(crate) attacked_heap: usize,
    pub(crate) seen: attack::Seen,
    /// More requests were in flight at the end than the count limit lets in.
    pub(crate) over_count: bool,
    /// Permits still held once the legitimate clients were done and the attacks had
    /// opened nothing for a zero-window stream's allowance: held past it.
    pub(crate) held_past_allowance: u64,
}

/// Measures `server`'s capacity with the legitimate clients, then offers 80% of it for
/// `run` twice, quiet and under every attack. `peak` reads the peak heap since it was
/// last read (`|| 0` where the heap is not counted).
pub(crate) async fn compare(
    server: Server,
    capped: bool,
    run: Duration,
    peak: impl Fn() -> usize,
) -> Compared {
    let (layer, addr) = server.start(capped).await;
    let clients = Arc::new(load::Clients::new(addr, CLIENTS));
    let capacity = clients.capacity(COUNT, Duration::from_secs(2)).await;
    let rate = capacity * LOAD;

    peak();
    let quiet = clients.offer(rate, run).await;
    let quiet_heap = peak();
    eprintln!("attacks: {}: quiet run done", server.name());

    let attacks = attack::Attacks::start(addr);
    // The attacks take hold before the measured load comes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let attacked = clients.offer(rate, run).await;
    let attacked_heap = peak();
    // What the attacks hold once they open nothing more, after an allowance: held past it.
    attacks.quiesce();
    tokio::time::sleep(attack::RESET_WITHIN).await;
    let held_past_allowance = layer.snapshot().gate.count.in_flight;
    let over_count = held_past_allowance > COUNT as u64;
    let seen = attacks.stop().await;
    eprintln!("attacks: {}: attacked run done", server.name());
    Compared {
        addr,
        capacity,
        quiet,
        attacked,
        quiet_heap,
        attacked_heap,
        seen,
        over_count,
        held_past_allowance,
    }
}
