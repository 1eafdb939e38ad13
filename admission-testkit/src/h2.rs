//! h2 by hand: frames written byte by byte, and a client that reads what comes, answers
//! pings and opens flow-control windows on a schedule of the test's, for the tests that
//! attack `serve` below what a real client library would send.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};

pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const PING: u8 = 6;
pub const GOAWAY: u8 = 7;
pub const WINDOW_UPDATE: u8 = 8;
pub const CONTINUATION: u8 = 9;
pub const END_STREAM: u8 = 1;
pub const END_HEADERS: u8 = 4;

/// SETTINGS_INITIAL_WINDOW_SIZE: every stream's window, as the client opens it.
pub const INITIAL_WINDOW_SIZE: u16 = 4;

/// One h2 frame.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut frame = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// A GET of `path` in HPACK without the dynamic table: `:method GET`, `:scheme http`,
/// `:authority a`, `:path`.
pub fn get_block(path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x01, 0x01, b'a', 0x04, path.len() as u8];
    block.extend_from_slice(path.as_bytes());
    block
}

/// The client preface and empty settings.
pub fn preface() -> Vec<u8> {
    preface_with(&[])
}

/// The client preface and `settings` (identifier, value).
pub fn preface_with(settings: &[(u16, u32)]) -> Vec<u8> {
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let payload: Vec<u8> = settings
        .iter()
        .flat_map(|(id, value)| id.to_be_bytes().into_iter().chain(value.to_be_bytes()))
        .collect();
    bytes.extend(frame(SETTINGS, 0, 0, &payload));
    bytes
}

/// A GET of `path` on stream `id`, its request complete.
pub fn get_on(id: u32, path: &str) -> Vec<u8> {
    frame(HEADERS, END_STREAM | END_HEADERS, id, &get_block(path))
}

/// A GET of `path` on stream `id` with `headers` besides (literals, not indexed).
pub fn get_with(id: u32, path: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut block = get_block(path);
    for (name, value) in headers {
        block.extend([0, name.len() as u8]);
        block.extend_from_slice(name.as_bytes());
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    frame(HEADERS, END_STREAM | END_HEADERS, id, &block)
}

/// `bytes` more of stream `id`'s window (0: the connection's).
pub fn window_update(id: u32, bytes: u32) -> Vec<u8> {
    frame(WINDOW_UPDATE, 0, id, &bytes.to_be_bytes())
}

/// Reads frames until the connection closes or `within` passes: (type, flags, stream,
/// payload) of each.
pub async fn frames(stream: &mut TcpStream, within: Duration) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut read = Vec::new();
    let _ = timeout(within, async {
        let mut buf = [0; 8192];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let mut frames = Vec::new();
    let mut at = 0;
    while let Some((kind, flags, id, payload, len)) = parse(&read[at..]) {
        frames.push((kind, flags, id, payload.to_vec()));
        at += len;
    }
    frames
}

/// The first whole frame of `bytes`: its type, flags, stream, payload, and its length
/// with the header.
pub fn parse(bytes: &[u8]) -> Option<(u8, u8, u32, &[u8], usize)> {
    if bytes.len() < 9 {
        return None;
    }
    let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
    if bytes.len() < 9 + len {
        return None;
    }
    let id = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
    Some((bytes[3], bytes[4], id, &bytes[9..9 + len], 9 + len))
}

/// A frame the client saw, and when (since the client started).
#[derive(Clone)]
pub struct Seen {
    pub at: Duration,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?}: type {} flags {} stream {} ({} bytes)",
            self.at,
            self.kind,
            self.flags,
            self.stream,
            self.payload.len()
        )
    }
}

/// Everything a client saw.
#[derive(Debug, Default)]
pub struct Log(pub Vec<Seen>);

impl Log {
    /// When stream `id` was reset, if it was.
    pub fn reset(&self, id: u32) -> Option<Duration> {
        self.0
            .iter()
            .find(|seen| seen.kind == RST_STREAM && seen.stream == id)
            .map(|seen| seen.at)
    }

    /// Whether any stream was reset.
    pub fn any_reset(&self) -> bool {
        self.0.iter().any(|seen| seen.kind == RST_STREAM)
    }

    /// The DATA bytes stream `id` received.
    pub fn data(&self, id: u32) -> usize {
        self.0
            .iter()
            .filter(|seen| seen.kind == DATA && seen.stream == id)
            .map(|seen| seen.payload.len())
            .sum()
    }

    /// Whether the connection was ended with a `GOAWAY`.
    pub fn went_away(&self) -> bool {
        self.0.iter().any(|seen| seen.kind == GOAWAY)
    }
}

/// Drives `stream` for `within` (or until the server closes it, or `done` says so):
/// records every frame, answers every ping, and every `every` writes what `tick`
/// returns (window updates, say), given how long the client has run.
pub async fn client(
    stream: &mut TcpStream,
    within: Duration,
    every: Duration,
    mut tick: impl FnMut(Duration) -> Vec<u8>,
    mut done: impl FnMut(&Log) -> bool,
) -> Log {
    let start = Instant::now();
    let mut log = Log::default();
    let mut read = Vec::new();
    let mut ticks = tokio::time::interval_at(start + every, every);
    let mut buf = vec![0; 64 * 1024];
    let _ = timeout(within, async {
        loop {
            tokio::select! {
                n = stream.read(&mut buf) => match n {
                    Ok(0) | Err(_) => return,
                    Ok(n) => read.extend_from_slice(&buf[..n]),
                },
                _ = ticks.tick() => {
                    let bytes = tick(start.elapsed());
                    if !bytes.is_empty() && stream.write_all(&bytes).await.is_err() {
                        return;
                    }
                    continue;
                }
            }
            let mut at = 0;
            let mut pongs = Vec::new();
            while let Some((kind, flags, id, payload, len)) = parse(&read[at..]) {
                if kind == PING && flags == 0 {
                    pongs.extend(frame(PING, 1, 0, payload));
                }
                log.0.push(Seen {
                    at: start.elapsed(),
                    kind,
                    flags,
                    stream: id,
                    payload: payload.to_vec(),
                });
                at += len;
            }
            read.drain(..at);
            if !pongs.is_empty() && stream.write_all(&pongs).await.is_err() {
                return;
            }
            if done(&log) {
                return;
            }
        }
    })
    .await;
    log
}

/// Opens an h2 connection to `addr` with `window` as every stream's window and asks for
/// `path` on `streams` streams (1, 3, 5, ...).
pub async fn ask(addr: SocketAddr, window: u32, path: &str, streams: u32) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut bytes = preface_with(&[(INITIAL_WINDOW_SIZE, window)]);
    for i in 0..streams {
        bytes.extend(get_on(2 * i + 1, path));
    }
    stream.write_all(&bytes).await.unwrap();
    stream
}

/// A reader of `/stream` whose window starts at 1 KiB and grows by `per_second`, on the
/// stream and the connection alike, for `within` (or until its stream is reset): what
/// it saw.
pub async fn slow_reader(addr: SocketAddr, per_second: u32, within: Duration) -> Log {
    let mut reader = ask(addr, 1024, "/stream", 1).await;
    let quarter = per_second / 4;
    let open = move |_| [window_update(1, quarter), window_update(0, quarter)].concat();
    client(
        &mut reader,
        within,
        Duration::from_millis(250),
        open,
        |log| log.reset(1).is_some(),
    )
    .await
}
