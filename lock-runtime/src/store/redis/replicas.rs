//! Replica acknowledgement ([`wait_for_replicas`](crate::LockClientBuilder::wait_for_replicas)):
//! every acquire and renewal of a Redis store is followed by `WAIT n timeout` in the same round
//! trip, and counts only when enough replicas acknowledged it, so that a failover to one of them
//! never brings a lock back with an earlier expiry than its holder believes (or loses it).

use std::time::Duration;

use super::connection::Connection;
use super::scripts::Call;
use super::servers::Servers;
use crate::store::{Flight, Renewal, Replicas, Timeouts};
use crate::LockError;

/// A Redis store's requests that change locks, and how they are acknowledged.
#[derive(Debug)]
pub(crate) struct Acknowledged {
    replicas: Option<Replicas>,
    /// With replicas: the connection acquires (each followed by `WAIT`, which holds up
    /// everything behind it on its connection) and releases (which must follow an acquire they
    /// may undo) go on, so that renewals, which keep locks valid, never wait behind them.
    connection: Option<Connection>,
}

impl Acknowledged {
    pub(crate) fn new(replicas: Option<Replicas>, servers: &Servers, timeouts: Timeouts) -> Self {
        Acknowledged {
            replicas,
            connection: replicas.map(|_| Connection::new(servers.clone(), timeouts)),
        }
    }

    /// Whether every acquire and renewal waits for replicas.
    pub(crate) fn waits(&self) -> bool {
        self.replicas.is_some()
    }

    /// Opens the acknowledged connection now (when there is one).
    pub(crate) async fn ensure_open(&self) -> Result<(), LockError> {
        match &self.connection {
            Some(connection) => connection.ensure_open().await,
            None => Ok(()),
        }
    }

    /// The connection for acquires and releases (`conn`, the store's own, without replicas),
    /// and how long a request on it may take (with replicas, a `WAIT` may be queued ahead; a
    /// script unknown to the node costs a second round with its own `WAIT`).
    pub(crate) fn ordered<'a>(
        &'a self,
        conn: &'a Connection,
        response: Duration,
    ) -> (&'a Connection, Duration) {
        match (&self.connection, self.replicas) {
            (Some(acked), Some(replicas)) => (acked, response + 2 * replicas.timeout),
            _ => (conn, response),
        }
    }

    /// Sends `call` on the [`ordered`](Self::ordered) connection, followed by `WAIT` when
    /// replicas are asked for: the answer, and how many replicas acknowledged it.
    pub(crate) async fn run<T: redis::FromRedisValue + Send>(
        &self,
        (conn, response): (&Connection, Duration),
        flight: Option<&Flight>,
        call: impl Fn() -> Call,
    ) -> Result<(T, Option<usize>), LockError> {
        let call = &call;
        let (connection, within) = self.ordered(conn, response);
        match self.replicas {
            None => {
                let answer = connection
                    .request_pinned(flight, within, |mut conn| async move {
                        call().invoke(&mut conn).await
                    })
                    .await?;
                Ok((answer, None))
            }
            Some(replicas) => {
                let (answer, acked) = connection
                    .request_pinned(flight, within, |mut conn| async move {
                        call()
                            .invoke_then_wait(&mut conn, replicas.wanted, replicas.timeout)
                            .await
                    })
                    .await?;
                Ok((answer, Some(acked)))
            }
        }
    }

    /// `SET` (`cmd`, on `key`) on the [`ordered`](Self::ordered) connection, followed by `WAIT`
    /// when replicas are asked for.
    pub(crate) async fn set<T: redis::FromRedisValue + Send>(
        &self,
        (conn, response): (&Connection, Duration),
        flight: &Flight,
        (key, cmd): (&str, impl Fn() -> redis::Cmd),
    ) -> Result<(T, Option<usize>), LockError> {
        let cmd = &cmd;
        let (connection, within) = self.ordered(conn, response);
        match self.replicas {
            None => connection
                .request_pinned(Some(flight), within, |mut conn| async move {
                    cmd().query_async(&mut conn).await
                })
                .await
                .map(|found| (found, None)),
            Some(replicas) => connection
                .request_pinned(Some(flight), within, |mut conn| async move {
                    conn.then_wait(cmd(), key.as_bytes(), replicas.wanted, replicas.timeout)
                        .await
                })
                .await
                .map(|(found, acked)| (found, Some(acked))),
        }
    }

    /// `(acked, wanted)` when a write was acknowledged by fewer replicas than asked for.
    pub(crate) fn too_few(&self, acked: Option<usize>) -> Option<(usize, usize)> {
        let (acked, replicas) = (acked?, self.replicas?);
        (acked < replicas.wanted).then_some((acked, replicas.wanted))
    }

    /// What a renewal found for each lock (renew.lua's 1 or 0 per lock), given how many replicas
    /// acknowledged it: one too few acknowledged is [`Renewal::NotReplicated`], and moves no
    /// validity.
    pub(crate) fn renewals(&self, renewed: Vec<i64>, acked: Option<usize>) -> Vec<Renewal> {
        let short = self.too_few(acked);
        if let Some((acked, wanted)) = short {
            tracing::debug!(acked, wanted, "too few replicas acknowledged a renewal");
        }
        renewed
            .into_iter()
            .map(|r| match (r == 1, short) {
                (false, _) => Renewal::Gone,
                (true, None) => Renewal::RENEWED,
                (true, Some((acked, wanted))) => Renewal::NotReplicated { acked, wanted },
            })
            .collect()
    }
}
