//! How a metered body is read: its frames (replayed ones first), paced and charged.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use admission_core::Refused;
use bytes::Buf;
use http_body::{Body, Frame, SizeHint};

use super::{MeteredBody, TAKEN};
use crate::BoxError;
use crate::ahead::{self, Replay};
use crate::pace;

/// What a poll of body `B` gives.
type Polled<B> = Poll<Option<Result<Frame<<B as Body>::Data>, <B as Body>::Error>>>;

/// The next frame of a body of which `replay` (if any) was read ahead: those frames first,
/// then the body's own.
#[inline]
fn poll_source<B: Body>(
    inner: Pin<&mut B>,
    replay: &mut Option<Box<dyn Replay<B>>>,
    cx: &mut Context<'_>,
) -> Polled<B> {
    if let Some(ahead) = replay {
        if let Some(frame) = ahead.next() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if ahead.ended() {
            return Poll::Ready(None);
        }
        *replay = None;
    }
    inner.poll_frame(cx)
}

impl<B> Body for MeteredBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let inner = this.inner.as_mut().as_pin_mut().expect(TAKEN);
        let Some(meter) = this.meter.as_mut() else {
            // Unmetered: the inner body, as it is.
            return inner.poll_frame(cx).map_err(Into::into);
        };
        let meter = meter.as_mut().project();
        let replay = meter.replay;
        let Some(charge) = meter.charge.as_ref() else {
            // Replayed, not metered.
            return poll_source(inner, replay, cx).map_err(Into::into);
        };
        if charge.refused().is_some() {
            return Poll::Ready(None);
        }
        let Some(mut pace) = meter.pace.as_pin_mut() else {
            return match poll_source(inner, replay, cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.data_ref() {
                    Some(data) => {
                        let seen = charge.saw(data.remaining() as u64);
                        match charge.cover(seen, seen) {
                            Ok(()) => Poll::Ready(Some(Ok(frame))),
                            Err(refused) => Poll::Ready(Some(Err(Box::new(refused)))),
                        }
                    }
                    None => Poll::Ready(Some(Ok(frame))),
                },
                other => other.map_err(Into::into),
            };
        };
        let mut now = pace::now();
        match poll_source(inner, replay, cx) {
            Poll::Pending => {
                pace.as_mut().waiting(now);
                loop {
                    if pace.too_slow(now) {
                        let refused = charge.refuse(Refused::TooSlow);
                        return Poll::Ready(Some(Err(Box::new(refused))));
                    }
                    // Give back what the body's pace no longer earns.
                    charge.give_back(pace.reservation(now));
                    let holds_ahead = charge.covered() > pace.received;
                    match pace.as_mut().poll_alarm(cx, now, holds_ahead) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(()) => now = pace::now(),
                    }
                }
            }
            Poll::Ready(Some(Ok(frame))) => {
                let data = frame.data_ref().map_or(0, |data| data.remaining() as u64);
                if pace.too_slow(now) {
                    // Late (without a timer, nothing cut it while it waited).
                    let refused = charge.refuse(Refused::TooSlow);
                    return Poll::Ready(Some(Err(Box::new(refused))));
                }
                pace.as_mut().arrived(now, data);
                if data > 0 {
                    let seen = charge.saw(data);
                    if let Err(refused) = charge.cover(seen, pace.reservation(now)) {
                        return Poll::Ready(Some(Err(Box::new(refused))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            other => other.map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.failed() {
            return true;
        }
        match self.replayed() {
            Some(replay) if !replay.is_empty() => false,
            Some(replay) if replay.ended() => true,
            _ => self.get_ref().is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        if self.failed() {
            return SizeHint::with_exact(0);
        }
        let inner = self.get_ref().size_hint();
        match self.replayed() {
            Some(replay) => ahead::size_hint(replay.remaining(), replay.ended(), inner),
            None => inner,
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for MeteredBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MeteredBody")
            .field("inner", &self.inner)
            .field("seen", &self.seen())
            .field("metered", &self.meter.is_some())
            .finish()
    }
}
