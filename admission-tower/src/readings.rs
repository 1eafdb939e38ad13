//! What a layer tells its operator: a reading of its state ([`AdmissionSnapshot`]), and
//! each refusal as it happens ([`RefusalEvent`], for the refusal hook).

use admission_core::adaptive::AdaptiveSnapshot;
use admission_core::memory::MemoryLimit;
use admission_core::{GateSnapshot, Priority};
use admission_http::Refusal;
use http::request::Parts;

/// What the refusal hook sees: the refused request's head and why it was refused.
#[derive(Debug)]
#[non_exhaustive]
pub struct RefusalEvent<'a> {
    /// The request's method, URI, headers and extensions.
    pub request: &'a Parts,
    /// Why it was refused.
    pub refusal: Refusal,
    /// The request's priority class, on a layer with classes
    /// ([`AdmissionBuilder::priority`](crate::AdmissionBuilder::priority)).
    pub priority: Option<Priority>,
    /// The name of that class in the layer's table.
    pub class: Option<&'a str>,
    /// The request said it is a retry, on a layer that sheds retries first
    /// ([`AdmissionBuilder::retries`](crate::AdmissionBuilder::retries)).
    pub retry: bool,
    /// True in dry-run mode: the request is admitted all the same.
    pub dry_run: bool,
    /// How long it waited for a count slot before it was refused (zero if it did not
    /// wait: see [`Wait`](crate::Wait)).
    pub waited: std::time::Duration,
}

/// A reading of the layer: its gate's ledgers, and what the layer itself counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct AdmissionSnapshot {
    /// Every configured ledger: in flight, limit, high-water mark, refusals.
    pub gate: GateSnapshot,
    /// Requests refused in dry-run mode and admitted anyway.
    pub would_shed: u64,
    /// Request bodies cut for arriving slower than the minimum rate
    /// ([`SlowClients`](crate::SlowClients)).
    pub too_slow: u64,
    /// With an adaptive limit: the limit it has set (also `gate.count.capacity`), whether
    /// an operator fixed it, and its last window.
    pub adaptive: Option<AdaptiveSnapshot>,
    /// The wait for a count slot ([`Wait`](crate::Wait)): how many wait now, and what
    /// came of those that waited.
    pub wait: WaitSnapshot,
    /// Requests let go because their client went away while they waited for a slot or
    /// while their handler ran (their body failed: a hang-up, a reset, or what is not a
    /// body): never handed to the handler, or its future dropped, and their permits
    /// released. (A client that goes while its response streams is not counted here: its
    /// body's end releases the permits as any end does.)
    pub gone: u64,
    /// Responses whose permits the layer took back because their client did not take
    /// them at the minimum send rate ([`SlowClients::min_response_rate`]): their bodies
    /// then end in an error, and the server resets the h2 stream or closes the HTTP/1.1
    /// connection.
    ///
    /// [`SlowClients::min_response_rate`]: crate::SlowClients::min_response_rate
    pub stalled: u64,
    /// The memory limit the byte budget was sized from, with a
    /// [`MemoryShare`](crate::MemoryShare): its bytes and what sets it.
    pub memory: Option<MemoryLimit>,
}

/// What came of the requests that found the count full, on a layer with a
/// [`Wait`](crate::Wait) (all zero without one).
///
/// With a wait, each such request is counted once, where its wait ended: admitted
/// (`admitted`), refused when it ran out (`timed_out`) or at once for its client's
/// deadline (`deadline`), or gone with its client ([`AdmissionSnapshot::gone`]). The
/// count ledger's own refusal counter (`gate.count.refused`) counts only what it
/// refused without a wait: a full queue (`max_waiting`), or a closed layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WaitSnapshot {
    /// Requests waiting for a slot now.
    pub waiting: u64,
    /// Requests admitted after waiting.
    pub admitted: u64,
    /// Their waits added up, in microseconds.
    pub waited_micros: u64,
    /// Requests refused when their wait ran out: `max_wait`, their client's deadline, or,
    /// in a standing queue, the target once a newer request came.
    pub timed_out: u64,
    /// Requests refused at once because their client's deadline left no time to wait
    /// and answer.
    pub deadline: u64,
}
