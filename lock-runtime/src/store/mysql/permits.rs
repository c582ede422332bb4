//! Semaphores on MySQL and MariaDB, in the one lock table: permit `i` of a key with `n`
//! permits is a row of its own, `<lock>#p<n>:<i>` (both 4 digits; a lock's name ends in `}`, so
//! no lock's row has such a name), taken, renewed and given back as a lock's row is. The lock's
//! own row is the semaphore's *header* while permits are held: its token the count's marker
//! (a zero byte, `permits:`, the count: no holder's token starts with a zero byte) and its lease
//! the last holder's, so that a lock asked of the key finds it held, and by a semaphore.
//!
//! An attempt is one statement: the header and the lowest permit this client does not hold, in
//! one multi-row `INSERT … ON DUPLICATE KEY UPDATE` that a row it may not take fails whole (as
//! a multi-key set's: an unsigned overflow evaluated only there, and InnoDB rolls the statement
//! back): the
//! header where it is free, lapsed or of this count, the permit where it is free, lapsed or this
//! token's. Refused, a second statement reads the header and the permits, to tell another count
//! (`InvalidOptions`) from every permit taken, or to try the lowest free one. The fencing token
//! is the permit row's, as a lock's (the clock in microseconds, floored by the row's last), and
//! comes back in the statement's own reply (`LAST_INSERT_ID`).
//!
//! The header's fencing column counts the raises of its lease (each claim and renewal), so that
//! a release can shorten it safely: it reads the header's count and the last live permit's
//! lease end, then shortens the header to that end, or deletes it when no permit is held, only
//! if no claim or renewal raised it meanwhile (else it stays as long as that one's lease). So
//! once the last holder leaves, the key is free for any count, or a lock. A release is then
//! three statements (the permit, the read, the header), a claim and a renewal one.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use super::MysqlStore;
use crate::store::sql::{ask, millis, unsigned};
use crate::store::{permits_differ, Ask, Attempt, Lock, Released};
use crate::LockError;

/// How many permits one attempt tries when the one it tried was taken meanwhile.
const TRIES: usize = 4;

/// The claim of a permit with its header (binds: header name, marker, ttl; permit name, token,
/// ttl, fencing; fencing). A header row may be taken (as the header) when it has no
/// live holder or holds this count's marker, and its lease is then the longer of the two; a
/// permit row as a lock's row is by [`TAKE`](super::TAKE). Any other row fails the statement.
/// A permit taken sets `LAST_INSERT_ID` to its fencing token (or 1 without fencing).
const CLAIM: &str = concat!(
    "INSERT INTO lock_runtime_locks (name, token, expires_ms, fence) VALUES (?, ?, ",
    now_ms!(),
    " + ?, 1), (?, ?, ",
    now_ms!(),
    " + ?, IF(?, LAST_INSERT_ID(",
    now_us!(),
    "), IF(LAST_INSERT_ID(1), NULL, NULL))) ON DUPLICATE KEY UPDATE \
     fence = IF(LEFT(VALUES(token), 1) = X'00', \
       IF(token IS NULL OR expires_ms <= ",
    now_ms!(),
    " OR token = VALUES(token), COALESCE(fence, 0) + 1, expires_ms + 18446744073709551615), \
       IF(",
    takeable!(),
    ", IF(?, LAST_INSERT_ID(IF(token = VALUES(token) AND fence IS NOT NULL, fence, GREATEST(",
    now_us!(),
    ", COALESCE(fence, 0) + 1))), IF(LAST_INSERT_ID(1), fence, fence)), \
         expires_ms + 18446744073709551615)), \
     token = IF(LEFT(VALUES(token), 1) = X'00', VALUES(token), IF(",
    takeable!(),
    ", VALUES(token), token)), \
     expires_ms = IF(LEFT(VALUES(token), 1) = X'00', GREATEST(expires_ms, VALUES(expires_ms)), IF(",
    takeable!(),
    ", VALUES(expires_ms), expires_ms))"
);

