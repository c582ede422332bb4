//! Locks in a MySQL or MariaDB database (the `mysql` feature): one row per lock in
//! `lock_runtime_locks` (`schema.sql`, made if missing when the client first connects), leases
//! on the database's clock, fencing tokens that never repeat, through sqlx's MySQL driver.
//!
//! A lease row, not `GET_LOCK()`: a named lock is session state of one server (Group
//! Replication ignores it, Galera refuses it, a proxy stops multiplexing after it, a lost
//! connection drops it), where a row commits and replicates with the data and carries a
//! fencing token. Every request of a lock is one statement, so one round trip and atomic (a
//! multi-key set's fencing tokens are read back by a second; a semaphore's release is three,
//! see [`permits`]), and no connection or transaction is held while a lock is held:
//!
//! - the acquire is one `INSERT … ON DUPLICATE KEY UPDATE` whose assignments take the row only
//!   when it is free, expired or already this token's; `LAST_INSERT_ID(expr)` carries the answer
//!   back in the statement's own reply (the new fencing token, or 1, when taken; 0 when not),
//!   since sqlx's connections count matched rows, not changed ones;
//! - a multi-key set is one multi-row `INSERT … ON DUPLICATE KEY UPDATE` that a row it may not
//!   take fails whole (see [`take_set`]);
//! - a renewal and a release compare the token in their `WHERE`;
//! - a refused waiter asks how long the holder has left (a second statement, only when it will
//!   wait).
//!
//! MySQL has no notifications: this client's waiters are woken by its own releases at once;
//! the first of another client's waiters polls on a backoff from 8 ms to 256 ms (and at the
//! holder's expiry; the store says it is [`Polled`](super::Waking::Polled)), the rest wait for
//! their own client's releases. Fair mode, read-write locks and fair semaphores need more than
//! one statement: each of their requests is one short transaction ([`tx`], [`line`],
//! [`shares`]).

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool};

use super::sql::{ask, late_attempts, millis, unsigned, SqlCore, SqlStore};
use super::{
    Asked, Attempt, Capabilities, DynStore, Flight, Kind, Lock, Notices, Offered, Release, Released, Renewal,
    Renewing, SetAsk, SetAttempt, Settings, Store, StoreConfig, Waking,
};
use crate::redact::hide_credentials;
use crate::{LockClientBuilder, LockError};

/// The tables, made if missing (`CREATE TABLE IF NOT EXISTS`).
const SCHEMA: &str = include_str!("schema.sql");
/// Whether the tables are there (and this client may read them), without needing `CREATE`.
const SCHEMA_READY: &str = "SELECT 1 FROM lock_runtime_locks, lock_runtime_line, lock_runtime_shares LIMIT 0";

/// The database's clock at the statement's start, in microseconds and milliseconds since the
/// epoch: from `UTC_TIMESTAMP`, so whatever the session's time zone (no hour repeated by a
/// daylight-saving change, also behind a proxy that does not keep session variables) and past
/// 2038 (MariaDB's `UNIX_TIMESTAMP` before 11.5 is NULL then).
macro_rules! now_us {
    () => {
        "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
    };
}
macro_rules! now_ms {
    () => {
        concat!("(", now_us!(), " DIV 1000)")
    };
}
/// A statement's text: string literals and macros that give one (`now_ms!()`, `now_us!()`,
/// `takeable!(…)`) side by side, joined at compile time as `concat!` joins them; without the
/// commas, a statement reads as one piece of SQL.
macro_rules! sql {
    (@ [$($done:tt)*]) => {
        concat!($($done)*)
    };
    (@ [$($done:tt)*] $name:ident ! $args:tt $($rest:tt)*) => {
        sql!(@ [$($done)* $name! $args,] $($rest)*)
    };
    (@ [$($done:tt)*] $part:literal $($rest:tt)*) => {
        sql!(@ [$($done)* $part,] $($rest)*)
    };
    ($($parts:tt)+) => {
        sql!(@ [] $($parts)+)
    };
}
mod admin;

/// The row may be taken by the token `$token` (a bind, or an expression naming the row's own):
/// free, expired, or already its own.
macro_rules! takeable {
    ($token:expr) => {
        concat!(
            "(token IS NULL OR expires_ms <= ",
            now_ms!(),
            " OR token = ",
            $token,
            ")"
        )
    };
}

mod line;
mod permits;
mod shares;
mod tx;

