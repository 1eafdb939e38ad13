//! `PerKey`: each client's share, as one value.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use admission_core::{Key, KeyedLedger};
use http::request::Parts;

pub(crate) type KeyFn = Box<dyn Fn(&Parts) -> Option<Key> + Send + Sync>;
type CapFn = Box<dyn Fn(&Parts, &Key) -> Option<usize> + Send + Sync>;

/// A cap on each client's requests in flight (429 + `Retry-After` above it), and how
/// clients are told apart: for [`AdmissionBuilder::per_key`](crate::AdmissionBuilder::per_key).
///
/// The key comes from the request's head: a header ([`key::header`](crate::key::header)),
/// the peer address ([`key::peer_ip`](crate::key::peer_ip)), or an extension that an
/// authentication layer running before this one set. Keys are [`Key`]s: any identifier
/// becomes one without allocating (`Key::from` a string, bytes, a `u64` or an address).
///
/// ```
/// use admission_tower::{key, AdmissionLayer, PerKey};
/// use http::HeaderName;
///
/// let tenant = key::header(HeaderName::from_static("x-tenant"));
/// let layer = AdmissionLayer::builder()
///     .count(512)
///     .per_key(PerKey::new(16, tenant).max_keys(10_000))
///     .build()?;
/// assert_eq!(layer.gate().keyed().unwrap().cap(), 16);
/// # Ok::<(), admission_tower::BuildError>(())
/// ```
pub struct PerKey {
    pub(crate) key: KeyFn,
    /// The cap of every key the lookup gives none; `None` on a value for a shared gate.
    pub(crate) cap: Option<usize>,
    pub(crate) cap_by: Option<CapFn>,
    pub(crate) max_keys: Option<usize>,
    pub(crate) unkeyed: Unkeyed,
    pub(crate) leases: Option<Arc<dyn Leases>>,
}

/// Where each key's cap on this server is leased from, when one cap holds across several
/// servers: `admission-redis`'s `FleetCap` keeps a key's cap on a shared Redis and leases
/// each server a part of it. For [`PerKey::leased`].
///
/// The layer reads [`cap`](Self::cap) for each request with a key, as it reads
/// [`PerKey::cap_by`]: the slots this server holds for the key. A request the lease
/// refuses (the key's requests here fill it) asks [`grow`](Self::grow) once, holding
/// nothing while it does, and is then admitted if the lease grew, or refused (429).
///
/// A lease may shrink at any time. Once a request holds its key's permit, the layer reads
/// the cap again and lets the request go (as refused by its lease) if the key's requests
/// here then exceed it. So leases that lower a cap and then read
/// [`in_flight`](admission_core::KeyedLedger::in_flight) see every request admitted
/// against the old cap, or that request sees the new one: what they then give back was
/// not in use. (`cap` must be read under a lock the lowering takes, or behind a
/// `SeqCst` fence, for this to hold.)
pub trait Leases: Send + Sync + 'static {
    /// The slots this server holds for `key` now: the key's cap here (0 before any).
    /// Called on every request with a key: keep it to a map read.
    fn cap(&self, key: &Key) -> usize;

    /// Asks for more slots for `key`, whose lease its requests here fill. Resolves once
    /// the lease has grown or could not; it must bound its own time (a request waits
    /// for it).
    fn grow(&self, key: &Key) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

    /// Called once, when a layer is built: the per-key ledger in which that layer counts
    /// each key's requests in flight here (to give back what a key no longer uses), and
    /// the layer's name (its [`name`](crate::AdmissionBuilder::name), for the leases' own
    /// logs and metrics).
    ///
    /// # Errors
    ///
    /// [`LeasesTaken`] if these leases serve another layer already: they count one
    /// layer's requests, and that layer's `build` fails with
    /// [`BuildError::LeasesTaken`](crate::BuildError::LeasesTaken).
    fn attach(&self, keyed: &KeyedLedger<Key>, layer: &str) -> Result<(), LeasesTaken>;
}

/// What [`Leases::attach`] says of leases that serve another layer already.
///
/// ```
/// use admission_tower::LeasesTaken;
///
/// assert_eq!(LeasesTaken.to_string(), "these leases serve another layer already");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeasesTaken;

impl std::fmt::Display for LeasesTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("these leases serve another layer already")
    }
}

impl std::error::Error for LeasesTaken {}

/// What becomes of a request from which the key extractor gets no key (no such header;
/// no peer address in the request's extensions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Unkeyed {
    /// They are one client: every request without a key shares [`Key::MISSING`] and its
    /// cap (the default). Leaving a header out is then no way around the cap, and an
    /// extractor that never finds its key (a peer address from a server that does not
    /// record one) shows at once as a cap on everything rather than as no cap at all.
    #[default]
    Share,
    /// They pass the per-key dimension (the count and byte limits still apply): for a key
    /// only some callers have, where the others are bounded elsewhere.
    Exempt,
}

impl PerKey {
    /// At most `cap` requests in flight per key, told apart by `key`. A `cap` of 0 is a
    /// [`BuildError::ZeroLimit`](crate::BuildError::ZeroLimit): it would refuse every
    /// request with a key.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use admission_tower::{key, PerKey};
    /// use axum::extract::ConnectInfo;
    ///
    /// // By client address (serve with `into_make_service_with_connect_info`):
    /// let by_peer = PerKey::new(32, key::peer_ip(|info: &ConnectInfo<SocketAddr>| info.0.ip()));
    /// # drop(by_peer);
    /// ```
    pub fn new<F>(cap: usize, key: F) -> Self
    where
        F: Fn(&Parts) -> Option<Key> + Send + Sync + 'static,
    {
        Self {
            key: Box::new(key),
            cap: Some(cap),
            cap_by: None,
            max_keys: None,
            unkeyed: Unkeyed::default(),
            leases: None,
        }
    }