/// A semaphore's rows as they are (binds: the header's name, the permits' range): name, its
/// live token (NULL: none), and how long its lease has left.
const ROWS: &str = concat!(
    "SELECT name, IF(token IS NOT NULL AND expires_ms > ",
    now_ms!(),
    ", token, NULL), expires_ms - ",
    now_ms!(),
    " FROM lock_runtime_locks WHERE name = ? OR (name >= ? AND name < ?)"
);

/// Lengthens a header's lease to at least the ttl from now, counting the raise (binds: ttl,
/// name, marker).
const BUMP: &str = concat!(
    "UPDATE lock_runtime_locks SET expires_ms = GREATEST(expires_ms, ",
    now_ms!(),
    " + ?), fence = COALESCE(fence, 0) + 1 WHERE name = ? AND token = ?"
);

/// A header's count of raises, and when the last live permit's lease ends (binds: header name,
/// marker, the permits' range).
const LAST: &str = concat!(
    "SELECT (SELECT fence FROM lock_runtime_locks WHERE name = ? AND token = ?), \
     (SELECT MAX(expires_ms) FROM lock_runtime_locks WHERE name >= ? AND name < ? \
        AND token IS NOT NULL AND expires_ms > ",
    now_ms!(),
    ")"
);

/// Shortens a header's lease to when its last permit's ends, if nothing raised it since it was
/// read (binds: the end, name, marker, count of raises).
const SHORTEN: &str = "UPDATE lock_runtime_locks SET expires_ms = LEAST(expires_ms, ?) \
     WHERE name = ? AND token = ? AND fence = ?";

/// Deletes a header whose permits all went, if nothing raised it since it was read (binds:
/// name, marker, count of raises).
const DROP_HEADER: &str = "DELETE FROM lock_runtime_locks WHERE name = ? AND token = ? AND fence = ?";

/// Gives back a permit an attempt whose answer never came may have taken, found by its token
/// (binds: the permits' range, token, token).
const GIVE_BACK_ANY: &str = concat!(
    "UPDATE lock_runtime_locks SET token = NULL, expires_ms = ",
    now_ms!(),
    " WHERE name >= ? AND name < ? AND (token = ? OR token = CONCAT(?, ':released'))"
);

/// The header's token for a semaphore of `count` permits.
pub(super) fn marker(count: u32) -> Vec<u8> {
    format!("\0permits:{count:04}").into_bytes()
}

/// The count a header's token (`marker`) stands for, when it is one.
pub(super) fn count_of(token: &[u8]) -> Option<u32> {
    let digits = token.strip_prefix(b"\0permits:")?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The row of permit `permit` of `count` of the lock named `lock`.
pub(super) fn permit_row(lock: &str, count: u32, permit: u32) -> String {
    format!("{lock}#p{count:04}:{permit:04}")
}

/// The range of every permit row of the lock named `lock`: `[start, end)`.
fn permit_rows(lock: &str) -> (Vec<u8>, Vec<u8>) {
    (format!("{lock}#p").into_bytes(), format!("{lock}#q").into_bytes())
}

/// The lock name, count and permit of a permit row's name.
pub(super) fn parse_permit_row(name: &str) -> Option<(&str, u32, u32)> {
    let (lock, rest) = name.rsplit_once("#p")?;
    let (count, permit) = rest.split_once(':')?;
    let digits = |d: &str| (d.len() == 4 && d.bytes().all(|b| b.is_ascii_digit())).then(|| d.parse().ok())?;
    lock.ends_with('}').then_some(())?;
    Some((lock, digits(count)?, digits(permit)?))
}

/// A permit this client holds: its row, and its header's name and marker.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub(super) row: Lock,
    pub(super) header: String,
    pub(super) marker: Vec<u8>,
}

/// This client's permits, by token (a release and a renewal name the lock and the token only).
#[derive(Debug, Default)]
pub(super) struct Permits(Mutex<HashMap<String, Held>>);

