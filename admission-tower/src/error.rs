//! `BuildError`: why a builder could not make a layer.

use std::fmt;

use admission_core::CapacityError;
use admission_core::adaptive::AdaptiveError;
use admission_core::memory::MemoryError;

/// Why [`AdmissionBuilder::build`](crate::AdmissionBuilder::build) could not make a layer.
///
/// Each variant names the mistake; where another error lies beneath (a ledger's range,
/// the adaptive limit's bounds), `Display` says what was being built and
/// [`source`](std::error::Error::source) gives the cause, so an error reporter that walks
/// the chain prints each once.
///
/// ```
/// use std::error::Error;
/// use admission_tower::{AdmissionLayer, BuildError};
///
/// let error = AdmissionLayer::builder().count(usize::MAX).build().unwrap_err();
/// assert!(matches!(error, BuildError::Capacity(_)));
/// let cause = error.source().unwrap().to_string();
/// assert!(!error.to_string().contains(&cause), "said once, by the source");
/// # Ok::<(), BuildError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// A limit is beyond what its ledger represents.
    Capacity(CapacityError),
    /// A limit of 0 was set (`count`, `bytes`, `max_request_bytes`, a per-key cap or
    /// `max_keys`; named here). It would refuse every request: to set no limit, leave the
    /// setter out (or pass `None` to `count`, `bytes` and `max_request_bytes`).
    ZeroLimit(&'static str),
    /// A connection bound of 0 was set in [`ConnectionLimits`](crate::ConnectionLimits)
    /// (`max_connections`, `max_per_address`, `max_streams`, `head_within`, `idle` or
    /// `ping`; named here). It would close or refuse every connection or h2 stream: for
    /// no bound, pass `None`.
    ZeroConnectionLimit(&'static str),
    /// A per-key cap or `max_keys` was set for a layer over a shared gate, whose limits
    /// are the gate's: use [`PerKey::gate_cap`](crate::PerKey::gate_cap).
    LimitsOnSharedGate,
    /// [`PerKey::gate_cap`](crate::PerKey::gate_cap) on a layer with a gate of its own,
    /// which has no per-key cap to take: give the cap with
    /// [`PerKey::new`](crate::PerKey::new).
    NoKeyCap,
    /// Fair shares that cannot work: `FairShare::per_key` on a layer without a per-key
    /// cap, `FairShare::by` on a layer with one (one key tells clients apart), fair
    /// shares on a shared gate (they are the gate's:
    /// [`GateBuilder::fair_share`](admission_core::GateBuilder::fair_share)), without a
    /// count limit, or a headroom outside 0 to 1. It says which.
    FairShare(&'static str),
    /// A key extractor for a shared gate without a per-key dimension: no request would
    /// ever be capped by its key.
    NoKeyedLedger,
    /// Both a fixed count and an adaptive limit: the adaptive limit sets the count.
    CountAndAdaptive,
    /// The adaptive limit's bounds are invalid, or its count ledger (a shared gate's) is
    /// driven by another adaptive limit already.
    Adaptive(AdaptiveError),
    /// The memory limit a [`MemoryShare`](crate::MemoryShare) is a share of could not be
    /// read: the error names the file (or says the platform has none).
    Memory(MemoryError),
    /// A [`MemoryShare`](crate::MemoryShare) of 0 or less, or above 1.
    MemoryShare,
    /// Both `bytes` and `bytes_share`: the budget is one or the other.
    BytesAndShare,
    /// Priority classes without a count limit (a `count`, an `adaptive` limit or a
    /// shared gate's count): a class is a share of the count, and with none, every class
    /// is admitted alike.
    PriorityWithoutCount,
    /// A priority class whose share of the smallest count limit the layer can have (the
    /// fixed count, the adaptive limit's minimum, or the shared gate's count) rounds
    /// down to 0: every request of that class would be refused with nothing in flight.
    ClassShareRoundsToZero {
        /// The class's name.
        class: String,
        /// Its share, in percent.
        share: u8,
        /// The count limit at which it rounds to 0.
        limit: u64,
    },
    /// [`Retries`](crate::Retries) without a count limit (a `count`, an `adaptive` limit
    /// or a shared gate's count): a retry's share is a share of the count.
    RetriesWithoutCount,
    /// A [`Retries::share`](crate::Retries::share) of 0 or above 100.
    RetryShare(u8),
    /// The retries of a class (the least important, which has the smallest share) would
    /// be refused with nothing in flight at the smallest count limit the layer can have:
    /// their share of it rounds down to 0.
    RetryShareRoundsToZero {
        /// The class's name (`None` on a layer without priority classes).
        class: Option<String>,
        /// The share of the count its retries may fill, in percent.
        share: u8,
        /// The count limit at which it rounds to 0.
        limit: u64,
    },
    /// A [`Wait`](crate::Wait) without a count limit (a `count`, an `adaptive` limit or
    /// a shared gate's count) to wait for: nothing would ever wait.
    WaitWithoutCount,
    /// A [`Wait`](crate::Wait) that lets nothing wait: `max_waiting` or `max_wait` of 0
    /// (named here). To shed at once, leave `wait` out.
    EmptyWait(&'static str),
    /// The per-key leases ([`PerKey::leased`](crate::PerKey::leased), admission-redis's
    /// `FleetCap`) serve another layer already: each layer needs leases of its own.
    LeasesTaken,
}

/// What a drain given a deadline ([`AdmissionLayer::drain_within`](crate::AdmissionLayer::drain_within))
/// left in flight when the deadline came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Undrained {
    /// Admitted requests still running (their response bodies not ended).
    pub requests: u64,
}

impl fmt::Display for Undrained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "drain deadline passed with {} admitted requests in flight",
            self.requests
        )
    }
}

