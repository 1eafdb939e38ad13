//! The ledger's shared state: the word, the key's place, and `max_keys` settling.

use crossbeam_utils::CachePadded;

use super::entry::{Entry, Shard, home};
use super::{BOUNDED, COUNTED, HELD, KEYS, KeyedInner, SHARDS, SLOTS};
use crate::raw::Counted;
use crate::sync::{AtomicU64, Ordering, Track};

impl<K, S> Counted for KeyedInner<K, S> {
    fn word(&self) -> &AtomicU64 {
        &self.state
    }

    fn track(&self) -> &Track {
        &self.track
    }

    /// A releaser gives up its entry's share under its shard lock, or while its slot is
    /// `BUSY` (see the module docs): taking each lock once, and seeing each slot not busy,
    /// waits out any such step still running. Acquire: the releaser's store that ends
    /// `BUSY` is its last use of the ledger, and happens before the free.
    fn quiesce(&self) {
        for shard in self.shards.iter() {
            drop(shard.table.lock());
        }
        for slot in self.slots.iter().flatten() {
            slot.unbusy(Ordering::Acquire);
        }
    }

    /// The last handle is going: the entries made without a share of the word get one
    /// each, so that the word, not the handles' share, keeps the ledger alive for them.
    fn close(&self) {
        self.settle(None, true);
    }
}

impl<K, S> KeyedInner<K, S> {
    pub(super) fn shard_index(hash: u64) -> usize {
        // Bits 32.. choose the shard; hashbrown uses the low bits for the bucket and the
        // top seven for its control bytes, the window starts at bits 16.., and the tag is
        // the top 24: the shard stays independent of all of them.
        (hash >> 32) as usize & (SHARDS - 1)
    }

    pub(super) fn shard(&self, hash: u64) -> &CachePadded<Shard<K>> {
        &self.shards[Self::shard_index(hash)]
    }

    /// The slots a key may use: `WINDOW` of its shard's, from the one at the place this
    /// returns, the key's home. The `i`-th is at `(start + i) % SLOTS`.
    #[inline(always)]
    pub(super) fn window(&self, hash: u64) -> (&CachePadded<Shard<K>>, &[Entry<K>; SLOTS], usize) {
        let index = Self::shard_index(hash);
        (&self.shards[index], &self.slots[index], home(hash))
    }

    /// The key's home slot.
    #[inline(always)]
    pub(super) fn home(&self, hash: u64) -> &Entry<K> {
        &self.window(hash).1[home(hash)]
    }

    /// Takes a new entry's share of the word if the ledger holds fewer than `max_keys`
    /// (stored form) entries with one: the number of them it brings the ledger to, or
    /// `None`. Relaxed: the increment is made through a live handle (see `raw`). The
    /// count is below `MAX_KEYS` (checked against `max_keys`, or bounded by memory: every
    /// entry holds a key), so `+ 1` stays in the entries field.
    pub(super) fn count_new_key(&self, max_keys: u64) -> Option<u64> {
        let below_max = |word: u64| (word & KEYS < max_keys).then_some(word + 1);
        (self.state)
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, below_max)
            .ok()
            .map(|word| (word & KEYS) + 1)
    }

    /// Marks every slot `BOUNDED` or not (`bounded`, if given), and, if `count`, gives
    /// every entry in a slot that has no share of the word one (`COUNTED`) and adds it to
    /// the word: from then on, until an entry is made without a share again, the word
    /// counts every entry. For `set_max_keys` (the bound applies to the keys already in
    /// flight too), `set_max_keys_unlimited`, and the last handle's drop. Entries made
    /// under the lock always have their share.
    ///
    /// A slot being filled or emptied is waited for. AcqRel on the marking: an entry made
    /// without the lock after it (its acquire load of the slot reads this write) then
    /// loads `max_keys` as it was stored before; one made before it is seen here, filled,
    /// and counted.
    pub(super) fn settle(&self, bounded: Option<bool>, count: bool) {
        for slot in self.slots.iter().flatten() {
            loop {
                let state = slot.unbusy(Ordering::Acquire);
                let mut next = match bounded {
                    Some(true) => state | BOUNDED,
                    Some(false) => state & !BOUNDED,
                    None => state,
                };
                let share = count && next & HELD != 0 && next & COUNTED == 0;
                if share {
                    next |= COUNTED;
                    // The share first, so that a release that sees `COUNTED` always has
                    // one to give up. Relaxed: made through a live handle (see `raw`).
                    self.state.fetch_add(1, Ordering::Relaxed);
                }
                if next == state {
                    break;
                }
                match slot
                    .state
                    .compare_exchange(state, next, Ordering::AcqRel, Ordering::Relaxed)
                {
                    Ok(_) => break,
                    Err(_) if share => {
                        self.state.fetch_sub(1, Ordering::Relaxed);
                    }
                    Err(_) => {}
                }
            }
        }
    }
}
