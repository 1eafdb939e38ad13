//! What a fleet-wide cap costs, on a `redis-server` on loopback that this example starts:
//! `cargo run --release -p admission-redis --example cost` (`-- --short` for CI).
//!
//! 1. **A request within its key's lease**, through the layer in-process (no network):
//!    the layer with a `PerKey` cap beside the same layer with the cap leased from a
//!    `FleetCap`, in alternating rounds; the median round of each.
//! 2. **A grant's round trip** to Redis (the grant script), sequential on loopback.
//! 3. **Redis calls per 1,000 requests at steady load**: three replicas in one process,
//!    one tenant's requests spread over them, within its cap; then the same with every
//!    client moving on to the next replica every 250 ms; then **how long a free slot
//!    takes to move**: the cap filled on one replica, its requests ended, one request to
//!    another timed to its answer.
//! 4. **Beside one round trip a request**, after Stripe's concurrent-requests limiter: a
//!    script that admits (a sorted set of the requests in flight, expired by age) and a
//!    `ZREM` that releases, each request.
//!
//! Exits non-zero if the steady or the moving load makes more than 20 Redis calls a 1,000
//! requests, if the leased layer lets more than the cap run at once, or if a free slot
//! ever waits past a second to move (the holder's renewal would move it at last). How
//! long anything takes is otherwise printed, never checked.

#[allow(dead_code, unreachable_pub)]
#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use admission_redis::{FleetCap, script};
use admission_tower::{AdmissionLayer, Key, PerKey};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service, ServiceExt};

const TENANT: &str = "acme";

fn request() -> Request<Full<Bytes>> {
    Request::get("/")
        .header("x-tenant", TENANT)
        .body(Full::default())
        .expect("a request")
}

fn tenant_key(parts: &http::request::Parts) -> Option<Key> {
    parts
        .headers
        .get("x-tenant")
        .map(|v| Key::from_bytes(v.as_bytes()))
}

/// One request of the tenant through `service`, its body read: its status.
async fn send<S, B>(service: &mut S) -> http::StatusCode
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: hyper::body::Body,
{
    let response = service
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap();
    let status = response.status();
    drop(response.into_body().collect().await);
    status
}

/// Nanoseconds a request, over `n` requests one after another through `layer`.
async fn per_request(layer: &AdmissionLayer, n: u32) -> f64 {
    let inner = tower::service_fn(|_: Request<_>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    });
    let mut service = layer.layer(inner);
    let start = Instant::now();
    for _ in 0..n {
        assert_eq!(send(&mut service).await, 200);
    }
    start.elapsed().as_nanos() as f64 / f64::from(n)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn percentile(values: &mut [Duration], p: f64) -> Duration {
    values.sort();
    values[((values.len() - 1) as f64 * p) as usize]
}

type Replica = tower::util::BoxCloneSyncService<
    Request<Full<Bytes>>,
    Response<admission_tower::ResponseBody<Full<Bytes>>>,
    Infallible,
>;

/// Replicas in this process sharing one tenant's cap, each a layer over a handler that
/// takes `service` and counts what runs across them.
struct Fleet {
    caps: Vec<FleetCap>,
    services: Vec<Replica>,
    /// Running now, and the most ever at once.
    running: Arc<(AtomicUsize, AtomicUsize)>,
    /// Whether the handlers take their time (or answer at once).
    slow: Arc<AtomicBool>,
}

impl Fleet {
    async fn start(
        redis: &redis_server::Redis,
        prefix: &str,
        cap: usize,
        replicas: usize,
        service: Duration,
    ) -> Self {
        let running = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
        let slow = Arc::new(AtomicBool::new(true));
        let (mut caps, mut services) = (Vec::new(), Vec::new());
        for _ in 0..replicas {
            let fleet = FleetCap::builder(redis.client(), cap)
                .prefix(prefix)
                .build()
                .expect("a fleet cap");
            let layer = AdmissionLayer::builder()
                .per_key(fleet.per_key(tenant_key))
                .build()
                .expect("a layer");
            let (running, slow) = (running.clone(), slow.clone());
            let inner = tower::service_fn(move |_: Request<_>| {
                let (running, slow) = (running.clone(), slow.clone());
                async move {
                    let now = running.0.fetch_add(1, Ordering::SeqCst) + 1;
                    running.1.fetch_max(now, Ordering::SeqCst);
                    if slow.load(Ordering::Relaxed) {
                        tokio::time::sleep(service).await;
                    }
                    running.0.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                }
            });
            services.push(tower::util::BoxCloneSyncService::new(layer.layer(inner)));
            caps.push(fleet);
        }
        Self {
            caps,
            services,
            running,
            slow,
        }
    }

