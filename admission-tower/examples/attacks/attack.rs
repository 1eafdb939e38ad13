//! The attacks, each from loopback addresses of its own, running until told to stop, and
//! what each saw of the server.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission_tower::ConnectionLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::h2::{
    DATA, END_STREAM, GOAWAY, HEADERS, INITIAL_WINDOW_SIZE, PING, RST_STREAM, frame, frames,
    get_on, parse, preface, preface_with,
};
use super::{CONNECTIONS_PER_ADDRESS, loopback};

/// Connections that hold a place doing nothing, of each kind.
const HOLDERS: usize = 10;
/// Zero-window addresses, and connections from each (each with as many streams as the
/// server lets it open).
const ZERO_WINDOW_ADDRESSES: u8 = 2;
const ZERO_WINDOW_CONNECTIONS: usize = 2;
const STREAMS: usize = 100;
/// Streams of zero-window clients open at once, at most.
pub(crate) const ZERO_WINDOW_STREAMS: usize =
    ZERO_WINDOW_ADDRESSES as usize * ZERO_WINDOW_CONNECTIONS * STREAMS;
/// Connections the address at its cap opens.
const PAST_THE_CAP: usize = CONNECTIONS_PER_ADDRESS + 10;
/// Connections the attacks hold at once, at most.
pub(crate) const ATTACK_CONNECTIONS: usize =
    3 * HOLDERS + ZERO_WINDOW_ADDRESSES as usize * ZERO_WINDOW_CONNECTIONS + 1 + PAST_THE_CAP;
/// How long a zero-window stream may hold before it is reset (under `serve`) or its
/// permits go (under any server): the default grace (5 s), plus a second for the timers
/// and the scheduler.
pub(crate) const RESET_WITHIN: Duration = Duration::from_secs(6);

/// What the attacks saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Zero-window streams reset, and the longest any was held before its reset.
    resets: u64,
    longest_hold: Duration,
    /// Zero-window streams still open when the attacks stopped, held longer than the
    /// server should let them be.
    held_past_reset: usize,
    /// Rapid-reset connections the server ended (`GOAWAY`), of those made.
    floods_ended: u64,
    floods: u64,
    /// Connections of the address past its cap closed before anything was read.
    past_cap_closed: usize,
    /// How long the attacks ran.
    ran: Duration,
}

impl Seen {
    /// What the server should have done and did not.
    pub(crate) fn wrong(&self) -> Option<String> {
        if self.ran >= RESET_WITHIN && self.resets == 0 {
            return Some("no zero-window stream was reset".to_owned());
        }
        if self.held_past_reset > 0 || self.longest_hold > RESET_WITHIN {
            return Some(format!(
                "{} zero-window streams held past {RESET_WITHIN:?} at the end, the longest reset one {:?}",
                self.held_past_reset, self.longest_hold
            ));
        }
        if self.floods == 0 || self.floods_ended < self.floods {
            return Some(format!(
                "{} of {} rapid-reset connections ended",
                self.floods_ended, self.floods
            ));
        }
        if self.past_cap_closed < PAST_THE_CAP - CONNECTIONS_PER_ADDRESS {
            return Some(format!(
                "{} of {PAST_THE_CAP} connections from one address closed at its cap of {CONNECTIONS_PER_ADDRESS}",
                self.past_cap_closed
            ));
        }
        None
    }

    /// Zero-window streams still open at the end, held longer than the server should let
    /// them be (`RESET_WITHIN`). Admission-bench's `figures` reads it; the example prints
    /// it and checks it through `wrong`.
    #[allow(dead_code)]
    pub(crate) fn held_past_reset(&self) -> usize {
        self.held_past_reset
    }
}

