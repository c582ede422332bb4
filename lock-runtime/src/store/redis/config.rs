//! Where a Redis store's locks live, as the builder is told: one server by URL or as a
//! `redis::Client`, a Cluster, a Sentinel-managed primary.

use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "cluster")]
use super::cluster::ClusterNodes;
#[cfg(feature = "sentinel")]
use super::sentinel::Sentinels;
use super::servers::Servers;
use super::urls::{client_for_url, no_insecure_urls};
use super::RedisStore;
use crate::redact::hide_credentials;
use crate::store::{DynStore, Settings, StoreConfig};
use crate::{LockClientBuilder, LockError};

/// A Redis deployment, as the builder was told.
#[derive(Clone)]
pub(crate) enum RedisConfig {
    /// One server, by URL (`.url`).
    Url(String),
    /// One server, as a client the user built (`.redis_client`).
    Client(redis::Client),
    /// A Cluster's seed nodes (`.cluster`).
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    Cluster(Vec<String>),
    /// The sentinels and the name they monitor the primary under (`.sentinel`).
    #[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
    Sentinel(Vec<String>, String),
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A URL may carry a password: show where it points, not who logs in.
        let hidden = |urls: &[String]| urls.iter().map(|u| hide_credentials(u)).collect::<Vec<_>>();
        match self {
            RedisConfig::Url(url) => f.debug_tuple("Url").field(&hide_credentials(url)).finish(),
            RedisConfig::Client(client) => f.debug_tuple("Client").field(client).finish(),
            RedisConfig::Cluster(urls) => f.debug_tuple("Cluster").field(&hidden(urls)).finish(),
            RedisConfig::Sentinel(urls, name) => f
                .debug_tuple("Sentinel")
                .field(&hidden(urls))
                .field(name)
                .finish(),
        }
    }
}

impl StoreConfig for RedisConfig {
    fn open(&self, settings: Settings) -> Result<Arc<dyn DynStore>, LockError> {
        let urls: &[String] = match self {
            RedisConfig::Url(url) => std::slice::from_ref(url),
            RedisConfig::Client(_) => &[],
            RedisConfig::Cluster(urls) | RedisConfig::Sentinel(urls, _) => urls,
        };
        no_insecure_urls(urls)?;
        let answer_within =
            settings.timeouts.response + settings.replicas.map_or(Duration::ZERO, |r| 2 * r.timeout);
        let tls = &settings.tls;
        let servers = match self {
            RedisConfig::Url(url) => Servers::One(client_for_url(url, tls)?),
            RedisConfig::Client(client) => {
                settings.no_tls_material(
                    "TLS certificates go into the redis::Client given to .redis_client(…), not the builder",
                )?;
                Servers::One(client.clone())
            }
            #[cfg(feature = "cluster")]
            RedisConfig::Cluster(urls) => Servers::Cluster(Arc::new(ClusterNodes::new(
                urls,
                tls,
                settings.timeouts,
                answer_within,
            )?)),
            #[cfg(feature = "sentinel")]
            RedisConfig::Sentinel(urls, master_name) => {
                Servers::Sentinel(Arc::new(Sentinels::new(urls, master_name, tls)?))
            }
            #[allow(unreachable_patterns)] // when both features are on
            _ => {
                let _ = answer_within;
                return Err(LockError::invalid_options(
                    "this deployment needs a lock-runtime feature that is off",
                ));
            }
        };
        Ok(Arc::new(RedisStore::new(servers, settings)))
    }
}

/// One server, by URL (`LockClient::connect`).
pub(crate) fn from_url(url: &str) -> Result<Arc<dyn StoreConfig>, LockError> {
    Ok(Arc::new(RedisConfig::Url(url.to_owned())))
}

/// Redis, however deployed.
impl LockClientBuilder {
    /// The Redis server: `redis://[user:password@]host:port[/db]`, or `rediss://…` for TLS
    /// (with the `tls` feature). Give this or [`redis_client`](Self::redis_client).
    pub fn url(self, url: &str) -> Self {
        self.place(RedisConfig::Url(url.to_owned()))
    }

    /// The Redis server, as a `redis::Client` you built: for anything redis-rs supports that
    /// this builder does not name (your own TLS setup, RESP3, a Unix socket, …). Give this or
    /// [`url`](Self::url).
    pub fn redis_client(self, client: redis::Client) -> Self {
        self.place(RedisConfig::Client(client))
    }

    /// A Redis Cluster (the `cluster` feature, on by default), given some of its nodes: the
    /// client learns the rest, sends each request to the primary owning the lock's slot
    /// (following MOVED/ASK while slots migrate and failovers), and wakes waiters with sharded
    /// pub/sub on that slot.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .cluster(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
    ///     .wait_for_replicas(1, std::time::Duration::from_millis(100))
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    pub fn cluster(self, urls: impl IntoIterator<Item = impl AsRef<str>>) -> Self {
        self.place(RedisConfig::Cluster(crate::builder::addresses(urls)))
    }

    /// A primary managed by Redis Sentinel (the `sentinel` feature, on by default): `urls` are
    /// the sentinels', `master_name` the name they monitor it under. Each connection asks the
    /// sentinels for the primary (and checks its `ROLE`); after a failover (announced by the
    /// sentinels, or found by a request that reached the demoted node or a dead connection) the
    /// client reconnects to the new primary. The primary is reached with the first URL's user,
    /// password, database and TLS mode.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .sentinel(["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"], "locks")
    ///     .wait_for_replicas(1, std::time::Duration::from_millis(100))
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    pub fn sentinel(self, urls: impl IntoIterator<Item = impl AsRef<str>>, master_name: &str) -> Self {
        self.place(RedisConfig::Sentinel(
            crate::builder::addresses(urls),
            master_name.to_owned(),
        ))
    }
}
