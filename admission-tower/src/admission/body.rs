//! The response body of [`Admission`](super::Admission).

use std::collections::hash_map::RandomState;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use admission_core::Key;
use admission_http::PermitBody;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::service::AdmissionPermit;

pin_project! {
    /// The response body of [`Admission`](super::Admission): the inner body holding the
    /// request's permits until it ends, the inner body of a bypassed request, or a
    /// refusal's small body.
    pub struct ResponseBody<B, K = Key, H = RandomState> {
        #[pin]
        body: PermitBody<Inner<B>, AdmissionPermit<K, H>>,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<B> {
        Body { #[pin] body: B },
        // Empty once sent (and for a refusal without a body).
        Refused { bytes: Bytes },
    }
}

impl<B, K, H> ResponseBody<B, K, H> {
    /// The service's body, holding `permit` (if any) until it ends.
    #[inline]
    pub(crate) fn new(body: B, permit: Option<AdmissionPermit<K, H>>) -> Self {
        Self {
            body: PermitBody::from_parts(Inner::Body { body }, permit),
        }
    }

    pub(crate) fn refused(bytes: Bytes) -> Self {
        Self {
            body: PermitBody::from_parts(Inner::Refused { bytes }, None),
        }
    }

    /// Whether this is a refusal's body.
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
    /// let layer = AdmissionLayer::builder().count(1).build()?;
    /// let service = layer.layer(ok);
    /// let held = service.clone().oneshot(http::Request::new(Body::default())).await?;
    /// let refused = service.oneshot(http::Request::new(Body::default())).await?;
    /// assert!(!held.body().is_refusal());
    /// assert!(refused.body().is_refusal());
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_refusal(&self) -> bool {
        matches!(self.body.get_ref(), Inner::Refused { .. })
    }

    /// Whether this body still holds its request's permits (false once it has ended,
    /// and for bypassed requests and refusals).
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    /// use http_body_util::BodyExt;
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::convert::Infallible;
    /// # type Body = http_body_util::Full<bytes::Bytes>;
    /// # let ok = tower::service_fn(|_: http::Request<admission_http::MeteredBody<Body>>| async {
    /// #     Ok::<_, Infallible>(http::Response::new(Body::default()))
    /// # });
    /// let layer = AdmissionLayer::builder().count(1).build()?;
    /// let mut response = layer.layer(ok).oneshot(http::Request::new(Body::default())).await?;
    /// assert!(response.body().holds_permit());
    /// while response.body_mut().frame().await.is_some() {}
    /// assert!(!response.body().holds_permit(), "released at the end of the body");
    /// # Ok(())
    /// # }
    /// ```
    pub fn holds_permit(&self) -> bool {
        !self.body.is_released()
    }
}

impl<B, K, H> Body for ResponseBody<B, K, H>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().body.poll_frame(cx)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B> Body for Inner<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project() {
            InnerProj::Body { body } => body.poll_frame(cx),
            InnerProj::Refused { bytes } => {
                let bytes = std::mem::take(bytes);
                Poll::Ready((!bytes.is_empty()).then(|| Ok(Frame::data(bytes.into()))))
            }
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            Inner::Body { body } => body.is_end_stream(),
            Inner::Refused { bytes } => bytes.is_empty(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match self {
            Inner::Body { body } => body.size_hint(),
            Inner::Refused { bytes } => SizeHint::with_exact(bytes.len() as u64),
        }
    }
}

impl<B, K, H> fmt::Debug for ResponseBody<B, K, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match (self.body.get_ref(), self.holds_permit()) {
            (Inner::Refused { .. }, _) => "refused",
            (Inner::Body { .. }, true) => "admitted",
            (Inner::Body { .. }, false) => "body",
        };
        f.debug_struct("ResponseBody")
            .field("kind", &kind)
            .field("holds_permit", &self.holds_permit())
            .finish()
    }
}
