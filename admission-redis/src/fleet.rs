//! `FleetCap`: one key's cap across every replica, leased out in slots.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use admission_core::{Key, KeyState, KeyedLedger};
use admission_tower::{Leases, PerKey};
use http::request::Parts;
use parking_lot::RwLock;
use redis::aio::ConnectionManager;

use crate::config::{Config, Fallback};
use crate::script;

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
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    config: Config,
    /// This replica's name in Redis.
    replica: String,
    redis: ConnectionManager,
    grant: redis::Script,
    heartbeat: redis::Script,
    /// Each key with a lease, or with a grant under way.
    leases: RwLock<HashMap<Key, Lease, KeyState>>,
    /// Where the layer counts each key's requests in flight here.
    keyed: OnceLock<KeyedLedger<Key>>,
    /// The replicas last counted live (the builder's guess until Redis says).
    replicas: AtomicUsize,
    /// Redis could not be reached: every key is held to the fallback's cap.
    fallback: AtomicBool,
    /// Grants asked for and not yet answered.
    pending: AtomicUsize,
    counters: Counters,
}

struct Lease {
    /// The slots Redis granted this replica (0: none yet).
    granted: usize,
    /// Serializes what changes this key's lease in Redis, so that the last answer is the
    /// one kept.
    lock: Arc<tokio::sync::Mutex<()>>,
    /// Renewal rounds in a row that found nothing in flight.
    idle_rounds: u32,
    /// When a grant last came back short (the fleet held the rest of the cap): the key
    /// is not asked again for a while, since what the others give back comes at their
    /// renewals.
    short_at: Option<tokio::time::Instant>,
    /// The key's fair share, as Redis last said (the cap while no replica waits): a lease
    /// does not grow past it.
    share: usize,
}

#[derive(Default)]
struct Counters {
    calls: AtomicU64,
    errors: AtomicU64,
    fallbacks: AtomicU64,
    short: AtomicU64,
}

/// A reading of a [`FleetCap`]: what this replica holds and what it asked of Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct FleetSnapshot {
    /// Keys with a lease here (or a grant under way).
    pub keys: usize,
    /// The slots those leases hold, in all.
    pub slots: usize,
    /// The replicas last counted live in Redis (the builder's guess until then).
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
}

impl FleetCap {
    /// A fleet-wide cap of `cap` requests in flight per key, kept on the Redis `client`
    /// points to; see [`FleetCapBuilder`](crate::FleetCapBuilder) for the rest.
    pub fn builder(client: redis::Client, cap: usize) -> crate::FleetCapBuilder {
        crate::FleetCapBuilder::new(client, cap)
    }

    /// Starts the cap's upkeep (heartbeats, renewals, returns) on the current tokio
    /// runtime. Nothing is sent to Redis before it is needed: a replica started while
    /// Redis is out of reach starts on its fallback.
    pub(crate) fn start(config: Config, client: redis::Client) -> Result<Self, redis::RedisError> {
        let timeout = Some(config.grant_timeout);
        let manager = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout)
            .set_number_of_retries(1);
        let redis = ConnectionManager::new_lazy_with_config(client, manager)?;
        let replica = replica_name();
        let inner = Arc::new(Inner {
            replicas: AtomicUsize::new(config.replicas.max(1)),
            config,
            replica,
            redis,
            grant: redis::Script::new(script::GRANT),
            heartbeat: redis::Script::new(script::HEARTBEAT),
            leases: RwLock::new(HashMap::with_hasher(KeyState::new())),
            keyed: OnceLock::new(),
            fallback: AtomicBool::new(false),
            pending: AtomicUsize::new(0),
            counters: Counters::default(),
        });
        tokio::spawn(upkeep(Arc::downgrade(&inner)));
        Ok(Self { inner })
    }

    /// The per-key dimension for a layer: requests told apart by `key`, each key capped
    /// across the fleet. One `FleetCap` serves one layer.
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
            .map_or(0, |lease| lease.granted)
    }

    fn grow(&self, key: &Key) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        let (inner, key) = (self.inner.clone(), *key);
        Box::pin(async move { inner.grow(key).await })
    }

    fn attach(&self, keyed: &KeyedLedger<Key>) {
        // One layer a cap: a second layer's ledger is not read.
        let _ = self.inner.keyed.set(keyed.clone());
    }
}

impl Inner {
    fn on_fallback(&self) -> bool {
        self.fallback.load(Ordering::Relaxed)
    }

    /// Each key's cap here while Redis is out of reach.
    fn fallback_cap(&self) -> usize {
        match self.config.fallback {
            Fallback::Share => self.config.cap / self.replicas.load(Ordering::Relaxed).max(1),
            Fallback::Closed => 0,
            Fallback::Local(cap) => cap.min(self.config.cap),
        }
    }