/// The acquire (binds: name, token, ttl, fencing; then token, fencing, token, token, token,
/// token, ttl: the update names the inserted row's values by binding them again, not by
/// `VALUES()`, which MySQL deprecates since 8.0.20). A fencing token is the larger of the clock
/// in microseconds and one more than the key's last (kept in its row, which a fenced lock keeps
/// an hour after its release): tokens of a key never repeat, also when the clock steps back.
/// The fence is assigned first, while `token` and `expires_ms` are still the row's (MySQL
/// assigns left to right, MariaDB may assign all at once: every assignment reads the same
/// condition, which holds after the token is ours exactly when it held before, so the result
/// does not depend on the order). A taken row sets `LAST_INSERT_ID` to its token (or 1 without
/// fencing), a refused one to 0, or to 2 when a header holds the key (a semaphore's or readers':
/// its token starts with a zero byte); the statement's reply carries it.
const TAKE: &str = sql!(
    "INSERT INTO lock_runtime_locks (name, token, expires_ms, fence) \
     VALUES (?, ?, " now_ms!() " + ?, IF(?, LAST_INSERT_ID(" now_us!() "), IF(LAST_INSERT_ID(1), NULL, NULL))) \
     ON DUPLICATE KEY UPDATE \
     fence = IF(" takeable!("?") ", \
       IF(?, LAST_INSERT_ID(IF(token = ? AND fence IS NOT NULL, fence, \
         GREATEST(" now_us!() ", COALESCE(fence, 0) + 1))), IF(LAST_INSERT_ID(1), fence, fence)), \
       IF(LAST_INSERT_ID(IF(LEFT(token, 1) = X'00', 2, 0)), fence, fence)), \
     token = IF(" takeable!("?") ", ?, token), \
     expires_ms = IF(" takeable!("?") ", " now_ms!() " + ?, expires_ms)"
);
/// A set's acquire: [`TAKE`] for many rows in one statement, every row or none (binds: per row
/// name, token, ttl, fencing; then [`row_tokens`]' binds five times, with fencing after the
/// first; then ttl). The update reads each row's own token by its name (a `CASE` over the
/// rows: bound again, not `VALUES()`). A row that may not be taken makes the whole statement
/// fail (an unsigned overflow, evaluated only for such a row: ER_DATA_OUT_OF_RANGE, whatever
/// the `sql_mode`), and InnoDB rolls a failed statement back, so no row of a refused set was
/// taken. A new row's fencing token is the clock in microseconds; a row's own, as for one lock.
/// Its rows are locked in the order they are named, which the caller makes the primary key's
/// (as a renewal and the sweep lock them), and a deadlock's victim changed nothing and is sent
/// again.
fn take_set(rows: usize) -> String {
    let row = sql!("(?, ?, " now_ms!() " + ?, IF(?, " now_us!() ", NULL))");
    let own = row_tokens(rows);
    let takeable = format!("(token IS NULL OR expires_ms <= {} OR token = {own})", now_ms!());
    format!(
        "INSERT INTO lock_runtime_locks (name, token, expires_ms, fence) VALUES {} \
         ON DUPLICATE KEY UPDATE fence = IF({takeable}, IF(?, IF(token = {own} AND fence IS NOT NULL, \
         fence, GREATEST({}, COALESCE(fence, 0) + 1)), fence), expires_ms + 18446744073709551615), \
         token = IF({takeable}, {own}, token), expires_ms = IF({takeable}, {} + ?, expires_ms)",
        vec![row; rows].join(", "),
        now_us!(),
        now_ms!()
    )
}

/// The token a set's statement inserts for the row being updated, by its name (binds: each
/// row's name and token).
fn row_tokens(rows: usize) -> String {
    format!("CASE name{} END", " WHEN ? THEN ?".repeat(rows))
}

/// Sets of up to this many locks are taken with a statement prepared on the server.
const PREPARED_SETS: usize = 4;

/// The set's statement refused: some row of it may not be taken (see [`take_set`]).
fn set_refused(e: &sqlx::Error) -> bool {
    // ER_DATA_OUT_OF_RANGE
    number(e) == Some(1690)
}

/// The rows of some locks as they are now (binds: the names): name, token, fencing token and
/// how long the lease has left (at most 0 when it ended). `locking`: a locking read, which a
/// proxy that splits reads from writes sends to the primary (the tokens a write just took).
fn rows_of(names: usize, locking: bool) -> String {
    format!(
        concat!(
            "SELECT name, token, fence, expires_ms - ",
            now_ms!(),
            " FROM lock_runtime_locks WHERE name IN ({}){}"
        ),
        vec!["?"; names].join(", "),
        if locking { " FOR UPDATE" } else { "" }
    )
}

