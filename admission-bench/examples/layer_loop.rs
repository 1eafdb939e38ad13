//! Drives one layer variant N times, for instruction counts under callgrind, which are
//! repeatable where wall-clock benches on a shared machine are not:
//!
//! ```sh
//! cargo build --release -p admission-bench --example layer_loop
//! valgrind --tool=callgrind target/release/examples/layer_loop ours 100000
//! valgrind --tool=callgrind target/release/examples/layer_loop ours 200000
//! ```
//!
//! The difference of the two totals over 100,000 is the cost of one call. Variants:
//! `bare`, `ours` (`AdmissionLayer`, count only), `disabled` (`AdmissionLayer` with
//! every limit disabled), `classes` (`AdmissionLayer`, count with priority classes),
//! `adaptive` (`AdmissionLayer` with an adaptive count limit, held at 1024: the
//! sample's cost, clock reads included), `body` and `body_untimed` (`ours` answering 1 KiB
//! and polling the body to its end, with the minimum send rate kept and without: its
//! cost for a response with a body), `theirs` (`LoadShed` + `ConcurrencyLimit`),
//! `none`; and, without a service, the count
//! ledger's acquire and release: `count` (plain), `count_class` (with a priority class),
//! beside tokio's owned permit (`tokio_owned`: `Arc<Semaphore>::try_acquire_owned` and its
//! drop) and the floor (`floor`: one compare-exchange and one subtraction).
//! Built with `--features metrics`, `metrics` is `ours` recording into a Prometheus
//! recorder, and `metrics_off` is `ours` opted out (`.metrics(false)`). `per_key_1000` and
//! `fair_1000`: 1,000 tenants and a heavy one by header, a per-key cap alone and with
//! fair shares (see `tenants`).

use std::task::{Context, Waker};

use admission_bench::layer::{drive, drive_request, drive_to_end, kib, ok};
use admission_core::adaptive::{AdaptiveLimit, Gradient};
use admission_core::{Classes, CountLedger, Priority};
use admission_tower::{AdmissionLayer, FairShare, Key, PerKey, key};
use bytes::Bytes;
use http_body_util::Empty;
use tower::{Layer, ServiceBuilder};

fn main() {
    let which = std::env::args().nth(1).unwrap();
    let n: u64 = std::env::args()
        .nth(2)
        .map_or(10_000_000, |s| s.parse().unwrap());
    let mut cx = Context::from_waker(Waker::noop());
    match which.as_str() {
        "none" => {}
        "bare" => {
            let mut s = tower::service_fn(ok::<Empty<Bytes>>);
            spin(&mut s, n, &mut cx);
        }
        "ours" => {
            let l = AdmissionLayer::builder().count(1024).build().unwrap();
            let mut s = l.layer(tower::service_fn(ok));
            spin::<_, Empty<Bytes>>(&mut s, n, &mut cx);
        }
        "adaptive" => {
            let limit = AdaptiveLimit::builder(Gradient::default()).bounds(1024, 1024);
            let l = AdmissionLayer::builder().adaptive(limit).build().unwrap();
            let mut s = l.layer(tower::service_fn(ok));
            spin::<_, Empty<Bytes>>(&mut s, n, &mut cx);
        }
        "body" | "body_untimed" => {
            let slow = admission_tower::SlowClients::default();
            let slow = match which.as_str() {
                "body" => slow,
                _ => slow.without_min_response_rate(),
            };
            let l = AdmissionLayer::builder()
                .count(1024)
                .slow_clients(slow)
                .build()
                .unwrap();
            let mut s = l.layer(tower::service_fn(kib));
            spin_to_end::<_, Empty<Bytes>, _>(&mut s, n, &mut cx);
        }
        "disabled" => {
            let l = AdmissionLayer::off();
            let mut s = l.layer(tower::service_fn(ok));
            spin::<_, Empty<Bytes>>(&mut s, n, &mut cx);
        }
        "classes" => {
            let l = AdmissionLayer::builder()
                .count(1024)
                .priority(Classes::standard(), |_, _| Priority::SHEDDABLE)
                .build()
                .unwrap();
            let mut s = l.layer(tower::service_fn(ok));
            spin::<_, Empty<Bytes>>(&mut s, n, &mut cx);
        }
        #[cfg(feature = "metrics")]
        "metrics" => {
            let _prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .unwrap();
            let l = AdmissionLayer::builder().count(1024).build().unwrap();
            let mut s = l.layer(tower::service_fn(ok));
            spin::<_, Empty<Bytes>>(&mut s, n, &mut cx);
        }
        #[cfg(feature = "metrics")]
        "metrics_off" => {
            let l = AdmissionLayer::builder()
                .count(1024)
                .metrics(false)
                .build()
                .unwrap();
            let mut s = l.layer(tower::service_fn(ok));
            spin::<_, Empty<Bytes>>(&mut s, n, &mut cx);
        }
        "count" => {
            let ledger = CountLedger::new(1024).unwrap();
            for _ in 0..n {
                drop(std::hint::black_box(ledger.try_acquire().unwrap()));
            }
        }
        "count_class" => {
            let ledger = CountLedger::new(1024).unwrap();
            let class = std::hint::black_box(Priority::SHEDDABLE);
            for _ in 0..n {
                drop(std::hint::black_box(ledger.try_acquire_as(class).unwrap()));
            }
        }
        "tokio_owned" => {
            let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(1024));
            for _ in 0..n {
                drop(std::hint::black_box(
                    semaphore.clone().try_acquire_owned().unwrap(),
                ));
            }
        }
        "floor" => {
            let floor = admission_bench::Floor::new(1024);
            for _ in 0..n {
                assert!(std::hint::black_box(&floor).try_acquire(1));
                std::hint::black_box(&floor).release(1);
            }
        }
        "per_key_1000" | "fair_1000" => tenants(which == "fair_1000", n, &mut cx),
        "theirs" => {
            let mut s = ServiceBuilder::new()
                .load_shed()
                .concurrency_limit(1024)
                .service(tower::service_fn(ok::<Empty<Bytes>>));
            spin(&mut s, n, &mut cx);
        }
        _ => panic!(),
    }
}

