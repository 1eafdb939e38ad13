//! A request its key's lease refused: the lease is asked to grow, once, and the request
//! admitted on what it then holds, or refused.

use super::Admission;
use super::pending::{Inner, Pending, RequestBody};
use crate::future::ResponseFuture;

impl<S> Admission<S> {
    /// Asks the key's lease for more slots (see [`crate::Leases`]) while the request holds
    /// nothing, then admits it on what the lease holds, or refuses it. The inner service,
    /// ready, goes with the request into the response future, as for a wait.
    #[cold]
    #[inline(never)]
    pub(super) fn grow_lease<ReqBody>(
        &mut self,
        pending: Pending<ReqBody>,
    ) -> ResponseFuture<S::Future>
    where
        S: Inner<ReqBody>,
        ReqBody: RequestBody,
    {
        let leases = self
            .shared
            .keys
            .as_ref()
            .and_then(|keys| keys.leases.as_ref());
        let key = self.shared.key_of(&pending.parts);
        let (Some(leases), Some(key)) = (leases, key) else {
            // Refused by a key, so both are there; refused as it was if not.
            let refusal = admission_http::Refusal::Refused(admission_core::Refused::Key);
            return self.refuse(pending, refusal);
        };
        let grow = leases.grow(&key);
        let inner = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, inner);
        let mut admission = Admission {
            inner: ready,
            shared: self.shared.clone(),
        };
        ResponseFuture::waiting(Box::pin(async move {
            grow.await;
            let admitted = admission
                .shared
                .admit(&pending.parts, pending.priority, pending.rate);
            admission.decide(admitted, pending, false)
        }))
    }
}
