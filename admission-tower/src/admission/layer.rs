//! `AdmissionLayer` and its builder.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use admission_core::{CapacityError, Gate, GateBuilder, GatePermit, GateSnapshot};
use admission_http::{
    content_length, BodyRefusalContext, RefusalBody, RefusalContext, Refusals, Rejection,
};
use http::request::Parts;
use tower_layer::Layer;

use super::drain::DrainLimits;
use super::Admission;

type KeyFn<K> = Box<dyn Fn(&Parts) -> Option<K> + Send + Sync>;
type BypassFn = Box<dyn Fn(&Parts) -> bool + Send + Sync>;
type ObserverFn = Box<dyn Fn(&RefusalEvent<'_>) + Send + Sync>;

/// What the refusal hook sees: the refused request's head and why it was refused.
#[derive(Debug)]
#[non_exhaustive]
pub struct RefusalEvent<'a> {
    /// The request's method, URI, headers and extensions.
    pub request: &'a Parts,
    /// Why it was refused.
    pub rejection: Rejection,
    /// True in dry-run mode: the request is admitted all the same.
    pub dry_run: bool,
}

/// The configuration every clone of the layer and its services shares.
pub(crate) struct Shared<K, H> {
    pub(crate) gate: Gate<K, H>,
    key: Option<KeyFn<K>>,
    bypass: Option<BypassFn>,
    pub(crate) refusals: Refusals,
    observer: Option<ObserverFn>,
    pub(crate) dry_run: bool,
    pub(crate) drain: DrainLimits,
    would_shed: AtomicU64,
}

impl<K: Hash + Eq + Clone, H: BuildHasher> Shared<K, H> {
    pub(crate) fn bypasses(&self, parts: &Parts) -> bool {
        self.bypass.as_ref().is_some_and(|bypass| bypass(parts))
    }

    /// Admits the request on every configured dimension, or says why not. Reads only
    /// the head: the body is untouched either way.
    pub(crate) fn admit(&self, parts: &Parts) -> Result<GatePermit<K, H>, Rejection> {
        let declared = match self.gate.bytes() {
            Some(_) => content_length(&parts.headers)?.unwrap_or(0),
            None => 0,
        };
        let key = self.key.as_ref().and_then(|key| key(parts));
        Ok(self.gate.try_admit(key.as_ref(), declared)?)
    }
}

