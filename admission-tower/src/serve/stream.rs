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
//! - [`Pace`] is the rule, with time passed in: each piece is what the client could
//!   take at the minimum rate within its patience (so an honest slow reader is never
//!   handed more than it can take in time), waits spend patience, pieces asked past
//!   earn it back at `1 / rate` a byte.
//! - The body (`TrackedBody` in `conn.rs`) keeps the pace and publishes when its
//!   stream must next ask, in a thread-local cell set while the stream is polled.
//! - [`StreamExecutor`] polls each stream hyper spawns with that cell set, and ends
//!   the stream when the time passes: hyper's stream future is dropped, h2 sends
//!   `RST_STREAM`, and the body with its permits goes.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use admission_http::MinDataRate;
use bytes::Bytes;
use pin_project_lite::pin_project;
use tokio::time::Instant;

use admission_http::Alarm;

/// The largest piece of a response handed to hyper at once: h2's default frame size.
const MAX_PIECE: usize = 16 * 1024;

/// The smallest piece (unless less is left): a client so slow that its patience is
/// worth less is handed this much, and must take it in time.
const MIN_PIECE: usize = 1024;

/// What a stream may bank: the time the bytes of h2's default window (64 KiB) earn at
/// the minimum rate, beyond the grace period. A client that takes a window at once and
/// then waits to open the next is kept if it keeps up on average; one that banks a
/// fast start holds its stream at most this long after it stops.
const MAX_BANKED: usize = 64 * 1024;

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
/// response made here is paced, and polled to its end or dropped. The layer's response
/// body asks, to hold its permits until then (not just until it has handed over its
/// last frame, which may still wait on the client).
#[inline]
pub(crate) fn in_stream() -> bool {
    STREAM.get().is_some()
}

/// Tells the stream's executor when the body must next be asked for a frame.
fn publish(due: Option<Instant>) {
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

/// A response's pace on its h2 stream: the rule of the minimum send rate, per stream.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pace {
    rate: Option<MinDataRate>,
    /// How much longer the stream may wait on the client: spent while a piece waits,
    /// earned back at `1 / rate` a byte asked past, at most `grace + MAX_BANKED / rate`.
    patience: Duration,
    /// Since when the last piece handed out has waited, and its size.
    waiting: Option<(Instant, usize)>,
}

impl Pace {
    /// A response whose head has gone out at `now`: it waits on the client from then,
    /// unless it has no body.
    pub(super) fn new(rate: Option<MinDataRate>, now: Instant, empty: bool) -> Self {
        let pace = Self {
            rate,
            patience: rate.map_or(Duration::ZERO, |rate| rate.grace()),
            waiting: (!empty).then_some((now, 0)),
        };
        publish(pace.due());
        pace
    }

    /// The stream asks for the next frame: what it was handed has gone on.
    pub(super) fn asked(&mut self, now: Instant) {
        if let (Some((since, bytes)), Some(rate)) = (self.waiting.take(), self.rate) {
            let banked = rate.grace().saturating_add(taking(MAX_BANKED, rate));
            self.patience = (self.patience)
                .saturating_sub(now.saturating_duration_since(since))
                .saturating_add(taking(bytes, rate))
                .min(banked);
        }
        publish(None);
    }

    /// Hands the next piece of `held` out at `now`.
    pub(super) fn hand(&mut self, held: &mut Bytes, now: Instant) -> Bytes {
        let piece = held.split_to(self.piece().min(held.len()));
        self.handed(piece.len(), now);
        piece
    }

    /// A frame of `bytes` (a trailer: 0) went out at `now`.
    pub(super) fn handed(&mut self, bytes: usize, now: Instant) {
        self.waiting = Some((now, bytes));
        publish(self.due());
    }

    /// The next piece's size: what the client could take at the minimum rate within
    /// its patience, between `MIN_PIECE` and `MAX_PIECE`.
    fn piece(&self) -> usize {
        match self.rate {
            Some(rate) => {
                // Whole milliseconds: a piece's size need not be finer.
                let millis = u64::try_from(self.patience.as_millis()).unwrap_or(u64::MAX);
                let takes = millis.saturating_mul(rate.bytes_per_second()) / 1_000;
                usize::try_from(takes)
                    .unwrap_or(MAX_PIECE)
                    .clamp(MIN_PIECE, MAX_PIECE)
            }
            None => MAX_PIECE,
        }
    }

