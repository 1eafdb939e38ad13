//! What the replicas tell each other through Redis: a replica whose grant fell short says
//! it waits, and those holding slots of the key they do not use give them back at once; a
//! replica that gives slots back says so, and the waiter asks again. A free slot moves
//! between replicas in a few round trips, not at the holder's next renewal.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use admission_core::Key;
use futures_core::Stream;
use tokio::sync::{Notify, oneshot};

use crate::names::{key_named, lease_name};
use crate::state::{Inner, expiry};

impl Inner {
    /// Registers a wait for slots of `key` given back (see [`freed`](Self::freed)).
    pub(crate) fn wait_for(&self, key: Key) -> Arc<Notify> {
        let mut waiting = self.waiting.lock();
        let (notify, waiters) = waiting.entry(key).or_default();
        *waiters += 1;
        notify.clone()
    }

    /// Ends a wait registered by [`wait_for`](Self::wait_for).
    pub(crate) fn done_waiting(&self, key: Key) {
        let mut waiting = self.waiting.lock();
        if let Some((_, waiters)) = waiting.get_mut(&key) {
            *waiters -= 1;
            if *waiters == 0 {
                waiting.remove(&key);
            }
        }
    }

    /// What another replica said on the channel: `w` (it waits for slots of a key) or `f`
    /// (it gave slots of a key back), its name, a space, and the key's lease name.
    fn heard(self: Arc<Self>, payload: &[u8]) {
        let Some((&word, rest)) = payload.split_first() else {
            return;
        };
        let Some(space) = rest.iter().position(|&byte| byte == b' ') else {
            return;
        };
        let (replica, name) = (&rest[..space], &rest[space + 1..]);
        if replica == self.replica.as_bytes() {
            return;
        }
        let Some(key) = key_named(&self.config.prefix, name) else {
            return;
        };
        match word {
            // (What this replica holds of the key, if anything, is read under its lock.)
            b'w' => drop(tokio::spawn(async move { self.give_back(key).await })),
            b'f' => self.freed(&key),
            _ => {}
        }
    }

    /// Another replica gave slots of `key` back: a grant that came back short is asked
    /// again at once.
    fn freed(&self, key: &Key) {
        if let Some(lease) = self.leases.write().get_mut(key) {
            lease.short_at = None;
        }
        if let Some((notify, _)) = self.waiting.lock().get(key) {
            notify.notify_waiters();
        }
    }

    /// Gives back the slots of `key` this replica holds and does not use, for another
    /// replica that waits for them: its own cap lowered to what is in flight first, then
    /// Redis set to what is in flight then. A request admitted against the cap before it
    /// was lowered is counted in that second reading, or reads the lowered cap once it
    /// holds its permit and lets itself go (see [`admission_tower::Leases`]): Redis never
    /// counts less than this replica may run.
    pub(crate) async fn give_back(&self, key: Key) {
        let Some(name) = lease_name(&self.config.prefix, &key) else {
            return;
        };
        let Some(lock) = self.leases.read().get(&key).map(|lease| lease.lock.clone()) else {
            return;
        };
        let _held = lock.lock().await;
        if self.on_fallback() {
            return;
        }
        let in_flight = self.in_flight(&key);
        let kept = {
            let mut leases = self.leases.write();
            let Some(lease) = leases.get_mut(&key) else {
                return;
            };
            if lease.in_redis <= in_flight {
                return;
            }
            lease.granted = lease.granted.min(in_flight);
            lease.granted
        };
        // Read after the lower cap is published (under the map's lock): see above.
        let want = kept.max(self.in_flight(&key));
        let called = self.tick.load(Ordering::Relaxed);
        let Some((granted, fair, _)) = self.set(&name, want).await else {
            return;
        };
        self.counters.given_back.fetch_add(1, Ordering::Relaxed);
        let mut leases = self.leases.write();
        let Some(lease) = leases.get_mut(&key) else {
            return;
        };
        lease.in_redis = granted;
        lease.expires = expiry(called);
        lease.granted = kept.min(granted);
        lease.share = fair;
        if granted == 0 && lease.granted == 0 && Arc::strong_count(&lock) == 2 {
            leases.remove(&key);
        }
    }
}

/// Listens on the cap's channel until `stop` (the cap dropped), connecting again a third
/// of the TTL after a connection is lost. While it is not connected, slots move between
/// replicas at their renewals, as they would without it.
pub(crate) async fn listen(inner: Weak<Inner>, mut stop: oneshot::Receiver<()>) {
    let (channel, pause) = match inner.upgrade() {
        Some(inner) => (inner.channel.clone(), inner.config.ttl / 3),
        None => return,
    };
    loop {
        let connect = async {
            let cap = inner.upgrade()?;
            let client = tokio::time::timeout(pause, cap.store.listener()).await;
            drop(cap);
            let client = client.ok()?.ok()?;
            let connecting = tokio::time::timeout(pause, client.get_async_pubsub());
            let mut pubsub = connecting.await.ok()?.ok()?;
            pubsub.subscribe(&channel).await.ok()?;
            Some(pubsub)
        };
        let connected = tokio::select! {
            _ = &mut stop => return,
            connected = connect => connected,
        };
        if let Some(pubsub) = connected {
            let mut messages = std::pin::pin!(pubsub.into_on_message());
            loop {
                let next = std::future::poll_fn(|cx| messages.as_mut().poll_next(cx));
                let message = tokio::select! {
                    _ = &mut stop => return,
                    message = next => message,
                };
                let Some(message) = message else {
                    break;
                };
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                inner.heard(message.get_payload_bytes());
            }
        }
        tokio::select! {
            _ = &mut stop => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use admission_core::Key;

    /// A wait registered twice is one entry, removed with the last of its waits.
    #[tokio::test]
    async fn the_waits_for_a_key_are_counted_and_forgotten() {
        let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
        let fleet = crate::FleetCap::builder(client, 4).build().unwrap();
        let inner = &fleet.inner;
        let key = Key::from("acme");
        let first = inner.wait_for(key);
        let second = inner.wait_for(key);
        assert!(std::sync::Arc::ptr_eq(&first, &second));
        inner.done_waiting(key);
        assert_eq!(inner.waiting.lock().get(&key).map(|(_, n)| *n), Some(1));
        inner.done_waiting(key);
        assert!(inner.waiting.lock().is_empty());
    }
}
