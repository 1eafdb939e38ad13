//! The response body of [`Admission`](crate::Admission).

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use admission_http::PermitBody;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::permit::AdmissionPermit;

pin_project! {
    /// The response body of [`Admission`](crate::Admission): the inner body holding the
    /// request's permits until it ends, the inner body of a bypassed request, or a
    /// refusal's small body.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        // Holding nothing (a bypassed or uncounted request): the body as it is.
        Passed { #[pin] body: B },
        // Holding the request's permits until the body ends.
        Held { #[pin] body: PermitBody<B, AdmissionPermit> },
        // Empty once sent (and for a refusal without a body).
        Refused { bytes: Bytes },
    }
}

impl<B> ResponseBody<B> {
    /// The service's body, holding `permit` (if any) until it ends.
    #[inline]
    pub(crate) fn new(body: B, permit: Option<AdmissionPermit>) -> Self {
        let kind = match permit {
            Some(permit) => {
                let body = PermitBody::new(body, permit);
                // Its response is paced on an h2 stream by `serve`: its last frame may
                // still wait on the client once handed over, and the stream polls it to
                // its end.
                let body = if paced() {
                    body.held_until_none()
                } else {
                    body
                };
                Kind::Held { body }
            }
            None => Kind::Passed { body },
        };
        Self { kind }
    }

    /// The body of a request that holds nothing.
    #[inline]
    pub(crate) fn passed(body: B) -> Self {
        Self {
            kind: Kind::Passed { body },
        }
    }

    pub(crate) fn refused(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Refused { bytes },
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
        matches!(self.kind, Kind::Refused { .. })
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
        matches!(&self.kind, Kind::Held { body } if !body.is_released())
    }
}

impl<B> Body for ResponseBody<B>
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
        match self.project().kind.project() {
            KindProj::Passed { body } => body.poll_frame(cx),
            KindProj::Held { mut body } => {
                // What the handler left of the request body is read on, so that a client
                // who hangs up is seen even while this body has nothing to send: then its
                // permits go, and the response ends (the server closes the connection).
                let unread = body.permit().and_then(AdmissionPermit::charge);
                if unread.is_some_and(|charge| charge.poll_unread(cx) == Poll::Ready(false)) {
                    body.as_mut().release();
                    return Poll::Ready(None);
                }
                body.poll_frame(cx)
            }
            KindProj::Refused { bytes } => {
                let bytes = std::mem::take(bytes);
                Poll::Ready((!bytes.is_empty()).then(|| Ok(Frame::data(bytes.into()))))
            }
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Passed { body } => body.is_end_stream(),
            Kind::Held { body } => body.is_end_stream(),
            Kind::Refused { bytes } => bytes.is_empty(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Passed { body } => body.size_hint(),
            Kind::Held { body } => body.size_hint(),
            Kind::Refused { bytes } => SizeHint::with_exact(bytes.len() as u64),
        }
    }
}

/// Whether this runs in an h2 stream that `serve` paces (see `serve::stream`).
#[inline]
fn paced() -> bool {
    #[cfg(feature = "serve")]
    {
        crate::serve::in_stream()
    }
    #[cfg(not(feature = "serve"))]
    {
        false
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match (&self.kind, self.holds_permit()) {
            (Kind::Refused { .. }, _) => "refused",
            (_, true) => "admitted",
            (_, false) => "body",
        };
        f.debug_struct("ResponseBody")
            .field("kind", &kind)
            .field("holds_permit", &self.holds_permit())
            .finish()
    }
}