/// How long the holder of a refused lock has left (none: it went meanwhile).
const LEFT: &str = sql!(
    "SELECT expires_ms - " now_ms!()
    " FROM lock_runtime_locks WHERE name = ? AND token IS NOT NULL AND expires_ms > " now_ms!()
);
/// One renewal (binds: ttl, name, token): never shortens the lease.
const RENEW: &str = sql!(
    "UPDATE lock_runtime_locks SET expires_ms = GREATEST(expires_ms, " now_ms!()
    " + ?) WHERE name = ? AND token = ? AND expires_ms > " now_ms!()
);
/// The common release (binds: name, token): deletes a lock still held by this token with no
/// fencing token to keep.
const GIVE_BACK: &str = sql!(
    "DELETE FROM lock_runtime_locks WHERE name = ? AND token = ? AND fence IS NULL AND expires_ms > "
    now_ms!()
);
/// Any other release (binds: hold, hold, name, token): frees the row, keeping its fencing token,
/// or keeps the lock `hold` ms longer marked released.
const RELEASE: &str = sql!(
    "UPDATE lock_runtime_locks SET token = IF(? > 0, CONCAT(token, ':released'), NULL), expires_ms = "
    now_ms!() " + ? WHERE name = ? AND token = ? AND expires_ms > " now_ms!()
);
/// Rows nothing needs any more: an unfenced lock's as soon as it expired, a fenced lock's (its
/// last token) an hour after.
macro_rules! unneeded {
    () => {
        concat!(
            "expires_ms < ",
            now_ms!(),
            " AND (fence IS NULL OR expires_ms < ",
            now_ms!(),
            " - 3600000)"
        )
    };
}
/// The sweep's first step (binds: rows): a plain read, which locks nothing (a `DELETE … WHERE`
/// over the unindexed lease column would lock every row it reads, live locks included, until
/// it ends).
const UNNEEDED: &str = sql!("SELECT name FROM lock_runtime_locks WHERE " unneeded!() " LIMIT ?");

/// The most rows one sweep deletes.
const SWEEP_ROWS: u32 = 1000;

/// How many connections a client's pool opens at most.
const POOL_SIZE: u32 = 10;

/// A MySQL or MariaDB database, as the builder was told.
#[derive(Clone)]
pub(crate) struct MysqlConfig {
    url: String,
}

impl std::fmt::Debug for MysqlConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mysql")
            .field("url", &hide_credentials(&self.url))
            .finish()
    }
}

impl StoreConfig for MysqlConfig {
    fn open(&self, settings: Settings) -> Result<Arc<dyn DynStore>, LockError> {
        settings.no_replicas(
            "MySQL: semi-synchronous replication (rpl_semi_sync) makes every commit, locks \
             included, wait for a replica",
        )?;
        settings.no_tls_material(
            "TLS for MySQL goes into its URL (ssl-mode, ssl-ca, ssl-cert, ssl-key), not the builder",
        )?;
        Ok(Arc::new(MysqlStore::new(&self.url, settings)?))
    }
}

/// A database by URL (`LockClient::connect`).
pub(crate) fn from_url(url: &str) -> Result<Arc<dyn StoreConfig>, LockError> {
    Ok(Arc::new(MysqlConfig { url: url.to_owned() }))
}

impl LockClientBuilder {
    /// A MySQL or MariaDB database (`mysql://user:password@host:3306/database`; the `mysql`
    /// feature): each lock is a row of `lock_runtime_locks` (made by the first client that
    /// connects, in the URL's database), leased on the database's clock, with fencing tokens
    /// that never repeat. No connection or transaction is held while a lock is held; every
    /// request of a lock is one statement (a semaphore's permit is a row of its own, its key's
    /// row the semaphore's header). Waiters of this client are woken by its releases; others
    /// try again on a backoff from 8 ms to 256 ms, and at the holder's expiry. Fair mode,
    /// read-write locks and fair semaphores are short transactions (the lines and shares are
    /// tables of their own, made beside the lock table).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .mysql("mysql://app:secret@db.internal:3306/orders")
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    pub fn mysql(self, url: &str) -> Self {
        self.place(MysqlConfig { url: url.to_owned() })
    }
}

/// Locks in one MySQL or MariaDB database.
#[derive(Debug)]
pub(crate) struct MysqlStore {
    /// Its pool and what else every SQL store holds (the place it names: `host:port/database`).
    sql: SqlCore<sqlx::MySql>,
    /// Each row's name starts with it.
    prefix: String,
    notices: Notices,
    /// This client's semaphore permits, by token.
    permits: permits::Permits,
    /// This client's shares of read-write locks, by token.
    shares: shares::Shares,
}

