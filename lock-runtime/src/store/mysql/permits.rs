//! Semaphores on MySQL and MariaDB, in the one lock table: permit `i` of a key with `n`
//! permits is a row of its own, `<lock>#p<n>:<i>` (both 4 digits; a lock's name ends in `}`, so
//! no lock's row has such a name), taken and given back as a lock's row is. The lock's own row
//! is the semaphore's *header* while permits are held: its token the count's marker (a zero
//! byte, `permits:`, the count: no holder's token starts with a zero byte), its lease at least
//! every holder's, so that a lock asked of the key finds it held, and by a semaphore. Its
//! fencing column is the key's fencing floor: every claim and renewal raises it (to the clock
//! in microseconds, or one more), a fenced permit takes the value its claim raised it to (so
//! tokens rise per key, across permits, also when the clock steps back), and a release reads
//! it to shorten the header only if nothing raised it meanwhile.
//!
//! An attempt is one statement: the header and the lowest permit this client does not hold, in
//! one multi-row `INSERT … ON DUPLICATE KEY UPDATE` that a row it may not take fails whole (as
//! a multi-key set's: an unsigned overflow evaluated only there, and InnoDB rolls the statement
//! back): the header where it is free, lapsed or of this count, the permit where it is free,
//! lapsed or this token's. Refused, a second statement reads the header and the permits, to
//! tell another count (`InvalidOptions`) from every permit taken, or to try the lowest free
//! one. The fencing token comes back in the statement's own reply (`LAST_INSERT_ID`).
//!
//! A renewal raises the header and the permit in one statement, only while the header still
//! holds the count's marker. A release kept for a minimum hold is one statement (the permit
//! marked released, the header raised to the hold's end). Any other release is one short
//! transaction ([`tx`](super::tx)) under the header's row lock: the permit's row given back,
//! then the header read with the last live permit's lease end, and shortened to that end, or
//! freed when no permit is held (only if its floor did not rise since the read: a renewal
//! raises it without that lock). So once the last holder leaves, the key is free for any count,
//! or a lock.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use sqlx::mysql::{MySql, MySqlArguments};
use sqlx::query::Query;

use super::tx::Step;
use super::MysqlStore;
use crate::store::sql::{ask, millis, unsigned, SqlStore as _};
use crate::store::{permits_differ, Ask, Asked, Attempt, Lock, Released};
use crate::LockError;

/// How many permits one attempt tries when the one it tried was taken meanwhile.
const TRIES: usize = 4;

/// The claim of a permit with its header (binds: header name, marker, ttl; permit name, token,
/// ttl; then header name, marker, token, header name, marker, token, token, header name, ttl,
/// token, ttl: the update tells the rows apart by name and names their values by binding them
/// again, not by `VALUES()`). A header row may be taken (as the header) when it has no live
/// holder or holds this count's marker: its lease is then the longer of the two, and its
/// fencing floor is raised (`LAST_INSERT_ID` is set to it: the statement's answer, a fenced
/// permit's token). A permit row is taken as a lock's row is by [`TAKE`](super::TAKE); its
/// fencing column stays empty (the key's tokens live in the header: a permit's token is not
/// read back from its row, so no statement reads `LAST_INSERT_ID()` where it also sets it,
/// which the manual leaves undefined). Any other row fails the statement.
const CLAIM: &str = sql!(
    "INSERT INTO lock_runtime_locks (name, token, expires_ms, fence) \
     VALUES (?, ?, " now_ms!() " + ?, LAST_INSERT_ID(" now_us!() ")), (?, ?, " now_ms!() " + ?, NULL) \
     ON DUPLICATE KEY UPDATE \
     fence = IF(name = ?, \
       IF(token IS NULL OR expires_ms <= " now_ms!() " OR token = ?, \
         LAST_INSERT_ID(GREATEST(" now_us!() ", COALESCE(fence, 0) + 1)), \
         expires_ms + 18446744073709551615), \
       IF(" takeable!("?") ", fence, expires_ms + 18446744073709551615)), \
     token = IF(name = ?, ?, IF(" takeable!("?") ", ?, token)), \
     expires_ms = IF(name = ?, GREATEST(expires_ms, " now_ms!() " + ?), \
       IF(" takeable!("?") ", " now_ms!() " + ?, expires_ms))"
);

