//! A layer's minimum send rate for responses, and the table by which a permit names it.
//!
//! An admitted request names its layer's [`Pacer`] by a number ([`PacerId`]), not by a
//! reference-counted handle: every admitted request carries one, and cloning a handle
//! would add an atomic read-modify-write, on a line every request shares, to admission.
//! The number is looked up only where the pacer is needed: when a response with a body
//! starts to wait on its client (for its rate, and then to count it if it stalls).

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use admission_http::MinDataRate;
use slab::Slab;

use crate::observe::StallReport;

/// A request's extension, which `serve` inserts in each HTTP/2 request it serves: the
/// stream's response is polled by `serve`'s stream executor to its end (or dropped), at
/// the stream's own pace, so its body holds its permits until the last poll, not just
/// until it hands its last frame over (which may still wait on the client).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServedStream;

/// Whether a request's extensions say `serve` polls its response to its end.
#[inline]
pub(crate) fn served_stream(extensions: &http::Extensions) -> bool {
    cfg!(feature = "serve") && extensions.get::<ServedStream>().is_some()
}

/// What a layer's response bodies keep to the minimum send rate with: the rate, and the
/// count of responses whose permits the sweep took back.
pub(crate) struct Pacer {
    rate: MinDataRate,
    stalled: AtomicU64,
    report: StallReport,
}

impl Pacer {
    /// The minimum rate at which a response must be taken.
    pub(crate) fn rate(&self) -> MinDataRate {
        self.rate
    }

    /// A response's permits went because its client did not take it.
    pub(crate) fn stalled(&self) {
        self.stalled.fetch_add(1, Ordering::Relaxed);
        self.report.stalled();
    }
}

/// The pacers of the layers alive, each with the generation it was registered in (a
/// slab reuses places: an id of a layer gone finds nothing, not its successor's).
struct Table {
    slab: Slab<(u32, Arc<Pacer>)>,
    generation: u32,
}

static TABLE: RwLock<Table> = RwLock::new(Table {
    slab: Slab::new(),
    generation: 0,
});

/// A layer's pacer, as a permit names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PacerId(NonZeroU64);

impl PacerId {
    /// The pacer, while its layer is alive.
    pub(crate) fn pacer(self) -> Option<Arc<Pacer>> {
        let key = (self.0.get() >> 32) as usize - 1;
        let generation = self.0.get() as u32;
        let table = TABLE.read().unwrap_or_else(PoisonError::into_inner);
        match table.slab.get(key) {
            Some((registered, pacer)) if *registered == generation => Some(pacer.clone()),
            _ => None,
        }
    }
}

/// A layer's pacer, registered in the table for as long as the layer lives.
pub(crate) struct Pacing {
    id: PacerId,
    pacer: Arc<Pacer>,
}

impl Pacing {
    /// Registers a pacer that keeps `rate` and reports stalls through `report`.
    pub(crate) fn new(rate: MinDataRate, report: StallReport) -> Self {
        let pacer = Arc::new(Pacer {
            rate,
            stalled: AtomicU64::new(0),
            report,
        });
        let mut table = TABLE.write().unwrap_or_else(PoisonError::into_inner);
        table.generation = table.generation.wrapping_add(1);
        let generation = table.generation;
        let key = table.slab.insert((generation, pacer.clone()));
        let id = ((key as u64 + 1) << 32) | u64::from(generation);
        let id = PacerId(NonZeroU64::new(id).expect("the key's half is at least 1"));
        Self { id, pacer }
    }

    /// How the layer's permits name it.
    pub(crate) fn id(&self) -> PacerId {
        self.id
    }

    /// Responses whose permits went because their clients did not take them.
    pub(crate) fn stalled(&self) -> u64 {
        self.pacer.stalled.load(Ordering::Relaxed)
    }
}

impl Drop for Pacing {
    fn drop(&mut self) {
        let key = (self.id.0.get() >> 32) as usize - 1;
        let mut table = TABLE.write().unwrap_or_else(PoisonError::into_inner);
        table.slab.try_remove(key);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use admission_http::MinDataRate;

    use super::Pacing;
    use crate::observe::StallReport;

    #[test]
    fn an_id_finds_its_pacer_while_its_layer_lives_and_never_another() {
        let rate = MinDataRate::new(100, Duration::from_secs(1));
        let pacing = Pacing::new(rate, StallReport::default());
        let id = pacing.id();
        let pacer = id.pacer().expect("registered");
        assert_eq!(pacer.rate(), rate);
        pacer.stalled();
        assert_eq!(pacing.stalled(), 1);
        drop(pacing);
        assert!(id.pacer().is_none(), "gone with its layer");
        // A later layer may take the same place; the old id does not find it.
        let later = Pacing::new(MinDataRate::default(), StallReport::default());
        assert!(id.pacer().is_none());
        assert_eq!(later.id().pacer().unwrap().rate(), MinDataRate::default());
    }
}
