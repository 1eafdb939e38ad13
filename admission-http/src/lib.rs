//! Admission for servers built on `http` 1.x and `http-body` 1.x.
//!
//! | You want to | Use |
//! |---|---|
//! | hold a permit until the response body ends (streams, downloads, SSE, gRPC) | [`PermitBody`] |
//! | charge request bodies against a byte budget, and refuse one too large | [`RequestMeter`], [`MeteredBody`], [`RequestCharge`] |
//! | cut a body that arrives slower than a minimum rate, and hold of the budget only what it fills | [`MeteredBody::paced`], [`MinDataRate`] |
//! | see a client hang up while its request waits, reading its body ahead (bounded) and giving it back intact | [`ReadAhead`], [`MeteredBody::replay`] |
//! | answer a refused request (503 / 429 / 413 + `Retry-After`, optionally jittered) | [`Refusals`], [`Refusal`] |
//! | key a per-client limit by a header or the peer address, without allocating | [`key::header`], [`key::peer_ip`] |
//!
//! The ledgers come from [`admission_core`]; for a ready-made middleware see
//! `admission-tower`.
//!
//! # Example
//!
//! A hand-written admission step: meter the request, admit it through a count ledger,
//! and hold both permits until the response body ends.
//!
//! ```
//! use admission_core::{ByteLedger, CountLedger};
//! use admission_http::{MeteredBody, PermitBody, Refusals, Refusal, RequestMeter};
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Full};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), admission_http::BoxError> {
//! let count = CountLedger::new(64)?;
//! let meter = RequestMeter::new(ByteLedger::new(8 << 20)?);
//! let refusals = Refusals::new();
//!
//! let request = http::Request::post("/echo")
//!     .header("content-length", "5")
//!     .body(Full::new(Bytes::from("hello")))?;
//!
//! let Ok(permit) = count.try_acquire() else {
//!     let _503 = refusals.respond(&request, Refusal::Refused(admission_core::Refused::Count));
//!     return Ok(());
//! };
//! let (request, charge) = match meter.charge(request.headers()) {
//!     Ok(charge) => (request.map(|b| MeteredBody::new(b, charge.clone())), charge),
//!     Err(refusal) => {
//!         let _refusal = refusals.respond(&request, refusal);
//!         return Ok(());
//!     }
//! };
//!
//! // The handler reads the (metered) body and answers.
//! let body = request.into_body().collect().await?.to_bytes();
//! let response = http::Response::new(Full::new(body));
//!
//! // Both permits ride with the response body and are released when it ends.
//! let mut response = response.map(|body| PermitBody::new(body, (permit, charge)));
//! assert_eq!((count.in_flight(), meter.ledger().in_flight()), (1, 5));
//! while let Some(frame) = response.body_mut().frame().await {
//!     frame?;
//! }
//! assert_eq!((count.in_flight(), meter.ledger().in_flight()), (0, 0));
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(html_root_url = "https://docs.rs/admission-http/0.2")]

mod ahead;
mod alarm;
mod answer;
mod body;
mod charge;
pub mod class;
mod grpc;
mod jitter;
pub mod key;
mod metered_body;
mod pace;
mod rate;
mod refusal;
mod request_meter;
mod shape;

pub use ahead::{ReadAhead, ReadFrames};
#[doc(hidden)]
pub use alarm::Alarm;
pub use answer::{DiscardLimits, Refusals};
pub use body::PermitBody;
pub use charge::RequestCharge;
pub use grpc::{INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE, grpc_code};
pub use jitter::jittered;
pub use metered_body::MeteredBody;
pub use rate::{MinDataRate, Patience};
pub use refusal::{BodyRefused, BoxError, Refusal, content_length};
pub use request_meter::{MeteredRequest, RequestMeter};
pub use shape::{BodyRefusalContext, RefusalBody, RefusalContext};

pub use admission_core;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
