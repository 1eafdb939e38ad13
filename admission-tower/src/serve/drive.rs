//! The loop that drives one connection under `serve`: it ends the connection when a
//! bound passes with nothing in flight, gracefully when the server drains, and at once at
//! the shutdown's deadline.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use admission_http::Alarm;
use tokio::sync::watch;
use tokio::time::Instant;

use super::tracker::{Expiry, Tracker};
use crate::ConnectionLimits;

/// How long an idle connection closed gracefully may take to go (an h2 peer answering
/// the `GOAWAY`'s ping) before it is cut.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Where the server is in its life, as each connection sees it (through a `watch`
/// channel that holds the latest stage).
///
/// Why not `hyper_util::server::graceful`: it tells each connection once to finish
/// gracefully, then waits for all of them with no bound. A shutdown here has two steps,
/// a drain (finish what is in flight, take nothing new) and, at its deadline, a cut; and
/// each connection's own timers (the head and idle bounds, the h2 pings) act on which
/// step the server is at. A `watch` gives every connection the latest stage, one that
/// starts during the drain included, and wakes each at the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    Serving,
    /// Finish what is in flight, take nothing new, close.
    Draining,
    /// The shutdown's deadline: close now.
    Cut,
}

/// Drives `connection` until it ends, closing it when a bound of `limits` passes with
/// nothing in flight, gracefully when the server drains, and at once at the
/// shutdown's deadline.
pub(super) async fn drive<C: Future>(
    connection: C,
    graceful_shutdown: impl Fn(Pin<&mut C>),
    tracker: Arc<Tracker>,
    limits: ConnectionLimits,
    mut stage: watch::Receiver<Stage>,
) {
    let mut connection = pin!(connection);
    let mut timer = Alarm::new();
    // Set once the connection is closing gracefully: when it must be gone.
    let mut closing: Option<Instant> = None;
    let mut watching = true;
    if *stage.borrow_and_update() != Stage::Serving {
        return;
    }
    loop {
        let event = {
            let mut changed = pin!(stage.changed());
            poll_fn(|cx| {
                if connection.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Event::Ended);
                }
                if watching {
                    if let Poll::Ready(result) = changed.as_mut().poll(cx) {
                        return Poll::Ready(Event::Stage(result.is_ok()));
                    }
                }
                let due = match closing {
                    Some(at) => Some((at, Expiry::Cut)),
                    None => tracker.deadline(&limits, cx),
                };
                if let Some((at, expiry)) = due {
                    if timer.poll_at(cx, at.into_std()).is_ready() {
                        return Poll::Ready(Event::Due(expiry));
                    }
                }
                Poll::Pending
            })
            .await
        };
        match event {
            Event::Ended => return,
            Event::Stage(false) => watching = false,
            Event::Stage(true) => match *stage.borrow_and_update() {
                Stage::Serving => {}
                Stage::Draining => graceful_shutdown(connection.as_mut()),
                Stage::Cut => return,
            },
            Event::Due(Expiry::Cut) => return,
            Event::Due(Expiry::Idle) => {
                graceful_shutdown(connection.as_mut());
                closing = Some(Instant::now() + CLOSE_GRACE);
            }
        }
    }
}

enum Event {
    Ended,
    /// The stage changed (`true`), or the server is gone (`false`).
    Stage(bool),
    Due(Expiry),
}