impl Permits {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Held>> {
        // Every update is one step, so a poisoned map is still consistent.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn get(&self, token: &str) -> Option<Held> {
        self.map().get(token).cloned()
    }

    pub(super) fn forget(&self, token: &str) -> Option<Held> {
        self.map().remove(token)
    }

    /// Whether this client holds the permit whose row is `row`.
    fn holds(&self, row: &str) -> bool {
        self.map().values().any(|held| held.row.name() == row)
    }
}

impl MysqlStore {
    /// One attempt at any free permit of a semaphore of `ask.permits` (see the module doc).
    pub(super) async fn permit_attempt(
        &self,
        lock: &Lock,
        token: &str,
        ask: &Ask,
    ) -> Result<Attempt, LockError> {
        self.sweep_now_and_then();
        let count = ask.permits;
        let marker = marker(count);
        // The lowest permit this client does not hold of the key: free, when no other client
        // holds one.
        let mut permit = (0..count)
            .find(|p| !self.permits.holds(&permit_row(lock.name(), count, *p)))
            .unwrap_or(0);
        for _ in 0..TRIES {
            let row = permit_row(lock.name(), count, permit);
            let claimed = ask!(self, |conn| {
                let query = sqlx::query(CLAIM)
                    .bind(lock.name().as_bytes())
                    .bind(marker.as_slice())
                    .bind(millis(ask.ttl_ms))
                    .bind(row.as_bytes())
                    .bind(token.as_bytes())
                    .bind(millis(ask.ttl_ms))
                    .bind(ask.fencing)
                    .bind(ask.fencing);
                async {
                    match query.execute(conn).await {
                        Ok(done) => Ok(Some(done.last_insert_id())),
                        Err(e) if super::set_refused(&e) => Ok(None),
                        Err(e) => Err(e),
                    }
                }
            })?;
            if let Some(answer) = claimed {
                let held = Held {
                    row: Lock::new(lock.key(), row),
                    header: lock.name().to_owned(),
                    marker: marker.clone(),
                };
                self.permits.map().insert(token.to_owned(), held);
                return Ok(Attempt::permit(ask.fencing.then_some(answer), permit));
            }
            // Refused: why (one more statement).
            let (start, end) = permit_rows(lock.name());
            type Row = (Vec<u8>, Option<Vec<u8>>, i64);
            let rows: Vec<Row> = ask!(self, |conn| sqlx::query_as(ROWS)
                .bind(lock.name().as_bytes())
                .bind(start.as_slice())
                .bind(end.as_slice())
                .fetch_all(conn))?;
            let mut taken = Vec::new();
            let mut first_end: Option<i64> = None;
            for (name, live, left) in &rows {
                let Some(live) = live else { continue };
                if name.as_slice() == lock.name().as_bytes() {
                    match count_of(live) {
                        Some(held) if held != count => return Err(permits_differ(lock.key(), held, count)),
                        Some(_) => {}
                        // A lock's holder.
                        None => return Err(permits_differ(lock.key(), 1, count)),
                    }
                    continue;
                }
                let parsed = std::str::from_utf8(name).ok().and_then(parse_permit_row);
                match parsed {
                    Some((_, held, _)) if held != count => {
                        return Err(permits_differ(lock.key(), held, count))
                    }
                    Some((_, _, taken_permit)) => {
                        taken.push(taken_permit);
                        first_end = Some(first_end.map_or(*left, |f| f.min(*left)));
                    }
                    None => {}
                }
            }
            match (0..count).find(|p| !taken.contains(p)) {
                Some(free) => permit = free,
                None => {
                    return Ok(Attempt::Held {
                        pttl_ms: first_end.map(unsigned),
                        behind: false,
                        claimed: false,
                        kept: None,
                    })
                }
            }
        }
        // Every permit it tried was taken meanwhile: refused for now.
        Ok(Attempt::HELD)
    }

