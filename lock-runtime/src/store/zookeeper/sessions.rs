//! A client's ZooKeeper sessions: one per ttl class (a ttl rounded up to whole seconds), opened
//! at its first use, so that the nodes of a holder that dies lapse with its session within
//! about its ttl; kept in the registry every queue store keeps ([`ByClass`]), and closed when
//! unused for a minute with no node on them.
//!
//! What a lock on a session can count on is bounded by what the *leader* knows: it expires a
//! session a timeout after it last heard of it, and a follower reports a session's activity only
//! in its reply to the leader's next ping (every half tick). A lock granted by a request sent at
//! `t` is valid until `t + keeps`, where `keeps` is the timeout granted less a margin:
//!
//! ```text
//! margin  = conn / 2        the longest zookeeper-client stays silent (it pings 3/8 of its
//!                           per-server connection timeout `conn` after its last send, checked
//!                           every 1/8)
//!         + SKIP            a stall of the client's runtime shorter than the pulse notices
//!         + tick / 2        the follower's report, at the leader's next ping
//!         + SLACK           the network and the servers' queues
//! confirm = conn / 8 + tick / 2 + SLACK
//! ```
//!
//! While the client runs, the leader heard of the session at most `margin` before any request
//! (the client's previous send, reported within a half tick; by induction the session never
//! lapses), so it lives at least until `t - margin + timeout = t + keeps`. After a stall (see
//! [`super::pulse`]) that induction breaks: nothing was sent, and the first request after it may
//! be answered by a follower while the leader expires the session. Interleaving, with a 4 s
//! session on a follower: the client is stopped at 0 s; it thaws at 3.9 s, sends a `sync` and a
//! read at 3.95 s, and the follower (synced) answers that its node is first; the leader expires
//! the session at 4 s, before the follower's report of the request (due by 4.05 s); the next
//! waiter enters at 4.1 s. Counted from 3.95 s, the thawed holder would believe its lock valid
//! until 5.7 s. So after a stall a request counts only when sent `confirm` after it ended: by
//! then the client's ping (or request) sent within `conn / 8` of the thaw was reported, which
//! either refreshed the session at the leader (it lives a timeout from the report) or found it
//! expired (the node is gone, and the `sync` + read sent after the report sees that). A
//! reconnect revalidates the session at the leader itself, before any request goes.
//!
//! `tick` is probed once per client: a session asked for 2 s is granted at least the servers'
//! minimum, which is 2 ticks by default, so half the timeout granted bounds the tick (exactly,
//! with ZooKeeper's default tick of 2 s; at most 1 s below that). Servers configured with a
//! `minSessionTimeout` below two ticks make this bound too low: do not.
//!
//! A session the server ended (expired, closed, or whose client's task went with its runtime)
//! is replaced at its next use; the nodes on it went with it, and the holders are told (see
//! `Shared::session_ended`).

use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::{Client, SessionState};

use super::diagnose;
use super::pulse::SKIP;
use super::requests::{connect_error, unavailable, Ensemble};
use crate::store::line::sessions::{self, class_of, ByClass};
use crate::LockError;

/// The network's and the servers' share of the margin (see the module doc).
const SLACK: Duration = Duration::from_millis(100);

/// The session timeout asked of the probe whose grant bounds the servers' tick.
const PROBE_ASK: Duration = Duration::from_secs(2);

/// One session.
#[derive(Debug, Clone)]
pub(super) struct Session {
    pub(super) client: Client,
    /// Its id: the ephemeral owner of its nodes.
    pub(super) id: i64,
    /// How long after a request's send the servers keep the session (and its nodes) at least:
    /// the timeout they granted less the margin (see the module doc).
    pub(super) keeps: Duration,
    /// How long after a stall a request must be sent to count the session fresh (`confirm` in
    /// the module doc).
    pub(super) confirm: Duration,
    /// When it was opened (its handshake refreshed it at the leader).
    pub(super) opened: Instant,
}

impl sessions::Session for Session {
    fn id(&self) -> i64 {
        self.id
    }
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

/// What the servers' and the client's timing gives a session: see the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Timing {
    /// The servers' tick, at most.
    tick: Duration,
    /// The client's connection timeout per server.
    conn: Duration,
}

