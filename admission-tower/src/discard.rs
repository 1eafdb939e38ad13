//! What happens to the unread body of a refused HTTP/1.x request: discarded (read to its
//! end and dropped), or the connection closed. (Not the graceful drain of a layer, which
//! is `AdmissionLayer::drain`.)
//!
//! HTTP/1.x carries one request after another on a connection, so a body the server
//! does not read stands between the refusal and the next request. A server that answers
//! without reading it must close the connection, and must say so (`connection: close`):
//! otherwise a pooled client sends its next request on a connection that is going away,
//! and that request fails with a transport error rather than a retryable refusal.
//! Closing with unread bytes in the socket can also make the kernel reset the
//! connection before the client has read the refusal.
//!
//! So a refused request's body is *discarded* (read and dropped, holding no permit) when
//! it is small and arrives quickly: at most [`DiscardLimits::max_bytes`], within
//! [`DiscardLimits::within`]. The refusal is sent once the body has ended, and the
//! connection stays open. A body that is larger, declares `expect: 100-continue` (the
//! client has not sent it and need not), or does not arrive in time is not read: the
//! refusal says `connection: close` and the server closes the connection after it.
//! HTTP/2 streams are independent, but a stream answered while its client is still
//! sending is reset, and some clients (curl's nghttp2) then report a stream error in place
//! of the answer. So a small body is discarded there too; any other is answered at once,
//! and no connection header is ever sent (HTTP/2 forbids it).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Buf;
use http::header::{CONNECTION, EXPECT};
use http::request::Parts;
use http::{HeaderValue, Response, Version};
use http_body::Body;
use pin_project_lite::pin_project;

pub(crate) use admission_http::DiscardLimits;

/// What to do with a refused request's body.
pub(crate) enum Plan {
    /// Nothing is left unread (no body, or HTTP/2): answer as is.
    Answer,
    /// Read the body, then answer; close if it cannot be read within the limits.
    Discard,
    /// Answer at once with `connection: close`.
    Close,
}

/// The plan for a refused request with this head and body, under `limits`. `closing`:
/// the layer is closed (draining for shutdown), so over HTTP/1.x every refusal closes
/// its connection, sending keep-alive clients elsewhere.
pub(crate) fn plan<B: Body>(
    limits: &DiscardLimits,
    parts: &Parts,
    body: &B,
    declared: Option<u64>,
    closing: bool,
) -> Plan {
    let http1 = is_http1(parts.version);
    if closing && http1 {
        return Plan::Close;
    }
    if body.is_end_stream() {
        return Plan::Answer;
    }
    let expects_continue = parts
        .headers
        .get(EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let small = declared.is_none_or(|length| length <= limits.max_bytes);
    let discard = limits.max_bytes != 0 && !expects_continue && small && cfg!(feature = "tokio");
    match (discard, http1) {
        (true, _) => Plan::Discard,
        (false, true) => Plan::Close,
        // HTTP/2: the stream is reset after the answer; nothing to close.
        (false, false) => Plan::Answer,
    }
}

/// Marks an HTTP/1.x response as the connection's last.
pub(crate) fn close<B>(response: &mut Response<B>) {
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
}

/// Whether a request came over HTTP/1.x (where a connection header means something).
pub(crate) fn is_http1(version: Version) -> bool {
    version < Version::HTTP_2
}

pin_project! {
    /// Reads a refused request's body to its end and drops it, within the limits.
    #[project = DiscardProj]
    pub(crate) struct Discard<B> {
        #[pin]
        body: B,
        read: u64,
        limits: DiscardLimits,
        deadline: Option<Deadline>,
    }
}

/// The timer that bounds a discard's wait, started at its first wait.
#[cfg(feature = "tokio")]
type Deadline = Pin<Box<tokio::time::Sleep>>;
/// Without a timer a discard never waits, so it never has a deadline.
#[cfg(not(feature = "tokio"))]
type Deadline = std::convert::Infallible;

impl<B> Discard<B> {
    pub(crate) fn new(body: B, limits: DiscardLimits) -> Self {
        Self {
            body,
            read: 0,
            limits,
            deadline: None,
        }
    }
}

impl<B: Body> Future for Discard<B> {
    /// Whether the whole body was read.
    type Output = bool;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let mut this = self.project();
        loop {
            match this.body.as_mut().poll_frame(cx) {
                Poll::Ready(None) => return Poll::Ready(true),
                Poll::Ready(Some(Err(_))) => return Poll::Ready(false),
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        *this.read = this.read.saturating_add(data.remaining() as u64);
                        if *this.read > this.limits.max_bytes {
                            return Poll::Ready(false);
                        }
                    }
                }
                Poll::Pending => return this.wait(cx),
            }
        }
    }
}

impl<B> DiscardProj<'_, B> {
    /// The body is not at hand: wait for it until the deadline, which starts now.
    /// Without a timer (no `tokio` feature, or outside a tokio runtime), never wait.
    fn wait(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        #[cfg(not(feature = "tokio"))]
        {
            let _ = cx;
            Poll::Ready(false)
        }
        #[cfg(feature = "tokio")]
        {
            if self.deadline.is_none() {
                if tokio::runtime::Handle::try_current().is_err() {
                    return Poll::Ready(false);
                }
                *self.deadline = Some(Box::pin(tokio::time::sleep(self.limits.within)));
            }
            match self.deadline.as_mut().map(|sleep| sleep.as_mut().poll(cx)) {
                Some(Poll::Ready(())) => Poll::Ready(false),
                _ => Poll::Pending,
            }
        }
    }
}
