//! `Acquire`: a count acquisition that may wait for a slot, bounded in waiters.
//!
//! # Protocol
//!
//! The waiters are a queue under the ledger's control lock. While any waits, `QUEUE` is
//! set in the ledger's word; it is set and cleared only under that lock, by a thread
//! that holds a share of the word (a waiter's ledger handle, a releasing permit), so the
//! bit itself needs no share.
//!
//! - A release gives its unit back with a compare-exchange that fails if `QUEUE` is set
//!   (`raw::put_unless`): check and decrement are one step. Finding `QUEUE`, it hands its
//!   slot to the next waiter under the lock without giving it back (the waiter's permit
//!   is the releasing permit's share, passed on, so the slot is never free for a moment
//!   and nothing can take it first), or gives it back if no waiter may take it.
//! - A new waiter queues and sets `QUEUE` under the lock, then grants free slots to the
//!   queue in its order: a slot freed by a release that read the word before `QUEUE` was
//!   set is taken then (the release's exchange came first in the word's order, or it
//!   would have failed and seen `QUEUE`).
//! - A capacity that rises (an operator, an adaptive limit, a reopening) grants free
//!   slots under the lock too; a close refuses every waiter.
//! - A waiter dropped while queued leaves the queue under the lock; one dropped after its
//!   grant, before it was polled, releases the permit it was given, which goes on to the
//!   next waiter.
//! - While the queue stands (see [`CountLedger::set_standing_queue`]), a new waiter
//!   refuses, under the lock, the waiters it would be served before that have waited
//!   longer than the target: they hold no share, so refusing them moves no count.
//!
//! Plain acquisitions do not look at `QUEUE`: a waiter of a class waits because its
//! class's share is in flight, which refuses a new acquisition of that class just the
//! same, while a more important class with room in its share is admitted at once.

use std::fmt;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::{
    CountInner, CountLedger, CountPermit, OWNER, Priority, QUEUE, Refused, WATCH, Waiters, raw,
};
use crate::sync::Ordering;

/// How long the queue must have been waited in without a break before it counts as
/// standing, by default: then the newest waiter of a class is served first (see
/// [`CountLedger::acquire`]), and a waiter that has waited [`TARGET`] gives way to a newer
/// one. CoDel's interval, as Meta's adaptive LIFO sets it.
pub(super) const INTERVAL: Duration = Duration::from_millis(100);

/// How long a waiter may wait while the queue stands before a newer one takes its place,
/// by default (CoDel's target).
pub(super) const TARGET: Duration = Duration::from_millis(5);

/// One acquisition in the queue.
pub(super) struct Waiter {
    id: u64,
    priority: Option<Priority>,
    /// The flow it waits in (see [`Acquire::in_flow`]); `None`: the one flow of every
    /// acquisition that names none.
    pub(super) flow: Option<u64>,
    /// Its flow's place in the turns: the round, then the order in which flows came to it.
    /// The flow whose waiters hold the lowest is served next (the same place on every
    /// waiter of a flow, moved on together when one of them is served).
    pub(super) turn: (u64, u64),
    waker: Waker,
    pub(super) state: State,
    /// When it queued, on the ledger's clock.
    since: Instant,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum State {
    Waiting,
    /// A slot was taken for it: the word holds its permit's share.
    Granted,
    Refused(Refused),
}

impl Waiter {
    /// Its place among classes: 0 is the most important (no class: the whole capacity,
    /// as the most important class).
    pub(super) fn rank(&self) -> usize {
        self.priority.map_or(0, Priority::index)
    }
}

impl Waiters {
    /// Whether the queue stands at `now`: it has been waited in for the interval without
    /// a break.
    pub(super) fn standing(&self, now: Instant) -> bool {
        self.busy_since
            .is_some_and(|since| now.saturating_duration_since(since) >= self.interval)
    }

    pub(super) fn waiting(&self) -> usize {
        self.queue
            .iter()
            .filter(|waiter| waiter.state == State::Waiting)
            .count()
    }

