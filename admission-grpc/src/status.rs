//! gRPC statuses for refusals, and the trailers-only response that carries one.

use std::time::Duration;

use admission_core::Refused;
use admission_http::{BodyRefusalContext, Refusal, RefusalContext, grpc_code};
use bytes::Bytes;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The metadata key of gRPC's server pushback: how long the client should wait before
/// retrying, in milliseconds (gRFC A6).
pub const RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";

/// Which code a retryable refusal carries.
///
/// ```
/// use admission_grpc::RefusalCode;
///
/// assert_eq!(RefusalCode::default(), RefusalCode::ResourceExhausted);
/// assert_eq!(RefusalCode::Unavailable.code(), tonic::Code::Unavailable);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RefusalCode {
    /// `RESOURCE_EXHAUSTED` (8): what an overloaded server means. With `RetryInfo`, OTLP
    /// exporters and clients that honour server pushback retry it.
    #[default]
    ResourceExhausted,
    /// `UNAVAILABLE` (14): for clients whose retry policy lists only this code.
    Unavailable,
}

impl RefusalCode {
    /// The gRPC code.
    ///
    /// ```
    /// use admission_grpc::RefusalCode;
    ///
    /// assert_eq!(RefusalCode::ResourceExhausted.code(), tonic::Code::ResourceExhausted);
    /// ```
    pub fn code(self) -> Code {
        match self {
            RefusalCode::ResourceExhausted => Code::ResourceExhausted,
            RefusalCode::Unavailable => Code::Unavailable,
        }
    }
}

/// The `Status` for a refusal: `RESOURCE_EXHAUSTED`, a message naming the dimension, and,
/// when retrying can help, `RetryInfo` in the details and `grpc-retry-pushback-ms` in
/// the metadata, both from `retry_after`.
///
/// For charges made inside a handler, such as the decoded size of a batch charged to a
/// `ByteLedger` after decoding (the decoded batch, not the wire bytes, is what the
/// process holds): return this status when the charge is refused.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_core::{ByteLedger, Refused};
/// use admission_grpc::refused_status;
/// use tonic_types::StatusExt;
///
/// let decoded = ByteLedger::new(1 << 20)?;
/// let _busy = decoded.try_charge(1 << 20)?;
/// let status = decoded
///     .try_charge(4096)
///     .map_err(|refused| refused_status(refused, Duration::from_millis(500)))
///     .unwrap_err();
/// assert_eq!(status.code(), tonic::Code::ResourceExhausted);
/// assert_eq!(status.message(), "admission refused: byte budget exhausted");
/// assert_eq!(status.metadata().get("grpc-retry-pushback-ms").unwrap(), "500");
/// let retry = status.get_details_retry_info().unwrap();
/// assert_eq!(retry.retry_delay, Some(Duration::from_millis(500)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn refused_status(refused: Refused, retry_after: Duration) -> Status {
    status_with(RefusalCode::ResourceExhausted, refused, retry_after)
}

/// As [`refused_status`], with the code of your choice for retryable refusals.
///
/// ```
/// use std::time::Duration;
/// use admission_core::Refused;
/// use admission_grpc::{refused_status_with, RefusalCode};
///
/// let status = refused_status_with(RefusalCode::Unavailable, Refused::Count, Duration::from_secs(1));
/// assert_eq!(status.code(), tonic::Code::Unavailable);
/// // A request too large is never worth retrying: no RetryInfo, and always RESOURCE_EXHAUSTED.
/// let status = refused_status_with(RefusalCode::Unavailable, Refused::TooLarge, Duration::from_secs(1));
/// assert_eq!(status.code(), tonic::Code::ResourceExhausted);
/// assert!(status.metadata().get("grpc-retry-pushback-ms").is_none());
/// // A closed (draining) server is going away: always UNAVAILABLE, with the pushback.
/// let status = refused_status_with(RefusalCode::ResourceExhausted, Refused::Closed, Duration::from_secs(1));
/// assert_eq!(status.code(), tonic::Code::Unavailable);
/// assert!(status.metadata().get("grpc-retry-pushback-ms").is_some());
/// ```
pub fn refused_status_with(code: RefusalCode, refused: Refused, retry_after: Duration) -> Status {
    status_with(code, refused, retry_after)
}

fn status_with(code: RefusalCode, refused: Refused, retry_after: Duration) -> Status {
    let message = format!("admission refused: {refused}");
    // The one mapping (admission-http's): a closed server is `UNAVAILABLE` whatever code
    // overload is given, a refusal no retry helps `RESOURCE_EXHAUSTED`.
    let overload = code.code() as u16;
    let code = Code::from(i32::from(grpc_code(Refusal::Refused(refused), overload)));
    if !refused.is_retryable() {
        return Status::new(code, message);
    }
    let details = ErrorDetails::with_retry_info(Some(retry_after));
    let mut status = Status::with_error_details(code, message, details);
    let pushback = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
    status
        .metadata_mut()
        .insert(RETRY_PUSHBACK_MS, MetadataValue::from(pushback));
    status
}

/// The `Status` for any refusal the layer can make: a refusal as
/// [`refused_status_with`], a malformed `Content-Length` as `INVALID_ARGUMENT`.
pub(crate) fn refusal_status(code: RefusalCode, cx: &RefusalContext<'_>) -> Status {
    match cx.refusal {
        Refusal::Refused(refused) => status_with(code, refused, cx.retry_delay.unwrap_or_default()),
        other => Status::new(Code::InvalidArgument, format!("admission refused: {other}")),
    }
}

/// The `Status` a request body refused while it streams fails with (its reader, tonic,
/// finds it in the error's source chain).
pub(crate) fn body_status(code: RefusalCode, cx: &BodyRefusalContext) -> Status {
    status_with(code, cx.refused, cx.retry_delay.unwrap_or_default())
}

/// The trailers-only response for a refusal: HTTP 200, `content-type: application/grpc`,
/// and the status in the headers of a response with no body.
pub(crate) fn trailers_only(code: RefusalCode, cx: &RefusalContext<'_>) -> http::Response<Bytes> {
    let mut response: http::Response<Bytes> = refusal_status(code, cx).into_http();
    // `into_http` records the status in the extensions too; a refusal needs only headers.
    response.extensions_mut().clear();
    response
}
