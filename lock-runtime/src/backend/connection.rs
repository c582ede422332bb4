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

use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, RedisError, RedisResult, Value};
use tokio::time::Instant;

use crate::error::TimedOut;
use crate::LockError;

/// How long [`LockClientBuilder::build`](crate::LockClientBuilder::build) waits for a connection
/// by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long any one request may take by default before it fails as
/// [`LockError::Unavailable`].
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long to wait for a connection, and for any one answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
}

/// PEM material for TLS beyond the system's trust store: a private CA, a client certificate.
#[derive(Clone, Default)]
pub(crate) struct TlsMaterial {
    pub(crate) root_ca: Option<Vec<u8>>,
    pub(crate) client_auth: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("TlsMaterial")
            .field("root_ca", &self.root_ca.is_some())
            .field("client_auth", &self.client_auth.is_some())
            .finish()
    }
}

impl TlsMaterial {
    /// The material as redis-rs takes it.
    #[cfg(feature = "tls")]
    pub(crate) fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client_auth
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.root_ca.clone(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.root_ca.is_none() && self.client_auth.is_none()
    }
}

/// The `redis::Client` for `url`: checked (scheme, TLS feature, PEM material) without
/// connecting, with TCP keepalive. `TCP_NODELAY` stays off, as redis-rs leaves it: a request
/// waits for no ACK anyway (the answer to the previous one carries it), while with many
/// requests in flight Nagle's algorithm packs them into fewer packets, which measured 24% more
/// pairs per second with 64 tasks (see BENCHMARKS.md).
pub(crate) fn client_for_url(url: &str, tls: &TlsMaterial) -> Result<redis::Client, LockError> {
    if !url.contains("://") {
        return Err(LockError::invalid_options(
            "the Redis URL has no scheme: write it as redis://host:port (rediss://host:port for TLS)",
        ));
    }
    let is_tls = url.starts_with("rediss://");
    if is_tls && !cfg!(feature = "tls") {
        return Err(LockError::invalid_options(
            "a rediss:// (TLS) URL needs lock-runtime's `tls` feature",
        ));
    }
    if !tls.is_empty() && !is_tls {
        return Err(LockError::invalid_options(
            "TLS certificates were given, but the Redis URL is not rediss://",
        ));
    }
    let info = redis::IntoConnectionInfo::into_connection_info(url)
        .map_err(|e| LockError::invalid_options(format!("invalid Redis URL: {e}")))?;
    let info = info.set_tcp_settings(tcp_settings());
    let no_certificate = |pem: &[u8]| !String::from_utf8_lossy(pem).contains("-----BEGIN CERTIFICATE-----");
    if tls.root_ca.as_deref().is_some_and(no_certificate)
        || tls
            .client_auth
            .as_ref()
            .is_some_and(|(cert, _)| no_certificate(cert))
    {
        return Err(LockError::invalid_options(
            "invalid TLS material: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
        ));
    }
    if is_tls {
        tls_client(info, tls)
    } else {
        redis::Client::open(info).map_err(|e| LockError::invalid_options(format!("invalid Redis URL: {e}")))
    }
}

/// TCP keepalive (15 s, then every 5 s), so a peer that vanished is noticed by the kernel too.
pub(crate) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    let keepalive = redis::io::tcp::socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(15))
        .with_interval(Duration::from_secs(5));
    redis::io::tcp::TcpSettings::default().set_keepalive(keepalive)
}

#[cfg(feature = "tls")]
fn tls_client(info: redis::ConnectionInfo, tls: &TlsMaterial) -> Result<redis::Client, LockError> {
    // rustls needs a process-wide crypto provider; install ours unless the application already
    // installed one (then `install_default` fails, and theirs is kept).
    let _ = rustls::crypto::ring::default_provider().install_default();
    if tls.is_empty() {
        return redis::Client::open(info)
            .map_err(|e| LockError::invalid_options(format!("invalid Redis URL: {e}")));
    }
    redis::Client::build_with_tls(info, tls.certificates())
        .map_err(|e| LockError::invalid_options(format!("invalid TLS material: {e}")))
}

#[cfg(not(feature = "tls"))]
fn tls_client(_: redis::ConnectionInfo, _: &TlsMaterial) -> Result<redis::Client, LockError> {
    Err(LockError::invalid_options(
        "a rediss:// (TLS) URL needs lock-runtime's `tls` feature",
    ))
}

/// This many requests in a row without an answer, and the connection counts as silent: the next
/// request opens a new one.
pub(crate) const SILENT_AFTER: u32 = 2;

