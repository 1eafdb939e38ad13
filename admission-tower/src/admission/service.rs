//! `Admission<S>`: the gate in front of a service.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use admission_core::adaptive::Outcome;
use admission_core::{CountPermit, Gate, Key, KeyedPermit, Priority, Refused};
use admission_http::{content_length, MeteredBody, Rejection, RequestCharge};
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, Request, Response};
use http_body::Body;
use tower_service::Service;

use super::drain::{self, Drain, Plan};
use super::future::{LateRefusal, ResponseFuture};
use super::layer::{AdmissionSnapshot, SampleAt, Shared};
use super::observe::Timer;
use super::ResponseBody;

/// What an admitted request holds until its response body ends: its count permit, and
/// its key's permit, body charge and adaptive sample where the layer has those. Two
/// words: the response future and body that carry it are moved at every step, and the
/// common request (count only) should not pay for the rare ones.
pub(crate) struct AdmissionPermit<K = Key, H = RandomState> {
    held: Held<K, H>,
    /// The hold time's start, with the `metrics` feature (else nothing at all).
    _timer: Timer,
}

enum Held<K, H> {
    /// The count permit alone.
    Count { _permit: CountPermit },
    /// The count permit and the rest.
    Rest(Box<Rest<K, H>>),
    /// Released (in `drop`).
    Released,
}

impl<K, H> Drop for AdmissionPermit<K, H> {
    #[inline]
    fn drop(&mut self) {
        release(std::mem::replace(&mut self.held, Held::Released));
    }
}

/// Releases what a permit held. Out of line: the bodies and futures that carry a permit
/// are dropped on every request, and their drop stays small enough to be inlined where a
/// request holds none.
#[inline(never)]
fn release<K, H>(held: Held<K, H>) {
    drop(held);
}

/// The count permit with the key's permit, the body's charge or the adaptive sample, for
/// a request that has any; and, for a body that may be refused as it streams, what
/// answering that refusal takes.
struct Rest<K, H> {
    count: CountPermit,
    _keyed: Option<KeyedPermit<K, H>>,
    charge: Option<RequestCharge>,
    /// Boxed: the request head it keeps is large, and rare (see `may_outgrow`); the rest
    /// is moved into its box on every request that has any of it.
    late: Option<Box<LateRefusal<K, H>>>,
    /// The adaptive limit's sample, while it is still to be recorded.
    sample: Option<Sample>,
}

impl<K, H> Drop for Rest<K, H> {
    fn drop(&mut self) {
        // Before the count permit goes: the sample is recorded through it.
        self.record();
        // A body cut for its pace after the service answered: the layer did not answer
        // it, but the hook, the snapshot and the metrics still hear of it.
        if let (Some(charge), Some(late)) = (&self.charge, &self.late) {
            if charge.refused() == Some(Refused::TooSlow) {
                late.report(Refused::TooSlow);
            }
        }
    }
}

impl<K, H> Rest<K, H> {
    fn record(&mut self) {
        if let Some(sample) = self.sample.take() {
            self.count.record(sample.admitted.elapsed(), sample.outcome);
        }
    }
}

/// An adaptive limit's sample of one request: since when, how it ended as far as is known
/// (`Dropped` until the response head), and where it ends.
pub(crate) struct Sample {
    admitted: Instant,
    outcome: Outcome,
    at: SampleAt,
}

impl Sample {
    #[inline]
    pub(crate) fn start(at: Option<SampleAt>) -> Option<Self> {
        at.map(|at| Sample {
            admitted: Instant::now(),
            outcome: Outcome::Dropped,
            at,
        })
    }
}

impl<K, H> AdmissionPermit<K, H> {
    #[inline]
    fn new(
        count: CountPermit,
        keyed: Option<KeyedPermit<K, H>>,
        charge: Option<RequestCharge>,
        late: Option<LateRefusal<K, H>>,
        timer: Timer,
        sample: Option<Sample>,
    ) -> Self {
        let held = if keyed.is_some() || charge.is_some() || sample.is_some() {
            Held::Rest(Box::new(Rest {
                count,
                _keyed: keyed,
                charge,
                late: late.map(Box::new),
                sample,
            }))
        } else {
            Held::Count { _permit: count }
        };
        Self {
            held,
            _timer: timer,
        }
    }

