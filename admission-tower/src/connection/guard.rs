//! `Guarded`: an axum listener whose connections are bounded, as far as a listener can.

use super::{Connections, GuardedIo};
use crate::ClientAddress;

/// An axum listener that guards every connection it accepts ([`Connections`]).
/// Made by [`AdmissionLayer::guard`](crate::AdmissionLayer::guard).
#[derive(Debug)]
pub struct Guarded<L> {
    listener: L,
    connections: Connections,
}

impl<L> Guarded<L> {
    pub(crate) fn new(listener: L, connections: Connections) -> Self {
        Self {
            listener,
            connections,
        }
    }

    /// The bounds and the open-connection count.
    pub fn connections(&self) -> &Connections {
        &self.connections
    }
}

impl<L> axum::serve::Listener for Guarded<L>
where
    L: axum::serve::Listener,
    L::Addr: crate::ClientAddress,
{
    type Io = GuardedIo<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (io, addr) = self.listener.accept().await;
            // Over a cap the connection is closed at once: shed, never queue.
            let address = ClientAddress::ip(&addr);
            if let Some(io) = self.connections.admit_from(io, address, true) {
                return (io, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}
