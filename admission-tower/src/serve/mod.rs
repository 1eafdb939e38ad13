//! What [`AdmissionLayer::serve`] returns and takes (feature `serve`): [`Serve`], the
//! accept loop on hyper-util's auto builder that holds every connection to the layer's
//! [`ConnectionLimits`]; [`Shutdown`], its graceful shutdown; and the [`Listener`] and
//! [`Handshake`] traits it serves through ([`Plain`]: no handshake).

use std::fmt;
use std::future::{Future, IntoFuture, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use admission_http::Alarm;
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio::time::Instant;
use tower_service::Service;

use crate::{AdmissionLayer, ClientAddress, ConnectionLimits};

mod drive;
mod listener;
mod request;
mod stream;
mod tracker;

use drive::Stage;
pub use listener::{Handshake, Listener, Plain};
use request::Tracked;
use stream::StreamExecutor;
use tracker::Tracker;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Signal = Pin<Box<dyn Future<Output = ()> + Send>>;

/// h2 streams a client may reset before the server takes them, and resets its own
/// errors may cause, before its connection is ended: hyper's defences against reset
/// floods (CVE-2023-44487), set here rather than left to defaults that may move.
const MAX_PENDING_RESETS: usize = 20;
const MAX_ERROR_RESETS: usize = 1024;

/// A server that [`AdmissionLayer::serve`] made: await it to serve until the shutdown
/// signal (for ever without one).
#[must_use = "a server does nothing until awaited"]
pub struct Serve<L, S, H = Plain> {
    listener: L,
    service: S,
    handshake: H,
    layer: AdmissionLayer,
    shutdown: Option<(Signal, Duration)>,
}

impl<L, S, H> fmt::Debug for Serve<L, S, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Serve")
            .field("limits", self.layer.connections().limits())
            .field(
                "graceful_shutdown",
                &self.shutdown.as_ref().map(|(_, at)| at),
            )
            .finish_non_exhaustive()
    }
}

/// How a server's graceful shutdown ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shutdown {
    connections_cut: usize,
    requests_cut: u64,
}

impl Shutdown {
    /// Connections still open at the deadline, closed then.
    pub fn connections_cut(&self) -> usize {
        self.connections_cut
    }

    /// Requests the layer still held at the deadline, ended then (their handlers'
    /// futures dropped, their permits released).
    pub fn requests_cut(&self) -> u64 {
        self.requests_cut
    }
}

impl AdmissionLayer {
    /// Serves `service` on the connections `listener` accepts, holding each to the
    /// layer's [`ConnectionLimits`]: HTTP/1.1, h2 and h2c on hyper-util's auto builder
    /// with tokio's timer, the connection caps checked before anything is read, a head
    /// bound from the accept to the first complete request head, an idle bound, h2
    /// stream and header caps, pings, and the minimum send rate, at the socket and on
    /// each h2 stream (a client that keeps its flow-control window shut has its stream
    /// reset, and h2 buffers at most 96 KiB of a stream's response: see
    /// [`ConnectionLimits::with_min_send_rate`]).
    ///
    /// `service` is what you would give `axum::serve` (an axum `Router`, with
    /// `ConnectInfo<SocketAddr>` in every request: no `into_make_service_with_connect_info`
    /// needed), tonic's `Routes`, or any tower HTTP service. Apply this layer to it as
    /// usual: `serve` bounds connections, the layer requests. The client's address is
    /// also put in each request's extensions as `L::Addr` (for [`key::peer_ip`]).
    ///
    /// ```no_run
    /// use std::net::SocketAddr;
    /// use std::time::Duration;
    /// use admission_tower::{AdmissionLayer, ConnectionLimits};
    /// use axum::{extract::ConnectInfo, routing::get, Router};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let admission = AdmissionLayer::builder()
    ///     .count(512)
    ///     .connection_limits(ConnectionLimits::default().with_max_per_address(Some(64)))
    ///     .build()?;
    /// let app = Router::new()
    ///     .route("/", get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }))
    ///     .layer(admission.clone());
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    /// let shutdown = admission
    ///     .serve(listener, app)
    ///     .with_graceful_shutdown(async { tokio::signal::ctrl_c().await.unwrap() }, Duration::from_secs(30))
    ///     .await;
    /// println!("{} connections cut at the deadline", shutdown.connections_cut());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`key::peer_ip`]: crate::key::peer_ip
    #[cfg_attr(docsrs, doc(cfg(feature = "serve")))]
    pub fn serve<L, S>(&self, listener: L, service: S) -> Serve<L, S>
    where
        L: Listener,
    {
        Serve {
            listener,
            service,
            handshake: Plain,
            layer: self.clone(),
            shutdown: None,
        }
    }
}

impl<L, S, H> Serve<L, S, H> {
    /// Runs `handshake` on each accepted connection before HTTP (a TLS handshake:
    /// `move |io| acceptor.accept(io)` with tokio-rustls), on the connection's own task
    /// and under the head bound, so a client that stalls in it is closed at the bound
    /// and holds up no one else.
    pub fn handshake<H2>(self, handshake: H2) -> Serve<L, S, H2> {
        Serve {
            listener: self.listener,
            service: self.service,
            handshake,
            layer: self.layer,
            shutdown: self.shutdown,
        }
    }

    /// When `signal` completes: stop accepting, drain the layer (new requests refused,
    /// admitted ones finish), close idle connections at once and the others as their
    /// requests end (HTTP/1.1 after its response, h2 with a `GOAWAY`), and close what
    /// is still open `deadline` after the signal (a stream that never ends: server-sent
    /// events, a gRPC watch), its requests' futures dropped and permits released. The
    /// server then completes with what it had to cut.
    pub fn with_graceful_shutdown<F>(mut self, signal: F, deadline: Duration) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.shutdown = Some((Box::pin(signal), deadline));
        self
    }
}

