//! The `metrics` feature with a real Prometheus recorder: a fleet cap whose Redis is out
//! of reach says so in its series, and its Redis calls are counted by outcome.
//! (`cargo test -p admission-redis --features metrics`.)

#![cfg(feature = "metrics")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use admission_redis::{FleetCap, FleetError};
use metrics_exporter_prometheus::PrometheusBuilder;
use support::{Redis, Replica, Running, eventually_within, load};

/// The value of the one series of `metric` for cap `name` (and `outcome`, if given).
fn value(rendered: &str, metric: &str, name: &str, outcome: Option<&str>) -> Option<f64> {
    rendered.lines().find_map(|line| {
        let (head, value) = line.rsplit_once(' ')?;
        let matches = head.starts_with(&format!("{metric}{{"))
            && head.contains(&format!("name=\"{name}\""))
            && outcome.is_none_or(|outcome| head.contains(&format!("outcome=\"{outcome}\"")));
        matches.then(|| value.parse().unwrap())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_series_say_when_the_fleet_runs_on_its_fallback_and_when_it_is_back() {
    let Some(mut redis) = Redis::start("metrics") else {
        return;
    };
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).unwrap();

    let fleet = FleetCap::builder(redis.client(), 8)
        .ttl(Duration::from_millis(600))
        .prefix("fleet")
        .name("observed")
        .build()
        .unwrap();
    let replica = Replica::start(
        fleet.clone(),
        Arc::new(Running::default()),
        Duration::from_millis(5),
    )
    .await;
    let served = load(&[replica.addr], 4, "acme", Duration::from_millis(400)).await;
    assert!(served.ok > 0);
    eventually_within("a round recorded the slots", Duration::from_secs(2), || {
        value(&handle.render(), "admission_fleet_slots", "observed", None).is_some_and(|v| v > 0.0)
    })
    .await;
    let rendered = handle.render();
    let calls = value(
        &rendered,
        "admission_fleet_redis_calls_total",
        "observed",
        Some("ok"),
    )
    .unwrap();
    // The snapshot counts a call as it starts, the series as it ends.
    assert!(
        calls >= 1.0 && calls as u64 <= fleet.snapshot().calls,
        "{rendered}"
    );

    redis.stop();
    let _ = load(&[replica.addr], 4, "acme", Duration::from_millis(300)).await;
    eventually_within("on the fallback", Duration::from_secs(2), || {
        value(
            &handle.render(),
            "admission_fleet_fallback",
            "observed",
            None,
        ) == Some(1.0)
    })
    .await;
    let errors = value(
        &handle.render(),
        "admission_fleet_redis_calls_total",
        "observed",
        Some("error"),
    );
    assert!(errors.is_some_and(|errors| errors >= 1.0));

    redis.restart();
    eventually_within("back", Duration::from_secs(3), || {
        value(
            &handle.render(),
            "admission_fleet_fallback",
            "observed",
            None,
        ) == Some(0.0)
    })
    .await;
    assert!(!fleet.snapshot().fallback);
    // Without a name of its own, a cap's series carry its layer's.
    let unnamed = FleetCap::builder(redis.client(), 8)
        .prefix("fleet")
        .build()
        .unwrap();
    let layer = admission_tower::AdmissionLayer::builder()
        .name("edge")
        .per_key(unnamed.per_key(|_: &http::request::Parts| None))
        .build()
        .unwrap();
    eventually_within(
        "a heartbeat counted under the layer's name",
        Duration::from_secs(2),
        || {
            value(
                &handle.render(),
                "admission_fleet_redis_calls_total",
                "edge",
                Some("ok"),
            )
            .is_some()
        },
    )
    .await;
    let rendered = handle.render();
    let fleet_series = rendered
        .lines()
        .filter(|line| line.starts_with("admission_fleet_"));
    for line in fleet_series {
        assert!(
            line.contains("name=\"observed\"") || line.contains("name=\"edge\""),
            "named by the builder or the layer, never the prefix: {line}"
        );
    }
    drop(layer);
    // Settings that would refuse everything or never renew are errors, named.
    let zero = FleetCap::builder(redis.client(), 0).build().unwrap_err();
    assert!(matches!(zero, FleetError::Zero("cap")), "{zero}");
}
