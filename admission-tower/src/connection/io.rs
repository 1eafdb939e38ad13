//! `GuardedIo`: a connection held to its first-byte and send-rate bounds, and to its
//! places under the connection caps.

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use admission_core::{CountPermit, KeyedPermit};
use admission_http::{Alarm, MinDataRate};
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use admission_http::Patience;

/// A connection's places: under the cap on open connections and under its address's.
pub(super) type Places = (CountPermit, Option<KeyedPermit<IpAddr>>);

pin_project! {
    /// A connection held to its [`Connections`](super::Connections) bounds: it errs with
    /// [`io::ErrorKind::TimedOut`] (and the server closes it) when it sent nothing in
    /// time, or when the client does not take what the server writes at the minimum
    /// rate. It holds its places under the connection caps until dropped.
    pub struct GuardedIo<I> {
        #[pin]
        io: I,
        _places: Places,
        // Until the first byte is read: when the connection must have sent it.
        first_byte: Option<Instant>,
        // How much longer writes may wait on the client: the grace period at most, spent
        // while a write waits, earned back at `1 / rate` a byte the client takes, and full
        // again when a write is taken at once.
        send_rate: Option<Patience>,
        alarm: Alarm,
        // Told of every read that brought bytes (`serve`: a next request head begins).
        on_read: Option<OnRead>,
    }
}

/// What a connection's reads tell (see [`GuardedIo::watch_reads`]).
pub(crate) type OnRead = Arc<dyn Fn() + Send + Sync>;

impl<I> GuardedIo<I> {
    pub(super) fn new(
        io: I,
        places: Places,
        first_byte: Option<Instant>,
        send_rate: Option<MinDataRate>,
    ) -> Self {
        Self {
            io,
            _places: places,
            first_byte,
            send_rate: send_rate.map(|rate| Patience::new(rate, 0)),
            alarm: Alarm::new(),
            on_read: None,
        }
    }

    /// Calls `on_read` after every read that brings bytes.
    #[cfg_attr(not(feature = "serve"), allow(dead_code))]
    pub(crate) fn watch_reads(&mut self, on_read: OnRead) {
        self.on_read = Some(on_read);
    }

    /// The connection.
    pub fn get_ref(&self) -> &I {
        &self.io
    }

    /// The connection, mutably.
    pub fn get_mut(&mut self) -> &mut I {
        &mut self.io
    }
}

impl<I: fmt::Debug> fmt::Debug for GuardedIo<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedIo")
            .field("io", &self.io)
            .finish_non_exhaustive()
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what.to_owned())
}

impl<I: AsyncRead> AsyncRead for GuardedIo<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let read = this.io.poll_read(cx, buf);
        if buf.filled().len() > before {
            *this.first_byte = None;
            if let Some(on_read) = this.on_read {
                on_read();
            }
        } else if let (Some(deadline), Poll::Pending) = (*this.first_byte, &read) {
            if this.alarm.poll_at(cx, deadline.into_std()).is_ready() {
                return Poll::Ready(Err(timed_out("no request within the first-byte bound")));
            }
        }
        read
    }
}

impl<I: AsyncWrite> AsyncWrite for GuardedIo<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let write = this.io.poll_write(cx, data);
        let Some(patience) = this.send_rate else {
            return write;
        };
        let now = Instant::now().into_std();
        match &write {
            // Taken at once: the socket had room, the client keeps up.
            Poll::Ready(Ok(_)) if !patience.waiting() => {
                patience.fill();
            }
            // A write that waited: the wait spent patience, what the client took in it
            // earns some back.
            Poll::Ready(Ok(n)) => patience.moved(now, *n as u64),
            Poll::Pending => {
                patience.wait(now);
                // A grace period past what the clock can count to is no deadline.
                if (patience.due()).is_some_and(|at| this.alarm.poll_at(cx, at).is_ready()) {
                    return Poll::Ready(Err(timed_out(
                        "the client does not read at the minimum rate",
                    )));
                }
            }
            Poll::Ready(Err(_)) => {}
        }
        write
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
        // One buffer at a time keeps the stall accounting in one place.
        let first = bufs
            .iter()
            .find(|buf| !buf.is_empty())
            .map_or(&[][..], |buf| &**buf);
        self.poll_write(cx, first)
    }
}