    fn find(&self, id: u64) -> Option<usize> {
        self.queue.iter().position(|waiter| waiter.id == id)
    }
}

impl CountInner {
    /// Takes one slot for `priority`'s class if its share has room, counting nothing: the
    /// level it brought the ledger to.
    fn take_slot(&self, priority: Option<Priority>) -> Option<u64> {
        let threshold = self.threshold(priority);
        let state = &self.hot.state;
        let mut current = state.load(Ordering::Relaxed);
        loop {
            // `WATCH` is in `held` (nothing is admitted while a drain waits); `QUEUE` not.
            let held = current & !(OWNER | QUEUE);
            if held >= threshold {
                return None;
            }
            // Relaxed: as `CountLedger::acquire`; made through a live share.
            match state.compare_exchange_weak(
                current,
                current + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(held + 1),
                Err(actual) => current = actual,
            }
        }
    }

    /// Marks the waiter at `at` granted and takes its waker; clears `QUEUE` once no one
    /// waits. Called with the control lock held, by a thread holding a share.
    fn granted(&self, control: &mut Waiters, at: usize, wake: &mut Vec<Waker>) {
        control.served(at);
        let waiter = &mut control.queue[at];
        waiter.state = State::Granted;
        wake.push(waiter.waker.clone());
        self.settle(control);
    }

    /// Clears `QUEUE` (and starts the break in the standing clock) if no one waits any
    /// more. Called with the control lock held, by a thread holding a share.
    fn settle(&self, control: &mut Waiters) {
        if control.waiting() == 0 {
            if control.emptied_at.is_none() {
                control.emptied_at = Some((control.clock)());
            }
            // Relaxed: the bit is ordered by the lock for the waiters; a release's
            // exchange reads the latest word whatever the ordering.
            self.hot.state.fetch_and(!QUEUE, Ordering::Relaxed);
        }
    }

    /// Gives free slots to the queue, in its order, while the next waiter's class has
    /// room. Called with the control lock held, by a thread holding a share.
    pub(super) fn grant(&self, control: &mut Waiters, wake: &mut Vec<Waker>) {
        let now = (control.clock)();
        while let Some(at) = control.next(now) {
            let Some(level) = self.take_slot(control.queue[at].priority) else {
                break;
            };
            self.cold.stats.observe(level);
            self.granted(control, at, wake);
        }
    }

    /// Refuses every waiter with `why` (the ledger closed). Called with the control lock
    /// held, by a thread holding a share.
    pub(super) fn refuse_waiters(
        &self,
        control: &mut Waiters,
        why: Refused,
        wake: &mut Vec<Waker>,
    ) {
        for waiter in control.queue.iter_mut() {
            if waiter.state == State::Waiting {
                waiter.state = State::Refused(why);
                wake.push(waiter.waker.clone());
            }
        }
        self.settle(control);
    }

