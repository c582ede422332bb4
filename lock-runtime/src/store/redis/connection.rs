//! The request connection to where the locks live (one server, a Sentinel-managed primary, or a
//! Redis Cluster): opened on first use, shared by every request of the client (multiplexed),
//! retried once when it broke (or reached a replica), and replaced when it went silent.
//!
//! redis-rs's `ConnectionManager` reconnects in the background after a broken connection, but it
//! hands the failure of the request that found the break to its caller (the "first request after
//! a restart fails" symptom), and it never replaces a connection that stopped answering without
//! a reset (a host gone in a failover, a firewall that forgot the flow): every request then times
//! out until the kernel gives up, which takes about 15 minutes. So the lifecycle is ours, over a
//! plain `MultiplexedConnection`.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, RedisError, RedisFuture, RedisResult, Value};
use tokio::time::Instant;

use super::servers::Servers;
use crate::error::TimedOut;
use crate::store::{Flight, Timeouts};
use crate::LockError;

/// This many requests in a row without an answer, and the connection counts as silent: the next
/// request opens a new one.
pub(crate) const SILENT_AFTER: u32 = 2;

/// An open request connection: to one server (or the primary the sentinels named), or to a
/// Cluster. The same commands work on each; only scripts followed by `WAIT` need to know which
/// it is (see [`Conn::then_wait`]).
#[derive(Clone)]
// Cloned for every request: boxing the larger variant would allocate each time.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Conn {
    Server(MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Server(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Server(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Sends `cmd` and then `WAIT replicas timeout` on the same node (the one owning `key`'s
    /// slot in a cluster), in one round trip: `cmd`'s answer, and how many replicas
    /// acknowledged it.
    pub(crate) async fn then_wait<T: FromRedisValue>(
        &mut self,
        cmd: Cmd,
        key: &[u8],
        replicas: usize,
        timeout: Duration,
    ) -> RedisResult<(T, usize)> {
        let mut pipe = redis::pipe();
        pipe.add_command(cmd)
            .cmd("WAIT")
            .arg(replicas)
            .arg(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        let answers: Vec<Value> = match self {
            Conn::Server(c) => {
                let _ = key;
                pipe.query_async(c).await?
            }
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => {
                use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
                // WAIT has no key, so a cluster would send it to every primary: pin both to the
                // primary of the key's slot.
                let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
                c.route_pipeline(pipe, 0, 2, route).await?
            }
        };
        let mut answers = answers.into_iter();
        let (Some(answer), Some(acked)) = (answers.next(), answers.next()) else {
            return Err(RedisError::from((
                redis::ErrorKind::Parse,
                "WAIT pipeline answered fewer than two replies",
            )));
        };
        let answer = T::from_redis_value(answer.extract_error()?)?;
        let acked = i64::from_redis_value(acked.extract_error()?)?;
        Ok((answer, usize::try_from(acked).unwrap_or(0)))
    }
}

#[derive(Debug)]
pub(crate) struct Connection {
    servers: Servers,
    timeouts: Timeouts,
    /// Read by every request, written only when a connection opens or is dropped (also by the
    /// task that follows the sentinels' failover announcements).
    live: std::sync::Arc<RwLock<Option<Live>>>,
    /// With Sentinel: the task that drops the connection when the sentinels announce a new
    /// primary, started with the first connection.
    follower: crate::background::Background,
    /// Told when a sentinel announced a new primary (the subscriber connection follows too).
    switched: std::sync::Arc<tokio::sync::Notify>,
    /// The open under way, if any, with its number. It runs as a task of its own (bounded by
    /// the connect timeout), so one open serves every request that finds no connection, each
    /// waiting for it only as long as its own deadline allows; it completes even if all of
    /// them gave up, and a later request finds its connection.
    opening: std::sync::Arc<Mutex<Option<(u64, Opening)>>>,
    /// Requests that timed out in a row on the current connection.
    unanswered: std::sync::Arc<AtomicU32>,
    /// Connections replaced lately (a silent one, most of all), with when: the release of an
    /// acquire whose answer never came follows it on the connection it went on (see
    /// [`Flight`]), which may have been replaced meanwhile. Holding one keeps it open.
    recent: Mutex<VecDeque<(Instant, Live)>>,
}

/// How many replaced connections are kept for releases that must follow their acquires.
const RECENT: usize = 4;

/// How long a replaced connection is kept for them: far longer than a release takes to follow.
const RECENT_FOR: Duration = Duration::from_secs(60);

/// The shared outcome of one open.
type Opening =
    futures_util::future::Shared<futures_util::future::BoxFuture<'static, Result<Live, OpenError>>>;

#[derive(Clone)]
struct Live {
    generation: u64,
    conn: Conn,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("generation", &self.generation)
            .finish()
    }
}

#[derive(Debug, Clone)]
enum OpenError {
    /// Redis's error, and where it tried.
    Redis(RedisError, String),
    TimedOut(Duration, String),
    /// The task opening it was stopped (its runtime shut down) before it finished.
    Stopped,
}

impl From<OpenError> for LockError {
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::Redis(e, address) => crate::store::redis::errors::at(e, &address),
            OpenError::TimedOut(after, address) => crate::store::redis::errors::timed_out(after, &address),
            OpenError::Stopped => LockError::unavailable("the task opening the Redis connection was stopped"),
        }
    }
}

impl Connection {
    /// Connects nothing yet: the first request opens the connection.
    pub(crate) fn new(servers: Servers, timeouts: Timeouts) -> Self {
        Connection {
            servers,
            timeouts,
            live: std::sync::Arc::new(RwLock::new(None)),
            follower: crate::background::Background::default(),
            switched: std::sync::Arc::default(),
            opening: std::sync::Arc::default(),
            unanswered: std::sync::Arc::default(),
            recent: Mutex::default(),
        }
    }

    /// Opens the connection now unless it is open: for `build()`, which reports a server that
    /// is down or refuses us at start.
    pub(crate) async fn ensure_open(&self) -> Result<(), LockError> {
        self.current(None).await.map(drop)
    }

    /// Sends one request, bounded by the response timeout (opening a connection first included:
    /// a request never waits the longer connect timeout). A request that fails because the
    /// connection broke, or because it reached a replica (`READONLY`: the primary failed over
    /// and this connection still points at the old one), is sent once more on a fresh
    /// connection: every request of the lock protocol is idempotent for its token, so a retry
    /// never takes a second lock.
    pub(crate) async fn request<T, F, Fut>(&self, send: F) -> Result<T, LockError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        self.request_within(self.timeouts.response, send).await
    }

    /// [`request`](Self::request) with its own bound, for a request that waits on the server
    /// (`WAIT`) on top of the usual answer time.
    pub(crate) async fn request_within<T, F, Fut>(&self, within: Duration, send: F) -> Result<T, LockError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        self.request_pinned(None, within, send).await
    }

    /// [`request_within`](Self::request_within), recording in `flight` the connection each try
    /// is sent on.
    pub(crate) async fn request_pinned<T, F, Fut>(
        &self,
        flight: Option<&Flight>,
        within: Duration,
        send: F,
    ) -> Result<T, LockError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let deadline = Instant::now() + within;
        let mut retried = false;
        loop {
            // An open connection is found without the open's machinery (every request's path).
            let live = match self.open_now() {
                Some(live) => live,
                None => self.current(Some((deadline, within))).await?,
            };
            if let Some(flight) = flight {
                flight.set(live.generation);
            }
            match tokio::time::timeout_at(deadline, send(live.conn)).await {
                Ok(Ok(answer)) => {
                    self.answered();
                    return Ok(answer);
                }
                Ok(Err(e)) if broke(&e) || reached_replica(&e) => {
                    self.discard(live.generation);
                    if retried {
                        return Err(e.into());
                    }
                    tracing::debug!(error = %e, "Redis connection broke or reached a replica; retrying on a new one");
                    retried = true;
                }
                Ok(Err(e)) => {
                    // An error reply is still an answer: the connection is alive.
                    self.answered();
                    return Err(e.into());
                }
                Err(_) => {
                    // Not a Cluster's: redis-rs keeps one connection per node inside it and
                    // replaces a node's by itself; one slow shard must not drop every other
                    // shard's connection.
                    if !self.servers.is_cluster()
                        && self.unanswered.fetch_add(1, Ordering::Relaxed) + 1 >= SILENT_AFTER
                    {
                        tracing::warn!(
                            requests = SILENT_AFTER,
                            "Redis connection silent; the next request opens a new one"
                        );
                        self.discard(live.generation);
                    }
                    return Err(LockError::unavailable(TimedOut { after: within }));
                }
            }
        }
    }

    /// Sends on the connection `flight` recorded (after what was sent there), even if it has
    /// been replaced since; without a recorded connection, one no longer kept, or one that broke
    /// (then Redis has run what it received on it, or never will), as
    /// [`request_within`](Self::request_within) does.
    pub(crate) async fn request_after<T, F, Fut>(
        &self,
        flight: Option<&Flight>,
        within: Duration,
        send: F,
    ) -> Result<T, LockError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        if let Some(live) = flight.and_then(Flight::get).and_then(|g| self.find(g)) {
            match tokio::time::timeout(within, send(live.conn)).await {
                Ok(Err(e)) if broke(&e) => {
                    tracing::debug!(error = %e, "the acquire's connection broke; releasing on the current one");
                }
                Ok(answer) => return answer.map_err(LockError::from),
                // Still in order behind the acquire on that connection, if Redis ever reads it.
                Err(_) => return Err(LockError::unavailable(TimedOut { after: within })),
            }
        }
        self.request_within(within, send).await
    }

    /// The connection, if one is open.
    fn open_now(&self) -> Option<Live> {
        read(&self.live).clone()
    }

    /// Connection `generation`: the current one, or one replaced lately.
    fn find(&self, generation: u64) -> Option<Live> {
        if let Some(live) = self.open_now().filter(|l| l.generation == generation) {
            return Some(live);
        }
        let mut recent = lock(&self.recent);
        recent.retain(|(at, _)| at.elapsed() < RECENT_FOR);
        recent
            .iter()
            .find(|(_, l)| l.generation == generation)
            .map(|(_, l)| l.clone())
    }

    /// A request was answered on the current connection: it is not silent. Written only when
    /// it changes (every request's path, from every thread: a store each time would contend).
    fn answered(&self) {
        if self.unanswered.load(Ordering::Relaxed) != 0 {
            self.unanswered.store(0, Ordering::Relaxed);
        }
    }

    /// The open connection, or the outcome of opening one, waited for until the request's
    /// deadline if it has one (`Unavailable` after `within` then; the open goes on).
    async fn current(&self, deadline: Option<(Instant, Duration)>) -> Result<Live, LockError> {
        let mut restarted = false;
        loop {
            if let Some(live) = self.open_now() {
                return Ok(live);
            }
            // None: opened by the attempt that just left the slot.
            let Some(opening) = self.opening() else { continue };
            let outcome = match deadline {
                None => opening.await,
                Some((deadline, within)) => tokio::time::timeout_at(deadline, opening)
                    .await
                    .map_err(|_| LockError::unavailable(TimedOut { after: within }))?,
            };
            match outcome {
                Ok(live) => {
                    self.follow_failovers();
                    return Ok(live);
                }
                // Opened on a runtime that has shut down since: once more, on this one.
                Err(OpenError::Stopped) if !restarted => restarted = true,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The open under way, or a new one; `None` if a connection is open now.
    fn opening(&self) -> Option<Opening> {
        use futures_util::FutureExt;
        static ATTEMPT: AtomicU64 = AtomicU64::new(0);
        let mut slot = lock(&self.opening);
        if let Some((_, opening)) = slot.as_ref() {
            return Some(opening.clone());
        }
        if read(&self.live).is_some() {
            return None;
        }
        let attempt = ATTEMPT.fetch_add(1, Ordering::Relaxed);
        let (servers, connect) = (self.servers.clone(), self.timeouts.connect);
        let (live, unanswered) = (self.live.clone(), self.unanswered.clone());
        let task = tokio::spawn(async move {
            let outcome = open(&servers, connect).await;
            if let Ok(opened) = &outcome {
                unanswered.store(0, Ordering::Relaxed);
                *write(&live) = Some(opened.clone());
            }
            outcome
        });
        let slot_of_task = std::sync::Arc::clone(&self.opening);
        let opening = async move {
            let outcome = task.await.unwrap_or(Err(OpenError::Stopped));
            // Whoever sees the outcome first frees the slot (the connection, if any, is in
            // `live` by now), so that the request after a failure tries again.
            let mut slot = lock(&slot_of_task);
            if slot.as_ref().is_some_and(|(a, _)| *a == attempt) {
                *slot = None;
            }
            outcome
        }
        .boxed()
        .shared();
        *slot = Some((attempt, opening.clone()));
        Some(opening)
    }

    /// Notified each time a sentinel announces that the primary moved.
    pub(crate) fn switched(&self) -> std::sync::Arc<tokio::sync::Notify> {
        std::sync::Arc::clone(&self.switched)
    }

    /// With Sentinel, starts (once per runtime) the task that drops the connection as soon as a sentinel
    /// announces that the primary moved (`+switch-master`), rather than at the next request that
    /// fails on the old one.
    fn follow_failovers(&self) {
        #[cfg(feature = "sentinel")]
        if let Servers::Sentinel(sentinels) = &self.servers {
            if self.follower.is_running() {
                return;
            }
            let (sentinels, live, timeouts) = (sentinels.clone(), self.live.clone(), self.timeouts);
            let switched = std::sync::Arc::clone(&self.switched);
            self.follower.ensure(move || async move {
                loop {
                    match sentinels.switched(timeouts.connect, timeouts.response).await {
                        Ok(()) => {
                            tracing::info!("Sentinel announced a new primary; reconnecting");
                            *write(&live) = None;
                            switched.notify_waiters();
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "cannot hear the sentinels; failovers are noticed on the next request");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
            });
        }
    }

    /// Forgets connection `generation` (if it is still the current one): the next request
    /// opens a new one.
    fn discard(&self, generation: u64) {
        let mut live = write(&self.live);
        if live.as_ref().is_some_and(|l| l.generation == generation) {
            if let Some(old) = live.take() {
                drop(live);
                let mut recent = lock(&self.recent);
                if recent.len() == RECENT {
                    recent.pop_front();
                }
                recent.push_back((Instant::now(), old));
            }
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.follower.stop();
    }
}

/// Opens a connection to `servers`, within `after`.
async fn open(servers: &Servers, after: Duration) -> Result<Live, OpenError> {
    // From 1: a flight's 0 is "no connection recorded".
    static GENERATION: AtomicU64 = AtomicU64::new(1);
    let conn = match tokio::time::timeout(after, open_servers(servers, after)).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(OpenError::Redis(e, servers.describe())),
        Err(_) => return Err(OpenError::TimedOut(after, servers.describe())),
    };
    Ok(Live {
        generation: GENERATION.fetch_add(1, Ordering::Relaxed),
        conn,
    })
}

/// Opens a request connection to `servers`, within `after` per connect.
async fn open_servers(servers: &Servers, after: Duration) -> RedisResult<Conn> {
    // Responses are bounded by `request`, which also counts the silent ones.
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(after))
        .set_response_timeout(None);
    match servers {
        Servers::One(client) => Ok(Conn::Server(
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await?,
        )),
        #[cfg(feature = "sentinel")]
        Servers::Sentinel(sentinels) => {
            let client = sentinels.primary().await?;
            Ok(Conn::Server(
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?,
            ))
        }
        #[cfg(feature = "cluster")]
        Servers::Cluster(cluster) => Ok(Conn::Cluster(cluster.connect(None).await?)),
    }
}

/// The server refused a write because it is a replica: this connection points at a node that
/// was demoted (a failover), so the next one must look the primary up again.
fn reached_replica(e: &RedisError) -> bool {
    e.code() == Some("READONLY")
}

/// The connection itself failed (closed, reset, unparseable), as opposed to Redis answering
/// with an error.
fn broke(e: &RedisError) -> bool {
    (e.is_io_error() && !e.is_timeout()) || e.kind() == redis::ErrorKind::Parse
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // Each holder only reads or replaces the value, so a poisoned one is still consistent.
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each holder only reads or replaces the value, so a poisoned one is still consistent.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
