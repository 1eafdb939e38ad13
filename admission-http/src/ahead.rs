//! `ReadAhead`: a request body read ahead of its handler, so that a client who hangs up
//! is seen while nothing else reads the connection.

use std::collections::VecDeque;
use std::fmt;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};

/// A request body read ahead of its handler, up to a bound, while the request waits.
///
/// A server such as hyper reads a connection only as far as someone reads the request
/// body: while a request waits for admission with its body still to come, nothing does,
/// and a client that hangs up (or resets the connection) is not seen until the wait
/// ends. Polled while the request waits, `ReadAhead` reads the body's frames into a
/// buffer, up to `limit` data bytes (the last frame read may take it beyond, by at most
/// one frame: one read of the server's buffer), and reports a body that fails: that is
/// what a server makes of a client gone mid-body. A body read to its end leaves the
/// connection to the server, which then sees a hang-up by itself.
///
/// Once the request is admitted, [`split`](Self::split) gives back the body and what was
/// read of it, for [`MeteredBody::replay`](crate::MeteredBody::replay): the handler reads
/// every frame, in order, as if nothing had been read ahead.
///
/// What it does not see: a client that hangs up after the buffer filled (its body is no
/// longer read), and one whose request asked to be told to send its body
/// (`Expect: 100-continue`: reading would tell it to; leave such a body unread).
///
/// ```
/// use admission_http::ReadAhead;
/// use http_body_util::{BodyExt, StreamBody};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<bytes::Bytes>, std::io::Error>>(4);
/// let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
/// let mut ahead = ReadAhead::new(body, 1024);
/// tx.send(Ok(http_body::Frame::data(bytes::Bytes::from("hello")))).await?;
///
/// let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// assert!(ahead.poll_failed(&mut cx).is_pending(), "read, and the client is still there");
/// assert_eq!(ahead.read(), 5);
///
/// tx.send(Err(std::io::Error::other("connection reset"))).await?;
/// assert!(ahead.poll_failed(&mut cx).is_ready(), "the client is gone");
/// # Ok(())
/// # }
/// ```
pub struct ReadAhead<B: Body> {
    body: B,
    frames: VecDeque<Frame<B::Data>>,
    read: u64,
    limit: u64,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Reading,
    /// Read to `limit`: left unread from here on.
    Full,
    /// Read to its end.
    Ended,
    /// Failed: its client is gone (or sent what is not a body).
    Failed,
}

impl<B: Body + Unpin> ReadAhead<B> {
    /// Reads `body` ahead, up to `limit` data bytes, as [`poll_failed`](Self::poll_failed)
    /// is polled.
    ///
    /// ```
    /// use admission_http::ReadAhead;
    ///
    /// let ahead = ReadAhead::new(http_body_util::Full::new(bytes::Bytes::from("abc")), 16);
    /// assert_eq!(ahead.read(), 0, "nothing is read before it is polled");
    /// ```
    pub fn new(body: B, limit: u64) -> Self {
        let state = if body.is_end_stream() {
            State::Ended
        } else {
            State::Reading
        };
        Self {
            body,
            frames: VecDeque::new(),
            read: 0,
            limit,
            state,
        }
    }

