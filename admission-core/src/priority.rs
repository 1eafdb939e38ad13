//! Priority classes: each class may fill the count ledger up to its own share of the
//! capacity in force, so the least important work is shed first.

use std::fmt;

/// The most classes one [`Classes`] table holds.
pub const MAX_CLASSES: usize = 8;

/// A request's priority class: which class it is (for statistics) and the share of the
/// count ledger's capacity its class may fill.
///
/// Made by a [`Classes`] table ([`Classes::get`], [`Classes::iter`]); the standard table's
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
    const fn new(index: u8, percent: u8) -> Self {
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

/// A table of priority classes, most important first, each with its share of the count
/// capacity. Validated when built: never a panic later.
///
/// The [standard](Self::standard) table (also [`Default`]) is `critical` 100%, `default`
/// 90%, `sheddable` 70%, after the request criticalities of Google's SRE practice.
///
/// # Choosing shares
///
/// The gap between two shares is the headroom the more important class keeps from the
/// less important one: with 100 / 90 / 70 and a capacity of 100, sheddable work alone
/// fills 70 slots, ordinary work the next 20, and the last 10 are for critical work
/// only. Size the top class's headroom for the critical traffic you expect at peak (in
/// requests in flight: rate × latency), and keep the lowest share high enough that the
/// server is still used when only sheddable work arrives (a capacity filled 70% by
/// sheddable work is 30% idle). Shares apply to the capacity in force, so they follow a
/// capacity changed at run time or by an adaptive limit; on a small capacity they round
/// down (`⌊c × p / 100⌋`: at a capacity of 1 only a 100% class is admitted).
///
/// # Examples
///
/// ```
/// use admission_core::{Classes, Priority};
///
/// let classes = Classes::new([("checkout", 100), ("browse", 85), ("prefetch", 50)])?;
/// let prefetch = classes.get("prefetch").unwrap();
/// assert_eq!((prefetch.index(), prefetch.share()), (2, 50));
/// assert_eq!(classes.name(prefetch), Some("prefetch"));
///
/// assert!(Classes::new([("a", 100), ("b", 120)]).is_err());
/// assert_eq!(Classes::standard().get("sheddable"), Some(Priority::SHEDDABLE));
/// # Ok::<(), admission_core::ClassError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Classes {
    names: Vec<Box<str>>,
    shares: Vec<u8>,
}

impl Classes {
    /// A table from `(name, share in percent)` pairs, most important first.
    ///
    /// # Errors
    ///
    /// [`ClassError`] if there are no classes or more than [`MAX_CLASSES`], if the
    /// first share is not 100 (the most important work may fill the capacity), if a
    /// share is 0, above 100, or above the share of a class before it, or if a name is
    /// empty or repeated.
    ///
    /// ```
    /// use admission_core::Classes;
    ///
    /// let classes = Classes::new([("interactive", 100), ("batch", 60)])?;
    /// assert_eq!(classes.len(), 2);
    /// assert!(Classes::new([("batch", 60)]).unwrap_err().to_string().contains("100"));
    /// # Ok::<(), admission_core::ClassError>(())
    /// ```
    pub fn new<N: Into<String>>(
        classes: impl IntoIterator<Item = (N, u8)>,
    ) -> Result<Self, ClassError> {
        let mut names: Vec<Box<str>> = Vec::new();
        let mut shares = Vec::new();
        for (name, share) in classes {
            let name: String = name.into();
            let problem = if names.len() == MAX_CLASSES {
                Some(Problem::TooMany)
            } else if name.is_empty() {
                Some(Problem::EmptyName)
            } else if names.iter().any(|other| **other == *name) {
                Some(Problem::Repeated)
            } else if share == 0 || share > 100 {
                Some(Problem::Share)
            } else if shares.is_empty() && share != 100 {
                Some(Problem::FirstNotFull)
            } else if shares.last().is_some_and(|&before| share > before) {
                Some(Problem::Rising)
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(ClassError { name, problem });
            }
            names.push(name.into_boxed_str());
            shares.push(share);
        }
        if names.is_empty() {
            return Err(ClassError {
                name: String::new(),
                problem: Problem::Empty,
            });
        }
        Ok(Self { names, shares })
    }

    /// `critical` 100%, `default` 90%, `sheddable` 70%: the classes of
    /// [`Priority::CRITICAL`], [`Priority::DEFAULT`] and [`Priority::SHEDDABLE`].
    ///
    /// ```
    /// use admission_core::{Classes, Priority};
    ///
    /// let standard = Classes::standard();
    /// assert_eq!(standard.iter().collect::<Vec<_>>(), [
    ///     ("critical", Priority::CRITICAL),
    ///     ("default", Priority::DEFAULT),
    ///     ("sheddable", Priority::SHEDDABLE),
    /// ]);
    /// ```
    pub fn standard() -> Self {
        Self {
            names: vec!["critical".into(), "default".into(), "sheddable".into()],
            shares: vec![100, 90, 70],
        }
    }

    /// The class called `name`.
    ///
    /// ```
    /// use admission_core::{Classes, Priority};
    ///
    /// assert_eq!(Classes::standard().get("critical"), Some(Priority::CRITICAL));
    /// assert_eq!(Classes::standard().get("urgent"), None);
    /// ```
    pub fn get(&self, name: &str) -> Option<Priority> {
        let index = self.names.iter().position(|other| **other == *name)?;
        Some(self.at(index))
    }

