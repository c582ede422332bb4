//! `lockctl --postgres URL …`: the same four commands on the library's PostgreSQL store (the
//! `postgres` feature). It reads the rows the library writes (`lock_runtime_locks`, one per
//! lock, `<prefix>{key}` as on Redis, and `lock_runtime_line`, the fair waiters), each read one
//! statement, so every lock is seen at one instant; `release --force` frees a lock in one
//! statement that compares what the row holds with what was read and shown, and announces the
//! release (`NOTIFY lock_runtime`) so that waiters take it at once; `watch` looks every interval
//! and at once when a release is announced.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lock_runtime::keys::LockKeys;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};

use crate::error::Error;
use crate::inspect::{self, Fence, Holding, LockView, Reader};
use crate::output::Out;
use crate::release;
use crate::watch::{self, Plan};
use crate::Command;

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
        (SELECT count(*) FROM jsonb_each(l.claims) AS c WHERE c.value::bigint > n) \
     FROM lock_runtime_locks AS l, lock_runtime_v1_now() AS n \
     WHERE starts_with(l.key, $1) AND l.key ~ $2 \
     ORDER BY l.key";

/// Frees an exclusive lock if it still holds the value read, and announces it.
const FREE_HELD: &str = "WITH freed AS ( \
        UPDATE lock_runtime_locks SET token = NULL, expires_ms = n, marked = false \
        FROM lock_runtime_v1_now() AS n \
        WHERE key = $1 AND (token = $2 OR token = $2 || ':released') AND expires_ms > n \
        RETURNING key) \
     SELECT count(*) FROM (SELECT lock_runtime_v1_tell($3, 'c:lockctl') FROM freed) AS told";

/// Frees a read-write lock's shares if readers still hold it, and announces it.
const FREE_SHARED: &str = "WITH freed AS ( \
        UPDATE lock_runtime_locks SET shares = NULL, shares_until = 0, marked = false \
        FROM lock_runtime_v1_now() AS n \
        WHERE key = $1 AND shares_until > n \
        RETURNING key) \
     SELECT count(*) FROM (SELECT lock_runtime_v1_tell($2, 'c:lockctl') FROM freed) AS told";

/// The PostgreSQL store, through one connection.
#[derive(Debug)]
struct Db {
    pool: PgPool,
    prefix: String,
    timeout: Duration,
}

type Row = (
    String,
    Option<String>,
    Option<i64>,
    Vec<String>,
    Vec<i64>,
    Option<i64>,
    i64,
    i64,
);

impl Db {
    fn new(url: &str, prefix: &str, timeout: Duration) -> Result<Db, Error> {
        let options: PgConnectOptions = url.parse().map_err(|e| {
            Error::Usage(format!(
                "{} is not a PostgreSQL URL: {e}",
                crate::redact::hide_credentials(url)
            ))
        })?;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(timeout)
            .connect_lazy_with(options.application_name("lockctl"));
        Ok(Db {
            pool,
            prefix: prefix.to_owned(),
            timeout,
        })
    }

