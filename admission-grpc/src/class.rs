//! The priority-class convention for gRPC: a caller states its call's class in metadata
//! [`METADATA`] (`x-request-class: sheddable`), by a class name of the server's
//! [`Classes`] table; the server reads it with
//! [`AdmissionInterceptor::priority`](crate::AdmissionInterceptor::priority) and
//! [`metadata`], or, behind the tower layer, with `admission_tower::class::header`
//! (metadata are HTTP/2 headers: the same entry).
//!
//! A class stated by the caller is the caller's word: honour it from your own services
//! and gateways, and strip or overwrite it at the edge for everyone else.

use admission_core::{Classes, Priority};
use tonic::metadata::{AsciiMetadataValue, MetadataMap};

/// The metadata key of the convention (the same name as `admission_http::class::HEADER`).
pub const METADATA: &str = "x-request-class";

/// States `class` as the call's class, on the client side: sets [`METADATA`].
///
/// # Errors
///
/// `class` is not a valid ASCII metadata value (the request is unchanged).
///
/// ```
/// let mut request = tonic::Request::new(());
/// admission_grpc::class::set(&mut request, "sheddable")?;
/// assert_eq!(request.metadata().get("x-request-class").unwrap(), "sheddable");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn set<T>(
    request: &mut tonic::Request<T>,
    class: &str,
) -> Result<(), tonic::metadata::errors::InvalidMetadataValue> {
    let value = AsciiMetadataValue::try_from(class)?;
    request.metadata_mut().insert(METADATA, value);
    Ok(())
}

/// The class a call states in [`METADATA`] (matched exactly against `classes`' names), or
/// `fallback` when it states none or one `classes` does not have. For
/// [`AdmissionInterceptor::priority`](crate::AdmissionInterceptor::priority).
///
/// ```
/// use admission_core::{Classes, Priority};
///
/// let classify = admission_grpc::class::metadata(&Classes::standard(), Priority::DEFAULT);
/// let mut request = tonic::Request::new(());
/// admission_grpc::class::set(&mut request, "critical")?;
/// assert_eq!(classify(request.metadata()), Priority::CRITICAL);
/// assert_eq!(classify(tonic::Request::new(()).metadata()), Priority::DEFAULT);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn metadata(
    classes: &Classes,
    fallback: Priority,
) -> impl Fn(&MetadataMap) -> Priority + Send + Sync + 'static + use<> {
    let classes = classes.clone();
    move |metadata| {
        metadata
            .get(METADATA)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| classes.get(value))
            .unwrap_or(fallback)
    }
}
