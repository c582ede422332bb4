//! One Redis server: a reconnecting multiplexed connection shared by every lock of the client,
//! the three scripts, and one shared subscriber connection for wake-ups.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSubSink, PubSubStream};
use redis::{AsyncCommands, RedisResult, Script};
use tokio::sync::{mpsc, Mutex};
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;

use super::{Attempt, LockKeys};
use crate::error::TimedOut;
use crate::wakeups::{Registration, Wakeups};
use crate::LockError;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../scripts/acquire.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../scripts/renew.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../scripts/release.lua")));

#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
}

#[derive(Debug)]
pub(crate) struct RedisBackend {
    conn: ConnectionManager,
    timeouts: Timeouts,
    subscriber: Arc<Subscriber>,
    unsubscriber: JoinHandle<()>,
}

impl RedisBackend {
    pub(crate) async fn connect(url: &str, timeouts: Timeouts) -> Result<Self, LockError> {
        if url.starts_with("rediss://") && !cfg!(feature = "tls") {
            return Err(LockError::invalid_options(
                "a rediss:// (TLS) URL needs lock-runtime's `tls` feature",
            ));
        }
        let client = redis::Client::open(url)
            .map_err(|e| LockError::invalid_options(format!("invalid Redis URL: {e}")))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        // The manager tries twice, each bounded by the connect timeout, with a short pause.
        let bound = timeouts.connect * 2 + Duration::from_secs(1);
        let conn = match tokio::time::timeout(bound, client.get_connection_manager_with_config(config)).await
        {
            Ok(conn) => conn?,
            Err(_) => return Err(LockError::unavailable(TimedOut { after: bound })),
        };
        let (idle_tx, idle_rx) = mpsc::unbounded_channel();
        let subscriber = Arc::new(Subscriber::new(client, timeouts, Wakeups::new(Some(idle_tx))));
        let unsubscriber = tokio::spawn(Arc::clone(&subscriber).unsubscribe_idle(idle_rx));
        Ok(RedisBackend {
            conn,
            timeouts,
            subscriber,
            unsubscriber,
        })
    }

