//! Fair mode, writers' claims and fair semaphores on MySQL and MariaDB: lines of places in
//! `lock_runtime_line`, by arrival (an auto-increment number), each place kept for
//! [`FAIR_PLACE_KEPT`] from its waiter's last attempt, so a place whose client vanished lapses.
//! A lock's line has the lock's name; a fair semaphore's, the name and `#permits`; the writers
//! waiting for a read-write lock's readers to leave, the name and `#claims` (a lock's name ends
//! in `}`, so no lock's line is another's).
//!
//! Each request is one transaction ([`tx`](super::tx)) that locks the key's row first: every
//! change to a key's lines is made under it, so no two requests of one key interleave.
//!
//! - A fair attempt takes the lock only when it is free and the caller heads the line (or the
//!   line is empty): a newcomer never barges in while someone waits. Refused, a caller that will
//!   wait takes or keeps its place.
//! - A fair release names the head of the line: this client wakes it at once if it is its own;
//!   another client's head finds the lock free at its next poll (8 to 256 ms), as any waiter of
//!   another client here.
//! - A fair semaphore's caller takes a permit only while fewer waiters are ahead of it than
//!   permits are free; a release names the waiter it admits (the one at rank `free - 1`).
//! - A writer refused by readers that will wait claims its turn: no reader that is not in
//!   already enters while a claim stands, so readers cannot starve a writer.

use sqlx::MySqlConnection;

use super::permits::{count_of, permit_row, permits_line, taken_permits, Held};
use super::tx::Step;
use super::MysqlStore;
use crate::options::FAIR_PLACE_KEPT;
use crate::store::sql::{ask, millis, unsigned};
use crate::store::{permits_differ, Asked, Attempt, Lock, Released};
use crate::LockError;

/// The token of a readers' header (see [`shares`](super::shares)): a zero byte first, as a
/// semaphore's header, so no holder's token is one.
pub(super) const SHARES: &[u8] = b"\0shares";

/// Locks the key's row until the transaction ends, made (free) if missing (binds: name).
const LOCK_ROW: &str = "INSERT INTO lock_runtime_locks (name, token, expires_ms, fence) \
     VALUES (?, NULL, 0, NULL) ON DUPLICATE KEY UPDATE name = name";
/// The key's row (binds: name): its token, how long its lease has left (at most 0: ended) and
/// its fencing token.
pub(super) const ROW: &str = sql!(
    "SELECT token, expires_ms - " now_ms!() ", fence FROM lock_runtime_locks WHERE name = ? FOR UPDATE"
);
/// Places that lapsed (binds: line).
const PURGE: &str = sql!("DELETE FROM lock_runtime_line WHERE name = ? AND kept_until <= " now_ms!());
/// The head of a line (binds: line).
const HEAD: &str = "SELECT token FROM lock_runtime_line WHERE name = ? ORDER BY id LIMIT 1";
/// The live waiter at a rank of a line (binds: line, rank).
const AT_RANK: &str = sql!(
    "SELECT token FROM lock_runtime_line WHERE name = ? AND kept_until > " now_ms!()
    " ORDER BY id LIMIT 1 OFFSET ?"
);
/// A waiter's place (binds: line, token).
const PLACE: &str = "SELECT id FROM lock_runtime_line WHERE name = ? AND token = ?";
/// How many waiters are ahead of a place (binds: line, the place's number).
const AHEAD: &str = "SELECT COUNT(*) FROM lock_runtime_line WHERE name = ? AND id < ?";
/// Keeps a place (binds: ms, line, token).
const KEEP: &str = sql!(
    "UPDATE lock_runtime_line SET kept_until = " now_ms!() " + ? WHERE name = ? AND token = ?"
);
/// Takes a place at the end of a line (binds: line, token, ms).
const JOIN: &str = sql!(
    "INSERT INTO lock_runtime_line (name, token, kept_until) VALUES (?, ?, " now_ms!() " + ?)"
);
/// Leaves a line (binds: line, token).
const LEAVE: &str = "DELETE FROM lock_runtime_line WHERE name = ? AND token = ?";
/// Leaves every line of a key (binds: token, the three lines).
const LEAVE_ALL: &str = "DELETE FROM lock_runtime_line WHERE token = ? AND name IN (?, ?, ?)";
/// How long the last standing claim has left (binds: claims line).
const CLAIMED_FOR: &str = sql!(
    "SELECT MAX(kept_until) - " now_ms!() " FROM lock_runtime_line WHERE name = ? AND kept_until > " now_ms!()
);
/// Takes the locked row for a token (binds: token, ttl, fencing, name).
const TAKE_ROW: &str = sql!(
    "UPDATE lock_runtime_locks SET token = ?, expires_ms = " now_ms!() " + ?, fence = IF(?, GREATEST("
    now_us!() ", COALESCE(fence, 0) + 1), fence) WHERE name = ?"
);
/// The row is this token's already (a request sent again): its lease counts from now, and it
/// takes a fencing token if it has none (binds: ttl, fencing, name).
const KEEP_OURS: &str = sql!(
    "UPDATE lock_runtime_locks SET expires_ms = GREATEST(expires_ms, " now_ms!()
    " + ?), fence = IF(? AND fence IS NULL, " now_us!() ", fence) WHERE name = ?"
);
/// The row's fencing token (binds: name).
const FENCE: &str = "SELECT fence FROM lock_runtime_locks WHERE name = ?";

