//! The slow wave: clients that would hold what they were admitted with, or a connection,
//! without doing the work: trickled uploads and heads, readers that stop, silent and idle
//! connections. Each reports when the server cut it.

use super::*;

#[derive(Debug, Clone, Copy)]
enum Holder {
    /// Sends a request head a byte every 200 ms.
    Trickler,
    /// Sends nothing.
    Silent,
    /// Sends one request, then nothing.
    KeptAlive,
}

/// A connection that holds its place doing nothing: how long until the server closed
/// it, if it did within 10 s.
async fn hold_a_connection(addr: SocketAddr, how: Holder) -> Option<Duration> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let mut buf = vec![0; 1024];
    if let Holder::KeptAlive = how {
        stream
            .write_all(b"GET /health HTTP/1.1\r\nhost: demo\r\n\r\n")
            .await
            .ok()?;
        let n = stream.read(&mut buf).await.ok()?;
        if !buf[..n].starts_with(b"HTTP/1.1 200") {
            return None;
        }
    }
    let start = Instant::now();
    let (mut read, mut write) = stream.into_split();
    let trickle = tokio::spawn(async move {
        if let Holder::Trickler = how {
            for byte in b"GET /health HTTP/1.1\r\nhost: demo\r\nx-slow: a byte at a time\r\n\r\n" {
                if write.write_all(&[*byte]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        std::future::pending::<()>().await;
    });
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(1..) = read.read(&mut buf).await {}
    })
    .await;
    trickle.abort();
    closed.ok().map(|()| start.elapsed())
}

/// An upload that declares 48 KiB and sends a byte every 100 ms: the status line it is
/// answered with, and after how long.
async fn trickler(addr: SocketAddr, key: String) -> Option<(String, Duration)> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let head = format!(
        "POST /upload HTTP/1.1\r\nhost: demo\r\nx-client: {key}\r\ncontent-length: {UPLOAD_BYTES}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.ok()?;
    let start = Instant::now();
    let (mut read, mut write) = stream.into_split();
    let sender = tokio::spawn(async move {
        for _ in 0..UPLOAD_BYTES {
            if write.write_all(b"x").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut answer = vec![0; 64];
    let n = tokio::time::timeout(CLIENT_TIMEOUT, read.read(&mut answer))
        .await
        .ok()?
        .ok()?;
    sender.abort();
    let line = String::from_utf8_lossy(&answer[..n])
        .lines()
        .next()?
        .to_owned();
    Some((line, start.elapsed()))
}

/// A download whose client reads nothing (a small receive window, so the kernel buffers
/// little): whether the server cut the connection before sending it all, and when.
async fn stalled_reader(addr: SocketAddr, key: String) -> Option<Duration> {
    let socket = TcpSocket::new_v4().ok()?;
    socket.set_recv_buffer_size(4096).ok()?;
    let mut stream = socket.connect(addr).await.ok()?;
    let head = format!("GET /download HTTP/1.1\r\nhost: demo\r\nx-client: {key}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.ok()?;
    let start = Instant::now();
    tokio::time::sleep(GRACE * 3).await; // reads nothing
    // Then reads what is left: a cut connection ends long before the 16 MiB.
    let mut buf = vec![0; 64 << 10];
    let mut total = 0;
    let read_all = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => total += n,
            }
        }
    };
    let ended = tokio::time::timeout(Duration::from_secs(5), read_all)
        .await
        .is_ok();
    (ended && total < DOWNLOAD_CHUNKS * (64 << 10)).then(|| start.elapsed())
}

/// A download over h2 whose client keeps the stream's window at 0 (and answers pings),
/// so the socket stays writable: how long until the server reset the stream, if it did
/// within 10 s.
async fn zero_window_reader(addr: SocketAddr, key: String) -> Option<Duration> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let mut bytes = h2::preface_with(&[(h2::INITIAL_WINDOW_SIZE, 0)]);
    bytes.extend(h2::get_with(1, "/download", &[("x-client", &key)]));
    stream.write_all(&bytes).await.ok()?;
    let log = h2::client(
        &mut stream,
        Duration::from_secs(10),
        Duration::from_secs(1),
        |_| Vec::new(),
        |log| log.reset(1).is_some(),
    )
    .await;
    log.reset(1)
}

/// The slow wave, under way.
pub(crate) struct SlowWave {
    uploads: Vec<JoinHandle<Option<(String, Duration)>>>,
    readers: Vec<JoinHandle<Option<Duration>>>,
    h2_readers: Vec<JoinHandle<Option<Duration>>>,
    holders: Vec<JoinHandle<Option<Duration>>>,
}

/// When each of the slow wave's clients was cut, or its connection closed.
pub(crate) struct SlowCuts {
    /// Trickled uploads answered 408.
    pub(crate) uploads_408: Vec<Duration>,
    /// Readers that stopped, cut before the end of their download.
    pub(crate) readers: Vec<Duration>,
    /// h2 readers that kept their window at 0, their streams reset.
    pub(crate) h2_readers: Vec<Duration>,
    /// Connections holding a place doing nothing, closed.
    pub(crate) holders: Vec<Duration>,
}

impl SlowWave {
    pub(crate) fn start(addr: SocketAddr) -> Self {
        let uploads = (0..TRICKLERS)
            .map(|i| tokio::spawn(trickler(addr, format!("trickler-{i}"))))
            .collect();
        let readers = (0..STALLED)
            .map(|i| tokio::spawn(stalled_reader(addr, format!("stalled-{i}"))))
            .collect();
        let h2_readers = (0..ZERO_WINDOW)
            .map(|i| tokio::spawn(zero_window_reader(addr, format!("zero-window-{i}"))))
            .collect();
        let holders = [Holder::Trickler; HEAD_TRICKLERS]
            .into_iter()
            .chain([Holder::Silent; SILENT])
            .chain([Holder::KeptAlive; KEPT_ALIVE])
            .map(|how| tokio::spawn(hold_a_connection(addr, how)))
            .collect();
        SlowWave {
            uploads,
            readers,
            h2_readers,
            holders,
        }
    }

    pub(crate) async fn cuts(self) -> SlowCuts {
        let mut cuts = SlowCuts {
            uploads_408: Vec::new(),
            readers: Vec::new(),
            h2_readers: Vec::new(),
            holders: Vec::new(),
        };
        for upload in self.uploads {
            if let Ok(Some((line, after))) = upload.await {
                if line.starts_with("HTTP/1.1 408") {
                    cuts.uploads_408.push(after);
                }
            }
        }
        for reader in self.readers {
            if let Ok(Some(after)) = reader.await {
                cuts.readers.push(after);
            }
        }
        for reader in self.h2_readers {
            if let Ok(Some(after)) = reader.await {
                cuts.h2_readers.push(after);
            }
        }
        for holder in self.holders {
            if let Ok(Some(after)) = holder.await {
                cuts.holders.push(after);
            }
        }
        cuts
    }
}
