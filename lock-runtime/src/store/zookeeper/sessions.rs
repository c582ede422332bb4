//! A client's ZooKeeper sessions: one per ttl class (a ttl rounded up to whole seconds), opened
//! at its first use, so that the nodes of a holder that dies lapse with its session within
//! about its ttl. The session timeout asked for is the class plus a margin ([`MARGIN`], at most
//! the class itself): the leader learns that a session is alive from the server the client talks
//! to, at that server's next ping (every tick), so it may count the session's timeout from a
//! moment up to a tick before this client's request. The servers bound every session timeout (by
//! default between 2 and 20 ticks: 4 s and 40 s with the default 2 s tick): what a lock on the
//! session can count on is the timeout granted less that margin ([`Session::keeps`]), which
//! is the whole class unless the servers granted less than was asked.
//!
//! A session the server ended (expired, closed, or whose client's task went with its runtime)
//! is replaced at its next use; the nodes on it went with it, which the holders find at their
//! next renewal and the waiters when they look again.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::{Client, SessionState};

use super::requests::{connect_error, unavailable, Ensemble};
use crate::LockError;

/// A session unused this long, with no node on it, is closed.
pub(super) const IDLE: Duration = Duration::from_secs(60);

/// What a session's timeout is asked above its class, and what a lock counts below the timeout
/// granted: ZooKeeper's default tick (at most half the timeout granted).
pub(super) const MARGIN: Duration = Duration::from_secs(2);

/// One session.
#[derive(Debug, Clone)]
pub(super) struct Session {
    pub(super) client: Client,
    /// Its id: the ephemeral owner of its nodes.
    pub(super) id: i64,
    /// How long after a request's send the servers keep the session (and its nodes) at least:
    /// the timeout they granted less the margin (see the module doc).
    pub(super) keeps: Duration,
    /// When a lock last asked for it.
    used: Instant,
}

impl Session {
    /// Whether the server may still keep it (not expired, closed or refused).
    pub(super) fn is_alive(&self) -> bool {
        !matches!(
            self.client.state(),
            SessionState::Expired | SessionState::Closed | SessionState::AuthFailed
        )
    }
}

/// A ttl in whole seconds, rounded up.
pub(super) fn class_of(ttl_ms: u64) -> u64 {
    ttl_ms.div_ceil(1000).max(1)
}

/// The session timeout asked for a class: the class and a margin of at most the class.
fn asked(class: u64) -> Duration {
    let class = Duration::from_secs(class);
    class + MARGIN.min(class)
}

/// What a session whose granted timeout is `granted` keeps a lock at least, from a request's
/// send.
fn keeps(granted: Duration) -> Duration {
    granted - MARGIN.min(granted / 2)
}

/// The sessions of one client, by class.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    /// Never held across an await.
    by_class: std::sync::Mutex<HashMap<u64, Session>>,
    /// Held across a connect, so that two first uses of a class open one session (lookups of
    /// the sessions that are open do not wait for it).
    connecting: tokio::sync::Mutex<()>,
}

impl Sessions {
    fn all(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Session>> {
        // Every update is one step, so a poisoned map is still consistent.
        self.by_class.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The session of `class` if it is alive (marked used); one found ended is forgotten.
    fn alive(&self, class: u64) -> Option<Session> {
        let mut all = self.all();
        match all.get_mut(&class) {
            Some(session) if session.is_alive() => {
                session.used = Instant::now();
                Some(session.clone())
            }
            Some(session) => {
                tracing::warn!(
                    session = format_args!("{:#x}", session.id),
                    "a ZooKeeper session ended (expired, or closed): its locks are lost; opening another"
                );
                all.remove(&class);
                None
            }
            None => None,
        }
    }

    /// The session for locks of `ttl_ms`, opened now if there is none alive.
    pub(super) async fn for_ttl(&self, ensemble: &Ensemble, ttl_ms: u64) -> Result<Session, LockError> {
        let class = class_of(ttl_ms);
        if let Some(session) = self.alive(class) {
            return Ok(session);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(session) = self.alive(class) {
            return Ok(session);
        }
        // Each server gets a share of the connect timeout for its handshake (a frozen server
        // tried first must not use it all): at least a second, and at most the 2/5 of the
        // session's timeout the client takes by default. The client also counts a connection
        // silent that long as lost (it pings every 3/8 of it).
        let servers = u32::try_from(ensemble.hosts.len().max(1)).unwrap_or(u32::MAX);
        let per_server = (ensemble.timeouts.connect / servers)
            .max(Duration::from_secs(1))
            .min(asked(class) * 2 / 5);
        let connector = Client::connector()
            .with_session_timeout(asked(class))
            .with_connection_timeout(per_server)
            .with_fail_eagerly();
        let client = tokio::time::timeout(
            ensemble.timeouts.connect,
            ensemble.access.connect(connector, &ensemble.connect_string()),
        )
        .await
        .map_err(|_| {
            unavailable(
                ensemble,
                format!("no session within {:?}", ensemble.timeouts.connect),
            )
        })?
        .map_err(|e| connect_error(ensemble, &e))?;
        let session = Session {
            id: client.session_id().0,
            keeps: keeps(client.session_timeout()),
            client,
            used: Instant::now(),
        };
        self.all().insert(class, session.clone());
        Ok(session)
    }

    /// Forgets the session `id` (the server ended it): the next use opens another.
    pub(super) fn forget(&self, id: i64) {
        self.all().retain(|_, s| s.id != id);
    }

    /// The session with id `id`, if it is one of ours and alive.
    pub(super) fn by_id(&self, id: i64) -> Option<Session> {
        self.all().values().find(|s| s.id == id && s.is_alive()).cloned()
    }

    /// Closes the sessions unused for [`IDLE`] on which no node of this client is (`in_use`):
    /// dropping the last handle on a session closes it. A session in use counts as used now.
    pub(super) fn close_idle(&self, in_use: impl Fn(i64) -> bool) {
        let now = Instant::now();
        self.all().retain(|_, s| {
            if in_use(s.id) {
                s.used = now;
            }
            now.saturating_duration_since(s.used) < IDLE
        });
    }

    /// When the next session may become idle.
    pub(super) fn next_idle(&self) -> Option<Instant> {
        self.all().values().map(|s| s.used + IDLE).min()
    }

    /// Takes every session out (the client is going): dropping them closes them.
    pub(super) fn take_all(&self) -> Vec<Session> {
        self.all().drain().map(|(_, s)| s).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds_and_sessions_keep_at_least_their_class() {
        assert_eq!(class_of(1), 1);
        assert_eq!(class_of(1000), 1);
        assert_eq!(class_of(1001), 2);
        assert_eq!(class_of(30_000), 30);
        let s = Duration::from_secs;
        assert_eq!(asked(1), s(2));
        assert_eq!(asked(30), s(32));
        for class in [1, 2, 3, 10, 30, 600] {
            assert!(keeps(asked(class)) >= s(class), "{class}");
            assert!(keeps(asked(class)) < asked(class), "{class}");
        }
        // Granted less than asked (the servers' maximum): what is left after the margin.
        assert_eq!(keeps(s(40)), s(38));
        assert_eq!(keeps(s(2)), s(1));
    }
}
