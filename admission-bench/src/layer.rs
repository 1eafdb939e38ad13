//! Drives a tower service through one whole call: `poll_ready`, `call`, poll the future
//! to its response, and drop the response (so a permit's whole life is inside).

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Empty, Full};

/// One whole call of `service`, with a default request body.
///
/// # Panics
///
/// If the service is not ready at once or its future is not ready at its first poll:
/// the benches measure ready services only.
#[inline]
pub fn drive<S, B>(service: &mut S, cx: &mut Context<'_>)
where
    S: tower::Service<Request<B>>,
    S::Error: std::fmt::Debug,
    B: Default,
{
    // Written out, not through `respond`: the instruction targets measure this, and
    // calling the helper (inlined or not) moves it by some 80 instructions a call.
    match service.poll_ready(cx) {
        Poll::Ready(Ok(())) => {}
        _ => panic!("the service is always ready"),
    }
    let future = pin!(service.call(Request::new(B::default())));
    match future.poll(cx) {
        Poll::Ready(Ok(response)) => drop(black_box(response)),
        _ => panic!("the response is ready at once"),
    }
}

/// One whole call of `service` with `request`, as [`drive`] makes it.
///
/// # Panics
///
/// As [`drive`].
#[inline]
pub fn drive_request<S, B>(service: &mut S, request: Request<B>, cx: &mut Context<'_>)
where
    S: tower::Service<Request<B>>,
    S::Error: std::fmt::Debug,
{
    match service.poll_ready(cx) {
        Poll::Ready(Ok(())) => {}
        _ => panic!("the service is always ready"),
    }
    let future = pin!(service.call(request));
    match future.poll(cx) {
        Poll::Ready(Ok(response)) => drop(black_box(response)),
        _ => panic!("the response is ready at once"),
    }
}

/// One whole call of `service` as [`drive`] makes it, and its response body polled to its
/// end before it is dropped.
///
/// # Panics
///
/// As [`drive`], and if the body is not ready at once or fails.
#[inline]
pub fn drive_to_end<S, B, RB>(service: &mut S, cx: &mut Context<'_>)
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Error: std::fmt::Debug,
    B: Default,
    RB: http_body::Body,
{
    let mut body = pin!(respond(service, cx).into_body());
    loop {
        match body.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => drop(black_box(frame)),
            Poll::Ready(None) => break,
            _ => panic!("the body is ready at once and does not fail"),
        }
    }
}

/// The response of one call of `service`, ready at once.
#[inline]
fn respond<S, B>(service: &mut S, cx: &mut Context<'_>) -> S::Response
where
    S: tower::Service<Request<B>>,
    S::Error: std::fmt::Debug,
    B: Default,
{
    match service.poll_ready(cx) {
        Poll::Ready(Ok(())) => {}
        _ => panic!("the service is always ready"),
    }
    let future = pin!(service.call(Request::new(B::default())));
    match future.poll(cx) {
        Poll::Ready(Ok(response)) => response,
        _ => panic!("the response is ready at once"),
    }
}

/// A ready handler: 1 KiB for any request.
#[inline(never)]
pub fn kib<B>(_: Request<B>) -> Ready<Result<Response<Full<Bytes>>, Infallible>> {
    ready(Ok(Response::new(Full::new(Bytes::from_static(&[7; 1024])))))
}

/// A ready handler: an empty 200 for any request.
///
/// Never inlined: a real handler is not inlined into the layers around it, and whether
/// LLVM inlines this one (and then copies the request once more) otherwise changes from
/// build to build with unrelated code, moving a variant's instruction count by about 35.
#[inline(never)]
pub fn ok<B>(_: Request<B>) -> Ready<Result<Response<Empty<Bytes>>, Infallible>> {
    ready(Ok(Response::new(Empty::new())))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Waker;

    use super::*;

    #[test]
    fn a_drive_is_one_call_and_a_service_that_is_not_ready_is_refused() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let mut service = tower::service_fn(move |request: Request<Empty<Bytes>>| {
            counted.fetch_add(1, Ordering::Relaxed);
            ok(request)
        });
        let mut cx = Context::from_waker(Waker::noop());
        drive(&mut service, &mut cx);
        drive(&mut service, &mut cx);
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        // A handler that is not ready at once has no place in these benches.
        let mut pending = tower::service_fn(|_: Request<Empty<Bytes>>| {
            std::future::pending::<Result<Response<Empty<Bytes>>, Infallible>>()
        });
        let unready = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            drive(&mut pending, &mut cx)
        }));
        assert!(unready.is_err());
    }
}