    /// Reads what has come, up to the limit: `Ready(())` once the body has failed (its
    /// client hung up or reset, or sent what is not a body), `Pending` otherwise, also
    /// after the body ended or the limit was reached (the task is woken when more comes,
    /// while it reads).
    ///
    /// ```
    /// use admission_http::ReadAhead;
    ///
    /// let mut ahead = ReadAhead::new(http_body_util::Full::new(bytes::Bytes::from("abc")), 16);
    /// let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    /// assert!(ahead.poll_failed(&mut cx).is_pending(), "read to its end: nothing failed");
    /// assert!(ahead.ended());
    /// assert_eq!(ahead.read(), 3);
    /// ```
    pub fn poll_failed(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        // A few frames a call, then yield: a client that sends fast cannot hold the task.
        for _ in 0..16 {
            if self.state == State::Reading && self.read >= self.limit {
                self.state = State::Full;
            }
            if self.state != State::Reading {
                return match self.state {
                    State::Failed => Poll::Ready(()),
                    _ => Poll::Pending,
                };
            }
            match std::pin::Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => self.state = State::Ended,
                Poll::Ready(Some(Err(_))) => self.state = State::Failed,
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        self.read = self.read.saturating_add(data.remaining() as u64);
                    }
                    self.frames.push_back(frame);
                    if self.body.is_end_stream() {
                        self.state = State::Ended;
                    }
                }
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<B: Body> ReadAhead<B> {
    /// Data bytes read ahead so far.
    ///
    /// ```
    /// use admission_http::ReadAhead;
    ///
    /// let ahead = ReadAhead::new(http_body_util::Empty::<bytes::Bytes>::new(), 16);
    /// assert_eq!(ahead.read(), 0);
    /// ```
    pub fn read(&self) -> u64 {
        self.read
    }

    /// Whether the body was read to its end.
    ///
    /// ```
    /// use admission_http::ReadAhead;
    ///
    /// let ahead = ReadAhead::new(http_body_util::Empty::<bytes::Bytes>::new(), 16);
    /// assert!(ahead.ended(), "an empty body has nothing to read");
    /// ```
    pub fn ended(&self) -> bool {
        self.state == State::Ended
    }

    /// The body, and what was read of it, to replay first
    /// ([`MeteredBody::replay`](crate::MeteredBody::replay)).
    ///
    /// ```
    /// use admission_http::{MeteredBody, ReadAhead};
    /// use http_body_util::BodyExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut ahead = ReadAhead::new(http_body_util::Full::new(bytes::Bytes::from("hello")), 2);
    /// let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    /// let _ = ahead.poll_failed(&mut cx);
    /// let (body, read) = ahead.split();
    /// let replayed = MeteredBody::unmetered(body).replay(read).collect().await.unwrap().to_bytes();
    /// assert_eq!(replayed, "hello");
    /// # Ok(())
    /// # }
    /// ```
    pub fn split(self) -> (B, ReadFrames<B>) {
        let read = ReadFrames {
            frames: self.frames,
            read: self.read,
            ended: self.state == State::Ended,
            body: PhantomData,
        };
        (self.body, read)
    }
}

impl<B: Body> fmt::Debug for ReadAhead<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadAhead")
            .field("read", &self.read)
            .field("limit", &self.limit)
            .field("state", &self.state)
            .finish()
    }
}

/// The frames a [`ReadAhead`] read of its body, to be given first to whoever reads the
/// body next ([`MeteredBody::replay`](crate::MeteredBody::replay)).
pub struct ReadFrames<B: Body> {
    frames: VecDeque<Frame<B::Data>>,
    read: u64,
    /// The body was read to its end: nothing follows these frames.
    ended: bool,
    body: PhantomData<fn() -> B>,
}

impl<B: Body> fmt::Debug for ReadFrames<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadFrames")
            .field("frames", &self.frames.len())
            .field("read", &self.read)
            .field("ended", &self.ended)
            .finish()
    }
}

/// [`ReadFrames`] with its body type erased but for the frames' type, so that a body
/// type with no bound (`MeteredBody<B>`) can hold them.
pub(crate) trait Replay<B>: Send + Sync {
    /// The next frame read ahead, if any is left.
    fn next(&mut self) -> Option<Frame<B::Data>>
    where
        B: Body;

    /// Whether the body had ended: nothing follows these frames.
    fn ended(&self) -> bool;

    /// Whether frames are left.
    fn is_empty(&self) -> bool;

    /// Data bytes left.
    fn remaining(&self) -> u64;
}

impl<B: Body> Replay<B> for ReadFrames<B>
where
    B::Data: Send + Sync,
{
    fn next(&mut self) -> Option<Frame<B::Data>> {
        let frame = self.frames.pop_front()?;
        if let Some(data) = frame.data_ref() {
            self.read -= data.remaining() as u64;
        }
        Some(frame)
    }

    fn ended(&self) -> bool {
        self.ended
    }

    fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    fn remaining(&self) -> u64 {
        self.read
    }
}

/// The size hint of a body of which `remaining` data bytes read ahead are still to come,
/// then `inner` unless the body had `ended`.
pub(crate) fn size_hint(remaining: u64, ended: bool, inner: SizeHint) -> SizeHint {
    if ended {
        return SizeHint::with_exact(remaining);
    }
    let mut hint = SizeHint::new();
    hint.set_lower(inner.lower().saturating_add(remaining));
    if let Some(upper) = inner.upper() {
        hint.set_upper(upper.saturating_add(remaining));
    }
    hint
}