    async fn within<T>(
        &self,
        what: &str,
        request: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.timeout, request).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(sqlx::Error::Database(e))) if e.code().as_deref() == Some("42P01") => Err(Error::Failed(
                "no lock-runtime tables in this database: no lock client has connected to it yet".to_owned(),
            )),
            Ok(Err(e)) => Err(Error::Failed(format!("PostgreSQL: {what}: {e}"))),
            Err(_) => Err(Error::Failed(format!(
                "PostgreSQL: {what}: no answer within {:?}",
                self.timeout
            ))),
        }
    }

    /// Every lock row of the prefix whose key matches `pattern` (a glob), free ones too.
    async fn rows(&self, pattern: &str) -> Result<Vec<LockView>, Error> {
        let escaped = regex_escape(&self.prefix);
        let matching = format!("^{escaped}\\{{{}\\}}$", glob_regex(pattern));
        let rows: Vec<Row> = self
            .within(
                "reading the locks",
                sqlx::query_as(HELD)
                    .bind(&self.prefix)
                    .bind(&matching)
                    .fetch_all(&self.pool),
            )
            .await?;
        let read_at = Instant::now();
        Ok(rows
            .into_iter()
            .filter_map(|row| self.view(row, read_at))
            .collect())
    }

    fn view(&self, row: Row, read_at: Instant) -> Option<LockView> {
        let (lock_key, token, left, readers, reader_left, fence, fair, writers) = row;
        let key = LockKeys::user_key(&self.prefix, &lock_key)?.to_owned();
        let unsigned = |n: i64| u64::try_from(n).unwrap_or(0);
        let (holding, ttl_ms) = match token {
            Some(value) => (inspect::parse_value(&value), left.map(unsigned)),
            None if !readers.is_empty() => {
                let readers: Vec<Reader> = readers
                    .into_iter()
                    .zip(reader_left)
                    .map(|(value, left)| Reader {
                        owner: inspect::owner_of(&value).unwrap_or_default().to_owned(),
                        value,
                        ttl_ms: unsigned(left),
                    })
                    .collect();
                let ttl = readers.iter().map(|r| r.ttl_ms).max();
                (Holding::Shared { readers }, ttl)
            }
            None => (Holding::Free, None),
        };
        Some(LockView {
            key,
            lock_key,
            holding,
            ttl_ms,
            fence: fence.map_or(Fence::None, |f| Fence::Token(unsigned(f))),
            fair_waiters: unsigned(fair),
            waiting_writers: unsigned(writers),
            read_at,
        })
    }

    async fn held(&self, pattern: &str) -> Result<Vec<LockView>, Error> {
        let views = self.rows(pattern).await?;
        Ok(views.into_iter().filter(|v| v.holding != Holding::Free).collect())
    }

    async fn read_one(&self, key: &str) -> Result<LockView, Error> {
        let found = self.rows(&inspect::glob_escape(key)).await?;
        Ok(found.into_iter().next().unwrap_or_else(|| LockView {
            key: key.to_owned(),
            lock_key: LockKeys::new(&self.prefix, key).lock().to_owned(),
            holding: Holding::Free,
            ttl_ms: None,
            fence: Fence::None,
            fair_waiters: 0,
            waiting_writers: 0,
            read_at: Instant::now(),
        }))
    }

    /// Frees the lock `view` describes if the row still holds that.
    async fn compare_and_delete(&self, view: &LockView) -> Result<release::Deleted, Error> {
        let names = LockKeys::new(&self.prefix, &view.key);
        let freed: i64 = match &view.holding {
            Holding::Free | Holding::Foreign { .. } => return Ok(release::Deleted::Gone),
            Holding::Exclusive { value, .. } => {
                let token = value.strip_suffix(":released").unwrap_or(value);
                self.within(
                    "releasing the lock",
                    sqlx::query_scalar(FREE_HELD)
                        .bind(names.lock())
                        .bind(token)
                        .bind(names.channel())
                        .fetch_one(&self.pool),
                )
                .await?
            }
            Holding::Shared { .. } => {
                self.within(
                    "releasing the lock",
                    sqlx::query_scalar(FREE_SHARED)
                        .bind(names.lock())
                        .bind(names.channel())
                        .fetch_one(&self.pool),
                )
                .await?
            }
        };
        if freed == 1 {
            return Ok(release::Deleted::Yes);
        }
        let now = self.read_one(&view.key).await?;
        Ok(if now.holding == Holding::Free {
            release::Deleted::Gone
        } else {
            release::Deleted::ChangedHands
        })
    }
}

impl release::Locks for &Db {
    async fn read_one(&mut self, key: &str) -> Result<LockView, Error> {
        Db::read_one(self, key).await
    }

    async fn compare_and_delete(&mut self, view: &LockView) -> Result<release::Deleted, Error> {
        Db::compare_and_delete(self, view).await
    }
}