/// Keeps only a key's own permit rows among those in its range (`<lock>#p`…`<lock>#q` holds the
/// permits of keys that start with this key's name and `#p`, too): their names are the lock's
/// and 11 bytes.
macro_rules! own_permits {
    () => {
        " AND LENGTH(name) = LENGTH(?) + 11"
    };
}

/// A semaphore's rows as they are (binds: the header's name, the permits' range, the header's
/// name): name, its live token (NULL: none), and how long its lease has left.
const ROWS: &str = sql!(
    "SELECT name, IF(token IS NOT NULL AND expires_ms > " now_ms!() ", token, NULL), expires_ms - " now_ms!()
    " FROM lock_runtime_locks WHERE name = ? OR (name >= ? AND name < ?" own_permits!() ")"
);

/// An update of a live permit and its header in one statement (one clock), only while the
/// header holds the count's marker: what it sets goes between (binds: permit name, token, then
/// the set's, then header name, marker). Two rows when done.
macro_rules! permit_and_header {
    ($($set:expr),+) => {
        concat!(
            "UPDATE lock_runtime_locks h JOIN lock_runtime_locks p ON p.name = ? AND p.token = ? \
               AND p.expires_ms > ",
            now_ms!(),
            " SET ",
            $($set,)+
            " WHERE h.name = ? AND h.token = ?"
        )
    };
}

/// The header's lease raised to at least `?` ms from now, and its floor with it.
macro_rules! header_raised {
    () => {
        concat!(
            "h.expires_ms = GREATEST(h.expires_ms, ",
            now_ms!(),
            " + ?), h.fence = GREATEST(",
            now_us!(),
            ", COALESCE(h.fence, 0) + 1)"
        )
    };
}

/// Renews a permit and its header (binds: permit name, token, ttl, ttl, header name, marker).
const RENEW_PERMIT: &str = permit_and_header!(
    header_raised!(),
    ", p.expires_ms = GREATEST(p.expires_ms, ",
    now_ms!(),
    " + ?)"
);

/// Gives a permit back kept for its minimum hold, marked released, and raises its header to the
/// hold's end (binds: permit name, token, hold, hold, header name, marker).
const KEEP: &str = permit_and_header!(
    "p.token = CONCAT(p.token, ':released'), p.expires_ms = ",
    now_ms!(),
    " + ?, ",
    header_raised!()
);

/// A header's token and floor, when the last live permit's lease ends and how many are live
/// (binds: header name, the permits' range, header name).
const LAST: &str = sql!(
    "SELECT (SELECT token FROM lock_runtime_locks WHERE name = ?), \
       (SELECT fence FROM lock_runtime_locks WHERE name = ?), \
       MAX(expires_ms), COUNT(*) FROM lock_runtime_locks WHERE name >= ? AND name < ?"
    own_permits!() " AND token IS NOT NULL AND expires_ms > " now_ms!()
);

/// Shortens a header's lease to when its last permit's ends, if nothing raised it since it was
/// read (binds: the end, name, marker, floor read).
const SHORTEN: &str = "UPDATE lock_runtime_locks SET expires_ms = LEAST(expires_ms, ?) \
     WHERE name = ? AND token = ? AND fence = ?";

/// Frees a header whose permits all went, if nothing raised it since it was read (binds: name,
/// marker, floor read). Its row stays, with the key's fencing floor (the sweep deletes it an
/// hour later).
const FREE_HEADER: &str = sql!(
    "UPDATE lock_runtime_locks SET token = NULL, expires_ms = " now_ms!()
    " WHERE name = ? AND token = ? AND fence = ?"
);

/// Gives back a permit an attempt whose answer never came may have taken, found by its token
/// (binds: the permits' range, the header's name, token, token).
const GIVE_BACK_ANY: &str = sql!(
    "UPDATE lock_runtime_locks SET token = NULL, expires_ms = " now_ms!() " WHERE name >= ? AND name < ?"
    own_permits!() " AND (token = ? OR token = CONCAT(?, ':released'))"
);

