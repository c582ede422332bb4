//! Locks in a PostgreSQL database (the `postgres` feature): one row per lock in
//! `lock_runtime_locks`, leases on the database's clock, fencing tokens from one sequence, and
//! waiters woken by `NOTIFY`, heard on one listening connection per client.
//!
//! Every request is one statement calling one of the functions of `schema.sql` (made if missing
//! when the client first connects), so one round trip and atomic: the row of the lock is locked
//! for the few microseconds the statement runs, and no connection or transaction is held while a
//! lock is held. A connection from the pool serves each request.

use std::future::Future;
use std::sync::Arc;

use sqlx::postgres::{PgConnectOptions, PgPool};

use super::sql::{ask, late_attempts, millis, unsigned, SqlCore, SqlStore};
use super::{
    Ask, Asked, Attempt, Capabilities, DynStore, Flight, Kind, Lock, Notices, Release, Released, Renewal,
    Renewing, SetAsk, SetAttempt, Settings, Store, StoreConfig,
};
use crate::options::FAIR_PLACE_KEPT;
use crate::redact::hide_credentials;
use crate::wakeups::HandedOver;
use crate::{LockClientBuilder, LockError};

mod listener;

/// The tables, sequences and functions, made if missing (`CREATE … IF NOT EXISTS`, `CREATE OR
/// REPLACE FUNCTION`).
const SCHEMA: &str = include_str!("schema.sql");

/// Whether this schema is there, exactly: the comment on its last function (made last, in the
/// same transaction as the rest) names a hash of `schema.sql`. Any other (an older build's) is
/// made again: every statement of it is idempotent. Read from the catalog's tables, which each
/// statement sees as committed when it starts (a lookup by name, `to_regprocedure`, goes through
/// the session's cache, which a transaction that began before another's making does not renew:
/// one that waited for the maker found nothing).
const SCHEMA_READY: &str = "SELECT coalesce((\
       SELECT d.description = $1 FROM pg_catalog.pg_proc p \
       JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
       JOIN pg_catalog.pg_description d ON d.objoid = p.oid \
         AND d.classoid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.objsubid = 0 \
       WHERE n.nspname = $2 AND p.proname = 'lock_runtime_v1_sweep' \
         AND p.proargtypes = '23'::pg_catalog.oidvector), false), \
     EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $2)";

/// Names this `schema.sql` (FNV-1a of its text).
const SCHEMA_HASH: u64 = {
    let bytes = SCHEMA.as_bytes();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
};

fn schema_mark() -> String {
    format!("lock-runtime schema {SCHEMA_HASH:016x}")
}

/// Serialises clients that make the schema at once: the ASCII of "lockrtv1".
const SCHEMA_LOCK: i64 = 0x6c6f_636b_7274_7631;

/// The most rows one batch of a sweep deletes.
const SWEEP_ROWS: i32 = 1000;

/// How many connections a client's pool opens at most (one of them listens for releases).
const POOL_SIZE: u32 = 10;

/// The common acquire, one statement without a function: an exclusive lock that is not fair,
/// taken if free, expired or already this token's, and no reader holds it (the same statement
/// as `lock_runtime_v1_acquire`'s first; `EXCLUDED.expires_ms - $3` is the statement's now).
/// No row: refused, and the function is asked only when the caller wants the refusal's details.
/// A fencing token is taken in `SET`, once the row is locked and the lock granted: one taken in
/// `VALUES` (evaluated before the statement waits for the row) could be smaller than that of a
/// holder who got in meanwhile. `VALUES`' own serves a key without a row (no earlier holder's
/// token is kept there: a fenced lock's row stays an hour after its release). Both come from
/// `lock_runtime_v1_fence`, the one rule that keeps tokens from repeating.
const TAKE: &str = "INSERT INTO lock_runtime_locks AS l (key, token, expires_ms, fence) \
     VALUES ($1, $2, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + $3, \
             CASE WHEN $4 THEN lock_runtime_v1_fence(NULL) END) \
     ON CONFLICT (key) DO UPDATE \
         SET token = EXCLUDED.token, expires_ms = EXCLUDED.expires_ms, \
             fence = CASE WHEN NOT $4 THEN l.fence \
                          WHEN l.token = EXCLUDED.token AND l.fence IS NOT NULL THEN l.fence \
                          ELSE lock_runtime_v1_fence(l.fence) END, \
             marked = false, shares = NULL \
         WHERE (l.token IS NULL OR l.expires_ms <= EXCLUDED.expires_ms - $3 OR l.token = EXCLUDED.token) \
             AND l.shares_until <= EXCLUDED.expires_ms - $3 \
     RETURNING l.fence";
