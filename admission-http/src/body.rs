//! A response body that holds a permit until the body ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// A body that holds a permit until the body is finished.
    ///
    /// Wraps any [`Body`] and any permit `P` (a core permit, a `GatePermit`, a tuple of
    /// them: anything `Send + 'static` whose drop releases). Every frame, data and
    /// trailers, passes through unchanged; `is_end_stream` and `size_hint` are the inner
    /// body's. The permit is released:
    ///
    /// - when the inner body returns `Ready(None)` (end of stream);
    /// - when it returns an error frame;
    /// - right after a frame, when the inner body then reports `is_end_stream()` (a
    ///   server that knows the body's exact length may never poll again);
    /// - when the wrapper is dropped (a client that disconnects mid-stream).
    ///
    /// Never on `Pending`, whatever `is_end_stream` says then. Releasing when the response
    /// head is sent (as `ConcurrencyLimit` does when its future resolves) would leave
    /// server-sent events, gRPC server streams and large downloads outside every limit.
    ///
    /// # Examples
    ///
    /// Wrap a response body by hand with a core permit:
    ///
    /// ```
    /// use admission_core::CountLedger;
    /// use admission_http::PermitBody;
    /// use http_body_util::{BodyExt, Full};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ledger = CountLedger::new(10)?;
    /// let permit = ledger.try_acquire()?;
    /// let response = http::Response::new(Full::new(bytes::Bytes::from("hello")));
    /// let mut response = response.map(|body| PermitBody::new(body, permit));
    /// assert_eq!(ledger.in_flight(), 1, "held while the body is unread");
    ///
    /// // The server polls the body; the last frame releases the permit in place.
    /// let frame = response.body_mut().frame().await.unwrap()?;
    /// assert_eq!(frame.into_data().unwrap(), "hello");
    /// assert!(response.body().is_released());
    /// assert_eq!(ledger.in_flight(), 0);
    /// # Ok(())
    /// # }
    /// ```
    pub struct PermitBody<B, P> {
        #[pin]
        inner: B,
        permit: Option<P>,
        // Released only at the end of the stream, an error or drop: not right after a
        // last frame (see `held_until_none`).
        until_none: bool,
    }
}

impl<B, P> PermitBody<B, P> {
    /// Wraps `inner`, holding `permit` until the body ends or is dropped.
    ///
    /// ```
    /// use admission_http::PermitBody;
    /// use http_body_util::Empty;
    ///
    /// let body = PermitBody::new(Empty::<bytes::Bytes>::new(), "any permit");
    /// assert_eq!(body.permit(), Some(&"any permit"));
    /// ```
    pub fn new(inner: B, permit: P) -> Self {
        Self {
            inner,
            permit: Some(permit),
            until_none: false,
        }
    }

    /// Wraps `inner` with `permit` if there is one: a body of a request that holds no
    /// permit (a bypassed route, say) has the same type as one that does.
    ///
    /// ```
    /// use admission_http::PermitBody;
    /// use http_body_util::Empty;
    ///
    /// let body = PermitBody::<_, ()>::from_parts(Empty::<bytes::Bytes>::new(), None);
    /// assert!(body.is_released(), "nothing to release");
    /// ```
    pub fn from_parts(inner: B, permit: Option<P>) -> Self {
        Self {
            inner,
            permit,
            until_none: false,
        }
    }

    /// The permit, while it is held.
    ///
    /// ```
    /// use admission_http::PermitBody;
    ///
    /// let body = PermitBody::new(http_body_util::Empty::<bytes::Bytes>::new(), 7);
    /// assert_eq!(body.permit(), Some(&7));
    /// ```
    pub fn permit(&self) -> Option<&P> {
        self.permit.as_ref()
    }

    /// Whether the permit has been released (the body ended or failed).
    ///
    /// ```
    /// use admission_http::PermitBody;
    ///
    /// let body = PermitBody::new(http_body_util::Empty::<bytes::Bytes>::new(), ());
    /// assert!(!body.is_released(), "nothing released before the first poll");
    /// ```
    pub fn is_released(&self) -> bool {
        self.permit.is_none()
    }

