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
//! recorder, and `metrics_off` is `ours` opted out (`.metrics(false)`).

use std::task::{Context, Waker};

use admission_bench::layer::{drive, drive_to_end, kib, ok};
use admission_core::adaptive::{AdaptiveLimit, Gradient};
use admission_core::{Classes, CountLedger, Priority};
use admission_tower::AdmissionLayer;
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
            for _ in 0..n {
                drive(&mut s, &mut cx)
            }
        }
        "ours" => {
            let l = AdmissionLayer::builder().count(1024).build().unwrap();
            let mut s = l.layer(tower::service_fn(ok));
            for _ in 0..n {
                drive::<_, Empty<Bytes>>(&mut s, &mut cx)
            }
        }
        "adaptive" => {
            let limit = AdaptiveLimit::builder(Gradient::default()).bounds(1024, 1024);
            let l = AdmissionLayer::builder().adaptive(limit).build().unwrap();
            let mut s = l.layer(tower::service_fn(ok));
            for _ in 0..n {
                drive::<_, Empty<Bytes>>(&mut s, &mut cx)
            }
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
            for _ in 0..n {
                drive_to_end::<_, Empty<Bytes>, _>(&mut s, &mut cx)
            }
        }
        "disabled" => {
            let l = AdmissionLayer::off();
            let mut s = l.layer(tower::service_fn(ok));
            for _ in 0..n {
                drive::<_, Empty<Bytes>>(&mut s, &mut cx)
            }
        }
        "classes" => {
            let l = AdmissionLayer::builder()
                .count(1024)
                .priority(Classes::standard(), |_, _| Priority::SHEDDABLE)
                .build()
                .unwrap();
            let mut s = l.layer(tower::service_fn(ok));
            for _ in 0..n {
                drive::<_, Empty<Bytes>>(&mut s, &mut cx)
            }
        }
        #[cfg(feature = "metrics")]
        "metrics" => {
            let _prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .unwrap();
            let l = AdmissionLayer::builder().count(1024).build().unwrap();
            let mut s = l.layer(tower::service_fn(ok));
            for _ in 0..n {
                drive::<_, Empty<Bytes>>(&mut s, &mut cx)
            }
        }
        #[cfg(feature = "metrics")]
        "metrics_off" => {
            let l = AdmissionLayer::builder()
                .count(1024)
                .metrics(false)
                .build()
                .unwrap();
            let mut s = l.layer(tower::service_fn(ok));
            for _ in 0..n {
                drive::<_, Empty<Bytes>>(&mut s, &mut cx)
            }
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
        "theirs" => {
            let mut s = ServiceBuilder::new()
                .load_shed()
                .concurrency_limit(1024)
                .service(tower::service_fn(ok::<Empty<Bytes>>));
            for _ in 0..n {
                drive(&mut s, &mut cx)
            }
        }
        _ => panic!(),
    }
}
