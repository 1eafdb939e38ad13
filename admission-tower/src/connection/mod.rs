//! Bounds on connections before any request exists ([`ConnectionLimits`]), and the
//! ledgers that count them ([`Connections`]).

mod limits;

pub use limits::ConnectionLimits;

#[cfg(feature = "tokio")]
mod address;
#[cfg(feature = "axum")]
mod guard;
#[cfg(feature = "tokio")]
mod io;
#[cfg(feature = "tokio")]
mod ledgers;

#[cfg(feature = "tokio")]
pub use address::ClientAddress;
#[cfg(feature = "axum")]
pub use guard::Guarded;
#[cfg(feature = "tokio")]
pub use io::GuardedIo;
#[cfg(feature = "tokio")]
pub use ledgers::Connections;
