//! The burst's clients and what they met, by outcome and by class.

use super::*;

/// How one client request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Outcome {
    Admitted,
    HungUp,
    Shed(u16),
    Failed,
}

/// What one priority class's requests met.
#[derive(Default, Clone)]
pub(crate) struct ClassTally {
    pub(crate) sent: u64,
    pub(crate) admitted: u64,
    pub(crate) shed: u64,
    pub(crate) failed: u64,
    pub(crate) latency: Vec<Duration>,
}

#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) sent: AtomicU64,
    pub(crate) outcomes: Mutex<HashMap<Outcome, u64>>,
    pub(crate) admitted_latency: Mutex<Vec<Duration>>,
    pub(crate) shed_latency: Mutex<Vec<Duration>>,
    pub(crate) by_class: Mutex<HashMap<&'static str, ClassTally>>,
}

impl Tally {
    fn record(&self, class: &'static str, outcome: Outcome, head_after: Option<Duration>) {
        {
            let mut by_class = self.by_class.lock().unwrap();
            let tally = by_class.entry(class).or_default();
            tally.sent += 1;
            match outcome {
                Outcome::Admitted | Outcome::HungUp => tally.admitted += 1,
                Outcome::Shed(_) => tally.shed += 1,
                Outcome::Failed => tally.failed += 1,
            }
            if let (Outcome::Admitted | Outcome::HungUp, Some(latency)) = (outcome, head_after) {
                tally.latency.push(latency);
            }
        }
        *self.outcomes.lock().unwrap().entry(outcome).or_default() += 1;
        if let Some(latency) = head_after {
            match outcome {
                Outcome::Shed(_) => self.shed_latency.lock().unwrap().push(latency),
                Outcome::Admitted | Outcome::HungUp => {
                    self.admitted_latency.lock().unwrap().push(latency)
                }
                Outcome::Failed => {}
            }
        }
    }

    pub(crate) fn count(&self, outcome: Outcome) -> u64 {
        self.outcomes
            .lock()
            .unwrap()
            .get(&outcome)
            .copied()
            .unwrap_or(0)
    }
}

async fn client(addr: SocketAddr, request: Request<Full<Bytes>>, hang_up: bool, tally: Arc<Tally>) {
    tally.sent.fetch_add(1, Ordering::Relaxed);
    let class = match request
        .headers()
        .get("x-request-class")
        .map(|v| v.as_bytes())
    {
        Some(b"critical") => "critical",
        Some(b"sheddable") => "sheddable",
        _ => "default",
    };
    let run = async {
        let stream = TcpStream::connect(addr).await.ok()?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .ok()?;
        tokio::spawn(conn);
        let start = Instant::now();
        let mut response = sender.send_request(request).await.ok()?;
        let head_after = start.elapsed();
        let status = response.status();
        if status != StatusCode::OK {
            let body = response.into_body().collect().await.ok()?.to_bytes();
            // The default refusal body names the dimension: tell count from bytes.
            let code = match (status.as_u16(), body.starts_with(b"overloaded: byte")) {
                (503, true) => 5031,
                (code, _) => code,
            };
            return Some((Outcome::Shed(code), head_after));
        }
        if hang_up {
            let _ = response.body_mut().frame().await;
            return Some((Outcome::HungUp, head_after)); // drops the connection
        }
        response.into_body().collect().await.ok()?;
        Some((Outcome::Admitted, head_after))
    };
    match tokio::time::timeout(CLIENT_TIMEOUT, run).await {
        Ok(Some((outcome, latency))) => tally.record(class, outcome, Some(latency)),
        _ => tally.record(class, Outcome::Failed, None),
    }
}

/// A request of the burst, from client `key`, of class `class`, with a body of `body`
/// bytes if any.
fn make_request(path: &str, key: &str, class: &str, body: Option<usize>) -> Request<Full<Bytes>> {
    let builder = Request::builder()
        .uri(path)
        .header("x-client", key)
        .header("x-request-class", class);
    match body {
        Some(n) => builder
            .method("POST")
            .body(Full::new(Bytes::from(vec![b'x'; n]))),
        None => builder.body(Full::default()),
    }
    .expect("a valid request")
}

/// The burst, under way: its clients, and the critical checkouts that run through it.
pub(crate) struct Burst {
    clients: Vec<JoinHandle<()>>,
    checkouts: Vec<JoinHandle<()>>,
    over: Arc<AtomicBool>,
}