    /// If the request's body was refused while it streamed (and the layer answers such
    /// refusals): the refusal, and what answering it takes. The caller drops the
    /// handler's answer, then this permit, then answers.
    #[inline]
    pub(crate) fn take_late_refusal(&mut self) -> Option<(Refused, Box<LateRefusal<K, H>>)> {
        let Held::Rest(rest) = &mut self.held else {
            return None;
        };
        let refused = rest.charge.as_ref().and_then(RequestCharge::refused)?;
        let late = rest.late.take()?;
        // Refused by the layer itself, mid-request: not the service's latency.
        rest.sample = None;
        Some((refused, late))
    }

    /// The response head is here: its outcome, and its sample if sampled at the head.
    #[inline]
    pub(crate) fn head<B>(&mut self, response: &Response<B>) {
        if let Held::Rest(rest) = &mut self.held {
            if let Some(sample) = &mut rest.sample {
                sample.outcome = outcome(response);
                if sample.at == SampleAt::Head {
                    rest.record();
                }
            }
        }
    }

    /// The request's body charge, if it has one.
    #[inline]
    pub(crate) fn charge(&self) -> Option<&RequestCharge> {
        match &self.held {
            Held::Rest(rest) => rest.charge.as_ref(),
            _ => None,
        }
    }

    /// The service failed the request: an overload.
    pub(crate) fn failed(&mut self) {
        if let Held::Rest(rest) = &mut self.held {
            if let Some(sample) = &mut rest.sample {
                sample.outcome = Outcome::Overload;
            }
        }
    }
}

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// How a response head reports the request, for the adaptive limit: a 5xx, or a gRPC
/// status of overload (`RESOURCE_EXHAUSTED`, `UNAVAILABLE`, `DEADLINE_EXCEEDED`) in a
/// trailers-only response, is an overload.
fn outcome<B>(response: &Response<B>) -> Outcome {
    let grpc_overload = || {
        response
            .headers()
            .get(&GRPC_STATUS)
            .is_some_and(|status| matches!(status.as_bytes(), b"4" | b"8" | b"14"))
    };
    if response.status().is_server_error() || grpc_overload() {
        Outcome::Overload
    } else {
        Outcome::Success
    }
}

/// Admission control in front of a service `S`; made by [`AdmissionLayer`].
///
/// In `call` it reads the request's head, admits it through the gate or refuses it at
/// once (503, 429, 413 or 400, with `Retry-After` where retrying helps). A refused
/// request's body is never read and the inner service is never called. An admitted
/// request's permits ride in the response future and then in the response body, and are
/// released when the body ends, fails or is dropped (or when the future is dropped
/// before it resolves).
///
/// The inner service receives the request body as a [`MeteredBody`], which charges a
/// body that arrives without a `Content-Length` (or longer than it said) against the
/// byte budget, and fails it with `BodyRefused` when the budget refuses. The request is
/// then answered as refused, in place of the service's answer, unless the service had
/// already sent its response head. Without a byte dimension the body passes through
/// unmetered.
///
/// # When the inner service is not ready
///
/// `poll_ready` is the inner service's, as tower middleware does: no capacity is
/// reserved before a request is seen, so a ready inner service never makes anything wait
/// here. An inner service that is *not* ready (a `ConcurrencyLimit`, a `Buffer` that is
/// full, a client pool at its bound) makes the connection wait in `poll_ready`, and the
/// requests behind it wait in the server, outside any limit of this layer. To shed them
/// instead, put tower's `LoadShed` between the two, one line:
///
/// ```
/// use admission_tower::AdmissionLayer;
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # type Body = http_body_util::Full<bytes::Bytes>;
/// # let handler = tower::service_fn(|_: http::Request<admission_http::MeteredBody<Body>>| async {
/// #     Ok::<_, std::convert::Infallible>(http::Response::new(Body::default()))
/// # });
/// let service = ServiceBuilder::new()
///     .layer(AdmissionLayer::builder().count(64).build()?)
///     .load_shed()             // an inner service that is not ready: refuse, don't wait
///     .concurrency_limit(0)    // (an inner service that is never ready, for the example)
///     .service(handler);
/// let error = service.oneshot(http::Request::new(Body::default())).await.unwrap_err();
/// assert!(error.is::<tower::load_shed::error::Overloaded>());
/// # Ok(())
/// # }
/// ```
///
/// The error is then tower's `Overloaded`; with axum, `HandleErrorLayer` turns it into a
/// 503.
///
/// [`AdmissionLayer`]: super::AdmissionLayer
pub struct Admission<S, K = Key, H = RandomState> {
    inner: S,
    shared: Arc<Shared<K, H>>,
}

