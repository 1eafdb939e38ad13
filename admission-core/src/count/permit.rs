//! `CountPermit`: one permit, released when dropped.

use std::fmt;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use super::{CountInner, OWNER, Outcome, QUEUE, WATCH, raw};

/// One unit of a [`CountLedger`](crate::CountLedger)'s capacity, released when dropped.
///
/// The permit is one pointer wide, `'static`, and may be sent to and dropped on any
/// thread, also after every handle of its ledger is gone.
///
/// ```
/// use admission_core::CountLedger;
///
/// let ledger = CountLedger::new(1)?;
/// let permit = ledger.try_acquire()?;
/// std::thread::spawn(move || drop(permit)).join().unwrap();
/// assert_eq!(ledger.in_flight(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "the permit is released as soon as it is dropped"]
pub struct CountPermit {
    pub(super) inner: NonNull<CountInner>,
}

impl CountPermit {
    /// Records how the work under this permit went, for the ledger's
    /// [`AdaptiveLimit`](crate::AdaptiveLimit) (nothing happens if the ledger has none):
    /// its latency, from admission to whatever point the caller chose, and its outcome.
    /// Call it once, before or as the permit is dropped. Reads the clock once.
    ///
    /// The same as the limit's own [`record`](crate::AdaptiveLimit::record), without a
    /// handle to it: a permit reaches its ledger with no reference-count traffic.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use admission_core::adaptive::{AdaptiveLimit, Gradient, Outcome};
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(0)?;
    /// let _limit = AdaptiveLimit::builder(Gradient::default()).build(&ledger)?;
    /// let permit = ledger.try_acquire()?;
    /// let admitted = Instant::now();
    /// // ... the work ...
    /// permit.record(admitted.elapsed(), Outcome::Success);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn record(&self, latency: Duration, outcome: Outcome) {
        self.record_at(Instant::now(), latency, outcome);
    }

    /// [`record`](Self::record) at `now` on the limit's clock (see
    /// [`AdaptiveBuilder::epoch`](crate::adaptive::AdaptiveBuilder::epoch)).
    #[inline]
    pub fn record_at(&self, now: Instant, latency: Duration, outcome: Outcome) {
        // SAFETY: this permit holds a share of the ledger's count, so the allocation is
        // alive as long as `self` is; only shared access through atomics and mutexes.
        let inner = unsafe { self.inner.as_ref() };
        inner.record_at(now, latency, outcome);
    }

    /// Gives the permit's unit back to its ledger. Called only from `Drop`, so it runs
    /// exactly once.
    #[inline]
    fn release(&mut self) {
        // SAFETY: this permit added 1 to the word when it was made and gives it up here,
        // once (only `Drop` calls this), unless acquisitions wait: then the share is
        // still ours, and `hand_off` passes it on or gives it up.
        match unsafe { raw::put_unless(self.inner, 1, QUEUE) } {
            Ok(prev) => {
                if prev & !OWNER == WATCH | 1 {
                    // This release took the count to zero while a drain waited.
                    // SAFETY: as `last_out` requires: `WATCH` was set when this release
                    // took the count from one to zero, so that share is now this thread's.
                    unsafe { CountInner::last_out(self.inner) }
                }
            }
            // SAFETY: the share is ours, given up there once; not used after.
            Err(_) => unsafe { CountInner::hand_off(self.inner) },
        }
    }
}

impl Drop for CountPermit {
    #[inline]
    fn drop(&mut self) {
        self.release();
    }
}

impl fmt::Debug for CountPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountPermit").finish_non_exhaustive()
    }
}

// SAFETY: the permit refers to a `CountInner`, whose shared state is atomics and a
// mutex (`Send + Sync`), and its only operation, the release in `Drop`, is an atomic
// decrement (and, for the last release under a drain, the mutex) that is correct on any
// thread.
unsafe impl Send for CountPermit {}

// SAFETY: `&CountPermit` offers only `record`, which touches the ledger's shared state
// through atomics and mutexes (`Sync`), correct from any thread.
unsafe impl Sync for CountPermit {}

// What the two impls above rest on, checked by the compiler: the ledger's state is
// `Send + Sync` of its own accord. (Not under loom, whose use-tracker is neither.)
#[cfg(not(admission_loom))]
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<CountInner>();
};