/// The common release, one statement without a function: deletes a lock still held by this
/// token that nothing else needs (no waiter marked it, no fencing token or writers' claim to
/// keep): what `lock_runtime_v1_release` does then. No row: the function decides. (A variant
/// that also freed a fenced lock in the same statement, keeping its row, cost every release
/// about a tenth more of the server's time: fenced releases take the function's second
/// request instead.)
const GIVE_BACK: &str = "DELETE FROM lock_runtime_locks \
     WHERE key = $1 AND token = $2 AND NOT marked AND fence IS NULL AND claims IS NULL \
         AND expires_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";
const ACQUIRE: &str = "SELECT got, got_fence, left_ms, is_behind, has_claimed, kept_stamp \
     FROM lock_runtime_v1_acquire($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";
const SHARE: &str = "SELECT got, got_fence, left_ms FROM lock_runtime_v1_share($1, $2, $3, $4)";
const PERMIT: &str = "SELECT got, got_fence, got_permit, left_ms, ahead, kept_stamp \
     FROM lock_runtime_v1_take_permit($1, $2, $3, $4, $5, $6, $7, $8, $9)";
/// The count of a key its semaphore's permits hold now (no row: not held by permits): asked
/// after a plain first try was refused, so that a lock asked of a semaphore is told so.
const COUNT_HELD: &str = "SELECT permits FROM lock_runtime_locks \
     WHERE key = $1 AND permits IS NOT NULL AND shares_until > lock_runtime_v1_now()";
/// Every lock of a set or none (`lock_runtime_v1_take_set`).
const TAKE_SET: &str =
    "SELECT fences, refused, left_ms, held_permits FROM lock_runtime_v1_take_set($1, $2, $3, $4, $5)";
const RENEW: &str = "SELECT lock_runtime_v1_renew($1, $2, $3)";
const RELEASE: &str = "SELECT answer, admitted, handed_fence, handed_stamp, handed_permit \
     FROM lock_runtime_v1_hand_back($1, $2, $3, $4, $5, $6)";
const LEAVE: &str = "SELECT lock_runtime_v1_leave($1, $2, $3, $4)";
const SWEEP: &str = "SELECT lock_runtime_v1_sweep($1)";
/// A fencing token nobody uses: the probe of the right to take them.
const PROBE_FENCE: &str = "SELECT lock_runtime_v1_fence(NULL)";

mod admin;

/// The schema the store's tables and functions live in unless the builder names another.
pub(crate) const DEFAULT_SCHEMA: &str = "public";

/// A PostgreSQL database, as the builder was told.
#[derive(Clone)]
pub(crate) struct PostgresConfig {
    url: String,
    /// Where the tables and functions live (`.postgres_schema`).
    schema: String,
}

impl PostgresConfig {
    fn new(url: &str) -> Self {
        PostgresConfig {
            url: url.to_owned(),
            schema: DEFAULT_SCHEMA.to_owned(),
        }
    }
}

impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("url", &hide_credentials(&self.url))
            .field("schema", &self.schema)
            .finish()
    }
}

impl StoreConfig for PostgresConfig {
    fn open(&self, settings: Settings) -> Result<Arc<dyn DynStore>, LockError> {
        settings.no_replicas(
            "PostgreSQL: set synchronous_commit and synchronous_standby_names on the server, and \
             every lock waits for its standbys",
        )?;
        settings.no_tls_material(
            "TLS for PostgreSQL goes into its URL (sslmode, sslrootcert, sslcert, sslkey), not the builder",
        )?;
        Ok(Arc::new(PostgresStore::new(&self.url, &self.schema, settings)?))
    }
}

