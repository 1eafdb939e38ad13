//! The guide: how a request goes through the layer, what each bound does with a client
//! that will not do its part, and how to wire the layer into hyper, tonic and Prometheus.
//!
//! The crate root has the contract and a table of what to use for what; this page has
//! the reasoning behind it. It holds no items.
//!
//! # How a request goes through
//!
//! [`AdmissionLayer`](crate::AdmissionLayer) wraps a service in [`Admission`](crate::Admission), which for every request:
//!
//! 1. lets the routes you chose to [`bypass`](crate::AdmissionBuilder::bypass) (liveness
//!    probes, say) straight through, holding nothing; none are bypassed unless you say so;
//! 2. reads the head: the key (a header, or an extension set by an authentication
//!    layer that runs before this one; requests without one count as one client, unless
//!    [`Unkeyed::Exempt`](crate::Unkeyed::Exempt)) and its cap if caps are chosen per key, the priority class if
//!    the layer has classes, whether it is a retry if the layer sheds retries first,
//!    and the declared `Content-Length`;
//! 3. admits the request through the gate (count, per-key, bytes; all or nothing) or
//!    refuses it at once: 503 + `Retry-After` for overload (a priority class at its
//!    share of the count limit included) or a closed (draining) layer, 429 +
//!    `Retry-After` for one key over its cap, 413 for a body above the
//!    maximum (checked first: never a retryable answer to a request that can never
//!    fit), 400 for a malformed `Content-Length`. The inner service is never called and
//!    the refused body is never handed to it. By default nothing waits for capacity;
//!    with a [`Wait`](crate::Wait) (feature `tokio`), a request that finds the count full waits for a
//!    slot, bounded in waiters, in time and by its client's deadline, and is refused as
//!    above when the wait runs out;
//! 4. charges a body that has no `Content-Length` (chunked uploads, gRPC) as it arrives.
//!    If the byte budget refuses it before the service has answered, the request is
//!    answered as refused (503 + `Retry-After`, or 413 past the maximum), in place of
//!    whatever the service made of the body error it read (axum's extractors answer 400);
//!    no setup is needed. A service that has already sent its response head sees the
//!    body error (a [`BodyRefused`](crate::BodyRefused)) and ends as it sees fit;
//! 5. holds the permits in the response future and then in the response body, until the
//!    body ends, fails or is dropped. A streaming response (server-sent events, a gRPC
//!    server stream, a download) counts for as long as it streams.
//!
//! Over HTTP/1.1, a refused request's unread body stands between the refusal and the
//! connection's next request. Small bodies (64 KiB within 1 s by default) are discarded (read and dropped)
//! before the refusal is sent and the connection stays open; any other refusal of a
//! request with an unread body says `connection: close`, so a pooled client does not send
//! its next request on a connection that is about to close
//! ([`Refusals::discard`](crate::Refusals::discard)). Over HTTP/2 small bodies are discarded too (a
//! stream answered early is reset, which curl reports in place of the refusal), and no
//! refusal carries a connection header.
//!
//! A request body that arrives slower than a minimum rate (240 bytes per second after a
//! 5 s grace period, counted only while the handler waits on it) is cut and answered 408,
//! and a slow body holds of the byte budget only what it has sent plus what its own rate
//! earns: see [`SlowClients`](crate::SlowClients) for the rule and what it costs.
//!
//! A client that goes away (hangs up, or resets) is let go in every state, its permits
//! released as soon as the server sees it go, which the layer makes sure it does:
//! - **waiting** for a slot ([`Wait`](crate::Wait)): it leaves the queue and never reaches the
//!   handler (the layer reads its body ahead while it waits, up to 64 KiB);
//! - **its handler running**: if the handler dropped the body unfinished (an axum
//!   handler without a body extractor), the layer reads on what is left (and discards
//!   it), and on a hang-up drops the handler's future, as a server does when it sees
//!   one; a handler that reads its body sees the error itself;
//! - **its response under way**: what the handler left unread is read on while the
//!   response lasts, so the hang-up is seen even while the response has nothing to send,
//!   and the response then ends.
//!
//! What a gone client can still hold, and for how long: a waiting request that had sent
//! more than 64 KiB of its body, or `Expect: 100-continue`, until its wait ends (at most
//! `max_wait`); a handler that holds the body without reading it, until it returns; and
//! on HTTP/1.1 a request whose client pipelined another request behind it, until the
//! handler answers. Requests let go are counted in [`AdmissionSnapshot::gone`](crate::AdmissionSnapshot::gone).
//!
//! Connections are the accept loop's, which a layer does not see. Serve through
//! `AdmissionLayer::serve` (feature `serve`) to hold each to the layer's
//! [`ConnectionLimits`](crate::ConnectionLimits): caps on open connections and per client address, checked
//! before anything is read; a [head bound](crate::ConnectionLimits::HEAD_WITHIN) from the
//! accept to a complete request head, whatever the connection does first (a TLS
//! handshake, the h2 preface, a head trickled in), and from the first byte of each later
//! head; an [idle bound](crate::ConnectionLimits::IDLE); h2 pings, a cap on streams a
//! connection and on header bytes; and a client that does not take a response (slower
//! than the [minimum rate](crate::MinDataRate) after its grace period while the server has bytes for it: at the socket, and on h2 per
//! stream, a window kept shut included) is cut, its permits released, while h2 buffers
//! at most 96 KiB of a stream's response. `AdmissionLayer::guard` (for `axum::serve`,
//! feature `axum`) and [`Connections::admit`](crate::Connections::admit) (an accept loop of your own) hold the caps,
//! the first byte and the send rate at the socket only: a listener sees bytes, not
//! requests, so through them a head trickled a byte every 10 s, an idle keep-alive
//! connection, or an h2 stream whose window the client keeps at 0, keeps its place for
//! as long as it likes.
//!
//! The request's permits are another matter: under any server the layer's response body
//! keeps the minimum send rate itself ([`SlowClients::min_response_rate`](crate::SlowClients::min_response_rate)).
//! hyper asks a body for its next frame only once what it was handed has gone into its
//! buffers, which it does only as the client takes it; so a body not asked within its
//! allowance (the grace period, plus what the bytes it has sent earn at the rate, at most
//! 64 KiB's worth banked) is not being taken, whether it was never asked at all (an h2
//! window of 0 from the start) or left mid-way. Its permits go at once, from one thread
//! that sweeps every 250 ms, and it ends in [`Stalled`](crate::Stalled) when next asked.
//! Time it waits on its own source is never the client's. Under `serve` the h2 stream
//! is reset at the same allowance.
//!
//! What it does not bound: how long a request takes (compose `tower::timeout`), memory a
//! handler allocates beyond the request body (charge it to a `ByteLedger` yourself), an
//! upgraded connection (WebSocket) once upgraded (it keeps its place under the caps), or
//! anything across processes.
//!
//! # Fair shares
//!
//! A per-key cap is fixed; a [`FairShare`](crate::FairShare) moves with the load: each
//! client's share is the count (its class's share of it) over the clients with work,
//! rounded up, so a lone client can use an idle server and, once it is full, a client
//! sending ten times as many requests does not take ten times the slots that free.
//! Without a [`Wait`](crate::Wait), the last free slots (the headroom) are kept for the
//! clients below their share and a client at or above it is refused 429: the heavy one
//! is shed first, at the price of those slots idling while the light ones do not come.
//! With a wait, waiting clients take turns at the slots that free instead, one each in
//! turn, and no slot idles; a full queue makes room for a client with fewer waiters, and
//! a client's own old waiters give way to its newer ones (the wait's standing-queue
//! rule) only while it has at least its share of the waiters. A request that costs more
//! than one slot says so with [`seats`](crate::AdmissionBuilder::seats).
//!
//! # Adaptive concurrency
//!
//! [`AdmissionBuilder::adaptive`](crate::AdmissionBuilder::adaptive) hands the count limit to an
//! [`AdaptiveLimit`](crate::adaptive::AdaptiveLimit), which finds the concurrency the
//! server really has and follows it (see [`adaptive`](crate::adaptive) for the algorithms
//! and when to use which). Each admitted request is a sample: its latency from admission
//! to the response head (or, with [`SampleAt::BodyEnd`](crate::SampleAt::BodyEnd), to the body's end) and its
//! outcome (a 5xx, a trailers-only gRPC `RESOURCE_EXHAUSTED`, `UNAVAILABLE` or
//! `DEADLINE_EXCEEDED`, or a service error is an overload; a response future dropped
//! before its head, a client gone). The head is the default because a streaming response
//! lasts as long as its client reads, which says nothing about the server's load. The
//! byte and key limits, classes (whose shares follow the limit), bypass and dry run are
//! unchanged; a [`close`](crate::AdmissionLayer::close) or [`drain`](crate::AdmissionLayer::drain)
//! overrides the controller, and a count set by hand holds until handed back. The limit in
//! force is in every snapshot (and, with `metrics`, in `admission_limit_requests`).
//!
//! # Chunked uploads
//!
//! A body without a length (a chunked upload) is charged as it arrives, and refused with
//! the same answers, whatever the handler's extractor would have said:
//!
//! ```
//! use admission_tower::AdmissionLayer;
//! use axum::{body::{Body, Bytes}, routing::post, Router};
//! use http::{Request, StatusCode};
//! use http_body::Frame;
//! use http_body_util::StreamBody;
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let admission = AdmissionLayer::builder()
//!     .bytes(64 << 10)
//!     .max_request_bytes(1024)
//!     .build()?;
//! let app = Router::new()
//!     .route("/upload", post(|body: Bytes| async move { body.len().to_string() }))
//!     .layer(admission);
//!
//! // Two 800-byte chunks, no Content-Length: past the maximum on the second chunk.
//! let chunks = [Bytes::from(vec![0; 800]), Bytes::from(vec![0; 800])];
//! let frames = chunks.map(|c| Ok::<_, std::convert::Infallible>(Frame::data(c)));
//! let body = Body::new(StreamBody::new(tokio_stream::iter(frames)));
//! let response = app.oneshot(Request::post("/upload").body(body)?).await?;
//! assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE); // not axum's 400
//! # Ok(())
//! # }
//! ```
//!
//! With hyper directly, wrap the service with `tower::ServiceBuilder::new().layer(..)`
//! and serve it through `hyper_util::service::TowerToHyperService`; with tonic,
//! `tonic::transport::Server::builder().layer(..)`. A refused gRPC call is answered
//! trailers-only with `UNAVAILABLE`, which gRPC clients retry (see
//! [`Refusals::respond`](crate::Refusals::respond)); `admission-grpc` adds `RESOURCE_EXHAUSTED` with `RetryInfo`.
//!
//! # Prometheus (feature `metrics`)
//!
//! With the `metrics` feature the layer records admissions, refusals by dimension and
//! hold times through the `metrics` facade, and its ledgers' gauges when you ask
//! (`AdmissionLayer::record_gauges`, in the `/metrics` handler). A complete axum
//! server with `/metrics` in Prometheus text, with buckets so that the hold time is a
//! Prometheus histogram (the series, and what they cost, are in the feature's section of
//! the [crate docs](crate), shown when the docs are built with it, as on docs.rs):
//!
//! ```rust
//! # #[cfg(feature = "metrics")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use admission_tower::AdmissionLayer;
//! use axum::{body::Body, routing::get, Router};
//! use http::Request;
//! use http_body_util::BodyExt;
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//! use tower::ServiceExt;
//!
//! // 1. The recorder, before any layer is built; buckets make the layer's two
//! // histograms (the hold time and the wait) Prometheus histograms.
//! let histograms = Matcher::Prefix("admission_".to_owned());
//! let buckets = [0.005, 0.025, 0.1, 0.5, 2.5, 10.0];
//! let prometheus = PrometheusBuilder::new()
//!     .set_buckets_for_metric(histograms, &buckets)?
//!     .install_recorder()?;
//!
//! // 2. The layer, named for its series.
//! let admission = AdmissionLayer::builder()
//!     .name("api")
//!     .count(512)
//!     .bypass(|req| matches!(req.uri.path(), "/health" | "/metrics"))
//!     .build()?;
//!
//! // 3. `/metrics` reads the gauges from the ledgers, then renders.
//! let gauges = admission.clone();
//! let app = Router::new()
//!     .route("/work", get(|| async { "done" }))
//!     .route("/health", get(|| async { "ok" }))
//!     .route(
//!         "/metrics",
//!         get(move || {
//!             gauges.record_gauges();
//!             std::future::ready(prometheus.render())
//!         }),
//!     )
//!     .layer(admission);
//!
//! // Serve it as usual (`admission.serve(listener, app)`); here, in-process:
//! app.clone().oneshot(Request::get("/work").body(Body::empty())?).await?;
//! let scrape = app.oneshot(Request::get("/metrics").body(Body::empty())?).await?;
//! let text = String::from_utf8(scrape.into_body().collect().await?.to_bytes().to_vec())?;
//! assert!(text.contains(r#"admission_admitted_total{name="api"} 1"#));
//! assert!(text.contains(r#"admission_limit_requests{name="api"} 512"#));
//! assert!(text.contains(r#"admission_permit_held_seconds_count{name="api"} 1"#));
//! assert!(text.contains(r#"admission_permit_held_seconds_bucket{name="api",le="10"} 1"#));
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "metrics"))]
//! # fn main() {}
//! ```
