//! `FleetCap`: one key's cap across every replica, leased out in slots.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use admission_core::{Key, KeyState, KeyedLedger};
use admission_tower::{Leases, LeasesTaken, PerKey};
use http::request::Parts;
use parking_lot::RwLock;

use crate::config::{Config, FleetCapBuilder};
use crate::error::FleetError;
use crate::listen::listen;
use crate::names::{nameable, replica_name};
use crate::script;
use crate::state::{Counters, Inner, TICKS};
use crate::store::{Backend, Store};
use crate::upkeep::upkeep;

/// A cap on each key's requests in flight across every replica that shares a Redis (or
/// Valkey): each replica holds a lease of slots for each key with work in flight and
/// admits against it in-process, as [`PerKey`] does; Redis is asked only to grow a lease
/// that is used up, to renew leases, and to take back what a key no longer uses.
///
/// Build one per server with [`FleetCap::builder`], and hand the layer its
/// [`per_key`](Self::per_key) in place of a `PerKey`. See the [crate docs](crate) for what
/// it costs and what happens when Redis goes away.
#[derive(Clone)]
pub struct FleetCap {
    pub(crate) inner: Arc<Inner>,
}

/// A reading of a [`FleetCap`]: what this replica holds and what it asked of Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct FleetSnapshot {
    /// Keys with a lease here (or a grant under way).
    pub keys: usize,
    /// The slots those leases hold, in all.
    pub slots: usize,
    /// The replicas last counted live in Redis (the builder's
    /// [`replicas`](FleetCapBuilder::replicas) until then; 0 if it gave none).
    pub replicas: usize,
    /// Whether Redis is out of reach and every key held to the fallback's cap.
    pub fallback: bool,
    /// Times this replica went on its fallback.
    pub fallbacks: u64,
    /// Calls made to Redis: grants, renewals, returns and heartbeats.
    pub calls: u64,
    /// Of those, the ones that failed or ran out of time.
    pub errors: u64,
    /// Grants smaller than asked: the key's cap was held by the fleet.
    pub short: u64,
    /// Times this replica gave back slots it did not use, at once, because another
    /// replica waited for them.
    pub given_back: u64,
}

impl FleetCapBuilder {
    /// The cap, its upkeep started on the current tokio runtime (call it inside one).
    /// Nothing waits on Redis here: a replica built while Redis is out of reach starts on
    /// its fallback (see [`Fallback::Share`](crate::Fallback::Share) for the share it runs on then).
    ///
    /// # Errors
    ///
    /// [`FleetError`] names a setting of 0, a grant timeout not below a third of the time
    /// to live, or a client that cannot be set up.
    pub fn build(self) -> Result<FleetCap, FleetError> {
        let (config, store) = self.checked()?;
        FleetCap::start(config, store)
    }
}

impl FleetCap {
    /// A fleet-wide cap of `cap` requests in flight per key, kept in `store`: a
    /// [`redis::Client`], or a Sentinel or Cluster [`Store`](crate::Store); see
    /// [`FleetCapBuilder`](FleetCapBuilder) for the rest.
    pub fn builder(store: impl Into<Store>, cap: usize) -> FleetCapBuilder {
        FleetCapBuilder::new(store.into(), cap)
    }

    /// Starts the cap's upkeep (heartbeats, renewals, returns) on the current tokio
    /// runtime, to run once a layer uses the cap. Nothing waits on Redis here: a replica
    /// started while Redis is out of reach starts on its fallback.
    pub(crate) fn start(config: Config, store: Store) -> Result<Self, FleetError> {
        let store = Backend::new(store, config.grant_timeout).map_err(FleetError::Redis)?;
        let replica = replica_name();
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (attach, attached) = tokio::sync::oneshot::channel();
        let label = OnceLock::new();
        if let Some(name) = &config.name {
            let _ = label.set(name.clone());
        }
        let inner = Arc::new(Inner {
            replicas: AtomicUsize::new(config.replicas.unwrap_or(0)),
            channel: format!("{}:leases", config.prefix),
            label,
            waiting: parking_lot::Mutex::default(),
            _stop: stop,
            attach: parking_lot::Mutex::new(Some(attach)),
            config,
            replica,
            store,
            grant: redis::Script::new(script::GRANT),
            heartbeat: redis::Script::new(script::HEARTBEAT),
            leases: RwLock::new(HashMap::with_hasher(KeyState::new())),
            keyed: OnceLock::new(),
            fallback: AtomicBool::new(false),
            rejoining: AtomicUsize::new(usize::MAX),
            pending: AtomicUsize::new(0),
            tick: AtomicU64::new(0),
            counters: Counters::default(),
        });
        tokio::spawn(upkeep(Arc::downgrade(&inner), attached));
        tokio::spawn(listen(Arc::downgrade(&inner), stopped));
        spawn_clock(Arc::downgrade(&inner))?;
        Ok(Self { inner })
    }

    /// The per-key dimension for a layer: requests told apart by `key`, each key capped
    /// across the fleet. One `FleetCap` serves one layer: a second layer built with it
    /// fails with [`BuildError::LeasesTaken`](admission_tower::BuildError::LeasesTaken).
    ///
    /// ```no_run
    /// use admission_redis::FleetCap;
    /// use admission_tower::{key, AdmissionLayer};
    ///
    /// # async fn server() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1/")?;
    /// let fleet = FleetCap::builder(client, 16).build()?;
    /// let tenant = key::header(http::HeaderName::from_static("x-tenant"));
    /// let layer = AdmissionLayer::builder().count(512).per_key(fleet.per_key(tenant)).build()?;
    /// # drop(layer);
    /// # Ok(())
    /// # }
    /// ```
    pub fn per_key<F>(&self, key: F) -> PerKey
    where
        F: Fn(&Parts) -> Option<Key> + Send + Sync + 'static,
    {
        PerKey::new(self.inner.config.cap, key).leased(Arc::new(self.clone()))
    }

