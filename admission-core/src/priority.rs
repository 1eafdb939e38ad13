//! Priority classes: each class may fill the count ledger up to its own share of the
//! capacity in force, so the least important work is shed first.

use std::fmt;

/// The most classes one [`Classes`](crate::Classes) table holds.
pub const MAX_CLASSES: usize = 8;

/// A request's priority class: which class it is (for statistics) and the share of the
/// count ledger's capacity its class may fill.
///
/// Made by a [`Classes`](crate::Classes) table ([`get`](crate::Classes::get),
/// [`iter`](crate::Classes::iter)); the standard table's
/// classes are also constants ([`CRITICAL`](Self::CRITICAL), [`DEFAULT`](Self::DEFAULT),
/// [`SHEDDABLE`](Self::SHEDDABLE)). A retry of a class is a `Priority` of its own, with a
/// smaller share ([`retry`](Self::retry)). A `Priority` is small and `Copy`.
///
/// A class whose share is `p`% is admitted by a count ledger of capacity `c` while fewer
/// than `⌊c × p / 100⌋` permits are in flight (of every class together): the share is a
/// threshold, not a reservation. What a 100% class may use and a 70% class may not is
/// the headroom kept for the important work.
///
/// # Examples
///
/// ```
/// use admission_core::{CountLedger, Priority, Refused};
///
/// let ledger = CountLedger::new(10)?;
/// let held: Vec<_> = (0..7).map(|_| ledger.try_acquire_as(Priority::SHEDDABLE)).collect::<Result<_, _>>()?;
/// // 7 in flight: sheddable work (70%) is shed, the rest is not.
/// assert_eq!(ledger.try_acquire_as(Priority::SHEDDABLE).unwrap_err(), Refused::Class);
/// let _default = ledger.try_acquire_as(Priority::DEFAULT)?; // 90%: up to 9
/// let _critical = ledger.try_acquire_as(Priority::CRITICAL)?; // 100%: up to 10
/// assert_eq!(ledger.refused_by_class()[Priority::SHEDDABLE.index()], 1);
/// # drop(held);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Priority {
    index: u8,
    percent: u8,
    /// Made by [`retry`](Self::retry).
    retry: bool,
    /// `⌈percent × 2⁶⁴ / 100⌉`, or 0 for 100%: see [`of`](Self::of).
    scale: u64,
}

impl Priority {
    /// The standard table's most important class: may fill the whole capacity.
    pub const CRITICAL: Priority = Priority::new(0, 100);
    /// The standard table's class for ordinary work: up to 90% of the capacity.
    pub const DEFAULT: Priority = Priority::new(1, 90);
    /// The standard table's least important class: up to 70% of the capacity.
    pub const SHEDDABLE: Priority = Priority::new(2, 70);

    /// Class `index` with a share of `percent` (1 to 100, checked by the callers).
    pub(crate) const fn new(index: u8, percent: u8) -> Self {
        let scale = if percent >= 100 {
            0
        } else {
            ((percent as u128) << 64).div_ceil(100) as u64
        };
        Self {
            index,
            percent,
            retry: false,
            scale,
        }
    }

