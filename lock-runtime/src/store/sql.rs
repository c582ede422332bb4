//! What the SQL stores (PostgreSQL, MySQL) share: one request on a connection of the pool,
//! within the response timeout, on a connection closed if the request is abandoned; errors in
//! one line; milliseconds as the databases' signed integers.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::pool::PoolOptions;
use sqlx::{ConnectOptions, Connection, Pool};
use tokio::sync::OnceCell;

use crate::background::Background;
use crate::error::TimedOut;
use crate::store::{Ask, Asked, Attempt, Flight, Kind, Lock, Mode, Release, Store, Timeouts};
use crate::LockError;

/// Every right locking needs on a SQL store, checked when a client connects (so that a role
/// without one is refused there, the database naming what it lacks, not at its first fair,
/// shared or counted acquire): on probe locks of this call's own (`<prefix>rights-check-<id>`,
/// no `{…}`: no user's lock or line is touched, and no other client's probe is in the way, so
/// every step runs the statements it is meant to), a share taken and given back; a lock taken, a
/// fair waiter's place behind it taken and left, the lock given back; with `own_permits` (a
/// store that keeps a semaphore's holders apart from its locks' rows), a permit of a semaphore
/// of two taken and given back. Each through the store's own requests, as a caller's are sent.
pub(crate) async fn check_rights<S: Store>(
    store: &S,
    prefix: &str,
    own_permits: bool,
) -> Result<(), LockError> {
    let id = format!("{:016x}", rand::random::<u64>());
    let token = |role: &str| format!("rights-check {role} {id}");
    let (holder, waiter, reader) = (token("holder"), token("waiter"), token("reader"));
    let probe = Lock::new("rights-check", format!("{prefix}rights-check-{id}"));
    let once = Ask::once(1000, false);
    let ask = |mode: Mode| Ask { mode, ..once };
    let release = |kind: Kind| Release {
        hold_ms: 0,
        kind,
        after: None,
    };
    let flight = Flight::default();
    store
        .attempt(Asked::new(&probe, &reader, &ask(Mode::Shared)), &flight)
        .await?;
    store.release(&probe, &reader, release(Kind::Shared)).await?;
    store.attempt(Asked::new(&probe, &holder, &once), &flight).await?;
    let queued = Ask {
        join: true,
        ..ask(Mode::Fair)
    };
    let waited = async {
        let answer = store
            .attempt(Asked::new(&probe, &waiter, &queued), &flight)
            .await?;
        store.leave(&probe, &waiter, false).await?;
        if let Attempt::Acquired { .. } = answer {
            // The holder's lease ran out first (a database slower than the probe's ttl).
            store.release(&probe, &waiter, release(Kind::Fair)).await?;
        }
        Ok::<(), LockError>(())
    }
    .await;
    store.release(&probe, &holder, release(Kind::Plain)).await?;
    waited?;
    if !own_permits {
        return Ok(());
    }
    let permits = Lock::new("rights-check", format!("{prefix}rights-check-{id}-permits"));
    let two = ask(Mode::Permits {
        count: 2,
        fair: false,
    });
    store
        .attempt(Asked::new(&permits, &holder, &two), &flight)
        .await?;
    store.release(&permits, &holder, release(Kind::Permit)).await?;
    Ok(())
}

/// The options a pool of `DB` connects with.
pub(crate) type Options<DB> = <<DB as sqlx::Database>::Connection as Connection>::Options;

/// What a store runs on each connection it opens, before the connection's first request: a
/// session setting no connect option carries (MySQL's lock wait).
pub(crate) type Setup<DB> = Arc<
    dyn for<'c> Fn(&'c mut <DB as sqlx::Database>::Connection) -> BoxFuture<'c, Result<(), sqlx::Error>>
        + Send
        + Sync,
>;

/// What a SQL store allows, beyond the longest it lets an attempt run on the server, for an
/// attempt the client gave up on to have ended there: its way to the server after the client
/// sent it (a busy server, the network), and its end.
const ATTEMPT_ENDED_SLACK: Duration = Duration::from_secs(1);