impl Timing {
    fn margin(self) -> Duration {
        self.conn / 2 + SKIP + self.tick / 2 + SLACK
    }

    fn confirm(self) -> Duration {
        self.conn / 8 + self.tick / 2 + SLACK
    }

    /// The session timeout asked for a class: the class and the margin.
    fn asked(self, class: u64) -> Duration {
        Duration::from_secs(class) + self.margin()
    }

    /// The timing once the servers granted `granted`: zookeeper-client shortens its connection
    /// timeout to 2/5 of the session's when the one asked is more than 3/5 of it.
    fn granted(self, granted: Duration) -> Timing {
        let conn = if self.conn > granted * 3 / 5 {
            granted * 2 / 5
        } else {
            self.conn
        };
        Timing { conn, ..self }
    }

    /// What a session granted `granted` keeps a lock at least, from a request's send.
    fn keeps(self, granted: Duration) -> Duration {
        granted.saturating_sub(self.granted(granted).margin())
    }
}

/// Each server's share of the connect timeout for its handshake (a frozen server tried first
/// must not use it all): at least a second. The client also counts a connection silent that
/// long as lost.
fn per_server(ensemble: &Ensemble) -> Duration {
    let servers = u32::try_from(ensemble.hosts.len().max(1)).unwrap_or(u32::MAX);
    (ensemble.timeouts.connect / servers).max(Duration::from_secs(1))
}

/// A session of `asked` on `ensemble`, its handshake given `conn` per server. When no server
/// grants one, the error names each server with what it did ([`diagnose`]).
async fn open(ensemble: &Ensemble, asked: Duration, conn: Duration) -> Result<Client, LockError> {
    let opened = tokio::time::timeout(
        ensemble.timeouts.connect,
        ensemble.access.connect(
            Client::connector()
                .with_session_timeout(asked)
                .with_connection_timeout(conn)
                .with_fail_eagerly(),
            &ensemble.connect_string(),
        ),
    )
    .await;
    let what = match opened {
        Ok(Ok(client)) => return Ok(client),
        Ok(Err(zookeeper_client::Error::NoHosts)) => "no server granted a session".to_owned(),
        Ok(Err(e)) => return Err(connect_error(ensemble, &e)),
        Err(_) => format!("no session within {:?}", ensemble.timeouts.connect),
    };
    let found = diagnose::servers(&ensemble.hosts, ensemble.access.is_tls()).await;
    Err(unavailable(ensemble, format!("{what}: {found}")))
}

/// The sessions of one client, by class.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    by_class: ByClass<Session>,
    /// Held across a connect, so that two first uses of a class open one session (lookups of
    /// the sessions that are open do not wait for it); guards the servers' tick, once probed.
    connecting: tokio::sync::Mutex<Option<Duration>>,
    /// The classes whose short grant was warned about (once each).
    warned: std::sync::Mutex<std::collections::HashSet<u64>>,
}

impl Sessions {
    /// The session of `class` if it is alive (marked used); one found ended is forgotten.
    fn alive(&self, class: u64) -> Option<Session> {
        let session = self.by_class.used(class)?;
        if session.is_alive() {
            return Some(session);
        }
        tracing::warn!(
            session = format_args!("{:#x}", session.id),
            "a ZooKeeper session ended (expired, or closed): its locks are lost; opening another"
        );
        self.by_class.forget(session.id);
        None
    }

