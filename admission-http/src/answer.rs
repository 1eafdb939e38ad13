//! Refusal responses: status, `Retry-After`, and a body of the user's shape.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Method, Response, Uri};

use admission_core::Refused;

use crate::grpc::{grpc_trailers_only, is_grpc};
use crate::shape::{BodyError, ErrorShape};
use crate::{BodyRefusalContext, BoxError, Refusal, RefusalBody, RefusalContext, jittered};

type Shape = dyn Fn(&RefusalContext<'_>) -> RefusalBody + Send + Sync;
type Whole = dyn Fn(&RefusalContext<'_>) -> Response<Bytes> + Send + Sync;

/// How much of a refused request's unread body is discarded (read and dropped) before
/// the refusal is sent ([`Refusals::discard`]). By default 64 KiB within 1 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiscardLimits {
    /// The most bytes discarded (0: none).
    pub max_bytes: u64,
    /// How long the body may take to arrive.
    pub within: Duration,
}

impl Default for DiscardLimits {
    fn default() -> Self {
        Self {
            max_bytes: 64 << 10,
            within: Duration::from_secs(1),
        }
    }
}

/// How refused requests are answered.
///
/// The status follows the refusal ([`Refusal::status`]): 503 for global overload,
/// 429 for one key over its share, 413 for one request too large, 400 for a malformed
/// `Content-Length`. 503 and 429 carry `Retry-After` in whole seconds (default 1); 413
/// and 400 do not, since the same request would fail again.
///
/// The body is the user's choice: a closure over the request's method, URI and headers
/// and the refusal, so one server can answer in two error envelopes by path. The
/// default is one line of plain text naming the reason (`overloaded: count limit
/// reached`; a client over its own share reads `too many requests from this client:
/// per-key limit reached`, since the server is not overloaded): it costs next to nothing to build under overload, reads well in `curl` and
/// in logs, and presumes no API's error format. APIs with an envelope set their own.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_core::Refused;
/// use admission_http::{Refusals, RefusalBody, Refusal};
///
/// let refusals = Refusals::new()
///     .retry_after(Duration::from_secs(2))
///     .body(|cx| {
///         if cx.uri.path().starts_with("/api/") {
///             RefusalBody::json(format!(r#"{{"error":"{}"}}"#, cx.refusal))
///         } else {
///             RefusalBody::text(format!("{}\n", cx.status))
///         }
///     });
///
/// let request = http::Request::get("/api/items").body(())?;
/// let response = refusals.respond(&request, Refusal::Refused(Refused::Key));
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["retry-after"], "2");
/// assert_eq!(response.headers()["content-type"], "application/json");
/// assert_eq!(response.body(), r#"{"error":"per-key limit reached"}"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Refusals {
    retry_delay: Duration,
    retry_jitter: Duration,
    shape: Option<Arc<Shape>>,
    whole: Option<Arc<Whole>>,
    error: Option<Arc<ErrorShape>>,
    discard: DiscardLimits,
}

impl Default for Refusals {
    fn default() -> Self {
        Self::new()
    }
}

