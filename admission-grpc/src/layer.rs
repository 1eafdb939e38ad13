//! The admission layer with gRPC-shaped refusals.

use std::hash::{BuildHasher, Hash};

use admission_tower::AdmissionBuilder;
use http::request::Parts;

use crate::status::{body_status, trailers_only, RefusalCode};

/// gRPC refusals for [`AdmissionBuilder`]: the same gate and service as for HTTP, with
/// a trailers-only gRPC response instead of 503 / 429 / 413.
///
/// A refused call gets HTTP 200, `content-type: application/grpc`, `grpc-status: 8`
/// (`RESOURCE_EXHAUSTED`), a percent-encoded `grpc-message` naming the refusing
/// dimension, `grpc-retry-pushback-ms` from the builder's `retry_after`, and
/// `grpc-status-details-bin` carrying a `google.rpc.RetryInfo` with that delay. A
/// tonic client sees `Code::ResourceExhausted`. (A bare HTTP 503 reaches a gRPC client as
/// `UNAVAILABLE` and loses the server's meaning; and OTLP exporters retry
/// `RESOURCE_EXHAUSTED` only when `RetryInfo` says the server will recover.)
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
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_grpc::{is_health_check, GrpcAdmission};
/// use admission_tower::AdmissionLayer;
///
/// let layer = AdmissionLayer::builder()
///     .count(256)
///     .retry_after(Duration::from_millis(500))
///     .bypass(is_health_check)
///     .grpc()
///     .build()?;
/// // tonic::transport::Server::builder().layer(layer).add_service(...)
/// # drop(layer);
/// # Ok::<(), admission_tower::BuildError>(())
/// ```
pub trait GrpcAdmission: Sized {
    /// Refuse with trailers-only `RESOURCE_EXHAUSTED` and `RetryInfo`.
    ///
    /// ```
    /// use admission_grpc::GrpcAdmission;
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(4).grpc().build()?;
    /// assert_eq!(layer.gate().count().capacity(), 4);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    fn grpc(self) -> Self {
        self.grpc_with(RefusalCode::ResourceExhausted)
    }

    /// Refuse with trailers-only gRPC responses of the given code (`UNAVAILABLE` for
    /// clients whose retry policy lists only that code). A request too large is always
    /// `RESOURCE_EXHAUSTED`, without `RetryInfo`.
    ///
    /// ```
    /// use admission_grpc::{GrpcAdmission, RefusalCode};
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(4).grpc_with(RefusalCode::Unavailable).build()?;
    /// assert_eq!(layer.gate().count().capacity(), 4);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    fn grpc_with(self, code: RefusalCode) -> Self;
}

impl<K, H> GrpcAdmission for AdmissionBuilder<K, H>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    fn grpc_with(self, code: RefusalCode) -> Self {
        self.refusal_response(move |cx| trailers_only(code, cx))
            .body_error(move |cx| Box::new(body_status(code, cx)))
    }
}

/// Whether a call is to the standard health service, `grpc.health.v1.Health`: pass it to
/// [`AdmissionBuilder::bypass`] so health checks are never shed (a load balancer would
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