    /// Renews a permit this client holds, its header first (never the permit past its header:
    /// a lock must not find the key free while a permit is held).
    pub(super) async fn renew_permit(
        &self,
        held: &Held,
        token: &str,
        ttl_ms: u64,
    ) -> Result<bool, LockError> {
        self.bump(held, ttl_ms).await?;
        if self.renew_one(&held.row, token, ttl_ms).await? == crate::store::Renewal::Renewed {
            return Ok(true);
        }
        self.permits.forget(token);
        Ok(false)
    }

    /// Lengthens `held`'s header's lease to at least the ttl from now.
    pub(super) async fn bump(&self, held: &Held, ttl_ms: u64) -> Result<(), LockError> {
        ask!(self, |conn| sqlx::query(BUMP)
            .bind(millis(ttl_ms))
            .bind(held.header.as_bytes())
            .bind(held.marker.as_slice())
            .execute(conn))?;
        Ok(())
    }

    /// Gives back the permit of `token` (kept `hold_ms` longer, marked released, for a minimum
    /// hold); an attempt whose answer never came (`abandoned`) is looked for among the lock's
    /// permits by its token.
    pub(super) async fn release_permit(
        &self,
        lock: &Lock,
        token: &str,
        hold_ms: u64,
        abandoned: bool,
    ) -> Result<Released, LockError> {
        let held = match hold_ms {
            0 => self.permits.forget(token),
            _ => self.permits.get(token),
        };
        if let Some(held) = held {
            let released = self.release_lock(&held.row, token, hold_ms).await?;
            if released == Released::Freed {
                self.shorten_header(lock, &held.marker).await?;
            }
            return Ok(released);
        }
        if !abandoned {
            return Ok(Released::NotOurs);
        }
        let (start, end) = permit_rows(lock.name());
        let freed = ask!(self, |conn| sqlx::query(GIVE_BACK_ANY)
            .bind(start.as_slice())
            .bind(end.as_slice())
            .bind(token.as_bytes())
            .bind(token.as_bytes())
            .execute(conn))?;
        Ok(match freed.rows_affected() {
            0 => Released::NotOurs,
            _ => Released::Freed,
        })
    }
}

impl MysqlStore {
    /// Shortens the header of `lock` (marker `marker`) to its last live permit's lease, or
    /// deletes it when none is left, unless a claim or renewal raised it meanwhile.
    pub(super) async fn shorten_header(&self, lock: &Lock, marker: &[u8]) -> Result<(), LockError> {
        let (start, end) = permit_rows(lock.name());
        let (raises, last): (Option<i64>, Option<i64>) = ask!(self, |conn| sqlx::query_as(LAST)
            .bind(lock.name().as_bytes())
            .bind(marker)
            .bind(start.as_slice())
            .bind(end.as_slice())
            .fetch_one(conn))?;
        let Some(raises) = raises else {
            return Ok(()); // no header (any more)
        };
        match last {
            Some(last) => ask!(self, |conn| sqlx::query(SHORTEN)
                .bind(last)
                .bind(lock.name().as_bytes())
                .bind(marker)
                .bind(raises)
                .execute(conn))?,
            None => ask!(self, |conn| sqlx::query(DROP_HEADER)
                .bind(lock.name().as_bytes())
                .bind(marker)
                .bind(raises)
                .execute(conn))?,
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permit_rows_and_markers_read_back() {
        let row = permit_row("lock:{export:7}", 4, 2);
        assert_eq!(row, "lock:{export:7}#p0004:0002");
        assert_eq!(parse_permit_row(&row), Some(("lock:{export:7}", 4, 2)));
        // A lock's row ends in `}`: never a permit's.
        assert_eq!(parse_permit_row("lock:{a#p0004:0002}"), None);
        assert_eq!(parse_permit_row("lock:{a}#p04:0002"), None);
        let (start, end) = permit_rows("lock:{export:7}");
        assert!(start.as_slice() <= row.as_bytes() && row.as_bytes() < end.as_slice());
        assert_eq!(count_of(&marker(4)), Some(4));
        assert_eq!(count_of(b"0123 owner"), None);
    }
}
