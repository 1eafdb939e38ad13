//! Admission control for tower-based servers (axum, hyper, tonic): bound the requests
//! in flight, the bytes of their bodies, and each client's share; over a bound, shed at
//! once with a retryable answer. Never queue.
//!
//! | You want to | Use |
//! |---|---|
//! | put the gate in front of a service | [`AdmissionLayer::builder`] → [`AdmissionLayer`] → [`Admission`] |
//! | cap each client (429 over its share) | [`AdmissionBuilder::per_key`] with [`admission_http::key::header`] or [`admission_http::key::peer_ip`] |
//! | shed the least important work first | [`AdmissionBuilder::priority`] with [`admission_core::Classes`] (or [`admission_http::class::header`]) |
//! | give each tenant the cap of its tier | [`AdmissionBuilder::key_cap`] |
//! | share one limit between servers (HTTP and gRPC, a layer and an interceptor) | [`AdmissionLayer::from_gate`] over clones of one [`admission_core::Gate`] |
//! | cut request bodies that trickle, so a slow client cannot pin a limit | [`SlowClients`] (on by default) |
//! | cap connections, close silent ones, cut clients that stop reading | `AdmissionLayer::guard` for `axum::serve` (feature `axum`), [`Connections`] for hyper-util |
//! | shut down gracefully | [`AdmissionLayer::drain`] (refuse new, finish admitted, then complete) |
//! | read what it is doing | [`AdmissionLayer::snapshot`], [`AdmissionBuilder::on_refusal`]; features `metrics` (Prometheus and any `metrics` exporter) and `tracing` ([module docs](admission)) |
//! | roll a limit out safely | [`AdmissionBuilder::dry_run`] |
//! | change a limit at run time, or stop traffic | [`AdmissionLayer::gate`] and the ledgers' setters; [`AdmissionLayer::close`] |
//!
//! The shortest correct code for a global limit on an axum app, a per-API-key cap and a
//! graceful drain is in this crate's README (its examples run as doctests); tonic
//! servers are in `admission-grpc`.
//!
//! The middleware and a complete axum example are in [`admission`]. The ledgers are
//! [`admission_core`]'s and the bodies [`admission_http`]'s, both re-exported.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admission;

pub use admission::{
    Admission, AdmissionBuilder, AdmissionLayer, AdmissionSnapshot, BuildError, RefusalEvent,
    ResponseBody, ResponseFuture, SampleAt, SlowClients,
};
#[cfg(feature = "tokio")]
pub use admission::{Connections, GuardedIo};
#[cfg(feature = "axum")]
pub use admission::{Guarded, GuardedListener};
pub use admission_core;
pub use admission_http;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
