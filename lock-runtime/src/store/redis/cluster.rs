//! A Redis Cluster: redis-rs's cluster connection routes each keyed request to the primary
//! owning its slot and follows MOVED/ASK redirections and failovers; wake-ups use sharded
//! pub/sub on the lock's slot.

use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{IntoConnectionInfo, PushInfo, RedisResult};
use tokio::sync::mpsc::UnboundedSender;

use super::urls::tcp_settings;
use crate::store::{Timeouts, TlsMaterial};
use crate::LockError;

/// The seed nodes and how to talk to them.
pub(crate) struct ClusterNodes {
    nodes: Vec<redis::ConnectionInfo>,
    tls: TlsMaterial,
    timeouts: Timeouts,
    /// The longest a request may wait for its answer: the response timeout, plus the replica
    /// wait when acquires are followed by `WAIT`.
    answer_within: Duration,
}

impl std::fmt::Debug for ClusterNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNodes")
            .field("seed_nodes", &self.nodes.len())
            .finish()
    }
}

impl ClusterNodes {
    /// Checks the seed URLs without connecting.
    pub(crate) fn new(
        urls: &[String],
        tls: &TlsMaterial,
        timeouts: Timeouts,
        answer_within: Duration,
    ) -> Result<Self, LockError> {
        if urls.is_empty() {
            return Err(LockError::invalid_options(
                "no Redis Cluster node URL given to .cluster(…)",
            ));
        }
        let mut nodes = Vec::with_capacity(urls.len());
        for url in urls {
            // The same checks as for one server (scheme, TLS feature, PEM material).
            super::urls::client_for_url(url, tls)?;
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|e| LockError::invalid_options(format!("invalid Redis Cluster URL: {e}")))?;
            nodes.push(info.set_tcp_settings(tcp_settings()));
        }
        Ok(ClusterNodes {
            nodes,
            tls: tls.clone(),
            timeouts,
            answer_within,
        })
    }

    /// A cluster connection; with `pushes`, a RESP3 one whose pub/sub messages go there.
    pub(crate) async fn connect(
        &self,
        pushes: Option<UnboundedSender<PushInfo>>,
    ) -> RedisResult<ClusterConnection> {
        let mut builder = ClusterClientBuilder::new(self.nodes.clone())
            .connection_timeout(self.timeouts.connect)
            .response_timeout(self.answer_within)
            // Each request is bounded by the caller's response timeout; a few quick retries
            // inside it (a MOVED, a node reconnecting) are all that fit.
            .retries(3)
            .min_retry_wait(10)
            .max_retry_wait(Duration::from_millis(200).as_millis().try_into().unwrap_or(200));
        if let Some(pushes) = pushes {
            builder = builder
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(pushes);
        }
        builder = with_tls(builder, &self.tls);
        builder.build()?.get_async_connection().await
    }
}

#[cfg(feature = "tls")]
fn with_tls(builder: ClusterClientBuilder, tls: &TlsMaterial) -> ClusterClientBuilder {
    if tls.is_empty() {
        return builder;
    }
    builder.certs(super::urls::certificates(tls))
}

#[cfg(not(feature = "tls"))]
fn with_tls(builder: ClusterClientBuilder, _: &TlsMaterial) -> ClusterClientBuilder {
    builder
}
