//! A request under `serve`: counted in its connection's tracker from its call to its
//! response body's end, its response handed to hyper a piece at a time at the pace the
//! client takes it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use admission_http::MinDataRate;
use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::stream;
use super::tracker::Tracker;
use crate::pacer::ServedStream;
use crate::send_pace::SendPace;

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
        // Each h2 stream runs on a task the stream executor polls: the layer's response
        // body learns it from here, rather than from the executor's thread-local.
        if request.version() == http::Version::HTTP_2 {
            request.extensions_mut().insert(ServedStream);
        }
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
                let pace = stream::in_stream().then(|| {
                    let mut pace = SendPace::new(send_rate, now());
                    if body.is_end_stream() {
                        // Nothing to send: nothing waits on the client.
                        pace.asked(now());
                    }
                    stream::publish(pace.due());
                    pace
                });
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
        pace: Option<SendPace>,
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
        let now = now();
        pace.asked(now);
        stream::publish(None);
        if this.held.is_empty() {
            match std::task::ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => *this.held = data,
                    Err(trailers) => {
                        pace.handed(0, now);
                        stream::publish(pace.due());
                        return Poll::Ready(Some(Ok(trailers)));
                    }
                },
                end => return Poll::Ready(end),
            }
        }
        let piece = pace.hand(this.held, now);
        stream::publish(pace.due());
        Poll::Ready(Some(Ok(Frame::data(piece))))
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

/// The clock streams are timed by: tokio's (so a paused test clock holds for them too).
fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

#[cfg(test)]
mod paced_tests {
    use std::pin::pin;
    use std::time::Duration;

    use admission_http::MinDataRate;
    use bytes::Bytes;
    use http_body::Body;
    use http_body_util::{BodyExt, Full};

    use super::{SendPace, TrackedBody, now};

    /// A response body paced as on an h2 stream, its inner body `bytes` long.
    fn paced(bytes: usize) -> TrackedBody<Full<Bytes>> {
        let rate = MinDataRate::new(1_000, Duration::from_secs(1));
        TrackedBody {
            inner: Full::new(Bytes::from(vec![7; bytes])),
            held: Bytes::new(),
            pace: Some(SendPace::new(Some(rate), now())),
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
