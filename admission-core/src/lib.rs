//! Admission ledgers for servers: bound what is in flight, and shed what is over the
//! bound (by default at once; optionally after a short wait, bounded in waiters).
//!
//! A server that accepts work must bound what it holds at once: how many requests, how
//! many bytes they buffer, and how much any one client takes. Over the bound the answer
//! is an immediate, retryable refusal, not a queue (a queue without bounds keeps the
//! buffered bodies resident and only moves the unbounded growth elsewhere). Where
//! traffic comes in bursts, a count acquisition may instead wait for a slot
//! ([`CountLedger::acquire`], [`Gate::claim`]): at most
//! [`max_waiting`](CountLedger::set_max_waiting) at once, each holding only a small entry
//! of the ledger's queue, served by class, newest first once the queue stands.
//!
//! This crate is the runtime-agnostic core: no async runtime, no HTTP. Adapters
//! (`admission-http`, `admission-tower`, `admission-grpc`) map its refusals to responses.
//!
//! | You want to bound | Use | Refusal |
//! |---|---|---|
//! | requests in flight | [`CountLedger`] → [`CountPermit`] | [`Refused::Count`] |
//! | bytes buffered in flight | [`ByteLedger`] → [`BytePermit`] (grows, shrinks) | [`Refused::Bytes`], [`Refused::TooLarge`] |
//! | requests in flight per client | [`KeyedLedger`] → [`KeyedPermit`], keyed by [`Key`] or your own type | [`Refused::Key`], [`Refused::KeyTable`] |
//! | any of these together | [`Gate`] → [`GatePermit`], all or nothing | the dimension that refused |
//! | the least important work shed first | [`Priority`] classes ([`Classes`]) with [`CountLedger::try_acquire_as`], [`Claim::priority`] | [`Refused::Count`], counted by class |
//! | retries shed before first attempts | [`Priority::retry`] of the request's class | [`Refused::Class`], counted by class and as retries |
//! | a cap chosen per client (tenant tiers) | [`KeyedLedger::try_acquire_with_cap`], [`Claim::key_cap`] | [`Refused::Key`] |
//! | a count limit that finds the server's concurrency itself | [`AdaptiveLimit`] driving a [`CountLedger`] ([`adaptive`]) | [`Refused::Count`] |
//! | a burst served rather than shed | [`CountLedger::acquire`] / [`Gate::claim`] after [`CountLedger::set_max_waiting`] (a future, no timer: add your runtime's timeout) | [`Refused::Count`] beyond the waiters |
//! | a byte budget sized from the memory the process may use | [`memory::MemoryLimit::read`] (cgroup v2 or v1, else the machine), [`memory::MemoryBudget`] | |
//! | shutting down gracefully | [`Gate::drain`] → [`Drain`] (a future, or [`Drain::wait`]) | [`Refused::Closed`] |
//!
//! Every permit is `'static`, `Send + Sync`, `#[must_use]`, and releases exactly once,
//! when dropped. `try_` acquisition never blocks, never awaits, and (for count and
//! bytes) takes no lock and never allocates: one compare-exchange to acquire, one to
//! release (while acquisitions wait, a release hands its slot to a waiter under the
//! ledger's lock instead). In configuration (constructors, builders) a limit of 0 means "unlimited"
//! (a [`Gate`] leaves such a byte or key dimension out; it always counts requests), and
//! a limit a ledger cannot represent is a [`CapacityError`] from the constructor, never
//! a panic later. Limits can be changed at run time, where 0 is an error rather than a
//! silent "unlimited" (removing a limit is spelled out: `set_unlimited`, ...); held
//! permits are never revoked. [`CountLedger::close`] (or [`Gate::close`]) refuses
//! everything new until reopened, whatever limits are set meanwhile, and
//! [`Gate::drain`] closes and waits, on any runtime or none, for the last permit.
//!
//! # Example
//!
//! ```
//! use admission_core::{Gate, Refused};
//!
//! // 2 requests in flight, 1 MiB of bodies, 1 request per client.
//! let gate = Gate::<&str>::builder().count(2).bytes(1 << 20).per_key(1).build()?;
//!
//! let first = gate.try_admit(Some(&"alice"), 4096)?;
//! // Alice is at her share: 429 territory.
//! assert_eq!(gate.try_admit(Some(&"alice"), 10).unwrap_err(), Refused::Key);
//! let second = gate.try_admit(Some(&"bob"), 4096)?;
//! // The server is full: 503 territory.
//! assert_eq!(gate.try_admit(Some(&"carol"), 10).unwrap_err(), Refused::Count);
//!
//! // The permits release when dropped: at the end of the response body, say.
//! drop((first, second));
//! let snap = gate.snapshot();
//! assert_eq!(snap.count.in_flight, 0);
//! assert_eq!(snap.count.refused, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What is verified, and how
//!
//! The invariants (never above a limit outside the lone-request exemption; back to zero
//! and an empty key table once every permit is gone; a refused call changes nothing but
//! the refusing dimension's refusal counter, and holds nothing that could make another
//! request be refused; a key's cap holds, and the key is counted once, while its entry
//! is reclaimed; one of two concurrent oversized charges on an idle byte ledger; a
//! lowered limit revokes nothing and admits nothing above it) are checked by unit tests,
//! by property tests against a plain reference model, and by loom models of every
//! atomic protocol (`cargo xtask loom` in the workspace).

#![deny(unsafe_code)] // Allowed in `raw`, `count`, `bytes` and `keyed`, each block argued.
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(html_root_url = "https://docs.rs/admission-core/0.2")]

pub mod adaptive;
#[allow(unsafe_code)]
mod bytes;
mod classes;
#[allow(unsafe_code)]
mod count;
mod gate;
mod key;
#[allow(unsafe_code)]
mod keyed;
mod limit;
pub mod memory;
mod priority;
#[allow(unsafe_code)]
mod raw;
mod refused;
mod samples;
mod stats;
mod sync;

pub use adaptive::AdaptiveLimit;
pub use bytes::{ByteLedger, BytePermit};
pub use classes::{ClassError, Classes};
pub use count::{Acquire, CountLedger, CountPermit, Drain};
pub use gate::{Claim, Gate, GateBuilder, GatePermit, GateSnapshot};
pub use key::Key;
pub use keyed::{KeyHasher, KeyState, KeyedLedger, KeyedPermit, KeyedSnapshot};
pub use priority::{MAX_CLASSES, Priority};
pub use refused::{CapacityError, Refused};
pub use stats::Snapshot;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
