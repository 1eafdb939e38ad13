//! A fleet cap's work with Redis: growing a lease, renewing and giving back, the
//! heartbeat, and the fallback.

use std::future::Future;
use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use admission_core::Key;

use crate::config::Fallback;
use crate::names::lease_name;
use crate::state::{Inner, Lease, TICKS, expiry};

impl Inner {
    pub(crate) fn on_fallback(&self) -> bool {
        self.fallback.load(Ordering::Relaxed)
    }

    /// Each key's cap here while Redis is out of reach.
    pub(crate) fn fallback_cap(&self) -> usize {
        match self.config.fallback {
            // No replica count yet (none given, Redis never reached): refuse.
            Fallback::Share => match self.replicas.load(Ordering::Relaxed) {
                0 => 0,
                replicas => self.config.cap / replicas,
            },
            Fallback::Closed => 0,
            Fallback::Local(cap) => cap.min(self.config.cap),
        }
    }

    /// The grant timeout, in ticks of the cap's clock (rounded up).
    fn timeout_ticks(&self) -> u64 {
        let tick = self.config.ttl.as_nanos() / u128::from(TICKS);
        u64::try_from(self.config.grant_timeout.as_nanos().div_ceil(tick.max(1)))
            .unwrap_or(u64::MAX)
    }

    pub(crate) fn in_flight(&self, key: &Key) -> usize {
        let held = self.keyed.get().map_or(0, |keyed| keyed.in_flight(key));
        usize::try_from(held).unwrap_or(usize::MAX)
    }

    /// Grows `key`'s lease by a chunk, if its requests here still fill it. If the fleet
    /// holds the rest of the cap, waits (at most the grant timeout) for another replica
    /// to give back slots it does not use, and asks once more.
    pub(crate) async fn grow(self: Arc<Self>, key: Key) {
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
        // Listening before asking: what another replica gives back follows the ask.
        let notify = self.wait_for(key);
        let mut freed = std::pin::pin!(notify.notified());
        freed.as_mut().enable();
        let short = {
            let _held = lock.lock().await;
            self.grow_held(&key, &name, false).await
        };
        if short
            && tokio::time::timeout(self.config.grant_timeout, freed)
                .await
                .is_ok()
        {
            let _held = lock.lock().await;
            self.grow_held(&key, &name, true).await;
        }
        self.done_waiting(key);
        self.pending.fetch_sub(1, Ordering::Relaxed);
    }

    /// [`grow`](Self::grow), the key's lock held (`freed`: another replica has just given
    /// slots back). Whether the grant fell short while other replicas hold slots.
    async fn grow_held(&self, key: &Key, name: &[u8], freed: bool) -> bool {
        let (current, short_at, share) = match self.leases.read().get(key) {
            Some(lease) => (lease.granted, lease.short_at, lease.share),
            None => return false,
        };
        let in_flight = self.in_flight(key);
        // Not asked again for a tenth of the TTL, at most 250 ms, unless another replica
        // says it gave slots back.
        let pause = (self.config.ttl / 10).min(Duration::from_millis(250));
        let recently_short = !freed && short_at.is_some_and(|at| at.elapsed() < pause);
        if in_flight < current || recently_short {
            // Another request's grant came first, or the fleet holds the rest.
            return false;
        }
        let mut want = (current.max(in_flight) + self.config.chunk)
            .min(self.config.cap)
            .min(share.max(current));
        // Back from the fallback: no further than the share this replica ran on there.
        want = want.min(self.rejoining.load(Ordering::Relaxed).max(current));
        if want <= current {
            return false; // this replica holds the whole cap, or its fair share
        }
        let called = self.tick.load(Ordering::Relaxed);
        let Some((granted, fair, said)) = self.set(name, want).await else {
            return false;
        };
        let short = (granted < want).then(tokio::time::Instant::now);
        if short.is_some() {
            self.counters.short.fetch_add(1, Ordering::Relaxed);
            #[cfg(feature = "tracing")]
            // Never the key: it may be a credential (an API key, say).
            tracing::debug!(
                name = self.label(),
                wanted = want,
                granted,
                "fleet cap: the other replicas hold the rest of the key's cap"
            );
        }
        if let Some(lease) = self.leases.write().get_mut(key) {
            // A grow never lowers a lease Redis still held when the script ran (it
            // grants at least that); one that may have expired is what Redis grants.
            let held = lease.expires > called + self.timeout_ticks();
            lease.granted = if held {
                lease.granted.max(granted)
            } else {
                granted
            };
            lease.in_redis = granted;
            lease.expires = expiry(called);
            lease.short_at = short;
            lease.share = fair;
        }
        said == Said::Waiting
    }

