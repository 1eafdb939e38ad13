//! The response body of [`Admission`](crate::Admission), and how it keeps the minimum
//! send rate under any server.
//!
//! A response handed to the server waits on its client until the server asks the body
//! for its next frame: hyper asks only once what it was handed has gone into its buffers,
//! which it does only as the client takes it (an h2 window with room, a socket that
//! drains). So a body that keeps the rate has a [`SendPace`]: it hands each frame out in
//! pieces the client could take at the minimum rate within its patience. Between polls
//! it keeps its permits and its pace parked in [`PARKED`], until its patience runs out
//! while it waits on the client, for as long as it likes while it waits on its own source
//! (the handler's stream: that time is never the client's). Asked in time, it takes them
//! back; not asked, the sweep releases them, and the body ends in [`Stalled`] when next
//! polled. (Parked between polls, the body itself stays small: every response, paced or
//! not, is moved whole through the server.)

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::error::Stalled;
use crate::pacer::{Pacer, PacerId};
use crate::permit::AdmissionPermit;
use crate::send_pace::SendPace;
use crate::stalls::{Registry, Ticket};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where paced response bodies keep their permits between polls.
static PARKED: Registry<Paced> = Registry::new(Paced::stalled);

pin_project! {
    /// The response body of [`Admission`](crate::Admission): the inner body holding the
    /// request's permits until it ends, the inner body of a bypassed request, or a
    /// refusal's small body.
    ///
    /// It keeps the layer's minimum send rate
    /// ([`SlowClients::min_response_rate`](crate::SlowClients::min_response_rate)): a
    /// response the server is not asked to send on within its allowance (its client
    /// does not take it) gives its permits back at once, and ends in a [`Stalled`] error
    /// when next polled. Its errors are boxed: the inner body's, or `Stalled`.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        // Holding nothing (a bypassed or uncounted request): the body as it is.
        Passed { #[pin] body: B },
        // Holding the request's permits until the body ends.
        Held {
            #[pin]
            body: B,
            hold: Hold,
        },
        // Empty once sent (and for a refusal without a body).
        Refused { bytes: Bytes },
    }
}

/// What a held body holds: its permits, or, if it keeps the minimum send rate, its
/// permits and pace parked between polls.
enum Hold {
    Here(AdmissionPermit),
    Parked(Parked),
    Released,
}

/// A paced body's permits and pace, what is left of the frame it hands out, and where
/// a stall is counted.
struct Paced {
    permit: AdmissionPermit,
    pace: SendPace,
    left: Bytes,
    pacer: Arc<Pacer>,
}

impl Paced {
    /// The sweep found it past its allowance: counted, and released.
    fn stalled(self) {
        self.pacer.stalled();
    }
}

/// What a body parked in [`PARKED`]; dropped, it is taken out and released.
struct Parked {
    ticket: Option<Ticket>,
    /// The bytes of a frame still to hand out (parked with the pace): the body is not at
    /// its end while there are any.
    left: u64,
}

impl Parked {
    /// Takes it back, unless the sweep released it.
    fn take(&mut self) -> Option<Paced> {
        PARKED.unpark(&self.ticket.take()?)
    }

    fn holds(&self) -> bool {
        self.ticket
            .as_ref()
            .is_some_and(|ticket| PARKED.holds(ticket))
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        drop(self.take());
    }
}

impl Hold {
    /// Parks a paced body's state until `due` (`None`: it waits on its own source, or on
    /// a client for longer than a clock counts).
    fn park(&mut self, paced: Paced, due: Option<Instant>) {
        let left = paced.left.len() as u64;
        let ticket = Some(PARKED.park(paced, due));
        *self = Hold::Parked(Parked { ticket, left });
    }

    /// The bytes of a frame still to hand out.
    fn left(&self) -> u64 {
        match self {
            Hold::Parked(parked) => parked.left,
            _ => 0,
        }
    }

    /// A paced body's state, taken back to be polled (`Ok(None)` for a body that is not
    /// paced); `Err` if the sweep released it first.
    fn unpark(&mut self) -> Result<Option<Paced>, Stalled> {
        let Hold::Parked(parked) = self else {
            return Ok(None);
        };
        let paced = parked.take();
        *self = Hold::Released;
        paced.map(Some).ok_or(Stalled)
    }

