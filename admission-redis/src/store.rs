//! Where a fleet cap is kept: one Redis (or Valkey), a primary that Sentinel watches, or a
//! Redis Cluster; and the connection to it that the cap calls through.

use std::fmt;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, RedisResult, ScriptInvocation};

#[cfg(feature = "cluster")]
use crate::error::FleetError;

/// Where a [`FleetCap`](crate::FleetCap) keeps its leases: what
/// [`FleetCap::builder`](crate::FleetCap::builder) takes.
///
/// - One server: a [`redis::Client`] (`redis://host:port/`, `rediss://` with redis-rs's
///   TLS features).
/// - A primary that Sentinel watches (feature `sentinel`): a
///   `redis::sentinel::SentinelClient` for the primary, built with redis-rs's own
///   settings (auth, TLS). After a failover the cap finds the new primary at its next
///   call that fails, and runs on its fallback meanwhile.
/// - A Redis Cluster (feature `cluster`): `Store::cluster` with the URLs of some of its
///   nodes. Each script touches one key, a key's leases in one hash slot.
///
/// ```
/// use admission_redis::Store;
///
/// let one: Store = redis::Client::open("redis://127.0.0.1/")?.into();
/// # drop(one);
/// # Ok::<(), redis::RedisError>(())
/// ```
#[derive(Clone)]
pub struct Store(pub(crate) Kind);

#[derive(Clone)]
pub(crate) enum Kind {
    Single(redis::Client),
    #[cfg(feature = "sentinel")]
    Sentinel(std::sync::Arc<tokio::sync::Mutex<redis::sentinel::SentinelClient>>),
    #[cfg(feature = "cluster")]
    Cluster(Vec<redis::ConnectionInfo>),
}

impl From<redis::Client> for Store {
    fn from(client: redis::Client) -> Self {
        Store(Kind::Single(client))
    }
}

#[cfg(feature = "sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
impl From<redis::sentinel::SentinelClient> for Store {
    /// The primary a Sentinel client names (build it with `SentinelServerType::Master`).
    ///
    /// ```no_run
    /// use admission_redis::FleetCap;
    /// use redis::sentinel::{SentinelClient, SentinelServerType};
    ///
    /// # async fn replica() -> Result<(), Box<dyn std::error::Error>> {
    /// let sentinels = vec!["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/"];
    /// let primary =
    ///     SentinelClient::build(sentinels, "fleet".to_owned(), None, SentinelServerType::Master)?;
    /// let fleet = FleetCap::builder(primary, 16).replicas(4).build()?;
    /// # drop(fleet);
    /// # Ok(())
    /// # }
    /// ```
    fn from(client: redis::sentinel::SentinelClient) -> Self {
        Store(Kind::Sentinel(std::sync::Arc::new(
            tokio::sync::Mutex::new(client),
        )))
    }
}

impl Store {
    /// A Redis Cluster, found from the URLs of some of its nodes (they carry the password:
    /// `redis://:secret@10.0.0.5:6379/`). The cap listens for the other replicas on one
    /// of those nodes (a cluster passes what is published on any node to all of them),
    /// moving to the next when it fails.
    ///
    /// ```no_run
    /// use admission_redis::{FleetCap, Store};
    ///
    /// # async fn replica() -> Result<(), Box<dyn std::error::Error>> {
    /// let nodes = ["redis://10.0.1.1:6379/", "redis://10.0.1.2:6379/"];
    /// let fleet = FleetCap::builder(Store::cluster(nodes)?, 16).replicas(4).build()?;
    /// # drop(fleet);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`FleetError::Redis`](crate::FleetError::Redis) for a URL that cannot be read, or
    /// no URL at all.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster<T: redis::IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = T>,
    ) -> Result<Self, FleetError> {
        let nodes = nodes
            .into_iter()
            .map(redis::IntoConnectionInfo::into_connection_info)
            .collect::<RedisResult<Vec<_>>>()
            .map_err(FleetError::Redis)?;
        if nodes.is_empty() {
            let none = (
                redis::ErrorKind::InvalidClientConfig,
                "no cluster node given",
            );
            return Err(FleetError::Redis(none.into()));
        }
        Ok(Store(Kind::Cluster(nodes)))
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Single(client) => f
                .debug_tuple("Single")
                .field(client.get_connection_info().addr())
                .finish(),
            #[cfg(feature = "sentinel")]
            Kind::Sentinel(_) => f.write_str("Sentinel"),
            #[cfg(feature = "cluster")]
            Kind::Cluster(nodes) => {
                let addrs = nodes.iter().map(redis::ConnectionInfo::addr);
                f.debug_tuple("Cluster")
                    .field(&addrs.collect::<Vec<_>>())
                    .finish()
            }
        }
    }
}

