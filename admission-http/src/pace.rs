//! A request body held to a minimum data rate, and the reservation a slow body may hold.
//!
//! A body is timed only while its reader waits on it: from a poll that found nothing
//! until the next frame. A handler that reads slowly, or not at all, is not a slow
//! client. The rule is [`Patience`]'s: the grace period to start with,
//! spent while the reader waits, earned back at `1 / rate` for each byte sent (banked up
//! to [`Patience::BANKED`]); a body whose wait outlasts it is cut
//! ([`Refused::TooSlow`]).
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
use crate::rate::{MinDataRate, Patience, bytes_in};

/// The shortest wait over which a body's own rate is measured: a body whose first bytes
/// come with its head has waited for nothing, and its rate is not yet known.
const MEASURED_OVER: Duration = Duration::from_secs(1);

/// How often a waiting body gives back the part of its reservation its rate no longer
/// earns.
pub(crate) const REVIEW: Duration = Duration::from_secs(1);

/// The clock bodies are timed by: tokio's where there is one (so a paused test clock
/// holds for bodies too), else the system's.
pub(crate) fn now() -> Instant {
    #[cfg(feature = "tokio")]
    return tokio::time::Instant::now().into_std();
    #[cfg(not(feature = "tokio"))]
    return Instant::now();
}

/// What a body that has sent `received` bytes over `waited` may hold ahead of them: the
/// grace period at its own rate, or at the minimum rate if that is higher.
pub(crate) fn ahead(rate: &MinDataRate, received: u64, waited: Duration) -> u64 {
    let over = waited.max(MEASURED_OVER).as_secs_f64();
    let own = (received as f64 / over) as u64;
    bytes_in(own.max(rate.bytes_per_second()), rate.grace())
}

pin_project! {
    /// One body's timing: its rate, its declared length, what it has sent, its patience,
    /// how long its reader has waited on it in all, and the alarm for a wait that runs out.
    pub(crate) struct Pace {
        pub(crate) rate: MinDataRate,
        pub(crate) declared: Option<u64>,
        pub(crate) received: u64,
        patience: Patience,
        // The waits that ended, in all (the one in progress is the patience's).
        waited: Duration,
        alarm: Alarm,
    }
}

impl Pace {
    pub(crate) fn new(rate: MinDataRate, declared: Option<u64>) -> Self {
        Self {
            rate,
            declared,
            received: 0,
            patience: Patience::new(rate, Patience::BANKED),
            waited: Duration::ZERO,
            alarm: Alarm::new(),
        }
    }

    /// The wait so far, counting the one in progress up to `now`.
    pub(crate) fn waited(&self, now: Instant) -> Duration {
        self.waited + self.patience.waited(now)
    }

    /// Whether the wait in progress has outlasted the body's patience.
    pub(crate) fn too_slow(&self, now: Instant) -> bool {
        self.patience.run_out(now)
    }

    /// What the body may hold of the byte budget now: what it has sent, plus what its
    /// rate earns ahead, up to its declared length (without one, only what it has sent).
    pub(crate) fn reservation(&self, now: Instant) -> u64 {
        match self.declared {
            Some(declared) => {
                let ahead = ahead(&self.rate, self.received, self.waited(now));
                declared
                    .min(self.received.saturating_add(ahead))
                    .max(self.received)
            }
            None => self.received,
        }
    }

    /// A poll found nothing: the wait starts now, unless one is in progress.
    pub(crate) fn waiting(self: Pin<&mut Self>, now: Instant) {
        self.project().patience.wait(now);
    }

    /// A frame came: the wait in progress ends, and `data` bytes are counted.
    pub(crate) fn arrived(self: Pin<&mut Self>, now: Instant, data: u64) {
        let this = self.project();
        *this.waited += this.patience.waited(now);
        this.patience.moved(now, data);
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
        let left = self.patience.remaining(now);
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
    fn a_body_may_wait_out_the_grace_period_and_what_it_sends_earns_more() {
        let start = Instant::now();
        let mut pace = Box::pin(Pace::new(RATE, None));
        pace.as_mut().waiting(start);
        assert!(!pace.too_slow(start + Duration::from_secs(5)));
        assert!(pace.too_slow(start + Duration::from_millis(5_001)));
        // 4 s waited, then 2,400 bytes: 10 s earned, 11 s left.
        pace.as_mut().arrived(start + Duration::from_secs(4), 2_400);
        let next = start + Duration::from_secs(4);
        pace.as_mut().waiting(next);
        assert!(!pace.too_slow(next + Duration::from_secs(11)));
        assert!(pace.too_slow(next + Duration::from_millis(11_001)));
        // A burst banks at most 64 KiB's worth beyond the grace period: 278.07 s.
        pace.as_mut().arrived(next, 10 << 20);
        pace.as_mut().waiting(next);
        assert!(!pace.too_slow(next + Duration::from_secs(278)));
        assert!(pace.too_slow(next + Duration::from_secs(279)));
    }

    #[test]
    fn what_a_body_holds_ahead_is_the_grace_period_at_its_rate_or_the_minimum() {
        // Nothing sent: the minimum rate's grace bytes.
        assert_eq!(ahead(&RATE, 0, Duration::ZERO), 1_200);
        // 2 KiB/s over 10 s: 10 KiB ahead.
        assert_eq!(ahead(&RATE, 20_480, Duration::from_secs(10)), 10_240);
        // Slower than the minimum: the minimum.
        assert_eq!(ahead(&RATE, 100, Duration::from_secs(10)), 1_200);
        // A first frame that came with the head is measured over a second, not over 0.
        assert_eq!(ahead(&RATE, 1, Duration::ZERO), 1_200);
        assert_eq!(ahead(&RATE, 16_384, Duration::ZERO), 81_920);
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
        // 1 s of the grace left, and 10 bytes' 41.7 ms earned.
        assert!(!pace.too_slow(later + Duration::from_millis(1_041)));
        assert!(pace.too_slow(later + Duration::from_millis(1_042)));
    }
}