    /// What this replica holds and what it asked of Redis.
    pub fn snapshot(&self) -> FleetSnapshot {
        let inner = &self.inner;
        let leases = inner.leases.read();
        let counters = &inner.counters;
        FleetSnapshot {
            keys: leases.len(),
            slots: leases.values().map(|lease| lease.granted).sum(),
            replicas: inner.replicas.load(Ordering::Relaxed),
            fallback: inner.on_fallback(),
            fallbacks: counters.fallbacks.load(Ordering::Relaxed),
            calls: counters.calls.load(Ordering::Relaxed),
            errors: counters.errors.load(Ordering::Relaxed),
            short: counters.short.load(Ordering::Relaxed),
            given_back: counters.given_back.load(Ordering::Relaxed),
        }
    }

    /// The slots this replica holds for `key` now: its cap here.
    pub fn held(&self, key: &Key) -> usize {
        Leases::cap(self, key)
    }

    /// Gives every lease back to Redis, for a replica that shuts down: the others may
    /// take the whole cap at once rather than after the leases' time to live. Call it
    /// once the server has finished its requests; a key with requests still in flight
    /// keeps what they hold.
    pub async fn release(&self) {
        let keys: Vec<Key> = self.inner.leases.read().keys().copied().collect();
        for key in keys {
            self.inner.settle(key, true).await;
        }
    }
}

/// The cap's clock: a thread that moves `tick` every sixth of the TTL until the cap is
/// dropped.
fn spawn_clock(inner: std::sync::Weak<Inner>) -> Result<(), FleetError> {
    let every = match inner.upgrade() {
        Some(inner) => inner.config.ttl / TICKS as u32,
        None => return Ok(()),
    };
    std::thread::Builder::new()
        .name("admission-redis clock".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                match inner.upgrade() {
                    Some(inner) => inner.tick.fetch_add(1, Ordering::Relaxed),
                    None => return,
                };
            }
        })
        .map(drop)
        .map_err(FleetError::Thread)
}

impl Leases for FleetCap {
    #[inline]
    fn cap(&self, key: &Key) -> usize {
        let inner = &self.inner;
        if inner.on_fallback() || !nameable(key) {
            return inner.fallback_cap();
        }
        inner
            .leases
            .read()
            .get(key)
            // A lease Redis may no longer count (its renewal held up past the TTL) is not
            // used: the request asks to grow it, which renews it.
            .filter(|lease| lease.expires > inner.tick.load(Ordering::Relaxed))
            .map_or(0, |lease| lease.granted)
    }

    fn grow(&self, key: &Key) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        let (inner, key) = (self.inner.clone(), *key);
        Box::pin(async move { inner.grow(key).await })
    }

    fn attach(&self, keyed: &KeyedLedger<Key>, layer: &str) -> Result<(), LeasesTaken> {
        // One layer a cap: a second layer's build fails.
        self.inner
            .keyed
            .set(keyed.clone())
            .map_err(|_| LeasesTaken)?;
        // The layer's name, unless the builder gave one.
        let _ = self.inner.label.set(layer.to_owned());
        if let Some(attach) = self.inner.attach.lock().take() {
            let _ = attach.send(());
        }
        Ok(())
    }
}

impl fmt::Debug for FleetCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetCap")
            .field("replica", &self.inner.replica)
            .field("config", &self.inner.config)
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use admission_core::Key;
    use std::sync::atomic::Ordering;

    use admission_tower::Leases;

    use super::FleetCap;

    /// A lease whose renewal was held up past its TTL (the upkeep starved of CPU, say)
    /// is not used: Redis may have let its slots go to another replica. A request then
    /// asks to grow it, which renews it.
    #[tokio::test]
    async fn a_lease_past_its_ttl_is_not_used() {
        // Nothing listens there: nothing here calls Redis.
        let client = redis::Client::open("redis://127.0.0.1:1/").expect("a client");
        let fleet = FleetCap::builder(client, 12)
            .ttl(Duration::from_secs(3))
            .build()
            .expect("a fleet cap");
        let key = Key::from("acme");
        let lock = fleet.inner.lock(key);
        drop(lock);
        let set = |expires: u64| {
            let mut leases = fleet.inner.leases.write();
            let lease = leases.get_mut(&key).expect("the entry");
            (lease.granted, lease.expires) = (5, expires);
        };
        fleet.inner.tick.store(10, Ordering::Relaxed);
        set(11);
        assert_eq!(fleet.cap(&key), 5, "within its TTL");
        set(10);
        assert_eq!(fleet.cap(&key), 0, "past its TTL");
        // The clock moves on its own: a tick every sixth of the TTL.
        let fast = FleetCap::builder(redis::Client::open("redis://127.0.0.1:1/").unwrap(), 1)
            .ttl(Duration::from_millis(60))
            .grant_timeout(Duration::from_millis(5))
            .build()
            .expect("a fleet cap");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(fast.inner.tick.load(Ordering::Relaxed) >= 2);
    }
}
