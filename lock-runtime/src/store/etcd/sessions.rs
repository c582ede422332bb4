//! A client's session leases: one per ttl class (a ttl rounded up to etcd's whole seconds),
//! granted at its first use and kept alive by the client's keeper, as etcd's own `concurrency`
//! sessions are, in the registry every queue store keeps ([`ByClass`]). Every key the client
//! writes for a lock (a holder's or a waiter's place in line) is attached to the session of its
//! ttl, so a client that dies or is cut off loses its locks within their ttl, when its sessions
//! lapse; nothing else is granted per lock. One unused for a minute with no key on it is
//! revoked.
//!
//! The keeper renews each session every third of its ttl, at most a second apart. Each renewal
//! answered says until when the server keeps the session at least (its send plus the ttl): a
//! lock taken on it is valid no longer than that (see [`Session::kept_until`]). A session etcd
//! says is gone (this client was cut off past its ttl) is forgotten: the next use grants a new
//! one, and the store learns which keys went with it.

use std::time::Duration;

use tokio::time::Instant;

use super::pool::Pool;
use crate::store::line::sessions::{self, class_of, ByClass};
use crate::LockError;

/// The longest time between two renewals of a session.
const LONGEST_INTERVAL: Duration = Duration::from_secs(1);

/// One session lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Session {
    /// The lease.
    pub(super) id: i64,
    /// Its ttl in seconds, as etcd granted it.
    pub(super) ttl_s: i64,
    /// The server keeps it at least until then: the send of its last renewal answered (or of
    /// its grant) plus its ttl.
    pub(super) kept_until: Instant,
    /// When its next renewal is due.
    due: Instant,
}

impl Session {
    fn ttl(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.ttl_s).unwrap_or(0))
    }

    /// How often it is renewed.
    fn interval(&self) -> Duration {
        (self.ttl() / 3).min(LONGEST_INTERVAL)
    }
}

impl sessions::Session for Session {
    fn id(&self) -> i64 {
        self.id
    }
}

/// A ttl in etcd's whole seconds, rounded up.
pub(super) fn seconds(ms: u64) -> i64 {
    i64::try_from(class_of(ms)).unwrap_or(i64::MAX)
}

/// The sessions of one client, by the ttl class asked for.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    by_class: ByClass<Session>,
}

/// What the keeper did with the sessions that were due.
#[derive(Debug, Default)]
pub(super) struct Kept {
    /// Sessions etcd no longer has: their keys went with them.
    pub(super) lapsed: Vec<i64>,
}

impl Sessions {
    /// The session for a lock of `ttl_ms` (`true`: granted now, there was none), renewed first
    /// if it has less than half its ttl left (its renewals are late: a lock taken on it would be
    /// short).
    pub(super) async fn for_ttl(&self, pool: &Pool, ttl_ms: u64) -> Result<(Session, bool), LockError> {
        let class = class_of(ttl_ms);
        let now = Instant::now();
        if let Some(session) = self.by_class.used(class) {
            if session.kept_until >= now + session.ttl() / 2 {
                return Ok((session, false));
            }
            if pool.keep_alive(session.id).await? {
                return Ok((self.renewed(session.id, now).unwrap_or(session), false));
            }
            self.forget(session.id);
        }
        let (id, ttl_s) = pool.grant(seconds(ttl_ms)).await?;
        let granted = Session {
            id,
            ttl_s,
            kept_until: now + Duration::from_secs(u64::try_from(ttl_s).unwrap_or(0)),
            due: now,
        };
        let granted = Session {
            due: now + granted.interval(),
            ..granted
        };
        // Two first uses at once: the first grant stays, the other lease is left to lapse (it
        // holds nothing).
        Ok((self.by_class.add(class, granted), true))
    }

    /// The session with lease `id`, if it is one of ours and alive.
    pub(super) fn by_id(&self, id: i64) -> Option<Session> {
        self.by_class.by_id(id)
    }

    /// A renewal of lease `id` sent at `sent` was answered: kept until `sent` plus its ttl.
    pub(super) fn renewed(&self, id: i64, sent: Instant) -> Option<Session> {
        self.by_class.update(id, |session| {
            session.kept_until = session.kept_until.max(sent + session.ttl());
            session.due = session.due.max(sent + session.interval());
            *session
        })
    }

    /// Lease `id` is gone.
    pub(super) fn forget(&self, id: i64) {
        self.by_class.forget(id);
    }

    /// When the next renewal is due.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.by_class.earliest(|s| s.due)
    }

    /// Revokes the sessions idle with no key on them (`in_use`; see
    /// [`ByClass::take_idle`]), renews every other that is due (a failed renewal is tried again
    /// soon), and forgets those etcd no longer has.
    pub(super) async fn keep(&self, pool: &Pool, in_use: impl Fn(i64) -> bool) -> Kept {
        let now = Instant::now();
        for session in self.by_class.take_idle(in_use) {
            let _ = pool.revoke(session.id).await;
        }
        let due = self.by_class.those(|s| s.due <= now);
        let renewals = due
            .iter()
            .map(|session| async move { (session, pool.keep_alive(session.id).await) });
        let mut kept = Kept::default();
        for (session, renewed) in futures_util::future::join_all(renewals).await {
            match renewed {
                Ok(true) => {
                    self.renewed(session.id, now);
                }
                Ok(false) => {
                    tracing::warn!(lease = session.id, "an etcd session lease ended (this client was cut off from etcd longer than its ttl): its locks are lost");
                    self.forget(session.id);
                    kept.lapsed.push(session.id);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "an etcd session lease could not be renewed; trying again");
                    self.by_class.update(session.id, |s| {
                        s.due = now + (s.interval() / 4).max(Duration::from_millis(50));
                    });
                }
            }
        }
        kept
    }

    /// Takes every session out (the client is going), to revoke them.
    pub(super) fn take_all(&self) -> Vec<i64> {
        self.by_class.take_all().into_iter().map(|s| s.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_asked_in_whole_seconds_and_renewed_at_least_every_second() {
        assert_eq!(
            (seconds(1000), seconds(1001), seconds(u64::MAX)),
            (1, 2, 18_446_744_073_709_552)
        );
        let now = Instant::now();
        let session = |ttl_s| Session {
            id: 1,
            ttl_s,
            kept_until: now,
            due: now,
        };
        assert_eq!(session(3).interval(), LONGEST_INTERVAL);
        assert!(session(2).interval() < LONGEST_INTERVAL);
        assert_eq!(session(30).interval(), LONGEST_INTERVAL);
    }
}
