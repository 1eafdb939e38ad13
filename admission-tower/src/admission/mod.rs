//! The admission gate as a tower middleware.
//!
//! [`AdmissionLayer`] wraps a service in [`Admission`], which for every request:
//!
//! 1. lets bypassed routes (liveness: `/`, `/health`) straight through, holding nothing;
//! 2. reads the head: the key (a header, or an extension set by an authentication
//!    layer that runs before this one) and the declared `Content-Length`;
//! 3. admits the request through the gate (count, per-key, bytes; all or nothing) or
//!    refuses it at once: 503 + `Retry-After` for overload, 429 + `Retry-After` for one
//!    key over its cap, 413 for a body above the maximum, 400 for a malformed
//!    `Content-Length`. A refused request's body is never read and the inner service is
//!    never called. Nothing waits: there is no queue;
//! 4. holds the permits in the response future and then in the response body, until the
//!    body ends, fails or is dropped. A streaming response (server-sent events, a gRPC
//!    server stream, a download) counts for as long as it streams.
//!
//! What it does not bound: connections (the server's accept loop), how long a request
//! takes (compose `tower::timeout`), memory a handler allocates beyond the request body
//! (charge it to a `ByteLedger` yourself), or anything across processes.
//!
//! # Example
//!
//! ```
//! use admission_tower::AdmissionLayer;
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
//!     .per_key(32, |req| {
//!         req.headers.get("x-api-key")?.to_str().ok().map(String::from)
//!     })
//!     .bypass(|req| matches!(req.uri.path(), "/" | "/health"))
//!     .build()?
//!     .expect("limits are configured");
//!
//! let app = Router::new()
//!     .route("/", get(|| async { "up" }))
//!     .route("/health", get(|| async { "ok" }))
//!     .route("/work", get(|| async { "done" }))
//!     .layer(admission.clone());
//!
//! // Serve it as usual: `axum::serve(listener, app).await`. Here, one request in-process:
//! let response = app
//!     .clone()
//!     .oneshot(Request::get("/work").header("x-api-key", "k1").body(Body::empty())?)
//!     .await?;
//! assert_eq!(response.status(), StatusCode::OK);
//!
//! // The request holds its permits until its response body ends.
//! assert_eq!(admission.snapshot().gate.count.unwrap().in_flight, 1);
//! let body = response.into_body().collect().await?.to_bytes();
//! assert_eq!(body, "done");
//! assert_eq!(admission.snapshot().gate.count.unwrap().in_flight, 0);
//!
//! // A body above the maximum is refused before it is read.
//! let huge = Request::post("/work")
//!     .header("content-length", (32 << 20).to_string())
//!     .body(Body::empty())?;
//! assert_eq!(app.oneshot(huge).await?.status(), StatusCode::PAYLOAD_TOO_LARGE);
//!
//! let count = admission.snapshot().gate.count.unwrap();
//! assert_eq!((count.in_flight, count.high_water), (0, 1));
//! # Ok(())
//! # }
//! ```
//!
//! With hyper directly, wrap the service with `tower::ServiceBuilder::new().layer(..)`
//! and serve it through `hyper_util::service::TowerToHyperService`; with tonic,
//! `tonic::transport::Server::builder().layer(..)` (and see `admission-grpc` for
//! gRPC-shaped refusals).

mod body;
mod drain;
mod future;
mod layer;
mod service;

pub use body::ResponseBody;
pub use future::ResponseFuture;
pub use layer::{AdmissionBuilder, AdmissionLayer, AdmissionSnapshot, RefusalEvent};
pub use service::{Admission, AdmissionPermit};
