//! A cap on each client's requests in flight that holds across a fleet of servers: leases
//! on a shared Redis (or Valkey), with the hot path local.
//!
//! `admission-tower`'s [`PerKey`](admission_tower::PerKey) caps each client within one
//! process. Behind a load balancer, N replicas give each client N times its cap, and the
//! cap moves whenever the autoscaler moves N. [`FleetCap`] keeps the cap in Redis and
//! leases each replica a part of it, key by key:
//!
//! - **A request within its key's lease is admitted in-process**, as `PerKey` admits:
//!   a map read beside the per-key ledger, no Redis call.
//! - **A request that finds its key's lease used up asks Redis to grow it** by a chunk,
//!   once, waiting at most the grant timeout (100 ms by default) and holding nothing
//!   meanwhile; it is then admitted, or refused 429 if the fleet holds the whole cap. A
//!   Lua script ([`script::GRANT`]) grants atomically: the live leases of every replica
//!   never add up to more than the cap. A key whose traffic lands on one replica grows
//!   that replica's lease to the whole cap; traffic spread over N replicas reaches the
//!   cap too, each lease growing until the cap is held.
//! - **A slot one replica holds and does not use moves to another that asks for it, at
//!   once.** A grant that falls short is published on the cap's channel (Redis pub/sub,
//!   `<prefix>:leases`); replicas holding slots of that key they do not use lower their
//!   own cap to what is in flight and give the rest back; the asker, told so, asks again
//!   within its wait (at most the grant timeout). Under a millisecond on loopback, where
//!   the holder's next renewal would take up to a third of the TTL. Busy slots never move.
//! - **Every third of the leases' time to live** (10 s by default) each replica renews
//!   its leases and shrinks each to what its key has in flight plus a chunk, in two steps:
//!   its own cap first, Redis at the next round, so that no request is admitted on a slot
//!   Redis no longer counts. A key with nothing in flight for two rounds is given back.
//!   While a replica that holds none of a key's cap waits for it, no lease grows past a
//!   fair share (the cap over the replicas that hold or want it), and those above it
//!   shrink to it: traffic spread over the replicas is served on each. Memory follows the
//!   keys with work in flight on both sides: a replica forgets a key it gave back, and
//!   Redis expires a key's leases with the last of them.
//!
//! # When Redis goes away
//!
//! - **A replica that dies** holds its slots until its leases expire: at most the time to
//!   live. The others may then take the whole cap.
//! - **Redis out of reach at start**: a replica told how many replicas may start at once
//!   ([`replicas`](FleetCapBuilder::replicas)) holds each key to `cap / replicas`; one not
//!   told refuses keyed requests until Redis first answers. Either way the fleet stays
//!   within the cap.
//! - **Redis out of reach, or slower than the grant timeout**: the replica goes on its
//!   [`Fallback`], by default a local cap of `cap / N` a key (N: the replicas last counted
//!   live), so the fleet stays within the cap; or refuse, or a fixed local cap. Never
//!   unlimited. No request waits on Redis past the grant timeout. The replica rejoins at
//!   the first heartbeat Redis answers (within a third of the time to live), each key
//!   growing again from what it has in flight. Counted in [`FleetSnapshot`] (and, with
//!   the `metrics` feature, `admission_fleet_fallback`).
//! - **A partition that heals**: the leases of a replica cut off expire within the time to
//!   live, while it runs on its fallback; once back, it asks again. What Redis counts is
//!   never double for longer than the time to live.
//! - **Redis restarted without its data**: every replica's leases register again at its
//!   next renewal (a third of the time to live); until then, the fleet may admit up to
//!   what the replicas held plus what Redis grants anew.
//!
//! # Example
//!
//! ```no_run
//! use admission_redis::FleetCap;
//! use admission_tower::{key, AdmissionLayer};
//!
//! # async fn server() -> Result<(), Box<dyn std::error::Error>> {
//! let redis = redis::Client::open("redis://10.0.0.5/")?;
//! // Each tenant: at most 16 requests in flight across every replica.
//! let fleet = FleetCap::builder(redis, 16).replicas(4).build()?;
//! let tenant = key::header(http::HeaderName::from_static("x-tenant"));
//! let layer = AdmissionLayer::builder()
//!     .count(512) // this replica's own bound, as before
//!     .per_key(fleet.per_key(tenant))
//!     .build()?;
//! # drop(layer);
//! # Ok(())
//! # }
//! ```
//!
//! With the `metrics` feature, the cap reports `admission_fleet_redis_calls_total`,
//! `admission_fleet_fallback` and `admission_fleet_slots`, labelled with the layer's name
//! (or [`FleetCapBuilder::name`]); with `tracing`, it says when it falls back, rejoins, or
//! finds a key's cap held elsewhere. The README has the table.
//!
//! Keys are named in Redis by their value: a key held as a digest (a value longer than
//! [`Key::INLINE`](admission_core::Key::INLINE) bytes, whose digest is keyed by a
//! per-process secret) cannot be named by another replica, and is held to the fallback's
//! cap locally.
//!
//! The cap lives on one Redis (a [`redis::Client`]), on a primary that Sentinel watches
//! (feature `sentinel`, a `SentinelClient`), or on a Redis Cluster (feature `cluster`,
//! `Store::cluster`); see [`Store`].
//!
//! The client is redis-rs (`redis` 1.x), whose `ConnectionManager` reconnects on its own
//! and multiplexes the replica's calls over one connection. Rust 1.88 or newer (redis
//! 1.x's floor). Tested on Redis 7.0 and Valkey 8.0.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(html_root_url = "https://docs.rs/admission-redis/0.2")]

mod config;
mod error;
mod fleet;
mod listen;
mod names;
pub mod script;
mod state;
mod store;
mod upkeep;

pub use config::{Fallback, FleetCapBuilder};
pub use error::FleetError;
pub use fleet::{FleetCap, FleetSnapshot};
pub use store::Store;

/// The README's example, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
