//! `Admission<S>`: the gate in front of a service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use admission_core::{Gate, Refused};
use admission_http::{MeteredBody, Refusal, RequestCharge, content_length};
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use crate::discard::{self, Discard, Plan};
use crate::future::ResponseFuture;
use crate::late::LateRefusal;
use crate::pacer::{Pacing, served_stream};
use crate::permit::{AdmissionPermit, Sample};
use crate::shared::Shared;
use crate::{AdmissionSnapshot, ResponseBody};
use pending::{Inner, Pending, RequestBody};

mod decide;
mod leased;
mod pending;
#[cfg(feature = "tokio")]
mod waiting;

/// Admission control in front of a service `S`; made by [`AdmissionLayer`].
///
/// In `call` it reads the request's head, admits it through the gate or refuses it at
/// once (503, 429, 413 or 400, with `Retry-After` where retrying helps); with a
/// [`Wait`](crate::Wait), a request that finds the count full may instead wait for a
/// slot, and the inner service, ready, goes with it into the response future (a clone
/// takes its place, which is why `S` must be `Clone`), to be called once it is admitted.
/// A refused request's body is never read and the inner service is never called. An
/// admitted request's permits ride in the response future and then in the response body,
/// released when the body ends, fails or is dropped (or the future before it resolves).
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
/// [`AdmissionLayer`]: crate::AdmissionLayer
pub struct Admission<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Admission<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
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
    pub fn gate(&self) -> &Gate {
        &self.shared.settings.gate
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

impl<S: Clone> Clone for Admission<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

// (The bounds spelled out, not as `Inner` and `RequestBody`: users read them here.)
impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Admission<S>
where
    S: Service<Request<MeteredBody<ReqBody>>, Response = Response<ResBody>>,
    S: Clone + Send + 'static,
    S::Future: 'static,
    ReqBody: Body + Send + Unpin + 'static,
    ReqBody::Data: Send + Sync,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline(always)]
    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        if shared.path.untracked && shared.settings.gate.count().admits_all() {
            // No limit, nothing to count: the request passes through.
            return ResponseFuture::unguarded(self.inner.call(request.map(MeteredBody::unmetered)));
        }
        if shared.path.count_only && request.body().is_end_stream() {
            // The count alone decides: nothing of the head to read, no body to time or
            // watch, and the request is passed on whole.
            let count = shared.settings.gate.count();
            let acquired = if shared.path.waits_first {
                count.try_acquire_before_wait(None)
            } else {
                count.try_acquire()
            };
            return match acquired {
                Ok(count) => {
                    let served = served_stream(request.extensions());
                    let timer = shared
                        .settings
                        .observer
                        .admitted(&shared.settings.gate, None);
                    let sample = Sample::start(shared.settings.sample_at);
                    ResponseFuture::admitted(
                        self.inner.call(request.map(MeteredBody::unmetered)),
                        AdmissionPermit::new(count, None, None, None, timer, sample, None)
                            .paced(shared.settings.pacer.as_ref().map(Pacing::id), served),
                    )
                }
                Err(refused) => {
                    self.decide(Err(Refusal::Refused(refused)), Pending::unread(request))
                }
            };
        }
        self.call_with_head(request)
    }
}

impl<S> Admission<S> {
    /// Admission that reads the head: a bypass, a key, a declared length, a dry run.
    /// Out of line, so that `call` stays small for the paths that read nothing.
    #[inline(never)]
    fn call_with_head<ReqBody>(&mut self, request: Request<ReqBody>) -> ResponseFuture<S::Future>
    where
        S: Inner<ReqBody>,
        ReqBody: RequestBody,
    {
        let shared = &*self.shared;
        let (parts, body) = request.into_parts();
        if shared.bypasses(&parts) {
            let request = Request::from_parts(parts, MeteredBody::unmetered(body));
            return ResponseFuture::unguarded(self.inner.call(request));
        }
        let priority = shared.classify(&parts);
        // A body is timed if the policy says so and there is one (never in a dry run).
        let rate = if shared.settings.dry_run || body.is_end_stream() {
            None
        } else {
            shared.settings.slow.body_rate_for(&parts)
        };
        let admitted = shared.admit(&parts, priority, rate);
        let pending = Pending {
            parts,
            body,
            read: None,
            priority,
            rate,
        };
        self.decide(admitted, pending)
    }

