//! A minimum data rate for request bodies, and the reservation a slow body may hold.
//!
//! A body is timed only while its reader waits on it: from a poll that found nothing
//! until the next frame. A handler that reads slowly, or not at all, is not a slow
//! client. After the grace period, a body that has waited `w` in all must have sent at
//! least `rate × w` bytes; one that has not is cut ([`Refused::TooSlow`]).
//!
//! A body with a declared length holds, of the byte budget, what it has sent plus what
//! it would send in the grace period at its own measured rate (never below the minimum
//! rate, measured over at least a second of waiting), up to its declared length. So a
//! client holds the budget only as fast as it fills it.
//!
//! [`Refused::TooSlow`]: admission_core::Refused::TooSlow

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;

use crate::alarm::Alarm;

/// The slowest a request body may arrive: at least `bytes_per_second`, once it has
/// waited for a `grace` period, measured only while its reader waits on it.
///
/// The default is Kestrel's: 240 bytes per second after 5 s. A body that sends at that
/// rate takes 273 s for 64 KiB: the rate cuts only what is barely moving, and the byte
/// reservation (see [`MeteredBody::paced`](crate::MeteredBody::paced)) bounds what a
/// body just above it holds.
///
/// ```
/// use std::time::Duration;
/// use admission_http::MinDataRate;
///
/// let rate = MinDataRate::default();
/// assert_eq!((rate.bytes_per_second(), rate.grace()), (240, Duration::from_secs(5)));
/// // What a body that has sent nothing yet may hold ahead: the grace period at the rate.
/// assert_eq!(rate.grace_bytes(), 1_200);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinDataRate {
    bytes_per_second: u64,
    grace: Duration,
}

impl Default for MinDataRate {
    fn default() -> Self {
        Self::new(240, Duration::from_secs(5))
    }
}

/// The shortest wait over which a body's own rate is measured: a body whose first bytes
/// come with its head has waited for nothing, and its rate is not yet known.
const MEASURED_OVER: Duration = Duration::from_secs(1);

/// How often a waiting body gives back the part of its reservation its rate no longer
/// earns.
pub(crate) const REVIEW: Duration = Duration::from_secs(1);

impl MinDataRate {
    /// At least `bytes_per_second` (0 is taken as 1) after `grace`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_http::MinDataRate;
    ///
    /// let rate = MinDataRate::new(1_000, Duration::from_secs(2));
    /// assert_eq!(rate.grace_bytes(), 2_000);
    /// ```
    pub const fn new(bytes_per_second: u64, grace: Duration) -> Self {
        Self {
            bytes_per_second: if bytes_per_second == 0 {
                1
            } else {
                bytes_per_second
            },
            grace,
        }
    }

    /// The minimum rate, in bytes per second.
    ///
    /// ```
    /// use admission_http::MinDataRate;
    ///
    /// assert_eq!(MinDataRate::default().bytes_per_second(), 240);
    /// ```
    pub const fn bytes_per_second(&self) -> u64 {
        self.bytes_per_second
    }

    /// How long a body may wait before the rate applies.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_http::MinDataRate;
    ///
    /// assert_eq!(MinDataRate::default().grace(), Duration::from_secs(5));
    /// ```
    pub const fn grace(&self) -> Duration {
        self.grace
    }

    /// What the grace period is worth at the minimum rate: the most a body that has sent
    /// nothing may hold of the byte budget.
    ///
    /// ```
    /// use admission_http::MinDataRate;
    ///
    /// assert_eq!(MinDataRate::default().grace_bytes(), 240 * 5);
    /// ```
    pub fn grace_bytes(&self) -> u64 {
        bytes_in(self.bytes_per_second, self.grace)
    }

    /// How long in all a body that has sent `received` bytes may have waited.
    pub(crate) fn patience(&self, received: u64) -> Duration {
        let earned = Duration::from_secs_f64(received as f64 / self.bytes_per_second as f64);
        self.grace.max(earned)
    }

    /// What a body that has sent `received` bytes over `waited` may hold ahead of them:
    /// the grace period at its own rate, or at the minimum rate if that is higher.
    pub(crate) fn ahead(&self, received: u64, waited: Duration) -> u64 {
        let over = waited.max(MEASURED_OVER).as_secs_f64();
        let own = (received as f64 / over) as u64;
        bytes_in(own.max(self.bytes_per_second), self.grace)
    }
}

/// The clock bodies are timed by: tokio's where there is one (so a paused test clock
/// holds for bodies too), else the system's.
pub(crate) fn now() -> Instant {
    #[cfg(feature = "tokio")]
    return tokio::time::Instant::now().into_std();
    #[cfg(not(feature = "tokio"))]
    return Instant::now();
}

fn bytes_in(bytes_per_second: u64, period: Duration) -> u64 {
    let bytes = bytes_per_second as f64 * period.as_secs_f64();
    if bytes >= u64::MAX as f64 {
        u64::MAX
    } else {
        bytes as u64
    }
}

pin_project! {
    /// One body's timing: its rate, its declared length, what it has sent, how long its
    /// reader has waited on it, and the alarm for a wait that runs out.
    pub(crate) struct Pace {
        pub(crate) rate: MinDataRate,
        pub(crate) declared: Option<u64>,
        pub(crate) received: u64,
        waited: Duration,
        // When the wait in progress began: set by a poll that found nothing.
        since: Option<Instant>,
        alarm: Alarm,
    }
}

impl Pace {
    pub(crate) fn new(rate: MinDataRate, declared: Option<u64>) -> Self {
        Self {
            rate,
            declared,
            received: 0,
            waited: Duration::ZERO,
            since: None,
            alarm: Alarm::new(),
        }
    }

