//! `Classes`: a table of priority classes, validated when built.

use std::fmt;

use crate::priority::{MAX_CLASSES, Priority};

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
    use super::{Classes, Priority};

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
