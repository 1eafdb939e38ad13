//! What `serve` accepts connections from, and what it does with one before HTTP.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::ClientAddress;

/// Where [`AdmissionLayer::serve`](crate::AdmissionLayer::serve) takes connections
/// from: tokio's TCP and Unix listeners, or one of your own.
///
/// `accept` should return as soon as the kernel hands over a connection, and do
/// nothing slow: a TLS handshake belongs in [`Serve::handshake`](crate::serve::Serve::handshake),
/// where it runs on the connection's own task under the head bound, rather than here,
/// where one stalled client would hold up every other.
pub trait Listener: Send + 'static {
    /// The connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The client's address, put in each request's extensions (and, with the `axum`
    /// feature, as `axum::extract::ConnectInfo<Addr>`).
    type Addr: ClientAddress;

    /// The next connection. Errors that say nothing of the listener (a client that
    /// reset before it was accepted) are skipped; others (out of file descriptors) are
    /// retried after a pause. It never fails: the server keeps serving.
    fn accept(&mut self) -> impl Future<Output = (Self::Io, Self::Addr)> + Send;

    /// The address listened on.
    fn local_addr(&self) -> io::Result<Self::Addr>;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match tokio::net::TcpListener::accept(self).await {
                Ok(accepted) => return accepted,
                Err(error) => pause_after(error).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        tokio::net::TcpListener::local_addr(self)
    }
}

#[cfg(unix)]
impl Listener for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    type Addr = tokio::net::unix::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match tokio::net::UnixListener::accept(self).await {
                Ok(accepted) => return accepted,
                Err(error) => pause_after(error).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        tokio::net::UnixListener::local_addr(self)
    }
}

/// After a failed accept: on at once if it concerned one connection only, after a
/// second otherwise (running out of file descriptors, where retrying at once spins).
async fn pause_after(error: io::Error) {
    use io::ErrorKind::*;
    if !matches!(
        error.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What is done with an accepted connection before HTTP is spoken on it: nothing
/// ([`Plain`]), or a TLS handshake, as any `Fn(Io) -> impl Future<Output =
/// io::Result<Io2>>` closure (`move |io| acceptor.accept(io)` with tokio-rustls). It
/// runs on the connection's task, under the head bound.
pub trait Handshake<I>: Clone + Send + Sync + 'static {
    /// The connection after the handshake.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The handshake.
    fn handshake(&self, io: I) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

/// No handshake: HTTP on the accepted connection as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain;

impl<I: AsyncRead + AsyncWrite + Unpin + Send + 'static> Handshake<I> for Plain {
    type Io = I;
    async fn handshake(&self, io: I) -> io::Result<I> {
        Ok(io)
    }
}

impl<I, F, Fut, O> Handshake<I> for F
where
    F: Fn(I) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = io::Result<O>> + Send,
    O: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Io = O;
    fn handshake(&self, io: I) -> impl Future<Output = io::Result<O>> + Send {
        self(io)
    }
}