impl<K, H> Shared<K, H> {
    /// The cold path of a refusal: the hook, and the dry-run count.
    #[cold]
    pub(crate) fn refused(&self, parts: &Parts, rejection: Rejection) {
        if self.dry_run {
            self.would_shed.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(observer) = &self.observer {
            observer(&RefusalEvent {
                request: parts,
                rejection,
                dry_run: self.dry_run,
            });
        }
    }

    pub(crate) fn snapshot(&self) -> AdmissionSnapshot {
        AdmissionSnapshot {
            gate: self.gate.snapshot(),
            would_shed: self.would_shed.load(Ordering::Relaxed),
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
}

/// Applies admission control to a service: sheds what is over the limits, never queues.
///
/// Every clone of the layer, and every service it makes, shares one gate: a limit per
/// clone would enforce nothing, since frameworks clone services per connection or per
/// request. Build it with [`AdmissionLayer::builder`].
///
/// See the [module docs](crate::admission) for a complete axum example.
pub struct AdmissionLayer<K = (), H = RandomState> {
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
    /// assert!(AdmissionLayer::builder().build()?.is_none(), "nothing to install");
    /// assert!(AdmissionLayer::builder().count(64).build()?.is_some());
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn builder() -> AdmissionBuilder {
        AdmissionBuilder {
            gate: Gate::builder(),
            key: None,
            bypass: None,
            refusals: Refusals::new(),
            observer: None,
            dry_run: false,
            drain: DrainLimits::default(),
        }
    }
}

impl<K, H> AdmissionLayer<K, H> {
    /// The gate: its ledgers, to read or to change limits at run time.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(8).build()?.unwrap();
    /// layer.gate().count().unwrap().set_capacity(16)?;
    /// assert_eq!(layer.snapshot().gate.count.unwrap().capacity, 16);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn gate(&self) -> &Gate<K, H> {
        &self.shared.gate
    }

    /// A cheap reading of the gate and the dry-run count.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(3).build()?.unwrap();
    /// let snap = layer.snapshot();
    /// assert_eq!((snap.gate.count.unwrap().capacity, snap.would_shed), (3, 0));
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn snapshot(&self) -> AdmissionSnapshot {
        self.shared.snapshot()
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

/// Configuration of an [`AdmissionLayer`]. Every limit defaults to 0, which disables
/// it; builder methods take `self` by value.
///
/// ```
/// use std::time::Duration;
/// use admission_tower::AdmissionLayer;
///
/// let layer = AdmissionLayer::builder()
///     .count(256)                         // requests in flight
///     .bytes(64 << 20)                    // request bytes in flight
///     .max_request_bytes(8 << 20)         // one request's body: 413 above
///     .per_key(16, |req| {                // per client, from a header
///         req.headers.get("x-tenant")?.to_str().ok().map(str::to_owned)
///     })
///     .max_keys(10_000)
///     .bypass(|req| matches!(req.uri.path(), "/" | "/health"))
///     .retry_after(Duration::from_secs(2))
///     .on_refusal(|event| eprintln!("shed {} {}", event.request.uri, event.rejection))
///     .build()?
///     .expect("limits are configured");
/// assert_eq!(layer.gate().keyed().unwrap().cap(), 16);
/// # Ok::<(), admission_core::CapacityError>(())
/// ```
pub struct AdmissionBuilder<K = ()> {
    gate: GateBuilder<K, RandomState>,
    key: Option<KeyFn<K>>,
    bypass: Option<BypassFn>,
    refusals: Refusals,
    observer: Option<ObserverFn>,
    dry_run: bool,
    drain: DrainLimits,
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> AdmissionBuilder<K> {
    /// At most `capacity` requests in flight (from the call until the response body
    /// ends); 0 disables.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(100).build()?.unwrap();
    /// assert_eq!(layer.gate().count().unwrap().capacity(), 100);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn count(mut self, capacity: usize) -> Self {
        self.gate = self.gate.count(capacity);
        self
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
    /// let layer = AdmissionLayer::builder().bytes(1 << 20).build()?.unwrap();
    /// assert_eq!(layer.gate().bytes().unwrap().budget(), 1 << 20);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn bytes(mut self, budget: u64) -> Self {
        self.gate = self.gate.bytes(budget);
        self
    }

    /// Refuse a request whose body is above `max` bytes with 413, before reading it;
    /// 0 sets no maximum.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().max_request_bytes(1 << 16).build()?.unwrap();
    /// assert_eq!(layer.gate().bytes().unwrap().max_charge(), 1 << 16);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn max_request_bytes(mut self, max: u64) -> Self {
        self.gate = self.gate.max_request_bytes(max);
        self
    }

    /// At most `cap` requests in flight per key; `key` extracts it from the request's
    /// head (a header, or an extension an authentication layer set before this one). A
    /// request for which `key` returns `None` passes the key dimension. 0 disables.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .per_key(8, |req| req.headers.get("x-tenant")?.to_str().ok().map(String::from))
    ///     .build()?
    ///     .unwrap();
    /// assert_eq!(layer.gate().keyed().unwrap().cap(), 8);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn per_key<K2, F>(self, cap: usize, key: F) -> AdmissionBuilder<K2>
    where
        K2: Hash + Eq + Clone + Send + Sync + 'static,
        F: Fn(&Parts) -> Option<K2> + Send + Sync + 'static,
    {
        AdmissionBuilder {
            gate: self.gate.with_key_type::<K2>().per_key(cap),
            key: Some(Box::new(key)),
            bypass: self.bypass,
            refusals: self.refusals,
            observer: self.observer,
            dry_run: self.dry_run,
            drain: self.drain,
        }
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
    ///     .build()?
    ///     .unwrap();
    /// assert_eq!(layer.gate().keyed().unwrap().max_keys(), 1000);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.gate = self.gate.max_keys(max_keys);
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
    ///     .build()?
    ///     .unwrap();
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
    /// let layer = AdmissionLayer::builder().count(1).retry_after(Duration::from_secs(5)).build()?.unwrap();
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
    ///     .build()?
    ///     .unwrap();
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
    ///     .build()?
    ///     .unwrap();
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
    ///     .build()?
    ///     .unwrap();
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
    /// HTTP/2 needs none of this: each request is its own stream.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .count(64)
    ///     .drain_refused(16 << 10, Duration::from_millis(200))
    ///     .build()?
    ///     .unwrap();
    /// # drop(layer);
    /// # Ok::<(), admission_core::CapacityError>(())
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
    ///     .build()?
    ///     .unwrap();
    /// # drop(layer);
    /// # Ok::<(), admission_core::CapacityError>(())
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
    /// let layer = AdmissionLayer::builder().count(1).dry_run(true).build()?.unwrap();
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

    /// The layer, or `None` when every limit is disabled: install nothing then, and the
    /// service behaves exactly as without admission.
    ///
    /// # Errors
    ///
    /// [`CapacityError`] if a limit is beyond what its ledger represents.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// assert!(AdmissionLayer::builder().count(0).build()?.is_none());
    /// assert!(AdmissionLayer::builder().count(usize::MAX).build().is_err());
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn build(self) -> Result<Option<AdmissionLayer<K>>, CapacityError> {
        let gate = match self.key {
            Some(_) => self.gate.build()?,
            // Without an extractor no request has a key: leave the dimension out.
            None => self.gate.per_key(0).build()?,
        };
        if gate.is_disabled() {
            return Ok(None);
        }
        Ok(Some(AdmissionLayer {
            shared: Arc::new(Shared {
                gate,
                key: self.key,
                bypass: self.bypass,
                refusals: self.refusals,
                observer: self.observer,
                dry_run: self.dry_run,
                drain: self.drain,
                would_shed: AtomicU64::new(0),
            }),
        }))
    }
}

impl<K> fmt::Debug for AdmissionBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionBuilder")
            .field("gate", &self.gate)
            .field("dry_run", &self.dry_run)
            .finish_non_exhaustive()
    }
}
