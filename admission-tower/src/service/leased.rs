//! A request its key's lease refused: the lease is asked to grow, once, and the request
//! admitted on what it then holds, or refused.

use admission_core::Priority;
use admission_http::{MeteredBody, MinDataRate};
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::Admission;
use crate::future::ResponseFuture;

impl<S> Admission<S> {
    /// Asks the key's lease for more slots (see [`crate::Leases`]) while the request holds
    /// nothing, then admits it on what the lease holds, or refuses it. The inner service,
    /// ready, goes with the request into the response future, as for a wait.
    #[cold]
    #[inline(never)]
    pub(super) fn grow_lease<ReqBody, ResBody>(
        &mut self,
        parts: Parts,
        body: ReqBody,
        priority: Option<Priority>,
        rate: Option<MinDataRate>,
    ) -> ResponseFuture<S::Future>
    where
        S: Service<Request<MeteredBody<ReqBody>>, Response = Response<ResBody>>,
        S: Clone + Send + 'static,
        S::Future: 'static,
        ReqBody: Body + Send + Unpin + 'static,
        ReqBody::Data: Send + Sync,
    {
        let leases = self
            .shared
            .keys
            .as_ref()
            .and_then(|keys| keys.leases.as_ref());
        let key = self.shared.key_of(&parts);
        let (Some(leases), Some(key)) = (leases, key) else {
            // Refused by a key, so both are there; refused as it was if not.
            let refusal = admission_http::Refusal::Refused(admission_core::Refused::Key);
            return self.refuse(parts, body, refusal, priority);
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
            let admitted = admission.shared.admit(&parts, priority, rate);
            admission.decide(admitted, parts, body, priority, rate, false)
        }))
    }
}