    fn in_flight(&self, key: &Key) -> usize {
        let held = self.keyed.get().map_or(0, |keyed| keyed.in_flight(key));
        usize::try_from(held).unwrap_or(usize::MAX)
    }

    /// Grows `key`'s lease by a chunk, if its requests here still fill it.
    async fn grow(self: Arc<Self>, key: Key) {
        if self.on_fallback() {
            return;
        }
        let Some(name) = lease_name(&self.config.prefix, &key) else {
            return;
        };
        // Bounded: past the most grants under way, a request is refused without asking.
        if self.pending.fetch_add(1, Ordering::Relaxed) >= self.config.max_pending {
            self.pending.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let lock = self.lock(key);
        let _held = lock.lock().await;
        self.grow_held(&key, &name).await;
        self.pending.fetch_sub(1, Ordering::Relaxed);
    }

    /// [`grow`](Self::grow), the key's lock held.
    async fn grow_held(&self, key: &Key, name: &[u8]) {
        let (current, short_at, share) = match self.leases.read().get(key) {
            Some(lease) => (lease.granted, lease.short_at, lease.share),
            None => return,
        };
        let in_flight = self.in_flight(key);
        let recently_short = short_at.is_some_and(|at| at.elapsed() < self.config.ttl / 10);
        if in_flight < current || recently_short {
            // Another request's grant came first, or the fleet holds the rest.
            return;
        }
        let want = (current.max(in_flight) + self.config.chunk)
            .min(self.config.cap)
            .min(share.max(current));
        if want <= current {
            return; // this replica holds the whole cap, or its fair share
        }
        if let Some((granted, fair)) = self.set(name, want).await {
            let short = (granted < want).then(tokio::time::Instant::now);
            if short.is_some() {
                self.counters.short.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(lease) = self.leases.write().get_mut(key) {
                // A grow never lowers the lease: Redis grants at least what it held.
                lease.granted = lease.granted.max(granted);
                lease.short_at = short;
                lease.share = fair;
            }
        }
    }

    /// The lock that serializes `key`'s changes in Redis (its entry made if it has none).
    fn lock(&self, key: Key) -> Arc<tokio::sync::Mutex<()>> {
        if let Some(lease) = self.leases.read().get(&key) {
            return lease.lock.clone();
        }
        let mut leases = self.leases.write();
        let lease = leases.entry(key).or_insert_with(|| Lease {
            granted: 0,
            lock: Arc::default(),
            idle_rounds: 0,
            short_at: None,
            share: self.config.cap,
        });
        lease.lock.clone()
    }

    /// Asks Redis to set this replica's lease of `name` to `want`: what it grants, and
    /// the key's fair share while other replicas wait (the cap while none do). `None`
    /// (and the fallback) if Redis could not answer in time.
    async fn set(&self, name: &[u8], want: usize) -> Option<(usize, usize)> {
        let mut invocation = self.grant.key(name);
        invocation
            .arg(&self.replica)
            .arg(want)
            .arg(self.config.cap)
            .arg(millis(self.config.ttl));
        let mut redis = self.redis.clone();
        self.call(invocation.invoke_async(&mut redis)).await
    }

    /// One call to Redis, bounded by the grant timeout; counted.
    async fn call<T>(&self, call: impl Future<Output = redis::RedisResult<T>>) -> Option<T> {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        let answer = match tokio::time::timeout(self.config.grant_timeout, call).await {
            Ok(Ok(value)) => Some(value),
            _ => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                self.set_fallback(true);
                None
            }
        };
        #[cfg(feature = "metrics")]
        {
            let outcome = if answer.is_some() { "ok" } else { "error" };
            let labels = [
                ("name", self.config.prefix.clone()),
                ("outcome", outcome.to_owned()),
            ];
            metrics::counter!("admission_fleet_redis_calls_total", &labels).increment(1);
        }
        answer
    }

    /// Goes on the fallback (`on`), or back to the fleet.
    fn set_fallback(&self, on: bool) {
        if self.fallback.swap(on, Ordering::Relaxed) != on && on {
            self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        {
            let labels = [("name", self.config.prefix.clone())];
            metrics::gauge!("admission_fleet_fallback", &labels).set(if on { 1.0 } else { 0.0 });
        }
    }

    /// Records the slots this replica holds (with the `metrics` feature).
    fn record_slots(&self) {
        #[cfg(feature = "metrics")]
        {
            let slots: usize = self.leases.read().values().map(|lease| lease.granted).sum();
            let labels = [("name", self.config.prefix.clone())];
            metrics::gauge!("admission_fleet_slots", &labels).set(slots as f64);
        }
    }

    /// One round of upkeep: the heartbeat (and, after a fallback, the return to the
    /// fleet), then each key's lease renewed, shrunk to what it uses, or given back.
    async fn round(&self) {
        let mut invocation = self
            .heartbeat
            .key(format!("{}:replicas", self.config.prefix));
        invocation.arg(&self.replica).arg(millis(self.config.ttl));
        let mut redis = self.redis.clone();
        let Some(live) = self
            .call(invocation.invoke_async::<usize>(&mut redis))
            .await
        else {
            return;
        };
        self.replicas.store(live.max(1), Ordering::Relaxed);
        if self.fallback.load(Ordering::Relaxed) {
            // Back: what Redis held for this replica has expired or is about to; each key
            // grows again from what is in flight (see `grow`), its grant overwriting any
            // lease of this replica Redis still holds.
            for lease in self.leases.write().values_mut() {
                lease.granted = 0;
                lease.short_at = None;
                lease.share = self.config.cap;
            }
            self.set_fallback(false);
            return;
        }
        let keys: Vec<Key> = self.leases.read().keys().copied().collect();
        for key in keys {
            self.settle(key, false).await;
            if self.on_fallback() {
                return;
            }
        }
        self.record_slots();
    }

    /// Renews `key`'s lease, in two steps so that no request is ever admitted on a slot
    /// Redis no longer counts: Redis is set to the cap this replica kept since the last
    /// round (or to what is in flight, if more), and only then is this replica's own cap
    /// lowered, for the next round, to what is in flight plus a chunk (at most the fair
    /// share while other replicas wait; nothing after two rounds with nothing in flight).
    /// A request that read the old cap as it was lowered has long been counted in flight
    /// when the next round sets Redis. With `release`, Redis is set to what is in flight at
    /// once (the caller has finished its requests).
    async fn settle(&self, key: Key, release: bool) {
        let Some(name) = lease_name(&self.config.prefix, &key) else {
            return;
        };
        let lock = self.lock(key);
        let _held = lock.lock().await;
        let in_flight = self.in_flight(&key);
        let (kept, idle) = {
            let mut leases = self.leases.write();
            let Some(lease) = leases.get_mut(&key) else {
                return;
            };
            lease.idle_rounds = if in_flight == 0 {
                lease.idle_rounds.saturating_add(1)
            } else {
                0
            };
            (lease.granted, release || lease.idle_rounds >= 2)
        };
        let want = if release {
            in_flight
        } else {
            kept.max(in_flight)
        };
        let want = want.min(self.config.cap);
        let answer = if kept == 0 && want == 0 {
            Some((0, self.config.cap)) // Redis holds nothing of this replica's for the key
        } else {
            self.set(&name, want).await
        };
        let Some((granted, fair)) = answer else {
            return;
        };
        let mut leases = self.leases.write();
        let Some(lease) = leases.get_mut(&key) else {
            return;
        };
        let target = if idle {
            0
        } else {
            in_flight + self.config.chunk
        };
        lease.granted = granted.min(target).min(fair);
        lease.share = fair;
        // Forgotten once Redis holds nothing of it, unless a grant waits for the key's
        // lock (it holds a clone of it).
        if granted == 0 && lease.granted == 0 && Arc::strong_count(&lock) == 2 {
            leases.remove(&key);
        }
    }
}

/// The upkeep of a cap, every third of the leases' time to live, until the cap is dropped.
async fn upkeep(inner: Weak<Inner>) {
    let every = match inner.upgrade() {
        Some(inner) => inner.config.ttl / 3,
        None => return,
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        inner.round().await;
    }
}

/// Whether another replica can name `key`: not a digest (see [`lease_name`]).
#[inline]
fn nameable(key: &Key) -> bool {
    key.as_bytes().is_some() || key.ip().is_some() || *key == Key::MISSING
}

/// The Redis name of `key`'s leases under `prefix`; `None` for a key held as a digest,
/// whose secret is the process's own, so that no other replica could name it.
pub(crate) fn lease_name(prefix: &str, key: &Key) -> Option<Vec<u8>> {
    let mut name = Vec::with_capacity(prefix.len() + 56);
    name.extend_from_slice(prefix.as_bytes());
    if let Some(ip) = key.ip() {
        name.extend_from_slice(format!(":ip:{ip}").as_bytes());
    } else if *key == Key::MISSING {
        name.extend_from_slice(b":missing");
    } else {
        name.extend_from_slice(b":key:");
        name.extend_from_slice(key.as_bytes()?);
    }
    Some(name)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A name no other replica has: the host's process id, the time, and an address.
fn replica_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{}-{}-{n}", std::process::id(), now.as_nanos())
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
