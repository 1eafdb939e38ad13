//! Seats on the wire: a request that costs several count slots holds them all until its
//! response ends, and is refused (503) unless all are free, while a one-seat request
//! still fits.

use std::sync::Arc;

use crate::support::{Seen, app, eventually, next_chunk, send, serve, text, with_header};
use admission_tower::AdmissionLayer;
use http::StatusCode;
use tower::Layer;

#[tokio::test]
async fn a_request_of_three_seats_holds_three_until_its_body_ends() {
    let layer = AdmissionLayer::builder()
        .count(4)
        .seats(|req| {
            let seats = req.headers.get("x-seats").and_then(|v| v.to_str().ok());
            seats.and_then(|v| v.parse().ok()).unwrap_or(1)
        })
        .build()
        .unwrap();
    let seen = Arc::new(Seen::default());
    let addr = serve(layer.layer(app(seen.clone()))).await;
    let in_flight = || layer.gate().count().in_flight();

    let mut wide = send(addr, with_header("/stream", "x-seats", "3")).await;
    assert_eq!(wide.status(), StatusCode::OK);
    assert_eq!(next_chunk(&mut wide).await.unwrap(), "first\n");
    assert_eq!(
        in_flight(),
        3,
        "its three seats, held while its body streams"
    );
    assert_eq!(layer.snapshot().gate.count.in_flight, 3);

    let refused = send(addr, with_header("/", "x-seats", "2")).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().contains_key(http::header::RETRY_AFTER));
    let fits = send(addr, with_header("/", "x-seats", "1")).await;
    assert_eq!(fits.status(), StatusCode::OK);
    assert_eq!(text(fits).await, "ok");

    seen.end_streams();
    drop(wide);
    eventually("every seat released", || in_flight() == 0).await;
    // More seats than the count: at most the count, so it runs alone.
    let everything = send(addr, with_header("/", "x-seats", "100")).await;
    assert_eq!(everything.status(), StatusCode::OK);
}
