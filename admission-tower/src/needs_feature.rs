//! Stand-ins for the entry points of features that are off: a call to one fails to
//! compile with an error that names the feature to turn on, rather than "no method".

use crate::AdmissionLayer;

/// Implemented by nothing: the bound of `AdmissionLayer::guard`'s stand-in.
#[cfg(not(feature = "axum"))]
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`AdmissionLayer::guard` needs admission-tower's `axum` feature",
    label = "turn on the `axum` feature of admission-tower to guard this listener"
)]
pub trait NeedsAxumFeature {}

/// Implemented by nothing: the bound of `AdmissionLayer::serve`'s stand-in.
#[cfg(not(feature = "serve"))]
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`AdmissionLayer::serve` needs admission-tower's `serve` feature",
    label = "turn on the `serve` feature of admission-tower to serve on this listener"
)]
pub trait NeedsServeFeature {}

impl AdmissionLayer {
    /// The `axum` feature is off: see the feature's `guard`.
    #[cfg(not(feature = "axum"))]
    #[doc(hidden)]
    pub fn guard<L: NeedsAxumFeature>(&self, _listener: L) -> std::convert::Infallible {
        unreachable!("no type implements NeedsAxumFeature")
    }

    /// The `serve` feature is off: see the feature's `serve`.
    #[cfg(not(feature = "serve"))]
    #[doc(hidden)]
    pub fn serve<L: NeedsServeFeature, S>(&self, _listener: L, _service: S) -> ServeNeedsFeature {
        unreachable!("no type implements NeedsServeFeature")
    }
}

/// The `serve` feature is off: what `serve`'s stand-in returns. It has the methods of the
/// feature's `Serve` and awaits to a stand-in `Shutdown`, so that a call written for the
/// feature fails with the one error that names it, not a second about its result.
#[cfg(not(feature = "serve"))]
#[doc(hidden)]
#[derive(Debug)]
pub struct ServeNeedsFeature(std::convert::Infallible);

#[cfg(not(feature = "serve"))]
impl ServeNeedsFeature {
    /// See the `serve` feature's `Serve::handshake`.
    pub fn handshake<H>(self, _handshake: H) -> Self {
        match self.0 {}
    }

    /// See the `serve` feature's `Serve::with_graceful_shutdown`.
    pub fn with_graceful_shutdown<F>(self, _signal: F, _deadline: std::time::Duration) -> Self {
        match self.0 {}
    }
}

#[cfg(not(feature = "serve"))]
impl std::future::IntoFuture for ServeNeedsFeature {
    type Output = ShutdownNeedsFeature;
    type IntoFuture = std::future::Ready<ShutdownNeedsFeature>;

    fn into_future(self) -> Self::IntoFuture {
        match self.0 {}
    }
}

/// The `serve` feature is off: what its stand-in's future gives.
#[cfg(not(feature = "serve"))]
#[doc(hidden)]
#[derive(Debug)]
pub struct ShutdownNeedsFeature(std::convert::Infallible);

#[cfg(not(feature = "serve"))]
impl ShutdownNeedsFeature {
    /// See the `serve` feature's `Shutdown::connections_cut`.
    pub fn connections_cut(&self) -> usize {
        match self.0 {}
    }

    /// See the `serve` feature's `Shutdown::requests_cut`.
    pub fn requests_cut(&self) -> u64 {
        match self.0 {}
    }
}
