//! A hand-written gRPC service (no protoc: the health messages serve as payloads), a
//! server on loopback, and tonic clients for its methods.

// Each test file uses part of this module, and test helpers need no docs.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use admission_core::ByteLedger;
use admission_grpc::{HandlerPermit, refused_status};
use bytes::Bytes;
use http::uri::PathAndQuery;
use tokio::sync::mpsc;
use tonic::codec::Streaming;
use tonic::server::{NamedService, ServerStreamingService, StreamingService, UnaryService};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_prost::ProstCodec;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub const PUT: &str = "/admission.test.Batch/Put";
pub const HOLD: &str = "/admission.test.Batch/Hold";
pub const ACK: &str = "/admission.test.Batch/Ack";
pub const POUR: &str = "/admission.test.Batch/Pour";

/// What the service saw.
#[derive(Debug)]
pub struct State {
    /// Handler runs of `Put`.
    pub calls: AtomicUsize,
    /// `Put` runs that found an interceptor's permit in the request's extensions.
    pub with_permit: AtomicUsize,
    /// Charged inside `Put` with the decoded size of the request (1 byte a character).
    pub decoded: ByteLedger,
    /// Senders of open `Hold` streams.
    pub streams: Mutex<Vec<mpsc::Sender<Result<HealthCheckResponse, Status>>>>,
}

impl State {
    pub fn new(decoded_budget: u64) -> Arc<Self> {
        Arc::new(Self {
            calls: AtomicUsize::new(0),
            with_permit: AtomicUsize::new(0),
            decoded: ByteLedger::new(decoded_budget).unwrap(),
            streams: Mutex::new(Vec::new()),
        })
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn end_streams(&self) {
        self.streams.lock().unwrap().clear();
    }
}

/// `admission.test.Batch`: unary `Put`, server-streaming `Hold` and `Pour`, bidirectional
/// `Ack`.
#[derive(Debug, Clone)]
pub struct Batch(pub Arc<State>);

impl NamedService for Batch {
    const NAME: &'static str = "admission.test.Batch";
}

struct Put(Arc<State>);

impl UnaryService<HealthCheckRequest> for Put {
    type Response = HealthCheckResponse;
    type Future = BoxFuture<Result<Response<HealthCheckResponse>, Status>>;

    fn call(&mut self, request: Request<HealthCheckRequest>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move {
            state.calls.fetch_add(1, Ordering::SeqCst);
            if request.extensions().get::<HandlerPermit>().is_some() {
                state.with_permit.fetch_add(1, Ordering::SeqCst);
            }
            // The decoded size is what this handler holds while it works.
            let size = request.get_ref().service.len() as u64;
            let _held = state
                .decoded
                .try_charge(size)
                .map_err(|refused| refused_status(refused, Duration::from_millis(300)))?;
            Ok(Response::new(HealthCheckResponse { status: 1 }))
        })
    }
}

struct Hold(Arc<State>);

/// The stream of a `Hold` call: items from a channel the test controls.
pub struct Items(mpsc::Receiver<Result<HealthCheckResponse, Status>>);

impl tokio_stream::Stream for Items {
    type Item = Result<HealthCheckResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

impl ServerStreamingService<HealthCheckRequest> for Hold {
    type Response = HealthCheckResponse;
    type ResponseStream = Items;
    type Future = BoxFuture<Result<Response<Items>, Status>>;

    fn call(&mut self, _request: Request<HealthCheckRequest>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move {
            let (tx, rx) = mpsc::channel(4);
            tx.send(Ok(HealthCheckResponse { status: 1 }))
                .await
                .unwrap();
            state.streams.lock().unwrap().push(tx);
            Ok(Response::new(Items(rx)))
        })
    }
}

struct Pour;

/// The stream of a `Pour` call: 4 KiB messages, as fast as they are taken, for ever.
type Poured = tokio_stream::Iter<std::iter::Repeat<Result<HealthCheckRequest, Status>>>;

impl ServerStreamingService<HealthCheckRequest> for Pour {
    type Response = HealthCheckRequest;
    type ResponseStream = Poured;
    type Future = BoxFuture<Result<Response<Poured>, Status>>;