/// Runs `command` against the PostgreSQL store at `url`.
pub(crate) async fn run(
    command: Command,
    url: &str,
    prefix: &str,
    timeout: Duration,
    out: &mut Out,
) -> Result<(), Error> {
    let db = Db::new(url, prefix, timeout)?;
    match command {
        Command::List { pattern } => {
            let views = db.held(&pattern).await?;
            out.list(&pattern, &views)
        }
        Command::Show { key } => {
            inspect::check_key(&key)?;
            let view = db.read_one(&key).await?;
            out.show(&view)
        }
        Command::Release { key, yes, .. } => {
            inspect::check_key(&key)?;
            release::release_from(&mut &db, &key, yes, out).await
        }
        Command::Watch {
            pattern,
            interval_ms,
            for_ms,
        } => {
            let plan = Plan {
                pattern,
                interval: Duration::from_millis(interval_ms),
                stop_after: for_ms.map(Duration::from_millis),
            };
            watch_rows(&db, url, &plan, out).await
        }
    }
}

/// `watch`: a look every interval, and one at once at a key whose release is announced.
async fn watch_rows(db: &Db, url: &str, plan: &Plan, out: &mut Out) -> Result<(), Error> {
    let mut seen = look(db, &plan.pattern).await?;
    let mut listener = db
        .within("listening for releases", async {
            let mut listener = PgListener::connect(url).await?;
            listener.listen("lock_runtime").await?;
            Ok(listener)
        })
        .await?;
    eprintln!(
        "lockctl: watching locks matching {} ({} held now; a look every {} ms); Ctrl-C to stop",
        plan.pattern,
        seen.len(),
        plan.interval.as_millis()
    );
    let stop = watch::stop_after(plan.stop_after);
    tokio::pin!(stop);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + plan.interval, plan.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut stop => return Ok(()),
            signal = &mut ctrl_c => {
                return signal.map_err(|e| Error::Failed(format!("cannot listen for Ctrl-C: {e}")));
            }
            _ = ticks.tick() => {
                let now = look(db, &plan.pattern).await?;
                watch::print(out, watch::changes(&seen, &now))?;
                seen = now;
            }
            heard = listener.recv() => {
                let heard = heard.map_err(|e| Error::Failed(format!("PostgreSQL: listening for releases: {e}")))?;
                // A release announced under the prefix: look now (one statement), not at the tick.
                if announced_key(&db.prefix, heard.payload()).is_some() {
                    let now = look(db, &plan.pattern).await?;
                    watch::print(out, watch::changes(&seen, &now))?;
                    seen = now;
                }
            }
        }
    }
}

/// The locks held now whose keys match `pattern`.
async fn look(db: &Db, pattern: &str) -> Result<watch::Seen, Error> {
    let views = db.held(pattern).await?;
    Ok(views
        .into_iter()
        .map(|v| (v.key.clone(), v))
        .collect::<BTreeMap<_, _>>())
}

/// The user's key of an announcement `<length>:<message><channel>` (as the library writes it).
fn announced_key<'a>(prefix: &str, payload: &'a str) -> Option<&'a str> {
    let (length, rest) = payload.split_once(':')?;
    let length: usize = length.parse().ok()?;
    let channel = rest.get(length..)?;
    LockKeys::user_key_of_channel(prefix, channel)
}

/// A regular expression (PostgreSQL's `~`) for a Redis-style glob: `*`, `?`, `[…]`, `\x`.
pub(crate) fn glob_regex(glob: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::{announced_key, glob_regex};

    #[test]
    fn globs_become_anchored_regular_expressions_of_the_key() {
        assert_eq!(glob_regex("order:*"), "order:.*");
        assert_eq!(glob_regex("a?c"), "a.c");
        assert_eq!(glob_regex("job.[ab]"), "job\\.[ab]");
        assert_eq!(glob_regex("lit\\*"), "lit\\*");
        assert_eq!(glob_regex("x(y)"), "x\\(y\\)");
    }

    #[test]
    fn an_announcement_names_its_lock() {
        assert_eq!(
            announced_key("lock:", "9:c:lockctllock:{order:7}:released"),
            Some("order:7")
        );
        assert_eq!(announced_key("lock:", "2:w:other:{x}:released"), None);
        assert_eq!(announced_key("lock:", "junk"), None);
    }
}
