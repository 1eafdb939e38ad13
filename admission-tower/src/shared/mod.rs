//! The state every clone of a layer and its services shares, and admission itself.

use std::sync::atomic::{AtomicU64, Ordering};

use admission_core::{AdaptiveLimit, Claim, Classes, GatePermit, Priority};
use admission_core::{Key, Refused};
use admission_http::{MinDataRate, Refusal, content_length};
use http::request::Parts;

use crate::readings::{AdmissionSnapshot, RefusalEvent, WaitSnapshot};

mod settings;

pub(crate) use settings::{BypassFn, ClassifyFn, HookFn, SeatsFn, Settings};

/// What every clone of a layer and its services shares: the settings the layer was built
/// with, the path a request takes (decided from them once), and the counts of what came
/// of requests. Admission itself is here too, reading the settings and writing the counts.
pub(crate) struct Shared {
    pub(crate) settings: Settings,
    pub(crate) path: Path,
    pub(crate) counts: Counts,
}

/// Which path a request takes through `call`, decided once from the settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Path {
    /// Nothing to read from the head: no byte or key dimension, no bypass, no classes, no
    /// retries. The count alone decides, before the request is taken apart. (A dry run
    /// may take this path too: its refusal, which admits the request, reads only the head.)
    pub(crate) count_only: bool,
    /// Made by `AdmissionLayer::off`: while the count ledger admits everything, requests
    /// pass through uncounted.
    pub(crate) untracked: bool,
    /// A request that finds the count full waits for a slot (a `Wait`, not a dry run):
    /// that first refusal is not counted by the ledger, the wait's end is.
    pub(crate) waits_first: bool,
}

/// What came of requests, counted as they end (read by `snapshot`).
#[derive(Default)]
pub(crate) struct Counts {
    /// Requests a dry run would have refused.
    pub(crate) would_shed: AtomicU64,
    /// Request bodies cut for arriving slower than the minimum rate.
    pub(crate) too_slow: AtomicU64,
    /// What came of the waits.
    pub(crate) waits: WaitCounts,
    /// Requests let go because their client went away (see `AdmissionSnapshot::gone`).
    pub(crate) gone: AtomicU64,
}

/// What came of the waits for a count slot, counted as they end.
#[derive(Default)]
pub(crate) struct WaitCounts {
    /// Requests admitted after waiting.
    pub(crate) admitted: AtomicU64,
    /// Microseconds they waited, in all.
    pub(crate) waited_micros: AtomicU64,
    /// Waits that ran out of time (or gave their place in a standing queue).
    pub(crate) timed_out: AtomicU64,
    /// Requests refused at once: their client's deadline was too close to wait.
    pub(crate) deadline: AtomicU64,
}

/// How a wait for a count slot ended, short of a slot.
#[cfg(feature = "tokio")]
pub(crate) enum WaitEnd {
    /// Refused: by a dimension, or out of time (`Refused::Count`).
    Refused(Refusal),
    /// Its body failed while it waited: the client is gone.
    Gone,
}

impl Shared {
    /// The shared state of a layer with these settings: the path decided from them,
    /// nothing counted yet.
    pub(crate) fn new(settings: Settings) -> Self {
        let path = Path {
            count_only: settings.gate.bytes().is_none()
                && settings.keys.is_none()
                && settings.bypass.is_none()
                && settings.classes.is_none()
                && settings.seats.is_none()
                && settings.retries.is_none(),
            untracked: false,
            waits_first: settings.waits() && !settings.dry_run,
        };
        Self {
            settings,
            path,
            counts: Counts::default(),
        }
    }

    /// [`new`](Self::new), for a layer whose requests pass through uncounted while its
    /// count admits everything ([`AdmissionLayer::off`](crate::AdmissionLayer::off)).
    pub(crate) fn untracked(settings: Settings) -> Self {
        let mut shared = Self::new(settings);
        shared.path.untracked = true;
        shared
    }

    /// Whether each key's cap here is leased ([`crate::Leases`]).
    pub(crate) fn leased(&self) -> bool {
        self.settings
            .keys
            .as_ref()
            .is_some_and(|keys| keys.leases.is_some())
    }

    /// Whether the request's key, on a layer whose caps are leased, has its lease full.
    #[cfg(feature = "tokio")]
    pub(crate) fn lease_full(&self, parts: &Parts) -> bool {
        let leases = self
            .settings
            .keys
            .as_ref()
            .and_then(|keys| keys.leases.as_ref());
        let (Some(leases), Some(keyed)) = (leases, self.settings.gate.keyed()) else {
            return false;
        };
        self.key_of(parts)
            .is_some_and(|key| keyed.in_flight(&key) >= leases.cap(&key) as u64)
    }

    pub(crate) fn bypasses(&self, parts: &Parts) -> bool {
        self.settings
            .bypass
            .as_ref()
            .is_some_and(|bypass| bypass(parts))
    }

