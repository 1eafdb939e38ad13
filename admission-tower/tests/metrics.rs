//! The `metrics` feature with a real Prometheus recorder: a burst through a real server
//! behind the layer, then the rendered Prometheus text checked against the layer's
//! snapshot and against the clients' own tally of the responses they got.
//! (`cargo test -p admission-tower --features metrics`.)

#![cfg(feature = "metrics")]

mod support;

use std::collections::HashMap;
use std::sync::Arc;

use admission_tower::{AdmissionLayer, Classes, PerKey, Priority, class, key};
use http::{Request, StatusCode};
use http_body_util::Full;
use metrics_exporter_prometheus::PrometheusBuilder;
use support::{Seen, app, send, serve, text};

/// One series of the rendered text: its metric name, labels and value.
struct Series {
    metric: String,
    labels: HashMap<String, String>,
    value: f64,
}

fn parse(rendered: &str) -> Vec<Series> {
    rendered
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (head, value) = line.rsplit_once(' ').unwrap();
            let (metric, labels) = match head.split_once('{') {
                Some((metric, rest)) => (metric, rest.trim_end_matches('}')),
                None => (head, ""),
            };
            let labels = labels
                .split(',')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap();
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            let value = match value {
                "+Inf" => f64::INFINITY,
                v => v.parse().unwrap(),
            };
            Series {
                metric: metric.to_owned(),
                labels,
                value,
            }
        })
        .collect()
}

/// The sum of `metric`'s series for layer `test` whose labels include `with`; `None` if
/// there is no such series.
fn value(series: &[Series], metric: &str, with: &[(&str, &str)]) -> Option<f64> {
    value_of("test", series, metric, with)
}

