//! Read-write locks on MySQL and MariaDB: each reader's share is a row of
//! `lock_runtime_shares` (its own token and lease, renewed and given back by its token), and
//! the key's row is their header while any is held: its token [`SHARES`] (a zero byte, as a
//! semaphore's header: no holder's token starts with one), its lease at least every share's. So
//! the one-statement acquire of a writer finds the key held, and by readers; a renewal raises
//! the header with the share, a release shortens it to the shares left or frees it.
//!
//! Every request is one transaction ([`tx`](super::tx)) under the key's row, as the lines'
//! ([`line`](super::line)): a reader enters while no writer holds the key and no waiting
//! writer's claim stands (a reader in already renews its share whatever claims stand); a
//! fenced reader reads the last writer's token (0: none).

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};

use sqlx::MySqlConnection;

pub(super) use super::line::SHARES;
use super::line::{claimed_for, lock_row, Outcome};
use super::tx::Step;
use super::MysqlStore;
use crate::store::sql::{millis, unsigned};
use crate::store::{Asked, Attempt, Lock, Released, Renewal};
use crate::LockError;

/// Every share of a key (binds: name): without a live header none is live.
const FORGET_ALL: &str = "DELETE FROM lock_runtime_shares WHERE name = ?";
/// Shares whose lease ended (binds: name).
const PURGE: &str = sql!("DELETE FROM lock_runtime_shares WHERE name = ? AND expires_ms <= " now_ms!());
/// Lengthens a live share, never shortening it (binds: ttl, name, token).
const RENEW: &str = sql!(
    "UPDATE lock_runtime_shares SET expires_ms = GREATEST(expires_ms, " now_ms!()
    " + ?) WHERE name = ? AND token = ? AND expires_ms > " now_ms!()
);
/// A new share (binds: name, token, ttl).
const ENTER: &str = sql!(
    "INSERT INTO lock_runtime_shares (name, token, expires_ms) VALUES (?, ?, " now_ms!() " + ?)"
);
/// Makes or raises the readers' header (binds: marker, ttl, name): the row is free, lapsed or
/// the header already (checked under its lock), so its lease only grows.
const RAISE: &str = sql!(
    "UPDATE lock_runtime_locks SET token = ?, expires_ms = GREATEST(expires_ms, " now_ms!()
    " + ?) WHERE name = ?"
);
/// Raises a readers' header found live under its row lock (binds: ttl, name, marker).
const RAISE_HEADER: &str = sql!(
    "UPDATE lock_runtime_locks SET expires_ms = GREATEST(expires_ms, " now_ms!()
    " + ?) WHERE name = ? AND token = ?"
);
/// Gives a live share back (binds: name, token).
const LEAVE: &str = sql!(
    "DELETE FROM lock_runtime_shares WHERE name = ? AND token = ? AND expires_ms > " now_ms!()
);
/// When the last live share ends (binds: name).
const LAST: &str = sql!(
    "SELECT MAX(expires_ms) FROM lock_runtime_shares WHERE name = ? AND expires_ms > " now_ms!()
);
/// Shortens the header to the last share's end (binds: end, name, marker).
const SHORTEN: &str =
    "UPDATE lock_runtime_locks SET expires_ms = LEAST(expires_ms, ?) WHERE name = ? AND token = ?";
/// Frees the header (binds: name, marker); its row stays with the key's fencing token.
const FREE: &str = sql!(
    "UPDATE lock_runtime_locks SET token = NULL, expires_ms = " now_ms!() " WHERE name = ? AND token = ?"
);
/// The live shares of the keys whose names start with a prefix (binds: prefix length, prefix):
/// name, token, ms left.
pub(super) const READERS: &str = sql!(
    "SELECT name, token, expires_ms - " now_ms!()
    " FROM lock_runtime_shares WHERE LEFT(name, ?) = ? AND expires_ms > " now_ms!()
);
/// The live shares of one key (binds: name), as [`READERS`].
pub(super) const READERS_OF: &str = sql!(
    "SELECT name, token, expires_ms - " now_ms!() " FROM lock_runtime_shares WHERE name = ? AND expires_ms > "
    now_ms!()
);

/// One attempt at a share (see the module doc).
fn enter<'c>(conn: &'c mut MySqlConnection, a: &'c Asked<'_>) -> Step<'c, Outcome> {
    Box::pin(async move {
        let (name, token, ask) = (a.lock.name(), a.token, a.ask);
        let row = lock_row(conn, name).await?;
        match row.live.as_deref() {
            Some(SHARES) | None => {}
            Some(live) if super::permits::count_of(live).is_some() => {
                return Ok(Outcome::Counted(row.count().unwrap_or(1)))
            }
            // A writer holds it.
            Some(_) => {
                return Ok(Outcome::Refused {
                    pttl_ms: Some(row.left_ms),
                    behind: false,
                    claimed: false,
                    ahead: 0,
                })
            }
        }
        if row.live.is_none() {
            // No live header: no share can be live (each ends no later than it), so any row
            // left is stale.
            sqlx::query(FORGET_ALL)
                .bind(name.as_bytes())
                .execute(&mut *conn)
                .await?;
        } else {
            sqlx::query(PURGE)
                .bind(name.as_bytes())
                .execute(&mut *conn)
                .await?;
        }
        let renewed = sqlx::query(RENEW)
            .bind(millis(ask.ttl_ms))
            .bind(name.as_bytes())
            .bind(token.as_bytes())
            .execute(&mut *conn)
            .await?;
        if renewed.rows_affected() == 0 {
            // Not in already: a waiting writer's claim keeps it out.
            if let Some(left) = claimed_for(conn, name).await? {
                return Ok(Outcome::Refused {
                    pttl_ms: Some(left),
                    behind: false,
                    claimed: false,
                    ahead: 0,
                });
            }
            sqlx::query(ENTER)
                .bind(name.as_bytes())
                .bind(token.as_bytes())
                .bind(millis(ask.ttl_ms))
                .execute(&mut *conn)
                .await?;
        }
        sqlx::query(RAISE)
            .bind(SHARES)
            .bind(millis(ask.ttl_ms))
            .bind(name.as_bytes())
            .execute(&mut *conn)
            .await?;
        Ok(Outcome::Taken {
            fence: ask.fencing.then(|| row.fence.map_or(0, unsigned)),
            permit: None,
        })
    })
}

