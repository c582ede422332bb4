//! The one pub/sub connection of a Redis store: opened by the first waiter, it subscribes to the
//! channels of the locks that are waited for (sharded pub/sub on a Cluster), tells the client's
//! waiters what it hears (through its [`Notices`]), unsubscribes channels nobody waits for any
//! more, and is replaced when it breaks or goes silent.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::RedisResult;
use tokio::sync::{mpsc, Mutex};
use tokio::time::Instant;

use super::connection::lock;
use super::keys;
use super::servers::Servers;
use crate::background::Background;
use crate::error::TimedOut;
use crate::store::announcement::Said;
use crate::store::{Notices, Timeouts};
use crate::LockError;

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
    sink: Sink,
}

/// Where subscriptions are sent.
enum Sink {
    /// A pub/sub connection to one server (or the primary the sentinels named).
    Server(PubSubSink),
    /// A RESP3 cluster connection: `SSUBSCRIBE` reaches the node owning the channel's slot, and
    /// redis-rs subscribes again after reconnects and slot moves.
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sink::Server(_) => "Sink::Server",
            #[cfg(feature = "cluster")]
            Sink::Cluster(_) => "Sink::Cluster",
        })
    }
}

impl Sink {
    async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Sink::Server(sink) => sink.subscribe(channel).await,
            #[cfg(feature = "cluster")]
            Sink::Cluster(conn) => conn.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Sink::Server(sink) => sink.unsubscribe(channel).await,
            #[cfg(feature = "cluster")]
            Sink::Cluster(conn) => conn.sunsubscribe(channel).await,
        }
    }

    /// Checks the connection answers. A cluster connection is redis-rs's to keep alive (it
    /// reconnects and subscribes again by itself).
    async fn ping(&mut self) -> RedisResult<()> {
        match self {
            Sink::Server(sink) => sink.ping::<redis::Value>().await.map(drop),
            #[cfg(feature = "cluster")]
            Sink::Cluster(_) => Ok(()),
        }
    }
}

/// What a subscriber connection hears.
enum Heard {
    Server(PubSubStream),
    #[cfg(feature = "cluster")]
    Cluster(mpsc::UnboundedReceiver<redis::PushInfo>),
}

/// One thing heard: a message on a channel, or a subscription the server ended by itself.
enum Event {
    Message(Vec<u8>, Vec<u8>),
    #[cfg(feature = "cluster")]
    Unsubscribed(Vec<u8>),
    #[cfg(feature = "cluster")]
    Disconnected,
}

impl Heard {
    async fn next(&mut self) -> Option<Event> {
        match self {
            Heard::Server(stream) => {
                let message = stream.next().await?;
                Some(Event::Message(
                    message.get_channel_name().as_bytes().to_vec(),
                    message.get_payload_bytes().to_vec(),
                ))
            }
            #[cfg(feature = "cluster")]
            Heard::Cluster(pushes) => loop {
                let push = pushes.recv().await?;
                let mut data = push.data.into_iter();
                let mut bytes = || match data.next() {
                    Some(redis::Value::BulkString(bytes)) => bytes,
                    _ => Vec::new(),
                };
                match push.kind {
                    redis::PushKind::SMessage | redis::PushKind::Message => {
                        let channel = bytes();
                        return Some(Event::Message(channel, bytes()));
                    }
                    redis::PushKind::SUnsubscribe => return Some(Event::Unsubscribed(bytes())),
                    redis::PushKind::Disconnection => return Some(Event::Disconnected),
                    _ => continue,
                }
            },
        }
    }
}

/// After the subscriber connection fails to open or to subscribe, waiters rely on their timers
/// for this long before anyone tries again: a server that refuses pub/sub is not hammered.
const SUBSCRIBER_RETRY: Duration = Duration::from_secs(1);

/// While anyone waits, the subscriber connection is pinged this often, so that one that went
/// silent (no reset, nothing answers) is replaced instead of leaving waiters on their timers.
const SUBSCRIBER_PING: Duration = Duration::from_secs(1);

/// One pub/sub connection per client, opened by the first waiter and reopened by the next one
/// after it breaks. Waiters whose subscription is lost with a connection are woken to re-check
/// their lock, so none sleeps through a release that went unheard.
#[derive(Debug)]
pub(crate) struct Subscriber {
    /// How this client announces its releases (`c:` and a random id), so that its own are
    /// skipped when heard back.
    pub(crate) announcement: String,
    servers: Servers,
    pub(crate) timeouts: Timeouts,
    /// Told when a sentinel announced a new primary: the subscriber leaves the old one too.
    switched: Arc<tokio::sync::Notify>,
    /// Where what it hears goes (as this store's listener).
    pub(crate) notices: Notices,
    /// Also serialises SUBSCRIBE against UNSUBSCRIBE of the same channel.
    live: Mutex<Option<Live>>,
    /// The task reading the current connection, so dropping the client can always stop it. A
    /// connection whose reader ended (with the runtime it ran on) is dead: it is replaced.
    dispatcher: Background,
    /// The task that unsubscribes idle channels and pings the connection, started by the first
    /// waiter (so a client can be built outside a runtime), and again on a later runtime.
    upkeep: Background,
    /// Locks nobody waits for any more, for the upkeep task (which holds it while it runs).
    idle: Arc<Mutex<mpsc::UnboundedReceiver<String>>>,
    /// Where [`unlisten`](Self::unlisten) sends them.
    idle_tx: mpsc::UnboundedSender<String>,
    /// Set when the client is dropped: no task starts again.
    stopped: AtomicBool,
    /// No new connection before this instant (set after a failure).
    retry_after: std::sync::Mutex<Option<Instant>>,
    /// Redis refused this client pub/sub (an ACL without channel rights); said once.
    denied_said: AtomicBool,
}

