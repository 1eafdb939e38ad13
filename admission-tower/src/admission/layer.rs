//! `AdmissionLayer` and its builder.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use admission_core::adaptive::{AdaptiveBuilder, AdaptiveError, AdaptiveSnapshot};
use admission_core::{
    AdaptiveLimit, CapacityError, Claim, Classes, Drain, Gate, GateBuilder, GatePermit,
    GateSnapshot, Key, Priority, Refused,
};
use admission_http::{
    content_length, BodyRefusalContext, MinDataRate, RefusalBody, RefusalContext, Refusals,
    Rejection,
};
use http::request::Parts;
use tower_layer::Layer;

use super::drain::DrainLimits;
use super::observe::{self, Observer};
#[cfg(feature = "tokio")]
use super::Connections;
use super::{Admission, SlowClients};
#[cfg(feature = "axum")]
use super::{Guarded, GuardedIo};

type KeyFn<K> = Box<dyn Fn(&Parts) -> Option<K> + Send + Sync>;
type BypassFn = Box<dyn Fn(&Parts) -> bool + Send + Sync>;
type ClassifyFn = Box<dyn Fn(&Parts) -> Priority + Send + Sync>;
type KeyCapFn<K> = Box<dyn Fn(&Parts, &K) -> Option<u64> + Send + Sync>;
type HookFn = Box<dyn Fn(&RefusalEvent<'_>) + Send + Sync>;

/// What the refusal hook sees: the refused request's head and why it was refused.
#[derive(Debug)]
#[non_exhaustive]
pub struct RefusalEvent<'a> {
    /// The request's method, URI, headers and extensions.
    pub request: &'a Parts,
    /// Why it was refused.
    pub rejection: Rejection,
    /// The request's priority class, on a layer with classes
    /// ([`AdmissionBuilder::priority`]).
    pub priority: Option<Priority>,
    /// The name of that class in the layer's table.
    pub class: Option<&'a str>,
    /// True in dry-run mode: the request is admitted all the same.
    pub dry_run: bool,
}

/// The configuration every clone of the layer and its services shares.
pub(crate) struct Shared<K, H> {
    pub(crate) gate: Gate<K, H>,
    key: Option<KeyFn<K>>,
    key_cap: Option<KeyCapFn<K>>,
    bypass: Option<BypassFn>,
    classes: Option<(Classes, ClassifyFn)>,
    pub(crate) refusals: Refusals,
    hook: Option<HookFn>,
    pub(crate) dry_run: bool,
    pub(crate) drain: DrainLimits,
    pub(crate) observer: Observer,
    would_shed: AtomicU64,
    /// The adaptive limit driving the count, if any.
    adaptive: Option<AdaptiveLimit>,
    /// Where requests are sampled for it (`None` without one).
    pub(crate) sample_at: Option<SampleAt>,
    pub(crate) slow: SlowClients,
    /// Request bodies cut for arriving slower than the minimum rate.
    too_slow: AtomicU64,
    /// The connection bounds of `slow`, for listeners this layer guards.
    #[cfg(feature = "tokio")]
    connections: Connections,
    /// Nothing to read from the head: no byte or key dimension, no bypass, no classes.
    /// The count alone decides, before the request is taken apart. (A dry run may take
    /// this path too: its refusal, which admits the request, reads only the head.)
    pub(crate) count_only: bool,
    /// Built with no limit at all and without `track_in_flight`: while the count ledger
    /// admits everything, requests pass through uncounted.
    pub(crate) untracked: bool,
}

impl<K: Hash + Eq + Clone, H: BuildHasher> Shared<K, H> {
    pub(crate) fn bypasses(&self, parts: &Parts) -> bool {
        self.bypass.as_ref().is_some_and(|bypass| bypass(parts))
    }

    /// The request's class, on a layer with classes.
    #[inline]
    pub(crate) fn classify(&self, parts: &Parts) -> Option<Priority> {
        self.classes.as_ref().map(|(_, classify)| classify(parts))
    }

    /// Admits the request (of class `priority`) on every configured dimension, or says
    /// why not; with the permit, the body's declared length (0 without a byte dimension).
    /// Reads only the head: the body is untouched either way. A body held to `rate` is
    /// charged at first only the grace period's worth of its declared length.
    pub(crate) fn admit(
        &self,
        parts: &Parts,
        priority: Option<Priority>,
        rate: Option<MinDataRate>,
    ) -> Result<(GatePermit<K, H>, u64), Rejection> {
        let declared = match self.gate.bytes() {
            Some(_) => content_length(&parts.headers)?.unwrap_or(0),
            None => 0,
        };
        let now = rate.map_or(declared, |rate| declared.min(rate.grace_bytes()));
        let key = self.key.as_ref().and_then(|key| key(parts));
        let mut claim = Claim::new().bytes(now).total(declared);
        if let Some(key) = &key {
            claim = claim.key(key);
            if let Some(cap) = self.key_cap.as_ref().and_then(|cap| cap(parts, key)) {
                claim = claim.key_cap(cap);
            }
        }
        if let Some(priority) = priority {
            claim = claim.priority(priority);
        }
        Ok((self.gate.try_claim(claim)?, declared))
    }
}

impl<K, H> Shared<K, H> {
    /// The cold path of a refusal: the hook, and the dry-run count.
    #[cold]
    pub(crate) fn refused(&self, parts: &Parts, rejection: Rejection, priority: Option<Priority>) {
        if self.dry_run {
            self.would_shed.fetch_add(1, Ordering::Relaxed);
        }
        if rejection == Rejection::Refused(Refused::TooSlow) {
            self.too_slow.fetch_add(1, Ordering::Relaxed);
        }
        let class = priority
            .zip(self.classes.as_ref())
            .and_then(|(priority, (classes, _))| classes.name(priority));
        self.observer
            .refused(&self.gate, rejection, priority, class, self.dry_run);
        if let Some(hook) = &self.hook {
            hook(&RefusalEvent {
                request: parts,
                rejection,
                priority,
                class,
                dry_run: self.dry_run,
            });
        }
    }

