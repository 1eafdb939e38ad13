//! `AdmissionLayer`: the layer, and what a running server does with it.

use std::fmt;
use std::sync::Arc;
#[cfg(feature = "tokio")]
use std::time::Duration;

use admission_core::{AdaptiveLimit, Classes, Drain, Gate};
use tower_layer::Layer;

#[cfg(feature = "tokio")]
use crate::Connections;
use crate::builder::{NewGate, SharedGate};
use crate::shared::{Settings, Shared};
use crate::{Admission, AdmissionBuilder, AdmissionSnapshot, ConnectionLimits, SlowClients};
#[cfg(feature = "axum")]
use crate::{Guarded, GuardedIo};

/// Applies admission control to a service: sheds what is over the limits, at once or
/// after a bounded [`Wait`](crate::Wait), never into an unbounded queue.
///
/// Every clone of the layer, and every service it makes, shares one gate: a limit per
/// clone would enforce nothing, since frameworks clone services per connection or per
/// request. Build it with [`AdmissionLayer::builder`], or over a [`Gate`] shared with
/// other layers and interceptors with [`AdmissionLayer::from_gate`]. Its type is the same
/// whichever limits are set ([`off`](Self::off) when admission is turned off); the
/// [crate docs](crate) have a complete axum example.
#[derive(Clone)]
pub struct AdmissionLayer {
    pub(crate) shared: Arc<Shared>,
    /// The connections' bounds, which only `serve` and `guard` read: no request does.
    #[cfg(feature = "tokio")]
    connections: Connections,
    #[cfg(not(feature = "tokio"))]
    connections: ConnectionLimits,
}

