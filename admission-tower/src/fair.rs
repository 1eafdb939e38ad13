//! `FairShare`: each client's share of the count when the server is full.

use std::fmt;

use admission_core::Key;
use http::request::Parts;

use crate::per_key::KeyFn;

/// Fair shares between clients when the server is full: for
/// [`AdmissionBuilder::fair_share`](crate::AdmissionBuilder::fair_share).
///
/// A per-key cap is a fixed number: low, and a lone client cannot use an idle server;
/// high, and a heavy client takes most of what frees up when it is full. A fair share
/// moves with the load: a client's share is the count (its class's share of it, with
/// priority classes) over the clients with work, rounded up. What it does depends on
/// whether the layer waits ([`Wait`](crate::Wait)):
///
/// - **Without a wait: fair shedding.** While no more than the headroom's slots are free,
///   a request from a client holding its share or more is refused (429 +
///   `Retry-After`), one from a client below its share admitted: the last free slots are
///   kept for the light clients, and the heavy one is shed first. A lone client still
///   uses the whole count. The headroom moves with need: at least an eighth of the count
///   (rounded up; [`headroom`](Self::headroom)), one slot more each time a client below
///   its share finds the count full, one fewer after each 8,192 requests in which none
///   did, at most half the count. Its cost is those slots idling while the light clients
///   do not use them: in the `fairness` example (10 workers, two clients 1:10 at twice
///   the capacity) the light client is served about 97% of what it asks, and the
///   workers are about 70% busy.
/// - **With a wait: fair turns.** Waiting clients take turns at the slots that free, one
///   each in turn, whatever the number of waiters each has (newest first within a client
///   once the queue stands, so the wait's CoDel rule holds); in a full queue a client
///   with fewer waiters takes the place of the oldest waiter of the client with the most.
///   No slot is kept idle: the queue serves the light client as soon as a slot frees (in
///   the example, over 99% of what it asks, the workers 100% busy). Prefer it where
///   requests may wait a few milliseconds.
///
/// Clients with work are those seen among roughly the last 8,192 to 16,384 requests,
/// whether or not one is in flight (a light client between two requests keeps its
/// share). Memory is fixed, 3 KiB, whatever the number of clients.
///
/// ```
/// use admission_tower::{key, AdmissionLayer, FairShare, PerKey};
/// use http::HeaderName;
///
/// let tenant = || key::header(HeaderName::from_static("x-tenant"));
/// // A key of its own:
/// let layer = AdmissionLayer::builder()
///     .count(64)
///     .fair_share(FairShare::by(tenant()))
///     .build()?;
/// # drop(layer);
/// // Or the per-key cap's key, with a cap as well:
/// let layer = AdmissionLayer::builder()
///     .count(64)
///     .per_key(PerKey::new(48, tenant()))
///     .fair_share(FairShare::per_key().headroom(0.25))
///     .build()?;
/// # drop(layer);
/// # Ok::<(), admission_tower::BuildError>(())
/// ```
pub struct FairShare {
    /// The key of its own; `None`: the per-key cap's.
    pub(crate) key: Option<KeyFn>,
    /// The headroom, per mille of the count.
    pub(crate) headroom: u32,
}

impl FairShare {
    /// Shares between the clients the per-key cap tells apart
    /// ([`AdmissionBuilder::per_key`](crate::AdmissionBuilder::per_key), which the layer
    /// must then have).
    pub fn per_key() -> Self {
        Self {
            key: None,
            headroom: 125,
        }
    }

    /// Shares between the clients `key` tells apart, on a layer without a per-key cap.
    /// A request without a key shares [`Key::MISSING`] with every other.
    pub fn by<F>(key: F) -> Self
    where
        F: Fn(&Parts) -> Option<Key> + Send + Sync + 'static,
    {
        Self {
            key: Some(Box::new(key)),
            headroom: 125,
        }
    }

    /// The least headroom: the fraction of the count kept, when the server is nearly
    /// full, for clients below their share (rounded up, at least one slot; without a
    /// wait), which clients below their share turned away widen. 0.125 by default;
    /// `build` refuses a fraction outside 0 to 1 ([`BuildError::FairShare`](crate::BuildError::FairShare)).
    pub fn headroom(mut self, fraction: f64) -> Self {
        self.headroom = if (0.0..=1.0).contains(&fraction) {
            (fraction * 1000.0).round() as u32
        } else {
            u32::MAX
        };
        self
    }
}

impl fmt::Debug for FairShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairShare")
            .field("own_key", &self.key.is_some())
            .field("headroom_per_mille", &self.headroom)
            .finish()
    }
}