    /// An admitted request, on its way to the inner service: its body metered (and timed)
    /// as the policy says, given first what was `read` of it while it waited, and kept if
    /// the handler drops it unfinished (so that a client who goes is seen); its permits in
    /// the response future.
    fn start<ReqBody>(
        &mut self,
        pending: Pending<ReqBody>,
        permit: admission_core::GatePermit,
        declared: u64,
    ) -> ResponseFuture<S::Future>
    where
        S: Service<Request<MeteredBody<ReqBody>>>,
        ReqBody: RequestBody,
    {
        let Pending {
            parts,
            body,
            read,
            priority,
            rate,
        } = pending;
        let shared = &*self.shared;
        let served = served_stream(&parts.extensions);
        let mut permit = permit;
        let seats = permit.take_seats();
        let (count, bytes, keyed) = permit.into_parts();
        let (body, charge, late) = match (bytes, rate) {
            (Some(bytes), _) => {
                // A body that may still outgrow its charge, or be cut for its pace,
                // may be refused as it streams; keep what answering that takes.
                let late = (!shared.settings.dry_run
                    && (rate.is_some() || may_outgrow(&body, bytes.charged())))
                .then(|| LateRefusal::new(&self.shared, &parts, priority));
                let charge = RequestCharge::with_refusals(bytes, &shared.settings.refusals);
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
                let charge = RequestCharge::unmetered(&shared.settings.refusals);
                let body = MeteredBody::new(body, charge.clone())
                    .paced(rate, None)
                    .keep_unread();
                (body, Some(charge), Some(late))
            }
            // Neither metered nor timed: a body still to come is kept if the handler drops
            // it unfinished, and read on, so that a client who goes is seen.
            (None, None) if !shared.settings.dry_run && !body.is_end_stream() => {
                let charge = RequestCharge::unmetered(&shared.settings.refusals);
                let body = MeteredBody::new(body, charge.clone()).keep_unread();
                (body, Some(charge), None)
            }
            (None, None) => (MeteredBody::unmetered(body), None, None),
        };
        let body = match read {
            Some(read) => body.replay(read),
            None => body,
        };
        let timer = shared
            .settings
            .observer
            .admitted(&shared.settings.gate, priority);
        let sample = Sample::start(shared.settings.sample_at);
        let future = self.inner.call(Request::from_parts(parts, body));
        let watch = charge.is_some().then(|| self.shared.clone());
        let permit = AdmissionPermit::new(count, keyed, charge, late, timer, sample, watch)
            .seated(seats)
            .paced(shared.settings.pacer.as_ref().map(Pacing::id), served);
        ResponseFuture::admitted(future, permit)
    }

    /// The cold path: a refused request (or, in a dry run, one admitted over a limit).
    /// Kept out of `call` so the admit path stays small.
    #[cold]
    #[inline(never)]
    fn refuse<ReqBody>(
        &mut self,
        pending: Pending<ReqBody>,
        refusal: Refusal,
    ) -> ResponseFuture<S::Future>
    where
        S: Service<Request<MeteredBody<ReqBody>>>,
        ReqBody: Body + Send + 'static,
    {
        self.refuse_after(pending, refusal, std::time::Duration::ZERO)
    }

    /// [`refuse`](Self::refuse), after the request waited `waited` for a count slot.
    #[cold]
    #[inline(never)]
    fn refuse_after<ReqBody>(
        &mut self,
        pending: Pending<ReqBody>,
        refusal: Refusal,
        waited: std::time::Duration,
    ) -> ResponseFuture<S::Future>
    where
        S: Service<Request<MeteredBody<ReqBody>>>,
        ReqBody: Body + Send + 'static,
    {
        let Pending {
            parts,
            body,
            priority,
            ..
        } = pending;
        let shared = &*self.shared;
        shared.refused_after(&parts, refusal, priority, waited);
        if shared.settings.dry_run {
            let request = Request::from_parts(parts, MeteredBody::unmetered(body));
            return ResponseFuture::unguarded(self.inner.call(request));
        }
        let mut response =
            shared
                .settings
                .refusals
                .respond_to(&parts.method, &parts.uri, &parts.headers, refusal);
        let declared = content_length(&parts.headers).ok().flatten();
        let closed = refusal == Refusal::Refused(Refused::Closed);
        let discard = match discard::plan(
            &shared.settings.refusals.discard_limits(),
            &parts,
            &body,
            declared,
            closed,
        ) {
            Plan::Answer => None,
            Plan::Discard => Some(Discard::new(
                body,
                shared.settings.refusals.discard_limits(),
            )),
            Plan::Close => {
                discard::close(&mut response);
                None
            }
        };
        ResponseFuture::refused(response, discard, discard::is_http1(parts.version))
    }
}

/// Whether `body` may carry more than the `charged` bytes its request declared: then the
/// meter may refuse it as it streams. (A server that enforces `Content-Length`, as hyper
/// does, reports its exact size: such a body never outgrows its charge.)
fn may_outgrow<B: Body>(body: &B, charged: u64) -> bool {
    !body.is_end_stream() && body.size_hint().upper().is_none_or(|upper| upper > charged)
}

impl<S: fmt::Debug> fmt::Debug for Admission<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("inner", &self.inner)
            .field("snapshot", &self.snapshot())
            .finish()
    }
}