    /// The inner body.
    ///
    /// ```
    /// use admission_http::PermitBody;
    /// use http_body::Body;
    ///
    /// let body = PermitBody::new(http_body_util::Full::new(bytes::Bytes::from("abc")), ());
    /// assert_eq!(body.get_ref().size_hint().exact(), Some(3));
    /// ```
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The inner body, mutably.
    ///
    /// ```
    /// use admission_http::PermitBody;
    ///
    /// let mut body = PermitBody::new(String::from("inner"), ());
    /// body.get_mut().push('!');
    /// assert_eq!(body.get_ref(), "inner!");
    /// ```
    pub fn get_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// The inner body, pinned.
    ///
    /// ```
    /// use std::pin::pin;
    /// use admission_http::PermitBody;
    ///
    /// let mut body = pin!(PermitBody::new(String::from("x"), ()));
    /// assert_eq!(body.as_mut().get_pin_mut().len(), 1);
    /// ```
    pub fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut B> {
        self.project().inner
    }

    /// Takes the wrapper apart: the inner body and the permit, if still held. The caller
    /// becomes responsible for the permit.
    ///
    /// ```
    /// use admission_core::CountLedger;
    /// use admission_http::PermitBody;
    ///
    /// let ledger = CountLedger::new(1)?;
    /// let body = PermitBody::new(String::new(), ledger.try_acquire()?);
    /// let (_inner, permit) = body.into_parts();
    /// assert_eq!(ledger.in_flight(), 1);
    /// drop(permit);
    /// assert_eq!(ledger.in_flight(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_parts(self) -> (B, Option<P>) {
        (self.inner, self.permit)
    }

    /// The inner body; the permit is released now.
    ///
    /// ```
    /// use admission_core::CountLedger;
    /// use admission_http::PermitBody;
    ///
    /// let ledger = CountLedger::new(1)?;
    /// let body = PermitBody::new(String::from("x"), ledger.try_acquire()?);
    /// assert_eq!(body.into_inner(), "x");
    /// assert_eq!(ledger.in_flight(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B, P> PermitBody<B, P> {
    /// Holds the permit past a frame after which the inner body reports its end, until
    /// the body is polled once more (and returns `Ready(None)`), fails, or is dropped:
    /// for a server that polls every body to its end or drops it, and whose last frame
    /// may still wait to be sent when it has been handed over (`AdmissionLayer::serve`
    /// on h2, where it waits on the client's flow-control window).
    ///
    /// ```
    /// use admission_core::CountLedger;
    /// use admission_http::PermitBody;
    /// use http_body_util::{BodyExt, Full};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ledger = CountLedger::new(1)?;
    /// let full = Full::new(bytes::Bytes::from("last"));
    /// let mut body = PermitBody::new(full, ledger.try_acquire()?).held_until_none();
    /// assert!(body.frame().await.is_some());
    /// assert_eq!(ledger.in_flight(), 1, "held past the last frame");
    /// assert!(body.frame().await.is_none());
    /// assert_eq!(ledger.in_flight(), 0, "released at the end of the stream");
    /// # Ok(())
    /// # }
    /// ```
    pub fn held_until_none(mut self) -> Self {
        self.until_none = true;
        self
    }

    /// Releases the permit now, before the body ends: for a holder that knows the client
    /// is gone (its request failed mid-body, say) while the body has nothing to send and
    /// the server has not yet dropped it.
    ///
    /// ```
    /// use std::pin::pin;
    /// use admission_core::CountLedger;
    /// use admission_http::PermitBody;
    ///
    /// let ledger = CountLedger::new(1)?;
    /// let mut body = pin!(PermitBody::new(http_body_util::Empty::<bytes::Bytes>::new(), ledger.try_acquire()?));
    /// body.as_mut().release();
    /// assert!(body.is_released());
    /// assert_eq!(ledger.in_flight(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn release(self: Pin<&mut Self>) {
        release(self.project().permit);
    }
}

/// The one place a `PermitBody` gives its permit up before it is dropped: end of stream,
/// an error frame, a frame after which the inner body reports its end, or `release`. (On drop the
/// permit goes with the wrapper's fields.)
fn release<P>(permit: &mut Option<P>) {
    drop(permit.take());
}

impl<B: Body, P> Body for PermitBody<B, P> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                release(this.permit);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(err))) => {
                release(this.permit);
                Poll::Ready(Some(Err(err)))
            }
            Poll::Ready(Some(Ok(frame))) => {
                if !*this.until_none && this.inner.is_end_stream() {
                    release(this.permit);
                }
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: fmt::Debug, P> fmt::Debug for PermitBody<B, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitBody")
            .field("inner", &self.inner)
            .field("released", &self.is_released())
            .finish()
    }
}