/// 1,000 tenants and a heavy one, told apart by an `x-tenant` header, each request the
/// heavy one's or the next tenant's in turn, against a count of 4,096 of which the tenants
/// hold 3,000 (so a fair share's cap is read on every request): with a per-key cap of 64
/// alone, or with fair shares too (`fair`).
fn tenants(fair: bool, n: u64, cx: &mut Context<'_>) {
    let tenant = || key::header(http::HeaderName::from_static("x-tenant"));
    let builder = AdmissionLayer::builder()
        .count(4096)
        .per_key(PerKey::new(64, tenant()));
    let builder = if fair {
        builder.fair_share(FairShare::per_key())
    } else {
        builder
    };
    let layer = builder.build().unwrap();
    let names: Vec<http::HeaderValue> = (0..1000)
        .map(|t| http::HeaderValue::try_from(format!("tenant-{t:04}")).unwrap())
        .collect();
    let resident: Vec<_> = (0..3000)
        .map(|i| {
            let key = Key::from(names[i % 1000].as_bytes());
            layer.gate().try_admit(Some(&key), 0).unwrap()
        })
        .collect();
    let heavy = http::HeaderValue::from_static("heavy");
    let mut s = layer.layer(tower::service_fn(ok));
    for i in 0..n {
        let name = if i % 2 == 0 {
            &heavy
        } else {
            &names[(i / 2 % 1000) as usize]
        };
        let request = http::Request::builder()
            .header("x-tenant", name.clone())
            .body(Empty::<Bytes>::new())
            .unwrap();
        drive_request(&mut s, request, cx);
    }
    let refused = layer
        .snapshot()
        .gate
        .keyed
        .map_or(0, |keyed| keyed.refused_key);
    assert_eq!(
        (refused, layer.snapshot().gate.count.refused),
        (0, 0),
        "every request admitted"
    );
    drop(resident);
}

/// `n` whole calls of `service`. Never inlined, and one copy for each service type: each
/// variant's loop is compiled on its own, whatever else `main` holds (inlined into it,
/// a variant's count moved by 60 instructions when another variant was added).
#[inline(never)]
fn spin<S, B>(service: &mut S, n: u64, cx: &mut Context<'_>)
where
    S: tower::Service<http::Request<B>>,
    S::Error: std::fmt::Debug,
    B: Default,
{
    for _ in 0..n {
        drive::<S, B>(service, cx);
    }
}

/// `n` whole calls of `service`, each response's body polled to its end; as [`spin`].
#[inline(never)]
fn spin_to_end<S, B, RB>(service: &mut S, n: u64, cx: &mut Context<'_>)
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Error: std::fmt::Debug,
    B: Default,
    RB: http_body::Body,
{
    for _ in 0..n {
        drive_to_end::<S, B, RB>(service, cx);
    }
}