    pub(crate) fn classes(&self) -> Option<&Classes> {
        self.classes.as_ref().map(|(classes, _)| classes)
    }

    pub(crate) fn snapshot(&self) -> AdmissionSnapshot {
        AdmissionSnapshot {
            gate: self.gate.snapshot(),
            would_shed: self.would_shed.load(Ordering::Relaxed),
            too_slow: self.too_slow.load(Ordering::Relaxed),
            adaptive: self.adaptive.as_ref().map(AdaptiveLimit::snapshot),
        }
    }
}

/// A reading of the layer: its gate's ledgers and, in dry-run mode, how many requests
/// it would have shed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct AdmissionSnapshot {
    /// Every configured ledger: in flight, limit, high-water mark, refusals.
    pub gate: GateSnapshot,
    /// Requests refused in dry-run mode and admitted anyway.
    pub would_shed: u64,
    /// Request bodies cut for arriving slower than the minimum rate
    /// ([`SlowClients`](super::SlowClients)).
    pub too_slow: u64,
    /// With an adaptive limit ([`AdmissionBuilder::adaptive`]): the limit it has set (also
    /// `gate.count.capacity`), whether an operator fixed it, and its last window.
    pub adaptive: Option<AdaptiveSnapshot>,
}

/// Where an adaptive limit's latency sample of a request ends
/// ([`AdmissionBuilder::sample_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SampleAt {
    /// When the inner service answers with the response head (the default). The time
    /// the service took to decide, whatever the body does next: a streaming response
    /// (server-sent events, a gRPC server stream, a download to a slow client) would
    /// otherwise read as a server slowing down. The permit is still held until the body
    /// ends.
    #[default]
    Head,
    /// When the response body ends (or fails, or is dropped) and the permit is released:
    /// the whole time the request held its place. For services whose work is in the
    /// body (a handler that streams a computed result) and whose bodies are short.
    BodyEnd,
}

/// Applies admission control to a service: sheds what is over the limits, never queues.
///
/// Every clone of the layer, and every service it makes, shares one gate: a limit per
/// clone would enforce nothing, since frameworks clone services per connection or per
/// request. Build it with [`AdmissionLayer::builder`], or over a [`Gate`] shared with
/// other layers and interceptors with [`AdmissionLayer::from_gate`].
///
/// Its type depends on the key type and hasher alone, never on which limits are set: a
/// layer with no limit at all is the same type, counts requests in flight (for
/// [`snapshot`](Self::snapshot) and [`drain`](Self::drain)) and refuses nothing.
///
/// See the [module docs](crate::admission) for a complete axum example.
pub struct AdmissionLayer<K = Key, H = RandomState> {
    pub(crate) shared: Arc<Shared<K, H>>,
}

impl<K, H> Clone for AdmissionLayer<K, H> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl AdmissionLayer {
    /// A builder with every limit disabled.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(64).build()?;
    /// assert_eq!(layer.gate().count().capacity(), 64);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn builder() -> AdmissionBuilder {
        AdmissionBuilder::new(Limits::Build(Gate::builder()))
    }
}

impl<K, H> AdmissionLayer<K, H> {
    /// A builder over an existing gate: its limits are the gate's, shared with every
    /// other layer or interceptor built from a clone of it (one limit for an HTTP and a
    /// gRPC server in one process, say). Set the key extractor with
    /// [`AdmissionBuilder::key`]; the builder's limit methods do not apply here
    /// (`build` says so: [`BuildError::LimitsOnSharedGate`]).
    ///
    /// ```
    /// use admission_core::{Gate, Key};
    /// use admission_tower::AdmissionLayer;
    ///
    /// let gate: Gate = Gate::builder().count(512).per_key(8).build()?;
    /// let http = AdmissionLayer::from_gate(gate.clone())
    ///     .key(admission_http::key::header(http::HeaderName::from_static("x-api-key")))
    ///     .build()?;
    /// let other = AdmissionLayer::from_gate(gate.clone()).build()?;
    /// let _held = gate.try_admit(Some(&Key::from("k")), 0)?;
    /// assert_eq!(http.snapshot().gate.count.in_flight, 1, "one gate, one count");
    /// assert_eq!(other.snapshot().gate.count.in_flight, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_gate(gate: Gate<K, H>) -> AdmissionBuilder<K, H> {
        AdmissionBuilder::new(Limits::Given(gate))
    }

    /// The gate: its ledgers, to read or to change limits at run time.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(8).build()?;
    /// layer.gate().count().set_capacity(16)?;
    /// assert_eq!(layer.snapshot().gate.count.capacity, 16);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gate(&self) -> &Gate<K, H> {
        &self.shared.gate
    }

    /// A cheap reading of the gate and the dry-run count.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(3).build()?;
    /// let snap = layer.snapshot();
    /// assert_eq!((snap.gate.count.capacity, snap.would_shed), (3, 0));
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn snapshot(&self) -> AdmissionSnapshot {
        self.shared.snapshot()
    }

    /// Sets the layer's gauges from its ledgers (feature `metrics`): requests, bytes
    /// and keys in flight, their high-water marks, the limits in force, and whether the
    /// layer is closed. Call it where the exporter renders (the `/metrics` handler), so
    /// the gauges are the ledgers' values at that moment: see the [module
    /// docs](crate::admission#metrics) for the whole setup and why gauges are read, not
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
        self.shared.observer.record_gauges(&self.shared.gate);
    }

    /// The layer's priority classes, if it has any ([`AdmissionBuilder::priority`]).
    ///
    /// ```
    /// use admission_core::{Classes, Priority};
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .count(64)
    ///     .priority(Classes::standard(), |_| Priority::DEFAULT)
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
    /// use admission_core::{Classes, Priority};
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .count(64)
    ///     .priority(Classes::standard(), |_| Priority::DEFAULT)
    ///     .build()?;
    /// assert_eq!(layer.shed_by_class(), [("critical", 0), ("default", 0), ("sheddable", 0)]);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn shed_by_class(&self) -> Vec<(&str, u64)> {
        let refused = self.shared.gate.count().refused_by_class();
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
        self.shared.gate.drain()
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
        self.shared.gate.close();
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
        self.shared.gate.reopen();
    }

    /// The adaptive limit setting the count limit, if the layer has one
    /// ([`AdmissionBuilder::adaptive`]): to fix the limit by hand and hand it back.
    pub fn adaptive(&self) -> Option<&AdaptiveLimit> {
        self.shared.adaptive.as_ref()
    }

    /// The connection bounds of the layer's [`SlowClients`] policy, shared by every
    /// listener it guards (`guard`, feature `axum`): the cap, and the connections open now.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(8).build()?;
    /// assert_eq!(layer.connections().open(), 0);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    #[cfg(feature = "tokio")]
    pub fn connections(&self) -> &Connections {
        &self.shared.connections
    }

    /// Bounds the connections `listener` accepts for `axum::serve`, by the layer's
    /// [`SlowClients`] policy: a cap on open connections (closed at once above it), a
    /// time to the first byte (30 s by default), and a minimum rate at which a client
    /// takes what the server writes (240 B/s after 5 s), so a client that stops reading
    /// a streamed response is cut and releases its permits. `ConnectInfo` keeps working
    /// (the listener is a `TapIo`, which axum's `ConnectInfo<SocketAddr>` accepts).
    ///
    /// What a listener cannot do: it sees bytes, not requests, so it cannot bound the
    /// time to a complete request head, or idle time between requests. For those, serve
    /// with hyper-util's builder and its `header_read_timeout` (with a timer), which
    /// composes with [`Connections::admit`] in its accept loop.
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
    pub fn guard<L>(&self, listener: L) -> GuardedListener<L>
    where
        L: axum::serve::Listener,
    {
        use axum::serve::ListenerExt;
        let keep: fn(&mut GuardedIo<L::Io>) = |_| {};
        Guarded::new(listener, self.shared.connections.clone()).tap_io(keep)
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
        self.shared.slow
    }
}