/// The cap's connection to its store.
pub(crate) enum Backend {
    Single {
        client: redis::Client,
        manager: ConnectionManager,
    },
    #[cfg(feature = "sentinel")]
    Sentinel {
        sentinel: std::sync::Arc<tokio::sync::Mutex<redis::sentinel::SentinelClient>>,
        /// The primary last found, and a connection to it; `None` once a call failed.
        primary: parking_lot::Mutex<Option<(redis::Client, ConnectionManager)>>,
        timeout: Duration,
    },
    #[cfg(feature = "cluster")]
    Cluster {
        // Boxed: the largest part of the enum by far, and read once.
        client: Box<redis::cluster::ClusterClient>,
        connection: tokio::sync::OnceCell<redis::cluster_async::ClusterConnection>,
        /// Where to listen: one node after another.
        nodes: Vec<redis::Client>,
        next: std::sync::atomic::AtomicUsize,
    },
}

/// A connection manager on `client` whose every call is bounded by `timeout`.
fn manager(client: redis::Client, timeout: Duration) -> RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1);
    ConnectionManager::new_lazy_with_config(client, config)
}

impl Backend {
    /// The connection for `store`; nothing is sent before the first call. `timeout`: the
    /// grant timeout, which bounds each call.
    pub(crate) fn new(store: Store, timeout: Duration) -> RedisResult<Self> {
        Ok(match store.0 {
            Kind::Single(client) => Backend::Single {
                manager: manager(client.clone(), timeout)?,
                client,
            },
            #[cfg(feature = "sentinel")]
            Kind::Sentinel(sentinel) => Backend::Sentinel {
                sentinel,
                primary: parking_lot::Mutex::new(None),
                timeout,
            },
            #[cfg(feature = "cluster")]
            Kind::Cluster(nodes) => Backend::Cluster {
                client: Box::new(
                    redis::cluster::ClusterClient::builder(nodes.clone())
                        .connection_timeout(timeout)
                        .response_timeout(timeout)
                        .retries(1)
                        .build()?,
                ),
                connection: tokio::sync::OnceCell::new(),
                nodes: nodes
                    .into_iter()
                    .map(redis::Client::open)
                    .collect::<RedisResult<_>>()?,
                next: std::sync::atomic::AtomicUsize::new(0),
            },
        })
    }

    /// Runs a script (its one key routes it, on a cluster).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        match self {
            Backend::Single { manager, .. } => invocation.invoke_async(&mut manager.clone()).await,
            #[cfg(feature = "sentinel")]
            Backend::Sentinel {
                sentinel,
                primary,
                timeout,
            } => {
                let (_, mut connection) = find_primary(sentinel, primary, *timeout).await?;
                let answer = invocation.invoke_async(&mut connection).await;
                if answer.is_err() {
                    // Failed over, perhaps (or a READONLY former primary): ask Sentinel
                    // again at the next call.
                    primary.lock().take();
                }
                answer
            }
            #[cfg(feature = "cluster")]
            Backend::Cluster {
                client, connection, ..
            } => {
                let connection = connection
                    .get_or_try_init(|| client.get_async_connection())
                    .await?;
                invocation.invoke_async(&mut connection.clone()).await
            }
        }
    }

    /// A client for the connection that listens for the other replicas.
    pub(crate) async fn listener(&self) -> RedisResult<redis::Client> {
        match self {
            Backend::Single { client, .. } => Ok(client.clone()),
            #[cfg(feature = "sentinel")]
            Backend::Sentinel {
                sentinel,
                primary,
                timeout,
            } => Ok(find_primary(sentinel, primary, *timeout).await?.0),
            #[cfg(feature = "cluster")]
            Backend::Cluster { nodes, next, .. } => {
                let at = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(nodes[at % nodes.len()].clone())
            }
        }
    }
}

/// The primary Sentinel names now (the one last found, until a call fails), and a
/// connection to it.
#[cfg(feature = "sentinel")]
async fn find_primary(
    sentinel: &tokio::sync::Mutex<redis::sentinel::SentinelClient>,
    primary: &parking_lot::Mutex<Option<(redis::Client, ConnectionManager)>>,
    timeout: Duration,
) -> RedisResult<(redis::Client, ConnectionManager)> {
    if let Some(found) = primary.lock().clone() {
        return Ok(found);
    }
    let client = sentinel.lock().await.async_get_client().await?;
    let found = (client.clone(), manager(client, timeout)?);
    *primary.lock() = Some(found.clone());
    Ok(found)
}

#[cfg(all(test, feature = "cluster"))]
mod tests {
    use std::time::Duration;

    use super::{Backend, Store};

    /// The channel is listened to on one node after another, each in turn.
    #[tokio::test]
    async fn a_cluster_is_listened_to_on_each_node_in_turn() {
        let urls = [
            "redis://127.0.0.1:7001/",
            "redis://127.0.0.1:7002/",
            "redis://127.0.0.1:7003/",
        ];
        let backend =
            Backend::new(Store::cluster(urls).unwrap(), Duration::from_millis(50)).unwrap();
        let mut ports = Vec::new();
        for _ in 0..4 {
            let client = backend.listener().await.unwrap();
            ports.push(client.get_connection_info().addr().to_string());
        }
        let expected = [
            "127.0.0.1:7001",
            "127.0.0.1:7002",
            "127.0.0.1:7003",
            "127.0.0.1:7001",
        ];
        assert_eq!(ports, expected);
    }
}