impl MysqlStore {
    /// A store for `url` (`mysql://user:password@host:port/database`); connects on first use.
    pub(crate) fn new(url: &str, settings: Settings) -> Result<Self, LockError> {
        let Settings {
            prefix,
            timeouts,
            notices,
            ..
        } = settings;
        let shown = hide_credentials(url);
        let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
        if !(scheme.eq_ignore_ascii_case("mysql") || scheme.eq_ignore_ascii_case("mariadb")) {
            return Err(LockError::invalid_options(format!(
                "{shown}: a MySQL URL starts with mysql:// or mariadb://"
            )));
        }
        // sqlx takes mysql:// only.
        let rest = &url[scheme.len()..];
        let options = MySqlConnectOptions::from_str(&format!("mysql{rest}"))
            .map_err(|e| LockError::invalid_options(format!("{shown}: not a MySQL URL ({e})")))?;
        let Some(database) = options.get_database().map(str::to_owned) else {
            return Err(LockError::invalid_options(format!(
                "{shown}: name the database the lock table lives in (mysql://user:password@host:3306/database)"
            )));
        };
        let address = format!("{}:{}/{database}", options.get_host(), options.get_port());
        let set: Arc<str> = format!(
            "SET SESSION innodb_lock_wait_timeout = {}",
            lock_wait(timeouts.response).as_secs()
        )
        .into();
        let setup: super::sql::Setup<sqlx::MySql> = Arc::new(move |conn| {
            let set = Arc::clone(&set);
            Box::pin(async move { sqlx::Executor::execute(conn, &*set).await.map(drop) })
        });
        Ok(MysqlStore {
            sql: SqlCore::new(options, timeouts, address).with_setup(setup),
            prefix,
            notices,
            permits: permits::Permits::default(),
            shares: shares::Shares::default(),
        })
    }

    async fn renew_one(&self, lock: &Lock, token: &str, ttl_ms: u64) -> Result<Renewal, LockError> {
        let renewed = ask!(self, |conn| sqlx::query(RENEW)
            .bind(millis(ttl_ms))
            .bind(lock.name().as_bytes())
            .bind(token.as_bytes())
            .execute(conn))?;
        // sqlx's connections count matched rows: 1 also when the lease did not move.
        Ok(Renewal::from_ours(renewed.rows_affected() == 1))
    }

    async fn release_lock(&self, lock: &Lock, token: &str, hold_ms: u64) -> Result<Released, LockError> {
        if hold_ms == 0 {
            let deleted = ask!(self, |conn| sqlx::query(GIVE_BACK)
                .bind(lock.name().as_bytes())
                .bind(token.as_bytes())
                .execute(conn))?;
            if deleted.rows_affected() == 1 {
                return Ok(Released::Freed);
            }
        }
        let hold = millis(hold_ms);
        let released = ask!(self, |conn| sqlx::query(RELEASE)
            .bind(hold)
            .bind(hold)
            .bind(lock.name().as_bytes())
            .bind(token.as_bytes())
            .execute(conn))?;
        Ok(match released.rows_affected() {
            1 => Released::Freed,
            _ => Released::NotOurs,
        })
    }
}

impl Drop for MysqlStore {
    fn drop(&mut self) {
        self.sql.stop();
    }
}

/// Deletes up to [`SWEEP_ROWS`] rows nothing needs of each table: found by a plain read, deleted
/// by their keys with the condition checked again (a row taken meanwhile stays), so only those
/// rows are locked, each for a moment. Whether any table's batch came back full.
async fn sweep_rows(conn: &mut sqlx::MySqlConnection) -> Result<bool, sqlx::Error> {
    let names: Vec<Vec<u8>> = sqlx::query_scalar(UNNEEDED)
        .bind(SWEEP_ROWS)
        .fetch_all(&mut *conn)
        .await?;
    if !names.is_empty() {
        let statement = format!(
            "DELETE FROM lock_runtime_locks WHERE name IN ({}) AND {}",
            vec!["?"; names.len()].join(", "),
            unneeded!()
        );
        let mut query = sqlx::query(&statement).persistent(false);
        for name in &names {
            query = query.bind(name.as_slice());
        }
        query.execute(&mut *conn).await?;
    }
    let full = |n: usize| n >= SWEEP_ROWS as usize;
    let places = sweep_lapsed(&mut *conn, "lock_runtime_line", "kept_until").await?;
    let shares = sweep_lapsed(conn, "lock_runtime_shares", "expires_ms").await?;
    Ok(full(names.len()) || full(places) || full(shares))
}

