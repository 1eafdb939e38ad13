//! The response body of [`Admission`](super::Admission).

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use admission_http::PermitBody;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::service::AdmissionPermit;

pin_project! {
    /// The response body of [`Admission`](super::Admission): the inner body holding the
    /// request's permits until it ends, the inner body of a bypassed request, or a
    /// refusal's small body.
    pub struct ResponseBody<B, K, H> {
        #[pin]
        kind: Kind<B, K, H>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B, K, H> {
        Admitted { #[pin] body: PermitBody<B, AdmissionPermit<K, H>> },
        Unguarded { #[pin] body: B },
        Refused { bytes: Option<Bytes> },
    }
}

impl<B, K, H> ResponseBody<B, K, H> {
    pub(crate) fn admitted(body: B, permit: AdmissionPermit<K, H>) -> Self {
        Self {
            kind: Kind::Admitted {
                body: PermitBody::new(body, permit),
            },
        }
    }

    pub(crate) fn unguarded(body: B) -> Self {
        Self {
            kind: Kind::Unguarded { body },
        }
    }

    pub(crate) fn refused(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Refused {
                bytes: Some(bytes).filter(|b| !b.is_empty()),
            },
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
    /// let layer = AdmissionLayer::builder().count(1).build()?.unwrap();
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
    /// let layer = AdmissionLayer::builder().count(1).build()?.unwrap();
    /// let mut response = layer.layer(ok).oneshot(http::Request::new(Body::default())).await?;
    /// assert!(response.body().holds_permit());
    /// while response.body_mut().frame().await.is_some() {}
    /// assert!(!response.body().holds_permit(), "released at the end of the body");
    /// # Ok(())
    /// # }
    /// ```
    pub fn holds_permit(&self) -> bool {
        match &self.kind {
            Kind::Admitted { body } => !body.is_released(),
            _ => false,
        }
    }
}

impl<B, K, H> Body for ResponseBody<B, K, H>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Admitted { body } => body.poll_frame(cx),
            KindProj::Unguarded { body } => body.poll_frame(cx),
            KindProj::Refused { bytes } => {
                Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b.into()))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Admitted { body } => body.is_end_stream(),
            Kind::Unguarded { body } => body.is_end_stream(),
            Kind::Refused { bytes } => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Admitted { body } => body.size_hint(),
            Kind::Unguarded { body } => body.size_hint(),
            Kind::Refused { bytes } => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

impl<B, K, H> fmt::Debug for ResponseBody<B, K, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Admitted { .. } => "admitted",
            Kind::Unguarded { .. } => "unguarded",
            Kind::Refused { .. } => "refused",
        };
        f.debug_struct("ResponseBody")
            .field("kind", &kind)
            .field("holds_permit", &self.holds_permit())
            .finish()
    }
}
