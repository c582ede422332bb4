//! What operators read and do on the PostgreSQL store (`lock_runtime::admin`, `lockctl`): the
//! lock rows of the prefix whose keys match a glob, each read in one statement by the
//! database's clock (so every lock is seen at one instant), and a forced release that frees a
//! lock only if its row still holds what was seen, announcing it (`NOTIFY lock_runtime`) so that
//! waiters take it at once.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use std::time::Duration;

use tokio::time::Instant;

use super::PostgresStore;
use crate::store::sql::{ask, unsigned};
use crate::store::{ForceReleased, Lock, StoreAdmin};
use crate::view::{glob_escape, Fence, Holding, LockView, Reader, RELEASED};
use crate::LockError;

/// Every lock of the prefix whose key matches a regular expression (made from the glob), with
/// what it holds now, by the database's clock (`n`).
const HELD: &str = "SELECT l.key, \
        CASE WHEN l.token IS NOT NULL AND l.expires_ms > n THEN l.token END, \
        CASE WHEN l.token IS NOT NULL AND l.expires_ms > n THEN l.expires_ms - n END, \
        coalesce((SELECT array_agg(e.key ORDER BY e.key) FROM jsonb_each(l.shares) AS e \
            WHERE e.value::bigint > n), '{}'), \
        coalesce((SELECT array_agg(e.value::bigint - n ORDER BY e.key) FROM jsonb_each(l.shares) AS e \
            WHERE e.value::bigint > n), '{}'), \
        l.fence, \
        (SELECT count(*) FROM lock_runtime_line AS q WHERE q.key = l.key AND q.kept_until > n), \
        (SELECT count(*) FROM jsonb_each(l.claims) AS c WHERE c.value::bigint > n), \
        l.permits, \
        coalesce((SELECT array_agg(CASE WHEN p.released THEN p.token || ':released' ELSE p.token END \
            ORDER BY p.token) FROM lock_runtime_permits AS p \
            WHERE p.key = l.key AND p.expires_ms > n AND l.permits IS NOT NULL), '{}'), \
        coalesce((SELECT array_agg(p.expires_ms - n ORDER BY p.token) FROM lock_runtime_permits AS p \
            WHERE p.key = l.key AND p.expires_ms > n AND l.permits IS NOT NULL), '{}'), \
        coalesce((SELECT array_agg(p.permit::bigint ORDER BY p.token) FROM lock_runtime_permits AS p \
            WHERE p.key = l.key AND p.expires_ms > n AND l.permits IS NOT NULL), '{}') \
     FROM lock_runtime_locks AS l, lock_runtime_v1_now() AS n \
     WHERE starts_with(l.key, $1) AND l.key ~ $2 \
     ORDER BY l.key";

/// Frees an exclusive lock if it still holds the value read, and announces it.
const FREE_HELD: &str = "WITH freed AS ( \
        UPDATE lock_runtime_locks SET token = NULL, expires_ms = n, marked = false \
        FROM lock_runtime_v1_now() AS n \
        WHERE key = $1 AND (token = $2 OR token = $2 || ':released') AND expires_ms > n \
        RETURNING key) \
     SELECT count(*) FROM (SELECT lock_runtime_v1_tell($1, $3) FROM freed) AS told";

/// Frees a read-write lock's shares (or, with `$3`, a semaphore's permits) if readers (holders)
/// still hold it, and announces it (binds: key, announcement, whether permits were seen).
const FREE_SHARED: &str = "WITH freed AS ( \
        UPDATE lock_runtime_locks SET shares = NULL, shares_until = 0, marked = false, \
            permits = NULL, held = NULL \
        FROM lock_runtime_v1_now() AS n \
        WHERE key = $1 AND shares_until > n AND (permits IS NOT NULL) = $3 \
        RETURNING key), \
     holders AS (DELETE FROM lock_runtime_permits WHERE key IN (SELECT key FROM freed)) \
     SELECT count(*) FROM (SELECT lock_runtime_v1_tell($1, $2) FROM freed) AS told";

type Row = (
    String,
    Option<String>,
    Option<i64>,
    Vec<String>,
    Vec<i64>,
    Option<i64>,
    i64,
    i64,
    Option<i32>,
    Vec<String>,
    Vec<i64>,
    Vec<i64>,
);

impl PostgresStore {
    /// Every lock row of the prefix whose key matches `pattern` (a glob), free ones too.
    async fn rows(&self, pattern: &str) -> Result<Vec<LockView>, LockError> {
        let matching = format!("^{}\\{{{}\\}}$", regex_escape(&self.prefix), glob_regex(pattern));
        let prefix = &self.prefix;
        let rows: Vec<Row> = ask!(self, |conn| sqlx::query_as(HELD)
            .bind(prefix)
            .bind(&matching)
            .fetch_all(conn))?;
        let read_at = Instant::now();
        Ok(rows
            .into_iter()
            .filter_map(|row| self.view(row, read_at))
            .collect())
    }

