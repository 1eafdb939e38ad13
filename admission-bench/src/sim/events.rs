//! The simulation's events, taken in time order.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// What happens at a moment of a run; at equal times, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Event {
    /// A worker finishes a request (a slot and its generation).
    Done(usize, u64),
    /// A request's client gives up.
    Deadline(usize, u64),
    /// A waiting request's wait may have run out.
    WaitEnd,
    Arrival,
    /// A burst of arrivals.
    Burst,
}

/// The run's events in time order: a heap, and beside it the clients' deadlines in a
/// queue kept sorted. A deadline is its request's arrival plus the scenario's deadline, so
/// each comes at or near the back; most are for requests long answered, and in the heap
/// they would make it many times larger (every admission of the last 100 S) and its
/// operations most of a run's cost. Taken in the order of `(time, event)`, as one heap
/// would give them.
///
/// Each is kept as one `u128` whose order is that of `(time, event)`: the time, then the
/// event's variant, its slot and its generation, each in bits of its own (a run's
/// slots below 2^29 and generations below 2^32: checked as they are pushed). Half the
/// size of the tuple, compared in one instruction: the heap's work is most of a run's.
#[derive(Default)]
pub(super) struct Events {
    heap: BinaryHeap<Reverse<u128>>,
    deadlines: VecDeque<u128>,
}

const SLOT_BITS: u32 = 29;
const GENERATION_BITS: u32 = 32;

fn pack(time: u64, event: Event) -> u128 {
    let (variant, slot, generation) = match event {
        Event::Done(slot, generation) => (0, slot, generation),
        Event::Deadline(slot, generation) => (1, slot, generation),
        Event::WaitEnd => (2, 0, 0),
        Event::Arrival => (3, 0, 0),
        Event::Burst => (4, 0, 0),
    };
    assert!(
        (slot as u64) < 1 << SLOT_BITS && generation < 1 << GENERATION_BITS,
        "a run's slots and generations fit their bits"
    );
    (u128::from(time) << 64)
        | (variant << (SLOT_BITS + GENERATION_BITS))
        | ((slot as u128) << GENERATION_BITS)
        | u128::from(generation)
}

fn unpack(packed: u128) -> (u64, Event) {
    let time = (packed >> 64) as u64;
    let low = packed as u64;
    let slot = ((low >> GENERATION_BITS) & ((1 << SLOT_BITS) - 1)) as usize;
    let generation = low & ((1 << GENERATION_BITS) - 1);
    let event = match low >> (SLOT_BITS + GENERATION_BITS) {
        0 => Event::Done(slot, generation),
        1 => Event::Deadline(slot, generation),
        2 => Event::WaitEnd,
        3 => Event::Arrival,
        _ => Event::Burst,
    };
    (time, event)
}

impl Events {
    pub(super) fn push(&mut self, time: u64, event: Event) {
        let item = pack(time, event);
        if let Event::Deadline(..) = event {
            let at = self.deadlines.iter().rposition(|d| *d <= item);
            self.deadlines.insert(at.map_or(0, |at| at + 1), item);
        } else {
            self.heap.push(Reverse(item));
        }
    }

    pub(super) fn pop(&mut self) -> Option<(u64, Event)> {
        let next = match (self.heap.peek(), self.deadlines.front()) {
            (Some(Reverse(next)), Some(deadline)) if next < deadline => {
                self.heap.pop().map(|Reverse(next)| next)
            }
            (_, Some(_)) => self.deadlines.pop_front(),
            (_, None) => self.heap.pop().map(|Reverse(next)| next),
        };
        next.map(unpack)
    }
}

#[cfg(test)]
mod tests {
    use rand_core::{RngCore, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    use super::*;

    /// The events come out in the order one heap of them all would give, deadlines pushed
    /// out of order (a waiter admitted late), at equal times and between pops included.
    #[test]
    fn events_come_in_the_order_of_one_heap() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
        let mut events = Events::default();
        let mut reference = BinaryHeap::new();
        let (mut popped, mut deadlines_popped) = (0, 0);
        for generation in 0..20_000u64 {
            if rng.next_u64() % 3 == 0 {
                let next = events.pop();
                assert_eq!(next, reference.pop().map(|Reverse(e)| e));
                popped += 1;
                deadlines_popped += usize::from(matches!(next, Some((_, Event::Deadline(..)))));
                continue;
            }
            // Times from a few values, so that many are equal.
            let time = generation / 4 + rng.next_u64() % 8;
            let id = (rng.next_u64() % 16) as usize;
            let event = match rng.next_u64() % 4 {
                0 | 1 => Event::Deadline(id, generation),
                2 => Event::Done(id, generation),
                _ => Event::WaitEnd,
            };
            events.push(time, event);
            reference.push(Reverse((time, event)));
        }
        while let Some(Reverse(expected)) = reference.pop() {
            assert_eq!(events.pop(), Some(expected));
            popped += 1;
        }
        assert_eq!(events.pop(), None);
        assert!(
            popped > 10_000 && deadlines_popped > 1_000,
            "{popped}, {deadlines_popped}"
        );
    }
}