/// The line of a fair semaphore of the lock named `lock` (see [`line`](super::line)).
pub(super) fn permits_line(lock: &str) -> String {
    format!("{lock}#permits")
}

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
    /// Taken by a fair caller: its release names the waiter it admits.
    pub(super) fair: bool,
}

impl Held {
    /// `statement` ([`RENEW_PERMIT`], [`KEEP`]), which moves this permit's lease and its
    /// header's to `ms` from now, with its binds: the permit's row, `token`, `ms` twice, the
    /// header's row and this semaphore's marker.
    fn moved<'q>(&'q self, statement: &'q str, token: &'q str, ms: u64) -> Query<'q, MySql, MySqlArguments> {
        sqlx::query(statement)
            .bind(self.row.name().as_bytes())
            .bind(token.as_bytes())
            .bind(millis(ms))
            .bind(millis(ms))
            .bind(self.header.as_bytes())
            .bind(self.marker.as_slice())
    }
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

    pub(super) fn hold(&self, token: &str, held: Held) {
        self.map().insert(token.to_owned(), held);
    }

    pub(super) fn forget(&self, token: &str) -> Option<Held> {
        self.map().remove(token)
    }

    /// Whether this client holds the permit whose row is `row`.
    fn holds(&self, row: &str) -> bool {
        self.map().values().any(|held| held.row.name() == row)
    }
}

/// A semaphore's rows as [`ROWS`] reads them: name, live token, ms left.
pub(super) type PermitRow = (Vec<u8>, Option<Vec<u8>>, i64);

/// Reads the header and permit rows of the lock named `name`.
pub(super) async fn rows_of_permits(
    conn: &mut sqlx::MySqlConnection,
    name: &str,
) -> Result<Vec<PermitRow>, sqlx::Error> {
    let (start, end) = permit_rows(name);
    sqlx::query_as(ROWS)
        .bind(name.as_bytes())
        .bind(start.as_slice())
        .bind(end.as_slice())
        .bind(name.as_bytes())
        .fetch_all(conn)
        .await
}

/// The permits of `count` taken among `rows` of the lock named `name`, and the ms until the
/// first of their leases ends; or the count the key is held with when it is another (a lock's
/// holder or readers count 1).
pub(super) fn taken_permits(
    rows: &[PermitRow],
    name: &str,
    count: u32,
) -> Result<(Vec<u32>, Option<u64>), u32> {
    let mut taken = Vec::new();
    let mut first_end: Option<i64> = None;
    for (row, live, left) in rows {
        let Some(live) = live else { continue };
        if row.as_slice() == name.as_bytes() {
            match count_of(live) {
                Some(held) if held != count => return Err(held),
                Some(_) => {}
                // A lock's holder, or readers.
                None => return Err(1),
            }
            continue;
        }
        let parsed = std::str::from_utf8(row)
            .ok()
            .and_then(parse_permit_row)
            .filter(|(of, _, _)| *of == name);
        match parsed {
            Some((_, held, _)) if held != count => return Err(held),
            Some((_, _, permit)) => {
                taken.push(permit);
                first_end = Some(first_end.map_or(*left, |f| f.min(*left)));
            }
            None => {}
        }
    }
    Ok((taken, first_end.map(unsigned)))
}

/// Claims permit `permit` of `lock` with its header in one statement ([`CLAIM`]): its fencing
/// token (or the header's floor) when taken; fails with ER_DATA_OUT_OF_RANGE when a row may not
/// be taken.
pub(super) async fn claim(
    conn: &mut sqlx::MySqlConnection,
    lock: &Lock,
    token: &str,
    ask: &Ask,
    permit: u32,
) -> Result<u64, sqlx::Error> {
    let row = permit_row(lock.name(), ask.mode.permits(), permit);
    let (header, marker, ttl) = (
        lock.name().as_bytes(),
        marker(ask.mode.permits()),
        millis(ask.ttl_ms),
    );
    let done = sqlx::query(CLAIM)
        .bind(header)
        .bind(marker.as_slice())
        .bind(ttl)
        .bind(row.as_bytes())
        .bind(token.as_bytes())
        .bind(ttl)
        .bind(header)
        .bind(marker.as_slice())
        .bind(token.as_bytes())
        .bind(header)
        .bind(marker.as_slice())
        .bind(token.as_bytes())
        .bind(token.as_bytes())
        .bind(header)
        .bind(ttl)
        .bind(token.as_bytes())
        .bind(ttl)
        .execute(conn)
        .await?;
    Ok(done.last_insert_id())
}

