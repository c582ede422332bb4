//! What operators read and do on a Redis store (`lock_runtime::admin`, `lockctl`), and what
//! `holder` reads: which keys are locks (`SCAN`, on every primary of a Cluster), what each one
//! holds (`inspect.lua`: every key of a lock read at one instant, with the rights locking has),
//! and a forced release of what was seen (`force.lua`).

use std::collections::BTreeSet;

use futures_util::{StreamExt, TryStreamExt};
use redis::{Cmd, FromRedisValue, Value};
use tokio::time::Instant;

#[cfg(feature = "cluster")]
use super::connection::Conn;
use super::keys;
use super::scripts::force::{Force, Forced};
use super::scripts::inspect;
use super::RedisStore;
use crate::store::{ForceReleased, Lock, StoreAdmin};
use crate::view::{glob_escape, Holding, LockView};
use crate::LockError;

/// How many keys one SCAN call looks at.
const PAGE: usize = 500;

/// How many locks are read at once (one script each, pipelined on the connection).
const READS_IN_FLIGHT: usize = 64;

/// A node whose keys a SCAN walks.
#[derive(Debug, Clone)]
enum Node {
    /// The one server.
    Server,
    /// A Cluster primary, by the address redis-rs knows it by.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    Primary { host: String, port: u16 },
}

impl RedisStore {
    /// The user keys of the lock keys matching `pattern`, sorted and without repeats (SCAN may
    /// return a key twice). SCAN, not KEYS: it does not block the server on a large keyspace. On
    /// a Cluster every primary is walked (each holds the keys of its slots).
    async fn scan(&self, pattern: &str) -> Result<Vec<String>, LockError> {
        let matching = keys::name(&glob_escape(&self.prefix), pattern);
        let prefix = self.prefix.as_str();
        let mut found = BTreeSet::new();
        for node in self.nodes().await? {
            let mut cursor: u64 = 0;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&matching)
                    .arg("COUNT")
                    .arg(PAGE);
                let (next, batch): (u64, Vec<Vec<u8>>) = self.on_node(&node, &scan).await?;
                let names = batch.into_iter().filter_map(|name| String::from_utf8(name).ok());
                found.extend(names.filter_map(|name| keys::user_key(prefix, &name).map(str::to_owned)));
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(found.into_iter().collect())
    }

    /// The nodes that together hold every key: the server, or each primary of the Cluster.
    async fn nodes(&self) -> Result<Vec<Node>, LockError> {
        #[cfg(feature = "cluster")]
        if self.deployment.sharded() {
            use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
            let answers: Value = self
                .conn
                .request(|conn| async move {
                    let Conn::Cluster(mut conn) = conn else {
                        return Ok(Value::Nil);
                    };
                    // Each primary answers under the address redis-rs routes to it by.
                    let all_primaries = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                    conn.route_command(redis::cmd("PING"), all_primaries).await
                })
                .await?;
            let Value::Map(answers) = answers else {
                return Err(unexpected("PING to every primary", &answers));
            };
            let mut nodes = Vec::with_capacity(answers.len());
            for (address, answer) in answers {
                answer.extract_error()?;
                let address = String::from_redis_value(address)?;
                let parsed = address
                    .rsplit_once(':')
                    .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)));
                let Some((host, port)) = parsed else {
                    return Err(LockError::unavailable(format!(
                        "unexpected Redis Cluster node address {address:?}"
                    )));
                };
                nodes.push(Node::Primary { host, port });
            }
            return Ok(nodes);
        }
        Ok(vec![Node::Server])
    }

    /// Sends `cmd` to `node` (a SCAN, whose cursor belongs to one node).
    async fn on_node<T: FromRedisValue>(&self, node: &Node, cmd: &Cmd) -> Result<T, LockError> {
        let answer: Value = self
            .conn
            .request(|mut conn| async move {
                match (&mut conn, node) {
                    #[cfg(feature = "cluster")]
                    (Conn::Cluster(cluster), Node::Primary { host, port }) => {
                        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                        let by_address = SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port: *port,
                        };
                        cluster
                            .route_command(cmd.clone(), RoutingInfo::SingleNode(by_address))
                            .await
                    }
                    _ => cmd.query_async(&mut conn).await,
                }
            })
            .await?;
        Ok(T::from_redis_value(answer)?)
    }
}

#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
fn unexpected(what: &str, answer: &Value) -> LockError {
    LockError::unavailable(format!("unexpected answer from Redis to {what}: {answer:?}"))
}

impl StoreAdmin for RedisStore {
    /// What the lock holds now, read at one instant (`inspect.lua`).
    async fn inspect(&self, lock: &Lock) -> Result<LockView, LockError> {
        let call = &inspect::call(lock.name());
        let answer: Vec<Value> = self
            .conn
            .request(|mut conn| async move { call.invoke(&mut conn).await })
            .await?;
        let read_at = Instant::now();
        let found = inspect::found(answer);
        Ok(LockView {
            key: lock.key().to_owned(),
            name: lock.name().to_owned(),
            holding: found.holding,
            remaining: found.remaining,
            fence: found.fence,
            queued: found.queued,
            writers: found.writers,
            read_at,
        })
    }

    /// The locks held now whose keys match `pattern`, sorted by key.
    async fn list(&self, pattern: &str) -> Result<Vec<LockView>, LockError> {
        let keys = self.scan(pattern).await?;
        let views: Vec<LockView> = futures_util::stream::iter(keys)
            .map(|key| async move {
                let lock = Lock::new(&key, keys::name(&self.prefix, &key));
                self.inspect(&lock).await
            })
            .buffered(READS_IN_FLIGHT)
            .try_collect()
            .await?;
        Ok(views.into_iter().filter(LockView::is_held).collect())
    }

    /// Frees the lock if it still holds what `seen` shows, in one script (`force.lua`), and
    /// announces it (with `SPUBLISH` on a Cluster, where waiters listen with `SSUBSCRIBE`).
    async fn force_release(&self, lock: &Lock, seen: &LockView) -> Result<ForceReleased, LockError> {
        if seen.holding == Holding::Free {
            return Ok(ForceReleased::Gone);
        }
        let force = &Force {
            lock: lock.name(),
            seen: &seen.holding,
            sharded: self.deployment.sharded(),
        };
        let answer: i64 = self
            .conn
            .request(|mut conn| async move { force.call().invoke(&mut conn).await })
            .await?;
        Ok(match Forced::from_answer(answer) {
            Forced::Freed => ForceReleased::Freed,
            Forced::Gone => ForceReleased::Gone,
            Forced::Changed => ForceReleased::Changed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_and_auxiliary_keys_are_told_apart() {
        assert_eq!(keys::user_key("lock:", "lock:{order:5}"), Some("order:5"));
        assert_eq!(keys::user_key("lock:", "lock:{a}b}"), Some("a}b"));
        for aux in [
            "lock:{order:5}:fence",
            "lock:{order:5}:queue",
            "lock:{order:5}:writers",
            "lock:x",
            "other",
        ] {
            assert_eq!(keys::user_key("lock:", aux), None, "{aux}");
        }
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