/// A database by URL (`LockClient::connect`).
pub(crate) fn from_url(url: &str) -> Result<Arc<dyn StoreConfig>, LockError> {
    Ok(Arc::new(PostgresConfig::new(url)))
}

/// `schema` if it is a plain lower-case identifier PostgreSQL takes unquoted (so the name the
/// builder was given is the schema's name as PostgreSQL spells it).
fn checked_schema(schema: &str) -> Result<&str, LockError> {
    let mut chars = schema.chars();
    let plain = matches!(chars.next(), Some('a'..='z' | '_'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        && schema.len() <= 63
        && !schema.starts_with("pg_");
    if plain {
        Ok(schema)
    } else {
        Err(LockError::invalid_options(format!(
            ".postgres_schema({schema:?}): a schema name is 1 to 63 of a-z, 0-9 and _, not starting \
             with a digit or pg_"
        )))
    }
}

impl LockClientBuilder {
    /// A PostgreSQL database (`postgres://user:password@host:5432/database`; the `postgres`
    /// feature): each lock is a row of `lock_runtime_locks` (made, with the other tables and
    /// functions the store needs, by the first client that connects, in the connection's
    /// `search_path`), leased on the database's clock, with fencing tokens from one sequence and
    /// waiters woken by `LISTEN`/`NOTIFY`. No connection or transaction is held while a lock is
    /// held; every request is one statement. The prefix starts each row's key, as on Redis.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .postgres("postgres://app:secret@db.internal:5432/orders")
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    pub fn postgres(self, url: &str) -> Self {
        self.place(PostgresConfig::new(url))
    }

    /// The schema the PostgreSQL store's tables, sequences and functions live in (default
    /// `public`; made if missing, which needs `CREATE` on the database), after `.postgres(…)`.
    /// Every client that should exclude another must name the same schema: the store's
    /// connections resolve names there whatever the `search_path` of the URL, the role or the
    /// database says (two services with different `search_path`s share one table).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .postgres("postgres://app:secret@db.internal:5432/orders")
    ///     .postgres_schema("locking")
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    pub fn postgres_schema(self, schema: &str) -> Self {
        let schema = schema.to_owned();
        self.refine(
            ".postgres_schema",
            ".postgres(url)",
            move |config: &mut PostgresConfig| {
                config.schema = schema;
            },
        )
    }
}

/// Locks in one PostgreSQL database.
#[derive(Debug)]
pub(crate) struct PostgresStore {
    /// Its pool and what else every SQL store holds (the place it names: `host:port/database
    /// (schema …)`).
    sql: SqlCore<sqlx::Postgres>,
    /// Each row's key starts with it.
    prefix: String,
    /// Where the tables and functions live.
    schema_name: String,
    notices: Notices,
    listener: listener::Listener,
    /// What this client's releases say when they announce themselves, so its own listener
    /// skips them (its waiters are woken without the database).
    announcement: String,
}

impl PostgresStore {
    /// A store for `url` (`postgres://user:password@host:port/database`); connects on first use.
    pub(crate) fn new(url: &str, schema: &str, settings: Settings) -> Result<Self, LockError> {
        let schema = checked_schema(schema)?;
        let Settings {
            prefix,
            timeouts,
            notices,
            ..
        } = settings;
        let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
        if !(scheme.eq_ignore_ascii_case("postgres") || scheme.eq_ignore_ascii_case("postgresql")) {
            return Err(LockError::invalid_options(format!(
                "{}: a PostgreSQL URL starts with postgres:// or postgresql://",
                crate::redact::hide_credentials(url)
            )));
        }
        let options: PgConnectOptions = url.parse().map_err(|e| {
            LockError::invalid_options(format!(
                "{}: not a PostgreSQL URL ({e})",
                crate::redact::hide_credentials(url)
            ))
        })?;
        let address = format!(
            "{}:{}/{}",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or("")
        );
        // Whatever the URL, the role or the database say: names resolve in the store's schema
        // (catalog first, as PostgreSQL advises for trusted code), and the store's own
        // statements run at READ COMMITTED (under REPEATABLE READ or SERIALIZABLE a contended
        // upsert fails with a serialization error instead of waiting for the row). And no
        // statement of the store's outlives the response timeout on the server either: the
        // client gives up on it then, and a statement given up on must not go on to take a lock
        // later (see `late_attempts`). Startup options come after the URL's and win over the role's
        // and database's settings.
        let statement_ms = crate::options::ceil_millis(timeouts.response).max(1);
        let options = options.application_name("lock-runtime").options([
            ("search_path", format!("pg_catalog,{schema},pg_temp")),
            ("default_transaction_isolation", "read\\ committed".to_owned()),
            ("statement_timeout", statement_ms.to_string()),
        ]);
        Ok(PostgresStore {
            sql: SqlCore::new(options, timeouts, format!("{address} (schema {schema})")),
            prefix,
            schema_name: schema.to_owned(),
            notices,
            listener: listener::Listener::default(),
            announcement: format!("c:{:016x}", rand::random::<u64>()),
        })
    }

    /// How long an attempt may wait for a row another session has locked: an attempt that could
    /// wait longer than its caller's wait has left (the response timeout bounds every other)
    /// tells the server to give up within it.
    fn lock_wait(&self, ask: &Ask) -> Option<std::time::Duration> {
        ask.wait_left.filter(|left| *left < self.sql.timeouts.response)
    }

    /// [`lock_wait`](Self::lock_wait) as the functions' `lock_ms`: 0, no bound of its own; else
    /// at least 1 ms (0 would be none).
    fn lock_ms(&self, ask: &Ask) -> i64 {
        self.lock_wait(ask)
            .map_or(0, |left| millis(crate::options::ceil_millis(left)).max(1))
    }

    /// One attempt at any free permit of a semaphore (`lock_runtime_v1_permit`).
    async fn permit(&self, lock: &Lock, token: &str, ask: &Ask) -> Result<Attempt, LockError> {
        let place_ms = millis(crate::options::ceil_millis(FAIR_PLACE_KEPT));
        let answer: Result<PermitRow, u32> = ask!(self, |conn| counted(
            sqlx::query_as(PERMIT)
                .bind(lock.name())
                .bind(token)
                .bind(millis(ask.ttl_ms))
                .bind(i32::try_from(ask.mode.permits()).unwrap_or(i32::MAX))
                .bind(ask.fencing)
                .bind(ask.waiting)
                .bind(ask.mode.fair())
                .bind(ask.join)
                .bind(place_ms)
                .fetch_one(conn)
        ))?;
        let (got, fence, permit, left, ahead, kept) =
            answer.map_err(|held| crate::store::permits_differ(lock.key(), held, ask.mode.permits()))?;
        Ok(match (got, permit) {
            (true, Some(permit)) => Attempt::permit(
                fence.filter(|_| ask.fencing).map(unsigned),
                u32::try_from(permit).unwrap_or_default(),
            ),
            // A fair waiter's place may be handed a permit (`kept` names it).
            _ => Attempt::no_permit(
                left.map(unsigned),
                ahead.map_or(0, |a| unsigned(a.into())),
                ask.mode.permits(),
            )
            .kept(kept.map(unsigned)),
        })
    }

    async fn release_lock(
        &self,
        lock: &Lock,
        token: &str,
        hold_ms: u64,
        kind: Kind,
    ) -> Result<Released, LockError> {
        if kind == Kind::Plain && hold_ms == 0 {
            let deleted = ask!(self, |conn| sqlx::query(GIVE_BACK)
                .bind(lock.name())
                .bind(token)
                .execute(conn))?;
            if deleted.rows_affected() == 1 {
                // Nobody marked it: only this client's own waiters may want it.
                return Ok(Released::Freed);
            }
        }
        type Answer = (i32, Option<String>, Option<i64>, Option<i64>, Option<i32>);
        let (released, admitted, fence, stamp, permit): Answer = ask!(self, |conn| sqlx::query_as(RELEASE)
            .bind(lock.name())
            .bind(lock.name())
            .bind(token)
            .bind(millis(hold_ms))
            .bind(kind == Kind::Fair)
            .bind(&self.announcement)
            .fetch_one(conn))?;
        Ok(match released {
            0 => Released::NotOurs,
            // Other readers still share the lock: nobody can enter because this one left.
            2 => Released::Quiet,
            // A permit's release handed it to the head of its fair line: this client hands it
            // at once if the waiter is its own (the NOTIFY reaches the others).
            4 => match (admitted, stamp, permit) {
                (Some(waiter), Some(kept), Some(permit)) => Released::HandedOver(
                    waiter,
                    HandedOver {
                        fence: fence.map_or(0, unsigned),
                        kept: unsigned(kept),
                        permit: Some(u32::try_from(permit).unwrap_or_default()),
                    },
                ),
                _ => Released::Quiet,
            },
            // A fair release names the next waiter.
            _ if kind == Kind::Fair => Released::Quiet,
            // This client's own next waiter need not hear it from the database (its listener
            // skips the announcement): the client wakes it.
            _ => Released::Freed,
        })
    }
}

impl Drop for PostgresStore {
    /// The listening connection goes with the client (its task would keep it open).
    fn drop(&mut self) {
        self.listener.stop();
        self.sql.stop();
    }
}

/// Makes the schema unless this version's is there: one transaction, its first statement taking
/// a transaction-level advisory lock, so clients starting together make it one at a time; and
/// asked again under that lock, so it is made once, not once per client that waited (a second
/// making would lock the table against the first one's lock holders until it commits). Its
/// statements may run `within` (the client waits that long for the making), not only the
/// response timeout the connection's other statements are held to: the advisory lock, and the
/// making's own locks, may wait for another client's making, or for sessions of an older build.
async fn make_schema(pool: &PgPool, schema: &str, within: std::time::Duration) -> Result<(), sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let conn: &mut sqlx::PgConnection = &mut conn;
    if schema_ready(conn, schema).await?.0 {
        return Ok(());
    }
    let mut tx = sqlx::Connection::begin(conn).await?;
    let within_ms = crate::options::ceil_millis(within).max(1);
    sqlx::query("SELECT set_config('statement_timeout', $1, true)")
        .bind(within_ms.to_string())
        .execute(&mut *tx)
        .await?;
    let made = make_schema_in(&mut tx, schema).await?;
    tx.commit().await?;
    if made {
        tracing::info!(schema, "made lock-runtime's tables and functions (lock_runtime_locks, lock_runtime_line, lock_runtime_v1_*) in the database");
    }
    Ok(())
}

/// [`make_schema`]'s transaction: whether it made the schema (no: another client had meanwhile).
async fn make_schema_in(tx: &mut sqlx::PgConnection, schema: &str) -> Result<bool, sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(SCHEMA_LOCK)
        .execute(&mut *tx)
        .await?;
    let (ready, exists) = schema_ready(&mut *tx, schema).await?;
    if ready {
        return Ok(false);
    }
    // (`schema` is a checked plain identifier.) Objects are made in the first schema of the
    // search_path, which for the store's statements starts with pg_catalog: here it is the
    // store's own, for this transaction only.
    let create = if exists {
        String::new()
    } else {
        format!("CREATE SCHEMA IF NOT EXISTS {schema};\n")
    };
    let script = format!(
        "{create}SET LOCAL search_path = {schema}, pg_catalog, pg_temp;\n{SCHEMA}\n\
         COMMENT ON FUNCTION lock_runtime_v1_sweep(integer) IS '{}';",
        schema_mark()
    );
    // A text without arguments goes as one simple query, whose statements may be many (as
    // `raw_sql`'s, whose executor bound the async trait's futures do not meet).
    sqlx::Executor::execute(tx, script.as_str()).await?;
    Ok(true)
}