    /// A retry of this class: the same class (its [`index`](Self::index), where its
    /// refusals are counted), admitted only while fewer than `percent`% of what the class
    /// may fill are in flight, so that when the server must shed, retries go before the
    /// class's first attempts. Its [`share`](Self::share) is `⌊share × percent / 100⌋`,
    /// at least 1; `percent` is taken as 1 to 100. Its refusals are counted also in
    /// [`CountLedger::refused_retries`](crate::CountLedger::refused_retries).
    ///
    /// ```
    /// use admission_core::{CountLedger, Priority, Refused};
    ///
    /// let retry = Priority::DEFAULT.retry(80);
    /// assert_eq!((retry.index(), retry.share(), retry.is_retry()), (1, 72, true));
    ///
    /// let ledger = CountLedger::new(10)?;
    /// let held: Vec<_> = (0..7).map(|_| ledger.try_acquire_as(Priority::DEFAULT)).collect::<Result<_, _>>()?;
    /// // 7 in flight: a retry (72% of 10) is shed, a first attempt (90%) is not.
    /// assert_eq!(ledger.try_acquire_as(retry).unwrap_err(), Refused::Class);
    /// let _first = ledger.try_acquire_as(Priority::DEFAULT)?;
    /// assert_eq!(ledger.refused_retries(), 1);
    /// # drop(held);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub const fn retry(self, percent: u8) -> Self {
        let percent = if percent == 0 {
            1
        } else if percent > 100 {
            100
        } else {
            percent
        };
        let share = self.percent as u16 * percent as u16 / 100;
        let share = if share == 0 { 1 } else { share as u8 };
        let mut retry = Priority::new(self.index, share);
        retry.retry = true;
        retry
    }

    /// Whether this is a [`retry`](Self::retry) of its class.
    ///
    /// ```
    /// use admission_core::Priority;
    ///
    /// assert!(!Priority::SHEDDABLE.is_retry());
    /// assert!(Priority::SHEDDABLE.retry(50).is_retry());
    /// ```
    pub const fn is_retry(self) -> bool {
        self.retry
    }

    /// The class's position in its table, from 0 (the most important); indexes
    /// [`CountLedger::refused_by_class`](crate::CountLedger::refused_by_class).
    ///
    /// ```
    /// use admission_core::Priority;
    ///
    /// assert_eq!(Priority::SHEDDABLE.index(), 2);
    /// ```
    pub const fn index(self) -> usize {
        self.index as usize
    }

    /// The class's share of the count capacity, in percent (1 to 100).
    ///
    /// ```
    /// use admission_core::Priority;
    ///
    /// assert_eq!(Priority::DEFAULT.share(), 90);
    /// ```
    pub const fn share(self) -> u8 {
        self.percent
    }

    /// The class's threshold under a ledger threshold `threshold`: `⌊threshold × p /
    /// 100⌋`, as the high half of one 64 × 64-bit multiplication by the precomputed
    /// `⌈p × 2⁶⁴ / 100⌉`. That is exact for every threshold below 2⁶⁴ / 100 (about
    /// 1.8 × 10¹⁷; the error `threshold × ε / 2⁶⁴`, with ε < 1, stays under the 1/100 that
    /// separates `threshold × p / 100` from the next integer), which every reachable
    /// capacity is; above it (an unlimited ledger's threshold) the result may be one more,
    /// still far above any count. A share of 100 gives `threshold` itself, and a closed
    /// ledger's 0 gives 0.
    #[inline]
    pub(crate) const fn of(self, threshold: u64) -> u64 {
        if self.scale == 0 {
            return threshold;
        }
        ((threshold as u128 * self.scale as u128) >> 64) as u64
    }
}

impl fmt::Debug for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let retry = if self.retry { ", retry" } else { "" };
        write!(f, "Priority(#{}, {}%{retry})", self.index, self.percent)
    }
}

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_share_of_a_threshold_is_exact_below_the_bound_and_never_overflows() {
        // Exact for every threshold a capacity can reach; the largest few checked too.
        const BOUND: u64 = u64::MAX / 100;
        // Under Miri, which interprets every step, a sample of the same ranges.
        let (small, near) = if cfg!(miri) { (200, 20) } else { (2000, 1000) };
        let large = (0..near).map(|i| BOUND - i);
        let spread = (0..=57).map(|bit| (1_u64 << bit) / 10 * 7 + bit);
        for percent in (1..=100_u8)
            .step_by(if cfg!(miri) { 9 } else { 1 })
            .chain([100])
        {
            let p = Priority::new(0, percent);
            for t in (0..small).chain(large.clone()).chain(spread.clone()) {
                let exact = (u128::from(t) * u128::from(percent) / 100) as u64;
                assert_eq!(p.of(t), exact, "{t} at {percent}%");
            }
            // Above it (an unlimited ledger's threshold): at most one more, no overflow.
            for t in [u64::MAX, (1 << 62) - 1, 1 << 62] {
                let exact = (u128::from(t) * u128::from(percent) / 100) as u64;
                assert!(p.of(t) - exact <= 1, "{t} at {percent}%");
            }
        }
        assert_eq!(Priority::CRITICAL.of(7), 7);
        assert_eq!(Priority::SHEDDABLE.of(10), 7);
        assert_eq!(Priority::DEFAULT.of(1), 0);
    }

    #[test]
    fn a_retry_keeps_its_class_at_a_share_of_its_share() {
        for (class, percent, share) in [
            (Priority::DEFAULT, 80, 72),
            (Priority::SHEDDABLE, 50, 35),
            (Priority::CRITICAL, 100, 100),
            (Priority::CRITICAL, 99, 99),
            // Never 0: a class of 1% retried at 50% is still 1%.
            (Priority::new(3, 1), 50, 1),
            // Taken as 1 to 100.
            (Priority::DEFAULT, 0, 1),
            (Priority::DEFAULT, 255, 90),
        ] {
            let retry = class.retry(percent);
            assert_eq!(retry.share(), share, "{class:?} at {percent}%");
            assert_eq!(retry.index(), class.index());
            assert!(retry.is_retry() && !class.is_retry());
            // The threshold is the retry's share's, computed as a class's is.
            assert_eq!(retry.of(1000), u64::from(share) * 10);
            assert_ne!(retry, class);
        }
        // A retry of a retry is a retry of the smaller share.
        assert_eq!(Priority::DEFAULT.retry(50).retry(50).share(), 22);
        assert_eq!(
            format!("{:?}", Priority::DEFAULT.retry(80)),
            "Priority(#1, 72%, retry)"
        );
        assert_eq!(format!("{:?}", Priority::DEFAULT), "Priority(#1, 90%)");
    }
}
