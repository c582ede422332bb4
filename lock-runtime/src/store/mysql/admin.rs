//! What operators read and do on the MySQL store (`lock_runtime::admin`, `lockctl`): the lock
//! rows of the prefix, read in one statement by the database's clock and matched against the
//! glob here (a binary column has no collation for `LIKE` or `REGEXP` to agree on across MySQL
//! and MariaDB), and a forced release that frees a lock only if its row still holds what was
//! seen, waking this client's waiters.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::line::claims_line;
use super::permits::{count_of, parse_permit_row, permit_row, permits_line};
use super::shares::{READERS, READERS_OF, SHARES};
use super::MysqlStore;
use crate::store::sql::{ask, unsigned};
use crate::store::{ForceReleased, Lock, StoreAdmin};
use crate::view::{glob_matches, Fence, Holding, LockView, Reader, RELEASED};
use crate::LockError;

/// Every lock row whose name starts with the prefix (binds: prefix length, prefix), with what
/// it holds now by the database's clock.
const ROWS: &str = sql!(
    "SELECT name, IF(token IS NOT NULL AND expires_ms > " now_ms!() ", token, NULL), expires_ms - " now_ms!()
    ", fence FROM lock_runtime_locks WHERE LEFT(name, ?) = ? ORDER BY name"
);
/// One lock's row (binds: name).
const ROW: &str = sql!(
    "SELECT name, IF(token IS NOT NULL AND expires_ms > " now_ms!() ", token, NULL), expires_ms - " now_ms!()
    ", fence FROM lock_runtime_locks WHERE name = ?"
);
/// Frees a lock if it still holds the value read (binds: name, value, value).
const FREE_HELD: &str = sql!(
    "UPDATE lock_runtime_locks SET token = NULL, expires_ms = " now_ms!()
    " WHERE name = ? AND (token = ? OR token = CONCAT(?, ':released')) AND expires_ms > " now_ms!()
);

/// The rows of a semaphore's permits (binds: their range's start and end), as [`ROWS`].
const PERMIT_ROWS: &str = sql!(
    "SELECT name, IF(token IS NOT NULL AND expires_ms > " now_ms!() ", token, NULL), expires_ms - " now_ms!()
    ", fence FROM lock_runtime_locks WHERE name >= ? AND name < ? AND LENGTH(name) = LENGTH(?) + 11 \
     ORDER BY name"
);

type Row = (Vec<u8>, Option<Vec<u8>>, i64, Option<i64>);

/// How many live places each line of the keys under a prefix has (binds: prefix length,
/// prefix): the line's name and its count.
const LINES: &str = sql!(
    "SELECT name, COUNT(*) FROM lock_runtime_line WHERE LEFT(name, ?) = ? AND kept_until > " now_ms!()
    " GROUP BY name"
);

/// The waiters of one lock, from the places of its lines: (fair waiters of a lock or a
/// semaphore, writers that claimed their turn).
fn waiters(lines: &HashMap<Vec<u8>, i64>, name: &str) -> (u64, u64) {
    let count = |line: String| lines.get(line.as_bytes()).copied().map_or(0, unsigned);
    (
        count(name.to_owned()) + count(permits_line(name)),
        count(claims_line(name)),
    )
}
/// A share as [`READERS`] reads it.
type ShareRow = (Vec<u8>, Vec<u8>, i64);

/// The readers of each key among `shares`, by lock name.
fn readers_of(shares: Vec<ShareRow>) -> HashMap<String, Vec<Reader>> {
    let mut readers: HashMap<String, Vec<Reader>> = HashMap::new();
    for (name, token, left) in shares {
        let Ok(name) = String::from_utf8(name) else {
            continue;
        };
        let value = String::from_utf8_lossy(&token);
        readers
            .entry(name)
            .or_default()
            .push(Reader::of(&value, Duration::from_millis(unsigned(left))));
    }
    readers
}

/// The permits held, by the lock name they belong to, among `rows` (the others are left).
fn permit_holders(rows: &[Row]) -> HashMap<String, Vec<Reader>> {
    let mut holders: HashMap<String, Vec<Reader>> = HashMap::new();
    for (name, token, left, _) in rows {
        let Some(token) = token else { continue };
        let Some((lock, _, permit)) = std::str::from_utf8(name).ok().and_then(parse_permit_row) else {
            continue;
        };
        let left = Duration::from_millis(unsigned(*left));
        let value = String::from_utf8_lossy(token);
        holders
            .entry(lock.to_owned())
            .or_default()
            .push(Reader::of_permit(&value, permit, left));
    }
    holders
}

impl MysqlStore {
    /// A lock's row as operators see it; a semaphore's header shows `permits`, its permits
    /// held; a readers' header, its readers.
    fn view(
        &self,
        row: Row,
        read_at: Instant,
        permits: &mut HashMap<String, Vec<Reader>>,
        readers: &mut HashMap<String, Vec<Reader>>,
        lines: &HashMap<Vec<u8>, i64>,
    ) -> Option<LockView> {
        let (name, token, left, fence) = row;
        let name = String::from_utf8(name).ok()?;
        let key = crate::store::user_key(&self.prefix, &name)?.to_owned();
        let count = token.as_deref().and_then(count_of);
        // The lease read with the value for one holder; the longest share's for the others.
        let (holding, lease) = match (token, count) {
            (Some(token), _) if token == SHARES => match readers.remove(&name) {
                Some(readers) if !readers.is_empty() => (Holding::shared(readers), None),
                _ => (Holding::Free, None),
            },
            (Some(_), Some(count)) => (
                Holding::permits(count, permits.remove(&name).unwrap_or_default()),
                None,
            ),
            (Some(value), None) => (
                Holding::of_value(&value),
                Some(Duration::from_millis(unsigned(left))),
            ),
            (None, _) => (Holding::Free, None),
        };
        let (queued, writers) = waiters(lines, &name);
        Some(LockView {
            remaining: lease.or_else(|| holding.longest_share()),
            fence: Fence::counter(fence),
            queued,
            writers,
            read_at,
            key,
            name,
            holding,
        })
    }