/// The claims of the writers waiting for the readers of the lock named `lock`.
pub(super) fn claims_line(lock: &str) -> String {
    format!("{lock}#claims")
}

/// How long a place or claim is kept after its waiter's attempt.
fn place_ms() -> i64 {
    millis(u64::try_from(FAIR_PLACE_KEPT.as_millis()).unwrap_or(u64::MAX))
}

/// What one attempt inside a transaction came to.
pub(super) enum Outcome {
    /// Taken, with its fencing token when asked for (and this permit, for a semaphore).
    Taken { fence: Option<u64>, permit: Option<u32> },
    /// Refused: the holder's remaining ms (none: free, others are ahead in line), whether the
    /// caller is behind others in line, whether it claimed the writers' turn, and how many
    /// waiters are ahead of it (a fair semaphore's).
    Refused {
        pttl_ms: Option<u64>,
        behind: bool,
        claimed: bool,
        ahead: u64,
    },
    /// The key is held with this count (a lock, a read-write lock: 1).
    Counted(u32),
}

impl Outcome {
    /// As the client's attempt, for a caller asking `permits`.
    pub(super) fn attempt(self, key: &str, permits: u32) -> Result<Attempt, LockError> {
        match self {
            Outcome::Taken {
                fence,
                permit: Some(permit),
            } => Ok(Attempt::permit(fence, permit)),
            Outcome::Taken { fence, permit: None } => Ok(Attempt::acquired(fence)),
            Outcome::Refused { pttl_ms, ahead, .. } if permits > 1 => {
                Ok(Attempt::no_permit(pttl_ms, ahead, permits))
            }
            Outcome::Refused {
                pttl_ms,
                behind,
                claimed,
                ..
            } => Ok(Attempt::Held {
                pttl_ms,
                behind,
                claimed,
                kept: None,
            }),
            Outcome::Counted(held) => Err(permits_differ(key, held, permits)),
        }
    }
}

/// The key's row, locked until the transaction ends: its token while its lease lasts, and its
/// fencing token.
pub(super) struct Row {
    pub(super) live: Option<Vec<u8>>,
    pub(super) left_ms: u64,
    pub(super) fence: Option<i64>,
}

impl Row {
    /// The count a semaphore's header holds the key with, or 1 for a lock's holder or readers.
    pub(super) fn count(&self) -> Option<u32> {
        self.live.as_deref().map(|token| count_of(token).unwrap_or(1))
    }
}

