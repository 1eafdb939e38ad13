//! Bounds on connections before any request exists: a cap on open connections, a time
//! to the first byte, and a minimum rate at which a client takes what the server has
//! to send. A listener sees connections and bytes, not where a request head ends or
//! whether a request is in flight: that is what it can bound, and all it can.

use std::fmt;
use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use admission_core::{CountLedger, CountPermit};
use admission_http::MinDataRate;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::SlowClients;

/// The connection bounds of a [`SlowClients`] policy, and the count of open connections.
#[derive(Debug, Clone)]
pub struct Connections {
    first_byte: Option<Duration>,
    send_rate: Option<MinDataRate>,
    open: CountLedger,
}

impl Connections {
    /// The bounds of `policy`, with a ledger of its own for the connection cap.
    ///
    /// ```
    /// use admission_tower::{Connections, SlowClients};
    ///
    /// let connections = Connections::new(SlowClients::default().with_max_connections(2));
    /// let first = connections.admit(()).expect("under the cap");
    /// let _second = connections.admit(()).expect("at the cap");
    /// assert!(connections.admit(()).is_none(), "over it: close the connection");
    /// drop(first);
    /// assert_eq!(connections.open(), 1);
    /// ```
    pub fn new(policy: SlowClients) -> Self {
        let open = CountLedger::new(policy.max_connections).unwrap_or_else(|_| {
            CountLedger::new(CountLedger::MAX_CAPACITY).expect("the maximum fits")
        });
        Self {
            first_byte: policy.first_byte,
            send_rate: policy.send_rate,
            open,
        }
    }

    /// Connections open now.
    ///
    /// ```
    /// use admission_tower::{Connections, SlowClients};
    ///
    /// assert_eq!(Connections::new(SlowClients::default()).open(), 0);
    /// ```
    pub fn open(&self) -> u64 {
        self.open.in_flight()
    }

    /// Guards an accepted connection `io`, or `None` if the cap is reached: drop `io` to
    /// close it.
    ///
    /// ```
    /// use admission_tower::{Connections, SlowClients};
    ///
    /// let connections = Connections::new(SlowClients::default());
    /// let guarded = connections.admit("an io").unwrap();
    /// assert_eq!(*guarded.get_ref(), "an io");
    /// assert_eq!(connections.open(), 1);
    /// ```
    pub fn admit<I>(&self, io: I) -> Option<GuardedIo<I>> {
        let permit = self.open.try_acquire().ok()?;
        let first_byte = self.first_byte.map(|within| Instant::now() + within);
        Some(GuardedIo {
            io,
            _permit: permit,
            first_byte,
            send_rate: self.send_rate,
            patience: self.send_rate.map_or(Duration::ZERO, |rate| rate.grace()),
            since: None,
            alarm: None,
        })
    }
}

pin_project! {
    /// A connection held to its [`Connections`] bounds: it errs with
    /// [`io::ErrorKind::TimedOut`] (and the server closes it) when it sent nothing in
    /// time, or when the client does not take what the server writes at the minimum
    /// rate. It holds a place under the connection cap until dropped.
    pub struct GuardedIo<I> {
        #[pin]
        io: I,
        _permit: CountPermit,
        // Until the first byte is read: when the connection must have sent it.
        first_byte: Option<Instant>,
        send_rate: Option<MinDataRate>,
        // How much longer writes may wait on the client: a bucket of at most the grace
        // period, spent while a write waits, earned back at `1 / rate` a byte the client
        // takes, and full again when a write is taken at once. And since when the write
        // in progress has waited.
        patience: Duration,
        since: Option<Instant>,
        alarm: Option<Pin<Box<Sleep>>>,
    }
}

impl<I> GuardedIo<I> {
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

/// Wakes the task at `at`; `Ready` once it has passed.
fn poll_alarm(alarm: &mut Option<Pin<Box<Sleep>>>, cx: &mut Context<'_>, at: Instant) -> Poll<()> {
    match alarm {
        Some(sleep) if sleep.deadline() == at => {}
        Some(sleep) => sleep.as_mut().reset(at),
        None => *alarm = Some(Box::pin(tokio::time::sleep_until(at))),
    }
    match alarm {
        Some(sleep) => sleep.as_mut().poll(cx),
        None => Poll::Pending,
    }
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
        if let Some(deadline) = *this.first_byte {
            match &read {
                Poll::Ready(Ok(())) if buf.filled().len() > before => *this.first_byte = None,
                Poll::Pending if poll_alarm(this.alarm, cx, deadline).is_ready() => {
                    return Poll::Ready(Err(timed_out("no request within the first-byte bound")));
                }
                _ => {}
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
        let Some(rate) = *this.send_rate else {
            return write;
        };
        let now = Instant::now();
        match &write {
            Poll::Ready(Ok(n)) => {
                let patience = match this.since.take() {
                    // A write that waited: the wait spent patience, what the client took
                    // in it earns some back.
                    Some(since) => {
                        let taken = *n as f64 / rate.bytes_per_second() as f64;
                        this.patience
                            .saturating_sub(now.saturating_duration_since(since))
                            + Duration::from_secs_f64(taken)
                    }
                    // Taken at once: the socket had room, the client keeps up.
                    None => rate.grace(),
                };
                *this.patience = patience.min(rate.grace());
            }
            Poll::Pending => {
                let since = *this.since.get_or_insert(now);
                let deadline = since + *this.patience + Duration::from_millis(1);
                if poll_alarm(this.alarm, cx, deadline).is_ready() {
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

#[cfg(feature = "axum")]
mod listener {
    use super::{Connections, GuardedIo};

    /// An axum listener that guards every connection it accepts ([`Connections`]).
    /// Made by `AdmissionLayer::guard`(crate::AdmissionLayer::guard).
    #[derive(Debug)]
    pub struct Guarded<L> {
        listener: L,
        connections: Connections,
    }

    impl<L> Guarded<L> {
        pub(crate) fn new(listener: L, connections: Connections) -> Self {
            Self {
                listener,
                connections,
            }
        }

        /// The bounds and the open-connection count.
        pub fn connections(&self) -> &Connections {
            &self.connections
        }
    }

    impl<L: axum::serve::Listener> axum::serve::Listener for Guarded<L> {
        type Io = GuardedIo<L::Io>;
        type Addr = L::Addr;

        async fn accept(&mut self) -> (Self::Io, Self::Addr) {
            loop {
                let (io, addr) = self.listener.accept().await;
                // Over the cap the connection is closed at once: shed, never queue.
                if let Some(io) = self.connections.admit(io) {
                    return (io, addr);
                }
            }
        }

        fn local_addr(&self) -> std::io::Result<Self::Addr> {
            self.listener.local_addr()
        }
    }
}

#[cfg(feature = "axum")]
pub use listener::Guarded;
