//! The fleet cap on Redis as production runs it, started by the tests: a three-primary
//! Redis Cluster, and a primary with a replica watched by three Sentinels, whose primary
//! is killed under load. (`cargo test -p admission-redis --features sentinel,cluster`.)

#![cfg(all(feature = "sentinel", feature = "cluster"))]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use admission_redis::{FleetCap, Store};
use support::{Cluster, Replica, Running, Sentinels, eventually_within, get, load};

const SERVICE: Duration = Duration::from_millis(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_holds_each_key_to_its_cap_and_moves_free_slots() {
    let Some(cluster) = Cluster::start("cluster") else {
        return;
    };
    const CAP: usize = 4;
    let running = Arc::new(Running::default());
    // Two replicas listening on different nodes: what one node publishes reaches both.
    let mut urls = cluster.urls();
    let mut replicas = Vec::new();
    for _ in 0..2 {
        // Leases of a minute: nothing moves at a renewal within the test.
        let fleet = FleetCap::builder(Store::cluster(urls.clone()).unwrap(), CAP)
            .prefix("clustered")
            .ttl(Duration::from_secs(60))
            .build()
            .expect("a fleet cap");
        replicas.push(Replica::start(fleet, running.clone(), SERVICE).await);
        urls.rotate_left(1);
    }
    let addrs: Vec<_> = replicas.iter().map(|replica| replica.addr).collect();
    // Tenants whose leases live on different nodes.
    let tenants = ["acme", "globex", "initech", "umbrella", "hooli", "stark"];
    let nodes: std::collections::BTreeSet<u16> = tenants
        .iter()
        .map(|tenant| cluster.node_of(&format!("clustered:{{key:{tenant}}}")))
        .collect();
    assert!(nodes.len() >= 2, "the tenants' leases on several nodes");
    for tenant in tenants {
        running.reset();
        let tally = load(&addrs, 12, tenant, Duration::from_millis(400)).await;
        assert_eq!(tally.failed, 0, "{tenant}: {tally:?}");
        assert!(tally.ok > 0 && tally.refused > 0, "{tenant}: {tally:?}");
        assert!(
            running.most() <= CAP,
            "{tenant}: {} in flight",
            running.most()
        );
    }
    for replica in &replicas {
        let snapshot = replica.fleet.snapshot();
        assert!(!snapshot.fallback && snapshot.errors == 0, "{snapshot:?}");
    }
    // A free slot moves between replicas as on one server.
    let (a, b) = (&replicas[0], &replicas[1]);
    let key = admission_core::Key::from("moving");
    let fill: Vec<_> = (0..CAP)
        .map(|_| tokio::spawn(get(a.addr, "moving")))
        .collect();
    for status in fill {
        assert_eq!(status.await.unwrap(), http::StatusCode::OK);
    }
    eventually_within(
        "a holds the cap, nothing in flight",
        Duration::from_secs(1),
        || a.fleet.held(&key) == CAP && a.layer.gate().count().in_flight() == 0,
    )
    .await;
    let moved = Instant::now();
    assert_eq!(get(b.addr, "moving").await, http::StatusCode::OK);
    assert!(
        moved.elapsed() < Duration::from_secs(1),
        "{:?}",
        moved.elapsed()
    );
    assert!(a.fleet.snapshot().given_back >= 1);
}

/// The primary killed under load: each replica falls back (holding the cap between
/// them), finds the new primary through the Sentinels, and rejoins there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_keeps_the_cap_and_rejoins_on_the_new_primary() {
    let Some(mut sentinels) = Sentinels::start("sentinel") else {
        return;
    };
    const CAP: usize = 8;
    let ttl = Duration::from_millis(900);
    let running = Arc::new(Running::default());
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let fleet = FleetCap::builder(sentinels.client(), CAP)
            .ttl(ttl)
            .prefix("watched")
            .build()
            .expect("a fleet cap");
        replicas.push(Replica::start(fleet, running.clone(), SERVICE).await);
    }
    let addrs: Vec<_> = replicas.iter().map(|replica| replica.addr).collect();
    eventually_within("two replicas counted", Duration::from_secs(3), || {
        replicas.iter().all(|r| r.fleet.snapshot().replicas == 2)
    })
    .await;
    let before = load(&addrs, 24, "acme", Duration::from_millis(500)).await;
    assert!(before.ok > 0 && before.failed == 0, "{before:?}");
    assert_eq!(running.most(), CAP, "the tenant reaches its cap");

    // Killed under load; the load goes on through the failover.
    running.reset();
    let loaded = tokio::spawn({
        let addrs = addrs.clone();
        async move { load(&addrs, 24, "acme", Duration::from_millis(4000)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    sentinels.kill_primary();
    eventually_within("both on their fallback", Duration::from_secs(2), || {
        replicas.iter().all(|r| r.fleet.snapshot().fallback)
    })
    .await;
    for replica in &replicas {
        assert_eq!(replica.fleet.held(&"acme".into()), CAP / 2);
    }
    // At the switch a replica keeps what it had in flight above its share, for about
    // one service time (as documented); from then on the cap holds, through the
    // failover and the return.
    tokio::time::sleep(SERVICE * 5).await;
    let switch = running.most();
    running.reset();
    sentinels.await_failover();
    eventually_within(
        "both back, on the new primary",
        Duration::from_secs(5),
        || replicas.iter().all(|r| !r.fleet.snapshot().fallback),
    )
    .await;
    let through = loaded.await.unwrap();
    assert_eq!(through.failed, 0, "{through:?}");
    assert!(through.ok > 0, "{through:?}");
    eprintln!(
        "in flight at the switch: {switch}; after: {}",
        running.most()
    );
    assert!(
        running.most() <= CAP,
        "{} in flight through the failover",
        running.most()
    );
    running.reset();
    let after = load(&addrs, 24, "acme", Duration::from_millis(1500)).await;
    assert!(after.ok > 0 && after.failed == 0, "{after:?}");
    assert!(running.most() <= CAP, "{} in flight after", running.most());
    assert_eq!(running.most(), CAP, "the tenant reaches its cap again");
    // The leases live on the new primary.
    let mut connection = redis::Client::open(format!("redis://127.0.0.1:{}/", sentinels.replica))
        .unwrap()
        .get_connection()
        .unwrap();
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg("watched:{key:acme}")
        .query(&mut connection)
        .unwrap();
    assert!(!fields.is_empty(), "leases on the new primary");
}

#[test]
fn a_cluster_of_no_node_or_an_unreadable_url_is_an_error() {
    use admission_redis::FleetError;
    let none = Store::cluster(Vec::<String>::new()).unwrap_err();
    assert!(matches!(none, FleetError::Redis(_)), "{none:?}");
    let unreadable = Store::cluster(["not a url"]).unwrap_err();
    assert!(matches!(unreadable, FleetError::Redis(_)), "{unreadable:?}");
    let store = Store::cluster(["redis://127.0.0.1:7001/", "redis://127.0.0.1:7002/"]).unwrap();
    let debug = format!("{store:?}");
    assert!(
        debug.contains("Cluster") && debug.contains("7002"),
        "{debug}"
    );
}