/// Locks the key's row (made free if missing) and reads it.
pub(super) async fn lock_row(conn: &mut MySqlConnection, name: &str) -> Result<Row, sqlx::Error> {
    sqlx::query(LOCK_ROW)
        .bind(name.as_bytes())
        .execute(&mut *conn)
        .await?;
    let (token, left, fence): (Option<Vec<u8>>, i64, Option<i64>) = sqlx::query_as(ROW)
        .bind(name.as_bytes())
        .fetch_one(&mut *conn)
        .await?;
    Ok(Row {
        live: token.filter(|_| left > 0),
        left_ms: unsigned(left),
        fence,
    })
}

/// Keeps `token`'s place in `line`, or takes one at its end.
async fn keep_place(conn: &mut MySqlConnection, line: &str, token: &str) -> Result<(), sqlx::Error> {
    let kept = sqlx::query(KEEP)
        .bind(place_ms())
        .bind(line.as_bytes())
        .bind(token.as_bytes())
        .execute(&mut *conn)
        .await?;
    // sqlx's connections count matched rows: 1 also when the end did not move.
    if kept.rows_affected() == 0 {
        sqlx::query(JOIN)
            .bind(line.as_bytes())
            .bind(token.as_bytes())
            .bind(place_ms())
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

async fn leave_line(conn: &mut MySqlConnection, line: &str, token: &str) -> Result<(), sqlx::Error> {
    sqlx::query(LEAVE)
        .bind(line.as_bytes())
        .bind(token.as_bytes())
        .execute(conn)
        .await?;
    Ok(())
}

/// The head of `line`, its lapsed places deleted first.
async fn head(conn: &mut MySqlConnection, line: &str) -> Result<Option<Vec<u8>>, sqlx::Error> {
    sqlx::query(PURGE)
        .bind(line.as_bytes())
        .execute(&mut *conn)
        .await?;
    sqlx::query_scalar(HEAD)
        .bind(line.as_bytes())
        .fetch_optional(conn)
        .await
}

/// A row this transaction took: taken, with the row's fencing token (read after the
/// transaction set it) when asked for.
async fn taken(conn: &mut MySqlConnection, name: &str, fencing: bool) -> Result<Outcome, sqlx::Error> {
    let fence = match fencing {
        true => sqlx::query_scalar::<_, Option<i64>>(FENCE)
            .bind(name.as_bytes())
            .fetch_one(conn)
            .await?
            .map(unsigned),
        false => None,
    };
    Ok(Outcome::Taken { fence, permit: None })
}

/// How long the writers' claims on the lock named `name` stand yet (none: no claim stands).
pub(super) async fn claimed_for(conn: &mut MySqlConnection, name: &str) -> Result<Option<u64>, sqlx::Error> {
    let left: Option<i64> = sqlx::query_scalar(CLAIMED_FOR)
        .bind(claims_line(name).as_bytes())
        .fetch_one(conn)
        .await?;
    Ok(left.map(unsigned))
}

/// One attempt at an exclusive lock that needs more than the one-statement acquire: fair, a
/// writer refused by readers, or a key whose row is a header (see the module doc).
pub(super) fn exclusive<'c>(conn: &'c mut MySqlConnection, a: &'c Asked<'_>) -> Step<'c, Outcome> {
    Box::pin(async move {
        let (name, token, ask) = (a.lock.name(), a.token, a.ask);
        let row = lock_row(conn, name).await?;
        match row.live.as_deref() {
            Some(live) if count_of(live).is_some() => return Ok(Outcome::Counted(row.count().unwrap_or(1))),
            Some(live) if live == token.as_bytes() => {
                // Ours already (a request sent again): its lease counts from now.
                sqlx::query(KEEP_OURS)
                    .bind(millis(ask.ttl_ms))
                    .bind(ask.fencing)
                    .bind(name.as_bytes())
                    .execute(&mut *conn)
                    .await?;
                return taken(conn, name, ask.fencing).await;
            }
            _ => {}
        }
        let readers = row.live.as_deref() == Some(SHARES);
        let holder = row.live.is_some().then_some(row.left_ms);
        // Readers share it: a writer that will wait claims its turn, so no new reader enters.
        let claimed = readers && ask.join;
        if claimed {
            keep_place(conn, &claims_line(name), token).await?;
        }
        if ask.mode.fair() {
            let head = head(conn, name).await?;
            let others_first = head.as_deref().is_some_and(|h| h != token.as_bytes());
            if holder.is_some() || others_first {
                let mut in_line = others_first
                    && sqlx::query_scalar::<_, i64>(PLACE)
                        .bind(name.as_bytes())
                        .bind(token.as_bytes())
                        .fetch_optional(&mut *conn)
                        .await?
                        .is_some();
                if ask.join {
                    keep_place(conn, name, token).await?;
                    in_line = true;
                }
                return Ok(Outcome::Refused {
                    pttl_ms: holder,
                    behind: in_line && others_first,
                    claimed,
                    ahead: 0,
                });
            }
            leave_line(conn, name, token).await?;
        }
        if holder.is_some() {
            return Ok(Outcome::Refused {
                pttl_ms: holder,
                behind: false,
                claimed,
                ahead: 0,
            });
        }
        if ask.claimed {
            leave_line(conn, &claims_line(name), token).await?;
        }
        sqlx::query(TAKE_ROW)
            .bind(token.as_bytes())
            .bind(millis(ask.ttl_ms))
            .bind(ask.fencing)
            .bind(name.as_bytes())
            .execute(&mut *conn)
            .await?;
        taken(conn, name, ask.fencing).await
    })
}