    /// The request's class, on a layer with classes; a retry of it (of the one class
    /// that may fill the count, without classes), on a layer that sheds retries first.
    #[inline]
    pub(crate) fn classify(&self, parts: &Parts) -> Option<Priority> {
        let class = self
            .settings
            .classes
            .as_ref()
            .map(|(classes, classify)| classify(parts, classes));
        match &self.settings.retries {
            Some(retries) if retries.is_retry(parts) => {
                Some(class.unwrap_or(Priority::CRITICAL).retry(retries.share))
            }
            _ => class,
        }
    }

    /// What the request (of class `priority`) claims of the gate, its key borrowed from
    /// `key` ([`key_of`](Self::key_of)), and its body's declared length (0 without a byte
    /// dimension). A body held to `rate` is charged at first only the grace period's worth
    /// of its declared length.
    fn claim_of<'k>(
        &self,
        parts: &Parts,
        priority: Option<Priority>,
        rate: Option<MinDataRate>,
        key: Option<&'k Key>,
    ) -> Result<(Claim<'k, Key>, u64), Refusal> {
        let declared = match self.settings.gate.bytes() {
            Some(_) => content_length(&parts.headers)?.unwrap_or(0),
            None => 0,
        };
        let now = rate.map_or(declared, |rate| declared.min(rate.grace_bytes()));
        let mut claim = Claim::new().bytes(now).total(declared);
        if let (Some(keys), Some(key)) = (self.settings.keys.as_ref(), key) {
            claim = claim.key(key);
            if let Some(cap) = keys.cap_for(parts, key) {
                claim = claim.key_cap(cap);
            }
        }
        if let Some(priority) = priority {
            claim = claim.priority(priority);
        }
        if let Some(seats) = &self.settings.seats {
            claim = claim.seats(seats(parts));
        }
        Ok((claim, declared))
    }

    /// The request's key, on a layer with a per-key dimension.
    pub(crate) fn key_of(&self, parts: &Parts) -> Option<Key> {
        self.settings.keys.as_ref().and_then(|keys| keys.key(parts))
    }

    /// Admits the request (of class `priority`) on every configured dimension, or says
    /// why not; with the permit, the body's declared length (0 without a byte dimension).
    /// Reads only the head: the body is untouched either way.
    pub(crate) fn admit(
        &self,
        parts: &Parts,
        priority: Option<Priority>,
        rate: Option<MinDataRate>,
    ) -> Result<(GatePermit, u64), Refusal> {
        let key = self.key_of(parts);
        let (claim, declared) = self.claim_of(parts, priority, rate, key.as_ref())?;
        // A retry never waits, so its refusal is counted here.
        let claim = if self.path.waits_first && !priority.is_some_and(Priority::is_retry) {
            claim.before_wait()
        } else {
            claim
        };
        let permit = self.settings.gate.try_claim(claim)?;
        Ok((self.within_lease(key.as_ref(), permit)?, declared))
    }

    /// A permit taken against a leased cap, kept if its key's requests here are still
    /// within the lease as it is now: a lease lowered between the read of its cap and the
    /// permit (see [`crate::Leases`]) lets the request go, refused by its key.
    #[inline]
    fn within_lease(&self, key: Option<&Key>, permit: GatePermit) -> Result<GatePermit, Refusal> {
        let leases = self
            .settings
            .keys
            .as_ref()
            .and_then(|keys| keys.leases.as_ref());
        let (Some(leases), Some(key), Some(keyed)) = (leases, key, self.settings.gate.keyed())
        else {
            return Ok(permit);
        };
        // The permit is counted before the cap is read again.
        if keyed.in_flight(key) <= leases.cap(key) as u64 {
            Ok(permit)
        } else {
            drop(permit);
            Err(Refusal::Refused(Refused::Key))
        }
    }

    /// [`admit`](Self::admit), waiting for a count slot (see [`crate::Wait`]) for at most
    /// `budget` (or until a standing queue gives its place to a newer request), while
    /// `ahead` reads the body to see its client go: a refusal names what refused (a wait
    /// out of time is `Refused::Count`).
    #[cfg(feature = "tokio")]
    pub(crate) async fn admit_waiting<B>(
        &self,
        parts: &Parts,
        priority: Option<Priority>,
        rate: Option<MinDataRate>,
        budget: std::time::Duration,
        ahead: &mut admission_http::ReadAhead<B>,
    ) -> Result<(GatePermit, u64), WaitEnd>
    where
        B: http_body::Body + Unpin,
    {
        use std::task::Poll;
        use tokio::time::Instant;

        let key = self.key_of(parts);
        let (claim, declared) = self
            .claim_of(parts, priority, rate, key.as_ref())
            .map_err(WaitEnd::Refused)?;
        // Fair turns: the key's flow.
        let flow = key.as_ref().filter(|_| self.settings.turns);
        let claim = match flow.and_then(|key| self.settings.gate.flow_of(key)) {
            Some(flow) => claim.flow(flow),
            None => claim,
        };
        let mut claim = std::pin::pin!(self.settings.gate.claim(claim));
        let mut timer = std::pin::pin!(tokio::time::sleep_until(Instant::now() + budget));
        let mut queued = false;
        std::future::poll_fn(|cx| {
            // The client first: a request whose client is gone leaves the queue.
            if ahead.poll_failed(cx).is_ready() {
                self.count_gone();
                return Poll::Ready(Err(WaitEnd::Gone));
            }
            match claim.as_mut().poll(cx) {
                Poll::Ready(Ok(permit)) => {
                    let kept = self.within_lease(key.as_ref(), permit);
                    return Poll::Ready(
                        kept.map(|permit| (permit, declared))
                            .map_err(WaitEnd::Refused),
                    );
                }
                Poll::Ready(Err(refused)) => {
                    if queued && matches!(refused, Refused::Count | Refused::Class) {
                        // A standing queue gave its place to a newer request.
                        self.counts.waits.timed_out.fetch_add(1, Ordering::Relaxed);
                    }
                    return Poll::Ready(Err(WaitEnd::Refused(refused.into())));
                }
                Poll::Pending => queued = true,
            }
            match timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.counts.waits.timed_out.fetch_add(1, Ordering::Relaxed);
                    Poll::Ready(Err(WaitEnd::Refused(Refusal::Refused(Refused::Count))))
                }
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }

    /// A request let go because its client went away (see `AdmissionSnapshot::gone`).
    #[cold]
    pub(crate) fn count_gone(&self) {
        self.counts.gone.fetch_add(1, Ordering::Relaxed);
        self.settings.observer.gone();
    }

    /// A request admitted after waiting `waited` for a count slot.
    #[cfg(feature = "tokio")]
    pub(crate) fn waited(&self, waited: std::time::Duration) {
        self.counts.waits.admitted.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.counts
            .waits
            .waited_micros
            .fetch_add(micros, Ordering::Relaxed);
        self.settings.observer.waited(waited);
    }

    #[cold]
    pub(crate) fn refused(&self, parts: &Parts, refusal: Refusal, priority: Option<Priority>) {
        self.refused_after(parts, refusal, priority, std::time::Duration::ZERO);
    }

    /// [`refused`](Self::refused), after waiting `waited` for a count slot.
    #[cold]
    pub(crate) fn refused_after(
        &self,
        parts: &Parts,
        refusal: Refusal,
        priority: Option<Priority>,
        waited: std::time::Duration,
    ) {
        if self.settings.dry_run {
            self.counts.would_shed.fetch_add(1, Ordering::Relaxed);
        }
        if refusal == Refusal::Refused(Refused::TooSlow) {
            self.counts.too_slow.fetch_add(1, Ordering::Relaxed);
        }
        let retry = priority.is_some_and(Priority::is_retry);
        // The class, as the layer's table names it (a retry on a layer without classes
        // has none).
        let priority = priority.filter(|_| self.settings.classes.is_some());
        let class = priority
            .zip(self.classes())
            .and_then(|(priority, classes)| classes.name(priority));
        self.settings.observer.refused(
            &self.settings.gate,
            refusal,
            priority,
            class,
            retry,
            self.settings.dry_run,
        );
        if let Some(hook) = &self.settings.hook {
            hook(&RefusalEvent {
                request: parts,
                refusal,
                priority,
                class,
                retry,
                dry_run: self.settings.dry_run,
                waited,
            });
        }
    }

    pub(crate) fn classes(&self) -> Option<&Classes> {
        self.settings.classes.as_ref().map(|(classes, _)| classes)
    }

    pub(crate) fn snapshot(&self) -> AdmissionSnapshot {
        AdmissionSnapshot {
            gate: self.settings.gate.snapshot(),
            would_shed: self.counts.would_shed.load(Ordering::Relaxed),
            too_slow: self.counts.too_slow.load(Ordering::Relaxed),
            adaptive: self.settings.adaptive.as_ref().map(AdaptiveLimit::snapshot),
            wait: WaitSnapshot {
                waiting: self.settings.gate.count().waiting() as u64,
                admitted: self.counts.waits.admitted.load(Ordering::Relaxed),
                waited_micros: self.counts.waits.waited_micros.load(Ordering::Relaxed),
                timed_out: self.counts.waits.timed_out.load(Ordering::Relaxed),
                deadline: self.counts.waits.deadline.load(Ordering::Relaxed),
            },
            gone: self.counts.gone.load(Ordering::Relaxed),
            stalled: self
                .settings
                .pacer
                .as_ref()
                .map_or(0, |pacer| pacer.stalled()),
            memory: self.settings.memory,
        }
    }
}