/// A SQL store's [`late_attempts`](Store::late_attempts), for a store that lets an attempt
/// run at most `statements` on the server: the attempt went on a connection of its own, closed
/// since, which the server may still be running (on its way there, or waiting for a row behind
/// the release), and a pool cannot send the release after it there. (An attempt that reaches
/// the server later than [`ATTEMPT_ENDED_SLACK`] after it was given up is not covered.)
pub(crate) fn late_attempts(statements: Duration) -> Option<Duration> {
    Some(statements + ATTEMPT_ENDED_SLACK)
}

/// A store's pool, made on the runtime that first needs it (so building a client needs no
/// runtime), and again if that runtime has gone (its connections went with it).
#[derive(Debug)]
pub(crate) struct LazyPool<DB: sqlx::Database> {
    pool: Mutex<Option<Pool<DB>>>,
    /// Runs while the pool's runtime does.
    runtime: Background,
}

impl<DB: sqlx::Database> LazyPool<DB> {
    pub(crate) fn new() -> Self {
        LazyPool {
            pool: Mutex::new(None),
            runtime: Background::default(),
        }
    }

    fn slot(&self) -> MutexGuard<'_, Option<Pool<DB>>> {
        // Every update is one step, so a poisoned slot is still consistent.
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pool of this runtime: at most `size` connections, none pinged before a request (a
    /// round trip per request: a connection that broke fails its request, which the caller
    /// retries, and the pool drops it), and a connection waited for three quarters of `connect`
    /// (the quarter left is [`why_unconnected`]'s, to say why none could be made); `setup` run
    /// on each connection it opens.
    pub(crate) fn get(
        &self,
        options: &Options<DB>,
        size: u32,
        connect: Duration,
        setup: Option<&Setup<DB>>,
    ) -> Pool<DB> {
        let mut slot = self.slot();
        if let Some(pool) = slot.as_ref().filter(|_| self.runtime.is_running()) {
            return pool.clone();
        }
        let mut pool = PoolOptions::<DB>::new()
            .max_connections(size)
            .test_before_acquire(false)
            .acquire_timeout(connect * 3 / 4);
        if let Some(setup) = setup.cloned() {
            pool = pool.after_connect(move |conn, _| setup(conn));
        }
        let pool = pool.connect_lazy_with(options.clone());
        *slot = Some(pool.clone());
        self.runtime.replace(std::future::pending);
        pool
    }

    /// The client goes: so does the pool's runtime task.
    pub(crate) fn stop(&self) {
        self.runtime.stop();
    }
}

/// Why the pool could make no connection within three quarters of `connect` (it says only that
/// it timed out): what one connection of its own says within the quarter left, in one line, or
/// `None` when that one connected or did not answer either.
pub(crate) async fn why_unconnected<O>(options: &O, connect: Duration) -> Option<(sqlx::Error, String)>
where
    O: ConnectOptions,
    O::Connection: Sized,
{
    let tried = tokio::time::timeout(connect / 4, options.connect()).await;
    match tried {
        Ok(Err(why)) => {
            let what = format!(
                "cannot connect ({}; tried for {:?})",
                one_line(&why),
                connect * 3 / 4
            );
            Some((why, what))
        }
        _ => None,
    }
}

/// Every this many acquires (and at the first), a client sweeps rows nothing needs any more, in
/// the background.
const SWEEP_EVERY: usize = 1024;

/// The most batches one sweep runs (each of at most a store's own number of rows).
const SWEEP_BATCHES: usize = 20;

/// When a client sweeps: at its first acquire and every [`SWEEP_EVERY`] after.
#[derive(Debug, Default)]
pub(crate) struct Sweeps(AtomicUsize);

impl Sweeps {
    /// One acquire more: whether it sweeps.
    pub(crate) fn due(&self) -> bool {
        self.0.fetch_add(1, Ordering::Relaxed).is_multiple_of(SWEEP_EVERY)
    }
}

/// What every SQL store holds the same way: how it connects, its pool, whether its schema is
/// there, and when it sweeps.
pub(crate) struct SqlCore<DB: sqlx::Database> {
    pub(crate) options: Options<DB>,
    pub(crate) timeouts: Timeouts,
    /// The pool, made on the runtime that first needs it.
    pool: LazyPool<DB>,
    /// The schema is there (checked once per client).
    schema: OnceCell<()>,
    pub(crate) sweeps: Sweeps,
    /// Where the database is, for errors (`host:port/database`, and what else names it).
    pub(crate) place: String,
    /// Run on each connection the pool opens.
    setup: Option<Setup<DB>>,
}

impl<DB: sqlx::Database> SqlCore<DB> {
    pub(crate) fn new(options: Options<DB>, timeouts: Timeouts, place: String) -> Self {
        SqlCore {
            options,
            timeouts,
            pool: LazyPool::new(),
            schema: OnceCell::new(),
            sweeps: Sweeps::default(),
            place,
            setup: None,
        }
    }