impl<S, K, H> Admission<S, K, H> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<K, H>>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    /// use tower::Layer;
    ///
    /// let layer = AdmissionLayer::builder().count(1).build()?;
    /// let service = layer.layer("inner");
    /// assert_eq!(*service.get_ref(), "inner");
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    /// use tower::Layer;
    ///
    /// let layer = AdmissionLayer::builder().count(1).build()?;
    /// let mut service = layer.layer(1_u8);
    /// *service.get_mut() += 1;
    /// assert_eq!(*service.get_ref(), 2);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service; the gate stays with the layer and its other services.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    /// use tower::Layer;
    ///
    /// let layer = AdmissionLayer::builder().count(1).build()?;
    /// assert_eq!(layer.layer("inner").into_inner(), "inner");
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The gate, shared with the layer and every other service it made.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    /// use tower::Layer;
    ///
    /// let layer = AdmissionLayer::builder().count(5).build()?;
    /// let service = layer.layer(());
    /// assert_eq!(service.gate().count().capacity(), 5);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn gate(&self) -> &Gate<K, H> {
        &self.shared.gate
    }

    /// A cheap reading of the gate and the dry-run count.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    /// use tower::Layer;
    ///
    /// let layer = AdmissionLayer::builder().count(5).build()?;
    /// let service = layer.layer(());
    /// assert_eq!(service.snapshot(), layer.snapshot(), "one shared gate");
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn snapshot(&self) -> AdmissionSnapshot {
        self.shared.snapshot()
    }
}

impl<S: Clone, K, H> Clone for Admission<S, K, H> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S, K, H, ReqBody, ResBody> Service<Request<ReqBody>> for Admission<S, K, H>
where
    S: Service<Request<MeteredBody<ReqBody>>, Response = Response<ResBody>>,
    ReqBody: Body + Send + Unpin + 'static,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
    K: Hash + Eq + Clone,
    H: BuildHasher,
{
    type Response = Response<ResponseBody<ResBody, K, H>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ReqBody, K, H>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        if shared.untracked && shared.gate.count().admits_all() {
            // No limit, nothing to count: the request passes through.
            return ResponseFuture::unguarded(self.inner.call(request.map(MeteredBody::unmetered)));
        }
        if shared.count_only
            && (shared.slow.min_body_rate().is_none() || request.body().is_end_stream())
        {
            // The count alone decides: nothing of the head to read, no body to time, and
            // the request is passed on whole.
            return match shared.gate.count().try_acquire() {
                Ok(count) => {
                    let timer = shared.observer.admitted(&shared.gate, None);
                    let sample = Sample::start(shared.sample_at);
                    ResponseFuture::admitted(
                        self.inner.call(request.map(MeteredBody::unmetered)),
                        AdmissionPermit::new(count, None, None, None, timer, sample),
                    )
                }
                Err(refused) => {
                    let (parts, body) = request.into_parts();
                    self.refuse(parts, body, Rejection::Refused(refused), None)
                }
            };
        }
        self.call_with_head(request)
    }
}

