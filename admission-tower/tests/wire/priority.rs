//! Priority classes and tenant tiers on a real server: a hyper server on loopback behind
//! the layer, a hyper client, responses held open so the ledger's level is the test's.

use std::sync::{Arc, Mutex};

use crate::support::{Seen, app, get, send, serve, with_header};
use admission_tower::{AdmissionLayer, Classes, Key, PerKey, Priority, class, key};
use http::StatusCode;
use hyper::body::Incoming;

/// Opens a streaming response of class `class`; `Ok` with the open response if admitted.
async fn open(
    addr: std::net::SocketAddr,
    class: &str,
) -> Result<http::Response<Incoming>, StatusCode> {
    let response = send(addr, with_header("/stream", "x-request-class", class)).await;
    match response.status() {
        StatusCode::OK => Ok(response),
        status => {
            if status == StatusCode::SERVICE_UNAVAILABLE {
                assert!(response.headers().contains_key("retry-after"));
            }
            Err(status)
        }
    }
}

#[tokio::test]
async fn a_critical_request_is_refused_only_at_full_capacity() {
    let shed = Arc::new(Mutex::new(Vec::new()));
    let seen_by_hook = shed.clone();
    let classes = Classes::standard();
    let layer = AdmissionLayer::builder()
        .count(10)
        .priority(
            classes.clone(),
            class::header(class::HEADER, Priority::DEFAULT),
        )
        .bypass(|req| req.uri.path() == "/health")
        .on_refusal(move |event| {
            let class = event.class.map(str::to_owned);
            seen_by_hook.lock().unwrap().push((event.priority, class));
        })
        .build()
        .unwrap();
    let seen = Arc::new(Seen::default());
    let addr = serve(tower::Layer::layer(&layer, app(seen.clone()))).await;
    let count = layer.gate().count().clone();

    // Fill with each class in turn, least important first, until it is refused; at every
    // level below the capacity a critical request is admitted (and completes).
    let mut held = Vec::new();
    for (name, share) in [("sheddable", 7), ("default", 9), ("critical", 10)] {
        while let Ok(response) = open(addr, name).await {
            held.push(response);
            assert!(count.in_flight() <= share, "{name} admitted above {share}");
            if count.in_flight() < 10 {
                let critical = send(addr, with_header("/", "x-request-class", "critical")).await;
                assert_eq!(
                    critical.status(),
                    StatusCode::OK,
                    "critical refused below capacity"
                );
                assert_eq!(crate::support::text(critical).await, "ok");
                let open_streams = held.len() as u64;
                crate::support::eventually("the critical request's permit released", || {
                    count.in_flight() == open_streams
                })
                .await;
            }
        }
        assert_eq!(count.in_flight(), share, "{name} refused below its share");
    }
    // At full capacity: critical is refused too (503 + Retry-After), health still served.
    assert_eq!(
        open(addr, "critical").await.unwrap_err(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(send(addr, get("/health")).await.status(), StatusCode::OK);
    // A request naming no class is of the fallback class; at the capacity, the refusal
    // names the count.
    let full = send(addr, get("/")).await;
    assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        crate::support::text(full).await,
        "overloaded: count limit reached\n"
    );

    assert_eq!(
        layer.refused_by_class(),
        [("critical", 2), ("default", 2), ("sheddable", 1)]
    );
    let refused = layer.snapshot().gate.refused_by_class;
    assert_eq!(refused[..3], [2, 2, 1]);
    let hook = shed.lock().unwrap().clone();
    let named = |p: Priority, n: &str| (Some(p), Some(n.to_owned()));
    assert_eq!(
        hook,
        [
            named(Priority::SHEDDABLE, "sheddable"),
            named(Priority::DEFAULT, "default"),
            named(Priority::CRITICAL, "critical"),
            named(Priority::CRITICAL, "critical"),
            named(Priority::DEFAULT, "default"),
        ]
    );

    // Releasing one slot admits critical work before anything else.
    drop(held.pop());
    crate::support::eventually("a permit released", || count.in_flight() == 9).await;
    // Below the capacity, a class at its share is refused by its share, and says so.
    let default = send(addr, with_header("/", "x-request-class", "default")).await;
    assert_eq!(default.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        crate::support::text(default).await,
        "overloaded: priority class share reached\n"
    );
    held.push(open(addr, "critical").await.unwrap());
    drop(held);
    crate::support::eventually("every permit released", || count.in_flight() == 0).await;
}

#[tokio::test]
async fn a_tenant_gets_the_cap_of_its_tier() {
    let paying = [Key::from("acme")];
    let layer = AdmissionLayer::builder()
        .per_key(
            PerKey::new(1, key::header(http::HeaderName::from_static("x-tenant")))
                .cap_by(move |_, tenant| paying.contains(tenant).then_some(3)),
        )
        .build()
        .unwrap();
    let seen = Arc::new(Seen::default());
    let addr = serve(tower::Layer::layer(&layer, app(seen.clone()))).await;

    let tenant = |name| with_header("/stream", "x-tenant", name);
    let mut held = Vec::new();
    for _ in 0..3 {
        let response = send(addr, tenant("acme")).await;
        assert_eq!(response.status(), StatusCode::OK);
        held.push(response);
    }
    assert_eq!(
        send(addr, tenant("acme")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let free = send(addr, tenant("free-user")).await;
    assert_eq!(free.status(), StatusCode::OK);
    assert_eq!(
        send(addr, tenant("free-user")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let keyed = layer.gate().keyed().unwrap().clone();
    assert_eq!((keyed.in_flight(&Key::from("acme")), keyed.keys()), (3, 2));
    drop((held, free));
    crate::support::eventually("every key reclaimed", || keyed.keys() == 0).await;
}