/// [`SCHEMA_READY`]'s answer: this version's schema is there; the schema exists at all.
async fn schema_ready(conn: &mut sqlx::PgConnection, schema: &str) -> Result<(bool, bool), sqlx::Error> {
    sqlx::query_as(SCHEMA_READY)
        .bind(schema_mark())
        .bind(schema)
        .fetch_one(conn)
        .await
}

impl SqlStore for PostgresStore {
    type Db = sqlx::Postgres;
    const POOL_SIZE: u32 = POOL_SIZE;
    const DATABASE: &'static str = "PostgreSQL";

    fn refusal(e: &sqlx::Error) -> Option<&'static str> {
        match e {
            sqlx::Error::Database(db) => match db.code().as_deref() {
                // invalid_authorization_specification, invalid_password
                Some("28000" | "28P01") => {
                    Some("wrong user or password: fix the credentials in the PostgreSQL URL")
                }
                // invalid_catalog_name
                Some("3D000") => Some("the database in the PostgreSQL URL does not exist"),
                // insufficient_privilege
                Some("42501") => Some(
                    "the PostgreSQL role lacks a right locking needs (see the guide, docs/deployments.md, \"PostgreSQL\": \
                     CREATE on the schema for the first client, then the lock tables, sequences and \
                     functions)",
                ),
                _ => None,
            },
            _ => None,
        }
    }

    fn core(&self) -> &SqlCore<sqlx::Postgres> {
        &self.sql
    }

    fn make_schema(&self, pool: &PgPool) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        let timeouts = &self.sql.timeouts;
        make_schema(pool, &self.schema_name, timeouts.connect + timeouts.response)
    }

    async fn sweep_batch(conn: &mut sqlx::PgConnection) -> Result<bool, sqlx::Error> {
        let gone: i64 = sqlx::query_scalar(SWEEP).bind(SWEEP_ROWS).fetch_one(conn).await?;
        Ok(gone >= i64::from(SWEEP_ROWS))
    }

    /// Its session was terminated: a restart, a failover, `pg_terminate_backend`.
    fn ended_by_server(&self, e: &sqlx::Error) -> bool {
        match e {
            // admin_shutdown, crash_shutdown: FATAL, so the statement's transaction did not
            // commit
            sqlx::Error::Database(db) => matches!(db.code().as_deref(), Some("57P01" | "57P02")),
            _ => false,
        }
    }
}

