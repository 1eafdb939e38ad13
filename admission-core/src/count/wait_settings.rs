//! The wait's settings and its reading: how many may wait, the standing-queue rule and
//! its clock, and how many wait now.

use std::time::{Duration, Instant};

use super::CountLedger;
use crate::sync::Ordering;

impl CountLedger {
    /// Lets at most `max` acquisitions wait for a slot at once ([`acquire`](Self::acquire));
    /// 0 (the default) lets none wait. Lowering it refuses no one already waiting.
    pub fn set_max_waiting(&self, max: usize) {
        // Relaxed: a setting, for the acquisitions after this one.
        self.inner()
            .cold
            .max_waiting
            .store(max as u64, Ordering::Relaxed);
    }

    /// How many acquisitions may wait at once (see [`set_max_waiting`](Self::set_max_waiting)).
    pub fn max_waiting(&self) -> usize {
        // Relaxed: a setting.
        self.inner().cold.max_waiting.load(Ordering::Relaxed) as usize
    }

    /// Sets the standing-queue rule (by default 100 ms and 5 ms, the interval and target
    /// of Meta's adaptive LIFO with CoDel). Once the queue has been waited in for
    /// `interval` without a break, it stands: each class is served newest first, and a
    /// waiter that has waited `target` is refused ([`Refused::Count`](crate::Refused::Count)) as soon as a newer
    /// acquisition of its class or a more important one comes to wait, since that one
    /// would be served first. A break is the queue staying empty for `interval`; until
    /// then a queue that stood still stands.
    ///
    /// So under sustained overload, where new requests keep coming, no one waits much
    /// longer than `target`, admitted or refused; after a burst, when no newer request
    /// comes, the waiters keep their places until the caller's own timeout, and the slots
    /// that free meanwhile go to them.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(8)?;
    /// ledger.set_standing_queue(Duration::from_millis(50), Duration::from_millis(2));
    /// assert_eq!(ledger.standing_queue(), (Duration::from_millis(50), Duration::from_millis(2)));
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn set_standing_queue(&self, interval: Duration, target: Duration) {
        let mut control = self.inner().cold.control.lock();
        control.interval = interval;
        control.target = target;
    }

    /// The standing-queue rule's interval and target (see
    /// [`set_standing_queue`](Self::set_standing_queue)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_core::CountLedger;
    ///
    /// let defaults = CountLedger::new(8)?.standing_queue();
    /// assert_eq!(defaults, (Duration::from_millis(100), Duration::from_millis(5)));
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn standing_queue(&self) -> (Duration, Duration) {
        let control = self.inner().cold.control.lock();
        (control.interval, control.target)
    }

    /// Sets the clock the standing-queue rule reads (by default `Instant::now`): for a
    /// simulation on virtual time, or a test that should not sleep. Nothing else of the
    /// wait reads a clock.
    pub fn set_wait_clock(&self, clock: fn() -> Instant) {
        self.inner().cold.control.lock().clock = clock;
    }

    /// How many acquisitions wait for a slot now.
    pub fn waiting(&self) -> usize {
        self.inner().cold.control.lock().waiting()
    }
}
