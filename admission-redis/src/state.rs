//! What a fleet cap keeps: each key's lease, the connection to Redis, the counters.
//! Read and changed by the handle (`fleet.rs`) and by the work with Redis (`upkeep.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

use tokio::sync::Notify;

use admission_core::{Key, KeyState, KeyedLedger};
use parking_lot::RwLock;

use crate::config::Config;
use crate::store::Backend;

/// Ticks of the cap's clock in a TTL.
pub(crate) const TICKS: u64 = 6;

/// The tick from which a lease set by a call begun at tick `called` is no longer used: a
/// tick before Redis lets it go (the call's own time counted in, as it may have reached
/// Redis at once).
pub(crate) fn expiry(called: u64) -> u64 {
    called + TICKS - 1
}

/// One fleet cap's state, shared by its handles and its upkeep task.
pub(crate) struct Inner {
    pub(crate) config: Config,
    /// This replica's name in Redis.
    pub(crate) replica: String,
    pub(crate) store: Backend,
    pub(crate) grant: redis::Script,
    pub(crate) heartbeat: redis::Script,
    /// Each key with a lease, or with a grant under way.
    pub(crate) leases: RwLock<HashMap<Key, Lease, KeyState>>,
    /// Where the layer counts each key's requests in flight here.
    pub(crate) keyed: OnceLock<KeyedLedger<Key>>,
    /// The `name` of metrics and events: the builder's, else the layer's.
    pub(crate) label: OnceLock<String>,
    /// The channel the replicas tell each other of waiters and of slots given back on.
    pub(crate) channel: String,
    /// Keys whose grant came back short and that wait for another replica to give slots
    /// back: woken when one does, with how many wait.
    pub(crate) waiting: parking_lot::Mutex<HashMap<Key, (Arc<Notify>, usize), KeyState>>,
    /// The replicas last counted live (the builder's guess until Redis says; 0: none
    /// known, the fallback refuses).
    pub(crate) replicas: AtomicUsize,
    /// Redis could not be reached: every key is held to the fallback's cap.
    pub(crate) fallback: AtomicBool,
    /// Back from the fallback since the last upkeep round: another replica may still run
    /// on its fallback share, which Redis does not count, so each lease grows no further
    /// than the share this replica ran on, until the next round (`usize::MAX`: not
    /// rejoining).
    pub(crate) rejoining: AtomicUsize,
    /// A coarse clock in ticks of a sixth of the TTL, moved by a thread of the cap's own
    /// (the OS schedules it, not the runtime whose tasks may starve the upkeep): read on
    /// every request for a lease's expiry, at the cost of an atomic load.
    pub(crate) tick: AtomicU64,
    /// Grants asked for and not yet answered.
    pub(crate) pending: AtomicUsize,
    pub(crate) counters: Counters,
    /// Dropped with the cap: the listener on the channel stops.
    pub(crate) _stop: tokio::sync::oneshot::Sender<()>,
    /// Sent when a layer attaches the cap: its upkeep starts.
    pub(crate) attach: parking_lot::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

pub(crate) struct Lease {
    /// The slots Redis granted this replica (0: none yet).
    pub(crate) granted: usize,
    /// Serializes what changes this key's lease in Redis, so that the last answer is the
    /// one kept.
    pub(crate) lock: Arc<tokio::sync::Mutex<()>>,
    /// The slots Redis holds for this replica, as it last answered: a lease lowered
    /// here is lowered in Redis a round later.
    pub(crate) in_redis: usize,
    /// Renewal rounds in a row that found nothing in flight.
    pub(crate) idle_rounds: u32,
    /// When a grant last came back short (the fleet held the rest of the cap): the key
    /// is not asked again for a while, since what the others give back comes at their
    /// renewals.
    pub(crate) short_at: Option<tokio::time::Instant>,
    /// The key's fair share, as Redis last said (the cap while no replica waits): a lease
    /// does not grow past it.
    pub(crate) share: usize,
    /// The tick of the cap's clock (see `Inner::tick`) from which this lease is not used:
    /// a tick before Redis lets it go, counted from the start of the call that last set
    /// it. So an upkeep held up past the TTL (its task starved of the runtime, say) leaves
    /// no lease in use that Redis may have given to another replica.
    pub(crate) expires: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) calls: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) fallbacks: AtomicU64,
    pub(crate) given_back: AtomicU64,
    pub(crate) short: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::{TICKS, expiry};

    #[test]
    fn a_lease_is_used_until_a_tick_before_its_ttl() {
        assert_eq!(expiry(0), TICKS - 1);
        assert_eq!(expiry(10), 15);
    }
}