impl std::error::Error for Undrained {}

impl From<AdaptiveError> for BuildError {
    fn from(error: AdaptiveError) -> Self {
        BuildError::Adaptive(error)
    }
}

impl From<CapacityError> for BuildError {
    fn from(error: CapacityError) -> Self {
        BuildError::Capacity(error)
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Capacity(_) => f.write_str("a limit is out of range"),
            // A per-key cap and `max_keys` are plain numbers: only leaving them out
            // sets no limit.
            BuildError::ZeroLimit(what @ ("per-key cap" | "max_keys")) => write!(
                f,
                "a {what} of 0 would refuse every request; for no limit, leave it out"
            ),
            BuildError::ZeroLimit(what) => write!(
                f,
                "`{what}` of 0 would refuse every request; for no limit, leave it out or pass `None`"
            ),
            BuildError::ZeroConnectionLimit(what) => write!(
                f,
                "a connection limit `{what}` of 0 would close or refuse every connection or stream; \
                 for no bound, pass `None`"
            ),
            BuildError::LeasesTaken => f.write_str(
                "the per-key leases (a `FleetCap`) serve another layer already; give each layer its own",
            ),
            BuildError::LimitsOnSharedGate => f.write_str(
                "a per-key cap or `max_keys` was set on a layer over a shared gate; \
                 set them on the gate and use `PerKey::gate_cap`",
            ),
            BuildError::FairShare(why) => write!(f, "fair shares: {why}"),
            BuildError::NoKeyCap => f.write_str(
                "`PerKey::gate_cap` on a layer with a gate of its own; give a cap with `PerKey::new`",
            ),
            BuildError::NoKeyedLedger => {
                f.write_str("a key extractor for a shared gate without a per-key limit")
            }
            BuildError::CountAndAdaptive => {
                f.write_str("both `count` and `adaptive` were set; the adaptive limit sets the count")
            }
            BuildError::Adaptive(_) => f.write_str("invalid adaptive limit"),
            BuildError::Memory(_) => {
                f.write_str("the memory limit for `bytes_share` could not be read")
            }
            BuildError::MemoryShare => {
                f.write_str("a memory share must be above 0 and at most 1")
            }
            BuildError::BytesAndShare => f.write_str(
                "both `bytes` and `bytes_share` were set; the byte budget is one or the other",
            ),
            BuildError::PriorityWithoutCount => f.write_str(
                "priority classes without a count limit (`count` or `adaptive`) never refuse anything",
            ),
            BuildError::ClassShareRoundsToZero {
                class,
                share,
                limit,
            } => write!(
                f,
                "priority class `{class}` ({share}%) of a count limit of {limit} rounds down to 0 \
                 and would refuse all its requests; raise the count (or the adaptive minimum) \
                 to at least {}",
                100_u64.div_ceil(u64::from(*share))
            ),
            BuildError::RetriesWithoutCount => f.write_str(
                "`retries` without a count limit (`count` or `adaptive`) never refuse anything",
            ),
            BuildError::RetryShare(share) => write!(
                f,
                "a retry share of {share}%: it must be between 1 and 100"
            ),
            BuildError::RetryShareRoundsToZero {
                class,
                share,
                limit,
            } => {
                let of = class
                    .as_ref()
                    .map_or_else(String::new, |class| format!(" of class `{class}`"));
                write!(
                    f,
                    "retries{of} may fill {share}% of the count, which at a count limit of \
                     {limit} rounds down to 0: they would all be refused; raise the count \
                     (or the adaptive minimum) to at least {}, or the retry share",
                    100_u64.div_ceil(u64::from(*share))
                )
            }
            BuildError::WaitWithoutCount => f.write_str(
                "a `wait` without a count limit (`count` or `adaptive`) never waits",
            ),
            BuildError::EmptyWait(what) => write!(
                f,
                "a `wait` with `{what}` of 0 lets nothing wait; to shed at once, leave `wait` out"
            ),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Capacity(error) => Some(error),
            BuildError::Adaptive(error) => Some(error),
            BuildError::Memory(error) => Some(error),
            _ => None,
        }
    }
}

/// The error a response body ends in when its client did not take it at the minimum send
/// rate ([`SlowClients::min_response_rate`](crate::SlowClients::min_response_rate)): the
/// layer has released its permits, and the server, seeing the error, resets the h2 stream
/// or closes the HTTP/1.1 connection. Found by downcasting the body's error.
///
/// ```
/// use std::error::Error;
/// use admission_tower::Stalled;
///
/// let error: Box<dyn Error + Send + Sync> = Box::new(Stalled);
/// assert!(error.is::<Stalled>());
/// assert_eq!(error.to_string(), "response not taken at the minimum send rate");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stalled;

impl fmt::Display for Stalled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("response not taken at the minimum send rate")
    }
}

impl std::error::Error for Stalled {}