impl MysqlStore {
    /// One attempt at any free permit of a semaphore of `ask.mode.permits()` (see the module doc).
    pub(super) async fn permit_attempt(&self, asked: Asked<'_>) -> Result<Attempt, LockError> {
        let Asked { lock, token, ask } = asked;
        self.sweep_now_and_then();
        if ask.mode.fair() {
            return self.fair_permit_attempt(asked).await;
        }
        let count = ask.mode.permits();
        let marker = marker(count);
        // The lowest permit this client does not hold of the key: free, when no other client
        // holds one.
        let mut permit = (0..count)
            .find(|p| !self.permits.holds(&permit_row(lock.name(), count, *p)))
            .unwrap_or(0);
        for _ in 0..TRIES {
            let claimed = ask!(self, |conn| async {
                match claim(conn, lock, token, ask, permit).await {
                    Ok(fence) => Ok(Some(fence)),
                    Err(e) if super::set_refused(&e) => Ok(None),
                    Err(e) => Err(e),
                }
            })?;
            if let Some(answer) = claimed {
                let held = Held {
                    row: Lock::new(lock.key(), permit_row(lock.name(), count, permit)),
                    header: lock.name().to_owned(),
                    marker: marker.clone(),
                    fair: false,
                };
                self.permits.hold(token, held);
                return Ok(Attempt::permit(ask.fencing.then_some(answer), permit));
            }
            // Refused: why (one more statement).
            let rows: Vec<PermitRow> = ask!(self, |conn| rows_of_permits(conn, lock.name()))?;
            let (taken, first_end) = taken_permits(&rows, lock.name(), count)
                .map_err(|held| permits_differ(lock.key(), held, count))?;
            match (0..count).find(|p| !taken.contains(p)) {
                Some(free) => permit = free,
                None => {
                    return Ok(Attempt::Held {
                        pttl_ms: first_end,
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

    /// Renews a permit this client holds and its header, in one statement, only while the
    /// header holds its count's marker (a permit whose header was lost is lost).
    pub(super) async fn renew_permit(
        &self,
        held: &Held,
        token: &str,
        ttl_ms: u64,
    ) -> Result<bool, LockError> {
        let renewed = ask!(self, |conn| held.moved(RENEW_PERMIT, token, ttl_ms).execute(conn))?;
        // sqlx's connections count matched rows: both, also when no lease moved.
        if renewed.rows_affected() == 2 {
            return Ok(true);
        }
        self.permits.forget(token);
        Ok(false)
    }

    /// Gives back the permit of `token` (kept `hold_ms` longer, marked released, for a minimum
    /// hold: its header raised to the hold's end in the same statement); an attempt whose answer never came
    /// (`abandoned`) is looked for among the lock's permits by its token. Then the header is
    /// shortened to the permits still held.
    pub(super) async fn release_permit(
        &self,
        lock: &Lock,
        token: &str,
        hold_ms: u64,
        abandoned: bool,
    ) -> Result<Released, LockError> {
        if let Some(held) = self.permits.forget(token) {
            if hold_ms > 0 {
                let kept = ask!(self, |conn| held.moved(KEEP, token, hold_ms).execute(conn))?;
                return Ok(match kept.rows_affected() {
                    2 => Released::Freed,
                    _ => Released::NotOurs,
                });
            }
            let giving = Giving {
                header: lock.name(),
                row: Some(held.row.name()),
                token,
            };
            let (released, live) = self.transact(&giving, give_back).await?;
            if released == Released::Freed && held.fair {
                let count = count_of(&held.marker).unwrap_or(1);
                let free = count.saturating_sub(live);
                return Ok(self.admitted(&permits_line(lock.name()), free).await);
            }
            return Ok(released);
        }
        if !abandoned {
            return Ok(Released::NotOurs);
        }
        let giving = Giving {
            header: lock.name(),
            row: None,
            token,
        };
        Ok(self.transact(&giving, give_back).await?.0)
    }

    /// Shortens the header of `lock` to its last live permit's lease, or frees it when none is
    /// left, in a transaction of its own (an operator's forced release).
    pub(super) async fn shorten_header(&self, lock: &Lock) -> Result<u32, LockError> {
        self.transact(lock.name(), |conn, header| {
            Box::pin(async move {
                sqlx::query(LOCK_HEADER)
                    .bind(header.as_bytes())
                    .execute(&mut *conn)
                    .await?;
                shorten(conn, header).await
            })
        })
        .await
    }
}

/// A permit given back: its header's name, its row (`None`: an attempt whose answer never came,
/// found among the key's permits by its token) and its token.
struct Giving<'a> {
    header: &'a str,
    row: Option<&'a str>,
    token: &'a str,
}

/// Locks a semaphore's header row, if there is one (binds: name).
const LOCK_HEADER: &str = "SELECT 1 FROM lock_runtime_locks WHERE name = ? FOR UPDATE";

/// Gives a permit back and shortens its header to the permits left (or frees it), under the
/// header's row lock, in one transaction: whether it was ours, and how many permits are live.
fn give_back<'c>(conn: &'c mut sqlx::MySqlConnection, g: &'c Giving<'_>) -> Step<'c, (Released, u32)> {
    Box::pin(async move {
        sqlx::query(LOCK_HEADER)
            .bind(g.header.as_bytes())
            .execute(&mut *conn)
            .await?;
        let freed = match g.row {
            Some(row) => {
                let deleted = sqlx::query(super::GIVE_BACK)
                    .bind(row.as_bytes())
                    .bind(g.token.as_bytes())
                    .execute(&mut *conn)
                    .await?;
                // A row of an earlier build keeps a fencing token: freed, kept.
                deleted.rows_affected() == 1
                    || sqlx::query(super::RELEASE)
                        .bind(0_i64)
                        .bind(0_i64)
                        .bind(row.as_bytes())
                        .bind(g.token.as_bytes())
                        .execute(&mut *conn)
                        .await?
                        .rows_affected()
                        == 1
            }
            None => {
                let (start, end) = permit_rows(g.header);
                sqlx::query(GIVE_BACK_ANY)
                    .bind(start.as_slice())
                    .bind(end.as_slice())
                    .bind(g.header.as_bytes())
                    .bind(g.token.as_bytes())
                    .bind(g.token.as_bytes())
                    .execute(&mut *conn)
                    .await?
                    .rows_affected()
                    > 0
            }
        };
        if !freed {
            return Ok((Released::NotOurs, 0));
        }
        let live = shorten(conn, g.header).await?;
        Ok((Released::Freed, live))
    })
}

/// Shortens the header named `header` to its last live permit's lease, or frees it when none is
/// left (its row locked by the caller's transaction; the floor checked still, as a renewal
/// raises it without that lock): how many permits are live.
async fn shorten(conn: &mut sqlx::MySqlConnection, header: &str) -> Result<u32, sqlx::Error> {
    let (start, end) = permit_rows(header);
    type Read = (Option<Vec<u8>>, Option<i64>, Option<i64>, i64);
    let (marker, floor, last, live): Read = sqlx::query_as(LAST)
        .bind(header.as_bytes())
        .bind(header.as_bytes())
        .bind(start.as_slice())
        .bind(end.as_slice())
        .bind(header.as_bytes())
        .fetch_one(&mut *conn)
        .await?;
    let live = u32::try_from(live).unwrap_or(u32::MAX);
    let (Some(marker), Some(floor)) = (marker.filter(|m| count_of(m).is_some()), floor) else {
        return Ok(live); // no header (any more)
    };
    match last {
        Some(last) => {
            sqlx::query(SHORTEN)
                .bind(last)
                .bind(header.as_bytes())
                .bind(marker.as_slice())
                .bind(floor)
                .execute(conn)
                .await?
        }
        None => {
            sqlx::query(FREE_HEADER)
                .bind(header.as_bytes())
                .bind(marker.as_slice())
                .bind(floor)
                .execute(conn)
                .await?
        }
    };
    Ok(live)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The claim's binds, as `claim` sends them.
    #[test]
    fn the_claim_has_seventeen_binds() {
        assert_eq!(CLAIM.matches('?').count(), 17, "{CLAIM}");
    }

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