impl AdmissionLayer {
    /// A builder with no limit set: what it builds counts requests in flight (for
    /// [`drain`](Self::drain) and snapshots) and refuses nothing until given a limit.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(64).build()?;
    /// assert_eq!(layer.gate().count().capacity(), 64);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn builder() -> AdmissionBuilder {
        AdmissionBuilder::new(NewGate::default())
    }

    /// A builder over an existing gate: its limits are the gate's, shared with every
    /// other layer or interceptor built from a clone of it (one limit for an HTTP and a
    /// gRPC server in one process, say). The builder has no limit setters; give the key
    /// extractor with [`PerKey::gate_cap`](crate::PerKey::gate_cap).
    ///
    /// ```
    /// use admission_tower::{key, AdmissionLayer, Gate, Key, PerKey};
    ///
    /// let gate: Gate = Gate::builder().count(512).per_key(8).build()?;
    /// let http = AdmissionLayer::from_gate(gate.clone())
    ///     .per_key(PerKey::gate_cap(key::header(http::HeaderName::from_static("x-api-key"))))
    ///     .build()?;
    /// let other = AdmissionLayer::from_gate(gate.clone()).build()?;
    /// let _held = gate.try_admit(Some(&Key::from("k")), 0)?;
    /// assert_eq!(http.snapshot().gate.count.in_flight, 1, "one gate, one count");
    /// assert_eq!(other.snapshot().gate.count.in_flight, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_gate(gate: Gate) -> AdmissionBuilder<SharedGate> {
        AdmissionBuilder::new(SharedGate(gate))
    }

    /// A layer that is off: no limit, nothing counted, no metrics; a request costs about
    /// what the bare service does. For admission turned off by configuration, with the
    /// layer's type unchanged. It still refuses new requests once
    /// [closed](Self::close), but having counted nothing, its [`drain`](Self::drain)
    /// completes at once (a server's own graceful shutdown, which waits for open
    /// connections, still cuts nothing off); a limit set at run time counts only the
    /// requests admitted after it. A layer from [`builder`](Self::builder) with no limit
    /// counts, and its drain waits.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let enabled = false; // from the configuration
    /// let layer = if enabled { AdmissionLayer::builder().count(512).build()? } else { AdmissionLayer::off() };
    /// assert_eq!(layer.snapshot().gate.count.capacity, None);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn off() -> Self {
        let gate = Gate::builder()
            .build()
            .expect("a gate without limits is in range");
        Self::from_parts(
            Shared::untracked(Settings::over(gate)),
            ConnectionLimits::off(),
        )
    }

    /// A layer of the requests' `shared` state and the connections' `limits`.
    pub(crate) fn from_parts(shared: Shared, limits: ConnectionLimits) -> Self {
        Self {
            shared: Arc::new(shared),
            #[cfg(feature = "tokio")]
            connections: Connections::new(limits),
            #[cfg(not(feature = "tokio"))]
            connections: limits,
        }
    }

    /// The gate: its ledgers, to read or to change limits at run time.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(8).build()?;
    /// layer.gate().count().set_capacity(16)?;
    /// assert_eq!(layer.snapshot().gate.count.capacity, Some(16));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gate(&self) -> &Gate {
        &self.shared.settings.gate
    }

    /// A cheap reading of the gate and the dry-run count.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(3).build()?;
    /// let snap = layer.snapshot();
    /// assert_eq!((snap.gate.count.capacity, snap.would_shed), (Some(3), 0));
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn snapshot(&self) -> AdmissionSnapshot {
        self.shared.snapshot()
    }

    /// Sets the layer's gauges from its ledgers (feature `metrics`): requests, bytes
    /// and keys in flight, their high-water marks, the limits in force, and whether the
    /// layer is closed. Call it where the exporter renders (the `/metrics` handler), so
    /// the gauges are the ledgers' values at that moment: see the [module
    /// docs](crate#metrics) for the whole setup and why gauges are read, not
    /// pushed.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(8).build()?;
    /// layer.record_gauges(); // then render
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn record_gauges(&self) {
        self.shared
            .settings
            .observer
            .record_gauges(&self.shared.settings.gate);
    }

    /// The layer's priority classes, if it has any ([`AdmissionBuilder::priority`]).
    ///
    /// ```
    /// use admission_tower::{AdmissionLayer, Classes, Priority};
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .count(64)
    ///     .priority(Classes::standard(), |_, _| Priority::DEFAULT)
    ///     .build()?;
    /// assert_eq!(layer.classes().unwrap().len(), 3);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn classes(&self) -> Option<&Classes> {
        self.shared.classes()
    }

    /// How many requests of each class the count limit has refused, most important class
    /// first; empty for a layer without classes. (The same figures as the snapshot's
    /// `gate.refused_by_class`, with the names.)
    ///
    /// ```
    /// use admission_tower::{AdmissionLayer, Classes, Priority};
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .count(64)
    ///     .priority(Classes::standard(), |_, _| Priority::DEFAULT)
    ///     .build()?;
    /// assert_eq!(layer.refused_by_class(), [("critical", 0), ("default", 0), ("sheddable", 0)]);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn refused_by_class(&self) -> Vec<(&str, u64)> {
        let refused = self.shared.settings.gate.count().refused_by_class();
        self.classes()
            .into_iter()
            .flat_map(Classes::iter)
            .map(|(name, priority)| (name, refused[priority.index()]))
            .collect()
    }

    /// Graceful drain, for shutdown: from now on every new request is refused (503 +
    /// `Retry-After` and, over HTTP/1.x, `connection: close`, so keep-alive clients
    /// reconnect, to another instance behind a load balancer; gRPC `UNAVAILABLE`), while
    /// every admitted request runs to the end of its response body. The returned
    /// [`Drain`] is a future, for any runtime, that completes when the last admitted
    /// request is done (or [`Drain::wait`] blocks a thread until then). Bypassed routes
    /// are still served.
    ///
    /// Stop the server's accept loop after the drain completes, or together with it (a
    /// graceful shutdown that waits for open connections): either way nothing admitted
    /// is cut off. [`reopen`](Self::reopen) undoes it.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    /// use axum::{routing::get, Router};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let admission = AdmissionLayer::builder().count(512).build()?;
    /// let app: Router = Router::new().route("/", get(|| async { "ok" })).layer(admission.clone());
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// let server = axum::serve(listener, app).with_graceful_shutdown(async move {
    ///     // On SIGTERM, say: refuse new work, let admitted requests finish, then stop.
    ///     admission.drain().await;
    /// });
    /// server.await?; // returns once the drain is done and open connections are closed
    /// # Ok(())
    /// # }
    /// ```
    pub fn drain(&self) -> Drain {
        self.shared.settings.gate.drain()
    }

    /// [`drain`](Self::drain), waited for at most `deadline`: an open stream (server-sent
    /// events, a gRPC stream, a download to a client that stopped reading) can keep a
    /// drain pending for ever. `Ok` once every admitted request is done; at the deadline,
    /// [`Undrained`](crate::Undrained) says how many are still in flight, and the caller
    /// decides (exit and cut them, or wait on). The layer stays closed either way.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_tower::AdmissionLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let admission = AdmissionLayer::builder().count(512).build()?;
    /// let held = admission.gate().try_admit(None, 0)?; // a request still running
    /// let undrained = admission.drain_within(Duration::from_millis(10)).await.unwrap_err();
    /// assert_eq!(undrained.requests, 1);
    /// drop(held);
    /// admission.drain_within(Duration::from_millis(10)).await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn drain_within(&self, deadline: Duration) -> Result<(), crate::Undrained> {
        match tokio::time::timeout(deadline, self.drain()).await {
            Ok(()) => Ok(()),
            Err(_) => Err(crate::Undrained {
                requests: self.shared.settings.gate.count().in_flight(),
            }),
        }
    }

    /// Refuses every new request until [`reopen`](Self::reopen), as
    /// [`drain`](Self::drain) does, without waiting for anything; limits changed
    /// meanwhile (by hand or by a controller) do not reopen it.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().build()?;
    /// layer.close();
    /// assert!(layer.snapshot().gate.closed);
    /// layer.reopen();
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn close(&self) {
        self.shared.settings.gate.close();
    }

    /// Admits again after [`close`](Self::close) or [`drain`](Self::drain).
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().build()?;
    /// let _ = layer.drain();
    /// layer.reopen();
    /// assert!(!layer.snapshot().gate.closed);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn reopen(&self) {
        self.shared.settings.gate.reopen();
    }

    /// The adaptive limit setting the count limit, if the layer has one
    /// ([`AdmissionBuilder::adaptive`]): to fix the limit by hand and hand it back.
    pub fn adaptive(&self) -> Option<&AdaptiveLimit> {
        self.shared.settings.adaptive.as_ref()
    }

    /// The layer's [`ConnectionLimits`] ([`AdmissionBuilder::connection_limits`]).
    ///
    /// ```
    /// use admission_tower::{AdmissionLayer, ConnectionLimits};
    ///
    /// let layer = AdmissionLayer::builder().count(8).build()?;
    /// assert_eq!(layer.connection_limits(), ConnectionLimits::default());
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn connection_limits(&self) -> ConnectionLimits {
        #[cfg(feature = "tokio")]
        return *self.connections.limits();
        #[cfg(not(feature = "tokio"))]
        self.connections
    }

    /// The connections open under the layer's [`ConnectionLimits`], shared by
    /// everything that serves or guards connections for it.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(8).build()?;
    /// assert_eq!(layer.connections().open(), 0);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn connections(&self) -> &Connections {
        &self.connections
    }

    /// Bounds the connections `listener` accepts for `axum::serve`, as far as a listener
    /// can, by the layer's [`ConnectionLimits`]: the caps (closed at once above them),
    /// a time to the first byte (the head bound, [`ConnectionLimits::HEAD_WITHIN`] by
    /// default), and the minimum rate at which a client takes what the server writes
    /// ([`ConnectionLimits::min_send_rate`]), so a client
    /// that stops reading a streamed response is cut and releases its permits.
    /// `ConnectInfo` keeps working (the listener is a `TapIo`, which axum's
    /// `ConnectInfo<SocketAddr>` accepts).
    ///
    /// Prefer `serve` (feature `serve`) where you can. A listener sees bytes, not
    /// requests: through it, a client that sends its head one byte every 10 s keeps its
    /// connection for ever, and so does an idle keep-alive connection, and h2 streams
    /// are hyper's default (200 a connection). Those take a place under the caps each.
    ///
    /// **h2 through a listener.** The send rate is timed at the socket, and an h2 client
    /// that keeps a stream's flow-control window at 0 (or opens it a byte at a time)
    /// leaves the socket writable. The layer's own response body still keeps the
    /// minimum send rate ([`SlowClients::min_response_rate`](crate::SlowClients::min_response_rate)):
    /// such a stream's permits go after its allowance (5 s by default), but the stream
    /// stays open (hyper never asks its body again), holding a place among hyper's 200
    /// streams a connection and what h2 buffers of its response (a response sent as
    /// one large chunk goes whole into h2's send buffer). `serve` resets such a stream
    /// and bounds what h2 buffers of it.
    ///
    /// ```no_run
    /// use std::net::SocketAddr;
    /// use admission_tower::AdmissionLayer;
    /// use axum::{extract::ConnectInfo, routing::get, Router};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let admission = AdmissionLayer::builder().count(512).build()?;
    /// let app = Router::new()
    ///     .route("/", get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }))
    ///     .layer(admission.clone());
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    /// axum::serve(admission.guard(listener), app.into_make_service_with_connect_info::<SocketAddr>())
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn guard<L>(&self, listener: L) -> GuardedListener<L>
    where
        L: axum::serve::Listener,
        L::Addr: crate::ClientAddress,
    {
        use axum::serve::ListenerExt;
        let keep: fn(&mut GuardedIo<L::Io>) = |_| {};
        Guarded::new(listener, self.connections.clone()).tap_io(keep)
    }

    /// The layer's policy for slow clients ([`AdmissionBuilder::slow_clients`]).
    ///
    /// ```
    /// use admission_tower::{AdmissionLayer, SlowClients};
    ///
    /// let layer = AdmissionLayer::builder().count(8).build()?;
    /// assert_eq!(layer.slow_clients(), SlowClients::default());
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn slow_clients(&self) -> SlowClients {
        self.shared.settings.slow
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admission<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Admission::new(inner, self.shared.clone())
    }
}

impl fmt::Debug for AdmissionLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionLayer")
            .field("snapshot", &self.snapshot())
            .field("dry_run", &self.shared.settings.dry_run)
            .finish_non_exhaustive()
    }
}

/// The listener `AdmissionLayer::guard` makes: a [`Guarded`] listener, as a `TapIo` so
/// that axum's `ConnectInfo<SocketAddr>` accepts it.
#[cfg(feature = "axum")]
pub type GuardedListener<L> =
    axum::serve::TapIo<Guarded<L>, fn(&mut GuardedIo<<L as axum::serve::Listener>::Io>)>;