    /// The session for locks of `ttl_ms`, opened now if there is none alive.
    pub(super) async fn for_ttl(&self, ensemble: &Ensemble, ttl_ms: u64) -> Result<Session, LockError> {
        let class = class_of(ttl_ms);
        if let Some(session) = self.alive(class) {
            return Ok(session);
        }
        let mut tick = self.connecting.lock().await;
        if let Some(session) = self.alive(class) {
            return Ok(session);
        }
        let conn = per_server(ensemble);
        let tick = match *tick {
            Some(tick) => tick,
            None => {
                // Closed when dropped: the servers' minimum session timeout is 2 ticks.
                let probe = open(ensemble, PROBE_ASK, conn.min(PROBE_ASK * 2 / 5)).await?;
                let bound = probe.session_timeout() / 2;
                tracing::debug!(tick = ?bound, "ZooKeeper's tick is at most this");
                *tick.insert(bound)
            }
        };
        let timing = Timing { tick, conn };
        let asked = timing.asked(class);
        let opening = Instant::now();
        let client = open(ensemble, asked, conn.min(asked * 2 / 5)).await?;
        let granted = client.session_timeout();
        let session = Session {
            id: client.session_id().0,
            keeps: timing.keeps(granted),
            confirm: timing.granted(granted).confirm(),
            opened: opening,
            client,
        };
        if session.keeps < Duration::from_secs(class) {
            self.short_grant(class, asked, granted, session.keeps);
        }
        // Opened under `connecting`, after the one there (if any) was found ended and forgotten.
        Ok(self.by_class.add(class, session))
    }

    /// Says once per class that the servers granted less than its locks' ttl: their validity
    /// is what the session keeps, renewed within it by the watchdog, and without it the holder is
    /// stopped then (`Lost`), before the servers could expire the session.
    fn short_grant(&self, class: u64, asked: Duration, granted: Duration, keeps: Duration) {
        let first = self
            .warned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(class);
        if first {
            tracing::warn!(
                ttl = ?Duration::from_secs(class),
                ?asked,
                ?granted,
                validity = ?keeps,
                "ZooKeeper granted a session of {granted:?} to locks of a ttl up to {class}s \
                 (asked {asked:?}; the servers' maxSessionTimeout is lower): such a lock is \
                 valid for {keeps:?} at a time; the watchdog renews it within that, and without \
                 the watchdog its holder is stopped (Lost) then; raise maxSessionTimeout, or use \
                 the watchdog"
            );
        }
    }

    /// Forgets the session `id` (the server ended it): the next use opens another.
    pub(super) fn forget(&self, id: i64) {
        self.by_class.forget(id);
    }

    /// The session with id `id`, if it is one of ours and alive.
    pub(super) fn by_id(&self, id: i64) -> Option<Session> {
        self.by_class.by_id(id).filter(Session::is_alive)
    }

    /// Closes the sessions idle with no node of this client on them (`in_use`; see
    /// [`ByClass::take_idle`]): dropping the last handle on a session closes it.
    pub(super) fn close_idle(&self, in_use: impl Fn(i64) -> bool) {
        drop(self.by_class.take_idle(in_use));
    }

    /// When the next session may become idle.
    pub(super) fn next_idle(&self) -> Option<Instant> {
        self.by_class.next_idle()
    }

    /// Takes every session out (the client is going): dropping them closes them.
    pub(super) fn take_all(&self) -> Vec<Session> {
        self.by_class.take_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_keep_at_least_their_class() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // ZooKeeper's default tick, one server, the default connect timeout.
        let timing = Timing {
            tick: s(2),
            conn: s(5),
        };
        assert_eq!(timing.margin(), ms(2500 + 300 + 1000 + 100));
        for (tick, conn) in [(s(2), s(5)), (ms(100), s(1)), (s(1), ms(1666)), (s(4), s(10))] {
            let timing = Timing { tick, conn };
            for class in [1, 2, 3, 10, 30, 600] {
                let asked = timing.asked(class);
                assert!(timing.keeps(asked) >= s(class), "{class} {timing:?}");
                assert!(timing.keeps(asked) < asked, "{class} {timing:?}");
                assert!(timing.granted(asked).confirm() < timing.granted(asked).margin());
            }
        }
        // Granted less than asked (the servers' maximum): what is left after the margin, with
        // the client's connection timeout shortened to 2/5 of the session's.
        let timing = |tick, conn| Timing { tick, conn };
        assert_eq!(
            timing(s(2), s(5)).keeps(s(40)),
            s(40) - ms(2500 + 300 + 1000 + 100)
        );
        assert_eq!(timing(ms(100), s(5)).keeps(s(2)), s(2) - ms(400 + 300 + 50 + 100));
    }
}