impl<S, K, H> Layer<S> for AdmissionLayer<K, H> {
    type Service = Admission<S, K, H>;

    fn layer(&self, inner: S) -> Self::Service {
        Admission::new(inner, self.shared.clone())
    }
}

impl<K, H> fmt::Debug for AdmissionLayer<K, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionLayer")
            .field("snapshot", &self.snapshot())
            .field("dry_run", &self.shared.dry_run)
            .finish_non_exhaustive()
    }
}

/// Where a layer's gate comes from.
enum Limits<K, H> {
    /// Built from the limits set on the builder.
    Build(GateBuilder<K, H>),
    /// Given ([`AdmissionLayer::from_gate`]).
    Given(Gate<K, H>),
    /// Limits were set on a builder over a given gate: `build` refuses.
    Conflict,
}

/// Configuration of an [`AdmissionLayer`]. Every limit defaults to 0, which disables
/// it; builder methods take `self` by value.
///
/// ```
/// use std::time::Duration;
/// use admission_http::key;
/// use admission_tower::AdmissionLayer;
///
/// let layer = AdmissionLayer::builder()
///     .count(256)                         // requests in flight
///     .bytes(64 << 20)                    // request bytes in flight
///     .max_request_bytes(8 << 20)         // one request's body: 413 above
///     .per_key(16, key::header(http::HeaderName::from_static("x-tenant"))) // 429 above
///     .max_keys(10_000)
///     .bypass(|req| matches!(req.uri.path(), "/" | "/health"))
///     .retry_after(Duration::from_secs(2))
///     .on_refusal(|event| eprintln!("shed {} {}", event.request.uri, event.rejection))
///     .build()?;
/// assert_eq!(layer.gate().keyed().unwrap().cap(), 16);
/// # Ok::<(), admission_tower::BuildError>(())
/// ```
pub struct AdmissionBuilder<K = Key, H = RandomState> {
    limits: Limits<K, H>,
    key: Option<KeyFn<K>>,
    key_cap: Option<KeyCapFn<K>>,
    bypass: Option<BypassFn>,
    classes: Option<(Classes, ClassifyFn)>,
    refusals: Refusals,
    observer: Option<HookFn>,
    dry_run: bool,
    drain: DrainLimits,
    track_in_flight: bool,
    report: observe::Options,
    adaptive: Option<AdaptiveBuilder>,
    sample_at: SampleAt,
    slow: SlowClients,
}

impl<K, H> Limits<K, H> {
    /// Changes the limits being built (to another key type or hasher, if need be); any
    /// change to a given gate is a conflict.
    fn map<K2, H2>(
        self,
        set: impl FnOnce(GateBuilder<K, H>) -> GateBuilder<K2, H2>,
    ) -> Limits<K2, H2> {
        match self {
            Limits::Build(builder) => Limits::Build(set(builder)),
            Limits::Given(_) | Limits::Conflict => Limits::Conflict,
        }
    }
}

impl<K, H> AdmissionBuilder<K, H> {
    /// The limits, and the rest of the builder (with a placeholder where they were).
    fn take_limits(mut self) -> (Limits<K, H>, Self) {
        let limits = std::mem::replace(&mut self.limits, Limits::Conflict);
        (limits, self)
    }

    fn new(limits: Limits<K, H>) -> Self {
        Self {
            limits,
            key: None,
            key_cap: None,
            bypass: None,
            classes: None,
            refusals: Refusals::new(),
            observer: None,
            dry_run: false,
            drain: DrainLimits::default(),
            track_in_flight: false,
            report: observe::Options::default(),
            adaptive: None,
            sample_at: SampleAt::default(),
            slow: SlowClients::default(),
        }
    }

