//! Where a driven ledger's permits record samples, and where the windows they fill close.
//!
//! Below both the count ledger (which keeps a [`Driver`] so that its permits can record
//! with no reference-count traffic) and the adaptive limits (which install the
//! [`Algorithm`] a window's close calls): neither imports the other through here. The
//! public types are re-exported from [`adaptive`](crate::adaptive).

use std::fmt;
use std::time::Duration;

mod driver;
mod window;

#[cfg(all(test, not(admission_loom)))]
pub(crate) use driver::{COUNT_FULL, MICROS_FULL, Shard};
pub(crate) use driver::{Control, Driver, Estimate, Steered};
pub use window::Window;
pub(crate) use window::{BUCKETS, Spread};

/// How an admitted piece of work ended, as the limit learns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Served.
    Success,
    /// The service failed it or answered that it is overloaded (a 5xx, a gRPC
    /// `RESOURCE_EXHAUSTED` or `UNAVAILABLE`, an error), or it took at least the
    /// limit's [`overload_latency`](crate::adaptive::AdaptiveBuilder::overload_latency).
    Overload,
    /// The client went away before the answer (a deadline, a disconnect).
    Gone,
}

/// An algorithm that sets a count limit from windows of samples.
///
/// Called once per window, under the limit's control lock (never on the admission path),
/// with the samples of the window that just closed; returns the limit for the next one.
/// The [`AdaptiveLimit`](crate::adaptive::AdaptiveLimit) clamps the answer into its bounds, so an algorithm should take
/// [`Window::limit`] (what was really in force) as its starting point rather than what
/// it returned last time: the two differ after clamping, and after an operator hands a
/// limit fixed by hand back to the controller.
///
/// Two are provided: [`Gradient`](crate::adaptive::Gradient) (latency against a no-load estimate: the default)
/// and [`Aimd`](crate::adaptive::Aimd) (outcomes only).
///
/// # Examples
///
/// ```
/// use admission_core::adaptive::{Algorithm, Window};
///
/// /// Doubles while nothing fails, halves on any failure.
/// #[derive(Debug)]
/// struct Doubling;
///
/// impl Algorithm for Doubling {
///     fn update(&mut self, window: &Window) -> u64 {
///         if window.overload_share() > 0.0 {
///             window.limit / 2
///         } else if window.app_limited() {
///             window.limit
///         } else {
///             window.limit * 2
///         }
///     }
/// }
/// ```
pub trait Algorithm: fmt::Debug + Send + 'static {
    /// The limit for the next window, given the window that just closed.
    fn update(&mut self, window: &Window) -> u64;

    /// The algorithm's estimate of a request's latency with nothing queued, if it keeps
    /// one (default: none). [`Gradient`](crate::adaptive::Gradient) does; [`Aimd`](crate::adaptive::Aimd) does not. Read after each window
    /// into [`AdaptiveLimit::latency`](crate::adaptive::AdaptiveLimit::latency).
    fn no_load_latency(&self) -> Option<Duration> {
        None
    }
}

impl<A: Algorithm + ?Sized> Algorithm for Box<A> {
    fn update(&mut self, window: &Window) -> u64 {
        (**self).update(window)
    }

    fn no_load_latency(&self) -> Option<Duration> {
        (**self).no_load_latency()
    }
}

/// The sample-count field of a shard's packed word.
pub(crate) const COUNT_BITS: u32 = 24;

/// The largest latency one sample adds (about three days): the field cannot be overrun by
/// one sample.
pub(crate) const MAX_MICROS: u64 = (1 << (64 - COUNT_BITS - 2)) - 1;

/// A latency in whole microseconds, capped so one sample cannot overrun its field. (In
/// 64-bit arithmetic: `Duration::as_micros` divides a 128-bit number, a cost on every
/// sample.)
#[inline]
pub(crate) fn micros(latency: Duration) -> u64 {
    latency
        .as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(latency.subsec_micros()))
        .min(MAX_MICROS)
}

#[inline]
pub(crate) fn nanos(duration: Duration) -> u64 {
    duration
        .as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(duration.subsec_nanos()))
}
