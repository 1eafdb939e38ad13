//! Fair shares: when the count is nearly full, a key at or above its share of it (the
//! count over the keys with work) is refused, and the last free slots are kept for the
//! keys below theirs.
//!
//! # Which keys have work
//!
//! A key has work if it sent a request recently, whether or not one is in flight now: a
//! light client between two requests still has its share kept. "Recently" is counted in
//! requests, not time (no clock is read): a key is active while it is among the keys of
//! the last one or two generations of [`PERIOD`] requests. Each generation marks its keys
//! in a bitmap of [`BITS`] bits by their hash; the keys of the current and of the last
//! generation are read as the larger of the two bitmaps' counts, corrected for keys that
//! share a bit. Three bitmaps take turns: the current, the last, and the next, cleared
//! while the current fills, so that a mark is never lost to a clearing.
//!
//! Memory is fixed: three bitmaps of [`BITS`] bits (3 KiB), whatever the number of keys.
//! The estimate reads within a few percent up to a few thousand active keys and, past
//! [`BITS`], below the truth (shares larger than fair, never smaller).

use crate::sync::{AtomicU64, Ordering};
use crate::{CountLedger, Priority};

/// Bits in one generation's bitmap.
#[cfg(not(admission_loom))]
pub(super) const BITS: u64 = 8192;
/// Under loom, two words: the model is of the protocol, not of the size.
#[cfg(admission_loom)]
pub(super) const BITS: u64 = 128;
const WORDS: usize = (BITS / 64) as usize;

/// Requests with a key in one generation: as many as the bitmap has bits, so that one
/// generation cannot mark more keys than the estimate can read.
pub(super) const PERIOD: u64 = BITS;

/// The gate's fair shares (see [`GateBuilder::fair_share`](super::GateBuilder::fair_share)).
pub(super) struct Fair {
    /// The fewest free slots kept for keys below their share, per mille of the class's
    /// threshold, rounded up (at least one slot).
    headroom: u32,
    /// Slots kept beyond those: one more each time a key below its share is refused by a
    /// full count, one fewer after each generation in which none was (see `cap`).
    extra: AtomicU64,
    /// Keys below their share refused by a full count, this generation.
    shortfalls: AtomicU64,
    /// Requests with a key so far: their generation is this over [`PERIOD`].
    marks: AtomicU64,
    /// The keys of each of three generations, by their hash's bit.
    banks: [Box<[AtomicU64]>; 3],
    /// The bits set in each bitmap.
    ones: [AtomicU64; 3],
}

impl std::fmt::Debug for Fair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fair")
            .field("headroom", &self.headroom)
            .field("extra", &self.extra.load(Ordering::Relaxed))
            .field("active", &self.active())
            .finish_non_exhaustive()
    }
}

impl Fair {
    pub(super) fn new(headroom: u32) -> Self {
        let bank = || (0..WORDS).map(|_| AtomicU64::new(0)).collect();
        Self {
            headroom,
            extra: AtomicU64::new(0),
            shortfalls: AtomicU64::new(0),
            marks: AtomicU64::new(0),
            banks: [bank(), bank(), bank()],
            ones: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// Marks the key of hash `hash` as active. One shared increment, a load, and a
    /// bit set the first time a key is seen in a generation.
    #[inline]
    pub(super) fn mark(&self, hash: u64) {
        // Relaxed throughout: an estimate, read by loads that may see any recent value.
        let n = self.marks.fetch_add(1, Ordering::Relaxed);
        let generation = n / PERIOD;
        if n % PERIOD == 0 {
            self.clear(((generation + 1) % 3) as usize);
            self.settle();
        }
        let bank = (generation % 3) as usize;
        // Mixed again (a multiply, its top bits): the keyed ledger's hasher is made for
        // placing keys by its low bits, not for spreading its high ones.
        let bit = hash.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - BITS.trailing_zeros());
        let word = &self.banks[bank][(bit / 64) as usize];
        let mask = 1 << (bit % 64);
        if word.load(Ordering::Relaxed) & mask == 0
            && word.fetch_or(mask, Ordering::Relaxed) & mask == 0
        {
            self.ones[bank].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A generation ends: the headroom gives back one slot it took, if no key below its
    /// share was refused by a full count in it.
    #[cold]
    fn settle(&self) {
        if self.shortfalls.swap(0, Ordering::Relaxed) == 0 {
            let _ = (self.extra).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |extra| {
                extra.checked_sub(1)
            });
        }
    }

    /// A claim of a key holding `held`, of `priority`'s class, refused by a full count: if
    /// the key was below its share, the headroom was too small for the keys below theirs,
    /// and takes one more slot (up to half the class's threshold).
    #[cold]
    pub(super) fn refused(&self, count: &CountLedger, priority: Option<Priority>, held: u64) {
        let (_, threshold) = count.room(priority);
        if held < self.share(threshold) {
            // Counted even at the widest: the generation does not narrow it.
            self.shortfalls.fetch_add(1, Ordering::Relaxed);
            if self.headroom(threshold) < threshold / 2 {
                self.extra.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A key's share of `threshold`: over the active keys, rounded up.
    fn share(&self, threshold: u64) -> u64 {
        threshold.div_ceil(self.active().max(1))
    }

    /// The free slots kept of `threshold`: its fraction, rounded up (at least one), and
    /// what shortfalls added, up to half of it (never less than the fraction).
    fn headroom(&self, threshold: u64) -> u64 {
        // Rounded up: an eighth of 10 slots keeps 2.
        let least = (u128::from(threshold) * u128::from(self.headroom)).div_ceil(1000) as u64;
        let least = least.max(1);
        let extra = self.extra.load(Ordering::Relaxed);
        least.saturating_add(extra).min((threshold / 2).max(least))
    }

    /// Clears the bitmap of the generation after the current one (last used two
    /// generations ago).
    #[cold]
    fn clear(&self, bank: usize) {
        for word in self.banks[bank].iter() {
            word.store(0, Ordering::Relaxed);
        }
        self.ones[bank].store(0, Ordering::Relaxed);
    }

    /// Keys active now: of the current generation and the last, the larger count of
    /// bits, corrected for keys that share one (linear counting: `-m ln(1 - ones/m)`, its
    /// whole part).
    pub(super) fn active(&self) -> u64 {
        let generation = self.marks.load(Ordering::Relaxed) / PERIOD;
        let current = self.ones[(generation % 3) as usize].load(Ordering::Relaxed);
        let last = self.ones[((generation + 2) % 3) as usize].load(Ordering::Relaxed);
        let ones = current.max(last).min(BITS - 1);
        // Linear counting: keys fall on bits at random, some together.
        let free = (BITS - ones) as f64 / BITS as f64;
        (-(BITS as f64) * free.ln()) as u64
    }

    /// The cap a key of `priority`'s class is held to now: `None` while the count has more
    /// free slots than the headroom; else its share, the class's threshold over the
    /// active keys, rounded up (at least one, while the ledger is open).
    ///
    /// The headroom moves: the fewest slots it keeps are the configured fraction; each
    /// key below its share that a full count refuses adds one (the keys below their share
    /// needed more than was kept), and each generation without one gives one back. So it
    /// settles at about the least that turns away a key below its share once a
    /// generation.
    #[inline]
    pub(super) fn cap(&self, count: &CountLedger, priority: Option<Priority>) -> Option<u64> {
        let (held, threshold) = count.room(priority);
        if held.saturating_add(self.headroom(threshold)) < threshold {
            return None;
        }
        Some(self.share(threshold))
    }
}