    /// The same, with `setup` run on each connection the pool opens.
    pub(crate) fn with_setup(self, setup: Setup<DB>) -> Self {
        SqlCore {
            setup: Some(setup),
            ..self
        }
    }

    /// The client goes: so does its pool's runtime task.
    pub(crate) fn stop(&self) {
        self.pool.stop();
    }
}

impl<DB: sqlx::Database> std::fmt::Debug for SqlCore<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlCore")
            .field("place", &self.place)
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

/// What went wrong with a SQL database, in one line naming it: the source of
/// [`LockError::Unavailable`] and [`LockError::Refused`] on PostgreSQL and MySQL.
#[derive(Debug, thiserror::Error)]
#[error("{database} at {place}: {what}")]
pub(crate) struct SqlError {
    database: &'static str,
    place: String,
    what: String,
}

/// A store over a pool of sqlx connections: what differs between the SQL databases (the
/// dialect: its error classes, its schema, where it is), under one flow for the rest (a pool
/// ready with its schema, errors naming the database, and each request through [`ask!`]).
pub(crate) trait SqlStore: Sync {
    /// The database's connections.
    type Db: sqlx::Database;

    /// The most connections its pool opens: a request whose connection the server ended is sent
    /// again at most this many times (each on another connection, the pool dropping the dead).
    const POOL_SIZE: u32;

    /// The database, as messages name it.
    const DATABASE: &'static str;

    /// The server ended the connection before the request ran (a restart, a terminated
    /// session), so it can be sent again on another.
    fn ended_by_server(&self, e: &sqlx::Error) -> bool;

    /// Why the database refuses this client, when only a configuration change can fix it.
    fn refusal(e: &sqlx::Error) -> Option<&'static str>;

    /// What the store holds the same way as every SQL store.
    fn core(&self) -> &SqlCore<Self::Db>;

    /// The pool of this runtime (made lazily, so building a client needs no runtime).
    fn pool(&self) -> Pool<Self::Db> {
        let core = self.core();
        core.pool.get(
            &core.options,
            Self::POOL_SIZE,
            core.timeouts.connect,
            core.setup.as_ref(),
        )
    }

