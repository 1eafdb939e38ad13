//! Ready-made key extractors for per-key limits: functions of a request's head that give
//! an [`admission_core::Key`], allocating nothing and keeping nothing of the request.

use std::net::IpAddr;

use admission_core::Key;
use http::header::HeaderName;
use http::request::Parts;

/// The value of header `name`, as a [`Key`]; `None` (no key: the per-key limit does not
/// apply) when the header is absent or empty. The first value counts when there are
/// several.
///
/// The value is copied into the key (at most [`Key::INLINE`] bytes, a digest beyond),
/// so the key neither allocates nor keeps the request's buffer alive.
///
/// ```
/// use admission_core::Key;
/// use admission_http::key;
///
/// let by_tenant = key::header(http::HeaderName::from_static("x-tenant"));
/// let (head, _) = http::Request::get("/").header("x-tenant", "t1").body(())?.into_parts();
/// assert_eq!(by_tenant(&head), Some(Key::from("t1")));
/// let (bare, _) = http::Request::get("/").body(())?.into_parts();
/// assert_eq!(by_tenant(&bare), None);
/// # Ok::<(), http::Error>(())
/// ```
pub fn header(name: HeaderName) -> impl Fn(&Parts) -> Option<Key> + Send + Sync + 'static {
    move |parts| {
        let value = parts.headers.get(&name)?.as_bytes();
        (!value.is_empty()).then(|| Key::from_bytes(value))
    }
}

/// The client's IP address, read from a connection-info extension of type `T` that the
/// server puts in every request, by `ip`: with axum, `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info`); with hyper, whatever the accept loop inserts.
/// `None` when the extension is missing.
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use admission_core::Key;
/// use admission_http::key;
///
/// // axum: key::peer_ip(|info: &axum::extract::ConnectInfo<SocketAddr>| info.0.ip())
/// let by_peer = key::peer_ip(|addr: &SocketAddr| addr.ip());
/// let mut request = http::Request::get("/").body(())?;
/// let peer: SocketAddr = "192.0.2.7:50123".parse()?;
/// request.extensions_mut().insert(peer);
/// let (head, _) = request.into_parts();
/// assert_eq!(by_peer(&head), Some(Key::from(peer.ip())));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn peer_ip<T, F>(ip: F) -> impl Fn(&Parts) -> Option<Key> + Send + Sync + 'static
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> IpAddr + Send + Sync + 'static,
{
    move |parts| parts.extensions.get::<T>().map(|info| Key::from(ip(info)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_header_is_no_key_and_only_the_first_value_counts() {
        let by = header(HeaderName::from_static("x-k"));
        let (head, _) = http::Request::get("/")
            .header("x-k", "")
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(by(&head), None);
        let (head, _) = http::Request::get("/")
            .header("x-k", "a")
            .header("x-k", "b")
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(by(&head), Some(Key::from("a")));
    }

    #[test]
    fn a_missing_extension_is_no_key() {
        let by = peer_ip(|addr: &std::net::SocketAddr| addr.ip());
        let (head, _) = http::Request::get("/").body(()).unwrap().into_parts();
        assert_eq!(by(&head), None);
    }
}