/// The sum of `metric`'s series of the layer named `name` with the labels `with`.
fn value_of(name: &str, series: &[Series], metric: &str, with: &[(&str, &str)]) -> Option<f64> {
    let matching: Vec<f64> = series
        .iter()
        .filter(|s| s.metric == metric && s.labels.get("name").map(String::as_str) == Some(name))
        .filter(|s| {
            with.iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

fn request(path: &str, tenant: &str, class: &str, body: usize) -> Request<Full<bytes::Bytes>> {
    Request::post(path)
        .header("x-tenant", tenant)
        .header("x-request-class", class)
        .body(Full::new(bytes::Bytes::from(vec![b'x'; body])))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prometheus_text_equals_the_snapshot_and_the_clients_tally() {
    let handle = PrometheusBuilder::new().install_recorder().unwrap();
    let classes = Classes::standard();
    let layer = AdmissionLayer::builder()
        .name("test")
        .count(6)
        .bytes(256 << 10)
        .max_request_bytes(32 << 10)
        .per_key(PerKey::new(
            1,
            key::header(http::HeaderName::from_static("x-tenant")),
        ))
        .priority(
            classes.clone(),
            class::header(class::HEADER, Priority::DEFAULT),
        )
        .bypass(|req| req.uri.path() == "/health")
        .build()
        .unwrap();
    // A second layer in the same process: told apart by its name.
    // Its byte budget a share of a memory limit of 64 MiB, laid out in files.
    let root = admission_testkit::Scratch::new("admission-metrics");
    root.write("proc/meminfo", "MemTotal: 65536 kB\n");
    let other = AdmissionLayer::builder()
        .name("other")
        .count(1)
        .bytes_share(admission_tower::MemoryShare::of(0.5).read_from(root.path()))
        .build()
        .unwrap();
    // And a layer with no limit at all: with metrics on, it still counts its requests.
    let unlimited = AdmissionLayer::builder().name("unlimited").build().unwrap();
    let seen = Arc::new(Seen::default());
    let addr = serve(tower::Layer::layer(&layer, app(seen.clone()))).await;
    let unlimited_addr = serve(tower::Layer::layer(&unlimited, app(Arc::default()))).await;
    for _ in 0..3 {
        let response = send(unlimited_addr, support::get("/")).await;
        assert_eq!(response.status(), StatusCode::OK);
        text(response).await;
    }

    // The burst: streams held open (so the count and per-key limits bite), uploads too
    // large, and liveness probes, all on the wire.
    let mut tally: HashMap<(StatusCode, &str), u64> = HashMap::new();
    let mut open = Vec::new();
    let classes_cycle = ["sheddable", "default", "critical"];
    for i in 0..24 {
        let class = classes_cycle[i % 3];
        let tenant = format!("t{}", i % 4);
        let response = send(addr, request("/stream", &tenant, class, 0)).await;
        *tally.entry((response.status(), class)).or_default() += 1;
        if response.status() == StatusCode::OK {
            open.push(response);
        } else {
            text(response).await;
        }
    }
    for i in 0..4 {
        let class = classes_cycle[i % 3];
        let response = send(addr, request("/upload", "big", class, 40 << 10)).await;
        *tally.entry((response.status(), class)).or_default() += 1;
        text(response).await;
    }
    let probe = send(addr, support::get("/health")).await;
    assert_eq!(probe.status(), StatusCode::OK);
    seen.end_streams();
    for response in open {
        text(response).await;
    }
    support::eventually("every permit released", || {
        let snap = layer.snapshot().gate;
        snap.count.in_flight == 0 && snap.keyed.is_some_and(|k| k.keys == 0)
    })
    .await;

    layer.record_gauges();
    other.record_gauges();
    let rendered = handle.render();
    let series = parse(&rendered);
    let snap = layer.snapshot().gate;
    let count = |status: StatusCode| -> f64 {
        tally
            .iter()
            .filter(|((s, _), _)| *s == status)
            .map(|(_, n)| *n)
            .sum::<u64>() as f64
    };
    let (ok, s503, s429, s413) = (
        count(StatusCode::OK),
        count(StatusCode::SERVICE_UNAVAILABLE),
        count(StatusCode::TOO_MANY_REQUESTS),
        count(StatusCode::PAYLOAD_TOO_LARGE),
    );
    // The burst exercised every refusal it could.
    assert!(
        ok > 0.0 && s503 > 0.0 && s429 > 0.0 && s413 == 4.0,
        "{tally:?}"
    );

    // Each series the snapshot also reports equals it.
    let g = |metric| {
        value(&series, metric, &[]).unwrap_or_else(|| panic!("{metric} missing:\n{rendered}"))
    };
    assert_eq!(
        g("admission_in_flight_requests"),
        snap.count.in_flight as f64
    );
    assert_eq!(
        g("admission_limit_requests"),
        snap.count.capacity.unwrap() as f64
    );
    assert_eq!(
        g("admission_high_water_requests"),
        snap.count.high_water as f64
    );
    assert_eq!(g("admission_closed"), 0.0);
    let bytes = snap.bytes.unwrap();
    assert_eq!(g("admission_in_flight_bytes"), bytes.in_flight as f64);
    assert_eq!(g("admission_limit_bytes"), bytes.capacity.unwrap() as f64);
    assert_eq!(g("admission_high_water_bytes"), bytes.high_water as f64);
    assert_eq!(g("admission_limit_request_bytes"), (32 << 10) as f64);
    let keyed = snap.keyed.unwrap();
    assert_eq!(g("admission_in_flight_keys"), keyed.keys as f64);
    assert_eq!(g("admission_high_water_keys"), keyed.keys_high_water as f64);
    assert_eq!(
        g("admission_limit_per_key_requests"),
        keyed.cap.unwrap() as f64
    );
    assert_eq!(g("admission_limit_keys"), f64::INFINITY, "no max_keys");
    let refused = |dimension| {
        value(
            &series,
            "admission_refused_total",
            &[("dimension", dimension)],
        )
        .unwrap()
    };
    assert_eq!(
        refused("count") + refused("class") + refused("closed"),
        snap.count.refused as f64
    );
    assert_eq!(refused("key"), keyed.refused_key as f64);
    assert_eq!(refused("key_table"), keyed.refused_table as f64);
    assert_eq!(
        refused("bytes") + refused("too_large"),
        bytes.refused as f64
    );
    for (name, priority) in classes.iter() {
        // Shed by the count or by the class's share of it.
        let shed = |dimension| {
            value(
                &series,
                "admission_refused_total",
                &[("dimension", dimension), ("class", name)],
            )
            .unwrap_or(0.0)
        };
        assert_eq!(
            shed("count") + shed("class"),
            snap.refused_by_class[priority.index()] as f64,
            "{name}"
        );
    }

    // Admitted and refused totals, and the hold-time count, equal the clients' tally.
    assert_eq!(g("admission_admitted_total"), ok);
    for class in classes_cycle {
        let admitted = value(&series, "admission_admitted_total", &[("class", class)]);
        assert_eq!(
            admitted,
            Some(*tally.get(&(StatusCode::OK, class)).unwrap_or(&0) as f64),
            "{class}"
        );
    }
    assert_eq!(g("admission_refused_total"), s503 + s429 + s413);
    assert_eq!(refused("key"), s429);
    assert_eq!(refused("too_large"), s413);
    assert_eq!(
        refused("count") + refused("class") + refused("bytes") + refused("key_table"),
        s503
    );
    assert_eq!(g("admission_permit_held_seconds_count"), ok);
    assert!(g("admission_permit_held_seconds_sum") > 0.0);

    // The layer without limits timed each of its three requests.
    for line in [
        "admission_admitted_total{name=\"unlimited\"} 3",
        "admission_permit_held_seconds_count{name=\"unlimited\"} 3",
    ] {
        assert!(rendered.contains(line), "{line} missing:\n{rendered}");
    }
    // Each metric is described, for the exporters that print help.
    assert!(
        rendered.contains("# HELP admission_admitted_total Requests admitted by the layer"),
        "{rendered}"
    );
    // The other layer's series carry its own name, and no series carries a key.
    for line in [
        "admission_limit_requests{name=\"other\"} 1",
        "admission_memory_limit_bytes{name=\"other\"} 67108864",
        "admission_limit_bytes{name=\"other\"} 33554432",
    ] {
        assert!(rendered.contains(line), "{line} missing:\n{rendered}");
    }
    assert!(!rendered.contains("admission_memory_limit_bytes{name=\"test\"}"));

    // Waiters, each counted once where its wait ended: gone, refused, admitted.
    let waits = AdmissionLayer::builder()
        .name("waits")
        .count(1)
        .wait(admission_tower::Wait::new(
            4,
            std::time::Duration::from_millis(300),
        ))
        .build()
        .unwrap();
    support::three_waiters(&waits).await;
    let series = parse(&handle.render());
    let of =
        |metric, with: &[(&str, &str)]| value_of("waits", &series, metric, with).unwrap_or(0.0);
    assert_eq!(of("admission_gone_total", &[]), 1.0);
    assert_eq!(
        of("admission_refused_total", &[]),
        1.0,
        "the wait that ran out"
    );
    assert_eq!(
        of("admission_refused_total", &[("dimension", "count")]),
        1.0
    );
    assert_eq!(
        of("admission_admitted_total", &[]),
        2.0,
        "the holder and the waiter served"
    );
    assert_eq!(of("admission_wait_seconds_count", &[]), 1.0);
    let snapshot = waits.snapshot();
    assert_eq!(snapshot.gone, 1);
    assert_eq!(snapshot.gate.count.refused, 0);
    assert!(
        !rendered.contains("t0") && !rendered.contains("big"),
        "a key leaked into a label"
    );

    // A retry refused is a refusal (of the class's share), and counted as a retry.
    let retries = AdmissionLayer::builder()
        .name("retries")
        .count(2)
        .retries(admission_tower::Retries::grpc())
        .build()
        .unwrap();
    let seen = Arc::new(Seen::default());
    let addr = serve(tower::Layer::layer(&retries, app(seen.clone()))).await;
    let holder = send(addr, support::get("/stream")).await;
    let retry = support::with_header("/", "grpc-previous-rpc-attempts", "1");
    assert_eq!(
        send(addr, retry).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(send(addr, support::get("/")).await.status(), StatusCode::OK);
    let series = parse(&handle.render());
    let of =
        |metric, with: &[(&str, &str)]| value_of("retries", &series, metric, with).unwrap_or(0.0);
    assert_eq!(of("admission_refused_retries_total", &[]), 1.0);
    assert_eq!(
        of("admission_refused_total", &[("dimension", "class")]),
        1.0
    );
    assert_eq!(of("admission_refused_total", &[]), 1.0);
    assert_eq!(of("admission_admitted_total", &[]), 2.0);
    // A layer that sheds no retries has the series, at 0.
    assert_eq!(
        value(&series, "admission_refused_retries_total", &[]),
        Some(0.0)
    );
    drop(holder);

    // A response its client does not take is counted stalled, as the snapshot counts it.
    let rate = admission_tower::MinDataRate::new(1024, std::time::Duration::from_millis(100));
    let stalls = AdmissionLayer::builder()
        .name("stalls")
        .count(1)
        .slow_clients(admission_tower::SlowClients::default().with_min_response_rate(rate))
        .build()
        .unwrap();
    let handler = tower::service_fn(|_: Request<_>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(bytes::Bytes::from(
            "never taken",
        ))))
    });
    let untaken = tower::ServiceExt::oneshot(
        tower::Layer::layer(&stalls, handler),
        Request::new(Full::<bytes::Bytes>::default()),
    )
    .await
    .unwrap();
    support::eventually("stalls.snapshot().stalled == 1", || {
        stalls.snapshot().stalled == 1
    })
    .await;
    let series = parse(&handle.render());
    assert_eq!(
        value_of("stalls", &series, "admission_stalled_total", &[]),
        Some(1.0)
    );
    assert!(
        handle
            .render()
            .contains("# HELP admission_stalled_total Responses whose permits"),
        "described"
    );
    drop(untaken);
}