impl<L, S, H, B> IntoFuture for Serve<L, S, H>
where
    L: Listener,
    H: Handshake<crate::GuardedIo<L::Io>>,
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Output = Shutdown;
    type IntoFuture = Pin<Box<dyn Future<Output = Shutdown> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let Self {
                mut listener,
                service,
                handshake,
                layer,
                shutdown,
            } = self;
            let connections = layer.connections().clone();
            let limits = *connections.limits();
            let builder = builder(&limits);
            let (stage, watching) = watch::channel(Stage::Serving);
            let (mut signal, deadline) = match shutdown {
                Some((signal, deadline)) => (Some(signal), deadline),
                None => (None, Duration::ZERO),
            };
            loop {
                let accepted = next(&mut listener, signal.as_mut()).await;
                let Some((io, address)) = accepted else { break };
                let accepted_at = Instant::now();
                // Over a cap, the connection is closed before anything is read from it.
                let Some(mut io) = connections.admit_from(io, address.ip(), false) else {
                    continue;
                };
                let tracker = Arc::new(Tracker::new(accepted_at));
                // Its reads tell the tracker when a next request head begins.
                let reads = tracker.clone();
                io.watch_reads(Arc::new(move || reads.read()));
                let service = Tracked::new(
                    service.clone(),
                    tracker.clone(),
                    address,
                    limits.min_send_rate,
                );
                let (builder, handshake, mut watching) =
                    (builder.clone(), handshake.clone(), watching.clone());
                tokio::spawn(async move {
                    let head = limits.head_due(accepted_at);
                    let Some(io) = within(handshake.handshake(io), head, &mut watching).await
                    else {
                        return;
                    };
                    let io = TokioIo::new(io);
                    let connection = builder
                        .serve_connection_with_upgrades(io, TowerToHyperService::new(service))
                        .into_owned();
                    drive::drive(
                        connection,
                        |c| c.graceful_shutdown(),
                        tracker,
                        limits,
                        watching,
                    )
                    .await;
                });
            }
            drop(listener);
            drop(watching);
            shut_down(stage, &layer, deadline).await
        })
    }
}

/// The next connection, or `None` once `signal` has come.
async fn next<L: Listener>(
    listener: &mut L,
    signal: Option<&mut Signal>,
) -> Option<(L::Io, L::Addr)> {
    let mut accept = pin!(listener.accept());
    let mut signal = signal;
    poll_fn(|cx| {
        if let Some(signal) = signal.as_mut() {
            if signal.as_mut().poll(cx).is_ready() {
                return Poll::Ready(None);
            }
        }
        accept.as_mut().poll(cx).map(Some)
    })
    .await
}

/// With the listener closed: drains the layer, asks every connection to close when its
/// requests end, and cuts those still open at `deadline`.
async fn shut_down(
    stage: watch::Sender<Stage>,
    layer: &AdmissionLayer,
    deadline: Duration,
) -> Shutdown {
    let _drained = layer.drain();
    let _ = stage.send(Stage::Draining);
    let mut all_closed = pin!(stage.closed());
    if tokio::time::timeout(deadline, all_closed.as_mut())
        .await
        .is_ok()
    {
        return Shutdown {
            connections_cut: 0,
            requests_cut: 0,
        };
    }
    let report = Shutdown {
        connections_cut: stage.receiver_count(),
        requests_cut: layer.snapshot().gate.count.in_flight,
    };
    let _ = stage.send(Stage::Cut);
    all_closed.await;
    report
}

/// hyper-util's auto builder, set to `limits`.
fn builder(limits: &ConnectionLimits) -> auto::Builder<StreamExecutor> {
    let mut builder = auto::Builder::new(StreamExecutor);
    builder
        .http1()
        .timer(TokioTimer::new())
        // The head bound is the connection's own (hyper's would also time the idle
        // wait before a head, and cannot see a handshake or the h2 preface).
        .header_read_timeout(None)
        .max_buf_size(limits.max_header_bytes);
    let mut http2 = builder.http2();
    http2
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_pending_accept_reset_streams(MAX_PENDING_RESETS)
        .max_local_error_reset_streams(MAX_ERROR_RESETS)
        // What h2 buffers of one stream's response, beside the piece hyper has in hand
        // and the one it has just put in: 64 + 2 x 16 KiB at most, for a stream whose
        // client does not take it.
        .max_send_buf_size(stream::SEND_BUFFER);
    if let Some(max) = limits.max_streams {
        http2.max_concurrent_streams(max);
    }
    if let Some((every, timeout)) = limits.ping {
        http2.keep_alive_interval(every).keep_alive_timeout(timeout);
    }
    builder
}

/// `handshake`, unless `head` passes or the server shuts down first.
async fn within<F, T>(
    handshake: F,
    head: Option<Instant>,
    stage: &mut watch::Receiver<Stage>,
) -> Option<T>
where
    F: Future<Output = std::io::Result<T>>,
{
    let mut handshake = pin!(handshake);
    let mut timer = Alarm::new();
    let mut changed = pin!(stage.changed());
    poll_fn(|cx| {
        if let Poll::Ready(result) = handshake.as_mut().poll(cx) {
            return Poll::Ready(result.ok());
        }
        if let Some(at) = head {
            if timer.poll_at(cx, at.into_std()).is_ready() {
                return Poll::Ready(None);
            }
        }
        if let Poll::Ready(Ok(())) = changed.as_mut().poll(cx) {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}
