//! A primary found through Redis Sentinel, looked up again each time a connection opens: after a
//! failover (a broken connection, or `READONLY` from the demoted primary, or the sentinels'
//! `+switch-master`), the next connection goes to the new primary.

use std::time::Duration;

use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{IntoConnectionInfo, RedisResult};
use tokio::sync::Mutex;

use super::urls::tcp_settings;
use crate::store::TlsMaterial;
use crate::LockError;

/// How often the sentinel that failovers are heard from is pinged.
const SENTINEL_PING: Duration = Duration::from_secs(1);

/// The sentinels of one monitored primary.
pub(crate) struct Sentinels {
    /// redis-rs's client keeps a connection to the sentinel that last answered.
    client: Mutex<SentinelClient>,
    master_name: String,
    /// One client per sentinel, for `+switch-master`.
    urls: Vec<redis::Client>,
}

impl std::fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinels")
            .field("master_name", &self.master_name)
            .field("sentinels", &self.urls.len())
            .finish()
    }
}

impl Sentinels {
    /// Whose primary requests go to, for errors.
    pub(crate) fn describe(&self) -> String {
        let at: Vec<String> = self
            .urls
            .iter()
            .map(|c| c.get_connection_info().addr().to_string())
            .collect();
        format!(
            "the primary of `{}` (sentinels {})",
            self.master_name,
            at.join(", ")
        )
    }

    /// Checks the sentinel URLs without connecting. The primary is reached with the first URL's
    /// credentials, database and TLS mode (sentinels and data nodes usually share them).
    pub(crate) fn new(urls: &[String], master_name: &str, tls: &TlsMaterial) -> Result<Self, LockError> {
        if master_name.is_empty() {
            return Err(LockError::invalid_options("the Sentinel master name is empty"));
        }
        if urls.is_empty() {
            return Err(LockError::invalid_options(
                "no Sentinel URL given to .sentinel(…)",
            ));
        }
        if !tls.is_empty() {
            return Err(LockError::invalid_options(
                "TLS certificates are not supported with Sentinel yet; use rediss:// with a public CA",
            ));
        }
        let mut infos = Vec::with_capacity(urls.len());
        let mut clients = Vec::with_capacity(urls.len());
        for url in urls {
            let client = super::urls::client_for_url(url, tls)?;
            infos.push(
                url.as_str()
                    .into_connection_info()
                    .map_err(|e| LockError::invalid_options(format!("invalid Sentinel URL: {e}")))?,
            );
            clients.push(client);
        }
        let mut node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(infos[0].redis_settings().clone())
            .set_tcp_settings(tcp_settings());
        if urls[0].starts_with("rediss://") {
            node = node.set_tls_mode(redis::TlsMode::Secure);
        }
        // redis-rs takes the name as a `String` without its rustls feature and as `impl AsRef<str>`
        // with it: an owned `String` suits both.
        let name: String = master_name.to_owned();
        let client = SentinelClient::build(infos, name, Some(node), SentinelServerType::Master)
            .map_err(|e| LockError::invalid_options(format!("invalid Sentinel configuration: {e}")))?;
        Ok(Sentinels {
            client: Mutex::new(client),
            master_name: master_name.to_owned(),
            urls: clients,
        })
    }

    /// A client for the current primary: asks the sentinels (the first that answers), and checks
    /// with `ROLE` that the node they name is a primary.
    pub(crate) async fn primary(&self) -> RedisResult<redis::Client> {
        let client = self.client.lock().await.async_get_client().await?;
        tracing::debug!(master = %self.master_name, "Sentinel named the primary");
        Ok(client)
    }

    /// Waits until a sentinel announces a failover of this primary (`+switch-master`), trying
    /// the sentinels in turn; returns when one is heard. The sentinel listened to is pinged
    /// every [`SENTINEL_PING`]: one that closed the connection, or answers no ping within
    /// `response`, is left for the next (a silent sentinel would otherwise swallow every later
    /// announcement without an error). Errors only when no sentinel can be listened to.
    pub(crate) async fn switched(&self, connect: Duration, response: Duration) -> Result<(), LockError> {
        use futures_util::StreamExt;
        let mut last = None;
        for sentinel in &self.urls {
            let pubsub = match tokio::time::timeout(connect, sentinel.get_async_pubsub()).await {
                Ok(Ok(pubsub)) => pubsub,
                Ok(Err(e)) => {
                    last = Some(LockError::from(e));
                    continue;
                }
                Err(_) => {
                    last = Some(LockError::unavailable(crate::error::TimedOut { after: connect }));
                    continue;
                }
            };
            let (mut sink, mut stream) = pubsub.split();
            match tokio::time::timeout(response, sink.subscribe("+switch-master")).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    last = Some(e.into());
                    continue;
                }
                Err(_) => {
                    last = Some(LockError::unavailable(crate::error::TimedOut { after: response }));
                    continue;
                }
            }
            let mut ping = tokio::time::interval(SENTINEL_PING);
            ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ping.tick().await;
            loop {
                tokio::select! {
                    message = stream.next() => {
                        let Some(message) = message else {
                            tracing::debug!("a sentinel closed the connection; listening to the next");
                            break;
                        };
                        // "<master name> <old ip> <old port> <new ip> <new port>"
                        let said = message.get_payload_bytes();
                        if said.split(|&b| b == b' ').next() == Some(self.master_name.as_bytes()) {
                            return Ok(());
                        }
                    }
                    _ = ping.tick() => {
                        let answered = tokio::time::timeout(response, sink.ping::<redis::Value>()).await;
                        if !matches!(answered, Ok(Ok(_))) {
                            tracing::warn!("a sentinel stopped answering; listening to the next for failovers");
                            last = Some(LockError::unavailable(crate::error::TimedOut { after: response }));
                            break;
                        }
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| LockError::invalid_options("no Sentinel URL")))
    }
}
