//! A request whose client goes away is let go in every state: while it waits for a slot
//! (it leaves the queue and never reaches the handler) and while its handler runs with
//! the body dropped unread (the handler's future is dropped and the permits released),
//! for every body shape (none; a fixed length, complete or not; chunked, ended or not),
//! a hang-up or a reset, on HTTP/1.1 and HTTP/2. And a waiting request's body reaches its
//! handler intact, whatever was read ahead of it.
#![cfg(feature = "tokio")]

use crate::support::{eventually, holds_within};

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use admission_tower::{AdmissionLayer, MeteredBody, SlowClients, Wait};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tower::Layer;

/// How soon a client's going must be seen (the docs promise at once: the tests allow
/// for a loaded machine).
const SEEN_WITHIN: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    NoBody,
    Complete,
    Incomplete,
    ChunkedEnded,
    ChunkedUnfinished,
}

const SHAPES: [Shape; 5] = [
    Shape::NoBody,
    Shape::Complete,
    Shape::Incomplete,
    Shape::ChunkedEnded,
    Shape::ChunkedUnfinished,
];

/// What the app saw: handlers begun, and handler futures dropped before they answered.
#[derive(Debug, Default)]
struct Seen {
    started: AtomicUsize,
    dropped: AtomicUsize,
}

/// Counts a handler future dropped before it answered.
struct DropGuard(Arc<Seen>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// `/hold` holds its slot (its response never comes); `/drop` drops the body unread and
/// never answers (a handler at work); `/echo` answers the body it read.
fn app(
    seen: Arc<Seen>,
) -> impl tower::Service<
    Request<MeteredBody<Incoming>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |request: Request<MeteredBody<Incoming>>| {
        let seen = seen.clone();
        async move {
            seen.started.fetch_add(1, Ordering::SeqCst);
            match request.uri().path() {
                "/echo" => {
                    let body = request.into_body().collect().await;
                    let body = body.map_or_else(|_| Bytes::from("failed"), |b| b.to_bytes());
                    Ok(Response::new(Full::new(body)))
                }
                _ => {
                    drop(request);
                    let _guard = DropGuard(seen.clone());
                    std::future::pending::<()>().await;
                    unreachable!()
                }
            }
        }
    })
}

async fn serve_seen(layer: &AdmissionLayer, h2: bool) -> (SocketAddr, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let addr = crate::support::serve_on(layer.layer(app(seen.clone())), h2).await;
    (addr, seen)
}

/// The request's bytes on HTTP/1.1.
fn http1_request(path: &str, shape: Shape) -> Vec<u8> {
    let head = |framing: &str| format!("POST {path} HTTP/1.1\r\nhost: t\r\n{framing}\r\n");
    let mut bytes = match shape {
        Shape::NoBody => format!("GET {path} HTTP/1.1\r\nhost: t\r\n\r\n"),
        Shape::Complete => head("content-length: 5\r\n") + "hello",
        Shape::Incomplete => head("content-length: 1000\r\n"),
        Shape::ChunkedEnded => head("transfer-encoding: chunked\r\n") + "5\r\nhello\r\n0\r\n\r\n",
        Shape::ChunkedUnfinished => head("transfer-encoding: chunked\r\n") + "64\r\n",
    }
    .into_bytes();
    if matches!(shape, Shape::Incomplete | Shape::ChunkedUnfinished) {
        bytes.extend_from_slice(&[b'x'; 100]);
    }
    bytes
}

/// A client of one request in flight, on its own connection, that can go away.
enum Client {
    Http1(TcpStream),
    Http2 {
        connection: tokio::task::JoinHandle<()>,
        response: tokio::task::JoinHandle<()>,
        // Keeps an unfinished body open.
        _body: Option<mpsc::Sender<Result<Frame<Bytes>, Infallible>>>,
    },
}