impl fmt::Display for Seen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  {HOLDERS} request heads trickled a byte a second, {HOLDERS} silent connections, {HOLDERS} idle keep-alives: held their places (the head and idle bounds close them at {} s and {} s)",
            ConnectionLimits::HEAD_WITHIN.as_secs(),
            ConnectionLimits::IDLE.as_secs(),
        )?;
        writeln!(
            f,
            "  zero-window h2 readers ({ZERO_WINDOW_ADDRESSES} addresses x {ZERO_WINDOW_CONNECTIONS} connections x {STREAMS} streams): {} streams reset, the longest after {:.1} s; {} still open past {} s at the end",
            self.resets,
            self.longest_hold.as_secs_f64(),
            self.held_past_reset,
            RESET_WITHIN.as_secs(),
        )?;
        writeln!(
            f,
            "  rapid reset (1,000 streams opened and reset at once): {} of {} connections ended by the server",
            self.floods_ended, self.floods
        )?;
        write!(
            f,
            "  one address opening {PAST_THE_CAP} connections: {} closed at its cap of {CONNECTIONS_PER_ADDRESS}",
            self.past_cap_closed
        )
    }
}

/// A connection to `addr` from `from`.
async fn connect(from: IpAddr, addr: SocketAddr) -> Option<TcpStream> {
    let socket = TcpSocket::new_v4().ok()?;
    socket.bind(SocketAddr::new(from, 0)).ok()?;
    socket.connect(addr).await.ok()
}

/// Waits until `stop` says so.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// The attacks, under way.
pub(crate) struct Attacks {
    stop: watch::Sender<bool>,
    /// Told, the attacks open nothing more, and hold what they have.
    quiesce: watch::Sender<bool>,
    tasks: JoinSet<()>,
    seen: Arc<Mutex<Seen>>,
    started: Instant,
}

impl Attacks {
    pub(crate) fn start(addr: SocketAddr) -> Self {
        let (stop, watching) = watch::channel(false);
        let (quiesce, quiescing) = watch::channel(false);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mut tasks = JoinSet::new();
        for i in 0..HOLDERS {
            tasks.spawn(trickle_a_head(addr, watching.clone(), i));
            tasks.spawn(hold(addr, loopback(2, 2), watching.clone(), false));
            tasks.spawn(hold(addr, loopback(2, 3), watching.clone(), true));
        }
        for host in 1..=ZERO_WINDOW_ADDRESSES {
            for _ in 0..ZERO_WINDOW_CONNECTIONS {
                tasks.spawn(zero_window(
                    addr,
                    loopback(3, host),
                    watching.clone(),
                    quiescing.clone(),
                    seen.clone(),
                ));
            }
        }
        tasks.spawn(rapid_reset(addr, quiescing, seen.clone()));
        tasks.spawn(past_the_cap(addr, watching, seen.clone()));
        Self {
            stop,
            quiesce,
            tasks,
            seen,
            started: Instant::now(),
        }
    }

    /// From now on the attacks open nothing more: no more floods, and no zero-window
    /// stream in place of one that ends. What they hold, they keep until stopped.
    pub(crate) fn quiesce(&self) {
        let _ = self.quiesce.send(true);
    }

    pub(crate) async fn stop(mut self) -> Seen {
        self.quiesce();
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
        let mut seen = std::mem::take(&mut *self.seen.lock().expect("not poisoned"));
        seen.ran = self.started.elapsed();
        seen
    }
}

