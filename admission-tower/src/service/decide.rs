//! What becomes of a request once admission has answered: it starts, it is refused, or
//! it goes on later, along one slow path whose steps run in order.

use admission_core::{GatePermit, Refused};
use admission_http::Refusal;

use super::pending::{Inner, Pending, RequestBody};
use super::{Admission, leased};
use crate::future::ResponseFuture;

impl<S> Admission<S> {
    /// The decision: an admitted request starts; a refused one is refused now, unless its
    /// key's lease may grow or the count's wait may take it, and then it goes on
    /// [`later`](Self::later).
    #[inline]
    pub(super) fn decide<ReqBody>(
        &mut self,
        admitted: Result<(GatePermit, u64), Refusal>,
        pending: Pending<ReqBody>,
    ) -> ResponseFuture<S::Future>
    where
        S: Inner<ReqBody>,
        ReqBody: RequestBody,
    {
        match admitted {
            Ok((permit, declared)) => self.start(pending, permit, declared),
            Err(refusal) => match self.goes_on(refusal, &pending) {
                Some(grow) => self.later(pending, refusal, grow),
                None => self.refuse(pending, refusal),
            },
        }
    }

    /// Whether a request refused with `refusal` goes on later, and if so whether its key's
    /// lease is asked to grow first: refused by its leased key, or bound to wait for a
    /// count slot with its key's lease full (the wait would end refused by the key).
    fn goes_on<ReqBody: RequestBody>(
        &self,
        refusal: Refusal,
        pending: &Pending<ReqBody>,
    ) -> Option<bool> {
        let shared = &*self.shared;
        #[cfg(feature = "tokio")]
        if self.waits(refusal, pending.priority) {
            return Some(shared.lease_full(&pending.parts));
        }
        let by_lease = refusal == Refusal::Refused(Refused::Key) && shared.leased();
        #[cfg(not(feature = "tokio"))]
        let _ = pending;
        by_lease.then_some(true)
    }

    /// The slow path, its steps in order: the key's lease asked to grow (if `grow`) and
    /// the request admitted again; a wait for a count slot, if the count is full and the
    /// layer waits; then the request starts or is refused. The inner service, ready, goes
    /// with the request into the response future (a clone takes its place here).
    #[cold]
    #[inline(never)]
    fn later<ReqBody>(
        &mut self,
        pending: Pending<ReqBody>,
        mut refusal: Refusal,
        grow: bool,
    ) -> ResponseFuture<S::Future>
    where
        S: Inner<ReqBody>,
        ReqBody: RequestBody,
    {
        let inner = self.inner.clone();
        let mut admission = Admission {
            inner: std::mem::replace(&mut self.inner, inner),
            shared: self.shared.clone(),
        };
        ResponseFuture::waiting(Box::pin(async move {
            if grow {
                let shared = admission.shared.clone();
                if !leased::grow_lease(&shared, &pending.parts).await {
                    return admission.refuse(pending, refusal);
                }
                match shared.admit(&pending.parts, pending.priority, pending.rate) {
                    Ok((permit, declared)) => return admission.start(pending, permit, declared),
                    Err(again) => refusal = again,
                }
            }
            #[cfg(feature = "tokio")]
            if admission.waits(refusal, pending.priority) {
                return admission.wait(pending).await;
            }
            admission.refuse(pending, refusal)
        }))
    }
}