    /// The release of a permit that found `QUEUE` set: its slot goes to the next waiter if
    /// that waiter's class has room with the slot free, else back to the ledger.
    ///
    /// # Safety
    ///
    /// `ptr` is a live `CountInner` in whose word the caller holds one permit's share,
    /// given up here (passed to a waiter, or put back), once; the caller does not use
    /// `ptr` afterwards.
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn hand_off(ptr: NonNull<CountInner>) {
        let mut wake = Vec::new();
        let passed = {
            // SAFETY: the caller's share keeps the cell alive until it is passed on or put
            // back below, after this borrow ends.
            let inner = unsafe { ptr.as_ref() };
            let mut control = inner.cold.control.lock();
            let now = (control.clock)();
            match control.next(now) {
                Some(at) => {
                    let threshold = inner.threshold(control.queue[at].priority);
                    // Relaxed: while `QUEUE` is set the count changes only under this
                    // lock, or falls (a slot put back), which only errs toward keeping.
                    let held = inner.held();
                    // With this slot free, `held - 1` would be in flight.
                    if held <= threshold && held & WATCH == 0 {
                        inner.granted(&mut control, at, &mut wake);
                        true
                    } else {
                        false
                    }
                }
                None => {
                    inner.settle(&mut control);
                    false
                }
            }
        };
        for waker in wake {
            waker.wake();
        }
        if !passed {
            // SAFETY: the caller's share, given up once; `ptr` is not used after, but for
            // the drain's rest as `last_out` requires.
            let prev = unsafe { raw::put(ptr, 1) };
            if prev & !(OWNER | QUEUE) == WATCH | 1 {
                // SAFETY: `WATCH` was set when this release took the count to zero.
                unsafe { CountInner::last_out(ptr) }
            }
        }
    }
}

/// A count acquisition that waits, if it must and may, for a slot; made by
/// [`CountLedger::acquire`] and [`CountLedger::acquire_as`].
///
/// A future of no particular runtime: it is woken by a release or by the capacity rising,
/// and has no timer of its own. Bound its wait with your runtime's timeout (dropping it
/// stops waiting and leaves nothing behind, whenever it is dropped).
#[must_use = "an acquisition does nothing unless awaited"]
pub struct Acquire {
    ledger: CountLedger,
    priority: Option<Priority>,
    pub(super) flow: Option<u64>,
    /// The id it waits under, once queued.
    id: Option<u64>,
}

impl Acquire {
    fn permit(&self) -> CountPermit {
        CountPermit {
            inner: self.ledger.owner.ptr(),
        }
    }
}

impl fmt::Debug for Acquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acquire")
            .field("priority", &self.priority)
            .field("flow", &self.flow)
            .field("waiting", &self.id.is_some())
            .finish()
    }
}

impl Future for Acquire {
    type Output = Result<CountPermit, Refused>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let inner = this.ledger.inner();
        if let Some(id) = this.id {
            let mut control = inner.cold.control.lock();
            let at = control
                .find(id)
                .expect("a queued acquisition stays queued until it ends");
            let outcome = match control.queue[at].state {
                State::Waiting => {
                    control.queue[at].waker.clone_from(cx.waker());
                    return Poll::Pending;
                }
                State::Granted => Ok(this.permit()),
                State::Refused(why) => Err(why),
            };
            control.queue.remove(at);
            this.id = None;
            return Poll::Ready(outcome);
        }
        // Not queued yet: at once if a slot is free.
        if let Some(level) = inner.take_slot(this.priority) {
            inner.cold.stats.observe(level);
            return Poll::Ready(Ok(this.permit()));
        }
        // Relaxed: a setting.
        let max_waiting = inner.cold.max_waiting.load(Ordering::Relaxed);
        if max_waiting == 0 {
            // No waiting: refused as `try_acquire` refuses, with no lock.
            return Poll::Ready(Err(inner.refuse(this.priority, false)));
        }
        let mut wake = Vec::new();
        let outcome = {
            let mut control = inner.cold.control.lock();
            // Relaxed: read under the lock a close writes under.
            if inner.cold.closed.load(Ordering::Relaxed) {
                drop(control);
                return Poll::Ready(Err(inner.refuse(this.priority, false)));
            }
            if control.waiting() as u64 >= max_waiting {
                // Full: a flow with fewer waiters takes the place of one with the most.
                let Some(at) = this.flow.and_then(|_| control.crowded(this.flow)) else {
                    drop(control);
                    return Poll::Ready(Err(inner.refuse(this.priority, false)));
                };
                let old = &mut control.queue[at];
                old.state = State::Refused(Refused::Count);
                wake.push(old.waker.clone());
            }
            let id = control.next_id;
            control.next_id += 1;
            let now = (control.clock)();
            // An empty queue begins to be waited in, unless it emptied for less than the
            // interval: a queue that stood still stands.
            if let Some(emptied) = control.emptied_at.take() {
                if now.saturating_duration_since(emptied) >= control.interval {
                    control.busy_since = None;
                }
            }
            control.busy_since.get_or_insert(now);
            let (flow, rank) = (this.flow, this.priority.map_or(0, Priority::index));
            let turn = control.turn_of(flow);
            control.queue.push_back(Waiter {
                id,
                priority: this.priority,
                flow,
                turn,
                waker: cx.waker().clone(),
                state: State::Waiting,
                since: now,
            });
            if control.stands(flow, now) {
                // A standing queue: the waiters this one will be served before (of its
                // flow, its class and less important ones) that have waited the target are
                // refused; a newer request takes their place.
                let target = control.target;
                for old in control.queue.iter_mut() {
                    if old.state == State::Waiting
                        && old.id != id
                        && old.flow == flow
                        && old.rank() >= rank
                        && now.saturating_duration_since(old.since) >= target
                    {
                        old.state = State::Refused(Refused::Count);
                        wake.push(old.waker.clone());
                    }
                }
            }
            // Relaxed: see `settle`.
            inner.hot.state.fetch_or(QUEUE, Ordering::Relaxed);
            // A slot freed before `QUEUE` was set is taken now.
            inner.grant(&mut control, &mut wake);
            let at = control.find(id).expect("just queued");
            if control.queue[at].state == State::Granted {
                control.queue.remove(at);
                Poll::Ready(Ok(this.permit()))
            } else {
                this.id = Some(id);
                Poll::Pending
            }
        };
        // Wakers of others granted with this one (or instead of it): woken unlocked. Its
        // own, if among them, is a spurious wake.
        for waker in wake {
            waker.wake();
        }
        outcome
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        let inner = self.ledger.inner();
        let granted = {
            let mut control = inner.cold.control.lock();
            let Some(at) = control.find(id) else {
                return;
            };
            let waiter = control.queue.remove(at).expect("found");
            inner.settle(&mut control);
            waiter.state == State::Granted
        };
        if granted {
            // Given a slot it never took: released as any permit, so it goes on to the
            // next waiter (outside the lock).
            drop(self.permit());
        }
    }
}

