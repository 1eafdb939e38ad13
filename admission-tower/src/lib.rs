//! Admission control for tower-based servers (axum, hyper, tonic): bound the requests
//! in flight, the bytes of their bodies, and each client's share; over a bound, shed at
//! once with a retryable answer. Never queue.
//!
//! | You want to | Use |
//! |---|---|
//! | put the gate in front of a service | [`AdmissionLayer::builder`] → [`AdmissionLayer`] → [`Admission`] |
//! | read what it is doing | [`AdmissionLayer::snapshot`], [`AdmissionBuilder::on_refusal`] |
//! | roll a limit out safely | [`AdmissionBuilder::dry_run`] |
//! | change a limit at run time | [`AdmissionLayer::gate`] and the ledgers' setters |
//!
//! The middleware and a complete axum example are in [`admission`]. The ledgers are
//! [`admission_core`]'s and the bodies [`admission_http`]'s, both re-exported.

#![forbid(unsafe_code)]

pub mod admission;

pub use admission::{
    Admission, AdmissionBuilder, AdmissionLayer, AdmissionPermit, AdmissionSnapshot, RefusalEvent,
    ResponseBody, ResponseFuture,
};
pub use admission_core;
pub use admission_http;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