    /// Applies `set` to the limits being built; on a given gate, records the conflict.
    fn limit(mut self, set: impl FnOnce(GateBuilder<K, H>) -> GateBuilder<K, H>) -> Self {
        self.limits = self.limits.map(set);
        self
    }

    /// The same configuration over other limits (a new key type or hasher), without
    /// a key extractor.
    fn with_limits<K2, H2>(self, limits: Limits<K2, H2>) -> AdmissionBuilder<K2, H2> {
        AdmissionBuilder {
            limits,
            key: None,
            key_cap: None,
            bypass: self.bypass,
            classes: self.classes,
            refusals: self.refusals,
            observer: self.observer,
            dry_run: self.dry_run,
            drain: self.drain,
            track_in_flight: self.track_in_flight,
            report: self.report,
            adaptive: self.adaptive,
            sample_at: self.sample_at,
            slow: self.slow,
        }
    }
}

impl<K, H> AdmissionBuilder<K, H>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    /// At most `capacity` requests in flight (from the call until the response body
    /// ends); 0 sets no count limit.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(100).build()?;
    /// assert_eq!(layer.gate().count().capacity(), 100);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn count(self, capacity: usize) -> Self {
        self.limit(|gate| gate.count(capacity))
    }

    /// At most `budget` bytes of request bodies in flight: a declared `Content-Length`
    /// is charged before the body is read, a body without one as it arrives; the charge
    /// is held until the response body ends. 0 disables the budget.
    ///
    /// This bounds request bytes the server is handed, not what handlers allocate.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().bytes(1 << 20).build()?;
    /// assert_eq!(layer.gate().bytes().unwrap().budget(), 1 << 20);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn bytes(self, budget: u64) -> Self {
        self.limit(|gate| gate.bytes(budget))
    }

    /// Refuse a request whose body is above `max` bytes with 413, before reading it;
    /// 0 sets no maximum.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().max_request_bytes(1 << 16).build()?;
    /// assert_eq!(layer.gate().bytes().unwrap().max_charge(), 1 << 16);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn max_request_bytes(self, max: u64) -> Self {
        self.limit(|gate| gate.max_request_bytes(max))
    }

    /// At most `cap` requests in flight per key (429 above); `key` extracts it from the
    /// request's head: a header, the peer address, or an extension an authentication
    /// layer set before this one. A request for which `key` returns `None` passes the key
    /// dimension. 0 disables the cap (the key is still extracted, for no use).
    ///
    /// The default key type, [`Key`], is what the ready-made extractors of
    /// [`admission_http::key`] give: it neither allocates per request nor keeps the
    /// request's buffer alive. Any `Hash + Eq + Clone` type works (the layer's type then
    /// names it).
    ///
    /// ```
    /// use admission_http::key;
    /// use admission_tower::AdmissionLayer;
    ///
    /// let by_tenant = AdmissionLayer::builder()
    ///     .per_key(8, key::header(http::HeaderName::from_static("x-tenant")))
    ///     .build()?;
    /// assert_eq!(by_tenant.gate().keyed().unwrap().cap(), 8);
    ///
    /// // axum, by client address (serve with `into_make_service_with_connect_info`):
    /// use axum::extract::ConnectInfo;
    /// use std::net::SocketAddr;
    /// let by_peer = AdmissionLayer::builder()
    ///     .per_key(32, key::peer_ip(|info: &ConnectInfo<SocketAddr>| info.0.ip()))
    ///     .build()?;
    /// # drop(by_peer);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn per_key<K2, F>(self, cap: usize, key: F) -> AdmissionBuilder<K2, H>
    where
        K2: Hash + Eq + Clone + Send + Sync + 'static,
        F: Fn(&Parts) -> Option<K2> + Send + Sync + 'static,
    {
        let (limits, rest) = self.take_limits();
        // A given gate's key type is fixed: `key` is the method for it.
        let limits = limits.map(|gate| gate.with_key_type::<K2>().per_key(cap));
        let mut builder = rest.with_limits(limits);
        builder.key = Some(Box::new(key));
        builder
    }

    /// The key extractor alone, without changing the per-key cap: for a layer over a
    /// given gate ([`AdmissionLayer::from_gate`]), whose cap is the gate's.
    ///
    /// ```
    /// use admission_core::Gate;
    /// use admission_http::key;
    /// use admission_tower::AdmissionLayer;
    ///
    /// let gate: Gate = Gate::builder().per_key(4).build()?;
    /// let layer = AdmissionLayer::from_gate(gate)
    ///     .key(key::header(http::HeaderName::from_static("x-api-key")))
    ///     .build()?;
    /// assert_eq!(layer.gate().keyed().unwrap().cap(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key<F>(mut self, key: F) -> Self
    where
        F: Fn(&Parts) -> Option<K> + Send + Sync + 'static,
    {
        self.key = Some(Box::new(key));
        self
    }

    /// The hasher of the per-key table (default: the standard library's `RandomState`,
    /// which resists hash flooding; choose a faster one only for keys clients cannot
    /// choose).
    ///
    /// ```
    /// use std::hash::BuildHasherDefault;
    /// use std::collections::hash_map::DefaultHasher;
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .per_key(4, |req| req.headers.get("x-k").map(|v| admission_core::Key::from_bytes(v.as_bytes())))
    ///     .hasher(BuildHasherDefault::<DefaultHasher>::default())
    ///     .build()?;
    /// assert_eq!(layer.gate().keyed().unwrap().cap(), 4);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn hasher<H2>(self, hasher: H2) -> AdmissionBuilder<K, H2>
    where
        H2: BuildHasher + Clone + Send + Sync + 'static,
    {
        let (limits, mut rest) = self.take_limits();
        let (key, key_cap) = (rest.key.take(), rest.key_cap.take());
        let mut builder = rest.with_limits(limits.map(|gate| gate.hasher(hasher)));
        builder.key = key;
        builder.key_cap = key_cap;
        builder
    }

    /// A cap chosen per key, in place of [`per_key`](Self::per_key)'s: tenant tiers. For
    /// each request with a key, `cap` looks at the head and the key and returns that
    /// key's cap (a paying tenant 32, a free one 4), or `None` for the layer's per-key
    /// cap. `Some(0)` refuses the key everything (429), `Some(u64::MAX)` gives it no cap.
    /// The key table, `max_keys` and the reclaim of idle keys are the same as with one
    /// cap. Use after [`per_key`](Self::per_key) (with a cap of 0 for "no cap unless the
    /// lookup gives one").
    ///
    /// Keep the lookup cheap (a map read, or a claim already parsed into the request's
    /// extensions): it runs on every request with a key.
    ///
    /// ```
    /// use admission_core::Key;
    /// use admission_http::key;
    /// use admission_tower::AdmissionLayer;
    ///
    /// let paying = [Key::from("acme")];
    /// let layer = AdmissionLayer::builder()
    ///     .per_key(4, key::header(http::HeaderName::from_static("x-tenant"))) // free tier: 4
    ///     .key_cap(move |_req, tenant| paying.contains(tenant).then_some(32))
    ///     .build()?;
    /// assert_eq!(layer.gate().keyed().unwrap().cap(), 4);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn key_cap<F>(mut self, cap: F) -> Self
    where
        F: Fn(&Parts, &K) -> Option<u64> + Send + Sync + 'static,
    {
        self.key_cap = Some(Box::new(cap));
        self
    }

    /// Priority classes: `classify` reads each request's head and names its class in
    /// `classes`; a class is admitted only while fewer than its share of the count
    /// capacity are in flight, so when the server must shed, the least important work
    /// goes first (see [`Classes`] on choosing shares). A class shed is a count refusal:
    /// 503 + `Retry-After`, as any. The refusal hook names the class
    /// ([`RefusalEvent::class`]), and [`AdmissionLayer::shed_by_class`] counts them.
    ///
    /// Bypassed routes are still bypassed. The classifier runs before admission, on
    /// every request that is not bypassed: keep it to a header or path lookup. A class
    /// taken from a request header is the client's word: trust it only from callers you
    /// trust (other services of yours), or derive it from what authenticates them.
    ///
    /// ```
    /// use admission_core::{Classes, Priority};
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .count(256)
    ///     .priority(Classes::standard(), |req| match req.uri.path() {
    ///         "/checkout" => Priority::CRITICAL,
    ///         path if path.starts_with("/prefetch") => Priority::SHEDDABLE,
    ///         _ => Priority::DEFAULT,
    ///     })
    ///     .build()?;
    /// assert!(layer.classes().is_some());
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn priority<F>(mut self, classes: Classes, classify: F) -> Self
    where
        F: Fn(&Parts) -> Priority + Send + Sync + 'static,
    {
        self.classes = Some((classes, Box::new(classify)));
        self
    }

    /// At most `max_keys` distinct keys with requests in flight (a client spraying new
    /// keys gets 503 past it); 0 sets no bound.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .per_key(8, |req| Some(req.uri.path().to_owned()))
    ///     .max_keys(1000)
    ///     .build()?;
    /// assert_eq!(layer.gate().keyed().unwrap().max_keys(), 1000);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn max_keys(self, max_keys: usize) -> Self {
        self.limit(|gate| gate.max_keys(max_keys))
    }

    /// The layer's name, for telling layers apart where it reports: the `name` label of
    /// its metrics (feature `metrics`) and the `name` field of its events (feature
    /// `tracing`). Default: `admission`.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let api = AdmissionLayer::builder().count(512).name("api").build()?;
    /// # drop(api);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.report.name = name.into();
        self
    }

    /// Whether this layer records metrics (feature `metrics`; default: yes, every layer
    /// does once the feature is on).
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let internal = AdmissionLayer::builder().count(64).metrics(false).build()?;
    /// # drop(internal);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics(mut self, enabled: bool) -> Self {
        self.report.metrics = enabled;
        self
    }

    /// Requests for which `bypass` returns true are never shed and hold no permit:
    /// liveness routes, so a load balancer does not evict an instance that is serving.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::convert::Infallible;
    /// # type Body = http_body_util::Full<bytes::Bytes>;
    /// # let ok = tower::service_fn(|_: http::Request<admission_http::MeteredBody<Body>>| async {
    /// #     Ok::<_, Infallible>(http::Response::new(Body::default()))
    /// # });
    /// let layer = AdmissionLayer::builder()
    ///     .count(1)
    ///     .bypass(|req| req.uri.path() == "/health")
    ///     .build()?;
    /// let service = layer.layer(ok);
    /// let _held = service.clone().oneshot(http::Request::new(Body::default())).await?;
    /// let probe = http::Request::get("/health").body(Body::default())?;
    /// assert_eq!(service.oneshot(probe).await?.status(), 200);
    /// # Ok(())
    /// # }
    /// ```
    pub fn bypass<F>(mut self, bypass: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.bypass = Some(Box::new(bypass));
        self
    }

    /// The `Retry-After` of 503 and 429 answers, rounded up to whole seconds (default 1).
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_tower::AdmissionLayer;
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::convert::Infallible;
    /// # type Body = http_body_util::Full<bytes::Bytes>;
    /// # let ok = tower::service_fn(|_: http::Request<admission_http::MeteredBody<Body>>| async {
    /// #     Ok::<_, Infallible>(http::Response::new(Body::default()))
    /// # });
    /// let layer = AdmissionLayer::builder().count(1).retry_after(Duration::from_secs(5)).build()?;
    /// let service = layer.layer(ok);
    /// let _held = service.clone().oneshot(http::Request::new(Body::default())).await?;
    /// let refused = service.oneshot(http::Request::new(Body::default())).await?;
    /// assert_eq!(refused.headers()["retry-after"], "5");
    /// # Ok(())
    /// # }
    /// ```
    pub fn retry_after(mut self, delay: Duration) -> Self {
        self.refusals = self.refusals.retry_after(delay);
        self
    }

    /// Spreads the `Retry-After` (and a gRPC refusal's pushback) of each refusal over
    /// `[retry_after, retry_after + jitter]`, drawn per refusal, so that clients shed in
    /// one burst do not all come back in the same second. Off by default; see
    /// [`Refusals::retry_jitter`] for why, and for when to turn it on.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .count(64)
    ///     .retry_after(Duration::from_secs(1))
    ///     .retry_jitter(Duration::from_secs(2)) // Retry-After: 1, 2 or 3
    ///     .build()?;
    /// # drop(layer);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn retry_jitter(mut self, jitter: Duration) -> Self {
        self.refusals = self.refusals.retry_jitter(jitter);
        self
    }

    /// The body of refusals (default: one line of plain text); see
    /// [`Refusals::body`].
    ///
    /// ```
    /// use admission_http::RefusalBody;
    /// use admission_tower::AdmissionLayer;
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::convert::Infallible;
    /// # type Body = http_body_util::Full<bytes::Bytes>;
    /// # let ok = tower::service_fn(|_: http::Request<admission_http::MeteredBody<Body>>| async {
    /// #     Ok::<_, Infallible>(http::Response::new(Body::default()))
    /// # });
    /// let layer = AdmissionLayer::builder()
    ///     .count(1)
    ///     .refusal_body(|cx| RefusalBody::json(format!(r#"{{"status":{}}}"#, cx.status.as_u16())))
    ///     .build()?;
    /// let service = layer.layer(ok);
    /// let _held = service.clone().oneshot(http::Request::new(Body::default())).await?;
    /// let refused = service.oneshot(http::Request::new(Body::default())).await?;
    /// assert_eq!(refused.headers()["content-type"], "application/json");
    /// # Ok(())
    /// # }
    /// ```
    pub fn refusal_body<F>(mut self, body: F) -> Self
    where
        F: Fn(&RefusalContext<'_>) -> RefusalBody + Send + Sync + 'static,
    {
        self.refusals = self.refusals.body(body);
        self
    }

    /// Replaces the whole refusal response (status and headers too), for protocols
    /// with their own refusal shape; see [`Refusals::response`]. `admission-grpc` uses
    /// this for gRPC's trailers-only `RESOURCE_EXHAUSTED`.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::convert::Infallible;
    /// # type Body = http_body_util::Full<bytes::Bytes>;
    /// # let ok = tower::service_fn(|_: http::Request<admission_http::MeteredBody<Body>>| async {
    /// #     Ok::<_, Infallible>(http::Response::new(Body::default()))
    /// # });
    /// let layer = AdmissionLayer::builder()
    ///     .count(1)
    ///     .refusal_response(|_| {
    ///         let mut response = http::Response::new(bytes::Bytes::new());
    ///         *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
    ///         response
    ///     })
    ///     .build()?;
    /// let service = layer.layer(ok);
    /// let _held = service.clone().oneshot(http::Request::new(Body::default())).await?;
    /// let refused = service.oneshot(http::Request::new(Body::default())).await?;
    /// assert_eq!(refused.status(), 429);
    /// # Ok(())
    /// # }
    /// ```
    pub fn refusal_response<F>(mut self, response: F) -> Self
    where
        F: Fn(&RefusalContext<'_>) -> http::Response<bytes::Bytes> + Send + Sync + 'static,
    {
        self.refusals = self.refusals.response(response);
        self
    }

    /// Called on every refusal (and every would-be refusal in dry-run mode), on the
    /// request's task: count it, or log it at debug level. Keep it cheap; it runs while
    /// the server is overloaded.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use admission_tower::AdmissionLayer;
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::convert::Infallible;
    /// # type Body = http_body_util::Full<bytes::Bytes>;
    /// # let ok = tower::service_fn(|_: http::Request<admission_http::MeteredBody<Body>>| async {
    /// #     Ok::<_, Infallible>(http::Response::new(Body::default()))
    /// # });
    /// let shed = Arc::new(AtomicU64::new(0));
    /// let counter = shed.clone();
    /// let layer = AdmissionLayer::builder()
    ///     .count(1)
    ///     .on_refusal(move |_event| { counter.fetch_add(1, Ordering::Relaxed); })
    ///     .build()?;
    /// let service = layer.layer(ok);
    /// let _held = service.clone().oneshot(http::Request::new(Body::default())).await?;
    /// let _refused = service.oneshot(http::Request::new(Body::default())).await?;
    /// assert_eq!(shed.load(Ordering::Relaxed), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_refusal<F>(mut self, observer: F) -> Self
    where
        F: Fn(&RefusalEvent<'_>) + Send + Sync + 'static,
    {
        self.observer = Some(Box::new(observer));
        self
    }

    /// How much of a refused HTTP/1.1 request's unread body is drained (read and
    /// dropped) so the connection can carry the next request: bodies up to `max_bytes`
    /// that arrive `within` the time given (default 64 KiB within 1 s; `max_bytes` 0
    /// drains none).
    ///
    /// A refused request's body is never handed to the service. Over HTTP/1.x that
    /// body stands between the refusal and the connection's next request, so the layer
    /// either drains it before sending the refusal (small bodies, read at once from
    /// the socket: the connection stays open) or answers at once with
    /// `connection: close` (a larger body, one sent with `expect: 100-continue`, one that
    /// does not arrive in time, and every refusal made while a body streamed): the
    /// client's pool then opens a new connection for its next request instead of
    /// failing it on this one. Above `max_bytes` the server closes with the body unread,
    /// which can make the client's kernel report a reset before the client reads the
    /// refusal. Draining holds no permit, and waits on tokio's timer (feature `tokio`,
    /// on by default; without it, or outside a tokio runtime, nothing is waited for).
    /// Over HTTP/2 a small body is drained the same way (a stream answered while its
    /// client still sends is reset, and some clients report that reset in place of the
    /// refusal); any other is answered at once, and never with a connection header.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .count(64)
    ///     .drain_refused(16 << 10, Duration::from_millis(200))
    ///     .build()?;
    /// # drop(layer);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn drain_refused(mut self, max_bytes: u64, within: Duration) -> Self {
        self.drain = DrainLimits { max_bytes, within };
        self
    }

    /// The source of the error a request body fails with when the byte budget refuses
    /// it while it streams; see [`Refusals::body_error`]. `admission-grpc` sets a
    /// `tonic::Status` here, so a streaming handler that propagates the body error
    /// answers with the refusal's gRPC status.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .bytes(1 << 20)
    ///     .body_error(|cx| format!("busy: {}", cx.refused).into())
    ///     .build()?;
    /// # drop(layer);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn body_error<F>(mut self, error: F) -> Self
    where
        F: Fn(&BodyRefusalContext) -> admission_http::BoxError + Send + Sync + 'static,
    {
        self.refusals = self.refusals.body_error(error);
        self
    }

    /// Dry run: count and report what would be shed (the hook and
    /// [`AdmissionSnapshot::would_shed`]) but admit it, for rolling out a limit safely.
    /// Requests admitted over a limit this way hold no permit.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::convert::Infallible;
    /// # type Body = http_body_util::Full<bytes::Bytes>;
    /// # let ok = tower::service_fn(|_: http::Request<admission_http::MeteredBody<Body>>| async {
    /// #     Ok::<_, Infallible>(http::Response::new(Body::default()))
    /// # });
    /// let layer = AdmissionLayer::builder().count(1).dry_run(true).build()?;
    /// let service = layer.layer(ok);
    /// let _held = service.clone().oneshot(http::Request::new(Body::default())).await?;
    /// let over = service.oneshot(http::Request::new(Body::default())).await?;
    /// assert_eq!(over.status(), 200, "admitted in a dry run");
    /// assert_eq!(layer.snapshot().would_shed, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn dry_run(mut self, enabled: bool) -> Self {
        self.dry_run = enabled;
        self
    }

    /// Count requests in flight even when no limit is set, so that
    /// [`AdmissionLayer::drain`] can wait for them and snapshots show them.
    ///
    /// A layer with a limit counts every admitted request anyway. A layer built with
    /// every limit disabled (admission turned off by configuration, say) passes requests
    /// through uncounted, at about the cost of the bare service; counting costs two
    /// uncontended atomic operations per request, which is most of the difference
    /// between the two in the layer bench. Uncounted, such a layer still refuses new
    /// requests once closed or drained, but its drain cannot know what was admitted
    /// before and completes at once: a server that shuts down gracefully (hyper's and
    /// axum's graceful shutdown wait for open connections) still cuts nothing off.
    /// Likewise a limit set at run time on an uncounted layer counts only the requests
    /// admitted after it.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # type Body = http_body_util::Full<bytes::Bytes>;
    /// # let ok = tower::service_fn(|_: http::Request<admission_http::MeteredBody<Body>>| async {
    /// #     Ok::<_, std::convert::Infallible>(http::Response::new(Body::default()))
    /// # });
    /// let layer = AdmissionLayer::builder().track_in_flight(true).build()?;
    /// let response = layer.layer(ok).oneshot(http::Request::new(Body::default())).await?;
    /// assert_eq!(layer.snapshot().gate.count.in_flight, 1, "counted until the body ends");
    /// drop(response);
    /// # Ok(())
    /// # }
    /// ```
    pub fn track_in_flight(mut self, enabled: bool) -> Self {
        self.track_in_flight = enabled;
        self
    }

    /// Lets an adaptive limit set the count limit: it raises the limit while the server
    /// keeps up and lowers it when latency (or failure) says the server queues, within
    /// its bounds. Replaces [`count`](Self::count)'s fixed number (the limit starts at
    /// the builder's initial limit); the byte and key dimensions, classes (whose shares
    /// follow the limit), bypass and dry run work as before. On a layer built
    /// [`from_gate`](AdmissionLayer::from_gate), it drives that gate's count, for every
    /// layer and interceptor sharing it (requests admitted elsewhere count in flight, but
    /// only this layer's are sampled).
    ///
    /// Each admitted request is one sample: its latency from admission to the point
    /// chosen with [`sample_at`](Self::sample_at) (default: the response head), and its
    /// outcome: a 5xx response, a gRPC `RESOURCE_EXHAUSTED`, `UNAVAILABLE` or
    /// `DEADLINE_EXCEEDED` in a trailers-only response, or an error from the service is
    /// an overload; a request whose response future is dropped before the head (the
    /// client went away) is dropped. Refusals by this layer are not samples. Costs two
    /// clock reads per admitted request and one uncontended atomic addition (see
    /// [`admission_core::adaptive`]).
    ///
    /// Who wins: [`close`](AdmissionLayer::close) and [`drain`](AdmissionLayer::drain)
    /// override the controller; a count set by hand (`layer.gate().count().set_capacity`)
    /// takes the limit out of its hands until
    /// [`AdaptiveLimit::resume`](admission_core::AdaptiveLimit::resume)
    /// ([`AdmissionLayer::adaptive`]). The limit is in every
    /// [`snapshot`](AdmissionLayer::snapshot).
    ///
    /// ```
    /// use admission_tower::admission_core::adaptive::{AdaptiveLimit, Gradient};
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .adaptive(AdaptiveLimit::builder(Gradient::default()).bounds(8, 2_000).initial(32))
    ///     .build()?;
    /// assert_eq!(layer.snapshot().gate.count.capacity, 32);
    /// assert_eq!(layer.snapshot().adaptive.unwrap().limit, 32);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn adaptive(mut self, limit: AdaptiveBuilder) -> Self {
        self.adaptive = Some(limit);
        self
    }

    /// Where the adaptive limit's latency sample of a request ends: at the response head
    /// (the default, right for streaming responses) or at the end of the response body.
    /// See [`SampleAt`].
    pub fn sample_at(mut self, at: SampleAt) -> Self {
        self.sample_at = at;
        self
    }

    /// What the layer does about slow clients: by default a request body slower than
    /// 240 bytes per second after 5 s of waiting is cut (408), and a slow body holds of
    /// the byte budget only what it fills. See [`SlowClients`].
    ///
    /// ```
    /// use admission_tower::{AdmissionLayer, SlowClients};
    ///
    /// let layer = AdmissionLayer::builder().bytes(1 << 20).slow_clients(SlowClients::off()).build()?;
    /// assert_eq!(layer.slow_clients(), SlowClients::off());
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn slow_clients(mut self, policy: SlowClients) -> Self {
        self.slow = policy;
        self
    }

    /// The layer. With every limit disabled it refuses nothing (unless closed or
    /// drained) and costs about what the bare service does; its type is the same either
    /// way, so a layer can be installed unconditionally.
    ///
    /// # Errors
    ///
    /// [`BuildError::Capacity`] if a limit is beyond what its ledger represents;
    /// [`BuildError::LimitsOnSharedGate`] if limits were set on a builder over a given
    /// gate.
    ///
    /// ```
    /// use admission_tower::{AdmissionLayer, BuildError};
    ///
    /// let unlimited = AdmissionLayer::builder().count(0).build()?;
    /// assert_eq!(unlimited.gate().count().capacity(), 0);
    /// assert!(matches!(
    ///     AdmissionLayer::builder().count(usize::MAX).build(),
    ///     Err(BuildError::Capacity(_))
    /// ));
    /// # Ok::<(), BuildError>(())
    /// ```
    pub fn build(self) -> Result<AdmissionLayer<K, H>, BuildError> {
        let gate = match self.limits {
            Limits::Conflict => return Err(BuildError::LimitsOnSharedGate),
            Limits::Given(gate) => gate,
            Limits::Build(builder) => match self.key {
                // Caps chosen per key need the key table even with no default cap.
                Some(_) if self.key_cap.is_some() => builder.track_keys().build()?,
                Some(_) => builder.build()?,
                // Without an extractor no request has a key: leave the dimension out.
                None => builder.per_key(0).build()?,
            },
        };
        let adaptive = self
            .adaptive
            .map(|limit| limit.build(gate.count()))
            .transpose()?;
        let count_only = gate.bytes().is_none()
            && gate.keyed().is_none()
            && self.bypass.is_none()
            && self.classes.is_none();
        let observer = Observer::new(
            &self.report,
            &gate,
            self.classes.as_ref().map(|(classes, _)| classes),
        );
        let untracked = !self.track_in_flight
            && !observer.counts()
            && gate.count().capacity() == 0
            && gate.bytes().is_none()
            && gate.keyed().is_none();
        Ok(AdmissionLayer {
            shared: Arc::new(Shared {
                gate,
                key: self.key,
                key_cap: self.key_cap,
                bypass: self.bypass,
                classes: self.classes,
                refusals: self.refusals,
                hook: self.observer,
                dry_run: self.dry_run,
                drain: self.drain,
                observer,
                would_shed: AtomicU64::new(0),
                sample_at: adaptive.is_some().then_some(self.sample_at),
                slow: self.slow,
                too_slow: AtomicU64::new(0),
                #[cfg(feature = "tokio")]
                connections: Connections::new(self.slow),
                adaptive,
                count_only,
                untracked,
            }),
        })
    }
}

