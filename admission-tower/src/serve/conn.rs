//! One connection's life under `serve`: what it has in flight, and the timers that
//! end it when it holds a place doing nothing.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::Version;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

use crate::ConnectionLimits;
use crate::connection::poll_alarm;

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

/// What one connection has in flight, shared by its task, its requests and its reads.
#[derive(Debug)]
pub(super) struct Tracker {
    state: Mutex<Track>,
    /// Set while the connection is idle between HTTP/1.1 requests: the next byte read
    /// starts a head. Read on every read, so that a busy connection never locks.
    between: AtomicBool,
}

#[derive(Debug)]
struct Track {
    in_flight: usize,
    requests: u64,
    h2: bool,
    /// Since when the connection has been idle, or its next head under way.
    since: Instant,
    /// A byte of a next HTTP/1.1 head has come.
    head: bool,
    /// The connection's task, woken when its last request ends elsewhere (h2 streams
    /// run on tasks of their own).
    task: Option<Waker>,
}

/// What a connection's timer does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// A head not complete in time: close at once.
    Cut,
    /// Idle: close gracefully.
    Idle,
}

impl Tracker {
    pub(super) fn new(accepted: Instant) -> Self {
        Self {
            state: Mutex::new(Track {
                in_flight: 0,
                requests: 0,
                h2: false,
                since: accepted,
                head: false,
                task: None,
            }),
            between: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Track> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A request head is complete.
    pub(super) fn begin(&self, version: Version) {
        let mut track = self.lock();
        track.in_flight += 1;
        track.requests += 1;
        track.h2 = version >= Version::HTTP_2;
        track.head = false;
        self.between.store(false, Ordering::Relaxed);
    }

    /// A request is over (its response body ended or was dropped).
    pub(super) fn end(&self) {
        let mut track = self.lock();
        track.in_flight -= 1;
        if track.in_flight == 0 {
            track.since = Instant::now();
            self.between.store(!track.h2, Ordering::Relaxed);
            if let Some(task) = track.task.take() {
                task.wake();
            }
        }
    }

    /// Bytes were read.
    fn read(&self) {
        if self.between.swap(false, Ordering::Relaxed) {
            let mut track = self.lock();
            if track.in_flight == 0 && !track.head {
                track.head = true;
                track.since = Instant::now();
            }
        }
    }

    /// When the connection's timer fires, and what it does then; registers `cx`'s task
    /// to be woken when the last request ends.
    fn deadline(&self, limits: &ConnectionLimits, cx: &Context<'_>) -> Option<(Instant, Expiry)> {
        let mut track = self.lock();
        if track.in_flight > 0 {
            match &track.task {
                Some(task) if task.will_wake(cx.waker()) => {}
                _ => track.task = Some(cx.waker().clone()),
            }
            return None;
        }
        let head = limits
            .head_within
            .map(|within| (track.since + within, Expiry::Cut));
        let idle = limits.idle.map(|idle| (track.since + idle, Expiry::Idle));
        if track.requests == 0 || track.head {
            // The first head counts from the accept; a later one from its first byte.
            // Both are idle time too.
            [head, idle].into_iter().flatten().min_by_key(|(at, _)| *at)
        } else {
            idle
        }
    }
}

pin_project! {
    /// A connection whose reads tell its tracker that a next head has begun.
    pub(super) struct Watched<I> {
        #[pin]
        io: I,
        tracker: Arc<Tracker>,
    }
}

impl<I> Watched<I> {
    pub(super) fn new(io: I, tracker: Arc<Tracker>) -> Self {
        Self { io, tracker }
    }
}

impl<I: AsyncRead> AsyncRead for Watched<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let read = this.io.poll_read(cx, buf);
        if buf.filled().len() > before {
            this.tracker.read();
        }
        read
    }
}

impl<I: AsyncWrite> AsyncWrite for Watched<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().io.poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().io.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
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
    let mut timer: Option<Pin<Box<Sleep>>> = None;
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
                    if poll_alarm(&mut timer, cx, at).is_ready() {
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    use super::*;

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_request_ending_elsewhere_wakes_its_connection_to_time_it_idle() {
        let limits = ConnectionLimits::default();
        let tracker = Arc::new(Tracker::new(Instant::now()));
        let woken = Arc::new(Count::default());
        let waker = Waker::from(woken.clone());
        let cx = Context::from_waker(&waker);
        let first_head = tracker.deadline(&limits, &cx).unwrap();
        assert_eq!(
            first_head.1,
            Expiry::Cut,
            "the head bound comes before the idle one"
        );

        tracker.begin(Version::HTTP_2);
        assert_eq!(tracker.deadline(&limits, &cx), None, "busy: no timer");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let ended = Instant::now();
        tracker.end(); // as its request's `InFlight` does when dropped
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        let (at, expiry) = tracker.deadline(&limits, &cx).unwrap();
        let idle = limits.idle.unwrap();
        assert!(at >= ended + idle && at <= Instant::now() + idle);
        assert_eq!(expiry, Expiry::Idle);
        // h2: bytes read while idle (pings, settings) start no head.
        tracker.read();
        assert_eq!(tracker.deadline(&limits, &cx).unwrap().1, Expiry::Idle);
    }
}