    fn holds(&self) -> bool {
        match self {
            Hold::Here(_) => true,
            Hold::Parked(parked) => parked.holds(),
            Hold::Released => false,
        }
    }

    /// The one place a held body lets its permits go before it is dropped: end of stream,
    /// an error, a frame after which the inner body reports its end, a client gone. (On
    /// drop, they go with it: parked ones are taken out first.)
    fn release(&mut self) {
        *self = Hold::Released;
    }
}

impl<B: Body> ResponseBody<B> {
    /// The service's body, holding `permit` (if any) until it ends.
    #[inline]
    pub(crate) fn new(body: B, permit: Option<AdmissionPermit>) -> Self {
        let kind = match permit {
            Some(permit) => {
                // A body with something to send waits on its client from now: the server
                // may never ask for it (hyper waits for room in an h2 window first). Under
                // `serve` too: its own rate for the stream may be off, or another.
                let pacer = if body.is_end_stream() {
                    None
                } else {
                    permit.pacer().and_then(PacerId::pacer)
                };
                let hold = match pacer {
                    Some(pacer) => {
                        let pace = SendPace::new(Some(pacer.rate()), Instant::now());
                        let due = pace.due();
                        let mut hold = Hold::Released;
                        let left = Bytes::new();
                        hold.park(
                            Paced {
                                permit,
                                pace,
                                left,
                                pacer,
                            },
                            due,
                        );
                        hold
                    }
                    None => Hold::Here(permit),
                };
                Kind::Held { body, hold }
            }
            None => Kind::Passed { body },
        };
        Self { kind }
    }
}

impl<B> ResponseBody<B> {
    /// The body of a request that holds nothing.
    #[inline]
    pub(crate) fn passed(body: B) -> Self {
        Self {
            kind: Kind::Passed { body },
        }
    }

    pub(crate) fn refused(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Refused { bytes },
        }
    }

    /// Whether this is a refusal's body.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::convert::Infallible;
    /// # type Body = http_body_util::Full<bytes::Bytes>;
    /// # let ok = tower::service_fn(|_: http::Request<admission_http::MeteredBody<Body>>| async {
    /// #     Ok::<_, Infallible>(http::Response::new(Body::default()))
    /// # });
    /// let layer = AdmissionLayer::builder().count(1).build()?;
    /// let service = layer.layer(ok);
    /// let held = service.clone().oneshot(http::Request::new(Body::default())).await?;
    /// let refused = service.oneshot(http::Request::new(Body::default())).await?;
    /// assert!(!held.body().is_refusal());
    /// assert!(refused.body().is_refusal());
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_refusal(&self) -> bool {
        matches!(self.kind, Kind::Refused { .. })
    }

    /// Whether this body still holds its request's permits (false once it has ended,
    /// and for bypassed requests and refusals).
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    /// use http_body_util::BodyExt;
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::convert::Infallible;
    /// # type Body = http_body_util::Full<bytes::Bytes>;
    /// # let ok = tower::service_fn(|_: http::Request<admission_http::MeteredBody<Body>>| async {
    /// #     Ok::<_, Infallible>(http::Response::new(Body::default()))
    /// # });
    /// let layer = AdmissionLayer::builder().count(1).build()?;
    /// let mut response = layer.layer(ok).oneshot(http::Request::new(Body::default())).await?;
    /// assert!(response.body().holds_permit());
    /// while response.body_mut().frame().await.is_some() {}
    /// assert!(!response.body().holds_permit(), "released at the end of the body");
    /// # Ok(())
    /// # }
    /// ```
    pub fn holds_permit(&self) -> bool {
        matches!(&self.kind, Kind::Held { hold, .. } if hold.holds())
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Passed { body } => body.poll_frame(cx).map_err(Into::into),
            KindProj::Held { body, hold } => poll_held(body, hold, cx),
            KindProj::Refused { bytes } => {
                let bytes = std::mem::take(bytes);
                Poll::Ready((!bytes.is_empty()).then(|| Ok(Frame::data(bytes.into()))))
            }
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Passed { body } => body.is_end_stream(),
            Kind::Held { body, hold } => hold.left() == 0 && body.is_end_stream(),
            Kind::Refused { bytes } => bytes.is_empty(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Passed { body } => body.size_hint(),
            Kind::Held { body, hold } => {
                // What it holds of a frame is still to come.
                let left = hold.left();
                let inner = body.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower().saturating_add(left));
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper.saturating_add(left));
                }
                hint
            }
            Kind::Refused { bytes } => SizeHint::with_exact(bytes.len() as u64),
        }
    }
}

