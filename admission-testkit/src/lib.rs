//! The workspace's test helpers, shared by every crate's tests and examples (not
//! published): a server on loopback ([`serve`], [`serve_on`], [`spawn_server`]), h2 written by hand
//! ([`h2`]), waiting for what a test expects ([`eventually`]), a heap counter
//! ([`heap`], installed by [`count_the_heap!`]), and a directory that goes with the test
//! ([`Scratch`]).

// Test helpers: each test binary uses part of them.
#![allow(missing_docs, dead_code)]

mod eventually;
pub mod h2;
pub mod heap;
mod scratch;
mod serve;

pub use eventually::{eventually, eventually_within, holds_within};
pub use scratch::Scratch;

/// The workspace README's examples, compiled and run as doctests (this crate is not
/// published, so its dev-dependencies can be every adapter the README shows).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct WorkspaceReadme;
pub use serve::{Served, serve, serve_on, spawn_server};