    /// Runs one request, bounded by the response timeout whatever state the connection is in.
    async fn timed<T>(&self, request: impl Future<Output = RedisResult<T>>) -> Result<T, LockError> {
        bounded(self.timeouts.response, request).await
    }

    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_ms: u64,
        fencing: bool,
    ) -> Result<Attempt, LockError> {
        let mut conn = self.conn.clone();
        let (taken, n): (i64, i64) = self
            .timed(
                ACQUIRE
                    .key(&keys.lock)
                    .key(&keys.fence)
                    .arg(token)
                    .arg(ttl_ms)
                    .arg(if fencing { "1" } else { "0" })
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(if taken == 1 {
            Attempt::Acquired {
                fence: fencing.then_some(n.unsigned_abs()),
            }
        } else {
            Attempt::Held {
                pttl_ms: u64::try_from(n).ok(),
            }
        })
    }

    pub(crate) async fn renew(&self, keys: &LockKeys, token: &str, ttl_ms: u64) -> Result<bool, LockError> {
        let mut conn = self.conn.clone();
        let renewed: i64 = self
            .timed(
                RENEW
                    .key(&keys.lock)
                    .arg(token)
                    .arg(ttl_ms)
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(renewed == 1)
    }

    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        token: &str,
        hold_ms: u64,
    ) -> Result<bool, LockError> {
        let mut conn = self.conn.clone();
        let released: i64 = self
            .timed(
                RELEASE
                    .key(&keys.lock)
                    .key(&keys.channel)
                    .arg(token)
                    .arg(hold_ms)
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(released == 1)
    }

    pub(crate) async fn is_locked(&self, keys: &LockKeys) -> Result<bool, LockError> {
        let mut conn = self.conn.clone();
        self.timed(conn.exists(&keys.lock)).await
    }

    pub(crate) async fn remaining_ttl(&self, keys: &LockKeys) -> Result<Option<Duration>, LockError> {
        let mut conn = self.conn.clone();
        let pttl: i64 = self.timed(conn.pttl(&keys.lock)).await?;
        Ok(u64::try_from(pttl).ok().map(Duration::from_millis))
    }

    pub(crate) async fn force_release(&self, keys: &LockKeys) -> Result<bool, LockError> {
        let mut conn = self.conn.clone();
        let (deleted, _): (i64, i64) = self
            .timed(
                redis::pipe()
                    .atomic()
                    .del(&keys.lock)
                    .publish(&keys.channel, "released")
                    .query_async(&mut conn),
            )
            .await?;
        Ok(deleted == 1)
    }

    pub(crate) fn wakeups(&self) -> &Arc<Wakeups> {
        &self.subscriber.wakeups
    }

    pub(crate) async fn listen(&self, registration: &Registration) {
        self.subscriber.listen(registration.channel()).await;
    }
}

impl Drop for RedisBackend {
    fn drop(&mut self) {
        self.unsubscriber.abort();
        self.subscriber.stop_dispatcher();
    }
}

async fn bounded<T>(after: Duration, request: impl Future<Output = RedisResult<T>>) -> Result<T, LockError> {
    match tokio::time::timeout(after, request).await {
        Ok(answer) => answer.map_err(LockError::from),
        Err(_) => Err(LockError::unavailable(TimedOut { after })),
    }
}

/// The subscriber connection while it is up: the half that sends SUBSCRIBE/UNSUBSCRIBE, and the
/// generation that tells its dispatcher task apart from an earlier connection's.
#[derive(Debug)]
struct Live {
    generation: u64,
    sink: PubSubSink,
}

/// After the subscriber connection fails to open or to subscribe, waiters rely on their timers
/// for this long before anyone tries again: a server that refuses pub/sub is not hammered.
const SUBSCRIBER_RETRY: Duration = Duration::from_secs(1);

/// One pub/sub connection per client, opened by the first waiter and reopened by the next one
/// after it breaks. Waiters whose subscription is lost with a connection are woken to re-check
/// their lock, so none sleeps through a release that went unheard.
#[derive(Debug)]
struct Subscriber {
    client: redis::Client,
    timeouts: Timeouts,
    wakeups: Arc<Wakeups>,
    /// Also serialises SUBSCRIBE against UNSUBSCRIBE of the same channel.
    live: Mutex<Option<Live>>,
    /// The task reading the current connection, so dropping the client can always stop it.
    dispatcher: std::sync::Mutex<Option<AbortHandle>>,
    /// No new connection before this instant (set after a failure).
    retry_after: std::sync::Mutex<Option<Instant>>,
}

impl Subscriber {
    fn new(client: redis::Client, timeouts: Timeouts, wakeups: Arc<Wakeups>) -> Self {
        Subscriber {
            client,
            timeouts,
            wakeups,
            live: Mutex::new(None),
            dispatcher: std::sync::Mutex::new(None),
            retry_after: std::sync::Mutex::new(None),
        }
    }

    fn cooling_down(&self) -> bool {
        lock(&self.retry_after).is_some_and(|until| Instant::now() < until)
    }

    fn stop_dispatcher(&self) {
        if let Some(dispatcher) = lock(&self.dispatcher).take() {
            dispatcher.abort();
        }
    }

    /// Subscribes `channel` unless it is already. Best effort: on failure the waiter wakes at
    /// the holder's expiry or its nap's end instead.
    async fn listen(self: &Arc<Self>, channel: &str) {
        if self.wakeups.is_subscribed(channel) || self.cooling_down() {
            return;
        }
        let mut live = self.live.lock().await;
        if self.wakeups.is_subscribed(channel) || self.cooling_down() {
            return;
        }
        if live.is_none() {
            match self.open().await {
                Ok(opened) => *live = Some(opened),
                Err(e) => {
                    tracing::debug!(error = %e, "lock wake-up subscriber unavailable; waiting on timers");
                    *lock(&self.retry_after) = Some(Instant::now() + SUBSCRIBER_RETRY);
                    return;
                }
            }
        }
        let Some(current) = live.as_mut() else { return };
        match bounded(self.timeouts.response, current.sink.subscribe(channel)).await {
            Ok(()) => self.wakeups.set_subscribed(channel),
            Err(e) => {
                tracing::debug!(error = %e, channel, "lock wake-up subscription failed; waiting on timers");
                self.discard(&mut live);
            }
        }
    }

    async fn open(self: &Arc<Self>) -> Result<Live, LockError> {
        let pubsub = bounded(self.timeouts.connect, self.client.get_async_pubsub()).await?;
        let (sink, stream) = pubsub.split();
        static GENERATION: AtomicU64 = AtomicU64::new(0);
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        let dispatcher = tokio::spawn(Arc::clone(self).dispatch(generation, stream));
        self.stop_dispatcher();
        *lock(&self.dispatcher) = Some(dispatcher.abort_handle());
        Ok(Live { generation, sink })
    }

    /// Drops a connection that misbehaved: its subscriptions are gone, so their waiters re-check,
    /// and nobody reconnects before [`SUBSCRIBER_RETRY`] has passed.
    fn discard(&self, live: &mut Option<Live>) {
        live.take();
        self.stop_dispatcher();
        *lock(&self.retry_after) = Some(Instant::now() + SUBSCRIBER_RETRY);
        self.wakeups.subscriptions_lost();
    }

    async fn dispatch(self: Arc<Self>, generation: u64, mut stream: PubSubStream) {
        while let Some(message) = stream.next().await {
            self.wakeups.notify(message.get_channel_name());
        }
        tracing::debug!("lock wake-up subscriber connection closed");
        let mut live = self.live.lock().await;
        if live.as_ref().is_some_and(|l| l.generation == generation) {
            live.take();
            self.wakeups.subscriptions_lost();
        }
    }

    /// Unsubscribes channels whose last local waiter has gone (unless one came back meanwhile).
    async fn unsubscribe_idle(self: Arc<Self>, mut idle: mpsc::UnboundedReceiver<String>) {
        while let Some(channel) = idle.recv().await {
            let mut live = self.live.lock().await;
            if self.wakeups.is_wanted(&channel) {
                continue;
            }
            if let Some(current) = live.as_mut() {
                if let Err(e) = bounded(self.timeouts.response, current.sink.unsubscribe(&channel)).await {
                    tracing::debug!(error = %e, "lock wake-up unsubscribe failed; reconnecting later");
                    self.discard(&mut live);
                }
            }
        }
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each holder only reads or replaces the value, so a poisoned one is still consistent.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
