//! Per-call overhead of the admission layer (count only) around a ready service, beside
//! the bare service and tower's `LoadShed` + `ConcurrencyLimit`.
//!
//! Each iteration drives one whole call: `poll_ready`, `call`, poll the future to its
//! response, and drop the response, so the permit's whole life (into the future, into
//! the body, released when the body drops) is inside the measurement.

use std::convert::Infallible;
use std::future::{ready, Future};
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use admission_tower::AdmissionLayer;
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use http_body_util::Empty;
use tower::{Layer, Service, ServiceBuilder};

fn drive<S, B>(service: &mut S, cx: &mut Context<'_>)
where
    S: Service<Request<B>>,
    S::Error: std::fmt::Debug,
    B: Default,
{
    match service.poll_ready(cx) {
        Poll::Ready(Ok(())) => {}
        _ => panic!("the service is always ready"),
    }
    let future = pin!(service.call(Request::new(B::default())));
    match future.poll(cx) {
        Poll::Ready(Ok(response)) => drop(black_box(response)),
        _ => panic!("the response is ready at once"),
    }
}

fn ok<B>(_: Request<B>) -> std::future::Ready<Result<Response<Empty<Bytes>>, Infallible>> {
    ready(Ok(Response::new(Empty::new())))
}

fn layer(c: &mut Criterion) {
    let mut g = c.benchmark_group("layer");
    let mut cx = Context::from_waker(Waker::noop());

    let mut bare = tower::service_fn(ok::<Empty<Bytes>>);
    g.bench_function("bare", |b| b.iter(|| drive(&mut bare, &mut cx)));

    let admission = AdmissionLayer::builder()
        .count(1024)
        .build()
        .unwrap()
        .unwrap();
    let mut ours = admission.layer(tower::service_fn(ok));
    g.bench_function("admission", |b| {
        b.iter(|| drive::<_, Empty<Bytes>>(&mut ours, &mut cx))
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

criterion_group!(benches, layer);
criterion_main!(benches);
