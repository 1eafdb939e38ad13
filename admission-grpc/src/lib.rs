//! gRPC-correct admission for tonic servers.
//!
//! A gRPC client that receives a bare HTTP 503 maps it to `UNAVAILABLE` and loses the
//! server's meaning; and under the OpenTelemetry protocol's rules an exporter retries
//! `RESOURCE_EXHAUSTED` only when the status carries `google.rpc.RetryInfo` (without it,
//! the telemetry is dropped). This crate makes refusals gRPC responses, done right:
//!
//! | You want to | Use |
//! |---|---|
//! | admit calls with the admission layer, refused as trailers-only `RESOURCE_EXHAUSTED` + `RetryInfo` | [`refusals()`] given to `AdmissionBuilder::refusals` |
//! | the same, answered `UNAVAILABLE` for clients whose retry policy lists only that | [`refusals_with`] + [`RefusalCode::Unavailable`] |
//! | never shed health checks | [`is_health_check`] as the layer's bypass |
//! | admit in an interceptor (count and key; scope: the handler) | [`AdmissionInterceptor`] |
//! | refuse a charge made inside a handler (decoded bytes, say) | [`refused_status`] |
//!
//! # What a refused call sees
//!
//! | Refused by | Code | `grpc-retry-pushback-ms`, `RetryInfo` |
//! |---|---|---|
//! | count, byte budget, per-key cap, key table | `RESOURCE_EXHAUSTED` (or `UNAVAILABLE`: [`RefusalCode`]) | yes, from `retry_after` |
//! | one request too large | `RESOURCE_EXHAUSTED` | no: retrying cannot help |
//! | a malformed `Content-Length` | `INVALID_ARGUMENT` | no |
//!
//! The same at the head and while the request streams in: tonic clients send no
//! `Content-Length`, so a byte budget or a maximum request size refuses as the message
//! arrives; the call is answered with the refusal rather than with the handler's
//! `UNKNOWN` (see [`refusals()`]). The OpenTelemetry OTLP exporter retries these
//! refusals by its own policy (the workspace tests it against the real exporter).
//!
//! # Example
//!
//! A tonic server behind the layer, its health service bypassed, and a client:
//!
//! ```
//! use std::time::Duration;
//! use admission_grpc::is_health_check;
//! use admission_tower::{key, AdmissionLayer, PerKey};
//! use tonic::transport::{Endpoint, Server};
//! use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let admission = AdmissionLayer::builder()
//!     .count(256)                              // calls in flight, streams included
//!     .bytes(64 << 20)                         // request bytes in flight
//!     .max_request_bytes(4 << 20)
//!     .per_key(PerKey::new(16, key::header(http::HeaderName::from_static("x-tenant"))))
//!     .bypass(is_health_check)
//!     // trailers-only RESOURCE_EXHAUSTED, RetryInfo and grpc-retry-pushback-ms of 250 ms
//!     .refusals(admission_grpc::refusals().retry_after(Duration::from_millis(250)))
//!     .build()?;
//!
//! let (reporter, health) = tonic_health::server::health_reporter();
//! reporter.set_service_status("", tonic_health::ServingStatus::Serving).await;
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let addr = listener.local_addr()?;
//! tokio::spawn(
//!     Server::builder()
//!         .layer(admission.clone())
//!         .add_service(health) // add your services here too
//!         .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
//! );
//!
//! let channel = Endpoint::from_shared(format!("http://{addr}"))?.connect().await?;
//! let reply = HealthClient::new(channel)
//!     .check(HealthCheckRequest { service: String::new() })
//!     .await?;
//! assert_eq!(reply.into_inner().status, 1); // SERVING
//! # Ok(())
//! # }
//! ```
//!
//! Inside a handler, charge what decoding produced and refuse with the same status:
//!
//! ```
//! use std::time::Duration;
//! use admission_core::ByteLedger;
//! use admission_grpc::refused_status;
//!
//! fn export(decoded: &ByteLedger, batch: Vec<u8>) -> Result<usize, tonic::Status> {
//!     // The decoded batch, not its wire size, is what the process holds.
//!     let _held = decoded
//!         .try_charge(batch.len() as u64)
//!         .map_err(|refused| refused_status(refused, Duration::from_secs(1)))?;
//!     Ok(batch.len()) // process the batch; the charge is released on return
//! }
//!
//! let decoded = ByteLedger::new(1 << 20).unwrap();
//! assert_eq!(export(&decoded, vec![0; 100]).unwrap(), 100);
//! let _busy = decoded.try_charge(1 << 20).unwrap();
//! let refused = export(&decoded, vec![0; 100]).unwrap_err();
//! assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
//! ```
//!
//! # Compatibility
//!
//! tonic 0.14, whose `Status` this crate's API uses (a server of an older tonic would
//! read it, in a body error, as `UNKNOWN`); in front of tonic 0.12 and 0.13, use
//! `admission-tower` alone, whose refused calls read `UNAVAILABLE`. Rust 1.88 or newer,
//! tonic 0.14's own floor.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(html_root_url = "https://docs.rs/admission-grpc/0.2")]

pub mod class;
mod interceptor;
pub mod key;
mod layer;
mod service;
mod status;

pub use interceptor::{AdmissionInterceptor, HandlerPermit};
pub use layer::{is_health_check, refusals, refusals_with};
pub use service::NamedAdmission;
pub use status::{RETRY_PUSHBACK_MS, RefusalCode, refused_status, refused_status_with};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
