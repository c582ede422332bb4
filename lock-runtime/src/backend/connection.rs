//! The request connection to one Redis server: opened on first use, shared by every request of
//! the client (multiplexed), retried once when it broke, and replaced when it went silent.
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

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, RedisResult};
use tokio::time::Instant;

use crate::error::TimedOut;
use crate::LockError;

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
    fn is_empty(&self) -> bool {
        self.root_ca.is_none() && self.client_auth.is_none()
    }
}

/// The `redis::Client` for `url`: checked (scheme, TLS feature, PEM material) without
/// connecting, with TCP keepalive. `TCP_NODELAY` stays off, as redis-rs leaves it: a request
/// waits for no ACK anyway (the answer to the previous one carries it), while with many
/// requests in flight Nagle's algorithm packs them into fewer packets, which measured 24% more
/// pairs per second with 64 tasks (see README, Performance).
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
    let keepalive = redis::io::tcp::socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(15))
        .with_interval(Duration::from_secs(5));
    let tcp = redis::io::tcp::TcpSettings::default().set_keepalive(keepalive);
    let info = info.set_tcp_settings(tcp);
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

#[cfg(feature = "tls")]
fn tls_client(info: redis::ConnectionInfo, tls: &TlsMaterial) -> Result<redis::Client, LockError> {
    // rustls needs a process-wide crypto provider; install ours unless the application already
    // installed one (then `install_default` fails, and theirs is kept).
    let _ = rustls::crypto::ring::default_provider().install_default();
    if tls.is_empty() {
        return redis::Client::open(info)
            .map_err(|e| LockError::invalid_options(format!("invalid Redis URL: {e}")));
    }
    let certificates = redis::TlsCertificates {
        client_tls: tls
            .client_auth
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.root_ca.clone(),
    };
    redis::Client::build_with_tls(info, certificates)
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

#[derive(Debug)]
pub(crate) struct Connection {
    client: redis::Client,
    timeouts: Timeouts,
    /// Read by every request, written only when a connection opens or is dropped.
    live: RwLock<Option<Live>>,
    /// Held while a connection is opened, so that one open serves everyone waiting; it keeps the
    /// last failure, which those who waited for that very attempt get instead of a new attempt.
    opening: tokio::sync::Mutex<Option<Failure>>,
    /// Requests that timed out in a row on the current connection.
    unanswered: AtomicU32,
}

#[derive(Debug, Clone)]
struct Live {
    generation: u64,
    conn: MultiplexedConnection,
}

#[derive(Debug)]
struct Failure {
    at: Instant,
    error: OpenError,
}

#[derive(Debug, Clone)]
enum OpenError {
    Redis(RedisError),
    TimedOut(Duration),
}

impl From<OpenError> for LockError {
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::Redis(e) => e.into(),
            OpenError::TimedOut(after) => LockError::unavailable(TimedOut { after }),
        }
    }
}

impl Connection {
    /// Connects nothing yet: the first request opens the connection.
    pub(crate) fn new(client: redis::Client, timeouts: Timeouts) -> Self {
        Connection {
            client,
            timeouts,
            live: RwLock::new(None),
            opening: tokio::sync::Mutex::new(None),
            unanswered: AtomicU32::new(0),
        }
    }

    /// Opens the connection now unless it is open: for `build()`, which reports a server that
    /// is down or refuses us at start.
    pub(crate) async fn ensure_open(&self) -> Result<(), LockError> {
        self.current().await.map(drop)
    }

    /// Sends one request, bounded by the response timeout. A request that fails because the
    /// connection broke is sent once more on a fresh connection: every request of the lock
    /// protocol is idempotent for its token, so a retry never takes a second lock.
    pub(crate) async fn request<T, F, Fut>(&self, send: F) -> Result<T, LockError>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let mut retried = false;
        loop {
            let live = self.current().await?;
            match tokio::time::timeout(self.timeouts.response, send(live.conn)).await {
                Ok(Ok(answer)) => {
                    self.unanswered.store(0, Ordering::Relaxed);
                    return Ok(answer);
                }
                Ok(Err(e)) if broke(&e) => {
                    self.discard(live.generation);
                    if retried {
                        return Err(e.into());
                    }
                    tracing::debug!(error = %e, "Redis connection broke; retrying on a new one");
                    retried = true;
                }
                Ok(Err(e)) => {
                    // An error reply is still an answer: the connection is alive.
                    self.unanswered.store(0, Ordering::Relaxed);
                    return Err(e.into());
                }
                Err(_) => {
                    if self.unanswered.fetch_add(1, Ordering::Relaxed) + 1 >= SILENT_AFTER {
                        tracing::warn!(
                            requests = SILENT_AFTER,
                            "Redis connection silent; the next request opens a new one"
                        );
                        self.discard(live.generation);
                    }
                    return Err(LockError::unavailable(TimedOut {
                        after: self.timeouts.response,
                    }));
                }
            }
        }
    }

    async fn current(&self) -> Result<Live, LockError> {
        if let Some(live) = read(&self.live).clone() {
            return Ok(live);
        }
        let asked = Instant::now();
        let mut last_failure = self.opening.lock().await;
        if let Some(live) = read(&self.live).clone() {
            return Ok(live);
        }
        if let Some(failure) = last_failure.as_ref().filter(|f| f.at >= asked) {
            return Err(failure.error.clone().into());
        }
        match self.open().await {
            Ok(live) => {
                *last_failure = None;
                self.unanswered.store(0, Ordering::Relaxed);
                *write(&self.live) = Some(live.clone());
                Ok(live)
            }
            Err(error) => {
                *last_failure = Some(Failure {
                    at: Instant::now(),
                    error: error.clone(),
                });
                Err(error.into())
            }
        }
    }

    async fn open(&self) -> Result<Live, OpenError> {
        static GENERATION: AtomicU64 = AtomicU64::new(0);
        let after = self.timeouts.connect;
        // Responses are bounded by `request`, which also counts the silent ones.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(after))
            .set_response_timeout(None);
        let conn = match tokio::time::timeout(
            after,
            self.client.get_multiplexed_async_connection_with_config(&config),
        )
        .await
        {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(OpenError::Redis(e)),
            Err(_) => return Err(OpenError::TimedOut(after)),
        };
        Ok(Live {
            generation: GENERATION.fetch_add(1, Ordering::Relaxed),
            conn,
        })
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
