//! `Drain`: the wait for a closed count ledger to have nothing in flight.

use std::fmt;
use std::pin::Pin;
#[cfg(not(admission_loom))]
use std::task::Waker;
use std::task::{Context, Poll};

use super::{CountLedger, HELD, WATCH, Waiters};
use crate::sync::Ordering;

/// The wait for a closed [`CountLedger`] to have nothing in flight; made by
/// [`CountLedger::drain`] (or [`Gate::drain`](crate::Gate::drain)).
///
/// As a future it needs no particular runtime: it completes once no permit is in flight,
/// or once the ledger is reopened (check [`CountLedger::is_closed`] if that matters).
/// Dropping it stops waiting; the ledger stays closed. Off async code, use
/// [`wait`](Self::wait) or [`wait_timeout`](Self::wait_timeout), which park the thread.
#[must_use = "a drain does nothing unless awaited or waited on"]
pub struct Drain {
    pub(super) ledger: CountLedger,
    /// The id this drain's waker is registered under, once it has waited.
    pub(super) id: Option<u64>,
}

impl Drain {
    /// The ledger being drained.
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(2)?;
    /// assert!(ledger.drain().ledger().is_closed());
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn ledger(&self) -> &CountLedger {
        &self.ledger
    }
}

/// Takes a drain's waker (registered under `id`, if it has waited) out of `waiters`.
fn forget(id: &mut Option<u64>, waiters: &mut Waiters) {
    if let Some(id) = id.take() {
        waiters.list.retain(|(other, _)| *other != id);
    }
}

impl Future for Drain {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let inner = this.ledger.inner();
        let mut control = inner.cold.control.lock();
        if !inner.cold.closed.load(Ordering::Relaxed) {
            // Reopened: not draining any more.
            forget(&mut this.id, &mut control);
            return Poll::Ready(());
        }
        let state = &inner.hot.state;
        // Acquire: reading zero synchronises with every release decrement before it.
        let mut current = state.load(Ordering::Acquire);
        loop {
            if current & HELD == 0 {
                // Done. A `WATCH` still set is the last release's to give back.
                forget(&mut this.id, &mut control);
                return Poll::Ready(());
            }
            if current & WATCH != 0 {
                break;
            }
            // Relaxed on success: the lock orders the waiters; see `unwatch`.
            match state.compare_exchange_weak(
                current,
                current | WATCH,
                Ordering::Relaxed,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        let id = match this.id {
            Some(id) => id,
            None => {
                let id = control.next_id;
                control.next_id += 1;
                this.id = Some(id);
                id
            }
        };
        match control.list.iter_mut().find(|(other, _)| *other == id) {
            Some((_, waker)) => waker.clone_from(cx.waker()),
            None => control.list.push((id, cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        if self.id.is_none() {
            return;
        }
        let inner = self.ledger.inner();
        let mut control = inner.cold.control.lock();
        forget(&mut self.id, &mut control);
        if control.list.is_empty() {
            inner.unwatch();
        }
    }
}

#[cfg(not(admission_loom))]
impl Drain {
    /// Blocks the thread until no permit is in flight (or the ledger is reopened).
    ///
    /// ```
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(0)?;
    /// ledger.drain().wait(); // nothing in flight: at once
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn wait(mut self) {
        let waker = Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        while Pin::new(&mut self).poll(&mut cx).is_pending() {
            std::thread::park();
        }
    }

    /// Blocks the thread until no permit is in flight (or the ledger is reopened), for
    /// at most `timeout`; whether it got there.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_core::CountLedger;
    ///
    /// let ledger = CountLedger::new(1)?;
    /// let stuck = ledger.try_acquire()?;
    /// assert!(!ledger.drain().wait_timeout(Duration::from_millis(10)));
    /// drop(stuck);
    /// assert!(ledger.drain().wait_timeout(Duration::from_millis(10)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_timeout(mut self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let waker = Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if Pin::new(&mut self).poll(&mut cx).is_ready() {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            std::thread::park_timeout(deadline - now);
        }
    }
}

/// Wakes a thread parked in [`Drain::wait`].
#[cfg(not(admission_loom))]
struct Unpark(std::thread::Thread);

#[cfg(not(admission_loom))]
impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

impl fmt::Debug for Drain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drain")
            .field("in_flight", &self.ledger.in_flight())
            .field("waiting", &self.id.is_some())
            .finish()
    }
}
