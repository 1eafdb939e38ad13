//! admission-tower's tests that share nothing global (no heap counter, metrics recorder
//! or tracing subscriber), one binary: each module is one subject, on the wire where it
//! can be. The tests that install a global of their own are binaries of their own
//! (`connections`, `footprint`, `memory`, `metrics`, `responses`, `serve`, `tracing`).

mod adaptive;
mod builder;
mod drain;
mod fair;
mod frameworks;
mod gone;
mod h2;
mod leases;
mod priority;
mod refusals;
mod retries;
mod seats;
mod send_rate;
mod server;
mod service;
mod slow;
#[path = "../support/mod.rs"]
mod support;
mod wait;