    /// The lock that serializes `key`'s changes in Redis (its entry made if it has none).
    pub(crate) fn lock(&self, key: Key) -> Arc<tokio::sync::Mutex<()>> {
        if let Some(lease) = self.leases.read().get(&key) {
            return lease.lock.clone();
        }
        let mut leases = self.leases.write();
        let lease = leases.entry(key).or_insert_with(|| Lease {
            granted: 0,
            in_redis: 0,
            lock: Arc::default(),
            idle_rounds: 0,
            short_at: None,
            expires: 0,
            share: self.config.cap,
        });
        lease.lock.clone()
    }

    /// Asks Redis to set this replica's lease of `name` to `want`: what it grants, the
    /// key's fair share while other replicas wait (the cap while none do), and what the
    /// other replicas were told. `None` (and the fallback) if Redis could not answer in
    /// time.
    pub(crate) async fn set(&self, name: &[u8], want: usize) -> Option<(usize, usize, Said)> {
        let mut invocation = self.grant.key(name);
        invocation
            .arg(&self.replica)
            .arg(want)
            .arg(self.config.cap)
            .arg(millis(self.config.ttl))
            .arg(&self.channel);
        let (granted, fair, said): (usize, usize, u8) =
            self.call(self.store.invoke(&invocation)).await?;
        let said = match said {
            1 => Said::Waiting,
            2 => Said::GaveBack,
            _ => Said::Nothing,
        };
        Some((granted, fair, said))
    }

    /// One call to Redis, bounded by the grant timeout; counted.
    pub(crate) async fn call<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Option<T> {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        let answer = match tokio::time::timeout(self.config.grant_timeout, call).await {
            Ok(Ok(value)) => Some(value),
            Ok(Err(error)) => {
                self.failed(&error);
                None
            }
            Err(_) => {
                self.failed(&"no answer within the grant timeout");
                None
            }
        };
        #[cfg(feature = "metrics")]
        {
            let outcome = if answer.is_some() { "ok" } else { "error" };
            let labels = [
                ("name", self.label().to_owned()),
                ("outcome", outcome.to_owned()),
            ];
            metrics::counter!("admission_fleet_redis_calls_total", &labels).increment(1);
        }
        answer
    }

