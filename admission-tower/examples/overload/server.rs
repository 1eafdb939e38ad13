//! The demonstration's server: handlers that keep their own count of what they hold,
//! independent of the ledgers, served by `AdmissionLayer::serve`.

use super::*;

#[derive(Default)]
pub(crate) struct Inside {
    /// Responses the handlers hold now, and the most at once.
    pub(crate) now: AtomicU64,
    pub(crate) max: AtomicU64,
    /// The same, for the noisy client's.
    noisy_now: AtomicU64,
    pub(crate) noisy_max: AtomicU64,
}

impl Inside {
    fn enter(&self, noisy: bool) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        if noisy {
            let now = self.noisy_now.fetch_add(1, Ordering::SeqCst) + 1;
            self.noisy_max.fetch_max(now, Ordering::SeqCst);
        }
    }

    fn leave(&self, noisy: bool) {
        self.now.fetch_sub(1, Ordering::SeqCst);
        if noisy {
            self.noisy_now.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A handler's stake in a request: counted from the handler's start until its response
/// body ends or is dropped (the body's end comes before the layer releases the permit).
struct Stake {
    inside: Arc<Inside>,
    noisy: bool,
    done: bool,
}

impl Stake {
    fn new(inside: Arc<Inside>, noisy: bool) -> Self {
        inside.enter(noisy);
        Self {
            inside,
            noisy,
            done: false,
        }
    }

    fn end(&mut self) {
        if !std::mem::replace(&mut self.done, true) {
            self.inside.leave(self.noisy);
        }
    }
}

impl Drop for Stake {
    fn drop(&mut self) {
        self.end();
    }
}

/// A response body: chunks from a channel, or one buffer; ends the stake at its end.
struct AppBody {
    chunks: Either<mpsc::Receiver<Bytes>, Option<Bytes>>,
    stake: Option<Stake>,
}

impl Body for AppBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let next = match &mut self.chunks {
            Either::Left(rx) => match rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(chunk) => chunk,
            },
            Either::Right(once) => once.take(),
        };
        if next.is_none() {
            if let Some(stake) = &mut self.stake {
                stake.end();
            }
        }
        Poll::Ready(next.map(|chunk| Ok(Frame::data(chunk))))
    }
}

async fn handle(
    req: Request<MeteredBody<Incoming>>,
    inside: Arc<Inside>,
) -> Result<Response<AppBody>, Infallible> {
    let noisy = req.headers().get("x-client").is_some_and(|v| v == "noisy");
    // Liveness routes bypass admission, so they take no stake in the count.
    let guarded = !matches!(req.uri().path(), "/" | "/health");
    let stake = guarded.then(|| Stake::new(inside, noisy));
    let chunks = match req.uri().path() {
        "/stream" => {
            let (tx, rx) = mpsc::channel(2);
            tokio::spawn(async move {
                for i in 0..CHUNKS {
                    if tx.send(Bytes::from(format!("chunk {i}\n"))).await.is_err() {
                        return; // the client hung up
                    }
                    tokio::time::sleep(CHUNK_EVERY).await;
                }
            });
            Either::Left(rx)
        }
        "/upload" => {
            let n = match req.into_body().collect().await {
                Ok(body) => body.to_bytes().len(),
                Err(_) => 0,
            };
            Either::Right(Some(Bytes::from(n.to_string())))
        }
        "/download" => {
            let (tx, rx) = mpsc::channel(2);
            let chunk = Bytes::from(vec![b'x'; 64 << 10]);
            tokio::spawn(async move {
                for _ in 0..DOWNLOAD_CHUNKS {
                    if tx.send(chunk.clone()).await.is_err() {
                        return; // the connection was cut
                    }
                }
            });
            Either::Left(rx)
        }
        "/checkout" => {
            // The head at once, the receipt once the work is done.
            let (tx, rx) = mpsc::channel(1);
            tokio::spawn(async move {
                tokio::time::sleep(CHECKOUT_TAKES).await;
                let _ = tx.send(Bytes::from_static(b"paid")).await;
            });
            Either::Left(rx)
        }
        _ => Either::Right(Some(Bytes::from_static(b"ok"))),
    };
    Ok(Response::new(AppBody { chunks, stake }))
}

pub(crate) async fn serve(layer: AdmissionLayer, inside: Arc<Inside>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local address");
    let app = tower::service_fn(move |req| handle(req, inside.clone()));
    // Every connection held to the layer's `ConnectionLimits`.
    tokio::spawn(layer.serve(listener, layer.layer(app)).into_future());
    addr
}