impl Client {
    async fn send(addr: SocketAddr, path: &str, shape: Shape, h2: bool) -> Client {
        let stream = TcpStream::connect(addr).await.unwrap();
        if !h2 {
            let mut stream = stream;
            stream.write_all(&http1_request(path, shape)).await.unwrap();
            return Client::Http1(stream);
        }
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        type Body = http_body_util::Either<
            Empty<Bytes>,
            StreamBody<tokio_stream::wrappers::ReceiverStream<Result<Frame<Bytes>, Infallible>>>,
        >;
        let (tx, rx) = mpsc::channel(4);
        let uri = format!("http://{addr}{path}");
        let mut request = Request::post(uri);
        let body: Body = match shape {
            Shape::NoBody => Body::Left(Empty::new()),
            _ => Body::Right(StreamBody::new(
                tokio_stream::wrappers::ReceiverStream::new(rx),
            )),
        };
        match shape {
            Shape::Complete => request = request.header("content-length", "5"),
            Shape::Incomplete => request = request.header("content-length", "1000"),
            _ => {}
        }
        let request = request.body(body).unwrap();
        let response = tokio::spawn(async move {
            let _ = sender.send_request(request).await;
        });
        let open = match shape {
            Shape::NoBody => None,
            Shape::Complete | Shape::ChunkedEnded => {
                tx.send(Ok(Frame::data(Bytes::from("hello"))))
                    .await
                    .unwrap();
                None // dropped: the body ends
            }
            Shape::Incomplete | Shape::ChunkedUnfinished => {
                let data = Bytes::from(vec![b'x'; 100]);
                tx.send(Ok(Frame::data(data))).await.unwrap();
                Some(tx)
            }
        };
        Client::Http2 {
            connection,
            response,
            _body: open,
        }
    }

    /// Goes away: closes the connection, or with `reset` resets it (HTTP/1.1: an RST;
    /// HTTP/2: the stream reset, RST_STREAM, the connection left open).
    fn go(self, reset: bool) {
        match self {
            Client::Http1(stream) => {
                if reset {
                    stream.set_zero_linger().unwrap();
                }
                drop(stream);
            }
            Client::Http2 {
                connection,
                response,
                ..
            } => {
                // Dropping the response future resets the stream; aborting the
                // connection closes it.
                response.abort();
                if !reset {
                    connection.abort();
                }
            }
        }
    }
}

/// Whether `condition` holds within `SEEN_WITHIN`.
async fn within(condition: impl FnMut() -> bool) -> bool {
    holds_within(SEEN_WITHIN, condition).await
}

fn waiting_layer() -> AdmissionLayer {
    AdmissionLayer::builder()
        .count(1)
        .wait(Wait::new(4, Duration::from_secs(30)))
        .build()
        .unwrap()
}

/// Every shape and way of going, while the request waits for the one slot (held by a
/// `/hold` request): it leaves the queue at once, and its handler is never called, even
/// once the slot frees.
async fn a_client_gone_while_waiting_leaves_the_queue(h2: bool) {
    let mut missed = Vec::new();
    for shape in SHAPES {
        for reset in [false, true] {
            let case = format!("h2 {h2}, {shape:?}, reset {reset}");
            let layer = waiting_layer();
            let (addr, seen) = serve_seen(&layer, h2).await;
            let holder = Client::send(addr, "/hold", Shape::NoBody, h2).await;
            eventually(&case, || seen.started.load(Ordering::SeqCst) == 1).await;
            let waiter = Client::send(addr, "/drop", shape, h2).await;
            eventually(&case, || layer.gate().count().waiting() == 1).await;
            waiter.go(reset);
            if !within(|| layer.gate().count().waiting() == 0).await {
                missed.push(case);
                continue;
            }
            // The slot frees: the request that went is not served.
            holder.go(false);
            eventually(&format!("{case}: the slot frees"), || {
                layer.gate().count().in_flight() == 0
            })
            .await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(
                seen.started.load(Ordering::SeqCst),
                1,
                "{case}: the request that went never reached its handler"
            );
            let waits = layer.snapshot().wait;
            assert_eq!((waits.admitted, waits.timed_out), (0, 0), "{case}");
        }
    }
    assert!(
        missed.is_empty(),
        "still waiting {SEEN_WITHIN:?} after the client went: {missed:#?}"
    );
}

#[tokio::test]
async fn over_http1_a_client_gone_while_waiting_leaves_the_queue() {
    a_client_gone_while_waiting_leaves_the_queue(false).await;
}

#[tokio::test]
async fn over_http2_a_client_gone_while_waiting_leaves_the_queue() {
    a_client_gone_while_waiting_leaves_the_queue(true).await;
}

/// Makes a fresh layer for each case.
type MakeLayer = fn() -> AdmissionLayer;