/// A share's words, for a renewal or release.
struct Share<'a> {
    name: &'a str,
    token: &'a str,
    ttl_ms: u64,
}

/// Renews a share and raises its header: whether it was still held. The header is checked live
/// first, under its row lock: a share is never renewed past a header that lapsed (a writer may
/// take the key then, and must find no live share).
fn renew<'c>(conn: &'c mut MySqlConnection, s: &'c Share<'_>) -> Step<'c, bool> {
    Box::pin(async move {
        let header: Option<(Option<Vec<u8>>, i64, Option<i64>)> = sqlx::query_as(super::line::ROW)
            .bind(s.name.as_bytes())
            .fetch_optional(&mut *conn)
            .await?;
        if !matches!(header, Some((Some(token), left, _)) if token == SHARES && left > 0) {
            return Ok(false);
        }
        let renewed = sqlx::query(RENEW)
            .bind(millis(s.ttl_ms))
            .bind(s.name.as_bytes())
            .bind(s.token.as_bytes())
            .execute(&mut *conn)
            .await?;
        if renewed.rows_affected() == 0 {
            return Ok(false);
        }
        let raised = sqlx::query(RAISE_HEADER)
            .bind(millis(s.ttl_ms))
            .bind(s.name.as_bytes())
            .bind(SHARES)
            .execute(&mut *conn)
            .await?;
        Ok(raised.rows_affected() == 1)
    })
}

/// Gives a share back, and shortens or frees its header.
fn give_back<'c>(conn: &'c mut MySqlConnection, s: &'c Share<'_>) -> Step<'c, Released> {
    Box::pin(async move {
        sqlx::query(super::line::ROW)
            .bind(s.name.as_bytes())
            .fetch_optional(&mut *conn)
            .await?;
        let left = sqlx::query(LEAVE)
            .bind(s.name.as_bytes())
            .bind(s.token.as_bytes())
            .execute(&mut *conn)
            .await?;
        if left.rows_affected() == 0 {
            return Ok(Released::NotOurs);
        }
        let last: Option<i64> = sqlx::query_scalar(LAST)
            .bind(s.name.as_bytes())
            .fetch_one(&mut *conn)
            .await?;
        Ok(match last {
            Some(end) => {
                sqlx::query(SHORTEN)
                    .bind(end)
                    .bind(s.name.as_bytes())
                    .bind(SHARES)
                    .execute(&mut *conn)
                    .await?;
                // Other readers hold it still.
                Released::Quiet
            }
            None => {
                sqlx::query(FREE)
                    .bind(s.name.as_bytes())
                    .bind(SHARES)
                    .execute(&mut *conn)
                    .await?;
                Released::Freed
            }
        })
    })
}

/// The shares this client holds, by token (a renewal names the lock and the token only).
#[derive(Debug, Default)]
pub(super) struct Shares(Mutex<HashSet<String>>);

impl Shares {
    fn set(&self) -> MutexGuard<'_, HashSet<String>> {
        // Every update is one step, so a poisoned set is still consistent.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn holds(&self, token: &str) -> bool {
        self.set().contains(token)
    }
}

impl MysqlStore {
    /// One attempt at a share ([`enter`]).
    pub(super) async fn share_attempt(&self, asked: Asked<'_>) -> Result<Attempt, LockError> {
        let Asked { lock, token, .. } = asked;
        let outcome = self.transact(&asked, enter).await?;
        if let Outcome::Taken { .. } = outcome {
            self.shares.set().insert(token.to_owned());
        }
        outcome.attempt(lock.key(), 1)
    }

    /// Renews a share this client holds.
    pub(super) async fn renew_share(
        &self,
        lock: &Lock,
        token: &str,
        ttl_ms: u64,
    ) -> Result<Renewal, LockError> {
        let share = Share {
            name: lock.name(),
            token,
            ttl_ms,
        };
        let renewed = self.transact(&share, renew).await?;
        if !renewed {
            self.shares.set().remove(token);
        }
        Ok(Renewal::from_ours(renewed))
    }

    /// Gives a share back: [`Released::Quiet`] while other readers hold the key, `Freed` when it
    /// was the last.
    pub(super) async fn release_share(&self, lock: &Lock, token: &str) -> Result<Released, LockError> {
        self.shares.set().remove(token);
        let share = Share {
            name: lock.name(),
            token,
            ttl_ms: 0,
        };
        self.transact(&share, give_back).await
    }
}