impl<S, K, H> Admission<S, K, H> {
    /// Admission that reads the head: a bypass, a key, a declared length, a dry run.
    /// Out of line, so that `call` stays small for the paths that read nothing.
    #[inline(never)]
    fn call_with_head<ReqBody, ResBody>(
        &mut self,
        request: Request<ReqBody>,
    ) -> ResponseFuture<S::Future, ReqBody, K, H>
    where
        S: Service<Request<MeteredBody<ReqBody>>, Response = Response<ResBody>>,
        ReqBody: Body + Send + Unpin + 'static,
        K: Hash + Eq + Clone,
        H: BuildHasher,
    {
        let shared = &*self.shared;
        let (parts, body) = request.into_parts();
        if shared.bypasses(&parts) {
            let request = Request::from_parts(parts, MeteredBody::unmetered(body));
            return ResponseFuture::unguarded(self.inner.call(request));
        }
        let priority = shared.classify(&parts);
        // A body is timed if the policy says so and there is one (never in a dry run).
        let rate = if shared.dry_run || body.is_end_stream() {
            None
        } else {
            shared.slow.body_rate_for(&parts)
        };
        match shared.admit(&parts, priority, rate) {
            Ok((permit, declared)) => {
                let (count, bytes, keyed) = permit.into_parts();
                let (body, charge, late) = match (bytes, rate) {
                    (Some(bytes), _) => {
                        // A body that may still outgrow its charge, or be cut for its pace,
                        // may be refused as it streams; keep what answering that takes.
                        let late = (!shared.dry_run
                            && (rate.is_some() || may_outgrow(&body, bytes.charged())))
                        .then(|| LateRefusal::new(&self.shared, &parts, priority));
                        let charge = RequestCharge::with_refusals(bytes, &shared.refusals);
                        let body = MeteredBody::new(body, charge.clone()).keep_unread();
                        let body = match rate {
                            Some(rate) => body.paced(rate, Some(declared).filter(|&n| n > 0)),
                            None => body,
                        };
                        (body, Some(charge), late)
                    }
                    // Timed, with no byte budget: a charge of nothing that records a cut.
                    (None, Some(rate)) => {
                        let late = LateRefusal::new(&self.shared, &parts, priority);
                        let charge = RequestCharge::unmetered(&shared.refusals);
                        let body = MeteredBody::new(body, charge.clone())
                            .paced(rate, None)
                            .keep_unread();
                        (body, Some(charge), Some(late))
                    }
                    (None, None) => (MeteredBody::unmetered(body), None, None),
                };
                let timer = shared.observer.admitted(&shared.gate, priority);
                let sample = Sample::start(shared.sample_at);
                let future = self.inner.call(Request::from_parts(parts, body));
                let permit = AdmissionPermit::new(count, keyed, charge, late, timer, sample);
                ResponseFuture::admitted(future, permit)
            }
            Err(rejection) => self.refuse(parts, body, rejection, priority),
        }
    }

    /// The cold path: a refused request (or, in a dry run, one admitted over a limit).
    /// Kept out of `call` so the admit path stays small.
    #[cold]
    #[inline(never)]
    fn refuse<ReqBody>(
        &mut self,
        parts: Parts,
        body: ReqBody,
        rejection: Rejection,
        priority: Option<Priority>,
    ) -> ResponseFuture<S::Future, ReqBody, K, H>
    where
        S: Service<Request<MeteredBody<ReqBody>>>,
        ReqBody: Body,
    {
        let shared = &*self.shared;
        shared.refused(&parts, rejection, priority);
        if shared.dry_run {
            let request = Request::from_parts(parts, MeteredBody::unmetered(body));
            return ResponseFuture::unguarded(self.inner.call(request));
        }
        let mut response =
            shared
                .refusals
                .respond_to(&parts.method, &parts.uri, &parts.headers, rejection);
        let declared = content_length(&parts.headers).ok().flatten();
        let closed = rejection == Rejection::Refused(Refused::Closed);
        let drain = match shared.drain.plan(&parts, &body, declared, closed) {
            Plan::Answer => None,
            Plan::Drain => Some(Drain::new(body, shared.drain)),
            Plan::Close => {
                drain::close(&mut response);
                None
            }
        };
        ResponseFuture::refused(response, drain, drain::is_http1(parts.version))
    }
}

/// Whether `body` may carry more than the `charged` bytes its request declared: then the
/// meter may refuse it as it streams. (A server that enforces `Content-Length`, as hyper
/// does, reports its exact size: such a body never outgrows its charge.)
fn may_outgrow<B: Body>(body: &B, charged: u64) -> bool {
    !body.is_end_stream() && body.size_hint().upper().is_none_or(|upper| upper > charged)
}

impl<S: fmt::Debug, K, H> fmt::Debug for Admission<S, K, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("inner", &self.inner)
            .field("snapshot", &self.snapshot())
            .finish()
    }
}