    /// The wait so far, counting the one in progress up to `now`.
    pub(crate) fn waited(&self, now: Instant) -> Duration {
        let current = self
            .since
            .map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
        self.waited + current
    }

    /// Whether the body has waited longer than what it has sent allows.
    pub(crate) fn too_slow(&self, now: Instant) -> bool {
        self.waited(now) > self.rate.patience(self.received)
    }

    /// What the body may hold of the byte budget now: what it has sent, plus what its
    /// rate earns ahead, up to its declared length (without one, only what it has sent).
    pub(crate) fn reservation(&self, now: Instant) -> u64 {
        match self.declared {
            Some(declared) => {
                let ahead = self.rate.ahead(self.received, self.waited(now));
                declared
                    .min(self.received.saturating_add(ahead))
                    .max(self.received)
            }
            None => self.received,
        }
    }

    /// A poll found nothing: the wait starts now, unless one is in progress.
    pub(crate) fn waiting(self: Pin<&mut Self>, now: Instant) {
        let this = self.project();
        if this.since.is_none() {
            *this.since = Some(now);
        }
    }

    /// A frame came: the wait in progress ends, and `data` bytes are counted.
    pub(crate) fn arrived(self: Pin<&mut Self>, now: Instant, data: u64) {
        let this = self.project();
        if let Some(since) = this.since.take() {
            *this.waited += now.saturating_duration_since(since);
        }
        *this.received = this.received.saturating_add(data);
    }

    /// While a wait is in progress: wakes the reader when the body's patience runs out,
    /// or, if it holds more than it has sent, at the next review of its reservation.
    /// `Ready` when that time has come.
    pub(crate) fn poll_alarm(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        now: Instant,
        holds_ahead: bool,
    ) -> Poll<()> {
        let left = self
            .rate
            .patience(self.received)
            .saturating_sub(self.waited(now));
        let next = if holds_ahead { left.min(REVIEW) } else { left };
        // The wake comes a millisecond late, so that the body is then past its patience.
        self.project()
            .alarm
            .poll_at(cx, now + next + Duration::from_millis(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: MinDataRate = MinDataRate::new(240, Duration::from_secs(5));

    #[test]
    fn a_rate_is_what_it_was_made_with_and_never_zero() {
        assert_eq!(RATE.bytes_per_second(), 240);
        assert_eq!(RATE.grace(), Duration::from_secs(5));
        assert_eq!(MinDataRate::new(0, Duration::ZERO).bytes_per_second(), 1);
    }

    #[test]
    fn outside_a_runtime_a_wait_has_no_alarm_and_does_not_panic() {
        let mut pace = Box::pin(Pace::new(RATE, None));
        let now = Instant::now();
        pace.as_mut().waiting(now);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let later = now + Duration::from_secs(60);
        assert!(pace.as_mut().poll_alarm(&mut cx, later, false).is_pending());
        assert!(pace.too_slow(later), "cut at its next frame instead");
    }

    #[test]
    fn a_body_may_wait_out_the_grace_period_then_what_it_has_sent_earns() {
        assert_eq!(RATE.patience(0), Duration::from_secs(5));
        assert_eq!(RATE.patience(1_200), Duration::from_secs(5));
        assert_eq!(RATE.patience(2_400), Duration::from_secs(10));
    }

    #[test]
    fn what_a_body_holds_ahead_is_the_grace_period_at_its_rate_or_the_minimum() {
        // Nothing sent: the minimum rate's grace bytes.
        assert_eq!(RATE.ahead(0, Duration::ZERO), 1_200);
        // 2 KiB/s over 10 s: 10 KiB ahead.
        assert_eq!(RATE.ahead(20_480, Duration::from_secs(10)), 10_240);
        // Slower than the minimum: the minimum.
        assert_eq!(RATE.ahead(100, Duration::from_secs(10)), 1_200);
        // A first frame that came with the head is measured over a second, not over 0.
        assert_eq!(RATE.ahead(1, Duration::ZERO), 1_200);
        assert_eq!(RATE.ahead(16_384, Duration::ZERO), 81_920);
    }

    #[test]
    fn a_reservation_is_what_was_sent_plus_what_the_rate_earns_up_to_the_declared_length() {
        let now = Instant::now();
        let mut pace = Box::pin(Pace::new(RATE, Some(65_536)));
        assert_eq!(pace.reservation(now), 1_200);
        pace.as_mut().arrived(now, 16_384);
        assert_eq!(pace.reservation(now), 65_536, "a fast body reserves it all");
        let mut chunked = Box::pin(Pace::new(RATE, None));
        chunked.as_mut().arrived(now, 500);
        assert_eq!(
            chunked.reservation(now),
            500,
            "no length: only what was sent"
        );
    }

    #[test]
    fn only_time_spent_waiting_counts() {
        let start = Instant::now();
        let mut pace = Box::pin(Pace::new(RATE, Some(65_536)));
        pace.as_mut().waiting(start);
        pace.as_mut().waiting(start + Duration::from_secs(1)); // still the same wait
        pace.as_mut().arrived(start + Duration::from_secs(4), 10);
        // The reader is busy for a minute: no wait in progress.
        let later = start + Duration::from_secs(64);
        assert_eq!(pace.waited(later), Duration::from_secs(4));
        assert!(!pace.too_slow(later));
        pace.as_mut().waiting(later);
        assert!(!pace.too_slow(later + Duration::from_secs(1)));
        assert!(pace.too_slow(later + Duration::from_millis(1_001)));
    }
}
