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
    pub fn serve<L: NeedsServeFeature, S>(
        &self,
        _listener: L,
        _service: S,
    ) -> std::convert::Infallible {
        unreachable!("no type implements NeedsServeFeature")
    }
}