    /// Makes the schema (tables, and what else the store runs) if it is not there.
    fn make_schema(&self, pool: &Pool<Self::Db>) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Deletes one batch of rows nothing needs any more (a lock's row long free, a place or a
    /// share that lapsed): whether the batch came back full, so that another follows.
    fn sweep_batch(
        conn: &mut <Self::Db as sqlx::Database>::Connection,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + '_;

    /// At a client's first acquire and every [`SWEEP_EVERY`] after ([`Sweeps`]), deletes rows
    /// nothing needs any more, in the background: batches while they come back full (at most
    /// [`SWEEP_BATCHES`]), so a load of keys locked once does not outgrow the sweep; each batch
    /// within the response timeout, on a connection closed if abandoned.
    fn sweep_now_and_then(&self)
    where
        Self: 'static,
    {
        if !self.core().sweeps.due() {
            return;
        }
        let pool = self.pool();
        let response = self.core().timeouts.response;
        tokio::spawn(async move {
            for _ in 0..SWEEP_BATCHES {
                let batch = async {
                    let mut checkout = Checkout::new(pool.acquire().await?, response);
                    let Some(conn) = checkout.get() else {
                        return Err(sqlx::Error::PoolClosed);
                    };
                    let full = Self::sweep_batch(conn).await;
                    checkout.answered();
                    full
                };
                match tokio::time::timeout(response, batch).await {
                    Ok(Ok(true)) => {}
                    Ok(Ok(false)) => return,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, database = Self::DATABASE, "sweeping expired lock rows failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(database = Self::DATABASE, "sweeping expired lock rows timed out");
                        return;
                    }
                }
            }
        });
    }

    /// The pool, with the schema there (checked once per client, within the timeouts).
    fn ready(&self) -> impl Future<Output = Result<Pool<Self::Db>, LockError>> + Send {
        async move {
            let pool = self.pool();
            let schema = &self.core().schema;
            if schema.get().is_none() {
                let made = schema.get_or_try_init(|| async {
                    match self.make_schema(&pool).await {
                        Ok(()) => Ok(()),
                        Err(e) => Err(self.failed(e).await),
                    }
                });
                let timeouts = &self.core().timeouts;
                bounded(timeouts.connect + timeouts.response, made).await?;
            }
            Ok(pool)
        }
    }

    /// `e`, naming the database. The pool retries a refused connection until its acquire
    /// timeout and then says only that it timed out: one connection of its own then says why.
    fn failed(&self, e: sqlx::Error) -> impl Future<Output = LockError> + Send {
        async move {
            if let sqlx::Error::PoolTimedOut = e {
                let core = self.core();
                if let Some((why, what)) = why_unconnected(&core.options, core.timeouts.connect).await {
                    return self.error_of(&why, what);
                }
            }
            let what = one_line(&e);
            self.error_of(&e, what)
        }
    }

    /// `e` (said as `what`): refused when only a configuration change can fix it, else
    /// unavailable.
    fn error_of(&self, e: &sqlx::Error, what: String) -> LockError {
        let source = self.error(what);
        match Self::refusal(e) {
            Some(reason) => LockError::Refused {
                reason,
                source: source.into(),
            },
            None => LockError::unavailable(source),
        }
    }

    /// A request that got no answer within `after`: [`LockError::Unavailable`] naming the
    /// database.
    fn timed_out(&self, after: Duration) -> LockError {
        LockError::unavailable(self.error(TimedOut { after }.to_string()))
    }

    /// `what` went wrong, naming the database.
    fn error(&self, what: String) -> SqlError {
        SqlError {
            database: Self::DATABASE,
            place: self.core().place.clone(),
            what,
        }
    }
}

/// Runs one request (an expression over `conn`, a connection of the pool) within the
/// response timeout. `$self` is a [`SqlStore`] (its pool ready, its errors naming it). The pool does not ping a
/// connection before handing it out (a round trip per request): a request that finds its
/// connection was ended by the server (its statement never ran) is sent again on another, the
/// pool dropping the dead one; a request abandoned unanswered closes its connection (see
/// [`Checkout`]).
macro_rules! ask {
    ($self:ident, |$conn:ident| $request:expr) => {{
        let pool = $crate::store::sql::SqlStore::ready($self).await?;
        let answer = async {
            let mut ended = 0;
            loop {
                let mut checkout = $crate::store::sql::Checkout::new(
                    pool.acquire().await?,
                    $crate::store::sql::SqlStore::core($self).timeouts.response,
                );
                let answer = match checkout.get() {
                    Some($conn) => $request.await,
                    None => Err(sqlx::Error::PoolClosed),
                };
                checkout.answered();
                match answer {
                    Err(e)
                        if $crate::store::sql::SqlStore::ended_by_server($self, &e)
                            && ended <= $crate::store::sql::pool_size($self) =>
                    {
                        ended += 1;
                    }
                    answer => return answer,
                }
            }
        };
        match tokio::time::timeout(
            $crate::store::sql::SqlStore::core($self).timeouts.response,
            answer,
        )
        .await
        {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err($crate::store::sql::SqlStore::failed($self, e).await),
            Err(_) => Err($crate::store::sql::SqlStore::timed_out(
                $self,
                $crate::store::sql::SqlStore::core($self).timeouts.response,
            )),
        }
    }};
}
pub(crate) use ask;

/// [`SqlStore::POOL_SIZE`] of a store value (for [`ask!`]).
pub(crate) fn pool_size<S: SqlStore>(_: &S) -> u32 {
    S::POOL_SIZE
}

/// A connection of the pool for one request. sqlx hands a connection back to its pool only
/// after a ping on it has been answered, with no bound: on a connection gone silent (a
/// partition, a firewall dropping the flow) that ping, or the abandoned request's answer it
/// waits behind, never comes, and the pool's slot is lost with it, until every slot is. So:
/// answered, the connection goes back within `within` (the response timeout), else it is
/// closed and its slot freed; abandoned unanswered (the response timeout, the caller's
/// cancellation), it is closed at once. Either way the pool opens another when it needs one.
pub(crate) struct Checkout<DB: sqlx::Database> {
    conn: Option<sqlx::pool::PoolConnection<DB>>,
    answered: bool,
    within: Duration,
}

impl<DB: sqlx::Database> Checkout<DB> {
    pub(crate) fn new(conn: sqlx::pool::PoolConnection<DB>, within: Duration) -> Self {
        Checkout {
            conn: Some(conn),
            answered: false,
            within,
        }
    }