    /// The name of `priority`'s class in this table (`None` if the table has no class at
    /// that position).
    ///
    /// ```
    /// use admission_core::{Classes, Priority};
    ///
    /// assert_eq!(Classes::standard().name(Priority::DEFAULT), Some("default"));
    /// ```
    pub fn name(&self, priority: Priority) -> Option<&str> {
        self.names.get(priority.index()).map(|name| &**name)
    }

    /// The classes, most important first.
    ///
    /// ```
    /// use admission_core::Classes;
    ///
    /// let classes = Classes::standard();
    /// let names: Vec<&str> = classes.iter().map(|(name, _)| name).collect();
    /// assert_eq!(names, ["critical", "default", "sheddable"]);
    /// ```
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, Priority)> + '_ {
        (0..self.names.len()).map(|index| (&*self.names[index], self.at(index)))
    }

    /// How many classes the table has.
    ///
    /// ```
    /// assert_eq!(admission_core::Classes::standard().len(), 3);
    /// ```
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Never: a table has at least one class. (For the `len` convention.)
    ///
    /// ```
    /// assert!(!admission_core::Classes::standard().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        false // `new` refuses an empty table
    }

    /// The most important class (share 100%).
    ///
    /// ```
    /// use admission_core::{Classes, Priority};
    ///
    /// assert_eq!(Classes::standard().highest(), Priority::CRITICAL);
    /// ```
    pub fn highest(&self) -> Priority {
        self.at(0)
    }

    /// The least important class.
    ///
    /// ```
    /// use admission_core::{Classes, Priority};
    ///
    /// assert_eq!(Classes::standard().lowest(), Priority::SHEDDABLE);
    /// ```
    pub fn lowest(&self) -> Priority {
        self.at(self.names.len() - 1)
    }

    fn at(&self, index: usize) -> Priority {
        // Below `MAX_CLASSES`, checked in `new`.
        Priority::new(index as u8, self.shares[index])
    }
}

impl Default for Classes {
    fn default() -> Self {
        Self::standard()
    }
}

impl fmt::Debug for Classes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.names
                    .iter()
                    .zip(self.shares.iter().map(|s| Percent(*s))),
            )
            .finish()
    }
}

struct Percent(u8);

impl fmt::Debug for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", self.0)
    }
}

/// Why a [`Classes`] table was refused.
///
/// ```
/// use admission_core::Classes;
///
/// let err = Classes::new([("a", 100), ("a", 50)]).unwrap_err();
/// assert_eq!(err.class(), "a");
/// assert!(err.to_string().contains("more than once"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassError {
    name: String,
    problem: Problem,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Problem {
    Empty,
    TooMany,
    EmptyName,
    Repeated,
    Share,
    FirstNotFull,
    Rising,
}

impl ClassError {
    /// The name of the class at fault (empty when the table has no class).
    pub fn class(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for ClassError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = &self.name;
        match self.problem {
            Problem::Empty => f.write_str("a class table needs at least one class"),
            Problem::TooMany => write!(
                f,
                "class `{name}`: a class table holds at most {MAX_CLASSES} classes"
            ),
            Problem::EmptyName => f.write_str("a class needs a name"),
            Problem::Repeated => write!(f, "class `{name}` is named more than once"),
            Problem::Share => write!(f, "class `{name}`: a share is between 1 and 100 percent"),
            Problem::FirstNotFull => write!(
                f,
                "class `{name}`: the first (most important) class's share must be 100 percent"
            ),
            Problem::Rising => write!(
                f,
                "class `{name}`: a class's share may not exceed the share of a class listed \
                 before it (more important classes first)"
            ),
        }
    }
}

impl std::error::Error for ClassError {}

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

    #[test]
    fn every_invalid_table_is_an_error_naming_the_class() {
        let cases: [(&[(&str, u8)], &str); 7] = [
            (&[], "at least one"),
            (&[("a", 100), ("", 50)], "needs a name"),
            (&[("a", 100), ("a", 50)], "more than once"),
            (&[("a", 100), ("b", 0)], "between 1 and 100"),
            (&[("a", 101)], "between 1 and 100"),
            (&[("a", 90)], "must be 100"),
            (&[("a", 100), ("b", 50), ("c", 60)], "may not exceed"),
        ];
        for (table, message) in cases {
            let err = Classes::new(table.iter().copied()).unwrap_err();
            assert!(err.to_string().contains(message), "{table:?}: {err}");
        }
        let nine = (0..9).map(|i| (format!("c{i}"), 100));
        let err = Classes::new(nine).unwrap_err();
        assert_eq!(err.class(), "c8");
        assert!(err.to_string().contains("at most 8"));
        let eight = Classes::new((0..8).map(|i| (format!("c{i}"), 100))).unwrap();
        assert_eq!(eight.lowest().index(), 7);
    }

    #[test]
    fn the_standard_table_is_the_constants() {
        let standard = Classes::default();
        assert_eq!(
            Classes::new([("critical", 100), ("default", 90), ("sheddable", 70)]).unwrap(),
            standard
        );
        assert_eq!(standard.get("default"), Some(Priority::DEFAULT));
        assert_eq!(standard.name(Priority::SHEDDABLE), Some("sheddable"));
        let one = Classes::new([("a", 100)]).unwrap();
        assert_eq!(one.name(Priority::SHEDDABLE), None);
        assert_eq!((one.len(), standard.len()), (1, 3));
        assert!(!one.is_empty() && !standard.is_empty());
        assert_eq!(
            format!("{standard:?}"),
            r#"{"critical": 100%, "default": 90%, "sheddable": 70%}"#
        );
        assert_eq!(format!("{:?}", Priority::DEFAULT), "Priority(#1, 90%)");
    }
}
