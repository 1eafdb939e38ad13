//! `AdmissionBuilder`: a layer's configuration, one value per concern.

use std::fmt;

use admission_core::{Classes, Gate, Priority};
use admission_http::Refusals;
use http::request::Parts;

use crate::observe;
use crate::shared::{BypassFn, ClassifyFn, HookFn, SeatsFn};
use crate::{Adaptive, ConnectionLimits, MemoryShare, PerKey, RefusalEvent, Retries, SlowClients};

/// A layer's configuration: the limits, then one value per concern (each client's share,
/// priority classes, the refusal's shape, an adaptive limit, slow clients), each
/// optional. Methods take `self` by value; [`build`](Self::build) checks the whole.
///
/// Why this shape: every method is one concern a reader can check on its own, and a
/// concern with parts (a per-key cap with its key table's bound and its caps per tenant;
/// a refusal's delay, jitter and body) is one value, so no setter can silently undo or
/// outlive another. What the types cannot rule out, `build` refuses by name
/// ([`BuildError`](crate::BuildError)): a limit of 0 (which would refuse everything), a fixed count beside an
/// adaptive one. A builder over a shared gate ([`AdmissionLayer::from_gate`](crate::AdmissionLayer::from_gate)) has no limit
/// setters at all.
///
/// ```
/// use std::time::Duration;
/// use admission_tower::{key, AdmissionLayer, PerKey, Refusals};
///
/// let layer = AdmissionLayer::builder()
///     .count(256)                         // requests in flight: 503 above
///     .bytes(64 << 20)                    // request bytes in flight: 503 above
///     .max_request_bytes(8 << 20)         // one request's body: 413 above
///     .per_key(PerKey::new(16, key::header(http::HeaderName::from_static("x-tenant")))) // 429
///     .bypass(|req| matches!(req.uri.path(), "/" | "/health"))
///     .refusals(Refusals::new().retry_after(Duration::from_secs(2)))
///     .on_refusal(|event| eprintln!("shed {} {}", event.request.uri, event.refusal))
///     .build()?;
/// assert_eq!(layer.gate().keyed().unwrap().cap(), 16);
/// # Ok::<(), admission_tower::BuildError>(())
/// ```
///
/// Over a shared gate, the limit setters do not exist:
///
/// ```compile_fail
/// use admission_tower::{AdmissionLayer, Gate};
///
/// let gate: Gate = Gate::builder().count(64).build().unwrap();
/// let layer = AdmissionLayer::from_gate(gate).count(32); // no such method
/// ```
pub struct AdmissionBuilder<G = NewGate> {
    pub(crate) gate: G,
    pub(crate) draft: Draft,
}

/// Where a builder's gate comes from: built from its own limits
/// ([`AdmissionLayer::builder`](crate::AdmissionLayer::builder)). Only such a builder has the limit setters.
#[derive(Debug, Default)]
pub struct NewGate {
    pub(crate) count: Option<usize>,
    pub(crate) bytes: Option<u64>,
    pub(crate) memory: Option<MemoryShare>,
    pub(crate) max_request_bytes: Option<u64>,
}

/// Where a builder's gate comes from: a gate shared with other layers and interceptors
/// ([`AdmissionLayer::from_gate`](crate::AdmissionLayer::from_gate)), whose limits are its own.
#[derive(Debug)]
pub struct SharedGate(pub(crate) Gate);

/// Everything a builder holds but its gate's source, before `build` checks it: one value,
/// so that a builder can change its gate's source and keep the rest.
pub(crate) struct Draft {
    pub(crate) per_key: Option<PerKey>,
    pub(crate) fair: Option<crate::FairShare>,
    pub(crate) bypass: Option<BypassFn>,
    pub(crate) classes: Option<(Classes, ClassifyFn)>,
    pub(crate) seats: Option<SeatsFn>,
    pub(crate) retries: Option<Retries>,
    pub(crate) refusals: Refusals,
    pub(crate) hook: Option<HookFn>,
    pub(crate) dry_run: bool,
    pub(crate) report: observe::Options,
    pub(crate) adaptive: Option<Adaptive>,
    pub(crate) slow: SlowClients,
    pub(crate) connections: ConnectionLimits,
    pub(crate) memory: Option<crate::memory::Resolved>,
    #[cfg(feature = "tokio")]
    pub(crate) wait: Option<crate::Wait>,
}