    fn call(&mut self, _request: Request<HealthCheckRequest>) -> Self::Future {
        let message = HealthCheckRequest {
            service: "x".repeat(4096),
        };
        let messages = tokio_stream::iter(std::iter::repeat(Ok(message)));
        Box::pin(async move { Ok(Response::new(messages)) })
    }
}

struct Ack;

impl StreamingService<HealthCheckRequest> for Ack {
    type Response = HealthCheckResponse;
    type ResponseStream = Items;
    type Future = BoxFuture<Result<Response<Items>, Status>>;

    /// Answers at once (the response head goes out before any message is read), then
    /// acknowledges each message with its length, and ends the stream with the request
    /// stream's error as a handler that propagates errors does.
    fn call(&mut self, request: Request<Streaming<HealthCheckRequest>>) -> Self::Future {
        Box::pin(async move {
            let mut inbound = request.into_inner();
            let (tx, rx) = mpsc::channel(4);
            tokio::spawn(async move {
                loop {
                    let item = match inbound.message().await {
                        Ok(Some(message)) => Ok(HealthCheckResponse {
                            status: message.service.len() as i32,
                        }),
                        Ok(None) => return,
                        Err(status) => Err(status),
                    };
                    let failed = item.is_err();
                    if tx.send(item).await.is_err() || failed {
                        return;
                    }
                }
            });
            Ok(Response::new(Items(rx)))
        })
    }
}

impl<B> tower::Service<http::Request<B>> for Batch
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
            Ok(match request.uri().path() {
                PUT => grpc.unary(Put(state), request).await,
                HOLD => grpc.server_streaming(Hold(state), request).await,
                POUR => {
                    let codec = ProstCodec::<HealthCheckRequest, HealthCheckRequest>::default();
                    let mut grpc = tonic::server::Grpc::new(codec);
                    grpc.server_streaming(Pour, request).await
                }
                ACK => grpc.streaming(Ack, request).await,
                _ => Status::unimplemented("no such method").into_http(),
            })
        })
    }
}

/// Serves `router` on `127.0.0.1:0`.
pub async fn serve<F>(
    serve: impl FnOnce(tokio_stream::wrappers::TcpListenerStream) -> F,
) -> SocketAddr
where
    F: Future<Output = Result<(), tonic::transport::Error>> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(tokio_stream::wrappers::TcpListenerStream::new(
        listener,
    )));
    addr
}

pub async fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap()
}

pub async fn put(
    channel: &Channel,
    payload: &str,
    metadata: &[(&'static str, &'static str)],
) -> Result<HealthCheckResponse, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let mut request = Request::new(HealthCheckRequest {
        service: payload.into(),
    });
    for (k, v) in metadata {
        request.metadata_mut().insert(*k, v.parse().unwrap());
    }
    grpc.unary(
        request,
        PathAndQuery::from_static(PUT),
        ProstCodec::default(),
    )
    .await
    .map(Response::into_inner)
}

pub async fn hold(channel: &Channel) -> Result<Streaming<HealthCheckResponse>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let request = Request::new(HealthCheckRequest::default());
    grpc.server_streaming(
        request,
        PathAndQuery::from_static(HOLD),
        ProstCodec::default(),
    )
    .await
    .map(Response::into_inner)
}

/// Opens a `Pour` stream: 4 KiB messages for as long as the client reads them.
pub async fn pour(channel: &Channel) -> Result<Streaming<HealthCheckRequest>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let request = Request::new(HealthCheckRequest::default());
    grpc.server_streaming(
        request,
        PathAndQuery::from_static(POUR),
        ProstCodec::default(),
    )
    .await
    .map(Response::into_inner)
}

#[allow(unused_imports)] // Not every test file waits.
pub use admission_testkit::eventually;

/// Opens an `Ack` stream; each payload the test sends on the returned sender goes out
/// as one message, when the test sends it.
pub async fn ack(
    channel: &Channel,
) -> (
    mpsc::Sender<String>,
    Result<Streaming<HealthCheckResponse>, Status>,
) {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let (tx, rx) = mpsc::channel::<String>(4);
    let messages =
        tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), |service| {
            HealthCheckRequest { service }
        });
    let request = Request::new(messages);
    let response = grpc
        .streaming(
            request,
            PathAndQuery::from_static(ACK),
            ProstCodec::default(),
        )
        .await
        .map(Response::into_inner);
    (tx, response)
}