/// A held body asked for its next frame.
fn poll_held<B>(
    mut body: Pin<&mut B>,
    hold: &mut Hold,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<B::Data>, BoxError>>>
where
    B: Body,
    B::Data: From<Bytes>,
    B::Error: Into<BoxError>,
{
    // Asked for more: what it handed out has gone on, if the client took it in time.
    let mut paced = match hold.unpark() {
        Ok(paced) => paced,
        Err(stalled) => return Poll::Ready(Some(Err(stalled.into()))),
    };
    let now = paced.as_ref().map(|_| Instant::now());
    if let (Some(paced), Some(now)) = (&mut paced, now) {
        paced.pace.asked(now);
    }
    // What the handler left of the request body is read on, so that a client who hangs
    // up is seen even while this body has nothing to send: then its permits go, and the
    // response ends (the server closes the connection).
    let permit = match (&paced, &*hold) {
        (Some(paced), _) => Some(&paced.permit),
        (None, Hold::Here(permit)) => Some(permit),
        _ => None,
    };
    // On an h2 stream `serve` paces, the last frame may still wait on the client once
    // handed over, and the stream polls the body to its end: the permits are held until
    // then.
    let until_none = permit.is_some_and(AdmissionPermit::served_stream);
    let unread = permit.and_then(AdmissionPermit::charge);
    if unread.is_some_and(|charge| charge.poll_unread(cx) == Poll::Ready(false)) {
        hold.release();
        return Poll::Ready(None);
    }
    let frame = match (&mut paced, now) {
        // The next piece of a frame in hand.
        (Some(paced), Some(now)) if !paced.left.is_empty() => {
            Frame::data(paced.pace.hand(&mut paced.left, now).into())
        }
        _ => match body.as_mut().poll_frame(cx) {
            Poll::Pending => {
                // Waiting on its own source, not on its client.
                if let Some(paced) = paced {
                    hold.park(paced, None);
                }
                return Poll::Pending;
            }
            Poll::Ready(None) => {
                hold.release();
                return Poll::Ready(None);
            }
            Poll::Ready(Some(Err(error))) => {
                hold.release();
                return Poll::Ready(Some(Err(error.into())));
            }
            Poll::Ready(Some(Ok(frame))) => match (&mut paced, now) {
                (Some(paced), Some(now)) => hand(paced, frame, now),
                _ => frame,
            },
        },
    };
    let left = paced.as_ref().map_or(0, |paced| paced.left.len());
    if !until_none && left == 0 && body.is_end_stream() {
        // Its last frame: a server that knows the length may never ask again.
        hold.release();
    } else if let Some(paced) = paced {
        let due = paced.pace.due();
        hold.park(paced, due);
    }
    Poll::Ready(Some(Ok(frame)))
}

/// Hands `frame` out at `now`: a data frame larger than the client could take in time,
/// a piece of it (the rest kept to hand out next).
fn hand<D: Buf + From<Bytes>>(paced: &mut Paced, frame: Frame<D>, now: Instant) -> Frame<D> {
    match frame.into_data() {
        Ok(mut data) if data.remaining() > paced.pace.piece() => {
            paced.left = data.copy_to_bytes(data.remaining());
            Frame::data(paced.pace.hand(&mut paced.left, now).into())
        }
        Ok(data) => {
            paced.pace.handed(data.remaining(), now);
            Frame::data(data)
        }
        // Trailers: the client must still take them.
        Err(trailers) => {
            paced.pace.handed(0, now);
            trailers
        }
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match (&self.kind, self.holds_permit()) {
            (Kind::Refused { .. }, _) => "refused",
            (_, true) => "admitted",
            (_, false) => "body",
        };
        f.debug_struct("ResponseBody")
            .field("kind", &kind)
            .field("holds_permit", &self.holds_permit())
            .finish()
    }
}
