//! One connection's life under `serve`: what it has in flight, and the timers that
//! end it when it holds a place doing nothing.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use admission_http::MinDataRate;
use bytes::Bytes;
use http::{Request, Response, Version};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::stream::{self, Pace};
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
    fn begin(&self, version: Version) {
        let mut track = self.lock();
        track.in_flight += 1;
        track.requests += 1;
        track.h2 = version >= Version::HTTP_2;
        track.head = false;
        self.between.store(false, Ordering::Relaxed);
    }

    /// A request is over (its response body ended or was dropped).
    fn end(&self) {
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

/// A request in flight on its connection, from its complete head until its response
/// body ends or is dropped.
#[derive(Debug)]
struct InFlight(Arc<Tracker>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// The user's service on one connection: each request counted in flight, and given
/// its client's address; on h2, each response handed to hyper at its stream's pace.
#[derive(Debug, Clone)]
pub(super) struct Tracked<S, A> {
    inner: S,
    tracker: Arc<Tracker>,
    address: A,
    send_rate: Option<MinDataRate>,
}

impl<S, A> Tracked<S, A> {
    pub(super) fn new(
        inner: S,
        tracker: Arc<Tracker>,
        address: A,
        send_rate: Option<MinDataRate>,
    ) -> Self {
        Self {
            inner,
            tracker,
            address,
            send_rate,
        }
    }
}

impl<S, A, B, RB> Service<Request<B>> for Tracked<S, A>
where
    S: Service<Request<B>, Response = Response<RB>>,
    A: Clone + Send + Sync + 'static,
    RB: Body,
{
    type Response = Response<TrackedBody<RB>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        self.tracker.begin(request.version());
        let extensions = request.extensions_mut();
        #[cfg(feature = "axum")]
        extensions.insert(axum::extract::ConnectInfo(self.address.clone()));
        extensions.insert(self.address.clone());
        TrackedFuture {
            inner: self.inner.call(request),
            in_flight: Some(InFlight(self.tracker.clone())),
            send_rate: self.send_rate,
        }
    }
}

pin_project! {
    /// The response future of a [`Tracked`] service.
    pub(super) struct TrackedFuture<F> {
        #[pin]
        inner: F,
        in_flight: Option<InFlight>,
        send_rate: Option<MinDataRate>,
    }
}

impl<F, RB, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
    RB: Body,
{
    type Output = Result<Response<TrackedBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx));
        let in_flight = this.in_flight.take();
        let send_rate = *this.send_rate;
        Poll::Ready(response.map(|response| {
            response.map(|body| {
                // An h2 stream's response (hyper runs each on a task of its own, which
                // the stream executor times); HTTP/1.x's is timed at the socket.
                let pace = stream::in_stream()
                    .then(|| Pace::new(send_rate, Instant::now(), body.is_end_stream()));
                TrackedBody {
                    inner: body,
                    held: Bytes::new(),
                    pace,
                    _in_flight: in_flight,
                }
            })
        }))
    }
}

pin_project! {
    /// A response body that keeps its request in flight until it ends or is dropped;
    /// on h2, handed to hyper a piece at a time at its stream's pace.
    pub(super) struct TrackedBody<B> {
        #[pin]
        inner: B,
        // What is left of the inner body's last data frame (h2).
        held: Bytes,
        pace: Option<Pace>,
        _in_flight: Option<InFlight>,
    }
}

impl<B: Body<Data = Bytes>> Body for TrackedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        let Some(pace) = this.pace.as_mut() else {
            return this.inner.poll_frame(cx);
        };
        let now = Instant::now();
        pace.asked(now);
        if this.held.is_empty() {
            match std::task::ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => *this.held = data,
                    Err(trailers) => {
                        pace.handed(0, now);
                        return Poll::Ready(Some(Ok(trailers)));
                    }
                },
                end => return Poll::Ready(end),
            }
        }
        Poll::Ready(Some(Ok(Frame::data(pace.hand(this.held, now)))))
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        // What it holds of a frame is still to come.
        let (inner, held) = (self.inner.size_hint(), self.held.len() as u64);
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + held);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + held);
        }
        hint
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
        drop(InFlight(tracker.clone()));
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

#[cfg(test)]
mod paced_tests {
    use std::pin::pin;
    use std::time::Duration;

    use admission_http::MinDataRate;
    use bytes::Bytes;
    use http_body::Body;
    use http_body_util::{BodyExt, Full};
    use tokio::time::Instant;

    use super::{Pace, TrackedBody};

    /// A response body paced as on an h2 stream, its inner body `bytes` long.
    fn paced(bytes: usize) -> TrackedBody<Full<Bytes>> {
        let rate = MinDataRate::new(1_000, Duration::from_secs(1));
        TrackedBody {
            inner: Full::new(Bytes::from(vec![7; bytes])),
            held: Bytes::new(),
            pace: Some(Pace::new(Some(rate), Instant::now(), false)),
            _in_flight: None,
        }
    }

    #[tokio::test]
    async fn a_paced_body_hands_its_frame_over_in_pieces_and_ends_after_the_last() {
        let mut body = pin!(paced(10_000));
        assert_eq!(body.size_hint().exact(), Some(10_000));
        let mut pieces = Vec::new();
        while let Some(frame) = body.frame().await {
            pieces.push(frame.unwrap().into_data().unwrap().len());
            let left = 10_000 - pieces.iter().sum::<usize>() as u64;
            assert_eq!(body.size_hint().exact(), Some(left), "what it holds counts");
            assert_eq!(body.is_end_stream(), left == 0);
        }
        assert!(pieces.len() > 1 && pieces.iter().all(|&n| n <= 16 * 1024));
        assert_eq!(pieces.iter().sum::<usize>(), 10_000);
    }

    #[tokio::test]
    async fn an_unpaced_body_passes_its_frames_whole() {
        let mut body = pin!(TrackedBody {
            pace: None,
            ..paced(10_000)
        });
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap().len(), 10_000);
        assert!(body.is_end_stream());
    }
}