    fn view(&self, row: Row, read_at: Instant) -> Option<LockView> {
        let (
            name,
            token,
            left,
            readers,
            reader_left,
            fence,
            queued,
            writers,
            permits,
            held,
            held_left,
            held_permit,
        ) = row;
        let key = crate::store::user_key(&self.prefix, &name)?.to_owned();
        let millis = |n: i64| Duration::from_millis(unsigned(n));
        // The lease read with the value for one holder; the longest share's for the others.
        let (holding, lease) = match token {
            Some(value) => (Holding::of_value(value.as_bytes()), left.map(millis)),
            None if !readers.is_empty() => {
                let readers = readers.iter().zip(reader_left);
                let readers = readers.map(|(value, left)| Reader::of(value, millis(left)));
                (Holding::shared(readers.collect()), None)
            }
            None if !held.is_empty() => {
                let holders = held.iter().zip(held_left).zip(held_permit);
                let holders = holders.map(|((value, left), permit)| {
                    Reader::of_permit(value, u32::try_from(permit).unwrap_or_default(), millis(left))
                });
                let count = u32::try_from(permits.unwrap_or_default()).unwrap_or_default();
                (Holding::permits(count, holders.collect()), None)
            }
            None => (Holding::Free, None),
        };
        Some(LockView {
            remaining: lease.or_else(|| holding.longest_share()),
            fence: Fence::counter(fence),
            queued: unsigned(queued),
            writers: unsigned(writers),
            read_at,
            key,
            name,
            holding,
        })
    }
}

/// A regular expression (PostgreSQL's `~`) for a Redis-style glob: `*`, `?`, `[…]`, `\x`.
fn glob_regex(glob: &str) -> String {
    let mut regex = String::with_capacity(glob.len() * 2);
    let mut chars = glob.chars();
    while let Some(c) = chars.next() {
        match c {
            '*' => regex.push_str(".*"),
            '?' => regex.push('.'),
            '[' => regex.push('['),
            ']' => regex.push(']'),
            '\\' => match chars.next() {
                Some(next) => regex.push_str(&regex_escape(&next.to_string())),
                None => regex.push_str("\\\\"),
            },
            c => regex.push_str(&regex_escape(&c.to_string())),
        }
    }
    regex
}

/// `text` with every regular expression metacharacter escaped.
fn regex_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.^$|?*+()[]{}".contains(c) {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

impl StoreAdmin for PostgresStore {
    /// What `lock` holds now.
    async fn inspect(&self, lock: &Lock) -> Result<LockView, LockError> {
        let found = self.rows(&glob_escape(lock.key())).await?;
        Ok(found
            .into_iter()
            .next()
            .unwrap_or_else(|| LockView::free(lock.key(), lock.name())))
    }

    /// The locks held now whose keys match `pattern`.
    async fn list(&self, pattern: &str) -> Result<Vec<LockView>, LockError> {
        let views = self.rows(pattern).await?;
        Ok(views.into_iter().filter(LockView::is_held).collect())
    }

    /// Frees `lock` if its row still holds what `seen` shows, and announces it.
    async fn force_release(&self, lock: &Lock, seen: &LockView) -> Result<ForceReleased, LockError> {
        let name = lock.name();
        let freed: i64 = match &seen.holding {
            Holding::Free | Holding::Foreign { .. } => return Ok(ForceReleased::Gone),
            Holding::Exclusive { value, .. } => {
                let token = value.strip_suffix(RELEASED).unwrap_or(value);
                ask!(self, |conn| sqlx::query_scalar(FREE_HELD)
                    .bind(name)
                    .bind(token)
                    .bind(&self.announcement)
                    .fetch_one(conn))?
            }
            Holding::Shared { .. } | Holding::Permits { .. } => {
                // Only the kind seen: a semaphore that took the key after the readers seen (or
                // readers after a semaphore) changed hands.
                let permits = matches!(seen.holding, Holding::Permits { .. });
                ask!(self, |conn| sqlx::query_scalar(FREE_SHARED)
                    .bind(name)
                    .bind(&self.announcement)
                    .bind(permits)
                    .fetch_one(conn))?
            }
        };
        if freed == 1 {
            return Ok(ForceReleased::Freed);
        }
        Ok(ForceReleased::not_freed(&StoreAdmin::inspect(self, lock).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::glob_regex;

    #[test]
    fn globs_become_anchored_regular_expressions_of_the_key() {
        assert_eq!(glob_regex("order:*"), "order:.*");
        assert_eq!(glob_regex("a?c"), "a.c");
        assert_eq!(glob_regex("job.[ab]"), "job\\.[ab]");
        assert_eq!(glob_regex("lit\\*"), "lit\\*");
        assert_eq!(glob_regex("x(y)"), "x\\(y\\)");
    }
}
