//! `Admission<S>`: the gate in front of a service.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::task::{Context, Poll};

use admission_core::{Gate, GatePermit};
use admission_http::{content_length, MeteredBody, Rejection, RequestCharge};
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::drain::{self, Drain, Plan};
use super::future::{LateRefusal, ResponseFuture};
use super::layer::{AdmissionSnapshot, Shared};
use super::ResponseBody;

/// What an admitted request holds until its response body ends: the gate's permits and
/// the request's byte charge.
pub struct AdmissionPermit<K = (), H = RandomState> {
    _gate: GatePermit<K, H>,
    charge: Option<RequestCharge>,
}

impl<K, H> AdmissionPermit<K, H> {
    /// Why the request's body was refused while it streamed, if it was.
    pub(crate) fn refused(&self) -> Option<admission_core::Refused> {
        self.charge.as_ref().and_then(RequestCharge::refused)
    }

    /// Bytes charged for the request's body, if a byte budget is configured.
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// // An `AdmissionPermit` rides inside the response body; its charge is the request's.
    /// let gate = Gate::<()>::builder().bytes(100).build()?;
    /// let permit = gate.try_admit(None, 10)?;
    /// assert_eq!(permit.bytes().unwrap().charged(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charged(&self) -> Option<u64> {
        self.charge.as_ref().map(RequestCharge::charged)
    }
}

impl<K, H> fmt::Debug for AdmissionPermit<K, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionPermit")
            .field("charged", &self.charged())
            .finish_non_exhaustive()
    }
}

/// Admission control in front of a service `S`; made by [`AdmissionLayer`].
///
/// In `call` it reads the request's head, admits it through the gate or refuses it at
/// once (503, 429, 413 or 400, with `Retry-After` where retrying helps). A refused
/// request's body is never read and the inner service is never called. An admitted
/// request's permits ride in the response future and then in the response body, and are
/// released when the body ends, fails or is dropped (or when the future is dropped
/// before it resolves). `poll_ready` is the inner service's: no capacity is reserved
/// before a request is seen, so nothing queues here.
///
/// The inner service receives the request body as a [`MeteredBody`], which charges a
/// body that arrives without a `Content-Length` (or longer than it said) against the
/// byte budget, and fails it with `BodyRefused` when the budget refuses. The request is
/// then answered as refused, in place of the service's answer, unless the service had
/// already sent its response head.
///
/// [`AdmissionLayer`]: super::AdmissionLayer
pub struct Admission<S, K = (), H = RandomState> {
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
    /// let layer = AdmissionLayer::builder().count(1).build()?.unwrap();
    /// let service = layer.layer("inner");
    /// assert_eq!(*service.get_ref(), "inner");
    /// # Ok::<(), admission_core::CapacityError>(())
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
    /// let layer = AdmissionLayer::builder().count(1).build()?.unwrap();
    /// let mut service = layer.layer(1_u8);
    /// *service.get_mut() += 1;
    /// assert_eq!(*service.get_ref(), 2);
    /// # Ok::<(), admission_core::CapacityError>(())
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
    /// let layer = AdmissionLayer::builder().count(1).build()?.unwrap();
    /// assert_eq!(layer.layer("inner").into_inner(), "inner");
    /// # Ok::<(), admission_core::CapacityError>(())
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
    /// let layer = AdmissionLayer::builder().count(5).build()?.unwrap();
    /// let service = layer.layer(());
    /// assert_eq!(service.gate().count().unwrap().capacity(), 5);
    /// # Ok::<(), admission_core::CapacityError>(())
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
    /// let layer = AdmissionLayer::builder().count(5).build()?.unwrap();
    /// let service = layer.layer(());
    /// assert_eq!(service.snapshot(), layer.snapshot(), "one shared gate");
    /// # Ok::<(), admission_core::CapacityError>(())
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
    ReqBody: Body,
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

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        let (parts, body) = request.into_parts();
        if shared.bypasses(&parts) {
            let request = Request::from_parts(parts, MeteredBody::unmetered(body));
            return ResponseFuture::unguarded(self.inner.call(request));
        }
        match shared.admit(&parts) {
            Ok(mut permit) => {
                let (body, charge, late) = match permit.take_bytes() {
                    Some(bytes) => {
                        // A body that may still outgrow its charge may be refused as it
                        // streams; keep what answering that refusal takes.
                        let late = (!shared.dry_run && may_outgrow(&body, bytes.charged()))
                            .then(|| LateRefusal::new(&self.shared, &parts));
                        let charge = RequestCharge::with_refusals(bytes, &shared.refusals);
                        (MeteredBody::new(body, charge.clone()), Some(charge), late)
                    }
                    None => (MeteredBody::unmetered(body), None, None),
                };
                let future = self.inner.call(Request::from_parts(parts, body));
                ResponseFuture::admitted(
                    future,
                    AdmissionPermit {
                        _gate: permit,
                        charge,
                    },
                    late,
                )
            }
            Err(rejection) => self.refuse(parts, body, rejection),
        }
    }
}

impl<S, K, H> Admission<S, K, H> {
    /// The cold path: a refused request (or, in a dry run, one admitted over a limit).
    /// Kept out of `call` so the admit path stays small.
    #[cold]
    #[inline(never)]
    fn refuse<ReqBody>(
        &mut self,
        parts: Parts,
        body: ReqBody,
        rejection: Rejection,
    ) -> ResponseFuture<S::Future, ReqBody, K, H>
    where
        S: Service<Request<MeteredBody<ReqBody>>>,
        ReqBody: Body,
    {
        let shared = &*self.shared;
        shared.refused(&parts, rejection);
        if shared.dry_run {
            let request = Request::from_parts(parts, MeteredBody::unmetered(body));
            return ResponseFuture::unguarded(self.inner.call(request));
        }
        let mut response =
            shared
                .refusals
                .respond_to(&parts.method, &parts.uri, &parts.headers, rejection);
        let declared = content_length(&parts.headers).ok().flatten();
        let drain = match shared.drain.plan(&parts, &body, declared) {
            Plan::Answer => None,
            Plan::Drain => Some(Drain::new(body, shared.drain)),
            Plan::Close => {
                drain::close(&mut response);
                None
            }
        };
        ResponseFuture::refused(response, drain)
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
