//! Admission control for tower-based servers (axum, hyper, tonic): bound the requests
//! in flight, the bytes of their bodies, and each client's share; over a bound, shed at
//! once with a retryable answer, or (optionally, for bursty traffic) after a short wait
//! for a count slot, bounded in waiters and in time ([`Wait`]).
//!
//! Everything a server needs is importable from this crate alone: the layer and its
//! builder, and the items of `admission-core` and `admission-http` it takes (keys,
//! classes, refusal shapes), re-exported. gRPC servers add `admission-grpc` beside it.
//!
//! | You want to | Use |
//! |---|---|
//! | put the gate in front of a service | [`AdmissionLayer::builder`] → [`AdmissionLayer`] → [`Admission`] |
//! | size the byte budget from the machine, and shed before the process runs out of memory | [`AdmissionBuilder::bytes_share`] with [`MemoryShare`] |
//! | serve bursts rather than shed them (bounded) | [`AdmissionBuilder::wait`] with a [`Wait`] |
//! | cap each client (429 over its share) | [`PerKey`] with [`key::header`] or [`key::peer_ip`] |
//! | give each tenant the cap of its tier | [`PerKey::cap_by`] |
//! | shed the least important work first | [`AdmissionBuilder::priority`] with [`Classes`] (or [`class::header`]) |
//! | shed retries before first attempts | [`AdmissionBuilder::retries`] with [`Retries`] |
//! | shape refusals (`Retry-After`, jitter, body) | [`Refusals`] |
//! | share one limit between servers (HTTP and gRPC, a layer and an interceptor) | [`AdmissionLayer::from_gate`] over clones of one [`Gate`] |
//! | cut request bodies that trickle, and take back what a response its client does not take holds (under any server), so a slow client cannot pin a limit | [`SlowClients`] (on by default) |
//! | serve with every connection bounded: caps (per client address too), heads, idle, h2 streams | `AdmissionLayer::serve` (feature `serve`) with [`ConnectionLimits`] |
//! | keep `axum::serve`, with what a listener can bound | `AdmissionLayer::guard` (feature `axum`); [`Connections`] in an accept loop of your own |
//! | shut down gracefully | `Serve::with_graceful_shutdown` (with a deadline), or [`AdmissionLayer::drain`] (refuse new, finish admitted, then complete) |
//! | read what it is doing | [`AdmissionLayer::snapshot`], [`AdmissionBuilder::on_refusal`]; features `metrics` and `tracing` (below) |
//! | roll a limit out safely | [`AdmissionBuilder::dry_run`] |
//! | find the limit as the server's capacity moves | [`AdmissionBuilder::adaptive`] |
//! | change a limit at run time, or stop traffic | [`AdmissionLayer::gate`] and the ledgers' setters; [`AdmissionLayer::close`] |
//! | turn admission off by configuration | [`AdmissionLayer::off`] |
//!
//! Choosing the count limit is in [`AdmissionBuilder::count`].
//!
//! # Example
//!
//! ```
//! use admission_tower::{key, AdmissionLayer, PerKey};
//! use axum::{body::Body, routing::get, Router};
//! use http::{Request, StatusCode};
//! use http_body_util::BodyExt;
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let admission = AdmissionLayer::builder()
//!     .count(512)
//!     .bytes(256 << 20)
//!     .max_request_bytes(16 << 20)
//!     .per_key(PerKey::new(32, key::header(http::HeaderName::from_static("x-api-key"))))
//!     .bypass(|req| matches!(req.uri.path(), "/" | "/health"))
//!     .build()?;
//!
//! let app = Router::new()
//!     .route("/", get(|| async { "up" }))
//!     .route("/health", get(|| async { "ok" }))
//!     .route("/work", get(|| async { "done" }))
//!     .layer(admission.clone());
//!
//! // Serve it with every connection bounded: `admission.serve(listener, app).await`
//! // (feature `serve`), or as usual with `axum::serve`. Here, one request in-process:
//! let response = app
//!     .clone()
//!     .oneshot(Request::get("/work").header("x-api-key", "k1").body(Body::empty())?)
//!     .await?;
//! assert_eq!(response.status(), StatusCode::OK);
//!
//! // The request holds its permits until its response body ends.
//! assert_eq!(admission.snapshot().gate.count.in_flight, 1);
//! let body = response.into_body().collect().await?.to_bytes();
//! assert_eq!(body, "done");
//! assert_eq!(admission.snapshot().gate.count.in_flight, 0);
//!
//! // A body above the maximum is refused before it is read.
//! let huge = Request::post("/work")
//!     .header("content-length", (32 << 20).to_string())
//!     .body(Body::empty())?;
//! assert_eq!(app.oneshot(huge).await?.status(), StatusCode::PAYLOAD_TOO_LARGE);
//!
//! let count = admission.snapshot().gate.count;
//! assert_eq!((count.in_flight, count.high_water), (0, 1));
//! # Ok(())
//! # }
//! ```
//!
//! # The contract
//!
//! - Every admitted request holds its permits (a count slot, its key's slot, its body's
//!   bytes) until its response body ends, fails or is dropped: a streaming response
//!   counts for as long as it streams.
//! - Over a bound a request is refused at once, never queued without bound: 503 +
//!   `Retry-After` for overload, 429 + `Retry-After` for one client over its share, 413
//!   for a body larger than the largest allowed (gRPC: trailers-only `UNAVAILABLE`). The
//!   inner service never sees a refused request. With a [`Wait`] it may first wait,
//!   bounded in waiters, in time and by its client's deadline.
//! - A client that goes away, or will not do its part (trickles its body, stops reading
//!   its response, keeps an h2 window shut), is let go and its permits released, within
//!   bounds that are on by default, under any server ([`SlowClients`]; and
//!   [`ConnectionLimits`] for the connections, when served by `serve`).
//! - Nothing is bounded across processes (`admission-redis` does that for per-client
//!   caps), nor how long a handler takes, nor what it allocates beyond the body.
//!
//! The [`guide`] walks through a request's path, the slow and the gone client, the
//! connection bounds, adaptive limits and Prometheus, with examples. Tested against axum
//! 0.7 and 0.8 and tonic 0.12 to 0.14 (the README's table); Rust 1.85 or newer, every
//! feature included.
//!
#![cfg_attr(feature = "metrics", doc = "")]
#![cfg_attr(feature = "metrics", doc = include_str!("observe/metrics.md"))]
#![cfg_attr(feature = "tracing", doc = "")]
#![cfg_attr(feature = "tracing", doc = include_str!("observe/tracing.md"))]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(html_root_url = "https://docs.rs/admission-tower/0.2")]