impl Default for Draft {
    fn default() -> Self {
        Self {
            per_key: None,
            fair: None,
            bypass: None,
            classes: None,
            seats: None,
            retries: None,
            refusals: Refusals::new(),
            hook: None,
            dry_run: false,
            report: observe::Options::default(),
            adaptive: None,
            slow: SlowClients::default(),
            connections: ConnectionLimits::default(),
            memory: None,
            #[cfg(feature = "tokio")]
            wait: None,
        }
    }
}

impl Draft {
    /// Whether the layer will wait for a count slot.
    pub(crate) fn waits(&self) -> bool {
        #[cfg(feature = "tokio")]
        return self.wait.is_some();
        #[cfg(not(feature = "tokio"))]
        false
    }
}

impl<G> AdmissionBuilder<G> {
    pub(crate) fn new(gate: G) -> Self {
        Self {
            gate,
            draft: Draft::default(),
        }
    }

    /// The gate's source, and the rest of the configuration over `gate`.
    pub(crate) fn swap<G2>(self, gate: G2) -> (G, AdmissionBuilder<G2>) {
        let rest = AdmissionBuilder {
            gate,
            draft: self.draft,
        };
        (self.gate, rest)
    }

    /// A cap on each client's requests in flight (429 above), and how clients are told
    /// apart: see [`PerKey`].
    pub fn per_key(mut self, per_key: PerKey) -> Self {
        self.draft.per_key = Some(per_key);
        self
    }

    /// Priority classes: `classify` reads each request's head and names its class in
    /// `classes`; a class is admitted only while fewer than its share of the count
    /// capacity are in flight, so when the server must shed, the least important work
    /// goes first (see [`Classes`] on choosing shares). A class shed below the capacity is
    /// refused as [`Refused::Class`](crate::Refused::Class) (at the capacity, as
    /// `Count`): 503 + `Retry-After`, as any, and the refusal hook names the class
    /// ([`RefusalEvent::class`]).
    ///
    /// The classifier runs before admission, on every request that is not bypassed: keep
    /// it to a header or path lookup. A class taken from a request header
    /// ([`class::header`](crate::class::header)) is the client's word: trust it only from
    /// callers you trust, or derive it from what authenticates them.
    ///
    /// Classes need a count limit (a `count`, an adaptive limit or a shared gate's), and
    /// each class's share of the smallest it can be (the adaptive minimum) must be at
    /// least one request: `build` says which class falls short
    /// ([`BuildError::ClassShareRoundsToZero`](crate::BuildError::ClassShareRoundsToZero)).
    ///
    /// ```
    /// use admission_tower::{class, AdmissionLayer, Classes, Priority};
    ///
    /// let by_path = AdmissionLayer::builder()
    ///     .count(256)
    ///     .priority(Classes::standard(), |req, _| match req.uri.path() {
    ///         "/checkout" => Priority::CRITICAL,
    ///         path if path.starts_with("/prefetch") => Priority::SHEDDABLE,
    ///         _ => Priority::DEFAULT,
    ///     })
    ///     .build()?;
    /// let stated = AdmissionLayer::builder()
    ///     .count(256)
    ///     .priority(Classes::standard(), class::header(class::HEADER, Priority::DEFAULT))
    ///     .build()?;
    /// assert_eq!(stated.classes().unwrap().len(), 3);
    /// # drop(by_path);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn priority<F>(mut self, classes: Classes, classify: F) -> Self
    where
        F: Fn(&Parts, &Classes) -> Priority + Send + Sync + 'static,
    {
        self.draft.classes = Some((classes, Box::new(classify)));
        self
    }

