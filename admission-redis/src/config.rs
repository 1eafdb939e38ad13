//! `FleetCapBuilder`: a fleet-wide cap's settings, checked when built (`FleetCap` is built
//! from them in `fleet.rs`).

use std::fmt;
use std::time::Duration;

use crate::error::FleetError;
use crate::store::Store;

/// What a replica does while Redis is out of reach (or slower than the grant timeout):
/// every key is held to a local cap, never to none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fallback {
    /// Each key may hold `cap / N` here, where N is the replicas last counted live (the
    /// builder's [`replicas`](FleetCapBuilder::replicas) until Redis has counted them),
    /// rounded down: with Redis out of every replica's reach, the fleet together stays
    /// within the cap. Where only this replica is cut off, the others may take the whole
    /// cap once its leases expire, so until the partition heals the fleet may hold the
    /// cap and this share; [`Closed`](Fallback::Closed) keeps it to the cap. The default.
    ///
    /// A replica that has never reached Redis and was not told
    /// [`replicas`](FleetCapBuilder::replicas) knows no N: it refuses keyed requests, as
    /// `Closed` does, until Redis first answers. Replicas started while Redis is down
    /// never take more than the cap between them.
    #[default]
    Share,
    /// Every request with a key is refused (429) until Redis answers again.
    Closed,
    /// Each key may hold this many here (at most the cap).
    Local(usize),
}

/// A fleet-wide cap's settings: [`FleetCap::builder`](crate::FleetCap::builder).
#[derive(Clone)]
pub struct FleetCapBuilder {
    store: Store,
    config: Config,
}

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) cap: usize,
    pub(crate) chunk: usize,
    pub(crate) ttl: Duration,
    pub(crate) grant_timeout: Duration,
    pub(crate) fallback: Fallback,
    pub(crate) replicas: Option<usize>,
    pub(crate) prefix: String,
    pub(crate) name: Option<String>,
    pub(crate) max_pending: usize,
}

impl FleetCapBuilder {
    pub(crate) fn new(store: Store, cap: usize) -> Self {
        Self {
            store,
            config: Config {
                cap,
                chunk: cap.div_ceil(8).max(1),
                ttl: Duration::from_secs(10),
                grant_timeout: Duration::from_millis(100),
                fallback: Fallback::Share,
                replicas: None,
                prefix: "admission".to_owned(),
                name: None,
                max_pending: 256,
            },
        }
    }

    /// How many slots a lease grows by when its requests fill it (default: an eighth of
    /// the cap, at least 1). Smaller asks Redis more often; larger leaves more of the cap
    /// idle on replicas a key's traffic has left, until their next renewal.
    #[must_use]
    pub fn chunk(mut self, chunk: usize) -> Self {
        self.config.chunk = chunk;
        self
    }

    /// How long a lease lives in Redis without a renewal (default 10 s): a replica that
    /// dies holds its slots this long at most. Leases are renewed (and shrunk to what
    /// their keys use) every third of it.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config.ttl = ttl;
        self
    }

    /// The longest a request waits for Redis to grow its key's lease (default 100 ms);
    /// past it, the replica goes on its [`Fallback`] until Redis answers a heartbeat.
    #[must_use]
    pub fn grant_timeout(mut self, timeout: Duration) -> Self {
        self.config.grant_timeout = timeout;
        self
    }

    /// What the replica does while Redis is out of reach (default [`Fallback::Share`]).
    #[must_use]
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.config.fallback = fallback;
        self
    }

    /// How many replicas to assume before Redis has counted them, for
    /// [`Fallback::Share`]: a replica that starts while Redis is out of reach holds each
    /// key to `cap / replicas`. Without it, such a replica refuses keyed requests until
    /// Redis first answers (the fleet never passes the cap). Give the most replicas that
    /// may start at once.
    #[must_use]
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.config.replicas = Some(replicas);
        self
    }

    /// The `name` label of this cap's metrics and the `name` field of its `tracing`
    /// events (default: the name of the layer it serves, see
    /// [`AdmissionBuilder::name`](admission_tower::AdmissionBuilder::name)).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.name = Some(name.into());
        self
    }

    /// The prefix of every name this cap makes in Redis (default `admission`): one per
    /// cap that shares a Redis.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.prefix = prefix.into();
        self
    }

    /// The most grants under way at once (default 256): past it, a request whose key's
    /// lease is used up is refused without asking Redis, so a client spraying new keys
    /// cannot queue calls to Redis without bound.
    #[must_use]
    pub fn max_pending(mut self, max_pending: usize) -> Self {
        self.config.max_pending = max_pending;
        self
    }

    /// The settings and the store, once every setting is checked (`FleetCapBuilder::build`).
    pub(crate) fn checked(self) -> Result<(Config, Store), FleetError> {
        let config = &self.config;
        for (what, value) in [
            ("cap", config.cap),
            ("chunk", config.chunk),
            ("replicas", config.replicas.unwrap_or(1)),
            ("max_pending", config.max_pending),
        ] {
            if value == 0 {
                return Err(FleetError::Zero(what));
            }
        }
        if config.ttl.is_zero() {
            return Err(FleetError::Zero("ttl"));
        }
        if config.grant_timeout.is_zero() {
            return Err(FleetError::Zero("grant_timeout"));
        }
        if config.grant_timeout * 3 >= config.ttl {
            return Err(FleetError::SlowGrant);
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(FleetError::NoRuntime);
        }
        Ok((self.config, self.store))
    }
}

impl fmt::Debug for FleetCapBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetCapBuilder")
            .field("store", &self.store)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("cap", &self.cap)
            .field("chunk", &self.chunk)
            .field("ttl", &self.ttl)
            .field("grant_timeout", &self.grant_timeout)
            .field("fallback", &self.fallback)
            .field("replicas", &self.replicas)
            .field("prefix", &self.prefix)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}