impl Burst {
    pub(crate) async fn start(
        addr: SocketAddr,
        layer: &AdmissionLayer,
        tally: &Arc<Tally>,
        started: Instant,
    ) -> Self {
        let mut clients = Vec::new();
        // First the noisy client, which meets its cap before the rest comes: on a loaded
        // machine the burst would otherwise fill the count limit first, and its sheddable
        // requests would all be shed by count, never reaching the per-client cap...
        for _ in 0..NOISY {
            let request = make_request("/stream", "noisy", "sheddable", None);
            clients.push(tokio::spawn(client(addr, request, false, tally.clone())));
        }
        let keyed = layer.gate().keyed().expect("a per-client cap").clone();
        while keyed.snapshot().refused_key < (NOISY - PER_KEY) as u64
            && started.elapsed() < Duration::from_secs(5)
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // ...then the uploads and the too-large uploads, all at once...
        for u in 0..UPLOADS {
            let key = format!("uploader-{u}");
            let request = make_request("/upload", &key, "default", Some(UPLOAD_BYTES));
            clients.push(tokio::spawn(client(addr, request, false, tally.clone())));
        }
        for t in 0..TOO_LARGE {
            let size = MAX_REQUEST as usize * 2;
            let request = make_request("/upload", &format!("big-{t}"), "default", Some(size));
            clients.push(tokio::spawn(client(addr, request, false, tally.clone())));
        }
        // ...then the streams, in waves of 40 every 100 ms.
        clients.push(tokio::spawn(streams(addr, tally.clone())));
        // Critical checkouts throughout the burst, each client one at a time.
        let over = Arc::new(AtomicBool::new(false));
        let checkouts = (0..CRITICAL_CLIENTS)
            .map(|c| tokio::spawn(checkouts(addr, c, tally.clone(), over.clone())))
            .collect();
        Burst {
            clients,
            checkouts,
            over,
        }
    }

    pub(crate) fn is_running(&self) -> bool {
        self.clients.iter().any(|c| !c.is_finished())
    }

    /// Waits for the burst's clients.
    pub(crate) async fn clients_done(&mut self) {
        for c in self.clients.drain(..) {
            let _ = c.await;
        }
    }

    /// Stops the checkouts, and waits for the last.
    pub(crate) async fn end(self) {
        self.over.store(true, Ordering::Relaxed);
        for c in self.checkouts {
            let _ = c.await;
        }
    }
}

async fn streams(addr: SocketAddr, tally: Arc<Tally>) {
    let mut streams = Vec::new();
    for i in 0..STREAMS {
        let key = format!("client-{}", i % 100);
        let class = if i % 3 == 0 { "default" } else { "sheddable" };
        let request = make_request("/stream", &key, class, None);
        let hang_up = i % HANGUP_EVERY == 0;
        streams.push(tokio::spawn(client(addr, request, hang_up, tally.clone())));
        if i % 40 == 39 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for s in streams {
        let _ = s.await;
    }
}

async fn checkouts(addr: SocketAddr, c: usize, tally: Arc<Tally>, over: Arc<AtomicBool>) {
    let mut n = 0;
    while !over.load(Ordering::Relaxed) {
        let key = format!("buyer-{c}-{n}");
        let request = make_request("/checkout", &key, "critical", None);
        client(addr, request, false, tally.clone()).await;
        n += 1;
    }
}

/// Liveness probes sent while the burst ran: how many, answered, and how fast.
#[derive(Default)]
pub(crate) struct Probes {
    pub(crate) sent: u64,
    pub(crate) ok: u64,
    pub(crate) latency: Vec<Duration>,
}

/// Probes `/health` while the burst runs, with a progress line every 250 ms.
pub(crate) async fn probe_while(
    burst: &Burst,
    addr: SocketAddr,
    layer: &AdmissionLayer,
    tally: &Tally,
    started: Instant,
) -> Probes {
    let mut probes = Probes::default();
    let mut last_report = Instant::now();
    let count = layer.gate().count().clone();
    while burst.is_running() {
        probes.sent += 1;
        let start = Instant::now();
        let probe = tokio::time::timeout(Duration::from_secs(2), async {
            let stream = TcpStream::connect(addr).await.ok()?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .ok()?;
            tokio::spawn(conn);
            let request = Request::get("/health")
                .body(Full::<Bytes>::default())
                .ok()?;
            let response = sender.send_request(request).await.ok()?;
            (response.status() == StatusCode::OK).then_some(())
        })
        .await;
        if let Ok(Some(())) = probe {
            probes.ok += 1;
            probes.latency.push(start.elapsed());
        }
        if last_report.elapsed() >= Duration::from_millis(250) {
            last_report = Instant::now();
            println!(
                "  t={:>4.2}s  sent {:>4}  in flight {:>2}/{COUNT_LIMIT}  admitted {:>4}  shed {:>4}  probes {}/{}",
                started.elapsed().as_secs_f64(),
                tally.sent.load(Ordering::Relaxed),
                count.in_flight(),
                tally.count(Outcome::Admitted) + tally.count(Outcome::HungUp),
                tally.count(Outcome::Shed(503))
                    + tally.count(Outcome::Shed(5031))
                    + tally.count(Outcome::Shed(429))
                    + tally.count(Outcome::Shed(413)),
                probes.ok,
                probes.sent,
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    probes
}
