//! What a refusal's shaping closures see and give: the request's context, the body,
//! and the error a body refused as it streams carries.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};

use admission_core::Refused;

use crate::{BoxError, Refusal, jittered};

/// What a refusal's body closure sees: the request's head and the refusal.
#[derive(Debug)]
#[non_exhaustive]
pub struct RefusalContext<'a> {
    /// The request's method.
    pub method: &'a Method,
    /// The request's URI.
    pub uri: &'a Uri,
    /// The request's headers.
    pub headers: &'a HeaderMap,
    /// Why the request is refused.
    pub refusal: Refusal,
    /// The status the response will carry.
    pub status: StatusCode,
    /// The `Retry-After` the response will carry, in seconds, if any.
    pub retry_after: Option<u64>,
    /// This refusal's retry delay, exactly (for protocols that carry milliseconds),
    /// when the refusal is retryable: the configured one, plus its jitter if any.
    pub retry_delay: Option<Duration>,
}

/// A refusal's body and its content type.
///
/// ```
/// use admission_http::RefusalBody;
///
/// let body = RefusalBody::json(r#"{"error":"overloaded"}"#);
/// assert_eq!(body.content_type(), "application/json");
/// assert_eq!(body.bytes(), &br#"{"error":"overloaded"}"#[..]);
/// ```
#[derive(Debug, Clone)]
pub struct RefusalBody {
    pub(crate) content_type: HeaderValue,
    pub(crate) bytes: Bytes,
}

impl RefusalBody {
    /// A body with any content type.
    ///
    /// ```
    /// use admission_http::RefusalBody;
    /// use http::HeaderValue;
    ///
    /// let body = RefusalBody::new(HeaderValue::from_static("application/problem+json"), "{}");
    /// assert_eq!(body.content_type(), "application/problem+json");
    /// ```
    pub fn new(content_type: HeaderValue, bytes: impl Into<Bytes>) -> Self {
        Self {
            content_type,
            bytes: bytes.into(),
        }
    }

    /// A `text/plain; charset=utf-8` body.
    ///
    /// ```
    /// use admission_http::RefusalBody;
    ///
    /// assert_eq!(RefusalBody::text("busy").content_type(), "text/plain; charset=utf-8");
    /// ```
    pub fn text(text: impl Into<Bytes>) -> Self {
        Self::new(
            HeaderValue::from_static("text/plain; charset=utf-8"),
            text.into(),
        )
    }

    /// An `application/json` body.
    ///
    /// ```
    /// use admission_http::RefusalBody;
    ///
    /// assert_eq!(RefusalBody::json("{}").content_type(), "application/json");
    /// ```
    pub fn json(json: impl Into<Bytes>) -> Self {
        Self::new(HeaderValue::from_static("application/json"), json.into())
    }

    /// The content type.
    ///
    /// ```
    /// use admission_http::RefusalBody;
    ///
    /// assert_eq!(RefusalBody::text("x").content_type(), "text/plain; charset=utf-8");
    /// ```
    pub fn content_type(&self) -> &HeaderValue {
        &self.content_type
    }

    /// The bytes.
    ///
    /// ```
    /// use admission_http::RefusalBody;
    ///
    /// assert_eq!(RefusalBody::text("busy").bytes(), "busy");
    /// ```
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }
}

/// A body-error closure, as `Refusals::body_error` takes it.
pub(crate) type ErrorShape = dyn Fn(&BodyRefusalContext) -> BoxError + Send + Sync;

/// What a [`Refusals::body_error`](crate::Refusals::body_error) closure sees: why a request's body was refused while
/// it streamed, and the configured retry delay when retrying can help.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct BodyRefusalContext {
    /// What the ledger said.
    pub refused: Refused,
    /// The retry delay (with its jitter, if configured), when `refused` is retryable.
    pub retry_delay: Option<Duration>,
}

/// A body-error closure and the retry delay it is told, as a request's charge holds it.
#[derive(Clone)]
pub(crate) struct BodyError {
    pub(crate) shape: Arc<ErrorShape>,
    pub(crate) retry_delay: Duration,
    pub(crate) retry_jitter: Duration,
}

impl BodyError {
    pub(crate) fn make(&self, refused: Refused) -> BoxError {
        (self.shape)(&BodyRefusalContext {
            refused,
            retry_delay: refused
                .is_retryable()
                .then(|| jittered(self.retry_delay, self.retry_jitter)),
        })
    }
}
