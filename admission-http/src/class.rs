//! Ready-made priority classifiers: functions of a request's head that name its class in
//! a [`Classes`] table, for `AdmissionBuilder::priority` in `admission-tower`.

use admission_core::{Classes, Priority};
use http::header::HeaderName;
use http::request::Parts;

/// The conventional header in which a caller states its request's class, by name
/// (`x-request-class: sheddable`). gRPC callers send it as metadata of the same name
/// (gRPC metadata are HTTP/2 headers); `admission-grpc` has the client half.
///
/// A class stated by the caller is the caller's word: honour it from callers you trust
/// (your own services, a gateway that sets it), and strip or overwrite it at the edge
/// for everyone else, or a client could make all its traffic critical.
pub const HEADER: HeaderName = HeaderName::from_static("x-request-class");

/// The class named by header `name` (the first value; matched exactly against the names
/// in the layer's `classes`, which the classifier is given), or `fallback` when the header
/// is absent or names no class. Nothing is allocated per request.
///
/// ```
/// use admission_core::{Classes, Priority};
/// use admission_http::class;
///
/// let classes = Classes::standard();
/// let classify = class::header(class::HEADER, Priority::DEFAULT);
/// let (head, _) = http::Request::get("/").header("x-request-class", "sheddable").body(())?.into_parts();
/// assert_eq!(classify(&head, &classes), Priority::SHEDDABLE);
/// let (bare, _) = http::Request::get("/").body(())?.into_parts();
/// assert_eq!(classify(&bare, &classes), Priority::DEFAULT);
/// let (odd, _) = http::Request::get("/").header("x-request-class", "urgent!").body(())?.into_parts();
/// assert_eq!(classify(&odd, &classes), Priority::DEFAULT);
/// # Ok::<(), http::Error>(())
/// ```
pub fn header(
    name: HeaderName,
    fallback: Priority,
) -> impl Fn(&Parts, &Classes) -> Priority + Send + Sync + 'static {
    move |parts, classes| {
        parts
            .headers
            .get(&name)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| classes.get(value))
            .unwrap_or(fallback)
    }
}
