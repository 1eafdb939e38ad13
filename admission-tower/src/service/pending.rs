//! A request on its way through admission, and what the layer asks of the service it
//! wraps and of a request body, named once.

use admission_core::Priority;
use admission_http::{MeteredBody, MinDataRate, ReadFrames};
use http::Request;
use http::request::Parts;
use http_body::Body;
use tower_service::Service;

/// A request on its way through admission: its head and body, its class, the pace its
/// body must keep, and what was read of the body while it waited. Each step of the
/// decision (`decide`, the wait, the lease, `start` or `refuse`) takes it whole.
pub(super) struct Pending<B: Body> {
    pub(super) parts: Parts,
    pub(super) body: B,
    pub(super) read: Option<ReadFrames<B>>,
    pub(super) priority: Option<Priority>,
    pub(super) rate: Option<MinDataRate>,
}

impl<B: Body> Pending<B> {
    /// A request whose head was not read: no class, no pace, nothing read ahead.
    pub(super) fn unread(request: Request<B>) -> Self {
        let (parts, body) = request.into_parts();
        Self {
            parts,
            body,
            read: None,
            priority: None,
            rate: None,
        }
    }
}

/// What the layer asks of the service it wraps: called with a metered request body,
/// cloned to go with a request that waits, its future kept in the layer's own.
pub(super) trait Inner<B>:
    Service<Request<MeteredBody<B>>, Future: 'static> + Clone + Send + 'static
{
}

impl<S, B> Inner<B> for S where
    S: Service<Request<MeteredBody<B>>, Future: 'static> + Clone + Send + 'static
{
}

/// What the layer asks of a request body: read ahead while its request waits, and
/// discarded on another task once refused.
pub(super) trait RequestBody: Body<Data: Send + Sync> + Send + Unpin + 'static {}

impl<B> RequestBody for B where B: Body<Data: Send + Sync> + Send + Unpin + 'static {}
