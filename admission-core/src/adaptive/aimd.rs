use super::{Algorithm, Window};

/// Additive increase, multiplicative decrease, on outcomes alone.
///
/// Each window: if more than [`threshold`](Self::threshold) of the samples were
/// overloaded or dropped, the limit is multiplied by [`backoff`](Self::backoff);
/// otherwise, unless the work did not use half the limit, it grows by
/// [`increase`](Self::increase).
///
/// When to use it: when failures are the signal, that is, the service answers overload
/// itself (503s, `RESOURCE_EXHAUSTED`) or clients give up on a deadline, and latency says
/// little (work of very uneven size).
///
/// # Where it fails
///
/// It learns of a queue only when the queue makes work fail. A limit that is too high
/// (started high, or left high after the server lost capacity) is never lowered while
/// nothing errors: the server queues inside, every request waits, and the limit keeps
/// growing while the work fills it (`admission-bench`'s simulator shows it, with clients
/// that wait long enough that nothing fails, in its README). Pair it with
/// [`overload_latency`](super::AdaptiveBuilder::overload_latency) (a fraction of the
/// clients' deadline: a success slower than that counts as an overload), so that "too
/// slow" is a failure too, or with clients that give up early (reported as
/// [`Gone`](super::Outcome::Gone)). Where latency is a good signal,
/// [`Gradient`](super::Gradient) keeps latency near the no-load latency instead.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_core::adaptive::{Aimd, Algorithm, Outcome, Window};
///
/// let mut aimd = Aimd::default().increase(2.0).backoff(0.5);
/// let mut busy = Window::new(10, Duration::from_millis(100));
/// busy.add(Duration::from_millis(5), Outcome::Success, 10);
/// assert_eq!(aimd.update(&busy), 12);
///
/// let mut failing = Window::new(12, Duration::from_millis(100));
/// failing.add(Duration::from_millis(5), Outcome::Overload, 12);
/// assert_eq!(aimd.update(&failing), 6);
/// ```
#[derive(Debug, Clone)]
pub struct Aimd {
    increase: f64,
    backoff: f64,
    threshold: f64,
    limit: f64,
}

impl Default for Aimd {
    /// Grows by 1 per window, backs off to 90%, on any failure.
    fn default() -> Self {
        Self {
            increase: 1.0,
            backoff: 0.9,
            threshold: 0.0,
            limit: 0.0,
        }
    }
}

impl Aimd {
    /// How much the limit grows per window without failures (default 1; at least 0).
    pub fn increase(mut self, increase: f64) -> Self {
        self.increase = increase.max(0.0);
        self
    }

    /// What the limit is multiplied by after a window with failures (default 0.9;
    /// between 0.1 and 1).
    pub fn backoff(mut self, backoff: f64) -> Self {
        self.backoff = backoff.clamp(0.1, 1.0);
        self
    }

    /// The share of failed samples a window may hold without a backoff (default 0: any).
    pub fn threshold(mut self, share: f64) -> Self {
        self.threshold = share.clamp(0.0, 1.0);
        self
    }
}

impl Algorithm for Aimd {
    fn update(&mut self, window: &Window) -> u64 {
        // Start from the limit in force unless it is our own, rounded.
        if (self.limit - window.limit as f64).abs() >= 1.0 {
            self.limit = window.limit as f64;
        }
        if window.overload_share() > self.threshold {
            self.limit *= self.backoff;
        } else if !window.app_limited() {
            self.limit += self.increase;
        }
        self.limit = self.limit.max(1.0);
        self.limit as u64
    }
}