    /// A forced release's answer: `Freed` (this client's waiters woken) when it freed something;
    /// else `Changed` when another holder has the lock now, `Gone` when it is free.
    async fn forced(&self, lock: &Lock, freed: bool) -> Result<ForceReleased, LockError> {
        if freed {
            self.notices.released(lock.name());
            return Ok(ForceReleased::Freed);
        }
        Ok(ForceReleased::not_freed(&StoreAdmin::inspect(self, lock).await?))
    }
}

impl StoreAdmin for MysqlStore {
    /// What `lock` holds now (a semaphore's permits read in a second statement).
    async fn inspect(&self, lock: &Lock) -> Result<LockView, LockError> {
        let row: Option<Row> = ask!(self, |conn| sqlx::query_as(ROW)
            .bind(lock.name().as_bytes())
            .fetch_optional(conn))?;
        let mut permits = HashMap::new();
        if row
            .as_ref()
            .and_then(|r| r.1.as_deref())
            .and_then(count_of)
            .is_some()
        {
            let (start, end) = (format!("{}#p", lock.name()), format!("{}#q", lock.name()));
            let rows: Vec<Row> = ask!(self, |conn| sqlx::query_as(PERMIT_ROWS)
                .bind(start.as_bytes())
                .bind(end.as_bytes())
                .bind(lock.name().as_bytes())
                .fetch_all(conn))?;
            permits = permit_holders(&rows);
        }
        let mut readers = HashMap::new();
        if row.as_ref().and_then(|r| r.1.as_deref()) == Some(SHARES) {
            let shares: Vec<ShareRow> = ask!(self, |conn| sqlx::query_as(READERS_OF)
                .bind(lock.name().as_bytes())
                .fetch_all(conn))?;
            readers = readers_of(shares);
        }
        // The lock's lines: its name with a suffix, or none (a prefix shared with no other key's).
        let lines: Vec<(Vec<u8>, i64)> = ask!(self, |conn| sqlx::query_as(LINES)
            .bind(lock.name().len() as u64)
            .bind(lock.name().as_bytes())
            .fetch_all(conn))?;
        let lines: HashMap<Vec<u8>, i64> = lines.into_iter().collect();
        let read_at = Instant::now();
        Ok(row
            .and_then(|row| self.view(row, read_at, &mut permits, &mut readers, &lines))
            .unwrap_or_else(|| LockView::free(lock.key(), lock.name())))
    }

    /// The locks held now whose keys match `pattern` (a glob).
    async fn list(&self, pattern: &str) -> Result<Vec<LockView>, LockError> {
        let prefix = self.prefix.as_bytes();
        let rows: Vec<Row> = ask!(self, |conn| sqlx::query_as(ROWS)
            .bind(prefix.len() as u64)
            .bind(prefix)
            .fetch_all(conn))?;
        let shares: Vec<ShareRow> = ask!(self, |conn| sqlx::query_as(READERS)
            .bind(prefix.len() as u64)
            .bind(prefix)
            .fetch_all(conn))?;
        let lines: Vec<(Vec<u8>, i64)> = ask!(self, |conn| sqlx::query_as(LINES)
            .bind(prefix.len() as u64)
            .bind(prefix)
            .fetch_all(conn))?;
        let lines: HashMap<Vec<u8>, i64> = lines.into_iter().collect();
        let read_at = Instant::now();
        let mut permits = permit_holders(&rows);
        let mut readers = readers_of(shares);
        Ok(rows
            .into_iter()
            .filter_map(|row| self.view(row, read_at, &mut permits, &mut readers, &lines))
            .filter(|view| view.is_held() && glob_matches(pattern, &view.key))
            .collect())
    }

    /// Frees `lock` if its row still holds what `seen` shows, and wakes this client's waiters
    /// (another client's retry at the lease's end it had read, or sooner).
    async fn force_release(&self, lock: &Lock, seen: &LockView) -> Result<ForceReleased, LockError> {
        if let Holding::Permits { permits, holders } = &seen.holding {
            // Each permit seen, if its row still holds that holder.
            let mut freed = false;
            for holder in holders {
                let row = permit_row(lock.name(), *permits, holder.permit.unwrap_or_default());
                let token = holder.value.strip_suffix(RELEASED).unwrap_or(&holder.value);
                let done = ask!(self, |conn| sqlx::query(FREE_HELD)
                    .bind(row.as_bytes())
                    .bind(token.as_bytes())
                    .bind(token.as_bytes())
                    .execute(conn))?;
                freed |= done.rows_affected() == 1;
            }
            if freed {
                self.shorten_header(lock).await?;
            }
            return self.forced(lock, freed).await;
        }
        if let Holding::Shared { readers } = &seen.holding {
            // Each share seen, if it is still held.
            let mut freed = false;
            for reader in readers {
                freed |= self.release_share(lock, &reader.value).await? != crate::store::Released::NotOurs;
            }
            return self.forced(lock, freed).await;
        }
        let Holding::Exclusive { value, .. } = &seen.holding else {
            return Ok(ForceReleased::Gone);
        };
        let token = value.strip_suffix(RELEASED).unwrap_or(value);
        let freed = ask!(self, |conn| sqlx::query(FREE_HELD)
            .bind(lock.name().as_bytes())
            .bind(token.as_bytes())
            .bind(token.as_bytes())
            .execute(conn))?;
        self.forced(lock, freed.rows_affected() == 1).await
    }
}