    /// `clients` clients sending one after another for `run`, client `i` to the replica
    /// `to(i, elapsed)`: the requests served.
    async fn load(
        &self,
        clients: usize,
        run: Duration,
        to: impl Fn(usize, Duration) -> usize + Copy + Send + 'static,
    ) -> usize {
        let served = Arc::new(AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        let start = Instant::now();
        for i in 0..clients {
            let (services, served) = (self.services.clone(), served.clone());
            tasks.spawn(async move {
                while start.elapsed() < run {
                    let mut service = services[to(i, start.elapsed()) % services.len()].clone();
                    if send(&mut service).await == 200 {
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        served.load(Ordering::Relaxed)
    }

    fn calls_per_thousand(&self, served: usize) -> f64 {
        let calls: u64 = self.caps.iter().map(|cap| cap.snapshot().calls).sum();
        calls as f64 * 1000.0 / served as f64
    }

    fn most(&self) -> usize {
        self.running.1.load(Ordering::SeqCst)
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let short = std::env::args().any(|arg| arg == "--short");
    let Some(redis) = redis_server::Redis::start("cost") else {
        eprintln!("this example needs redis-server (Debian's redis-server package)");
        return std::process::ExitCode::FAILURE;
    };
    let mut failed = false;
    let (rounds, n) = if short { (3, 20_000) } else { (9, 100_000) };

    // 1. Within a lease.
    let local = AdmissionLayer::builder()
        .per_key(PerKey::new(64, tenant_key))
        .build()
        .expect("a layer");
    let fleet = FleetCap::builder(redis.client(), 64)
        .prefix("cost")
        .build()
        .expect("a fleet cap");
    let leased = AdmissionLayer::builder()
        .per_key(fleet.per_key(tenant_key))
        .build()
        .expect("a layer");
    per_request(&leased, 10).await; // the lease's first grant
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        a.push(per_request(&local, n).await);
        b.push(per_request(&leased, n).await);
    }
    let (local_ns, leased_ns) = (median(a), median(b));
    println!(
        "a request within its key's lease, through the layer in-process ({rounds} rounds of {n}):"
    );
    println!("  PerKey (this process only)   {local_ns:>8.0} ns");
    println!(
        "  FleetCap (leased)            {leased_ns:>8.0} ns  ({:+.0} ns, {:.2}x)",
        leased_ns - local_ns,
        leased_ns / local_ns
    );
    let calls_within = fleet.snapshot().calls;
    println!(
        "  Redis calls in those {} requests: {calls_within}",
        u64::from(n) * rounds as u64 + 10
    );

    // 2. A grant's round trip.
    let mut connection = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    let grant = redis::Script::new(script::GRANT);
    let mut trips = Vec::new();
    for i in 0..if short { 500 } else { 5_000 } {
        let start = Instant::now();
        let _: (u64, u64, u64) = grant
            .key("cost:trip")
            .arg("r")
            .arg(i % 16 + 1)
            .arg(16)
            .arg(10_000)
            .arg("cost:leases")
            .invoke_async(&mut connection)
            .await
            .expect("a grant");
        trips.push(start.elapsed());
    }
    println!();
    println!(
        "a grant's round trip (the script, loopback): p50 {:.0} us, p99 {:.0} us",
        percentile(&mut trips, 0.5).as_secs_f64() * 1e6,
        percentile(&mut trips, 0.99).as_secs_f64() * 1e6
    );

    // 3. Steady load over three replicas.
    const CAP: usize = 48;
    let run = if short {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(10)
    };
    let steady = Fleet::start(&redis, "steady", CAP, 3, Duration::from_millis(1)).await;
    let served = steady.load(36, run, |i, _| i % 3).await;
    let (per_thousand, most) = (steady.calls_per_thousand(served), steady.most());
    println!();
    println!(
        "steady load, 3 replicas, 36 clients, one tenant capped at {CAP} ({} s):",
        run.as_secs()
    );
    println!(
        "  {served} requests served: {per_thousand:.1} Redis calls a 1,000 requests (want <= 20)"
    );
    println!("  most in flight at once across the replicas: {most} (the cap: {CAP})");
    failed |= per_thousand > 20.0 || most > CAP;

    // 3b. The tenant's traffic moving, and over its cap: 64 clients, every one moving on
    // to the next replica every 250 ms, as behind a balancer that shifts.
    let moving = Fleet::start(&redis, "moving", CAP, 3, Duration::from_millis(1)).await;
    let step = Duration::from_millis(250);
    let served = moving
        .load(64, run, move |_, elapsed| {
            (elapsed.as_millis() / step.as_millis()) as usize % 3
        })
        .await;
    let (per_thousand, most) = (moving.calls_per_thousand(served), moving.most());
    let given_back: u64 = moving
        .caps
        .iter()
        .map(|cap| cap.snapshot().given_back)
        .sum();
    println!();
    println!("moving load, 64 clients (over the cap), all on the next replica every 250 ms:");
    println!(
        "  {served} requests served: {per_thousand:.1} Redis calls a 1,000 requests (want <= 20), \
         {given_back} give-backs"
    );
    println!("  most in flight at once across the replicas: {most} (the cap: {CAP})");
    failed |= per_thousand > 20.0 || most > CAP;

    // 3c. How long a free slot takes to move: one replica fills the cap, its requests
    // end, and another replica's request is timed from then to its answer.
    let pair = Fleet::start(&redis, "reclaim", 8, 2, Duration::from_millis(20)).await;
    let mut moves = Vec::new();
    for i in 0..if short { 10 } else { 100 } {
        let (from, to) = (i % 2, (i + 1) % 2);
        pair.slow.store(true, Ordering::Relaxed);
        let mut fill = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let mut service = pair.services[from].clone();
            fill.spawn(async move { send(&mut service).await });
        }
        while let Some(status) = fill.join_next().await {
            assert_eq!(status.expect("a request"), 200);
        }
        if pair.caps[from].held(&Key::from(TENANT)) != 8 {
            println!("  the cap was not held on one replica before the move");
            failed = true;
        }
        pair.slow.store(false, Ordering::Relaxed);
        let freed = Instant::now();
        let mut service = pair.services[to].clone();
        let status = send(&mut service).await;
        moves.push(freed.elapsed());
        failed |= status != 200;
    }
    let slowest = *moves.iter().max().expect("moves");
    println!();
    println!(
        "a free slot moving to another replica (the cap held on one, then free): \
         p50 {:.1} ms, slowest {:.1} ms of {} (the holder's renewal: 3.3 s)",
        percentile(&mut moves, 0.5).as_secs_f64() * 1e3,
        slowest.as_secs_f64() * 1e3,
        moves.len()
    );
    failed |= slowest > Duration::from_secs(1);

    // 4. One round trip a request, to admit, and one to release.
    const ADMIT: &str = r"
local now = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 60000)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], now, ARGV[1])
return 1
";
    let admit = redis::Script::new(ADMIT);
    let mut per = Vec::new();
    let epoch = Instant::now();
    for i in 0..if short { 500 } else { 5_000 } {
        let start = Instant::now();
        let id = format!("req-{i}");
        let admitted: u64 = admit
            .key("stripe:acme")
            .arg(&id)
            .arg(epoch.elapsed().as_millis() as u64 + 1_000_000)
            .arg(CAP)
            .invoke_async(&mut connection)
            .await
            .expect("an admission");
        assert_eq!(admitted, 1);
        let _: u64 = redis::cmd("ZREM")
            .arg("stripe:acme")
            .arg(&id)
            .query_async(&mut connection)
            .await
            .expect("a release");
        per.push(start.elapsed());
    }
    let stripe = percentile(&mut per, 0.5);
    println!();
    println!(
        "one round trip a request (admit, then release): p50 {:.0} us added a request, \
         2,000 Redis calls a 1,000 requests",
        stripe.as_secs_f64() * 1e6
    );
    println!(
        "  against FleetCap within its lease: {:+.0} ns a request ({:.0}x less)",
        leased_ns - local_ns,
        stripe.as_nanos() as f64 / (leased_ns - local_ns).max(1.0)
    );
    if failed {
        println!("MISSED");
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}