    /// Sheds requests that say they are retries before the first attempts of their class:
    /// a retry is admitted only while fewer than its share of what its class may fill are
    /// in flight, and never waits. See [`Retries`]: how a request says it is a retry, and
    /// how the share is chosen. Without priority classes, every request is of one class
    /// that may fill the whole count.
    ///
    /// Retries need a count limit (a `count`, an adaptive limit or a shared gate's), and a
    /// retry of each class must be admitted at the smallest count the layer can have
    /// (the adaptive minimum): `build` says which class's retries would never be
    /// ([`BuildError::RetryShareRoundsToZero`](crate::BuildError::RetryShareRoundsToZero)).
    ///
    /// ```
    /// use admission_tower::{AdmissionLayer, Retries};
    ///
    /// let layer = AdmissionLayer::builder().count(256).retries(Retries::grpc()).build()?;
    /// # drop(layer);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn retries(mut self, retries: Retries) -> Self {
        self.draft.retries = Some(retries);
        self
    }

    /// Requests for which `bypass` returns true are never shed and hold no permit:
    /// liveness routes, so a load balancer does not evict an instance that is serving.
    /// Nothing is bypassed unless this is set.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .count(512)
    ///     .bypass(|req| req.uri.path() == "/health")
    ///     .build()?;
    /// # drop(layer);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn bypass<F>(mut self, bypass: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.draft.bypass = Some(Box::new(bypass));
        self
    }

    /// The shape of refusals, as one value: `Retry-After` and its jitter, the body (or
    /// the whole response, as gRPC's trailers-only refusal), the error a refused request
    /// body fails with, and how much of a refused body is discarded to keep an HTTP/1.1
    /// connection. See [`Refusals`]; `admission-grpc` makes gRPC's.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_tower::{AdmissionLayer, RefusalBody, Refusals};
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .count(64)
    ///     .refusals(
    ///         Refusals::new()
    ///             .retry_after(Duration::from_secs(1))
    ///             .retry_jitter(Duration::from_secs(2)) // Retry-After: 1, 2 or 3
    ///             .body(|cx| RefusalBody::json(format!(r#"{{"status":{}}}"#, cx.status.as_u16()))),
    ///     )
    ///     .build()?;
    /// # drop(layer);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn refusals(mut self, refusals: Refusals) -> Self {
        self.draft.refusals = refusals;
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
    ///
    /// let shed = Arc::new(AtomicU64::new(0));
    /// let counter = shed.clone();
    /// let layer = AdmissionLayer::builder()
    ///     .count(64)
    ///     .on_refusal(move |_event| { counter.fetch_add(1, Ordering::Relaxed); })
    ///     .build()?;
    /// # drop(layer);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn on_refusal<F>(mut self, hook: F) -> Self
    where
        F: Fn(&RefusalEvent<'_>) + Send + Sync + 'static,
    {
        self.draft.hook = Some(Box::new(hook));
        self
    }

    /// Dry run: count and report what would be shed (the hook, metrics and
    /// [`AdmissionSnapshot::would_shed`](crate::AdmissionSnapshot::would_shed)) but admit
    /// it, for rolling out a limit safely. Requests admitted over a limit this way hold
    /// no permit.
    pub fn dry_run(mut self, enabled: bool) -> Self {
        self.draft.dry_run = enabled;
        self
    }

    /// Lets an adaptive limit set the count limit: it raises the limit while the server
    /// keeps up and lowers it when latency (or failure) says the server queues, within
    /// its bounds. In place of [`count`](AdmissionBuilder::count) (both is a
    /// [`BuildError::CountAndAdaptive`](crate::BuildError::CountAndAdaptive)); on a shared gate it drives that gate's count.
    /// Takes an [`Adaptive`], or the core's `AdaptiveBuilder` (sampled at the head).
    ///
    /// Each admitted request is one sample: its latency from admission to the response
    /// head (or body end, [`SampleAt`](crate::SampleAt)) and its outcome (a 5xx, a gRPC
    /// `RESOURCE_EXHAUSTED`, `UNAVAILABLE` or `DEADLINE_EXCEEDED` in a trailers-only
    /// response, or an error from the service is an overload; a request whose response
    /// future is dropped before its head is dropped). [`close`](crate::AdmissionLayer::close) and
    /// [`drain`](crate::AdmissionLayer::drain) override it; a count set by hand holds until
    /// handed back ([`AdmissionLayer::adaptive`](crate::AdmissionLayer::adaptive)).
    ///
    /// ```
    /// use admission_tower::adaptive::{AdaptiveLimit, Gradient};
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .adaptive(AdaptiveLimit::builder(Gradient::default()).bounds(8, 2_000).initial(32))
    ///     .build()?;
    /// assert_eq!(layer.snapshot().gate.count.capacity, Some(32));
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn adaptive(mut self, limit: impl Into<Adaptive>) -> Self {
        self.draft.adaptive = Some(limit.into());
        self
    }

    /// Lets a request that finds the count full wait for a slot, bounded, instead of being
    /// refused at once (off by default): see [`Wait`](crate::Wait). For traffic that comes
    /// in bursts, where a few milliseconds of waiting use capacity that shedding at once
    /// would waste; under sustained overload it still sheds (beyond `max_waiting`, and
    /// once the queue stands, newest first, no waiter past 5 ms while newer requests
    /// come). The timer is tokio's. It needs a count limit to wait for, and room for a
    /// waiter for some time: `build` refuses it otherwise
    /// ([`BuildError::WaitWithoutCount`](crate::BuildError::WaitWithoutCount),
    /// [`BuildError::EmptyWait`](crate::BuildError::EmptyWait)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_tower::{AdmissionLayer, Wait};
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .count(16)
    ///     .wait(Wait::new(64, Duration::from_millis(50)))
    ///     .build()?;
    /// assert_eq!(layer.gate().count().max_waiting(), 64);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn wait(mut self, wait: crate::Wait) -> Self {
        self.draft.wait = Some(wait);
        self
    }

    /// What the layer does about slow clients (on by default): see [`SlowClients`].
    ///
    /// ```
    /// use admission_tower::{AdmissionLayer, SlowClients};
    ///
    /// let layer = AdmissionLayer::builder().bytes(1 << 20).slow_clients(SlowClients::off()).build()?;
    /// assert_eq!(layer.slow_clients(), SlowClients::off());
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn slow_clients(mut self, policy: SlowClients) -> Self {
        self.draft.slow = policy;
        self
    }

    /// What a connection may hold, and for how long (safe by default): see
    /// [`ConnectionLimits`], held by the layer's `serve` (feature `serve`) and `guard`
    /// (feature `axum`).
    ///
    /// ```
    /// use admission_tower::{AdmissionLayer, ConnectionLimits};
    ///
    /// let limits = ConnectionLimits::default().with_max_connections(Some(10_000));
    /// let layer = AdmissionLayer::builder().count(512).connection_limits(limits).build()?;
    /// assert_eq!(layer.connection_limits(), limits);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn connection_limits(mut self, limits: ConnectionLimits) -> Self {
        self.draft.connections = limits;
        self
    }

    /// The layer's name where it reports: the `name` label of its metrics (feature
    /// `metrics`) and the `name` field of its events (feature `tracing`). Default:
    /// `admission`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.draft.report.name = name.into();
        self
    }

    /// Whether this layer records metrics (default: yes, every layer does once the
    /// feature is on).
    ///
    /// The layer registers its series with the recorder installed when
    /// [`build`](AdmissionBuilder::build) runs: **install the recorder first**. One
    /// installed after the layer is built receives nothing from it (the `metrics` facade
    /// cannot tell a library which recorder is coming), and its `render` stays empty.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics(mut self, enabled: bool) -> Self {
        self.draft.report.metrics = enabled;
        self
    }
}

impl<G: fmt::Debug> fmt::Debug for AdmissionBuilder<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionBuilder")
            .field("gate", &self.gate)
            .field("per_key", &self.draft.per_key)
            .field("refusals", &self.draft.refusals)
            .field("dry_run", &self.draft.dry_run)
            .field("adaptive", &self.draft.adaptive)
            .field("slow_clients", &self.draft.slow)
            .field("connections", &self.draft.connections)
            .finish_non_exhaustive()
    }
}
