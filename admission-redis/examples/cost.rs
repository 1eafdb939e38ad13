//! What a fleet-wide cap costs, on a `redis-server` on loopback that this example starts:
//! `cargo run --release -p admission-redis --example cost` (`-- --short` for CI).
//!
//! 1. **A request within its key's lease**, through the layer in-process (no network):
//!    the layer with a `PerKey` cap beside the same layer with the cap leased from a
//!    `FleetCap`, in alternating rounds; the median round of each.
//! 2. **A grant's round trip** to Redis (the grant script), sequential on loopback.
//! 3. **Redis calls per 1,000 requests at steady load**: three replicas in one process,
//!    one tenant's requests spread over them, within its cap.
//! 4. **Beside one round trip a request**, after Stripe's concurrent-requests limiter: a
//!    script that admits (a sorted set of the requests in flight, expired by age) and a
//!    `ZREM` that releases, each request.
//!
//! Exits non-zero if the steady load makes more than 20 Redis calls a 1,000 requests, or
//! if the leased layer lets more than the cap run at once. How long anything takes is
//! printed, never checked.

#[allow(dead_code, unreachable_pub)]
#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    let running = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
    let mut fleets = Vec::new();
    let mut services = Vec::new();
    for _ in 0..3 {
        let fleet = FleetCap::builder(redis.client(), CAP)
            .prefix("steady")
            .ttl(Duration::from_secs(3))
            .build()
            .expect("a fleet cap");
        let layer = AdmissionLayer::builder()
            .per_key(fleet.per_key(tenant_key))
            .build()
            .expect("a layer");
        let running = running.clone();
        let inner = tower::service_fn(move |_: Request<_>| {
            let running = running.clone();
            async move {
                let now = running.0.fetch_add(1, Ordering::SeqCst) + 1;
                running.1.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
                running.0.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        });
        services.push(tower::util::BoxCloneSyncService::new(layer.layer(inner)));
        fleets.push(fleet);
    }
    let run = if short {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(10)
    };
    let served = Arc::new(AtomicUsize::new(0));
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..36 {
        let (mut service, served) = (services[i % 3].clone(), served.clone());
        clients.spawn(async move {
            let end = Instant::now() + run;
            while Instant::now() < end {
                if send(&mut service).await == 200 {
                    served.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while clients.join_next().await.is_some() {}
    let served = served.load(Ordering::Relaxed);
    let calls: u64 = fleets.iter().map(|fleet| fleet.snapshot().calls).sum();
    let per_thousand = calls as f64 * 1000.0 / served as f64;
    let most = running.1.load(Ordering::SeqCst);
    println!();
    println!(
        "steady load, 3 replicas, 36 clients, one tenant capped at {CAP} ({} s, leases of 3 s):",
        run.as_secs()
    );
    println!(
        "  {served} requests served, {calls} Redis calls: {per_thousand:.1} a 1,000 requests (want <= 20)"
    );
    println!("  most in flight at once across the replicas: {most} (the cap: {CAP})");
    failed |= per_thousand > 20.0 || most > CAP;

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
