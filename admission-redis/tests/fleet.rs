//! The fleet-wide cap against a real `redis-server`: three replicas (three layers served on
//! loopback in one process) share a tenant's cap, counted by the handlers themselves.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use admission_redis::{Fallback, FleetCap};
use support::{Redis, Replica, Running, eventually_within, get, load};

const SERVICE: Duration = Duration::from_millis(10);

async fn replicas(
    redis: &Redis,
    prefix: &str,
    cap: usize,
    ttl: Duration,
) -> (Vec<Replica>, Arc<Running>) {
    let running = Arc::new(Running::default());
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let fleet = FleetCap::builder(redis.client(), cap)
            .ttl(ttl)
            .prefix(prefix)
            .build()
            .expect("a fleet cap");
        replicas.push(Replica::start(fleet, running.clone(), SERVICE).await);
    }
    (replicas, running)
}

/// Two replicas sharing a cap of `cap` under `prefix`, leases of `ttl`, each request's
/// handler taking `service`.
async fn two(
    redis: &Redis,
    prefix: &str,
    cap: usize,
    ttl: Duration,
    service: Duration,
) -> (Replica, Replica, Arc<Running>) {
    let running = Arc::new(Running::default());
    let build = || {
        FleetCap::builder(redis.client(), cap)
            .prefix(prefix)
            .ttl(ttl)
            .build()
            .expect("a fleet cap")
    };
    let a = Replica::start(build(), running.clone(), service).await;
    let b = Replica::start(build(), running.clone(), service).await;
    (a, b, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_hold_a_tenant_to_its_cap_evenly_or_skewed() {
    let Some(redis) = Redis::start("three_replicas") else {
        return;
    };
    const CAP: usize = 12;
    // Leases of 1.5 s: renewed every 0.5 s, when a replica that holds much gives back.
    let (replicas, running) = replicas(&redis, "even", CAP, Duration::from_millis(1500)).await;
    let addrs: Vec<_> = replicas.iter().map(|replica| replica.addr).collect();

    // Spread evenly: 16 clients on each replica, the tenant's cap 12 in all; each replica
    // comes to hold a fair part of it (none keeps the others out).
    let even = tokio::spawn({
        let addrs = addrs.clone();
        async move { load(&addrs, 48, "acme", Duration::from_millis(2500)).await }
    });
    eventually_within(
        "every replica holds a part",
        Duration::from_millis(2400),
        || replicas.iter().all(|r| r.fleet.held(&"acme".into()) >= 2),
    )
    .await;
    let even = even.await.unwrap();
    assert_eq!(even.failed, 0, "{even:?}");
    assert!(
        running.most() <= CAP,
        "{} in flight across the fleet",
        running.most()
    );
    assert_eq!(
        running.most(),
        CAP,
        "spread evenly, the tenant reaches its cap"
    );
    assert!(even.refused > 0 && even.ok > 0, "{even:?}");
    let calls: u64 = replicas.iter().map(|r| r.fleet.snapshot().calls).sum();
    eprintln!("even: {even:?}, {calls} Redis calls");

    // Skewed: another tenant, all of it on one replica.
    running.reset();
    let skewed = load(&addrs[..1], 32, "globex", Duration::from_millis(1500)).await;
    assert_eq!(skewed.failed, 0, "{skewed:?}");
    assert!(running.most() <= CAP, "{} in flight", running.most());
    assert_eq!(
        running.most(),
        CAP,
        "on one replica, the tenant reaches its cap"
    );

    // Both at once, skewed 2:1:1; and the fleet's calls stay a few a thousand requests.
    running.reset();
    let targets = [addrs[0], addrs[0], addrs[1], addrs[2]];
    let (a, b) = tokio::join!(
        load(&targets, 32, "acme", Duration::from_millis(1500)),
        load(&targets, 32, "globex", Duration::from_millis(1500)),
    );
    assert!(
        running.most() <= 2 * CAP,
        "{} in flight for two tenants",
        running.most()
    );
    assert_eq!(a.failed + b.failed, 0);
    for replica in &replicas {
        let snapshot = replica.fleet.snapshot();
        assert!(!snapshot.fallback && snapshot.errors == 0, "{snapshot:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_dies_gives_its_share_back_within_the_ttl() {
    let Some(redis) = Redis::start("a_replica_that_dies") else {
        return;
    };
    const CAP: usize = 8;
    let ttl = Duration::from_secs(1);
    let (mut replicas, running) = replicas(&redis, "dies", CAP, ttl).await;
    let survivor = replicas.pop().unwrap();
    let doomed = replicas.pop().unwrap();
    // The doomed replica takes the whole cap, and dies holding it.
    let held = load(&[doomed.addr], 16, "acme", Duration::from_millis(500)).await;
    assert!(held.ok > 0);
    assert_eq!(doomed.fleet.held(&"acme".into()), CAP);
    let died = Instant::now();
    let fleet = doomed.fleet.clone();
    doomed.kill();
    drop(fleet); // its upkeep stops with it: no renewal, no return
    running.reset();
    // The survivor, loaded from the moment of death, reaches the cap once the dead
    // replica's leases expire: within the TTL and a renewal round.
    let survivor_fleet = survivor.fleet.clone();
    let waiter = tokio::spawn(async move {
        eventually_within("the survivor holds the cap", Duration::from_secs(5), || {
            survivor_fleet.held(&"acme".into()) == CAP
        })
        .await;
        died.elapsed()
    });
    let after = load(&[survivor.addr], 16, "acme", Duration::from_millis(2500)).await;
    let took = waiter.await.unwrap();
    assert!(
        took <= ttl + ttl / 3 + Duration::from_millis(500),
        "took {took:?}"
    );
    assert!(running.most() <= CAP);
    assert_eq!(running.most(), CAP);
    assert_eq!(after.failed, 0);
    eprintln!("the survivor held the cap {took:?} after the death");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_mid_load_falls_back_and_rejoins_when_it_returns() {
    let Some(mut redis) = Redis::start("redis_stopped") else {
        return;
    };
    const CAP: usize = 12;
    let ttl = Duration::from_millis(900);
    let (replicas, running) = replicas(&redis, "stopped", CAP, ttl).await;
    let addrs: Vec<_> = replicas.iter().map(|replica| replica.addr).collect();
    // Each replica has counted three live before the load.
    eventually_within("three replicas counted", Duration::from_secs(3), || {
        replicas.iter().all(|r| r.fleet.snapshot().replicas == 3)
    })
    .await;
    let loaded = tokio::spawn({
        let addrs = addrs.clone();
        async move { load(&addrs, 36, "acme", Duration::from_millis(2500)).await }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    redis.stop();
    eventually_within(
        "every replica on its fallback",
        Duration::from_secs(2),
        || replicas.iter().all(|r| r.fleet.snapshot().fallback),
    )
    .await;
    // On the fallback: cap / 3 a replica, so the fleet holds the cap still, once what a
    // replica held above its share at the switch has finished (a few service times).
    for replica in &replicas {
        assert_eq!(replica.fleet.held(&"acme".into()), CAP / 3);
    }
    tokio::time::sleep(SERVICE * 5).await;
    running.reset();
    let outage = loaded.await.unwrap();
    assert_eq!(outage.failed, 0, "{outage:?}");
    assert!(outage.ok > 0 && outage.refused > 0);
    assert!(
        running.most() <= CAP,
        "{} in flight on the fallback",
        running.most()
    );
    // No request waited on the dead Redis past its grant timeout (100 ms) for long.
    assert!(outage.slowest < Duration::from_secs(1), "{outage:?}");

    redis.restart();
    eventually_within("every replica back", Duration::from_secs(3), || {
        replicas.iter().all(|r| !r.fleet.snapshot().fallback)
    })
    .await;
    running.reset();
    let back = load(&addrs, 36, "acme", Duration::from_millis(1500)).await;
    assert_eq!(back.failed, 0);
    assert!(
        running.most() <= CAP,
        "{} in flight after the return",
        running.most()
    );
    assert_eq!(running.most(), CAP, "the tenant reaches its cap again");
    for replica in &replicas {
        let snapshot = replica.fleet.snapshot();
        assert_eq!(snapshot.fallbacks, 1, "{snapshot:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fallback_holds_a_key_to_its_cap_and_never_to_none() {
    // A Redis that is not there: the port of a listener just closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    for (fallback, expected) in [
        (Fallback::Share, 4),
        (Fallback::Closed, 0),
        (Fallback::Local(5), 5),
        (Fallback::Local(100), 12),
    ] {
        let fleet = FleetCap::builder(client.clone(), 12)
            .replicas(3)
            .fallback(fallback)
            .build()
            .unwrap();
        let running = Arc::new(Running::default());
        let replica = Replica::start(fleet.clone(), running, SERVICE).await;
        let tally = load(&[replica.addr], 1, "acme", Duration::from_millis(200)).await;
        assert_eq!(tally.failed, 0);
        assert!(fleet.snapshot().fallback, "{fallback:?}");
        assert_eq!(fleet.held(&"acme".into()), expected, "{fallback:?}");
        assert!(tally.slowest < Duration::from_secs(1), "{tally:?}");
    }
    // A key held as a digest cannot be named in Redis: held to the fallback's share.
    let fleet = FleetCap::builder(client, 12).replicas(2).build().unwrap();
    let long = admission_core::Key::from("k".repeat(100).as_str());
    assert_eq!(fleet.held(&long), 6);
}

#[tokio::test]
async fn one_cap_serves_one_layer_and_a_second_layer_s_build_says_so() {
    let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let fleet = FleetCap::builder(client, 8).build().unwrap();
    let tenant = || admission_tower::key::header(http::HeaderName::from_static("x-tenant"));
    let layer = |fleet: &FleetCap| {
        admission_tower::AdmissionLayer::builder()
            .count(64)
            .per_key(fleet.per_key(tenant()))
            .build()
    };
    assert!(layer(&fleet).is_ok());
    let second = layer(&fleet).unwrap_err();
    assert_eq!(second, admission_tower::BuildError::LeasesTaken);
}

#[test]
fn a_cap_built_outside_a_runtime_is_an_error_that_names_the_runtime() {
    use admission_redis::FleetError;
    let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let error = FleetCap::builder(client.clone(), 8).build().unwrap_err();
    assert!(matches!(error, FleetError::NoRuntime), "{error:?}");
    assert!(error.to_string().contains("tokio runtime"), "{error}");
    // Inside one (entered, not awaited), it builds.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    assert!(FleetCap::builder(client, 8).build().is_ok());
}

#[tokio::test]
async fn settings_that_would_refuse_everything_or_never_renew_are_errors() {
    use admission_redis::FleetError;
    let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let build = |builder: admission_redis::FleetCapBuilder| builder.build().unwrap_err();
    let base = || FleetCap::builder(client.clone(), 8);
    for (error, what) in [
        (build(FleetCap::builder(client.clone(), 0)), "cap"),
        (build(base().chunk(0)), "chunk"),
        (build(base().replicas(0)), "replicas"),
        (build(base().max_pending(0)), "max_pending"),
        (build(base().ttl(Duration::ZERO)), "ttl"),
        (build(base().grant_timeout(Duration::ZERO)), "grant_timeout"),
    ] {
        assert!(
            matches!(error, FleetError::Zero(named) if named == what),
            "{error:?}"
        );
        let said = error.to_string();
        assert!(said.contains(what) && said.contains("at least 1"), "{said}");
    }
    let debug = format!("{:?}", base().chunk(3));
    assert!(
        debug.contains("chunk: 3") && debug.contains("cap: 8"),
        "{debug}"
    );
    let slow = build(base().ttl(Duration::from_millis(300)));
    assert!(matches!(slow, FleetError::SlowGrant), "{slow:?}");
    assert!(base().ttl(Duration::from_millis(301)).build().is_ok());
    let bad = FleetCap::builder(redis::Client::open("redis://127.0.0.1:1/").unwrap(), 8);
    assert!(
        bad.build().is_ok(),
        "nothing is sent to Redis before it is needed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_that_heals_counts_nothing_twice_past_the_ttl() {
    let Some(redis) = Redis::start("a_partition") else {
        return;
    };
    const CAP: usize = 12;
    let ttl = Duration::from_millis(900);
    let partition = support::Partition::to(redis.port).await;
    let running = Arc::new(Running::default());
    let mut replicas = Vec::new();
    for client in [partition.client(), redis.client(), redis.client()] {
        let fleet = FleetCap::builder(client, CAP)
            .ttl(ttl)
            .prefix("partition")
            .build()
            .unwrap();
        replicas.push(Replica::start(fleet, running.clone(), SERVICE).await);
    }
    let addrs: Vec<_> = replicas.iter().map(|replica| replica.addr).collect();
    let (cut_off, others) = (&replicas[0].fleet, [&replicas[1].fleet, &replicas[2].fleet]);
    eventually_within("three replicas counted", Duration::from_secs(3), || {
        replicas.iter().all(|r| r.fleet.snapshot().replicas == 3)
    })
    .await;
    let loaded = tokio::spawn({
        let addrs = addrs.clone();
        async move { load(&addrs, 36, "acme", Duration::from_millis(3000)).await }
    });
    eventually_within(
        "the replica to be cut off holds a part",
        Duration::from_secs(2),
        || cut_off.held(&"acme".into()) > 0,
    )
    .await;
    partition.cut();
    let cut = Instant::now();
    // The cut-off replica goes on its fallback (cap / 3) at its next call to Redis.
    eventually_within(
        "the cut-off replica on its fallback",
        Duration::from_secs(2),
        || cut_off.snapshot().fallback,
    )
    .await;
    assert_eq!(cut_off.held(&"acme".into()), CAP / 3);
    // Its leases expire within the TTL: the others may then hold the whole cap between
    // them, and never more.
    eventually_within("the others hold the cap", Duration::from_secs(3), || {
        others.iter().map(|f| f.held(&"acme".into())).sum::<usize>() == CAP
    })
    .await;
    assert!(
        cut.elapsed() <= ttl + ttl / 3 + Duration::from_millis(500),
        "{:?}",
        cut.elapsed()
    );
    assert!(others.iter().all(|f| !f.snapshot().fallback));
    // Meanwhile the fleet holds at most the cap and the cut-off replica's fallback (the
    // README says so).
    tokio::time::sleep(SERVICE * 5).await;
    assert!(
        running.most() <= CAP + CAP / 3,
        "{} in flight during the partition",
        running.most()
    );

    partition.heal();
    eventually_within("the cut-off replica back", Duration::from_secs(3), || {
        !cut_off.snapshot().fallback
    })
    .await;
    // Once what it admitted on its fallback has finished, the fleet holds the cap again.
    tokio::time::sleep(SERVICE * 5).await;
    running.reset();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        running.most() <= CAP,
        "{} in flight after the heal",
        running.most()
    );
    let tally = loaded.await.unwrap();
    assert_eq!(tally.failed, 0, "{tally:?}");
    // What Redis counts: never above the cap.
    let mut connection = redis.client().get_connection().unwrap();
    let leases: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg("partition:{key:acme}")
        .query(&mut connection)
        .unwrap();
    let counted: usize = leases
        .iter()
        .filter(|(field, _)| !field.starts_with('~')) // a replica that waits
        .map(|(_, lease)| lease.split_once(':').unwrap().0.parse::<usize>().unwrap())
        .sum();
    assert!(counted <= CAP, "{leases:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_nothing_in_flight_are_forgotten_on_both_sides() {
    let Some(redis) = Redis::start("forgotten") else {
        return;
    };
    let ttl = Duration::from_millis(600);
    let (replicas, _running) = replicas(&redis, "forget", 8, ttl).await;
    let addrs: Vec<_> = replicas.iter().map(|replica| replica.addr).collect();
    let run = Duration::from_millis(400);
    let tallies = tokio::join!(
        load(&addrs, 6, "t1", run),
        load(&addrs, 6, "t2", run),
        load(&addrs, 6, "t3", run),
        load(&addrs, 6, "t4", run),
    );
    for tally in [tallies.0, tallies.1, tallies.2, tallies.3] {
        assert!(tally.ok > 0 && tally.failed == 0, "{tally:?}");
    }
    let mut connection = redis.client().get_connection().unwrap();
    let held = |connection: &mut redis::Connection| -> usize {
        let names: Vec<String> = redis::cmd("KEYS")
            .arg("forget:{key:*")
            .query(connection)
            .unwrap();
        names.len()
    };
    assert!(
        held(&mut connection) > 0,
        "leases in Redis as the load ends"
    );
    // Given back within a few renewal rounds (two idle, one to set Redis), then forgotten.
    eventually_within(
        "every replica forgets every key",
        Duration::from_secs(3),
        || replicas.iter().all(|r| r.fleet.snapshot().keys == 0),
    )
    .await;
    // A key forgotten was given back first: Redis holds no lease of it (at most the
    // marks of replicas that waited, which expire on their own).
    for tenant in ["t1", "t2", "t3", "t4"] {
        let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(format!("forget:{{key:{tenant}}}"))
            .query(&mut connection)
            .unwrap();
        assert!(
            fields.keys().all(|field| field.starts_with('~')),
            "{tenant}: {fields:?}"
        );
    }
    let start = Instant::now();
    while held(&mut connection) > 0 {
        assert!(start.elapsed() < ttl * 2, "Redis still holds marks");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(replicas.iter().all(|r| r.fleet.snapshot().slots == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_stalls_no_request_past_the_grant_timeout() {
    let Some(redis) = Redis::start("slow") else {
        return;
    };
    let (replicas, _running) = replicas(&redis, "slow", 8, Duration::from_secs(3)).await;
    let replica = &replicas[0];
    eventually_within("the replicas counted", Duration::from_secs(2), || {
        replicas.iter().all(|r| r.fleet.snapshot().replicas == 3)
    })
    .await;
    // Redis answers nothing for 1.5 s (a long script, a fork, a saturated network).
    let client = redis.client();
    let sleeper = std::thread::spawn(move || {
        let mut connection = client.get_connection().unwrap();
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(1.5)
            .query(&mut connection)
            .unwrap();
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A new tenant's first request must grow its lease: it waits the grant timeout
    // (100 ms), no more, and is then admitted on the fallback.
    let tally = load(&[replica.addr], 4, "newcomer", Duration::from_millis(600)).await;
    assert!(tally.ok > 0 && tally.failed == 0, "{tally:?}");
    assert!(tally.slowest < Duration::from_millis(600), "{tally:?}");
    assert!(replica.fleet.snapshot().fallback);
    sleeper.join().unwrap();
    eventually_within("back once Redis answers", Duration::from_secs(3), || {
        !replica.fleet.snapshot().fallback
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_shuts_down_gives_its_share_back_at_once() {
    let Some(redis) = Redis::start("release") else {
        return;
    };
    const CAP: usize = 8;
    // Leases of a minute: only a release can hand them over within the test.
    let (mut replicas, _running) = replicas(&redis, "release", CAP, Duration::from_secs(60)).await;
    let other = replicas.pop().unwrap();
    let leaving = replicas.pop().unwrap();
    let _ = load(&[leaving.addr], 16, "acme", Duration::from_millis(300)).await;
    assert_eq!(leaving.fleet.held(&"acme".into()), CAP);
    let mut connection = redis.client().get_connection().unwrap();
    let mut fields = || -> usize {
        let fields: Vec<String> = redis::cmd("HKEYS")
            .arg("release:{key:acme}")
            .query(&mut connection)
            .unwrap();
        fields.len()
    };
    assert_eq!(fields(), 1, "Redis counts the leaving replica's lease");
    // Its requests done, the leaving replica gives back what it holds, unasked.
    leaving.fleet.release().await;
    assert_eq!(leaving.fleet.held(&"acme".into()), 0);
    assert_eq!(leaving.fleet.snapshot().keys, 0, "and forgets the key");
    assert_eq!(fields(), 0, "and Redis counts nothing of it");
    let after = load(&[other.addr], 16, "acme", Duration::from_millis(300)).await;
    assert!(after.ok > 0);
    assert_eq!(other.fleet.held(&"acme".into()), CAP);
    let debug = format!("{:?}", other.fleet);
    assert!(
        debug.contains("cap: 8") && debug.contains("prefix: \"release\""),
        "{debug}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_is_asked_a_few_times_not_once_a_request() {
    let Some(redis) = Redis::start("few_calls") else {
        return;
    };
    const CAP: usize = 64; // chunks of 8
    let running = Arc::new(Running::default());
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let fleet = FleetCap::builder(redis.client(), CAP)
            .ttl(Duration::from_secs(30))
            .prefix("few")
            .build()
            .unwrap();
        replicas.push(Replica::start(fleet, running.clone(), Duration::from_millis(300)).await);
    }
    let calls = |replica: &Replica| replica.fleet.snapshot().calls;
    let (first, second) = (&replicas[0], &replicas[1]);
    let before = calls(first);
    // 64 requests at once on a new key: the lease grows a chunk at a time, each grant
    // shared by the requests that waited for it.
    let burst = load(&[first.addr], 64, "burst", Duration::from_millis(100)).await;
    assert_eq!(burst.ok, 64, "{burst:?}");
    let grants = calls(first) - before;
    assert!(grants <= 16, "{grants} calls for 64 requests");
    // The whole cap held there: a tenant over it on the other replica is refused, and
    // asks Redis at most every 250 ms, not at each refusal.
    let held = tokio::spawn({
        let addr = first.addr;
        async move { load(&[addr], 64, "burst", Duration::from_millis(900)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = calls(second);
    let refused = load(&[second.addr], 8, "burst", Duration::from_millis(600)).await;
    assert!(refused.refused > 100, "{refused:?}");
    let asked = calls(second) - before;
    assert!(asked <= 8, "{asked} calls for {} refusals", refused.refused);
    held.await.unwrap();
}

/// Redis comes back, and some replicas find it a while before the others do (each asks
/// at its own upkeep round, and these are half a second apart). Until they do, the
/// others run on their fallback share, which Redis does not count: a replica back grows
/// no further than the share it ran on until its next round, so the fleet never runs
/// more than the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_back_before_the_others_grows_no_further_than_its_share() {
    let Some(mut redis) = Redis::start("rejoin") else {
        return;
    };
    const CAP: usize = 12;
    // Leases of 3 s, renewed every second: the first replica's rounds fall half a second
    // apart from the other two's.
    let ttl = Duration::from_secs(3);
    let running = Arc::new(Running::default());
    let build = || {
        FleetCap::builder(redis.client(), CAP)
            .ttl(ttl)
            .prefix("rejoin")
            .build()
            .expect("a fleet cap")
    };
    let first = Replica::start(build(), running.clone(), SERVICE).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let others = [
        Replica::start(build(), running.clone(), SERVICE).await,
        Replica::start(build(), running.clone(), SERVICE).await,
    ];
    let all = || std::iter::once(&first).chain(others.iter());
    eventually_within("three replicas counted", Duration::from_secs(4), || {
        all().all(|r| r.fleet.snapshot().replicas == 3)
    })
    .await;
    let addrs: Vec<_> = all().map(|r| r.addr).collect();
    // Under load throughout: Redis stops, every replica falls back, Redis comes back.
    let loaded = tokio::spawn({
        let addrs = addrs.clone();
        async move { load(&addrs, 36, "acme", Duration::from_millis(5000)).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.stop();
    eventually_within(
        "every replica on its fallback",
        Duration::from_secs(2),
        || all().all(|r| r.fleet.snapshot().fallback),
    )
    .await;
    tokio::time::sleep(SERVICE * 5).await;
    running.reset();
    // Watched from before Redis restarts: a moment with a replica back while another
    // still runs on its fallback.
    let watch = {
        let fleets: Vec<FleetCap> = all().map(|r| r.fleet.clone()).collect();
        tokio::spawn(async move {
            let mut window = false;
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until {
                let on: Vec<bool> = fleets.iter().map(|f| f.snapshot().fallback).collect();
                window |= on.contains(&true) && on.contains(&false);
                if !on.contains(&true) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            window
        })
    };
    redis.restart();
    let window = watch.await.unwrap();
    let tally = loaded.await.unwrap();
    assert_eq!(tally.failed, 0, "{tally:?}");
    assert!(window, "the replicas came back all at once");
    assert!(
        running.most() <= CAP,
        "{} in flight as the fleet came back",
        running.most()
    );
}

/// A tenant's traffic moves from one replica to another (a round-robin balancer, say):
/// the slots the first holds and no longer uses are given back as soon as the second
/// asks, not at the first's next renewal (leases of a minute here: renewed every 20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_free_on_one_replica_moves_to_another_at_once() {
    let Some(redis) = Redis::start("moves") else {
        return;
    };
    const CAP: usize = 4;
    let (a, b, running) = two(
        &redis,
        "moves",
        CAP,
        Duration::from_secs(60),
        Duration::from_millis(100),
    )
    .await;
    let acme = admission_core::Key::from("acme");
    for (from, to) in [(&a, &b), (&b, &a), (&a, &b)] {
        // The whole cap on one replica, then nothing in flight anywhere.
        let fill: Vec<_> = (0..CAP)
            .map(|_| tokio::spawn(get(from.addr, "acme")))
            .collect();
        for status in fill {
            assert_eq!(status.await.unwrap(), http::StatusCode::OK);
        }
        assert_eq!(from.fleet.held(&acme), CAP, "it held the whole cap");
        eventually_within("nothing in flight", Duration::from_secs(1), || {
            from.layer.gate().count().in_flight() == 0
        })
        .await;
        // The other replica is served at once: the first gives back what it holds.
        let moved = Instant::now();
        assert_eq!(get(to.addr, "acme").await, http::StatusCode::OK);
        let took = moved.elapsed();
        eprintln!("a free slot moved in {took:?}");
        assert!(
            took < Duration::from_secs(1),
            "{took:?}: not at the next renewal"
        );
        assert!(from.fleet.snapshot().given_back >= 1);
        // It gave back all it held (nothing in flight there), and forgot the key.
        assert_eq!(from.fleet.held(&acme), 0);
        eventually_within("the key forgotten", Duration::from_secs(1), || {
            from.fleet.snapshot().keys == 0
        })
        .await;
    }
    assert!(running.most() <= CAP, "{} in flight", running.most());
    // Busy slots are not given back: the cap held by requests in flight on `a` leaves
    // `b` refused, after a wait of at most the grant timeout.
    let busy = FleetCap::builder(redis.client(), CAP)
        .prefix("moves")
        .ttl(Duration::from_secs(60))
        .build()
        .expect("a fleet cap");
    let busy = Replica::start(busy, running.clone(), Duration::from_secs(2)).await;
    let held: Vec<_> = (0..CAP)
        .map(|_| tokio::spawn(get(busy.addr, "globex")))
        .collect();
    eventually_within("the cap in flight", Duration::from_secs(2), || {
        running.now() == CAP
    })
    .await;
    let refused = Instant::now();
    assert_eq!(
        get(b.addr, "globex").await,
        http::StatusCode::TOO_MANY_REQUESTS
    );
    assert!(
        refused.elapsed() < Duration::from_secs(1),
        "{:?}",
        refused.elapsed()
    );
    for status in held {
        assert_eq!(status.await.unwrap(), http::StatusCode::OK);
    }
    assert!(running.most() <= CAP, "{} in flight", running.most());
}

/// Replicas started while Redis is down, built as the README builds them (no
/// `replicas`): none admits a keyed request until Redis first answers, so together they
/// never pass the cap; told `replicas`, each runs on its share. Once Redis is up, they
/// join and serve the whole cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_started_without_redis_never_pass_the_cap() {
    let Some(mut redis) = Redis::start("no_redis_at_start") else {
        return;
    };
    redis.stop();
    const CAP: usize = 4;
    let ttl = Duration::from_millis(900);
    let running = Arc::new(Running::default());
    let service = Duration::from_millis(300);
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let fleet = FleetCap::builder(redis.client(), CAP)
            .ttl(ttl)
            .prefix("cold")
            .build()
            .unwrap();
        replicas.push(Replica::start(fleet, running.clone(), service).await);
    }
    let addrs: Vec<_> = replicas.iter().map(|replica| replica.addr).collect();
    let tally = load(&addrs, 8, "acme", Duration::from_millis(600)).await;
    assert_eq!(tally.ok, 0, "nothing admitted without a count: {tally:?}");
    assert!(tally.refused > 0 && tally.failed == 0, "{tally:?}");
    assert_eq!(running.most(), 0);

    // Told how many replicas may start at once: each runs on its share.
    let mut shared = Vec::new();
    for _ in 0..2 {
        let fleet = FleetCap::builder(redis.client(), CAP)
            .ttl(ttl)
            .prefix("cold")
            .replicas(2)
            .build()
            .unwrap();
        shared.push(Replica::start(fleet, running.clone(), service).await);
    }
    let addrs: Vec<_> = shared.iter().map(|replica| replica.addr).collect();
    let tally = load(&addrs, 8, "acme", Duration::from_millis(900)).await;
    assert!(tally.ok > 0 && tally.failed == 0, "{tally:?}");
    assert_eq!(running.most(), CAP, "two shares of 2");

    // Redis comes up: the first replicas join and serve the cap.
    redis.restart();
    running.reset();
    eventually_within("back on leases", Duration::from_secs(3), || {
        replicas
            .iter()
            .all(|replica| !replica.fleet.snapshot().fallback)
            && replicas
                .iter()
                .all(|replica| replica.fleet.snapshot().replicas >= 1)
    })
    .await;
    let addrs: Vec<_> = replicas.iter().map(|replica| replica.addr).collect();
    let tally = load(&addrs, 8, "acme", Duration::from_millis(900)).await;
    assert!(tally.ok > 0 && tally.failed == 0, "{tally:?}");
    assert!(running.most() <= CAP, "{} in flight", running.most());
}

/// Redis restarted: the replicas' channel connections are cut with the rest. Each
/// listens again a third of the TTL later, and a free slot moves at once again (at a
/// renewal it would take two rounds: 4 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_channel_is_listened_to_again_once_redis_returns() {
    let Some(mut redis) = Redis::start("relisten") else {
        return;
    };
    const CAP: usize = 4;
    let ttl = Duration::from_secs(6);
    let (a, b, _) = two(&redis, "relisten", CAP, ttl, Duration::from_millis(50)).await;
    let both = [&a, &b];
    eventually_within("both counted", Duration::from_secs(3), || {
        both.iter().all(|r| r.fleet.snapshot().replicas == 2)
    })
    .await;
    let answered = |r: &&Replica| {
        let snapshot = r.fleet.snapshot();
        snapshot.calls - snapshot.errors
    };
    let before: Vec<u64> = both.iter().map(answered).collect();
    redis.restart();
    // Two rounds answered since (a replica back from its fallback grows no further than
    // its share until the round after), by then past the listeners' pause too.
    eventually_within("two rounds answered", Duration::from_secs(9), || {
        both.iter()
            .zip(&before)
            .all(|(r, b)| answered(r) >= b + 2 && !r.fleet.snapshot().fallback)
    })
    .await;
    let fill: Vec<_> = (0..CAP)
        .map(|_| tokio::spawn(get(a.addr, "acme")))
        .collect();
    for status in fill {
        assert_eq!(status.await.unwrap(), http::StatusCode::OK);
    }
    eventually_within("nothing in flight", Duration::from_secs(1), || {
        a.layer.gate().count().in_flight() == 0
    })
    .await;
    assert_eq!(a.fleet.held(&"acme".into()), CAP);
    let moved = Instant::now();
    assert_eq!(get(b.addr, "acme").await, http::StatusCode::OK);
    assert!(
        moved.elapsed() < Duration::from_secs(1),
        "{:?}: the channel is heard again",
        moved.elapsed()
    );
}

/// A holder with requests in flight gives back only the slots they do not use, and keeps
/// the rest (and the key) for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_gives_back_only_what_it_does_not_use() {
    let Some(redis) = Redis::start("partial") else {
        return;
    };
    const CAP: usize = 4;
    let service = Duration::from_secs(1);
    let ttl = Duration::from_secs(60);
    let (a, b, running) = two(&redis, "partial", CAP, ttl, service).await;
    let acme = admission_core::Key::from("acme");
    // Two, then two more half a service later: for that half, `a` holds the cap and
    // runs two.
    let mut held: Vec<_> = (0..2).map(|_| tokio::spawn(get(a.addr, "acme"))).collect();
    tokio::time::sleep(service / 2).await;
    held.extend((0..2).map(|_| tokio::spawn(get(a.addr, "acme"))));
    eventually_within("the first two done", Duration::from_secs(2), || {
        running.now() == 2 && a.fleet.held(&acme) == CAP
    })
    .await;
    let asked = tokio::spawn(get(b.addr, "acme"));
    eventually_within("two given back", Duration::from_millis(400), || {
        a.fleet.held(&acme) == 2
    })
    .await;
    assert_eq!(
        a.fleet.snapshot().keys,
        1,
        "the key kept for its two in flight"
    );
    assert_eq!(asked.await.unwrap(), http::StatusCode::OK);
    for status in held {
        assert_eq!(status.await.unwrap(), http::StatusCode::OK);
    }
    assert!(running.most() <= CAP, "{} in flight", running.most());
}