    /// A call that failed: counted, and the replica on its fallback.
    fn failed(&self, reason: &dyn std::fmt::Display) {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        if self.fallback.swap(true, Ordering::Relaxed) {
            return;
        }
        self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "tracing")]
        tracing::warn!(
            name = self.label(),
            %reason,
            per_key = self.fallback_cap(),
            "fleet cap: Redis out of reach, each key held to the fallback's cap here"
        );
        #[cfg(not(feature = "tracing"))]
        let _ = reason;
        self.record_fallback(true);
    }

    /// Back on the fleet's leases once Redis answers a heartbeat.
    fn rejoined(&self) {
        self.fallback.store(false, Ordering::Relaxed);
        #[cfg(feature = "tracing")]
        tracing::info!(
            name = self.label(),
            replicas = self.replicas.load(Ordering::Relaxed),
            "fleet cap: Redis answers again, keys back on leases"
        );
        self.record_fallback(false);
    }

    /// Records whether the replica is on its fallback (with the `metrics` feature).
    fn record_fallback(&self, on: bool) {
        #[cfg(feature = "metrics")]
        {
            let labels = [("name", self.label().to_owned())];
            metrics::gauge!("admission_fleet_fallback", &labels).set(if on { 1.0 } else { 0.0 });
        }
        #[cfg(not(feature = "metrics"))]
        let _ = on;
    }

    /// The `name` of this cap's metrics and events.
    #[cfg(any(feature = "metrics", feature = "tracing"))]
    pub(crate) fn label(&self) -> &str {
        self.label.get().map_or("admission", String::as_str)
    }

    /// Records the slots this replica holds (with the `metrics` feature).
    fn record_slots(&self) {
        #[cfg(feature = "metrics")]
        {
            let slots: usize = self.leases.read().values().map(|lease| lease.granted).sum();
            let labels = [("name", self.label().to_owned())];
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
        let Some(live) = self.call(self.store.invoke::<usize>(&invocation)).await else {
            return;
        };
        if self.fallback.load(Ordering::Relaxed) {
            // The share this replica ran on, before the count of live replicas (which
            // leaves out those still on their fallback) moves it.
            self.rejoining.store(self.fallback_cap(), Ordering::Relaxed);
        }
        self.replicas.store(live.max(1), Ordering::Relaxed);
        if self.fallback.load(Ordering::Relaxed) {
            // Back: what Redis held for this replica has expired or is about to; each key
            // grows again from what is in flight (see `grow`), its grant overwriting any
            // lease of this replica Redis still holds.
            for lease in self.leases.write().values_mut() {
                // Whatever Redis still holds of this replica's is overwritten by the
                // next grant, or expires.
                lease.granted = 0;
                lease.short_at = None;
                lease.share = self.config.cap;
            }
            self.rejoined();
            return;
        }
        self.rejoining.store(usize::MAX, Ordering::Relaxed);
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
    pub(crate) async fn settle(&self, key: Key, release: bool) {
        let Some(name) = lease_name(&self.config.prefix, &key) else {
            return;
        };
        let lock = self.lock(key);
        let _held = lock.lock().await;
        let in_flight = self.in_flight(&key);
        let (kept, in_redis, idle) = {
            let mut leases = self.leases.write();
            let Some(lease) = leases.get_mut(&key) else {
                return;
            };
            lease.idle_rounds = if in_flight == 0 {
                lease.idle_rounds.saturating_add(1)
            } else {
                0
            };
            let idle = release || lease.idle_rounds >= 2;
            (lease.granted, lease.in_redis, idle)
        };
        let want = if release {
            in_flight
        } else {
            kept.max(in_flight)
        };
        let want = want.min(self.config.cap);
        let called = self.tick.load(Ordering::Relaxed);
        let answer = if in_redis == 0 && want == 0 {
            // Redis holds nothing of this replica's for the key.
            Some((0, self.config.cap, Said::Nothing))
        } else {
            self.set(&name, want).await
        };
        let Some((granted, fair, _)) = answer else {
            return;
        };
        let mut leases = self.leases.write();
        let Some(lease) = leases.get_mut(&key) else {
            return;
        };
        lease.in_redis = granted;
        lease.expires = expiry(called);
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

/// What a grant told the other replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Said {
    Nothing,
    /// This replica waits for slots they hold.
    Waiting,
    /// This replica gave slots back while another waits.
    GaveBack,
}

/// The upkeep of a cap, every third of the leases' time to live, until the cap is dropped.
/// It starts once a layer has attached the cap (`attached`), whose name its metrics and
/// events carry.
pub(crate) async fn upkeep(inner: Weak<Inner>, attached: tokio::sync::oneshot::Receiver<()>) {
    if attached.await.is_err() {
        return; // dropped before any layer used it
    }
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

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
