//! `Alarm`: one timer, moved to each new deadline, for everything here and in
//! `admission-tower` that waits on a deadline that moves (a body's pace, a connection's
//! head, idle and send-rate bounds).

use std::task::{Context, Poll};
use std::time::Instant;

/// A timer on tokio's clock, made on its first deadline (a box, so that what holds it
/// stays `Unpin`) and moved, not remade, to the next. Outside a tokio runtime (or
/// without the `tokio` feature) it never fires.
///
/// Shared with `admission-tower`; not part of the API this crate promises.
#[cfg(feature = "tokio")]
#[doc(hidden)]
#[derive(Debug)]
pub struct Alarm {
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

#[cfg(feature = "tokio")]
impl Alarm {
    /// An alarm with no deadline yet.
    pub fn new() -> Self {
        Self { sleep: None }
    }

    /// Wakes the task at `at`; `Ready` once `at` has passed.
    pub fn poll_at(&mut self, cx: &mut Context<'_>, at: Instant) -> Poll<()> {
        let at = tokio::time::Instant::from_std(at);
        match &mut self.sleep {
            Some(sleep) if sleep.deadline() == at => {}
            Some(sleep) => sleep.as_mut().reset(at),
            // Outside a tokio runtime there is no timer to ask: no alarm.
            None if tokio::runtime::Handle::try_current().is_err() => return Poll::Pending,
            None => self.sleep = Some(Box::pin(tokio::time::sleep_until(at))),
        }
        match &mut self.sleep {
            Some(sleep) => std::future::Future::poll(sleep.as_mut(), cx),
            None => Poll::Pending,
        }
    }
}

/// Without the `tokio` feature there is no timer: an alarm never fires.
#[cfg(not(feature = "tokio"))]
#[doc(hidden)]
#[derive(Debug)]
pub struct Alarm;

#[cfg(not(feature = "tokio"))]
impl Alarm {
    /// An alarm that never fires.
    pub fn new() -> Self {
        Self
    }

    /// Never `Ready`.
    pub fn poll_at(&mut self, _: &mut Context<'_>, _: Instant) -> Poll<()> {
        Poll::Pending
    }
}

impl Default for Alarm {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, feature = "tokio"))]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Whether `alarm`, set to `at`, is due now.
    fn due(alarm: &mut Alarm, at: Instant) -> bool {
        let waker = std::task::Waker::noop();
        alarm
            .poll_at(&mut Context::from_waker(waker), at)
            .is_ready()
    }

    /// Moving the deadline moves the wake: later holds it off, earlier brings it on.
    #[tokio::test(start_paused = true)]
    async fn an_alarm_fires_at_its_latest_deadline_not_an_earlier_one() {
        let mut alarm = Alarm::new();
        let start = tokio::time::Instant::now().into_std();
        assert!(!due(&mut alarm, start + Duration::from_secs(1)));
        tokio::time::advance(Duration::from_millis(500)).await;
        // Moved later: not due at 1.1 s.
        assert!(!due(&mut alarm, start + Duration::from_secs(2)));
        tokio::time::advance(Duration::from_millis(600)).await;
        assert!(!due(&mut alarm, start + Duration::from_secs(2)));
        // Moved back to 1 s, now past: due at once.
        assert!(due(&mut alarm, start + Duration::from_secs(1)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(due(&mut alarm, start + Duration::from_secs(2)));
    }

    #[test]
    fn outside_a_runtime_an_alarm_never_fires() {
        let mut alarm = Alarm::new();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let past = Instant::now();
        assert!(alarm.poll_at(&mut cx, past).is_pending());
    }
}
