//! The settings a layer is built with: made once, read by every request, never changed.

use admission_core::memory::MemoryLimit;
use admission_core::{AdaptiveLimit, Classes, Gate, Priority};
use admission_http::Refusals;
use http::request::Parts;

use crate::observe::Observer;
use crate::pacer::Pacing;
use crate::per_key::KeyPolicy;
use crate::readings::RefusalEvent;
use crate::{Retries, SampleAt, SlowClients};

pub(crate) type BypassFn = Box<dyn Fn(&Parts) -> bool + Send + Sync>;
pub(crate) type ClassifyFn = Box<dyn Fn(&Parts, &Classes) -> Priority + Send + Sync>;
pub(crate) type HookFn = Box<dyn Fn(&RefusalEvent<'_>) + Send + Sync>;
pub(crate) type SeatsFn = Box<dyn Fn(&Parts) -> u32 + Send + Sync>;

/// What a layer was built with: its gate and what it reads of a request, how it answers
/// and reports, and the rates it keeps. `build` assembles it from a builder's checked
/// draft; [`Settings::over`] is every setting off, which `AdmissionLayer::off` uses as it
/// is and `build` starts from.
pub(crate) struct Settings {
    pub(crate) gate: Gate,
    pub(crate) keys: Option<KeyPolicy>,
    pub(crate) bypass: Option<BypassFn>,
    pub(crate) classes: Option<(Classes, ClassifyFn)>,
    /// Each request's count slots, where some cost more than one.
    pub(crate) seats: Option<SeatsFn>,
    /// Retries shed first, if the layer says so.
    pub(crate) retries: Option<Retries>,
    pub(crate) refusals: Refusals,
    pub(crate) hook: Option<HookFn>,
    pub(crate) dry_run: bool,
    pub(crate) observer: Observer,
    /// The adaptive limit driving the count, if any.
    pub(crate) adaptive: Option<AdaptiveLimit>,
    /// Where requests are sampled for it (`None` without one).
    pub(crate) sample_at: Option<SampleAt>,
    pub(crate) slow: SlowClients,
    /// The minimum send rate responses keep, if they keep one (`SlowClients`).
    pub(crate) pacer: Option<Pacing>,
    /// The wait for a count slot, if the layer has one.
    #[cfg(feature = "tokio")]
    pub(crate) wait: Option<crate::Wait>,
    /// Waiting clients take turns by their keys ([`crate::FairShare`] with a wait).
    #[cfg(feature = "tokio")]
    pub(crate) turns: bool,
    /// The memory limit a byte budget was sized from ([`crate::MemoryShare`]).
    pub(crate) memory: Option<MemoryLimit>,
    /// The thread keeping that budget following the process's use, stopped on drop.
    pub(crate) _follower: Option<crate::memory::Follower>,
}

impl Settings {
    /// The settings of a layer over `gate` that reads nothing of a request but the count,
    /// waits for nothing, keeps no rate, reports nothing and answers as
    /// [`Refusals::new`] does.
    pub(crate) fn over(gate: Gate) -> Self {
        Self {
            gate,
            keys: None,
            bypass: None,
            classes: None,
            seats: None,
            retries: None,
            refusals: Refusals::new(),
            hook: None,
            dry_run: false,
            observer: Observer::default(),
            adaptive: None,
            sample_at: None,
            slow: SlowClients::off(),
            pacer: None,
            #[cfg(feature = "tokio")]
            wait: None,
            #[cfg(feature = "tokio")]
            turns: false,
            memory: None,
            _follower: None,
        }
    }

    /// Whether a request that finds the count full may wait for a slot.
    pub(crate) fn waits(&self) -> bool {
        #[cfg(feature = "tokio")]
        return self.wait.is_some();
        #[cfg(not(feature = "tokio"))]
        false
    }
}