/// Every shape and way of going, while the handler runs with the body dropped unread:
/// its future is dropped and its permits released, under the default policy, with it
/// off, and with a byte budget.
async fn a_client_gone_while_its_handler_runs_is_let_go(h2: bool) {
    let layers: [(&str, MakeLayer); 3] = [
        ("default", || {
            AdmissionLayer::builder().count(4).build().unwrap()
        }),
        ("slow clients off", || {
            let off = SlowClients::off();
            AdmissionLayer::builder()
                .count(4)
                .slow_clients(off)
                .build()
                .unwrap()
        }),
        ("a byte budget", || {
            let off = SlowClients::off();
            let builder = AdmissionLayer::builder().count(4).bytes(1 << 20);
            builder.slow_clients(off).build().unwrap()
        }),
    ];
    let mut missed = Vec::new();
    for (policy, layer) in layers {
        for shape in SHAPES {
            for reset in [false, true] {
                let case = format!("h2 {h2}, {policy}, {shape:?}, reset {reset}");
                let layer = layer();
                let (addr, seen) = serve_seen(&layer, h2).await;
                let client = Client::send(addr, "/drop", shape, h2).await;
                eventually(&case, || seen.started.load(Ordering::SeqCst) == 1).await;
                client.go(reset);
                if !within(|| seen.dropped.load(Ordering::SeqCst) == 1).await {
                    missed.push(case);
                    continue;
                }
                eventually(&format!("{case}: its permits are released"), || {
                    let gate = layer.snapshot().gate;
                    gate.count.in_flight == 0 && gate.bytes.is_none_or(|b| b.in_flight == 0)
                })
                .await;
            }
        }
    }
    assert!(
        missed.is_empty(),
        "handler still running {SEEN_WITHIN:?} after the client went: {missed:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http1_a_client_gone_while_its_handler_runs_is_let_go() {
    a_client_gone_while_its_handler_runs_is_let_go(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_a_client_gone_while_its_handler_runs_is_let_go() {
    a_client_gone_while_its_handler_runs_is_let_go(true).await;
}

/// A request that waited is given its body whole, every byte in order, on either
/// protocol: a small one read ahead to its end, and one larger than what is read ahead.
#[tokio::test]
async fn a_waiting_request_s_body_reaches_its_handler_intact() {
    for h2 in [false, true] {
        for size in [5, 200 << 10] {
            let layer = waiting_layer();
            let (addr, seen) = serve_seen(&layer, h2).await;
            let holder = Client::send(addr, "/hold", Shape::NoBody, h2).await;
            eventually("held", || seen.started.load(Ordering::SeqCst) == 1).await;
            let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let stream = TcpStream::connect(addr).await.unwrap();
            let request = Request::post(format!("http://{addr}/echo"))
                .body(Full::new(Bytes::from(body.clone())))
                .unwrap();
            let answer = tokio::spawn(async move {
                let response = if h2 {
                    let (mut sender, connection) = hyper::client::conn::http2::handshake(
                        TokioExecutor::new(),
                        TokioIo::new(stream),
                    )
                    .await
                    .unwrap();
                    tokio::spawn(connection);
                    sender.send_request(request).await.unwrap()
                } else {
                    let (mut sender, connection) =
                        hyper::client::conn::http1::handshake(TokioIo::new(stream))
                            .await
                            .unwrap();
                    tokio::spawn(connection);
                    sender.send_request(request).await.unwrap()
                };
                let status = response.status();
                (
                    status,
                    response.into_body().collect().await.unwrap().to_bytes(),
                )
            });
            eventually("it waits", || layer.gate().count().waiting() == 1).await;
            // Let it read ahead what it will.
            tokio::time::sleep(Duration::from_millis(50)).await;
            holder.go(false);
            let (status, echoed) = tokio::time::timeout(Duration::from_secs(10), answer)
                .await
                .expect("answered")
                .unwrap();
            assert_eq!(status, StatusCode::OK, "h2 {h2}, {size} bytes");
            assert!(echoed == body, "h2 {h2}, {size} bytes: the body changed");
        }
    }
}

/// Under a standing queue a waiter gives its place to a newer request once it has waited
/// the target: it is refused (503) long before `max_wait`, and the newer one waits on.
#[tokio::test]
async fn a_standing_queue_refuses_a_waiter_past_the_target_when_a_newer_one_comes() {
    let wait = Wait::new(4, Duration::from_secs(30))
        .standing_queue(Duration::ZERO, Duration::from_millis(10));
    let layer = AdmissionLayer::builder()
        .count(1)
        .wait(wait)
        .build()
        .unwrap();
    let (addr, seen) = serve_seen(&layer, false).await;
    let _holder = Client::send(addr, "/hold", Shape::NoBody, false).await;
    eventually("held", || seen.started.load(Ordering::SeqCst) == 1).await;
    let started = tokio::time::Instant::now();
    let older = tokio::spawn(async move {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(connection);
        let request = Request::get(format!("http://{addr}/drop")).body(Empty::<Bytes>::new());
        sender
            .send_request(request.unwrap())
            .await
            .unwrap()
            .status()
    });
    eventually("the older waits", || layer.gate().count().waiting() == 1).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _newer = Client::send(addr, "/drop", Shape::NoBody, false).await;
    let status = tokio::time::timeout(Duration::from_secs(5), older)
        .await
        .expect("refused long before max_wait")
        .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(started.elapsed() < Duration::from_secs(5));
    eventually("the newer waits on", || layer.gate().count().waiting() == 1).await;
    assert_eq!(layer.snapshot().wait.timed_out, 1);
}

/// A request whose body fails while it waits is answered 400 (no one reads it), leaves
/// the queue, and is counted as gone; its handler is never called.
#[tokio::test]
async fn a_body_that_fails_while_waiting_is_answered_400_and_counted_as_gone() {
    use tower::ServiceExt;
    type Body = http_body_util::Either<
        Empty<Bytes>,
        StreamBody<tokio_stream::wrappers::ReceiverStream<Result<Frame<Bytes>, std::io::Error>>>,
    >;
    let layer = waiting_layer();
    let seen = Arc::new(Seen::default());
    let called = seen.clone();
    let service = layer.layer(tower::service_fn(
        move |request: Request<MeteredBody<Body>>| {
            called.started.fetch_add(1, Ordering::SeqCst);
            async move {
                if request.uri().path() == "/hold" {
                    std::future::pending::<()>().await;
                }
                Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
            }
        },
    ));
    // The slot's holder: a handler that never answers.
    let holder = tokio::spawn(
        service.clone().oneshot(
            Request::get("/hold")
                .body(Body::Left(Empty::new()))
                .unwrap(),
        ),
    );
    eventually("held", || layer.gate().count().in_flight() == 1).await;
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let request = Request::post("/echo").body(Body::Right(body)).unwrap();
    let waiter = tokio::spawn(service.oneshot(request));
    eventually("it waits", || layer.gate().count().waiting() == 1).await;
    tx.send(Err(std::io::Error::other("connection reset")))
        .await
        .unwrap();
    let response = tokio::time::timeout(SEEN_WITHIN, waiter)
        .await
        .expect("answered at once")
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(layer.gate().count().waiting(), 0);
    assert_eq!(layer.snapshot().gone, 1);
    assert_eq!(seen.started.load(Ordering::SeqCst), 1, "only the holder's");
    holder.abort();
}

/// A request that asked to be told to send its body (`Expect: 100-continue`) is not told
/// while it waits: its body is not read ahead. Once admitted, it is.
#[tokio::test]
async fn a_waiting_request_that_expects_100_continue_is_not_told_to_send_its_body() {
    use tokio::io::AsyncReadExt;
    let layer = waiting_layer();
    let (addr, seen) = serve_seen(&layer, false).await;
    let holder = Client::send(addr, "/hold", Shape::NoBody, false).await;
    eventually("held", || seen.started.load(Ordering::SeqCst) == 1).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head =
        "POST /echo HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    eventually("it waits", || layer.gate().count().waiting() == 1).await;
    let mut buf = [0; 256];
    let early = tokio::time::timeout(Duration::from_millis(300), stream.read(&mut buf)).await;
    assert!(
        early.is_err(),
        "nothing is sent while it waits: no 100 Continue"
    );
    holder.go(false);
    let n = tokio::time::timeout(SEEN_WITHIN, stream.read(&mut buf))
        .await
        .expect("told to send, once admitted")
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 100 Continue"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    stream.write_all(b"hello").await.unwrap();
    let mut answer = Vec::new();
    while !answer.ends_with(b"hello") {
        let n = tokio::time::timeout(SEEN_WITHIN, stream.read(&mut buf))
            .await
            .expect("answered")
            .unwrap();
        assert_ne!(
            n,
            0,
            "closed before the echo: {:?}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&buf[..n]);
    }
}