    /// The key extractor alone, for a layer over a shared gate
    /// ([`AdmissionLayer::from_gate`](crate::AdmissionLayer::from_gate)), whose per-key
    /// cap and key table are the gate's.
    ///
    /// ```
    /// use admission_tower::{key, AdmissionLayer, Gate, PerKey};
    ///
    /// let gate: Gate = Gate::builder().count(64).per_key(4).build()?;
    /// let layer = AdmissionLayer::from_gate(gate)
    ///     .per_key(PerKey::gate_cap(key::header(http::HeaderName::from_static("x-api-key"))))
    ///     .build()?;
    /// assert_eq!(layer.gate().keyed().unwrap().cap(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gate_cap<F>(key: F) -> Self
    where
        F: Fn(&Parts) -> Option<Key> + Send + Sync + 'static,
    {
        Self {
            cap: None,
            ..Self::new(0, key)
        }
    }

    /// A cap chosen per key: tenant tiers. For each request, `cap_by` looks at the head
    /// and the key and returns that key's cap (a paying tenant 32), or `None` for the
    /// value's own cap, in the same unit as [`PerKey::new`]'s. `Some(0)` refuses the key
    /// everything (429), `Some(usize::MAX)` gives it no cap. Keep it cheap (a map read, or a claim already parsed into the request's
    /// extensions): it runs on every request with a key.
    ///
    /// ```
    /// use admission_tower::{key, AdmissionLayer, Key, PerKey};
    ///
    /// let paying = [Key::from("acme")];
    /// let tiers = PerKey::new(4, key::header(http::HeaderName::from_static("x-tenant")))
    ///     .cap_by(move |_req, tenant| paying.contains(tenant).then_some(32));
    /// let layer = AdmissionLayer::builder().per_key(tiers).build()?;
    /// assert_eq!(layer.gate().keyed().unwrap().cap(), 4);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn cap_by<F>(mut self, cap_by: F) -> Self
    where
        F: Fn(&Parts, &Key) -> Option<usize> + Send + Sync + 'static,
    {
        self.cap_by = Some(Box::new(cap_by));
        self
    }

    /// Each key's cap on this server leased from `leases` (see [`Leases`]), in place of
    /// the value's own cap and [`cap_by`](Self::cap_by): a cap held across several
    /// servers. The value's own cap (`PerKey::new`'s) stays the most a key can hold here.
    pub fn leased(mut self, leases: Arc<dyn Leases>) -> Self {
        self.leases = Some(leases);
        self
    }

    /// At most `max_keys` distinct keys with requests in flight: past it, a request with
    /// a new key is refused 503 (a client spraying new keys cannot grow the table without
    /// bound). No bound by default; 0 is a
    /// [`BuildError::ZeroLimit`](crate::BuildError::ZeroLimit).
    ///
    /// ```
    /// use admission_tower::{AdmissionLayer, Key, PerKey};
    ///
    /// let per_path = PerKey::new(8, |req| Some(Key::from(req.uri.path()))).max_keys(1_000);
    /// let layer = AdmissionLayer::builder().per_key(per_path).build()?;
    /// assert_eq!(layer.gate().keyed().unwrap().max_keys(), 1_000);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// What becomes of requests without a key (default: [`Unkeyed::Share`], one client).
    ///
    /// ```
    /// use admission_tower::{key, PerKey, Unkeyed};
    ///
    /// let optional = PerKey::new(8, key::header(http::HeaderName::from_static("x-api-key")))
    ///     .unkeyed(Unkeyed::Exempt);
    /// # drop(optional);
    /// ```
    pub fn unkeyed(mut self, unkeyed: Unkeyed) -> Self {
        self.unkeyed = unkeyed;
        self
    }

    /// The policy of a key that has no cap ([`crate::FairShare::by`]): a request without
    /// a key shares [`Key::MISSING`].
    pub(crate) fn policy_of(key: KeyFn) -> KeyPolicy {
        KeyPolicy {
            key,
            cap_by: None,
            unkeyed: Unkeyed::Share,
            leases: None,
        }
    }

    pub(crate) fn into_policy(self) -> KeyPolicy {
        KeyPolicy {
            key: self.key,
            cap_by: self.cap_by,
            unkeyed: self.unkeyed,
            leases: self.leases,
        }
    }
}

impl fmt::Debug for PerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerKey")
            .field("cap", &self.cap)
            .field("cap_by", &self.cap_by.is_some())
            .field("max_keys", &self.max_keys)
            .field("unkeyed", &self.unkeyed)
            .field("leased", &self.leases.is_some())
            .finish_non_exhaustive()
    }
}

/// What a built layer keeps of a [`PerKey`]: how to read a request's key and its cap.
pub(crate) struct KeyPolicy {
    key: KeyFn,
    cap_by: Option<CapFn>,
    unkeyed: Unkeyed,
    pub(crate) leases: Option<Arc<dyn Leases>>,
}

impl KeyPolicy {
    /// The request's key: its own, [`Key::MISSING`] for one without, or none at all.
    #[inline]
    pub(crate) fn key(&self, parts: &Parts) -> Option<Key> {
        match (self.key)(parts) {
            Some(key) => Some(key),
            None => (self.unkeyed == Unkeyed::Share).then_some(Key::MISSING),
        }
    }

    /// The key's own cap, where caps are chosen per key.
    #[inline]
    pub(crate) fn cap_for(&self, parts: &Parts, key: &Key) -> Option<u64> {
        let cap = match &self.leases {
            Some(leases) => leases.cap(key),
            None => self.cap_by.as_ref().and_then(|cap_by| cap_by(parts, key))?,
        };
        Some(u64::try_from(cap).unwrap_or(u64::MAX))
    }
}