    pub(crate) fn get(&mut self) -> Option<&mut DB::Connection> {
        self.conn.as_deref_mut()
    }

    /// The request has its answer: the connection may go back to the pool.
    pub(crate) fn answered(&mut self) {
        self.answered = true;
    }
}

impl<DB: sqlx::Database> Drop for Checkout<DB> {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        match (self.answered, tokio::runtime::Handle::try_current()) {
            (true, Ok(runtime)) => {
                // sqlx's own way back, bounded: dropped unfinished, it closes the connection and
                // frees its slot. (`return_to_pool` is what sqlx's drop runs, made public for
                // this; sqlx 0.8.)
                let back = conn.return_to_pool();
                let within = self.within;
                runtime.spawn(async move {
                    if tokio::time::timeout(within, back).await.is_err() {
                        tracing::debug!(
                            "a database connection did not answer its way back to the pool; closed"
                        );
                    }
                });
            }
            // Outside a runtime sqlx's drop does what it can.
            (true, Err(_)) => drop(conn),
            // Out of the pool (which opens another), its socket closed as it drops.
            (false, _) => drop(conn.detach()),
        }
    }
}

/// `request`, given up as [`LockError::Unavailable`] after `after`.
pub(crate) async fn bounded<T>(
    after: Duration,
    request: impl std::future::Future<Output = Result<T, LockError>>,
) -> Result<T, LockError> {
    tokio::time::timeout(after, request)
        .await
        .map_err(|_| LockError::unavailable(TimedOut { after }))?
}

/// An error and its sources, in one line.
pub(crate) fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut at = e.source();
    while let Some(source) = at {
        let next = source.to_string();
        if !line.contains(&next) {
            line.push_str(": ");
            line.push_str(&next);
        }
        at = source.source();
    }
    line
}

/// Milliseconds as the databases' signed 64-bit integers (options are validated far below
/// their range).
pub(crate) fn millis(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// A database's signed integer that is never negative here, as unsigned.
pub(crate) fn unsigned(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}
