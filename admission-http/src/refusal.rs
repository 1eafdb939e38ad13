//! Why a request is refused: the refusal and its status, a declared length that
//! cannot be read, and the error a refused body fails with.

use std::fmt;

use admission_core::Refused;
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, StatusCode};

/// The error type of a metered body: the inner body's error or a [`BodyRefused`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request is answered before its body is read.
///
/// ```
/// use admission_core::Refused;
/// use admission_http::Refusal;
/// use http::StatusCode;
///
/// assert_eq!(Refusal::Refused(Refused::Count).status(), StatusCode::SERVICE_UNAVAILABLE);
/// assert_eq!(Refusal::Refused(Refused::Key).status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(Refusal::Refused(Refused::TooLarge).status(), StatusCode::PAYLOAD_TOO_LARGE);
/// assert_eq!(Refusal::Refused(Refused::TooSlow).status(), StatusCode::REQUEST_TIMEOUT);
/// assert_eq!(Refusal::InvalidContentLength.status(), StatusCode::BAD_REQUEST);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// A ledger refused the request.
    Refused(Refused),
    /// The request's `Content-Length` does not parse (or two of them disagree).
    InvalidContentLength,
}

impl Refusal {
    /// The HTTP status for this refusal: 503 for global overload (count, bytes, key
    /// table), 429 for one key over its cap, 413 for one request too large, 408 for a
    /// body slower than the minimum data rate, 400 for a malformed `Content-Length`.
    ///
    /// ```
    /// use admission_core::Refused;
    /// use admission_http::Refusal;
    ///
    /// assert_eq!(Refusal::Refused(Refused::KeyTable).status(), 503);
    /// ```
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Refused(Refused::Key) => StatusCode::TOO_MANY_REQUESTS,
            Refusal::Refused(Refused::TooLarge) => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::Refused(Refused::TooSlow) => StatusCode::REQUEST_TIMEOUT,
            Refusal::Refused(_) => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::InvalidContentLength => StatusCode::BAD_REQUEST,
        }
    }

    /// Whether the same request may succeed later, so a `Retry-After` belongs on the
    /// answer (503 and 429 yes; 413 and 400 no).
    ///
    /// ```
    /// use admission_core::Refused;
    /// use admission_http::Refusal;
    ///
    /// assert!(Refusal::Refused(Refused::Bytes).is_retryable());
    /// assert!(!Refusal::InvalidContentLength.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            Refusal::Refused(refused) => refused.is_retryable(),
            Refusal::InvalidContentLength => false,
        }
    }
}

impl From<Refused> for Refusal {
    fn from(refused: Refused) -> Self {
        Refusal::Refused(refused)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Refused(refused) => refused.fmt(f),
            Refusal::InvalidContentLength => f.write_str("invalid content-length"),
        }
    }
}

impl std::error::Error for Refusal {}

/// The request's declared body length: `Ok(None)` without a `Content-Length`.
///
/// # Errors
///
/// [`Refusal::InvalidContentLength`] if a value is not a plain decimal number that
/// fits a `u64`, or if several `Content-Length` headers disagree.
///
/// # Examples
///
/// ```
/// use admission_http::{content_length, Refusal};
/// use http::HeaderMap;
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(content_length(&headers), Ok(None));
/// headers.insert("content-length", "42".parse().unwrap());
/// assert_eq!(content_length(&headers), Ok(Some(42)));
/// headers.insert("content-length", "-1".parse().unwrap());
/// assert_eq!(content_length(&headers), Err(Refusal::InvalidContentLength));
/// ```
pub fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Refusal> {
    let mut length = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        let parsed = value
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or(Refusal::InvalidContentLength)?;
        if length.is_some_and(|seen| seen != parsed) {
            return Err(Refusal::InvalidContentLength);
        }
        length = Some(parsed);
    }
    Ok(length)
}

/// The error a [`MeteredBody`](crate::MeteredBody) returns when the byte ledger refuses to let the body
/// grow: the reader (the handler) sees a body error, and nothing hangs.
///
/// Downcast it from the body's [`BoxError`]:
///
/// ```
/// use admission_core::Refused;
/// use admission_http::{BodyRefused, BoxError};
///
/// let err: BoxError = Box::new(BodyRefused::new(Refused::Bytes));
/// let refused = err.downcast_ref::<BodyRefused>().unwrap();
/// assert_eq!(refused.refused(), Refused::Bytes);
/// assert_eq!(err.to_string(), "request body refused: byte budget exhausted");
/// ```
///
/// Its [`source`](std::error::Error::source) is the protocol's own error for the
/// refusal, when one was configured ([`Refusals::body_error`](crate::Refusals::body_error)):
/// a gRPC status, say, which a framework that looks for one in an error's chain (tonic)
/// then answers with.
#[derive(Debug)]
pub struct BodyRefused {
    refused: Refused,
    source: Option<BoxError>,
}

impl BodyRefused {
    /// An error for `refused`.
    ///
    /// ```
    /// use admission_core::Refused;
    /// use admission_http::BodyRefused;
    ///
    /// assert_eq!(BodyRefused::new(Refused::TooLarge).refused(), Refused::TooLarge);
    /// ```
    pub fn new(refused: Refused) -> Self {
        Self {
            refused,
            source: None,
        }
    }

    /// An error for `refused` whose source is `source`, a protocol's own error for it.
    ///
    /// ```
    /// use std::error::Error;
    /// use admission_core::Refused;
    /// use admission_http::BodyRefused;
    ///
    /// let err = BodyRefused::with_source(Refused::Bytes, "busy: retry in 1 s".into());
    /// assert_eq!(err.source().unwrap().to_string(), "busy: retry in 1 s");
    /// ```
    pub fn with_source(refused: Refused, source: BoxError) -> Self {
        Self {
            refused,
            source: Some(source),
        }
    }

    /// What the ledger said.
    ///
    /// ```
    /// use admission_core::Refused;
    /// use admission_http::BodyRefused;
    ///
    /// assert_eq!(BodyRefused::new(Refused::Bytes).refused(), Refused::Bytes);
    /// ```
    pub fn refused(&self) -> Refused {
        self.refused
    }
}

impl fmt::Display for BodyRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request body refused: {}", self.refused)
    }
}

impl std::error::Error for BodyRefused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn std::error::Error + 'static))
    }
}
