//! A gRPC call's refusal: trailers-only, as gRPC defines an error without a message.

use std::fmt::Write as _;

use admission_core::Refused;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response};

use crate::{Refusal, RefusalContext};

/// Whether a request is a gRPC call: `application/grpc`, alone or with a `+codec` or
/// parameters (gRPC-Web's `application/grpc-web` carries its status in the body: no).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(CONTENT_TYPE).is_some_and(|value| {
        value
            .as_bytes()
            .strip_prefix(b"application/grpc")
            .is_some_and(|rest| matches!(rest.first(), None | Some(b'+' | b';')))
    })
}

/// gRPC's `UNAVAILABLE`: a server that cannot take the call now; every client's retry
/// policy may retry it.
pub const UNAVAILABLE: u16 = 14;
/// gRPC's `RESOURCE_EXHAUSTED`: retried by clients only where the server says when
/// (`RetryInfo`, which the `admission-grpc` crate adds).
pub const RESOURCE_EXHAUSTED: u16 = 8;
/// gRPC's `INVALID_ARGUMENT`.
pub const INVALID_ARGUMENT: u16 = 3;

/// The gRPC status code a refused call is answered with: the one mapping every gRPC answer
/// of these crates follows (this crate's trailers-only responses with `overload` =
/// [`UNAVAILABLE`], `admission-grpc`'s statuses with its `RefusalCode`).
///
/// A closed (draining) server is `UNAVAILABLE`, which every client retries elsewhere; any
/// other retryable refusal is `overload`; a refusal no retry can help (a request too
/// large, a body too slow) is `RESOURCE_EXHAUSTED`; a malformed `Content-Length` is
/// `INVALID_ARGUMENT`.
///
/// ```
/// use admission_core::Refused;
/// use admission_http::{Refusal, grpc_code, RESOURCE_EXHAUSTED, UNAVAILABLE};
///
/// let count = Refusal::Refused(Refused::Count);
/// assert_eq!(grpc_code(count, RESOURCE_EXHAUSTED), RESOURCE_EXHAUSTED);
/// assert_eq!(grpc_code(count, UNAVAILABLE), UNAVAILABLE);
/// assert_eq!(grpc_code(Refusal::Refused(Refused::Closed), RESOURCE_EXHAUSTED), UNAVAILABLE);
/// assert_eq!(grpc_code(Refusal::Refused(Refused::TooLarge), UNAVAILABLE), RESOURCE_EXHAUSTED);
/// assert_eq!(grpc_code(Refusal::InvalidContentLength, UNAVAILABLE), 3);
/// ```
pub fn grpc_code(refusal: Refusal, overload: u16) -> u16 {
    match refusal {
        Refusal::Refused(Refused::Closed) => UNAVAILABLE,
        refusal if refusal.is_retryable() => overload,
        Refusal::Refused(_) => RESOURCE_EXHAUSTED,
        _ => INVALID_ARGUMENT,
    }
}

/// A gRPC call's refusal, as [`Refusals::respond`](crate::Refusals::respond) describes it.
pub(crate) fn grpc_trailers_only(cx: &RefusalContext<'_>) -> Response<Bytes> {
    // Without `RetryInfo`, a retryable refusal is the code clients retry unasked.
    let code = grpc_code(cx.refusal, UNAVAILABLE);
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(code));
    let message = percent_encoded(&format!("admission refused: {}", cx.refusal));
    if let Ok(message) = HeaderValue::from_str(&message) {
        headers.insert("grpc-message", message);
    }
    if let Some(delay) = cx.retry_delay {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        headers.insert("grpc-retry-pushback-ms", HeaderValue::from(millis));
    }
    if let Some(secs) = cx.retry_after {
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// `grpc-message`'s encoding: printable ASCII but `%` as it is, every other byte as `%XX`.
fn percent_encoded(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for &byte in text.as_bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            encoded.push(byte as char);
        } else {
            let _ = write!(encoded, "%{byte:02X}");
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::percent_encoded;

    #[test]
    fn grpc_messages_percent_encode_all_but_printable_ascii() {
        assert_eq!(percent_encoded("count limit: 5"), "count limit: 5");
        assert_eq!(percent_encoded("100%\n"), "100%25%0A");
        assert_eq!(percent_encoded("é~\u{7f}"), "%C3%A9~%7F");
    }
}