/// Where requests go.
#[derive(Debug, Clone)]
// One per client, kept for its life: not worth a box.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Place {
    /// One server.
    Server(redis::Client),
    /// The primary that the sentinels name, looked up again whenever a connection opens.
    #[cfg(feature = "sentinel")]
    Sentinel(std::sync::Arc<super::sentinel::Sentinels>),
    /// A Redis Cluster: each request reaches the primary owning its key's slot.
    #[cfg(feature = "cluster")]
    Cluster(std::sync::Arc<super::cluster::ClusterPlace>),
}

impl Place {
    /// A Redis Cluster (one connection per node, kept by redis-rs).
    pub(crate) fn is_cluster(&self) -> bool {
        #[cfg(feature = "cluster")]
        if let Place::Cluster(_) = self {
            return true;
        }
        false
    }
}

/// An open request connection: the same commands work on each; only scripts followed by `WAIT`
/// need to know which it is (see [`Conn::then_wait`]).
pub(crate) use super::conn::Conn;

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
    place: Place,
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
}

/// The shared outcome of one open.
type Opening =
    futures_util::future::Shared<futures_util::future::BoxFuture<'static, Result<Live, OpenError>>>;

/// The connection the requests of one acquire went on (the last of them, if one was sent again
/// on a new connection), so that the release of an acquire whose answer never came follows it
/// there: TCP keeps the two in order, where a release on a connection opened since (the first
/// one went silent and was replaced) could reach Redis before the acquire, which would then
/// take the lock for nobody. Holding it keeps that connection open until the release is sent.
#[derive(Debug, Default)]
pub(crate) struct Pinned(std::sync::Mutex<Option<Live>>);

impl Pinned {
    fn set(&self, live: &Live) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(live.clone());
    }

    fn get(&self) -> Option<Live> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

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
    Redis(RedisError),
    TimedOut(Duration),
    /// The task opening it was stopped (its runtime shut down) before it finished.
    Stopped,
}

impl From<OpenError> for LockError {
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::Redis(e) => e.into(),
            OpenError::TimedOut(after) => LockError::unavailable(TimedOut { after }),
            OpenError::Stopped => LockError::unavailable("the task opening the Redis connection was stopped"),
        }
    }
}

impl Connection {
    /// Connects nothing yet: the first request opens the connection.
    pub(crate) fn new(place: Place, timeouts: Timeouts) -> Self {
        Connection {
            place,
            timeouts,
            live: std::sync::Arc::new(RwLock::new(None)),
            follower: crate::background::Background::default(),
            switched: std::sync::Arc::default(),
            opening: std::sync::Arc::default(),
            unanswered: std::sync::Arc::default(),
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

    /// [`request_within`](Self::request_within), recording in `pin` the connection each try is
    /// sent on.
    pub(crate) async fn request_pinned<T, F, Fut>(
        &self,
        pin: Option<&Pinned>,
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
            if let Some(pin) = pin {
                pin.set(&live);
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
                    if !self.place.is_cluster()
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

    /// Sends on the connection `pin` recorded (after what was sent there), even if it has been
    /// replaced since; without a pin or a recorded connection, or if it broke (then Redis has
    /// run what it received on it, or never will), as [`request_within`](Self::request_within)
    /// does.
    pub(crate) async fn request_after<T, F, Fut>(
        &self,
        pin: Option<&Pinned>,
        within: Duration,
        send: F,
    ) -> Result<T, LockError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        if let Some(live) = pin.and_then(Pinned::get) {
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
        let (place, connect) = (self.place.clone(), self.timeouts.connect);
        let (live, unanswered) = (self.live.clone(), self.unanswered.clone());
        let task = tokio::spawn(async move {
            let outcome = open(&place, connect).await;
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
        if let Place::Sentinel(sentinels) = &self.place {
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
            *live = None;
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.follower.stop();
    }
}

/// Opens a connection to `place`, within `after`.
async fn open(place: &Place, after: Duration) -> Result<Live, OpenError> {
    static GENERATION: AtomicU64 = AtomicU64::new(0);
    let conn = match tokio::time::timeout(after, open_place(place, after)).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(OpenError::Redis(e)),
        Err(_) => return Err(OpenError::TimedOut(after)),
    };
    Ok(Live {
        generation: GENERATION.fetch_add(1, Ordering::Relaxed),
        conn,
    })
}

/// Opens a request connection to `place`, within `after` per connect.
async fn open_place(place: &Place, after: Duration) -> RedisResult<Conn> {
    // Responses are bounded by `request`, which also counts the silent ones.
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(after))
        .set_response_timeout(None);
    match place {
        Place::Server(client) => Ok(Conn::Server(
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await?,
        )),
        #[cfg(feature = "sentinel")]
        Place::Sentinel(sentinels) => {
            let client = sentinels.primary().await?;
            Ok(Conn::Server(
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?,
            ))
        }
        #[cfg(feature = "cluster")]
        Place::Cluster(cluster) => Ok(Conn::Cluster(cluster.connect(None).await?)),
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
