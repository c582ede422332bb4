//! Which servers a Redis store's requests go to: one server, the primary the sentinels name
//! (looked up again whenever a connection opens), or a Redis Cluster (each request reaches the
//! primary owning its key's slot).

#[cfg(any(feature = "cluster", feature = "sentinel"))]
use std::sync::Arc;

#[cfg(feature = "cluster")]
use super::cluster::ClusterNodes;
#[cfg(feature = "sentinel")]
use super::sentinel::Sentinels;

/// Where requests go.
#[derive(Debug, Clone)]
// One per client, kept for its life: not worth a box.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Servers {
    /// One server.
    One(redis::Client),
    /// The primary that the sentinels name, looked up again whenever a connection opens.
    #[cfg(feature = "sentinel")]
    Sentinel(Arc<Sentinels>),
    /// A Redis Cluster: each request reaches the primary owning its key's slot.
    #[cfg(feature = "cluster")]
    Cluster(Arc<ClusterNodes>),
}

impl Servers {
    /// A Redis Cluster (one connection per node, kept by redis-rs).
    pub(crate) fn is_cluster(&self) -> bool {
        #[cfg(feature = "cluster")]
        if let Servers::Cluster(_) = self {
            return true;
        }
        false
    }

    /// Where requests go, for errors: `host:port`, a Sentinel's master name, or the Cluster.
    pub(crate) fn describe(&self) -> String {
        match self {
            Servers::One(client) => client.get_connection_info().addr().to_string(),
            #[cfg(feature = "sentinel")]
            Servers::Sentinel(sentinels) => sentinels.describe(),
            #[cfg(feature = "cluster")]
            Servers::Cluster(_) => "the Redis Cluster".to_owned(),
        }
    }

    /// A client for the server requests go to now (for a Sentinel, the primary the sentinels
    /// name); `None` on a Cluster, whose connections redis-rs makes per node.
    pub(crate) async fn server(&self) -> redis::RedisResult<Option<redis::Client>> {
        match self {
            Servers::One(client) => Ok(Some(client.clone())),
            #[cfg(feature = "sentinel")]
            Servers::Sentinel(sentinels) => sentinels.primary().await.map(Some),
            #[cfg(feature = "cluster")]
            Servers::Cluster(_) => Ok(None),
        }
    }
}