mod adaptive_limit;
mod assemble;
mod body;
mod builder;
mod connection;
mod discard;
mod error;
mod fair;
mod future;
pub mod guide;
mod late;
mod layer;
mod limits;
mod memory;
#[cfg(not(all(feature = "axum", feature = "serve")))]
mod needs_feature;
mod observe;
mod pacer;
mod per_key;
mod permit;
mod readings;
mod retry;
mod send_pace;
#[cfg(feature = "serve")]
#[cfg_attr(docsrs, doc(cfg(feature = "serve")))]
pub mod serve;
mod service;
mod shared;
mod slow;
mod stalls;
#[cfg(feature = "tokio")]
mod wait;

pub use adaptive_limit::{Adaptive, SampleAt};
pub use body::ResponseBody;
pub use builder::{AdmissionBuilder, NewGate, SharedGate};
pub use connection::ConnectionLimits;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use connection::Guarded;
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub use connection::{ClientAddress, Connections, GuardedIo};
pub use error::{BuildError, Stalled, Undrained};
pub use fair::FairShare;
pub use future::ResponseFuture;
pub use layer::AdmissionLayer;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use layer::GuardedListener;
pub use memory::MemoryShare;
pub use per_key::{Leases, LeasesTaken, PerKey, Unkeyed};
pub use readings::{AdmissionSnapshot, RefusalEvent, WaitSnapshot};
pub use retry::Retries;
pub use service::Admission;
pub use slow::SlowClients;
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub use wait::Wait;

// What the layer takes and gives, from the crates beneath: one dependency for a server.
pub use admission_core::{Classes, Drain, Gate, GateSnapshot, Key, Priority, Refused, adaptive};
pub use admission_http::{
    BodyRefused, MeteredBody, MinDataRate, Refusal, RefusalBody, RefusalContext, Refusals, class,
    key,
};

/// The crates beneath, whole, for what is not re-exported above (the ledgers
/// themselves, to use outside a layer).
pub use admission_core;
pub use admission_http;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