/// One attempt at a permit of a fair semaphore (see the module doc): the permit is claimed by
/// the one-statement claim of [`permits`](super::permits), under the key's row this
/// transaction holds, so no other claim comes between the read and the claim.
pub(super) fn fair_permit<'c>(conn: &'c mut MySqlConnection, a: &'c Asked<'_>) -> Step<'c, Outcome> {
    Box::pin(async move {
        let (name, token, ask) = (a.lock.name(), a.token, a.ask);
        let count = ask.mode.permits();
        let row = lock_row(conn, name).await?;
        match row.count() {
            Some(held) if held != count => return Ok(Outcome::Counted(held)),
            _ => {}
        }
        let line = permits_line(name);
        sqlx::query(PURGE)
            .bind(line.as_bytes())
            .execute(&mut *conn)
            .await?;
        let place: Option<i64> = sqlx::query_scalar(PLACE)
            .bind(line.as_bytes())
            .bind(token.as_bytes())
            .fetch_optional(&mut *conn)
            .await?;
        let ahead: i64 = sqlx::query_scalar(AHEAD)
            .bind(line.as_bytes())
            .bind(place.unwrap_or(i64::MAX))
            .fetch_one(&mut *conn)
            .await?;
        let rows = super::permits::rows_of_permits(conn, name).await?;
        let (taken, first_end) = match taken_permits(&rows, name, count) {
            Ok(taken) => taken,
            Err(held) => return Ok(Outcome::Counted(held)),
        };
        // This token's permit already (a request sent again), or the lowest free one.
        let own = rows.iter().find_map(|(row_name, live, _)| {
            let ours = live.as_deref() == Some(token.as_bytes());
            let parsed = std::str::from_utf8(row_name)
                .ok()
                .and_then(super::permits::parse_permit_row);
            parsed.filter(|(of, _, _)| ours && *of == name).map(|(_, _, p)| p)
        });
        let free = count.saturating_sub(u32::try_from(taken.len()).unwrap_or(u32::MAX));
        let permit = match own {
            Some(own) => Some(own),
            None if unsigned(ahead) < u64::from(free) => (0..count).find(|p| !taken.contains(p)),
            None => None,
        };
        let Some(permit) = permit else {
            if ask.join {
                keep_place(conn, &line, token).await?;
            }
            return Ok(Outcome::Refused {
                pttl_ms: first_end,
                behind: false,
                claimed: false,
                ahead: unsigned(ahead),
            });
        };
        let fence = super::permits::claim(conn, a.lock, token, ask, permit).await?;
        leave_line(conn, &line, token).await?;
        Ok(Outcome::Taken {
            fence: ask.fencing.then_some(fence),
            permit: Some(permit),
        })
    })
}

