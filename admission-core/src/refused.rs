//! The two errors of this crate: a refusal and a capacity that cannot be represented.

use std::fmt;

/// Why an acquisition was refused: names the dimension that said no.
///
/// A refusal is immediate and leaves every ledger as it found it. Adapters map it to a
/// response: `Count`, `Class`, `Bytes` and `KeyTable` are global overload (HTTP 503), `Closed` is
/// a server that takes nothing new (draining for shutdown, or stopped by an operator:
/// HTTP 503, gRPC `UNAVAILABLE`), `Key` is one client over its share (HTTP 429),
/// `TooLarge` is one request that no amount of waiting would admit (HTTP 413), `TooSlow`
/// a request whose body arrived slower than the server's minimum data rate (HTTP 408).
/// This crate itself knows nothing of HTTP.
///
/// # Examples
///
/// ```
/// use admission_core::{CountLedger, Refused};
///
/// let ledger = CountLedger::new(1)?;
/// let _held = ledger.try_acquire()?;
/// let refused = ledger.try_acquire().unwrap_err();
/// assert_eq!(refused, Refused::Count);
/// assert_eq!(refused.to_string(), "count limit reached");
/// assert!(refused.is_retryable());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refused {
    /// The count ledger is at its capacity.
    Count,
    /// The request's priority class has its share of the count capacity in flight,
    /// while the capacity itself is not reached: more important work keeps the rest
    /// (see [`Classes`](crate::Classes)).
    Class,
    /// The byte ledger's budget cannot take this charge now.
    Bytes,
    /// This key is at its per-key cap.
    Key,
    /// The keyed ledger already tracks its maximum number of distinct keys.
    KeyTable,
    /// This one charge is larger than the maximum a single request may take.
    TooLarge,
    /// The count ledger is closed: it admits nothing new until it is reopened
    /// ([`CountLedger::close`](crate::CountLedger::close),
    /// [`Gate::drain`](crate::Gate::drain)).
    Closed,
    /// The request's body arrived slower than the minimum data rate, so it was cut
    /// rather than let it hold what it was admitted with. No ledger of this crate says
    /// this; the adapters that time bodies do.
    TooSlow,
}

impl Refused {
    /// Whether retrying the same request later can succeed.
    ///
    /// Every refusal is retryable except [`Refused::TooLarge`], the same request will be
    /// too large again, and [`Refused::TooSlow`]: the server was not short of room, the
    /// client was slow, and waiting does not make it faster (no retry delay is advised).
    ///
    /// ```
    /// use admission_core::Refused;
    ///
    /// assert!(Refused::Key.is_retryable());
    /// assert!(!Refused::TooLarge.is_retryable());
    /// assert!(!Refused::TooSlow.is_retryable());
    /// ```
    pub const fn is_retryable(self) -> bool {
        !matches!(self, Refused::TooLarge | Refused::TooSlow)
    }

    /// A short, stable name for the dimension, for metric labels and log fields.
    ///
    /// ```
    /// use admission_core::Refused;
    ///
    /// assert_eq!(Refused::Bytes.dimension(), "bytes");
    /// assert_eq!(Refused::KeyTable.dimension(), "key_table");
    /// ```
    pub const fn dimension(self) -> &'static str {
        match self {
            Refused::Count => "count",
            Refused::Class => "class",
            Refused::Bytes => "bytes",
            Refused::Key => "key",
            Refused::KeyTable => "key_table",
            Refused::TooLarge => "too_large",
            Refused::Closed => "closed",
            Refused::TooSlow => "too_slow",
        }
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refused::Count => "count limit reached",
            Refused::Class => "priority class share reached",
            Refused::Bytes => "byte budget exhausted",
            Refused::Key => "per-key limit reached",
            Refused::KeyTable => "key table full",
            Refused::TooLarge => "request too large",
            Refused::Closed => "closed to new work",
            Refused::TooSlow => "request body too slow",
        })
    }
}

impl std::error::Error for Refused {}

/// A capacity, budget or cap that a ledger cannot represent, or a run-time limit of 0.
///
/// Returned by constructors and setters instead of panicking, so a bad configuration
/// surfaces when it is loaded, not at the first request.
///
/// In configuration (constructors, builders) 0 means "unlimited". A run-time setter
/// refuses 0 instead ([`is_zero`](Self::is_zero)): an operator who writes 0 to stop
/// traffic would otherwise remove the limit. Removing a limit at run time is spelled out
/// (`set_unlimited`, `set_budget_unlimited`, ...), and refusing everything new is
/// [`CountLedger::close`](crate::CountLedger::close).
///
/// # Examples
///
/// ```
/// use admission_core::CountLedger;
///
/// let err = CountLedger::new(usize::MAX).unwrap_err();
/// assert_eq!(err.requested(), usize::MAX as u64);
/// assert_eq!(err.maximum(), CountLedger::MAX_CAPACITY as u64);
/// assert!(err.to_string().contains("exceeds the maximum"));
///
/// let ledger = CountLedger::new(8)?;
/// assert!(ledger.set_capacity(0).unwrap_err().is_zero());
/// assert_eq!(ledger.capacity(), 8, "unchanged");
/// # Ok::<(), admission_core::CapacityError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityError {
    requested: u64,
    maximum: u64,
}

