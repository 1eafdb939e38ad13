//! `ClientAddress`: what the per-address cap counts a connection under.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// A client's address, as the per-address connection cap reads it.
pub trait ClientAddress: Clone + fmt::Debug + Send + Sync + 'static {
    /// The IP address connections are counted under; `None` (a Unix socket's peer)
    /// counts under no address.
    fn ip(&self) -> Option<IpAddr>;
}

impl ClientAddress for SocketAddr {
    fn ip(&self) -> Option<IpAddr> {
        Some(SocketAddr::ip(self))
    }
}

// tokio's Unix sockets come with its `net` feature, which `serve` and `axum` turn on.
#[cfg(all(unix, any(feature = "serve", feature = "axum")))]
impl ClientAddress for tokio::net::unix::SocketAddr {
    fn ip(&self) -> Option<IpAddr> {
        None
    }
}
