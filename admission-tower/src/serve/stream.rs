//! One h2 stream's response under `serve`: handed to hyper a piece at a time, and
//! reset when the client does not take it at the minimum send rate.
//!
//! On h2 a client that does not read leaves the socket writable: what stalls is h2's
//! flow control (a stream or connection window kept at 0, or opened a byte at a time),
//! which the connection's send-rate bound cannot see. So each stream is timed on its
//! own, from what hyper does with its body: hyper polls the body for the next frame
//! only once the previous one has gone into h2's send buffer, which it does only once
//! the client's window has room. A piece handed out and not asked past is a piece the
//! client is not taking.
//!
//! - [`SendPace`](crate::send_pace::SendPace) is the rule (the one every send-rate bound keeps):
//!   each piece is what the client could take at the minimum rate within its patience,
//!   waits spend patience, pieces asked past earn it back at `1 / rate` a byte.
//! - The body (`TrackedBody` in `request.rs`) keeps the pace and publishes when its
//!   stream must next ask, in a thread-local cell set while the stream is polled.
//! - [`StreamExecutor`] polls each stream hyper spawns with that cell set, and ends
//!   the stream when the time passes: hyper's stream future is dropped, h2 sends
//!   `RST_STREAM`, and the body with its permits goes.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use admission_http::Alarm;
use pin_project_lite::pin_project;

/// h2's send buffer for one stream: hyper asks the body for more only while less than
/// this is buffered (and within the client's window).
pub(super) const SEND_BUFFER: usize = 64 * 1024;

thread_local! {
    /// While an h2 stream's future is polled (`Some`): when its body must next be asked
    /// for a frame, if it waits on the client. `None` outside a stream. A `const`
    /// thread-local cell, not tokio's `task_local!`: the layer asks it for every
    /// response, and this costs it a load, not a lazily set-up `RefCell`.
    static STREAM: Cell<Option<Option<Instant>>> = const { Cell::new(None) };
}

/// Whether this code runs in an h2 stream that [`StreamExecutor`] spawned: then the
/// response made here is paced, and polled to its end or dropped. (The layer's response
/// body learns the same from the request's `ServedStream` extension.)
#[inline]
pub(crate) fn in_stream() -> bool {
    STREAM.get().is_some()
}

/// Tells the stream's executor when the body must next be asked for a frame.
pub(super) fn publish(due: Option<Instant>) {
    if in_stream() {
        STREAM.set(Some(due));
    }
}

/// A stream's future being polled: [`STREAM`] holds its due time until this is dropped,
/// and then what it held before (also if the poll panics).
struct Entered {
    outer: Option<Option<Instant>>,
}

impl Entered {
    fn enter(due: Option<Instant>) -> Self {
        Self {
            outer: STREAM.replace(Some(due)),
        }
    }

    /// The due time the poll left.
    fn due(&self) -> Option<Instant> {
        STREAM.get().flatten()
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        STREAM.set(self.outer);
    }
}

/// hyper's executor under `serve`: each h2 stream it spawns runs on a tokio task of its
/// own, ended when its response waits on the client past its pace.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct StreamExecutor;

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        tokio::spawn(Timed {
            future,
            due: None,
            alarm: Alarm::new(),
        });
    }
}

pin_project! {
    /// An h2 stream's future, ended when its body's due time passes.
    struct Timed<F> {
        #[pin]
        future: F,
        // When its body must next be asked for a frame, between polls.
        due: Option<Instant>,
        alarm: Alarm,
    }
}

impl<F: Future> Future for Timed<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        let entered = Entered::enter(*this.due);
        if this.future.poll(cx).is_ready() {
            return Poll::Ready(());
        }
        *this.due = entered.due();
        drop(entered);
        match *this.due {
            // Past it: the stream ends here, and its future (hyper's stream, the
            // response body and its permits) is dropped with this task.
            Some(at) if this.alarm.poll_at(cx, at).is_ready() => Poll::Ready(()),
            _ => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::{Duration, Instant};

    use admission_http::Alarm;

    use super::{Timed, in_stream, publish};

    #[tokio::test]
    async fn a_stream_knows_it_is_one_while_it_is_polled_and_only_then() {
        assert!(!in_stream());
        let (seen, due) = std::sync::mpsc::channel();
        let at = Instant::now() + Duration::from_secs(60);
        let mut timed = std::pin::pin!(Timed {
            future: std::future::poll_fn(|_| {
                seen.send(in_stream()).unwrap();
                publish(Some(at));
                Poll::<()>::Pending
            }),
            due: None,
            alarm: Alarm::new(),
        });
        assert!(futures_poll(timed.as_mut()).is_pending());
        assert_eq!(due.try_recv(), Ok(true), "in the stream");
        assert!(!in_stream(), "and not after it");
        assert_eq!(timed.due, Some(at), "its due time kept between polls");
    }

    /// Polls `future` once with a waker that does nothing.
    fn futures_poll<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
        future.poll(&mut Context::from_waker(std::task::Waker::noop()))
    }
}