impl CountLedger {
    /// Takes one permit, waiting for one if the ledger is full and fewer than
    /// [`max_waiting`](Self::set_max_waiting) acquisitions already wait; refuses at once
    /// otherwise (as [`try_acquire`](Self::try_acquire) does, and always with the default
    /// of 0 waiters).
    ///
    /// Waiters are served as slots free (a release, or the capacity rising): the most
    /// important class first (see [`acquire_as`](Self::acquire_as)), and within a class
    /// the oldest while the queue drains, the newest once it has been waited in for
    /// 100 ms without a break (a standing queue: under sustained overload the newest have
    /// the best chance of being answered in time), when a waiter that has waited 5 ms is
    /// refused as a newer one comes (see [`set_standing_queue`](Self::set_standing_queue)).
    /// The future has no timer: bound the wait with your runtime's timeout, and drop it to
    /// stop waiting, at any point, leaving nothing behind.
    ///
    /// What a waiter holds: an entry in the ledger's queue (an id, its class and a
    /// waker), and nothing of the count until it is admitted.
    ///
    /// ```
    /// use admission_core::{CountLedger, Refused};
    /// # let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::task::Poll;
    ///
    /// let ledger = CountLedger::new(1)?;
    /// ledger.set_max_waiting(1);
    /// let held = ledger.try_acquire()?;
    ///
    /// let mut first = pin!(ledger.acquire());
    /// assert!(first.as_mut().poll(&mut cx).is_pending(), "waits for the slot");
    /// let mut second = pin!(ledger.acquire());
    /// assert!(matches!(second.as_mut().poll(&mut cx), Poll::Ready(Err(Refused::Count))), "one may wait");
    ///
    /// drop(held);
    /// assert!(matches!(first.as_mut().poll(&mut cx), Poll::Ready(Ok(_))), "handed the slot");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire(&self) -> Acquire {
        Acquire {
            ledger: self.clone(),
            priority: None,
            flow: None,
            id: None,
        }
    }

    /// [`acquire`](Self::acquire) for `priority`'s class: admitted while fewer than its
    /// share of the capacity are in flight (see [`try_acquire_as`](Self::try_acquire_as)),
    /// and served before the waiters of less important classes.
    pub fn acquire_as(&self, priority: Priority) -> Acquire {
        Acquire {
            ledger: self.clone(),
            priority: Some(priority),
            flow: None,
            id: None,
        }
    }
}
