//! The wait's order: which waiter is served next (classes first, then the flows' turns,
//! then within a flow), and the turns between flows (see
//! [`Acquire::in_flow`](super::Acquire::in_flow)): each flow's place is its round, then the
//! order it came to the round; the flow with the lowest is served next, and goes to the
//! next round once served.

use std::collections::VecDeque;
use std::time::Instant;

use super::Waiters;
use super::wait::{Acquire, State, Waiter};

impl Waiters {
    /// The waiter to serve next: the most important class first; within it, the flow
    /// whose turn it is (the lowest place; of equals, the first to come); within the flow
    /// the oldest, or, while the flow stands, the newest.
    pub(super) fn next(&mut self, now: Instant) -> Option<usize> {
        // `min_by_key` keeps the first of equals: the oldest.
        let (oldest, place) = waiting(&self.queue)
            .map(|(at, waiter)| (at, (waiter.rank(), waiter.turn, waiter.flow)))
            .min_by_key(|&(_, (rank, turn, _))| (rank, turn))?;
        if !self.stands(place.2, now) {
            return Some(oldest);
        }
        waiting(&self.queue)
            .rfind(|(_, waiter)| (waiter.rank(), waiter.turn, waiter.flow) == place)
            .map(|(newest, _)| newest)
    }

    /// The place a new waiter of `flow` takes: its flow's, if the flow has waiters; else
    /// the last place of the round being served, so that a flow that comes to wait goes
    /// after the flows still owed a turn in this round and before those that have had
    /// theirs.
    pub(super) fn turn_of(&mut self, flow: Option<u64>) -> (u64, u64) {
        let waiting = self
            .queue
            .iter()
            .find(|waiter| waiter.state == State::Waiting && waiter.flow == flow);
        match waiting {
            Some(waiter) => waiter.turn,
            None => (self.turn.0, self.next_place()),
        }
    }

    /// Whether `flow` stands at `now`: the queue stands, and the flow has at least its
    /// share of the waiters (as many as the mean of the flows waiting). A flow of few
    /// waiters, served in turn as they come, does not: its waiters are served oldest
    /// first and not refused for a newer one of theirs. Acquisitions that name no flow
    /// stand with the queue.
    pub(super) fn stands(&mut self, flow: Option<u64>, now: Instant) -> bool {
        if !self.standing(now) {
            return false;
        }
        if flow.is_none() {
            return true;
        }
        let total = self.tally();
        self.waiting_in(flow) * self.flows.len() >= total
    }

    /// Counts each flow's waiters into `flows`, with the place of its oldest: one pass
    /// over the queue. The waiters counted.
    fn tally(&mut self) -> usize {
        self.flows.clear();
        let mut total = 0;
        for (at, waiter) in self.queue.iter().enumerate() {
            if waiter.state == State::Waiting {
                self.flows.entry(waiter.flow).or_insert((0, at)).0 += 1;
                total += 1;
            }
        }
        total
    }

    /// The waiters of `flow`, as last counted.
    fn waiting_in(&self, flow: Option<u64>) -> usize {
        self.flows.get(&flow).map_or(0, |&(waiters, _)| waiters)
    }

    fn next_place(&mut self) -> u64 {
        self.turn.1 += 1;
        self.turn.1
    }

    /// The waiter at `at` is served: the round served is its flow's, and its flow goes
    /// to the next round, after the flows served before it in this one.
    pub(super) fn served(&mut self, at: usize) {
        let (flow, (round, _)) = (self.queue[at].flow, self.queue[at].turn);
        self.turn.0 = self.turn.0.max(round);
        let next = (round + 1, self.next_place());
        for waiter in self.queue.iter_mut().filter(|waiter| waiter.flow == flow) {
            waiter.turn = next;
        }
    }

    /// Where a newcomer of `flow` takes the place of another flow's waiter in a full
    /// queue: the oldest waiter of the flow with the most waiters, if that flow has more
    /// than the newcomer's will (its own plus the newcomer). No flow has more than its
    /// share of a full queue for long: each newcomer of a flow with fewer takes one.
    pub(super) fn crowded(&mut self, flow: Option<u64>) -> Option<usize> {
        self.tally();
        let mine = self.waiting_in(flow) + 1;
        let (most, oldest) = (self.flows.iter())
            .filter(|(of, _)| **of != flow)
            .map(|(_, &count)| count)
            // The most waiters; of equals, the flow whose oldest came first.
            .max_by(|(n, at), (m, bt)| n.cmp(m).then(bt.cmp(at)))?;
        (most > mine).then_some(oldest)
    }
}

impl Acquire {
    /// Waits in `flow` (a client, a tenant: any number that tells them apart): waiting
    /// flows take turns at the slots that free, one slot each in turn, so that a flow
    /// with many waiters does not take the slots of one with few; and in a full queue a
    /// newcomer of a flow with fewer waiters takes the place of the oldest waiter of the
    /// flow with the most (refused, [`Refused::Count`](crate::Refused::Count)). Within a flow, waiters are
    /// served as the queue serves them (oldest first, newest while it stands), and a
    /// standing queue refuses only a flow's own old waiters as its newcomers come.
    /// Acquisitions that name no flow are one flow together.
    ///
    /// It costs a scan of the queue as the waiter queues and as each slot is granted,
    /// under the ledger's lock (as the queue's order does already): keep
    /// [`max_waiting`](crate::CountLedger::set_max_waiting) to hundreds, not millions.
    ///
    /// ```
    /// use admission_core::CountLedger;
    /// # let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    /// use std::future::Future;
    /// use std::pin::pin;
    ///
    /// let ledger = CountLedger::new(1)?;
    /// ledger.set_max_waiting(8);
    /// let held = ledger.try_acquire()?;
    /// let mut heavy = [pin!(ledger.acquire().in_flow(1)), pin!(ledger.acquire().in_flow(1))];
    /// assert!(heavy[0].as_mut().poll(&mut cx).is_pending() && heavy[1].as_mut().poll(&mut cx).is_pending());
    /// let mut light = pin!(ledger.acquire().in_flow(2));
    /// assert!(light.as_mut().poll(&mut cx).is_pending());
    ///
    /// drop(held); // the slot goes to flow 1, whose turn came first
    /// let first = heavy[0].as_mut().poll(&mut cx);
    /// assert!(first.is_ready());
    /// drop(first); // the next turn is flow 2's, though flow 1 waited before it
    /// let second = light.as_mut().poll(&mut cx);
    /// assert!(second.is_ready());
    /// assert!(heavy[1].as_mut().poll(&mut cx).is_pending());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_flow(mut self, flow: u64) -> Self {
        self.flow = Some(flow);
        self
    }
}

/// The waiters still waiting, with their places in `queue`.
fn waiting(queue: &VecDeque<Waiter>) -> impl DoubleEndedIterator<Item = (usize, &Waiter)> {
    (queue.iter().enumerate()).filter(|(_, waiter)| waiter.state == State::Waiting)
}
