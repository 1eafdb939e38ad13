//! Per-call overhead of the admission layer (count only, and with every limit disabled)
//! around a ready service, beside the bare service and tower's `LoadShed` +
//! `ConcurrencyLimit`.
//!
//! Each iteration drives one whole call: `poll_ready`, `call`, poll the future to its
//! response, and drop the response, so the permit's whole life (into the future, into
//! the body, released when the body drops) is inside the measurement.

use std::task::{Context, Waker};

use admission_bench::layer::{drive, ok};
use admission_tower::AdmissionLayer;
use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::Empty;
use tower::{Layer, ServiceBuilder};

fn layer(c: &mut Criterion) {
    let mut g = c.benchmark_group("layer");
    let mut cx = Context::from_waker(Waker::noop());

    let mut bare = tower::service_fn(ok::<Empty<Bytes>>);
    g.bench_function("bare", |b| b.iter(|| drive(&mut bare, &mut cx)));

    let admission = AdmissionLayer::builder().count(1024).build().unwrap();
    let mut ours = admission.layer(tower::service_fn(ok));
    g.bench_function("admission", |b| {
        b.iter(|| drive::<_, Empty<Bytes>>(&mut ours, &mut cx))
    });

    // Every limit disabled: the same layer type, passing requests through uncounted.
    let disabled = AdmissionLayer::off();
    let mut disabled = disabled.layer(tower::service_fn(ok));
    g.bench_function("disabled", |b| {
        b.iter(|| drive::<_, Empty<Bytes>>(&mut disabled, &mut cx))
    });

    let mut theirs = ServiceBuilder::new()
        .load_shed()
        .concurrency_limit(1024)
        .service(tower::service_fn(ok::<Empty<Bytes>>));
    g.bench_function("load_shed_concurrency_limit", |b| {
        b.iter(|| drive(&mut theirs, &mut cx))
    });
    g.finish();
}

/// The added cost of the `metrics` feature per admitted request: the same count-only
/// layer with metrics off (`admission`) and on (`metrics`), recording into a real
/// Prometheus recorder, in the same run.
#[cfg(feature = "metrics")]
fn layer_metrics(c: &mut Criterion) {
    let _prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the bench's recorder");
    let mut g = c.benchmark_group("layer_metrics");
    let mut cx = Context::from_waker(Waker::noop());
    let plain = AdmissionLayer::builder()
        .count(1024)
        .metrics(false)
        .build()
        .unwrap();
    let mut plain = plain.layer(tower::service_fn(ok));
    g.bench_function("admission", |b| {
        b.iter(|| drive::<_, Empty<Bytes>>(&mut plain, &mut cx))
    });
    let recorded = AdmissionLayer::builder()
        .count(1024)
        .name("bench")
        .build()
        .unwrap();
    let mut recorded = recorded.layer(tower::service_fn(ok));
    g.bench_function("metrics", |b| {
        b.iter(|| drive::<_, Empty<Bytes>>(&mut recorded, &mut cx))
    });
    g.finish();
}

#[cfg(not(feature = "metrics"))]
criterion_group!(benches, layer);
#[cfg(feature = "metrics")]
criterion_group!(benches, layer, layer_metrics);
criterion_main!(benches);