impl Subscriber {
    pub(crate) fn new(
        servers: Servers,
        timeouts: Timeouts,
        notices: Notices,
        switched: Arc<tokio::sync::Notify>,
    ) -> Self {
        let (idle_tx, idle) = mpsc::unbounded_channel();
        Subscriber {
            announcement: format!("c:{:016x}", rand::random::<u64>()),
            servers,
            switched,
            timeouts,
            notices,
            live: Mutex::new(None),
            dispatcher: Background::default(),
            upkeep: Background::default(),
            idle: Arc::new(Mutex::new(idle)),
            idle_tx,
            stopped: AtomicBool::new(false),
            retry_after: std::sync::Mutex::new(None),
            denied_said: AtomicBool::new(false),
        }
    }

    fn cooling_down(&self) -> bool {
        lock(&self.retry_after).is_some_and(|until| Instant::now() < until)
    }

    fn stop_dispatcher(&self) {
        self.dispatcher.stop();
    }

    /// Nobody waits for lock `name` any more: its channel is unsubscribed (unless someone waits
    /// again by then).
    pub(crate) fn unlisten(&self, name: &str) {
        // The receiver only goes away with the store; nothing to do then.
        let _ = self.idle_tx.send(name.to_owned());
    }

    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.upkeep.stop();
        self.stop_dispatcher();
    }

    /// Says once per client that releases cannot be announced or heard, and what that costs.
    pub(crate) fn pubsub_denied(&self) {
        if !self.denied_said.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "Redis denies this client pub/sub on lock channels (ACL channel rights): waiters \
                 wake on their timers (up to 2 s after a release) instead of at the release; \
                 grant the user `&<prefix>*` to hand locks over at once"
            );
        }
    }

    fn start_upkeep(self: &Arc<Self>) {
        if !self.stopped.load(Ordering::Relaxed) {
            self.upkeep.ensure(|| Arc::clone(self).upkeep());
        }
    }

    /// Whether [`listen`](Self::listen) has nothing to do for lock `name`: its channel is
    /// subscribed, or the subscriber is cooling down after a failure (and the upkeep task runs).
    pub(crate) fn listening(&self, name: &str) -> bool {
        self.upkeep.is_running()
            && (self.cooling_down() || (self.dispatcher.is_running() && self.notices.is_confirmed(name)))
    }

    /// Subscribes the channel of lock `name` unless it is already. Best effort: on failure the
    /// waiter wakes at the holder's expiry or its nap's end instead.
    pub(crate) async fn listen(self: &Arc<Self>, name: &str) {
        self.start_upkeep();
        // A connection whose reader ended with the runtime it ran on is dead, subscriptions and
        // all: replaced at once (no cool-down, nothing failed).
        let orphaned = || !self.dispatcher.is_running();
        if !orphaned() && (self.notices.is_confirmed(name) || self.cooling_down()) {
            return;
        }
        let mut live = self.live.lock().await;
        if live.is_some() && orphaned() {
            live.take();
            self.notices.lost_all();
        }
        if self.notices.is_confirmed(name) || self.cooling_down() {
            return;
        }
        // Nobody waits for it any more (its waiter went while this ran detached): subscribing
        // now would leave the channel subscribed for nobody, as the waiter's leaving was seen
        // already (the upkeep judges under the same lock).
        if !self.notices.is_wanted(name) {
            return;
        }
        if live.is_none() {
            match self.open().await {
                Ok(opened) => *live = Some(opened),
                Err(e) => {
                    self.failed(&e, "lock wake-up subscriber unavailable; waiting on timers");
                    *lock(&self.retry_after) = Some(Instant::now() + SUBSCRIBER_RETRY);
                    return;
                }
            }
        }
        let Some(current) = live.as_mut() else { return };
        match bounded(
            self.timeouts.response,
            current.sink.subscribe(&keys::channel(name)),
        )
        .await
        {
            Ok(()) => self.notices.confirmed(name),
            Err(e) => {
                self.failed(&e, "lock wake-up subscription failed; waiting on timers");
                self.discard(&mut live);
            }
        }
    }

    fn failed(&self, e: &LockError, what: &str) {
        if matches!(e, LockError::Refused { .. }) {
            self.pubsub_denied();
        }
        tracing::debug!(error = %e, "{what}");
    }

    async fn connect(&self) -> RedisResult<(Sink, Heard)> {
        #[cfg(feature = "cluster")]
        if let Servers::Cluster(cluster) = &self.servers {
            let (pushes, heard) = mpsc::unbounded_channel();
            let conn = cluster.connect(Some(pushes)).await?;
            return Ok((Sink::Cluster(conn), Heard::Cluster(heard)));
        }
        let Some(server) = self.servers.server().await? else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "no server to subscribe on",
            )));
        };
        let (sink, stream) = server.get_async_pubsub().await?.split();
        Ok((Sink::Server(sink), Heard::Server(stream)))
    }

    async fn open(self: &Arc<Self>) -> Result<Live, LockError> {
        let (sink, stream) = bounded(self.timeouts.connect, self.connect()).await?;
        static GENERATION: AtomicU64 = AtomicU64::new(0);
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        self.dispatcher
            .replace(|| Arc::clone(self).dispatch(generation, stream));
        Ok(Live { generation, sink })
    }

    /// Drops a connection that misbehaved: its subscriptions are gone, so their waiters re-check,
    /// and nobody reconnects before [`SUBSCRIBER_RETRY`] has passed.
    fn discard(&self, live: &mut Option<Live>) {
        live.take();
        self.stop_dispatcher();
        *lock(&self.retry_after) = Some(Instant::now() + SUBSCRIBER_RETRY);
        self.notices.lost_all();
    }

    async fn dispatch(self: Arc<Self>, generation: u64, mut heard: Heard) {
        while let Some(event) = heard.next().await {
            match event {
                Event::Message(channel, said) => {
                    let channel = String::from_utf8_lossy(&channel);
                    let Some(name) = keys::lock_of_channel(&channel) else {
                        continue;
                    };
                    match Said::parse(&said) {
                        // A fair release names the next waiter; it may be another client's.
                        Said::Turn(waiter) => self.notices.turn(name, waiter, None),
                        // ... or hands it the lock.
                        Said::HandedOver(handed, waiter) => {
                            self.notices.turn(name, waiter, Some(handed));
                        }
                        // This client's own releases wake its waiters without it.
                        Said::Released if said == self.announcement.as_bytes() => {}
                        Said::Released => self.notices.released(name),
                    }
                }
                #[cfg(feature = "cluster")]
                Event::Unsubscribed(channel) => {
                    // Ours go only when nobody waits; one that still has waiters was ended by
                    // the server (its slot moved): they re-check, and subscribe again.
                    let channel = String::from_utf8_lossy(&channel);
                    if let Some(name) = keys::lock_of_channel(&channel).filter(|n| self.notices.is_wanted(n))
                    {
                        tracing::debug!(%channel, "lock wake-up subscription ended by the server");
                        self.notices.lost(name);
                    }
                }
                #[cfg(feature = "cluster")]
                Event::Disconnected => {
                    // redis-rs reconnects and subscribes again; what was said meanwhile is lost.
                    self.notices.lost_all();
                }
            }
        }
        tracing::debug!("lock wake-up subscriber connection closed");
        let mut live = self.live.lock().await;
        if live.as_ref().is_some_and(|l| l.generation == generation) {
            live.take();
            self.notices.lost_all();
        }
    }

    /// Unsubscribes channels whose last local waiter has gone (unless one came back meanwhile),
    /// and pings the connection while anyone waits, replacing it when it no longer answers.
    async fn upkeep(self: Arc<Self>) {
        let idle = Arc::clone(&self.idle);
        let mut idle = idle.lock().await;
        let mut ping = tokio::time::interval(SUBSCRIBER_PING);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.switched.notified() => {
                    // No cool-down: the new primary is there to subscribe to at once.
                    let mut live = self.live.lock().await;
                    if live.take().is_some() {
                        self.stop_dispatcher();
                        self.notices.lost_all();
                    }
                }
                name = idle.recv() => {
                    let Some(name) = name else { return };
                    let mut live = self.live.lock().await;
                    if self.notices.is_wanted(&name) {
                        continue;
                    }
                    if let Some(current) = live.as_mut() {
                        let channel = keys::channel(&name);
                        if let Err(e) = bounded(self.timeouts.response, current.sink.unsubscribe(&channel)).await {
                            tracing::debug!(error = %e, "lock wake-up unsubscribe failed; reconnecting later");
                            self.discard(&mut live);
                        }
                    }
                }
                _ = ping.tick() => {
                    if !self.notices.anyone_waits() {
                        continue;
                    }
                    let mut live = self.live.lock().await;
                    if let Some(current) = live.as_mut() {
                        if let Err(e) = bounded(self.timeouts.response, current.sink.ping()).await {
                            tracing::warn!(error = %e, "lock wake-up connection silent; replacing it");
                            self.discard(&mut live);
                        }
                    }
                }
            }
        }
    }
}