impl Refusals {
    /// Plain-text refusals with `Retry-After: 1`.
    ///
    /// ```
    /// use admission_core::Refused;
    /// use admission_http::{Refusals, Refusal};
    ///
    /// let request = http::Request::get("/").body(())?;
    /// let response = Refusals::new().respond(&request, Refusal::Refused(Refused::Count));
    /// assert_eq!(response.status(), 503);
    /// assert_eq!(response.headers()["retry-after"], "1");
    /// assert_eq!(response.body(), "overloaded: count limit reached\n");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new() -> Self {
        Self {
            retry_delay: Duration::from_secs(1),
            retry_jitter: Duration::ZERO,
            shape: None,
            whole: None,
            error: None,
            discard: DiscardLimits::default(),
        }
    }

    /// The `Retry-After` for retryable refusals, rounded up to whole seconds.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_http::Refusals;
    ///
    /// let refusals = Refusals::new().retry_after(Duration::from_millis(1500));
    /// assert_eq!(refusals.retry_after_secs(), 2);
    /// ```
    pub fn retry_after(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// Spreads retries: each refusal's delay is the configured one plus a uniformly
    /// drawn part of `jitter` (default none), so `Retry-After` (rounded up to seconds)
    /// and a gRPC pushback (milliseconds) vary from one refused client to the next.
    ///
    /// Off by default: the header then says exactly what was configured, which keeps
    /// answers predictable and cacheable, and most retrying clients add jitter of their
    /// own (gRPC's retry policy does; OTLP exporters do). Turn it on when shed clients
    /// honour the delay to the letter and come back in step: a burst shed at once then
    /// returns spread over `jitter` instead of in one second. A spread of about the
    /// delay itself (`retry_after(1 s)`, `retry_jitter(1 s)`: 1 or 2 s) halves the
    /// returning peak.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_core::Refused;
    /// use admission_http::{Refusals, Refusal};
    ///
    /// let refusals = Refusals::new()
    ///     .retry_after(Duration::from_secs(1))
    ///     .retry_jitter(Duration::from_secs(4));
    /// let request = http::Request::get("/").body(())?;
    /// let seen: std::collections::BTreeSet<String> = (0..200)
    ///     .map(|_| refusals.respond(&request, Refusal::Refused(Refused::Count)))
    ///     .map(|r| r.headers()["retry-after"].to_str().unwrap().to_owned())
    ///     .collect();
    /// assert!(seen.len() > 1 && seen.iter().all(|s| ("1"..="5").contains(&s.as_str())));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn retry_jitter(mut self, jitter: Duration) -> Self {
        self.retry_jitter = jitter;
        self
    }

    /// The `Retry-After` in seconds: the retry delay rounded up (without jitter).
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_http::Refusals;
    ///
    /// assert_eq!(Refusals::new().retry_after(Duration::from_secs(3)).retry_after_secs(), 3);
    /// ```
    pub fn retry_after_secs(&self) -> u64 {
        whole_seconds(self.retry_delay)
    }

    /// The retry delay as configured.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_http::Refusals;
    ///
    /// let refusals = Refusals::new().retry_after(Duration::from_millis(250));
    /// assert_eq!(refusals.retry_delay(), Duration::from_millis(250));
    /// assert_eq!(refusals.retry_after_secs(), 1);
    /// ```
    pub fn retry_delay(&self) -> Duration {
        self.retry_delay
    }

    /// What a refusal's body says: `body` is given the refusal (status, what refused,
    /// the request's head) and returns the body to send; the default is one line of text
    /// naming what refused.
    ///
    /// ```
    /// use admission_core::Refused;
    /// use admission_http::{RefusalBody, Refusals, Refusal};
    ///
    /// let refusals = Refusals::new().body(|cx| RefusalBody::text(format!("{}", cx.status.as_u16())));
    /// let request = http::Request::get("/").body(())?;
    /// assert_eq!(refusals.respond(&request, Refusal::Refused(Refused::Key)).body(), "429");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn body<F>(mut self, shape: F) -> Self
    where
        F: Fn(&RefusalContext<'_>) -> RefusalBody + Send + Sync + 'static,
    {
        self.shape = Some(Arc::new(shape));
        self.whole = None;
        self
    }

    /// Replaces the whole response (status and headers too), for protocols that answer
    /// refusals in their own shape, such as gRPC's trailers-only responses. The closure
    /// sees the same context as a body closure. A refusal has one shape: this replaces a
    /// [`body`](Self::body) set before, and a `body` set after replaces this.
    ///
    /// ```
    /// use admission_core::Refused;
    /// use admission_http::{Refusals, Refusal};
    ///
    /// let refusals = Refusals::new().response(|cx| {
    ///     let mut response = http::Response::new(bytes::Bytes::new());
    ///     response.headers_mut().insert("x-refused", cx.refusal.to_string().parse().unwrap());
    ///     response
    /// });
    /// let request = http::Request::get("/").body(())?;
    /// let response = refusals.respond(&request, Refusal::Refused(Refused::Count));
    /// assert_eq!(response.status(), 200);
    /// assert_eq!(response.headers()["x-refused"], "count limit reached");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn response<F>(mut self, whole: F) -> Self
    where
        F: Fn(&RefusalContext<'_>) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.whole = Some(Arc::new(whole));
        self.shape = None;
        self
    }

    /// The source of the error a metered request body fails with when it is refused
    /// while it streams ([`BodyRefused::source`](std::error::Error::source)): a
    /// protocol's own error for the refusal, for frameworks that answer a body error
    /// from its source chain. tonic does: given a `tonic::Status` here, a handler that
    /// propagates the body error answers with that status. (`admission-grpc` sets this.)
    ///
    /// ```
    /// use admission_core::Refused;
    /// use admission_http::Refusals;
    ///
    /// let refusals = Refusals::new().body_error(|cx| format!("busy: {}", cx.refused).into());
    /// assert!(refusals.has_body_error());
    /// ```
    ///
    /// [`BodyRefused::source`]: crate::BodyRefused
    pub fn body_error<F>(mut self, error: F) -> Self
    where
        F: Fn(&BodyRefusalContext) -> BoxError + Send + Sync + 'static,
    {
        self.error = Some(Arc::new(error));
        self
    }

    /// How much of a refused request's unread body a server discards (reads and drops)
    /// before answering, so that an HTTP/1.1 connection can carry the client's next
    /// request: bodies up to `max_bytes` that arrive `within` the time given (default
    /// 64 KiB within 1 s; `max_bytes` 0 discards none). A refusal whose body is not
    /// discarded says `connection: close` on HTTP/1.x. (`admission-tower` does the
    /// discarding.)
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_http::Refusals;
    ///
    /// let refusals = Refusals::new().discard(16 << 10, Duration::from_millis(200));
    /// let limits = refusals.discard_limits();
    /// assert_eq!((limits.max_bytes, limits.within), (16 << 10, Duration::from_millis(200)));
    /// ```
    pub fn discard(mut self, max_bytes: u64, within: Duration) -> Self {
        self.discard = DiscardLimits { max_bytes, within };
        self
    }

    /// The limits of [`discard`](Self::discard): bytes, and time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_http::Refusals;
    ///
    /// let limits = Refusals::new().discard_limits();
    /// assert_eq!((limits.max_bytes, limits.within), (64 << 10, Duration::from_secs(1)));
    /// ```
    pub fn discard_limits(&self) -> DiscardLimits {
        self.discard
    }

    /// Whether a [`body_error`](Self::body_error) closure is set.
    ///
    /// ```
    /// use admission_http::Refusals;
    ///
    /// assert!(!Refusals::new().has_body_error());
    /// ```
    pub fn has_body_error(&self) -> bool {
        self.error.is_some()
    }

    pub(crate) fn body_error_fn(&self) -> Option<BodyError> {
        self.error.as_ref().map(|shape| BodyError {
            shape: shape.clone(),
            retry_delay: self.retry_delay,
            retry_jitter: self.retry_jitter,
        })
    }

    /// The refusal for `request`'s head and `refusal`.
    ///
    /// A gRPC call (`content-type: application/grpc`, with or without a `+codec`; not
    /// gRPC-Web) is answered as gRPC defines an error without a message: a trailers-only
    /// response, HTTP 200 with the status in its headers and no body, whatever body shape
    /// is set (a gRPC client would fail to decode any other body, and report `INTERNAL`).
    /// A retryable refusal is `UNAVAILABLE`, the code gRPC clients' retry policies retry,
    /// with the delay in `grpc-retry-pushback-ms`; a request too large is
    /// `RESOURCE_EXHAUSTED`, which they do not; a malformed `Content-Length` is
    /// `INVALID_ARGUMENT`. For `RESOURCE_EXHAUSTED` with `RetryInfo` (the code and detail
    /// the OpenTelemetry exporters retry), use the `admission-grpc` crate's refusals, a
    /// [`response`](Self::response) of their own.
    ///
    /// ```
    /// use admission_core::Refused;
    /// use admission_http::{Refusals, Refusal};
    ///
    /// let request = http::Request::get("/").body(())?;
    /// let response = Refusals::new().respond(&request, Refusal::Refused(Refused::Bytes));
    /// assert_eq!(response.status(), 503);
    ///
    /// let call = http::Request::post("/pkg.Service/Method")
    ///     .header("content-type", "application/grpc")
    ///     .body(())?;
    /// let response = Refusals::new().respond(&call, Refusal::Refused(Refused::Count));
    /// assert_eq!(response.status(), 200);
    /// assert_eq!(response.headers()["grpc-status"], "14"); // UNAVAILABLE
    /// assert_eq!(response.headers()["grpc-retry-pushback-ms"], "1000");
    /// assert!(response.body().is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn respond<B>(&self, request: &http::Request<B>, refusal: Refusal) -> Response<Bytes> {
        self.respond_to(request.method(), request.uri(), request.headers(), refusal)
    }

    /// The refusal for a request given by its parts.
    ///
    /// ```
    /// use admission_core::Refused;
    /// use admission_http::{Refusals, Refusal};
    ///
    /// let (parts, _) = http::Request::post("/upload").body(())?.into_parts();
    /// let response = Refusals::new().respond_to(
    ///     &parts.method, &parts.uri, &parts.headers, Refusal::Refused(Refused::TooLarge));
    /// assert_eq!(response.status(), 413);
    /// assert!(response.headers().get("retry-after").is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn respond_to(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        refusal: Refusal,
    ) -> Response<Bytes> {
        let status = refusal.status();
        let retry_delay = refusal
            .is_retryable()
            .then(|| jittered(self.retry_delay, self.retry_jitter));
        let retry_after = retry_delay.map(whole_seconds);
        let cx = RefusalContext {
            method,
            uri,
            headers,
            refusal,
            status,
            retry_after,
            retry_delay,
        };
        if let Some(whole) = &self.whole {
            return whole(&cx);
        }
        if is_grpc(headers) {
            return grpc_trailers_only(&cx);
        }
        let body = match &self.shape {
            Some(shape) => shape(&cx),
            None => default_body(&cx),
        };
        let mut response = Response::new(body.bytes);
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, body.content_type);
        if let Some(secs) = retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// A delay rounded up to whole seconds, as `Retry-After` carries it.
fn whole_seconds(delay: Duration) -> u64 {
    let secs = delay.as_secs();
    if delay.subsec_nanos() > 0 {
        secs.saturating_add(1)
    } else {
        secs
    }
}

fn default_body(cx: &RefusalContext<'_>) -> RefusalBody {
    let text = match cx.refusal {
        // One client over its share: the server is not overloaded.
        Refusal::Refused(refused @ Refused::Key) => {
            format!("too many requests from this client: {refused}\n")
        }
        Refusal::Refused(refused) if refused.is_retryable() => {
            format!("overloaded: {refused}\n")
        }
        refusal => format!("{refusal}\n"),
    };
    RefusalBody::text(text)
}
impl fmt::Debug for Refusals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refusals")
            .field("retry_delay", &self.retry_delay)
            .field("retry_jitter", &self.retry_jitter)
            .field("custom_body", &self.shape.is_some())
            .field("custom_response", &self.whole.is_some())
            .field("body_error", &self.error.is_some())
            .field("discard", &self.discard)
            .finish()
    }
}