impl CapacityError {
    pub(crate) fn check(requested: u64, maximum: u64) -> Result<u64, CapacityError> {
        if requested > maximum {
            Err(CapacityError { requested, maximum })
        } else {
            Ok(requested)
        }
    }

    /// A run-time limit: between 1 and `maximum`.
    pub(crate) fn check_nonzero(requested: u64, maximum: u64) -> Result<u64, CapacityError> {
        match requested {
            0 => Err(CapacityError { requested, maximum }),
            _ => Self::check(requested, maximum),
        }
    }

    /// Whether this is a run-time setter refusing 0 (which would have removed the limit).
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// let ledger = ByteLedger::new(1024)?;
    /// let err = ledger.set_budget(0).unwrap_err();
    /// assert!(err.is_zero());
    /// assert!(err.to_string().contains("set_budget_unlimited"));
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn is_zero(&self) -> bool {
        self.requested == 0
    }

    /// The value that was asked for.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// assert_eq!(ByteLedger::new(u64::MAX).unwrap_err().requested(), u64::MAX);
    /// ```
    pub fn requested(&self) -> u64 {
        self.requested
    }

    /// The largest value the ledger accepts.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// assert_eq!(ByteLedger::new(u64::MAX).unwrap_err().maximum(), ByteLedger::MAX_BUDGET);
    /// ```
    pub fn maximum(&self) -> u64 {
        self.maximum
    }
}

impl fmt::Display for CapacityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_zero() {
            return f.write_str(
                "a limit of 0 at run time would remove the limit: to remove it, call the \
                 setter's `_unlimited` form (`set_unlimited`, `set_budget_unlimited`, ...); \
                 to refuse everything new, `close()` the count ledger or gate",
            );
        }
        write!(
            f,
            "capacity {} exceeds the maximum {} this ledger can represent",
            self.requested, self.maximum
        )
    }
}

impl std::error::Error for CapacityError {}

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use super::*;

    const ALL: [Refused; 7] = [
        Refused::Count,
        Refused::Class,
        Refused::Bytes,
        Refused::Key,
        Refused::KeyTable,
        Refused::TooLarge,
        Refused::Closed,
    ];

    #[test]
    fn only_too_large_is_not_worth_retrying() {
        let retryable: Vec<bool> = ALL.iter().map(|r| r.is_retryable()).collect();
        assert_eq!(retryable, [true, true, true, true, true, false, true]);
    }

    #[test]
    fn each_refusal_names_its_dimension_and_reads_as_a_sentence() {
        let names: Vec<&str> = ALL.iter().map(|r| r.dimension()).collect();
        assert_eq!(
            names,
            [
                "count",
                "class",
                "bytes",
                "key",
                "key_table",
                "too_large",
                "closed"
            ]
        );
        let shown: Vec<String> = ALL.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "count limit reached",
                "priority class share reached",
                "byte budget exhausted",
                "per-key limit reached",
                "key table full",
                "request too large",
                "closed to new work",
            ]
        );
    }

    #[test]
    fn a_capacity_error_says_what_was_asked_and_what_fits() {
        let err = CapacityError::check(10, 7).unwrap_err();
        assert_eq!((err.requested(), err.maximum()), (10, 7));
        assert_eq!(
            err.to_string(),
            "capacity 10 exceeds the maximum 7 this ledger can represent"
        );
        assert_eq!(CapacityError::check(7, 7), Ok(7));
        assert!(!err.is_zero());
    }

    #[test]
    fn a_run_time_zero_is_an_error_that_says_how_to_remove_or_close() {
        let err = CapacityError::check_nonzero(0, 7).unwrap_err();
        assert!(err.is_zero());
        let shown = err.to_string();
        assert!(
            shown.contains("_unlimited") && shown.contains("close()"),
            "{shown}"
        );
        assert_eq!(CapacityError::check_nonzero(1, 7), Ok(1));
        assert!(!CapacityError::check_nonzero(8, 7).unwrap_err().is_zero());
    }
}
