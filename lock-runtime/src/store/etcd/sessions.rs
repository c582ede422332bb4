//! A client's session leases: one per ttl class (a ttl rounded up to etcd's whole seconds),
//! granted at its first use and kept alive by the client's keeper, as etcd's own `concurrency`
//! sessions are. Every key the client writes for a lock (a holder's or a waiter's place in line)
//! is attached to the session of its ttl, so a client that dies or is cut off loses its locks
//! within their ttl, when its sessions lapse; nothing else is granted per lock.
//!
//! The keeper renews each session every third of its ttl, at most a second apart. Each renewal
//! answered says until when the server keeps the session at least (its send plus the ttl): a
//! lock taken on it is valid no longer than that (see [`Session::kept_until`]). A session etcd
//! says is gone (this client was cut off past its ttl) is forgotten: the next use grants a new
//! one, and the store learns which keys went with it.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::pool::Pool;
use crate::LockError;

/// The longest time between two renewals of a session.
const LONGEST_INTERVAL: Duration = Duration::from_secs(1);

/// A session unused this long, with no key on it, is revoked.
pub(super) const IDLE: Duration = Duration::from_secs(60);

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
    /// When a lock last asked for it.
    used: Instant,
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

/// A ttl in etcd's whole seconds, rounded up.
pub(super) fn seconds(ms: u64) -> i64 {
    i64::try_from(ms.div_ceil(1000).max(1)).unwrap_or(i64::MAX)
}

/// The sessions of one client, by the ttl class asked for.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    by_class: Mutex<HashMap<i64, Session>>,
}

/// What the keeper did with the sessions that were due.
#[derive(Debug, Default)]
pub(super) struct Kept {
    /// Sessions etcd no longer has: their keys went with them.
    pub(super) lapsed: Vec<i64>,
}

impl Sessions {
    fn all(&self) -> MutexGuard<'_, HashMap<i64, Session>> {
        // Every update is one step, so a poisoned map is still consistent.
        self.by_class.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The session for a lock of `ttl_ms` (`true`: granted now, there was none), renewed first
    /// if it has less than half its ttl left (its renewals are late: a lock taken on it would be
    /// short).
    pub(super) async fn for_ttl(&self, pool: &Pool, ttl_ms: u64) -> Result<(Session, bool), LockError> {
        let class = seconds(ttl_ms);
        let now = Instant::now();
        let known = self.all().get_mut(&class).map(|session| {
            session.used = now;
            *session
        });
        if let Some(session) = known {
            if session.kept_until >= now + session.ttl() / 2 {
                return Ok((session, false));
            }
            if pool.keep_alive(session.id).await? {
                return Ok((self.renewed(session.id, now).unwrap_or(session), false));
            }
            self.forget(session.id);
        }
        let (id, ttl_s) = pool.grant(class).await?;
        let granted = Session {
            id,
            ttl_s,
            kept_until: now + Duration::from_secs(u64::try_from(ttl_s).unwrap_or(0)),
            due: now,
            used: now,
        };
        let granted = Session {
            due: now + granted.interval(),
            ..granted
        };
        let mut all = self.all();
        // Two first uses at once: the first grant stays, the other lease is left to lapse (it
        // holds nothing).
        Ok((*all.entry(class).or_insert(granted), true))
    }

    /// The session with lease `id`, if it is one of ours and alive.
    pub(super) fn by_id(&self, id: i64) -> Option<Session> {
        self.all().values().find(|s| s.id == id).copied()
    }

    /// A renewal of lease `id` sent at `sent` was answered: kept until `sent` plus its ttl.
    pub(super) fn renewed(&self, id: i64, sent: Instant) -> Option<Session> {
        let mut all = self.all();
        let session = all.values_mut().find(|s| s.id == id)?;
        session.kept_until = session.kept_until.max(sent + session.ttl());
        session.due = session.due.max(sent + session.interval());
        Some(*session)
    }

    /// Lease `id` is gone.
    pub(super) fn forget(&self, id: i64) {
        self.all().retain(|_, s| s.id != id);
    }

    /// When the next renewal is due.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.all().values().map(|s| s.due).min()
    }

    /// Renews every session that is due (a failed renewal is tried again soon), forgets those
    /// etcd no longer has, and revokes those unused for [`IDLE`] with no key on them
    /// (`in_use`).
    pub(super) async fn keep(&self, pool: &Pool, in_use: impl Fn(i64) -> bool) -> Kept {
        let now = Instant::now();
        let (due, idle): (Vec<Session>, Vec<Session>) = {
            let all = self.all();
            let due = all.values().filter(|s| s.due <= now).copied().collect();
            let idle = all
                .values()
                .filter(|s| now.saturating_duration_since(s.used) >= IDLE && !in_use(s.id))
                .copied()
                .collect();
            (due, idle)
        };
        for session in &idle {
            self.forget(session.id);
            let _ = pool.revoke(session.id).await;
        }
        let renewals = due
            .iter()
            .filter(|s| !idle.contains(s))
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
                    if let Some(s) = self.all().values_mut().find(|s| s.id == session.id) {
                        s.due = now + (s.interval() / 4).max(Duration::from_millis(50));
                    }
                }
            }
        }
        kept
    }

    /// Takes every session out (the client is going), to revoke them.
    pub(super) fn take_all(&self) -> Vec<i64> {
        self.all().drain().map(|(_, s)| s.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds_and_renewals_come_at_least_every_second() {
        assert_eq!(seconds(1), 1);
        assert_eq!(seconds(1000), 1);
        assert_eq!(seconds(1001), 2);
        let now = Instant::now();
        let session = |ttl_s| Session {
            id: 1,
            ttl_s,
            kept_until: now,
            due: now,
            used: now,
        };
        assert_eq!(session(3).interval(), LONGEST_INTERVAL);
        assert!(session(2).interval() < LONGEST_INTERVAL);
        assert_eq!(session(30).interval(), LONGEST_INTERVAL);
    }
}