/// Deletes up to [`SWEEP_ROWS`] rows of `table` (the lines, the shares) whose `end` passed a
/// minute ago (a request on their key deletes them sooner): found by a plain read, deleted by
/// their ids with the condition checked again. How many it found.
async fn sweep_lapsed(
    conn: &mut sqlx::MySqlConnection,
    table: &str,
    end: &str,
) -> Result<usize, sqlx::Error> {
    let lapsed = format!("{end} < {} - 60000", now_ms!());
    let ids: Vec<i64> = sqlx::query_scalar(&format!("SELECT id FROM {table} WHERE {lapsed} LIMIT ?"))
        .persistent(false)
        .bind(SWEEP_ROWS)
        .fetch_all(&mut *conn)
        .await?;
    if ids.is_empty() {
        return Ok(0);
    }
    let found = ids.len();
    let statement = format!(
        "DELETE FROM {table} WHERE id IN ({}) AND {lapsed}",
        vec!["?"; ids.len()].join(", ")
    );
    let mut query = sqlx::query(&statement).persistent(false);
    for id in ids {
        query = query.bind(id);
    }
    query.execute(conn).await?;
    Ok(found)
}

/// Makes the tables unless they are there (checked first, so a client without `CREATE` works once
/// someone made it).
async fn make_schema(pool: &MySqlPool) -> Result<(), sqlx::Error> {
    match sqlx::query(SCHEMA_READY).execute(pool).await {
        Ok(_) => return Ok(()),
        // ER_NO_SUCH_TABLE
        Err(e) if number(&e) == Some(1146) => {}
        Err(e) => return Err(e),
    }
    sqlx::raw_sql(SCHEMA).execute(pool).await?;
    tracing::info!(
        tables = "lock_runtime_locks, lock_runtime_line, lock_runtime_shares",
        "made lock-runtime's tables in the database"
    );
    Ok(())
}

impl SqlStore for MysqlStore {
    type Db = sqlx::MySql;
    const POOL_SIZE: u32 = POOL_SIZE;
    const DATABASE: &'static str = "MySQL";

    fn refusal(e: &sqlx::Error) -> Option<&'static str> {
        match number(e)? {
            // ER_ACCESS_DENIED_ERROR, ER_ACCESS_DENIED_NO_PASSWORD_ERROR (a user without a password
            // that the server does not know, or that needs one), ER_PASSWORD_ANONYMOUS_USER
            1045 | 1698 | 1131 => Some("wrong user or password: fix the credentials in the MySQL URL"),
            // ER_NOT_SUPPORTED_AUTH_MODE
            1251 => Some(
                "the MySQL user's authentication plugin is one the client does not speak: give the \
                 user mysql_native_password or caching_sha2_password",
            ),
            // ER_MUST_CHANGE_PASSWORD, ER_MUST_CHANGE_PASSWORD_LOGIN
            1820 | 1862 => Some("the MySQL user's password has expired: set a new one"),
            // ER_ACCOUNT_HAS_BEEN_LOCKED (MySQL 8, MariaDB)
            3118 | 4151 => {
                Some("the MySQL user's account is locked: unlock it (ALTER USER … ACCOUNT UNLOCK)")
            }
            // ER_BAD_DB_ERROR
            1049 => Some("the database in the MySQL URL does not exist"),
            // ER_BINLOG_STMT_MODE_AND_ROW_ENGINE: READ COMMITTED with statement-based logging
            1665 => Some(
                "the server logs statements (binlog_format=STATEMENT), which InnoDB refuses at READ \
                 COMMITTED, the level of the store's transactions: set binlog_format to ROW or MIXED",
            ),
            // ER_DBACCESS_DENIED_ERROR, ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR,
            // ER_SPECIFIC_ACCESS_DENIED_ERROR
            1044 | 1142 | 1143 | 1227 => Some(
                "the MySQL user lacks a right locking needs (see the guide, docs/deployments.md, \"MySQL\": \
                 CREATE on the database for the first client, then SELECT, INSERT, UPDATE and DELETE \
                 on lock_runtime_locks, lock_runtime_line and lock_runtime_shares)",
            ),
            _ => None,
        }
    }

    fn core(&self) -> &SqlCore<sqlx::MySql> {
        &self.sql
    }

    fn make_schema(&self, pool: &MySqlPool) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        make_schema(pool)
    }

    fn sweep_batch(
        conn: &mut sqlx::MySqlConnection,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + '_ {
        sweep_rows(conn)
    }

    /// Its connection was killed (`KILL`, a restart), or the request was rolled back: a
    /// deadlock's victim (or a Galera certification failure), a lock wait that timed out, a
    /// Group Replication conflict at commit. It changed nothing (a one-statement request is
    /// rolled back whole; a transaction's connection is closed on any error, which rolls it
    /// back), and every request is idempotent for one token, so it can be sent again.
    fn ended_by_server(&self, e: &sqlx::Error) -> bool {
        // ER_SERVER_SHUTDOWN, ER_LOCK_WAIT_TIMEOUT, ER_LOCK_DEADLOCK, ER_CONNECTION_KILLED
        // (MariaDB), ER_TRANSACTION_ROLLBACK_DURING_COMMIT (MySQL Group Replication),
        // ER_CLIENT_INTERACTION_TIMEOUT
        matches!(number(e), Some(1053 | 1205 | 1213 | 1927 | 3101 | 4031))
    }
}