/// The listener `AdmissionLayer::guard` makes: a [`Guarded`] listener, as a `TapIo` so
/// that axum's `ConnectInfo<SocketAddr>` accepts it.
#[cfg(feature = "axum")]
pub type GuardedListener<L> =
    axum::serve::TapIo<Guarded<L>, fn(&mut GuardedIo<<L as axum::serve::Listener>::Io>)>;

/// Why [`AdmissionBuilder::build`] could not make a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// A limit is beyond what its ledger represents.
    Capacity(CapacityError),
    /// Limits (count, bytes, per-key cap, hasher, ...) were set on a builder over a
    /// given gate, whose limits are its own: set them on the gate, and the key extractor
    /// with [`AdmissionBuilder::key`].
    LimitsOnSharedGate,
    /// The adaptive limit's bounds are invalid, or its count ledger (a given gate's) is
    /// driven by another adaptive limit already.
    Adaptive(AdaptiveError),
}

impl From<AdaptiveError> for BuildError {
    fn from(error: AdaptiveError) -> Self {
        BuildError::Adaptive(error)
    }
}

impl From<CapacityError> for BuildError {
    fn from(error: CapacityError) -> Self {
        BuildError::Capacity(error)
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Capacity(error) => error.fmt(f),
            BuildError::LimitsOnSharedGate => f.write_str(
                "limits were set on a layer built from a gate; set them on the gate, \
                 and the key extractor with `key`",
            ),
            BuildError::Adaptive(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Capacity(error) => Some(error),
            BuildError::Adaptive(error) => Some(error),
            BuildError::LimitsOnSharedGate => None,
        }
    }
}

impl<K, H> fmt::Debug for AdmissionBuilder<K, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limits: &dyn fmt::Debug = match &self.limits {
            Limits::Build(builder) => builder,
            Limits::Given(_) => &"a given gate",
            Limits::Conflict => &"limits set on a given gate",
        };
        f.debug_struct("AdmissionBuilder")
            .field("limits", limits)
            .field("dry_run", &self.dry_run)
            .field("adaptive", &self.adaptive)
            .finish_non_exhaustive()
    }
}
