//! A server on loopback for a test: a tower service on `127.0.0.1:0`, over HTTP/1.1 or
//! h2, or any server the test starts on a listener there, until the test's runtime ends.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;

use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// A service a test serves: one clone a connection, on tasks of their own.
pub trait Served<B>:
    tower::Service<
        Request<Incoming>,
        Response = Response<B>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S, B> Served<B> for S where
    S: tower::Service<
            Request<Incoming>,
            Response = Response<B>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// Serves `service` over HTTP/1.1 on `127.0.0.1:0` until the test's runtime ends.
pub async fn serve<S, B>(service: S) -> SocketAddr
where
    S: Served<B>,
    B: Body<Data: Send, Error: Into<Box<dyn std::error::Error + Send + Sync>>> + Send + 'static,
{
    serve_on(service, false).await
}

/// Serves `service` over HTTP/1.1, or HTTP/2 if `h2` (prior knowledge), on
/// `127.0.0.1:0` until the test's runtime ends.
pub async fn serve_on<S, B>(service: S, h2: bool) -> SocketAddr
where
    S: Served<B>,
    B: Body<Data: Send, Error: Into<Box<dyn std::error::Error + Send + Sync>>> + Send + 'static,
{
    spawn_server(move |listener| async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let io = TokioIo::new(stream);
                let _ = if h2 {
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, service)
                        .await
                } else {
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await
                };
            });
        }
    })
    .await
}

/// Binds `127.0.0.1:0` and runs the server `start` makes of the listener (`axum::serve`,
/// a layer's own `serve`, an accept loop of the test's own) on a task of its own until the
/// test's runtime ends; the address it serves on.
pub async fn spawn_server<F>(start: impl FnOnce(TcpListener) -> F) -> SocketAddr
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(start(listener));
    addr
}
