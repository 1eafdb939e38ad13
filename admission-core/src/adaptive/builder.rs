//! `AdaptiveBuilder`: an adaptive limit's algorithm, bounds and window, and `build`.

use std::time::Duration;

use super::{AdaptiveError, AdaptiveLimit, Algorithm, Control, CountLedger, Window};

use std::time::Instant;

use super::limit::Guard;
use crate::samples::{micros, nanos};

/// Builds an [`AdaptiveLimit`]; from [`AdaptiveLimit::builder`].
#[derive(Debug)]
pub struct AdaptiveBuilder {
    pub(super) algorithm: Box<dyn Algorithm>,
    pub(super) min: u64,
    pub(super) max: u64,
    pub(super) initial: u64,
    pub(super) window: Duration,
    pub(super) min_samples: u64,
    pub(super) overload_latency: Option<Duration>,
    pub(super) epoch: Option<Instant>,
}

impl AdaptiveLimit {
    /// A builder for a limit that `algorithm` drives.
    pub fn builder(algorithm: impl Algorithm) -> AdaptiveBuilder {
        AdaptiveBuilder {
            algorithm: Box::new(algorithm),
            min: 1,
            max: 10_000,
            initial: 20,
            window: Duration::from_millis(100),
            min_samples: 50,
            overload_latency: None,
            epoch: None,
        }
    }
}

impl AdaptiveBuilder {
    /// The bounds the limit stays within, whatever the algorithm says (defaults: 1 and
    /// 10 000). The minimum is what a struggling server is still sent; the maximum, what
    /// a fast one may be sent at most.
    ///
    /// The floor is only a floor: how low [`Gradient`](super::Gradient)'s probe of the
    /// no-load latency goes is its own setting ([`Gradient::probe`](super::Gradient::probe),
    /// a share of the server's concurrency), not the minimum. A probe the floor holds up
    /// measures what runs at the floor; where that is above the server's concurrency, the
    /// estimate reads a queue, so keep the floor below what the server runs at once.
    pub fn bounds(mut self, min: u64, max: u64) -> Self {
        self.min = min;
        self.max = max;
        self
    }

    /// The limit to start from, clamped into the bounds (default 20).
    pub fn initial(mut self, limit: u64) -> Self {
        self.initial = limit;
        self
    }

    /// The shortest window (default 100 ms): a window closes at the first sample after it
    /// has lasted this long and holds at least [`min_samples`](Self::min_samples).
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// The fewest samples a window closes with (default 50): fewer make a noisy mean.
    /// ([`Gradient`](crate::adaptive::Gradient) decides on rounds of windows with enough samples for the spread it
    /// sees; an outcome-only algorithm such as [`Aimd`](crate::adaptive::Aimd) decides window by window.)
    pub fn min_samples(mut self, samples: u64) -> Self {
        self.min_samples = samples.max(1);
        self
    }

    /// Counts a sample that took at least `latency` as [`Outcome::Overload`](crate::adaptive::Outcome::Overload) (default:
    /// none). For outcome-only algorithms such as [`Aimd`](crate::adaptive::Aimd), whose only signal otherwise
    /// is failure: a fraction of the clients' deadline is a good value.
    pub fn overload_latency(mut self, latency: Duration) -> Self {
        self.overload_latency = Some(latency);
        self
    }

    /// The instant the limit's clock starts from (default: when it is built). A
    /// simulation passes its virtual clock's origin, and then the instants it records at.
    pub fn epoch(mut self, epoch: Instant) -> Self {
        self.epoch = Some(epoch);
        self
    }

    /// Puts `ledger`'s capacity in the limit's hands, starting at the initial limit.
    ///
    /// # Errors
    ///
    /// [`AdaptiveError::Bounds`] for invalid bounds, [`AdaptiveError::AlreadyDriven`] if
    /// another adaptive limit drives the ledger.
    pub fn build(self, ledger: &CountLedger) -> Result<AdaptiveLimit, AdaptiveError> {
        let (min, max) = (self.min, self.max);
        if min == 0 || min > max || max > CountLedger::MAX_CAPACITY as u64 {
            return Err(AdaptiveError::Bounds { min, max });
        }
        let initial = self.initial.clamp(min, max);
        let epoch = self.epoch.unwrap_or_else(Instant::now);
        let control = Control {
            algorithm: self.algorithm,
            pending: Window::default(),
            opened: 0,
            window: nanos(self.window),
            min_samples: self.min_samples,
            bounds: (min, max),
            windows: 0,
            last: None,
            typical: None,
        };
        let overload_after = self.overload_latency.map_or(u64::MAX, micros);
        if !ledger.drive(initial, epoch, control, overload_after) {
            return Err(AdaptiveError::AlreadyDriven);
        }
        Ok(AdaptiveLimit {
            guard: std::sync::Arc::new(Guard {
                ledger: ledger.clone(),
            }),
        })
    }
}