/// The server's error number (MySQL's and MariaDB's own, not the SQLSTATE).
fn number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(sqlx::mysql::MySqlDatabaseError::number),
        _ => None,
    }
}

impl Store for MysqlStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            name: "MySQL",
            fencing: Offered::Yes,
            fair: Offered::Yes,
            shared: Offered::Yes,
            permits: Offered::Yes,
            waking: Waking::Polled,
        }
    }

    /// `<prefix>{<key>}`, the row's name.
    fn name(&self, key: &str) -> String {
        super::name(&self.prefix, key)
    }

    /// The tables, and every right locking needs ([`check_rights`](super::sql::check_rights)):
    /// a semaphore's permits are rows of the locks' table, so a lock's rights are theirs (and a
    /// probe semaphore would leave its header row until a later sweep).
    async fn connect(&self) -> Result<(), LockError> {
        super::sql::check_rights(self, &self.prefix, false).await
    }

    async fn attempt(&self, asked: Asked<'_>, _: &Flight) -> Result<Attempt, LockError> {
        let Asked { lock, token, ask } = asked;
        if ask.mode.semaphore() {
            return self.permit_attempt(asked).await;
        }
        self.sweep_now_and_then();
        if ask.mode.shared() {
            return self.share_attempt(asked).await;
        }
        if ask.mode.fair() {
            return self.exclusive_attempt(asked).await;
        }
        let taken = ask!(self, |conn| sqlx::query(TAKE)
            .bind(lock.name().as_bytes())
            .bind(token.as_bytes())
            .bind(millis(ask.ttl_ms))
            .bind(ask.fencing)
            .bind(token.as_bytes())
            .bind(ask.fencing)
            .bind(token.as_bytes())
            .bind(token.as_bytes())
            .bind(token.as_bytes())
            .bind(token.as_bytes())
            .bind(millis(ask.ttl_ms))
            .execute(conn))?;
        let answer = taken.last_insert_id();
        if answer == 2 {
            // A header holds the key (a semaphore's, or readers'): the attempt that tells
            // which, and claims the writers' turn from readers.
            return self.exclusive_attempt(asked).await;
        }
        if answer != 0 {
            if ask.claimed {
                // Taken: a claim left behind lapses within a second by itself.
                if let Err(e) = self.end_claim(lock, token).await {
                    tracing::debug!(key = lock.key(), error = %e, "ending a writer's claim failed");
                }
            }
            return Ok(Attempt::acquired(ask.fencing.then_some(answer)));
        }
        if !ask.waiting {
            return Ok(Attempt::HELD);
        }
        let left: Option<i64> = ask!(self, |conn| sqlx::query_scalar(LEFT)
            .bind(lock.name().as_bytes())
            .fetch_optional(conn))?;
        Ok(Attempt::Held {
            // Gone meanwhile: try again at once.
            pttl_ms: Some(left.map_or(0, unsigned)),
            behind: false,
            claimed: false,
            kept: None,
        })
    }

    /// Every lock of a set for its token, or none, in one statement ([`take_set`]); the fencing
    /// tokens taken, when asked for, in a second (a write answers no values here), and the lock
    /// that refused a caller that will not wait, likewise (one that will goes on key by key). A
    /// fenced set whose tokens cannot all be read back as this caller's (a lock forced free or
    /// lapsed in between) is given back and refused: no guard is handed out without its tokens.
    async fn attempt_set(&self, set: SetAsk<'_>, _: &Flight) -> Result<Option<SetAttempt>, LockError> {
        let SetAsk { locks, tokens, ask } = set;
        self.sweep_now_and_then();
        let statement = take_set(locks.len());
        // The rows in the primary key's order.
        let mut order: Vec<usize> = (0..locks.len()).collect();
        order.sort_by_key(|&at| locks[at].name().as_bytes());
        let taken = ask!(self, |conn| {
            // Prepared on the server for the small sets most callers name (one statement per
            // size and connection, far below the server's `max_prepared_stmt_count`: parsing
            // it each time cost a set a quarter of its speed); larger ones go as text.
            let mut query = sqlx::query(&statement).persistent(locks.len() <= PREPARED_SETS);
            for &at in &order {
                query = query
                    .bind(locks[at].name().as_bytes())
                    .bind(tokens[at].as_bytes())
                    .bind(millis(ask.ttl_ms))
                    .bind(ask.fencing);
            }
            for case in 0..5 {
                for &at in &order {
                    query = query
                        .bind(locks[at].name().as_bytes())
                        .bind(tokens[at].as_bytes());
                }
                if case == 0 {
                    query = query.bind(ask.fencing);
                }
            }
            async {
                match query.bind(millis(ask.ttl_ms)).execute(conn).await {
                    Ok(_) => Ok(true),
                    Err(e) if set_refused(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            }
        })?;
        if taken && !ask.fencing {
            return Ok(Some(SetAttempt::taken(vec![None; locks.len()])));
        }
        if !taken && ask.join {
            return Ok(Some(SetAttempt::Refused { at: 0, pttl_ms: None }));
        }
        let statement = rows_of(locks.len(), taken);
        type Row = (Vec<u8>, Option<Vec<u8>>, Option<i64>, i64);
        let rows: Vec<Row> = ask!(self, |conn| {
            let mut query = sqlx::query_as(&statement).persistent(false);
            for &at in &order {
                query = query.bind(locks[at].name().as_bytes());
            }
            query.fetch_all(conn)
        })?;
        let row_of = |lock: &Lock| rows.iter().find(|row| row.0 == lock.name().as_bytes());
        if taken {
            let fences: Vec<Option<u64>> = locks
                .iter()
                .zip(tokens)
                .map(|(lock, token)| {
                    row_of(lock)
                        .filter(|row| row.1.as_deref() == Some(token.as_bytes()))
                        .and_then(|row| row.2)
                        .map(unsigned)
                })
                .collect();
            let Some(missing) = fences.iter().position(Option::is_none) else {
                return Ok(Some(SetAttempt::taken(fences)));
            };
            for (lock, token) in locks.iter().zip(tokens) {
                self.release_lock(lock, token, 0).await?;
            }
            return Ok(Some(SetAttempt::Refused {
                at: missing,
                pttl_ms: None,
            }));
        }
        // A key a semaphore holds: refused as a single lock is.
        for lock in locks {
            let header = row_of(lock)
                .filter(|row| row.3 > 0)
                .and_then(|row| row.1.as_deref().and_then(permits::count_of));
            if let Some(count) = header {
                return Err(crate::store::permits_differ(lock.key(), count, 1));
            }
        }
        // The first lock of the set someone holds (none: they went meanwhile).
        let held = locks.iter().enumerate().find_map(|(at, lock)| {
            row_of(lock)
                .filter(|row| row.1.is_some() && row.3 > 0)
                .map(|row| (at, row.3))
        });
        Ok(Some(SetAttempt::Refused {
            at: held.map_or(0, |(at, _)| at),
            pttl_ms: held.map(|(_, left)| unsigned(left)),
        }))
    }

    /// Many locks in one statement; when not every one was renewed, each again on its own to
    /// find which (a lost lock is rare).
    async fn renew(&self, locks: &[Renewing<'_>]) -> Result<Vec<Renewal>, LockError> {
        // A semaphore's permit is a row of its own, renewed with its header (one statement
        // each); the locks in one statement.
        let mut found = vec![Renewal::Gone; locks.len()];
        let mut plain = Vec::with_capacity(locks.len());
        for (at, (lock, token, ttl_ms)) in locks.iter().enumerate() {
            match self.permits.get(token) {
                Some(held) => {
                    found[at] = Renewal::from_ours(self.renew_permit(&held, token, *ttl_ms).await?);
                }
                None if self.shares.holds(token) => {
                    found[at] = self.renew_share(lock, token, *ttl_ms).await?
                }
                None => plain.push((at, (*lock, *token, *ttl_ms))),
            }
        }
        if let [(at, (lock, token, ttl_ms))] = plain.as_slice() {
            found[*at] = self.renew_one(lock, token, *ttl_ms).await?;
            return Ok(found);
        }
        if plain.is_empty() {
            return Ok(found);
        }
        let mut statement = format!(
            "UPDATE lock_runtime_locks SET expires_ms = GREATEST(expires_ms, {} + CASE name",
            now_ms!()
        );
        statement.push_str(&" WHEN ? THEN ?".repeat(plain.len()));
        statement.push_str(" END) WHERE expires_ms > ");
        statement.push_str(now_ms!());
        statement.push_str(" AND (");
        statement.push_str(&vec!["(name = ? AND token = ?)"; plain.len()].join(" OR "));
        statement.push(')');
        let renewed = ask!(self, |conn| {
            // Not prepared on the server: its text differs with the number of locks, and
            // prepared statements count against the server's `max_prepared_stmt_count`.
            let mut query = sqlx::query(&statement).persistent(false);
            for (_, (lock, _, ttl_ms)) in &plain {
                query = query.bind(lock.name().as_bytes()).bind(millis(*ttl_ms));
            }
            for (_, (lock, token, _)) in &plain {
                query = query.bind(lock.name().as_bytes()).bind(token.as_bytes());
            }
            query.execute(conn)
        })?;
        if renewed.rows_affected() == plain.len() as u64 {
            for (at, _) in &plain {
                found[*at] = Renewal::RENEWED;
            }
            return Ok(found);
        }
        for (at, (lock, token, ttl_ms)) in &plain {
            found[*at] = self.renew_one(lock, token, *ttl_ms).await?;
        }
        Ok(found)
    }

    async fn release(&self, lock: &Lock, token: &str, release: Release<'_>) -> Result<Released, LockError> {
        if release.kind == Kind::Permit {
            return self
                .release_permit(lock, token, release.hold_ms, release.after.is_some())
                .await;
        }
        if release.kind == Kind::Shared || self.shares.holds(token) {
            return self.release_share(lock, token).await;
        }
        let released = self.release_lock(lock, token, release.hold_ms).await?;
        if release.kind == Kind::Fair && released == Released::Freed && release.hold_ms == 0 {
            // The head of the line: woken at once if it is this client's.
            return Ok(self.admitted(lock.name(), 1).await);
        }
        Ok(released)
    }

    fn late_attempts(&self) -> Option<std::time::Duration> {
        // An attempt waits for a row at most `lock_wait`, and for two at most (a permit's claim
        // locks its header and its row). A set's statement waits for a row per key: its locks
        // are given back again after the longer of this and the client's wait for any set
        // (see `core::release_in_background`).
        late_attempts(lock_wait(self.sql.timeouts.response) * 2)
    }

    async fn leave(&self, lock: &Lock, token: &str, claimed: bool) -> Result<(), LockError> {
        self.leave_lines(lock, token, claimed).await
    }
}

/// How long a statement of the store's waits for a row on the server
/// (`innodb_lock_wait_timeout`, whole seconds, at least one): the response timeout, when the
/// client gives up on it too; not InnoDB's 50 s, after which a statement given up on would still
/// take a lock for nobody (see `late_attempts`).
fn lock_wait(response: std::time::Duration) -> std::time::Duration {
    let whole = response.as_secs() + u64::from(response.subsec_nanos() > 0);
    std::time::Duration::from_secs(whole.max(1))
}

#[cfg(test)]
mod tests {
    /// Every file that holds a MySQL statement, by name.
    const SOURCES: [(&str, &str); 7] = [
        ("mod.rs", include_str!("mod.rs")),
        ("permits.rs", include_str!("permits.rs")),
        ("line.rs", include_str!("line.rs")),
        ("shares.rs", include_str!("shares.rs")),
        ("admin.rs", include_str!("admin.rs")),
        ("tx.rs", include_str!("tx.rs")),
        ("schema.sql", include_str!("schema.sql")),
    ];

    /// The statements run on MySQL 8 as written: no `VALUES()` in `ON DUPLICATE KEY UPDATE`
    /// (deprecated since 8.0.20, a warning per execution; a derived table's columns instead),
    /// and no `LAST_INSERT_ID()` read anywhere (read in the statement that sets it with
    /// `LAST_INSERT_ID(expr)`, the manual calls the result undefined; the answer is read from
    /// the statement's reply). Comments may name them.
    #[test]
    fn no_statement_uses_values_or_reads_last_insert_id() {
        let values = format!("{}(", "VALUES");
        let read = format!("{}()", "LAST_INSERT_ID");
        for (file, text) in SOURCES {
            for (at, line) in text.lines().enumerate() {
                let code = line.trim_start();
                if code.starts_with("//") || code.starts_with("--") {
                    continue;
                }
                // (Statements are written in capitals: sqlx's `last_insert_id()` is not one.)
                assert!(!code.contains(&values), "{file}:{}: {line}", at + 1);
                assert!(!code.contains(&read), "{file}:{}: {line}", at + 1);
            }
        }
    }

    /// A set's statement has a row per lock and reads each row's token by its name: four binds
    /// per row, the five `CASE`s' two per row, fencing and the ttl.
    #[test]
    fn a_sets_statement_has_a_row_per_lock() {
        for rows in 1..=5 {
            let statement = super::take_set(rows);
            assert_eq!(statement.matches("CASE name").count(), 5, "{statement}");
            assert_eq!(statement.matches('?').count(), 14 * rows + 2, "{statement}");
        }
    }

    /// The acquire's binds, as `attempt` sends them.
    #[test]
    fn the_acquire_has_eleven_binds() {
        assert_eq!(super::TAKE.matches('?').count(), 11, "{}", super::TAKE);
    }
}
