//! admission-http's integration tests, one binary: each module is one subject, run
//! against the crate's public API alone.

mod ahead;
mod body;
mod key;
mod meter;
mod pace;
mod refusal;
mod support;
mod unread;
