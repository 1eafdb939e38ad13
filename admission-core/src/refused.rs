//! The two errors of this crate: a refusal and a capacity that cannot be represented.

use std::fmt;

/// Why an acquisition was refused: names the dimension that said no.
///
/// A refusal is immediate and leaves every ledger as it found it. Adapters map it to a
/// response: `Count`, `Bytes` and `KeyTable` are global overload (HTTP 503), `Key` is one
/// client over its share (HTTP 429), `TooLarge` is one request that no amount of waiting
/// would admit (HTTP 413). This crate itself knows nothing of HTTP.
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
    /// The byte ledger's budget cannot take this charge now.
    Bytes,
    /// This key is at its per-key cap.
    Key,
    /// The keyed ledger already tracks its maximum number of distinct keys.
    KeyTable,
    /// This one charge is larger than the maximum a single request may take.
    TooLarge,
}

impl Refused {
    /// Whether retrying the same request later can succeed.
    ///
    /// Every refusal is retryable except [`Refused::TooLarge`]: the same request will be
    /// too large again.
    ///
    /// ```
    /// use admission_core::Refused;
    ///
    /// assert!(Refused::Key.is_retryable());
    /// assert!(!Refused::TooLarge.is_retryable());
    /// ```
    pub const fn is_retryable(self) -> bool {
        !matches!(self, Refused::TooLarge)
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
            Refused::Bytes => "bytes",
            Refused::Key => "key",
            Refused::KeyTable => "key_table",
            Refused::TooLarge => "too_large",
        }
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refused::Count => "count limit reached",
            Refused::Bytes => "byte budget exhausted",
            Refused::Key => "per-key limit reached",
            Refused::KeyTable => "key table full",
            Refused::TooLarge => "request too large",
        })
    }
}

impl std::error::Error for Refused {}

/// A capacity, budget or cap that a ledger cannot represent.
///
/// Returned by constructors and setters instead of panicking, so a bad configuration
/// surfaces when it is loaded, not at the first request.
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

    const ALL: [Refused; 5] = [
        Refused::Count,
        Refused::Bytes,
        Refused::Key,
        Refused::KeyTable,
        Refused::TooLarge,
    ];

    #[test]
    fn only_too_large_is_not_worth_retrying() {
        let retryable: Vec<bool> = ALL.iter().map(|r| r.is_retryable()).collect();
        assert_eq!(retryable, [true, true, true, true, false]);
    }

    #[test]
    fn each_refusal_names_its_dimension_and_reads_as_a_sentence() {
        let names: Vec<&str> = ALL.iter().map(|r| r.dimension()).collect();
        assert_eq!(names, ["count", "bytes", "key", "key_table", "too_large"]);
        let shown: Vec<String> = ALL.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "count limit reached",
                "byte budget exhausted",
                "per-key limit reached",
                "key table full",
                "request too large",
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
    }
}
