//! Ready-made key extractors for [`AdmissionInterceptor::key`](crate::AdmissionInterceptor::key).

use admission_core::Key;
use tonic::metadata::MetadataMap;

/// The value of ASCII metadata entry `name` (an API key, a tenant), as a [`Key`]; `None`
/// when absent or empty. Copied into the key, so nothing is allocated per call and
/// nothing of the request is kept. (For the layer, which sees HTTP heads, use
/// `admission_http::key::header`: gRPC metadata are HTTP/2 headers.)
///
/// ```
/// use admission_core::Key;
/// use admission_grpc::key;
///
/// let by_key = key::metadata("x-api-key");
/// let mut request = tonic::Request::new(());
/// request.metadata_mut().insert("x-api-key", "k-123".parse().unwrap());
/// assert_eq!(by_key(request.metadata()), Some(Key::from("k-123")));
/// assert_eq!(by_key(tonic::Request::new(()).metadata()), None);
/// ```
pub fn metadata(name: &'static str) -> impl Fn(&MetadataMap) -> Option<Key> + Send + Sync {
    move |metadata| {
        let value = metadata.get(name)?.as_bytes();
        (!value.is_empty()).then(|| Key::from_bytes(value))
    }
}