/// A request head sent a byte a second, from 127.0.2.1.
async fn trickle_a_head(addr: SocketAddr, mut stop: watch::Receiver<bool>, i: usize) {
    let Some(mut stream) = connect(loopback(2, 1), addr).await else {
        return;
    };
    let head = format!("GET /work HTTP/1.1\r\nhost: a\r\nx-trickle: {i}\r\n\r\n");
    let trickle = async {
        for byte in head.bytes() {
            if stream.write_all(&[byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = trickle => {}
        () = stopped(&mut stop) => {}
    }
}

/// A connection that sends nothing, or (`kept_alive`) one request and then nothing.
async fn hold(addr: SocketAddr, from: IpAddr, mut stop: watch::Receiver<bool>, kept_alive: bool) {
    let Some(mut stream) = connect(from, addr).await else {
        return;
    };
    if kept_alive {
        let _ = stream
            .write_all(b"GET /work HTTP/1.1\r\nhost: a\r\n\r\n")
            .await;
    }
    let mut buf = vec![0; 1024];
    let read_on = async { while let Ok(1..) = stream.read(&mut buf).await {} };
    tokio::select! {
        () = read_on => {}
        () = stopped(&mut stop) => {}
    }
}

/// An h2 client whose every stream's window is 0: it asks for a download on every
/// stream it may open, and (until told to quiesce) opens another for each that ends.
async fn zero_window(
    addr: SocketAddr,
    from: IpAddr,
    mut stop: watch::Receiver<bool>,
    quiesce: watch::Receiver<bool>,
    seen: Arc<Mutex<Seen>>,
) {
    let Some(mut stream) = connect(from, addr).await else {
        return;
    };
    let mut next_id = 1u32;
    let mut opened = std::collections::HashMap::new();
    let mut bytes = preface_with(&[(INITIAL_WINDOW_SIZE, 0)]);
    for _ in 0..STREAMS {
        bytes.extend(get_on(next_id, "/download"));
        opened.insert(next_id, Instant::now());
        next_id += 2;
    }
    if stream.write_all(&bytes).await.is_err() {
        return;
    }
    let mut read = Vec::new();
    let mut buf = vec![0; 16 * 1024];
    loop {
        let n = tokio::select! {
            n = stream.read(&mut buf) => n,
            () = stopped(&mut stop) => {
                let held = opened.values().filter(|since| since.elapsed() > RESET_WITHIN);
                seen.lock().expect("not poisoned").held_past_reset += held.count();
                return;
            }
        };
        match n {
            Ok(0) | Err(_) => return,
            Ok(n) => read.extend_from_slice(&buf[..n]),
        }
        let mut at = 0;
        let mut answer = Vec::new();
        while let Some((kind, flags, id, payload, len)) = parse(&read[at..]) {
            if kind == PING && flags == 0 {
                answer.extend(frame(PING, 1, 0, payload));
            }
            // A stream reset, or ended (a refusal with no body): another takes its place.
            let ended = matches!(kind, HEADERS | DATA) && flags & END_STREAM != 0;
            if kind == RST_STREAM || ended {
                let since = opened.remove(&id);
                if let (Some(since), RST_STREAM) = (since, kind) {
                    let mut seen = seen.lock().expect("not poisoned");
                    seen.resets += 1;
                    seen.longest_hold = seen.longest_hold.max(since.elapsed());
                }
                if !*quiesce.borrow() {
                    answer.extend(get_on(next_id, "/download"));
                    opened.insert(next_id, Instant::now());
                    next_id += 2;
                }
            }
            at += len;
        }
        read.drain(..at);
        if !answer.is_empty() && stream.write_all(&answer).await.is_err() {
            return;
        }
    }
}

/// Connections that open a thousand streams and reset them at once, one every 250 ms,
/// from 127.0.4.1, until `stop` says so (the attacks quiesce).
async fn rapid_reset(addr: SocketAddr, mut stop: watch::Receiver<bool>, seen: Arc<Mutex<Seen>>) {
    let mut flood = preface();
    for i in 0..1_000u32 {
        let id = 2 * i + 1;
        flood.extend(get_on(id, "/work"));
        flood.extend(frame(RST_STREAM, 0, id, &[0, 0, 0, 8]));
    }
    while !*stop.borrow() {
        if let Some(mut stream) = connect(loopback(4, 1), addr).await {
            let _ = stream.write_all(&flood).await;
            let answer = frames(&mut stream, Duration::from_secs(2)).await;
            let mut seen = seen.lock().expect("not poisoned");
            seen.floods += 1;
            // GOAWAY with ENHANCE_YOUR_CALM.
            if answer
                .iter()
                .any(|(kind, _, _, payload)| *kind == GOAWAY && payload.get(7) == Some(&0xb))
            {
                seen.floods_ended += 1;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
            () = stopped(&mut stop) => {}
        }
    }
}

/// An address that opens connections past its cap, from 127.0.5.1, and holds them.
async fn past_the_cap(addr: SocketAddr, mut stop: watch::Receiver<bool>, seen: Arc<Mutex<Seen>>) {
    let mut held = Vec::new();
    for _ in 0..PAST_THE_CAP {
        if let Some(stream) = connect(loopback(5, 1), addr).await {
            held.push(stream);
        }
    }
    // The ones over the cap are closed before anything is read.
    let mut closed = 0;
    for stream in &mut held {
        let mut buf = [0; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(20), stream.read(&mut buf)).await
        {
            closed += 1;
        }
    }
    seen.lock().expect("not poisoned").past_cap_closed = closed;
    stopped(&mut stop).await;
}
