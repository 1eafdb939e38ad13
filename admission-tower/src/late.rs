//! `LateRefusal`: what answering a request refused after it was admitted takes (a body
//! refused as it streams). Shared by the permit, which holds it, and the response
//! future, which answers with it.

use std::sync::Arc;

use admission_core::{Priority, Refused};
use admission_http::Refusal;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};

use crate::discard;
use crate::shared::Shared;

/// What answering a request whose body is refused while it streams takes: the request's
/// head, kept for the refusal (its body closure sees the method, URI and headers), and
/// the layer's configuration. Kept only for a request whose body may still be refused.
pub(crate) struct LateRefusal {
    shared: Arc<Shared>,
    /// The request's head without its extensions (which cannot be cloned).
    head: Parts,
    /// Its class, for the refusal hook.
    priority: Option<Priority>,
}

impl LateRefusal {
    pub(crate) fn new(shared: &Arc<Shared>, parts: &Parts, priority: Option<Priority>) -> Self {
        let (mut head, ()) = Request::new(()).into_parts();
        head.method = parts.method.clone();
        head.uri = parts.uri.clone();
        head.version = parts.version;
        head.headers = parts.headers.clone();
        Self {
            shared: shared.clone(),
            head,
            priority,
        }
    }

    /// Tells the hook, the snapshot and the metrics of a refusal the layer did not answer.
    #[cold]
    pub(crate) fn report(&self, refused: Refused) {
        let refusal = Refusal::Refused(refused);
        self.shared.refused(&self.head, refusal, self.priority);
    }

    /// The refusal, in place of the handler's answer to a body it could not read.
    #[cold]
    pub(crate) fn respond(self, refused: Refused) -> Response<Bytes> {
        let (head, refusal) = (&self.head, Refusal::Refused(refused));
        self.shared.refused(head, refusal, self.priority);
        let mut response = self.shared.settings.refusals.respond_to(
            &head.method,
            &head.uri,
            &head.headers,
            refusal,
        );
        // The rest of the body is unread: on HTTP/1.x this is the connection's last.
        if discard::is_http1(head.version) {
            discard::close(&mut response);
        }
        response
    }
}