    /// When the stream must have asked again, if it waits (and a rate is set, with a
    /// grace period a clock can count to). A millisecond late, so that the stream is
    /// then past its patience.
    fn due(&self) -> Option<Instant> {
        self.rate?;
        let (since, _) = self.waiting?;
        since.checked_add(self.patience.saturating_add(Duration::from_millis(1)))
    }
}

/// How long `bytes` (at most `MAX_BANKED`) take at `rate`.
fn taking(bytes: usize, rate: MinDataRate) -> Duration {
    // 64 KiB of nanoseconds fits in a u64 many times over: no wider division.
    Duration::from_nanos(bytes as u64 * 1_000_000_000 / rate.bytes_per_second())
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
            Some(at) if this.alarm.poll_at(cx, at.into_std()).is_ready() => Poll::Ready(()),
            _ => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use admission_http::{Alarm, MinDataRate};
    use bytes::Bytes;
    use tokio::time::Instant;

    use super::{MAX_PIECE, MIN_PIECE, Pace, Timed, in_stream, publish};

    fn rate() -> MinDataRate {
        MinDataRate::new(1_000, Duration::from_secs(2))
    }

    #[test]
    fn a_response_waits_from_its_head_unless_it_has_no_body() {
        let now = Instant::now();
        let pace = Pace::new(Some(rate()), now, false);
        assert!(pace.waiting.is_some());
        assert_eq!(pace.due(), Some(now + Duration::from_millis(2_001)));
        assert!(Pace::new(Some(rate()), now, true).waiting.is_none());
        assert_eq!(Pace::new(None, now, false).due(), None, "no rate: no time");
    }

    #[test]
    fn pieces_start_at_what_the_grace_takes_and_grow_as_they_are_asked_past() {
        let now = Instant::now();
        let mut pace = Pace::new(Some(rate()), now, false);
        pace.asked(now);
        let mut held = Bytes::from(vec![0; 1 << 20]);
        let sizes: Vec<usize> = (0..5)
            .map(|_| {
                let piece = pace.hand(&mut held, now).len();
                pace.asked(now);
                piece
            })
            .collect();
        assert_eq!(sizes, [2_000, 4_000, 8_000, 16_000, MAX_PIECE]);
        assert_eq!(held.len(), (1 << 20) - 30_000 - MAX_PIECE);
        let mut pace = Pace::new(None, now, false);
        assert_eq!(pace.hand(&mut held, now).len(), MAX_PIECE, "no rate");
    }

    #[test]
    fn waiting_spends_patience_and_a_piece_asked_past_earns_it_back() {
        let start = Instant::now();
        let mut pace = Pace::new(Some(rate()), start, false);
        // The first frame waited 1.5 s of its 2 s.
        let asked = start + Duration::from_millis(1_500);
        pace.asked(asked);
        assert_eq!(pace.patience, Duration::from_millis(500));
        assert_eq!(pace.due(), None, "asked: not waiting");
        assert_eq!(pace.piece(), MIN_PIECE, "500 ms is worth 500 bytes");
        let mut held = Bytes::from(vec![0; 10_000]);
        assert_eq!(pace.hand(&mut held, asked).len(), MIN_PIECE);
        assert_eq!(pace.due(), Some(asked + Duration::from_millis(501)));
        // Asked past after 200 ms: 1,024 bytes earn 1.024 s.
        pace.asked(asked + Duration::from_millis(200));
        assert_eq!(pace.patience, Duration::from_millis(1_324));
    }

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

    #[test]
    fn a_grace_period_beyond_the_clock_is_no_deadline_and_no_panic() {
        let now = Instant::now();
        let forever = MinDataRate::new(1, Duration::MAX);
        let mut pace = Pace::new(Some(forever), now, false);
        assert_eq!(pace.due(), None);
        pace.asked(now + Duration::from_secs(1));
        assert_eq!(pace.patience, Duration::MAX - Duration::from_secs(1));
        let mut held = Bytes::from_static(b"abc");
        assert_eq!(pace.hand(&mut held, now).len(), 3);
    }

    #[test]
    fn what_a_stream_banks_is_bounded() {
        let now = Instant::now();
        let mut pace = Pace::new(Some(rate()), now, false);
        let mut held = Bytes::from(vec![0; 1 << 20]);
        while !held.is_empty() {
            pace.hand(&mut held, now);
            pace.asked(now);
        }
        let banked = Duration::from_secs(2) + Duration::from_secs_f64(65_536.0 / 1_000.0);
        assert_eq!(pace.patience, banked);
    }
}