impl MysqlStore {
    /// An exclusive attempt in a transaction ([`exclusive`]).
    pub(super) async fn exclusive_attempt(&self, asked: Asked<'_>) -> Result<Attempt, LockError> {
        let outcome = self.transact(&asked, exclusive).await?;
        outcome.attempt(asked.lock.key(), 1)
    }

    /// A fair semaphore's attempt in a transaction ([`fair_permit`]).
    pub(super) async fn fair_permit_attempt(&self, asked: Asked<'_>) -> Result<Attempt, LockError> {
        let Asked { lock, token, ask } = asked;
        let outcome = self.transact(&asked, fair_permit).await?;
        if let Outcome::Taken {
            permit: Some(permit), ..
        } = outcome
        {
            let held = Held {
                row: Lock::new(lock.key(), permit_row(lock.name(), ask.mode.permits(), permit)),
                header: lock.name().to_owned(),
                marker: super::permits::marker(ask.mode.permits()),
                fair: true,
            };
            self.permits.hold(token, held);
        }
        outcome.attempt(lock.key(), ask.mode.permits())
    }

    /// The waiter a fair release admits: the head of the lock's line (the lock is free), or the
    /// waiter at rank `free - 1` of a fair semaphore's (`free` permits free after the release).
    /// Asked after the release is done: a failure to read it only leaves the waking to the next
    /// poll (the release stands, and is answered `Freed`).
    pub(super) async fn admitted(&self, line: &str, free: u32) -> Released {
        let Some(rank) = free.checked_sub(1) else {
            return Released::Freed;
        };
        let named: Result<Option<Vec<u8>>, LockError> = async {
            Ok(ask!(self, |conn| sqlx::query_scalar(AT_RANK)
                .bind(line.as_bytes())
                .bind(rank)
                .fetch_optional(conn))?)
        }
        .await;
        match named.map(|n| n.map(String::from_utf8)) {
            Ok(Some(Ok(waiter))) => Released::Named(waiter),
            Ok(_) => Released::Freed,
            Err(e) => {
                tracing::debug!(error = %e, "reading the waiter a release admits failed");
                Released::Freed
            }
        }
    }

    /// A waiter that stops waiting leaves every line of the key, its claim too; readers held
    /// back by a claim it withdrew are woken.
    pub(super) async fn leave_lines(&self, lock: &Lock, token: &str, claimed: bool) -> Result<(), LockError> {
        let name = lock.name();
        let (permits, claims) = (permits_line(name), claims_line(name));
        let left = ask!(self, |conn| sqlx::query(LEAVE_ALL)
            .bind(token.as_bytes())
            .bind(name.as_bytes())
            .bind(permits.as_bytes())
            .bind(claims.as_bytes())
            .execute(conn))?;
        if claimed && left.rows_affected() > 0 {
            self.notices.released(name);
        }
        Ok(())
    }

    /// A writer that took the lock in one statement after it had claimed its turn ends its claim.
    pub(super) async fn end_claim(&self, lock: &Lock, token: &str) -> Result<(), LockError> {
        let claims = claims_line(lock.name());
        ask!(self, |conn| sqlx::query(LEAVE)
            .bind(claims.as_bytes())
            .bind(token.as_bytes())
            .execute(conn))?;
        Ok(())
    }
}
