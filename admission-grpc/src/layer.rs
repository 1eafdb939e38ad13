//! The admission layer with gRPC-shaped refusals.

use admission_tower::Refusals;
use http::request::Parts;

use crate::status::{RefusalCode, body_status, trailers_only};

/// gRPC refusals, for [`AdmissionBuilder::refusals`]: the same gate and service as for
/// HTTP, with a trailers-only gRPC response instead of 503 / 429 / 413.
///
/// A refused call gets HTTP 200, `content-type: application/grpc`, `grpc-status: 8`
/// (`RESOURCE_EXHAUSTED`), a percent-encoded `grpc-message` naming the refusing
/// dimension, `grpc-retry-pushback-ms` from the value's `retry_after`, and
/// `grpc-status-details-bin` carrying a `google.rpc.RetryInfo` with that delay. A
/// tonic client sees `Code::ResourceExhausted`. (A bare HTTP 503 reaches a gRPC client as
/// `UNAVAILABLE` and loses the server's meaning; and OTLP exporters retry
/// `RESOURCE_EXHAUSTED` only when `RetryInfo` says the server will recover.)
///
/// It is a [`Refusals`] like any: set its `retry_after` and `retry_jitter` on it. (Its
/// shape is the whole response: a `body` set on it afterwards would replace the gRPC
/// shape with an HTTP one.)
///
/// Permits are held until the response stream ends, so server-streaming calls stay
/// bounded for as long as they stream.
///
/// A request body is refused while it streams when it has no length to charge up front,
/// as every tonic client's: with a byte budget or a maximum request size, the refusal
/// comes as the message arrives. The call is then answered the same way: if the handler
/// has not answered yet (unary, server-streaming and client-streaming calls: tonic
/// decodes the request before the handler answers), its answer to the failed body is
/// replaced by the trailers-only refusal; if it has (a bidirectional stream that sent
/// its response head first), the body error it reads carries the refusal's
/// `tonic::Status`, so a handler that propagates it (`?`) ends the stream with that
/// status, pushback and `RetryInfo` included. A request too large is
/// `RESOURCE_EXHAUSTED` without a retry hint in every case.
///
/// ```
/// use std::time::Duration;
/// use admission_grpc::is_health_check;
/// use admission_tower::AdmissionLayer;
///
/// let layer = AdmissionLayer::builder()
///     .count(256)
///     .bypass(is_health_check)
///     .refusals(admission_grpc::refusals().retry_after(Duration::from_millis(500)))
///     .build()?;
/// // tonic::transport::Server::builder().layer(layer).add_service(...)
/// # drop(layer);
/// # Ok::<(), admission_tower::BuildError>(())
/// ```
///
/// [`AdmissionBuilder::refusals`]: admission_tower::AdmissionBuilder::refusals
pub fn refusals() -> Refusals {
    refusals_with(RefusalCode::ResourceExhausted)
}

/// gRPC refusals of the given code (`UNAVAILABLE` for clients whose retry policy lists
/// only that code), as [`refusals`] makes them. A request too large is always
/// `RESOURCE_EXHAUSTED`, without `RetryInfo`.
///
/// ```
/// use admission_grpc::RefusalCode;
/// use admission_tower::AdmissionLayer;
///
/// let layer = AdmissionLayer::builder()
///     .count(4)
///     .refusals(admission_grpc::refusals_with(RefusalCode::Unavailable))
///     .build()?;
/// assert_eq!(layer.gate().count().capacity(), 4);
/// # Ok::<(), admission_tower::BuildError>(())
/// ```
pub fn refusals_with(code: RefusalCode) -> Refusals {
    Refusals::new()
        .response(move |cx| trailers_only(code, cx))
        .body_error(move |cx| Box::new(body_status(code, cx)))
}

/// Whether a call is to the standard health service, `grpc.health.v1.Health`: pass it to
/// `AdmissionBuilder::bypass` so health checks are never shed (a load balancer would
/// evict an instance that is still serving).
///
/// ```
/// use admission_grpc::is_health_check;
///
/// let (check, _) = http::Request::post("/grpc.health.v1.Health/Check").body(())?.into_parts();
/// let (work, _) = http::Request::post("/pkg.Service/Work").body(())?.into_parts();
/// assert!(is_health_check(&check));
/// assert!(!is_health_check(&work));
/// # Ok::<(), http::Error>(())
/// ```
pub fn is_health_check(request: &Parts) -> bool {
    request.uri.path().starts_with("/grpc.health.v1.Health/")
}