/// What `lock_runtime_v1_take_permit` answers: taken, its fencing token, its permit, the ms
/// until the first holder's lease ends, how many fair waiters are ahead, and the stamp of the
/// place a refused fair waiter kept.
type PermitRow = (
    bool,
    Option<i64>,
    Option<i32>,
    Option<i64>,
    Option<i32>,
    Option<i64>,
);

/// A request refused because the key is held with another count of permits
/// (`lock_runtime_v1_count`: SQLSTATE LR001): that count.
fn count_held(e: &sqlx::Error) -> Option<u32> {
    match e {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("LR001") => db.message().parse().ok(),
        _ => None,
    }
}

/// A request's answer, or the count the key is held with when the database refused it for
/// another count ([`count_held`]).
async fn counted<T>(
    request: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<Result<T, u32>, sqlx::Error> {
    match request.await {
        Ok(answer) => Ok(Ok(answer)),
        Err(e) => count_held(&e).map(Err).ok_or(e),
    }
}

/// The statement gave up waiting for a row lock (its `lock_timeout`): it changed nothing.
fn lock_not_available(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03"))
}

impl Store for PostgresStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::all("PostgreSQL")
    }

    /// `<prefix>{<key>}`, the rows' key.
    fn name(&self, key: &str) -> String {
        super::name(&self.prefix, key)
    }

    /// The schema, a fencing token (the sequence's right, which only a fenced acquire would
    /// meet), and every right locking needs ([`check_rights`](super::sql::check_rights)), a
    /// semaphore's holder rows (their own table) among them.
    async fn connect(&self) -> Result<(), LockError> {
        let _: i64 = ask!(self, |conn| sqlx::query_scalar(PROBE_FENCE).fetch_one(conn))?;
        super::sql::check_rights(self, &self.prefix, true).await
    }

    async fn attempt(&self, asked: Asked<'_>, _: &Flight) -> Result<Attempt, LockError> {
        let Asked { lock, token, ask } = asked;
        self.sweep_now_and_then();
        let ttl = millis(ask.ttl_ms);
        if ask.mode.semaphore() {
            return self.permit(lock, token, ask).await;
        }
        if ask.mode.shared() {
            let answer: Result<(bool, Option<i64>, Option<i64>), u32> = ask!(self, |conn| counted(
                sqlx::query_as(SHARE)
                    .bind(lock.name())
                    .bind(token)
                    .bind(ttl)
                    .bind(ask.waiting)
                    .fetch_one(conn)
            ))?;
            let (got, fence, left) =
                answer.map_err(|held| crate::store::permits_differ(lock.key(), held, 1))?;
            return Ok(if got {
                Attempt::acquired(fence.filter(|_| ask.fencing).map(unsigned))
            } else {
                Attempt::Held {
                    pttl_ms: left.map(unsigned),
                    behind: false,
                    claimed: false,
                    kept: None,
                }
            });
        }
        let lock_wait = self.lock_wait(ask);
        // A waiter's attempt (it has been refused before) goes to the function at once: the
        // function tries the same statement first, and a refusal then costs one request.
        if !ask.mode.fair() && !ask.claimed && !ask.waiting && lock_wait.is_none() {
            let taken: Option<Option<i64>> = ask!(self, |conn| sqlx::query_scalar(TAKE)
                .bind(lock.name())
                .bind(token)
                .bind(ttl)
                .bind(ask.fencing)
                .fetch_optional(conn))?;
            match taken {
                Some(fence) => return Ok(Attempt::acquired(fence.filter(|_| ask.fencing).map(unsigned))),
                // A first try that will not wait needs no more (unless a semaphore holds the
                // key: then it is told so).
                None if !ask.join => {
                    let held: Option<Option<i32>> = ask!(self, |conn| sqlx::query_scalar(COUNT_HELD)
                        .bind(lock.name())
                        .fetch_optional(conn))?;
                    if let Some(held) = held.flatten() {
                        let held = u32::try_from(held).unwrap_or_default();
                        return Err(crate::store::permits_differ(lock.key(), held, 1));
                    }
                    return Ok(Attempt::Held {
                        pttl_ms: None,
                        behind: false,
                        claimed: false,
                        kept: None,
                    });
                }
                None => {}
            }
        }
        type Row = (bool, Option<i64>, Option<i64>, bool, bool, Option<i64>);
        let place_ms = millis(crate::options::ceil_millis(FAIR_PLACE_KEPT));
        let lock_ms = self.lock_ms(ask);
        let answer: Option<Result<Row, u32>> = ask!(self, |conn| async {
            let asked = sqlx::query_as(ACQUIRE)
                .bind(lock.name())
                .bind(lock.name())
                .bind(token)
                .bind(ttl)
                .bind(ask.fencing)
                .bind(ask.waiting)
                .bind(ask.mode.fair())
                .bind(ask.join)
                .bind(ask.claimed)
                .bind(place_ms)
                .bind(lock_ms)
                .fetch_one(conn)
                .await;
            match asked {
                Err(e) if lock_not_available(&e) => Ok(None),
                Err(e) => match count_held(&e) {
                    Some(held) => Ok(Some(Err(held))),
                    None => Err(e),
                },
                Ok(answer) => Ok(Some(Ok(answer))),
            }
        })?;
        let answer = answer
            .transpose()
            .map_err(|held| crate::store::permits_differ(lock.key(), held, 1))?;
        let Some((got, fence, left, behind, claimed, kept)) = answer else {
            // The row stayed locked by another session past the caller's wait: nothing changed.
            return Ok(Attempt::Held {
                pttl_ms: None,
                behind: false,
                claimed: false,
                kept: None,
            });
        };
        Ok(if got {
            Attempt::acquired(fence.filter(|_| ask.fencing).map(unsigned))
        } else {
            Attempt::Held {
                pttl_ms: left.map(unsigned),
                behind,
                claimed,
                kept: kept.map(unsigned),
            }
        })
    }

    /// Every lock of a set for its token, or none, in one statement (`lock_runtime_v1_take_set`).
    /// A key held by a semaphore is refused as a single lock's try is (`InvalidOptions` naming
    /// both counts); a caller that will wait gives up a wait for a locked row within its wait.
    async fn attempt_set(&self, set: SetAsk<'_>, _: &Flight) -> Result<Option<SetAttempt>, LockError> {
        let SetAsk { locks, tokens, ask } = set;
        self.sweep_now_and_then();
        let names: Vec<&str> = locks.iter().map(Lock::name).collect();
        let lock_ms = self.lock_ms(ask);
        type Row = (Option<Vec<i64>>, Option<i32>, Option<i64>, Option<i32>);
        let answer: Option<Row> = ask!(self, |conn| async {
            let asked = sqlx::query_as(TAKE_SET)
                .bind(&names)
                .bind(tokens)
                .bind(millis(ask.ttl_ms))
                .bind(ask.fencing)
                .bind(lock_ms)
                .fetch_one(conn)
                .await;
            match asked {
                Err(e) if lock_not_available(&e) => Ok(None),
                answer => answer.map(Some),
            }
        })?;
        let Some((fences, refused, left, held_permits)) = answer else {
            // A row stayed locked by another session past the caller's wait: nothing changed.
            return Ok(Some(SetAttempt::Refused { at: 0, pttl_ms: None }));
        };
        Ok(Some(match refused {
            Some(at) => {
                let at = usize::try_from(at)
                    .ok()
                    .and_then(|at| at.checked_sub(1))
                    .unwrap_or(0);
                if let (Some(held), Some(lock)) = (held_permits, locks.get(at)) {
                    let held = u32::try_from(held).unwrap_or_default();
                    return Err(crate::store::permits_differ(lock.key(), held, 1));
                }
                SetAttempt::Refused {
                    at,
                    pttl_ms: left.map(unsigned),
                }
            }
            None => SetAttempt::taken(
                fences
                    .unwrap_or_default()
                    .into_iter()
                    .map(|f| ask.fencing.then(|| unsigned(f)))
                    .collect(),
            ),
        }))
    }

    async fn renew(&self, locks: &[Renewing<'_>]) -> Result<Vec<Renewal>, LockError> {
        let keys: Vec<&str> = locks.iter().map(|(lock, _, _)| lock.name()).collect();
        let tokens: Vec<&str> = locks.iter().map(|(_, token, _)| *token).collect();
        let ttls: Vec<i64> = locks.iter().map(|(_, _, ttl)| millis(*ttl)).collect();
        let renewed: Vec<i32> = ask!(self, |conn| sqlx::query_scalar(RENEW)
            .bind(&keys)
            .bind(&tokens)
            .bind(&ttls)
            .fetch_all(conn))?;
        let mut found = vec![Renewal::Gone; locks.len()];
        for position in renewed {
            let at = usize::try_from(position).ok().and_then(|p| p.checked_sub(1));
            if let Some(slot) = at.and_then(|at| found.get_mut(at)) {
                *slot = Renewal::RENEWED;
            }
        }
        Ok(found)
    }

    async fn release(&self, lock: &Lock, token: &str, release: Release<'_>) -> Result<Released, LockError> {
        self.release_lock(lock, token, release.hold_ms, release.kind)
            .await
    }

    fn late_attempts(&self) -> Option<std::time::Duration> {
        // Every statement of the store's ends within the response timeout on the server (the
        // connection's `statement_timeout`; behind a pooler that drops startup options, the
        // role's, as docs/deployments.md asks).
        late_attempts(self.sql.timeouts.response)
    }

    async fn leave(&self, lock: &Lock, token: &str, claimed: bool) -> Result<(), LockError> {
        let withdrawn: bool = ask!(self, |conn| sqlx::query_scalar(LEAVE)
            .bind(lock.name())
            .bind(lock.name())
            .bind(token)
            .bind(&self.announcement)
            .fetch_one(conn))?;
        if claimed && withdrawn {
            // Readers held back by the claim try again.
            self.notices.released(lock.name());
        }
        Ok(())
    }

    async fn listen(&self, lock: &Lock) {
        let listening = self
            .listener
            .ensure(|| self.pool(), &self.notices, &self.announcement);
        if tokio::time::timeout(self.sql.timeouts.response, listening)
            .await
            .is_ok()
        {
            // After the listening connection broke, this also has the lock checked once more
            // (see `Notices::confirmed`).
            self.notices.confirmed(lock.name());
        }
    }
}
