//! A real hyper server on loopback behind the layer, a hyper client, and a test app
//! whose routes hold their responses open until the test says so.

// Each test file uses part of this module, and test helpers need no docs.
#![allow(dead_code, unreachable_pub, missing_docs)]

#[allow(unused_imports)] // Not every test file uses each.
pub use admission_testkit::{eventually, holds_within, serve, serve_on};

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use admission_http::MeteredBody;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// A response body fed by the test through a channel; ends when the sender drops.
#[derive(Debug)]
pub struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl ChannelBody {
    pub fn new(rx: mpsc::Receiver<Bytes>) -> Self {
        Self { rx }
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

/// Either a fixed body or a channel-fed stream.
pub type AppBody = http_body_util::Either<Full<Bytes>, ChannelBody>;

/// What the app saw, for assertions.
#[derive(Debug, Default)]
pub struct Seen {
    pub calls: AtomicUsize,
    pub bodies_read: AtomicUsize,
    pub body_errors: AtomicUsize,
    /// Senders of open `/stream` responses, in arrival order.
    pub streams: Mutex<Vec<mpsc::Sender<Bytes>>>,
    pub closed: AtomicBool,
}

impl Seen {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Ends every open stream (their bodies end when the senders drop).
    pub fn end_streams(&self) {
        self.streams.lock().unwrap().clear();
    }
}

/// The inner service: `/stream` answers 200 at once with a body that stays open;
/// `/upload` reads the whole body; anything else answers "ok".
pub fn app(
    seen: Arc<Seen>,
) -> impl tower::Service<
    Request<MeteredBody<Incoming>>,
    Response = Response<AppBody>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<AppBody>, Infallible>> + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |req: Request<MeteredBody<Incoming>>| {
        let seen = seen.clone();
        async move {
            seen.calls.fetch_add(1, Ordering::SeqCst);
            let body = match req.uri().path() {
                "/stream" => {
                    let (tx, rx) = mpsc::channel(4);
                    tx.send(Bytes::from_static(b"first\n")).await.unwrap();
                    seen.streams.lock().unwrap().push(tx);
                    AppBody::Right(ChannelBody { rx })
                }
                "/upload" => match req.into_body().collect().await {
                    Ok(collected) => {
                        seen.bodies_read.fetch_add(1, Ordering::SeqCst);
                        let n = collected.to_bytes().len();
                        AppBody::Left(Full::new(Bytes::from(n.to_string())))
                    }
                    Err(err) => {
                        seen.body_errors.fetch_add(1, Ordering::SeqCst);
                        let mut response =
                            Response::new(AppBody::Left(Full::new(Bytes::from(err.to_string()))));
                        *response.status_mut() = StatusCode::INSUFFICIENT_STORAGE;
                        return Ok(response);
                    }
                },
                _ => AppBody::Left(Full::new(Bytes::from_static(b"ok"))),
            };
            Ok::<_, Infallible>(Response::new(body))
        }
    })
}

/// One request on its own connection. The connection lives as long as the returned
/// response's body; dropping the body drops the connection (a client disconnect).
pub async fn send<B>(addr: SocketAddr, request: Request<B>) -> Response<Incoming>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .expect("the server answers within 10 s")
        .unwrap()
}

pub fn get(path: &str) -> Request<Full<Bytes>> {
    Request::get(path).body(Full::default()).unwrap()
}

pub fn with_header(path: &str, name: &str, value: &str) -> Request<Full<Bytes>> {
    Request::get(path)
        .header(name, value)
        .body(Full::default())
        .unwrap()
}

pub fn post(path: &str, body: Vec<u8>) -> Request<Full<Bytes>> {
    Request::post(path)
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// Reads one frame of a streaming response.
pub async fn next_chunk(response: &mut Response<Incoming>) -> Option<Bytes> {
    let frame = tokio::time::timeout(Duration::from_secs(10), response.body_mut().frame())
        .await
        .expect("a frame within 10 s")?;
    frame.unwrap().into_data().ok()
}

/// Reads a response to its end.
pub async fn text(response: Response<Incoming>) -> String {
    let bytes = tokio::time::timeout(Duration::from_secs(10), response.into_body().collect())
        .await
        .expect("the body ends within 10 s")
        .unwrap()
        .to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// On a layer with a count of one and a wait shorter than a few seconds, served here:
/// holds the slot, then makes three waiters, one whose client hangs up, one whose wait
/// runs out (503), and one served when the slot frees.
pub async fn three_waiters(layer: &admission_tower::AdmissionLayer) {
    let seen = Arc::new(Seen::default());
    let addr = serve(tower::Layer::layer(layer, app(seen.clone()))).await;
    let waiting = || layer.gate().count().waiting();
    let mut holder = send(addr, get("/stream")).await;
    assert_eq!(next_chunk(&mut holder).await.unwrap(), "first\n");
    let hung_up = tokio::spawn(async move { send(addr, get("/")).await });
    eventually("it waits", || waiting() == 1).await;
    hung_up.abort();
    eventually("the hung-up waiter leaves", || waiting() == 0).await;
    let timed_out = send(addr, get("/")).await;
    assert_eq!(timed_out.status(), StatusCode::SERVICE_UNAVAILABLE);
    let served = tokio::spawn(async move { send(addr, get("/")).await });
    eventually("it waits", || waiting() == 1).await;
    seen.end_streams();
    assert_eq!(served.await.unwrap().status(), StatusCode::OK);
    drop(holder);
    eventually("nothing in flight", || {
        layer.gate().count().in_flight() == 0
    })
    .await;
}
