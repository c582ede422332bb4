//! Redis, however deployed (one server, a Sentinel-managed primary, a Cluster): a request
//! connection shared by every lock of the client, the lock scripts, replica acknowledgement
//! ([`replicas`](super::replicas)), and one shared subscriber connection for wake-ups
//! ([`subscriber`](super::subscriber)); what the deployment changes is its
//! [`Deployment`]'s to say.

use std::sync::Arc;
use std::time::Duration;

use redis::{AsyncCommands, FromRedisValue};
use tokio::sync::mpsc;

use super::connection::{Connection, Pinned, Place, Timeouts};
use super::deployment::Deployment;
use super::replicas::{Acknowledged, Replicas};
use super::scripts::acquire;
use super::scripts::release::{Release, Released, Unlock};
use super::scripts::share::Share;
use super::scripts::{renew, Call, RIGHTS};
use super::subscriber::Subscriber;
use super::{Answer, Ask, Attempt, Capabilities, Kind, LockKeys, Renewal, Store, Stored};

use crate::wakeups::{Registration, Wakeups};
use crate::LockError;

#[derive(Debug)]
pub(crate) struct RedisBackend {
    conn: Connection,
    acknowledged: Acknowledged,
    subscriber: Arc<Subscriber>,
    deployment: Deployment,
    /// Set once the rights check (`rights.lua`) passed: before the first lock, never at a release.
    rights: tokio::sync::OnceCell<()>,
}

impl RedisBackend {
    /// A backend that connects on first use.
    pub(crate) fn new(place: Place, timeouts: Timeouts, replicas: Option<Replicas>) -> Self {
        let (idle_tx, idle_rx) = mpsc::unbounded_channel();
        RedisBackend::listening(
            place,
            timeouts,
            replicas,
            (Wakeups::new(vec![idle_tx]), 0, idle_rx),
        )
    }

    /// A backend whose waiters are `wakeups`' (shared with other backends: a RedLock client's
    /// masters), where this backend's subscriber is listener `listener` and hears about idle
    /// channels on `idle`.
    pub(crate) fn listening(
        place: Place,
        timeouts: Timeouts,
        replicas: Option<Replicas>,
        (wakeups, listener, idle): (Arc<Wakeups>, usize, mpsc::UnboundedReceiver<String>),
    ) -> Self {
        let deployment = Deployment::of(&place);
        let conn = Connection::new(place.clone(), timeouts);
        let subscriber = Arc::new(Subscriber::new(
            place.clone(),
            timeouts,
            wakeups,
            listener,
            (idle, conn.switched()),
        ));
        RedisBackend {
            acknowledged: Acknowledged::new(replicas, &place, timeouts),
            conn,
            subscriber,
            deployment,
            rights: tokio::sync::OnceCell::new(),
        }
    }

    /// The connection for acquires and releases, and how long a request on it may take.
    fn ordered(&self) -> (&Connection, Duration) {
        self.acknowledged
            .ordered(&self.conn, self.subscriber.timeouts.response)
    }

    /// Sends `call` on the [`ordered`](Self::ordered) connection; with replica acknowledgement
    /// asked for, followed by `WAIT` in the same round trip: the answer and how many replicas
    /// acknowledged it.
    async fn run_acknowledged<T: FromRedisValue + Send>(
        &self,
        pin: Option<&Pinned>,
        call: impl Fn() -> Call,
    ) -> Result<(T, Option<usize>), LockError> {
        let bound = (&self.conn, self.subscriber.timeouts.response);
        self.acknowledged.run(bound, pin, call).await
    }

    /// An acquire that took the lock but that too few replicas acknowledged: gives the lock back
    /// (token-checked, waking the next waiter) and says so.
    async fn unless_replicated(
        &self,
        attempt: Attempt,
        acked: Option<usize>,
        keys: &LockKeys,
        token: &str,
        kind: Kind,
    ) -> Result<Attempt, LockError> {
        let (Attempt::Acquired { .. }, Some((acked, wanted))) = (attempt, self.acknowledged.too_few(acked))
        else {
            return Ok(attempt);
        };
        tracing::warn!(
            redis_key = %keys.lock,
            acked,
            wanted,
            "too few replicas acknowledged the acquire; giving the lock back"
        );
        // Boxed: a rare path, kept out of every acquire's future.
        if let Err(e) = Box::pin(self.release_after(keys, token, 0, kind, None, false)).await {
            tracing::warn!(redis_key = %keys.lock, error = %e, "giving back an unreplicated lock failed; it will expire");
        }
        Ok(Attempt::NotReplicated { acked, wanted })
    }

    /// Opens the request connection now, and checks the client's rights on `probe`'s keys (see
    /// `rights.lua`): a server that is down or refuses us fails here, and the acquires of a
    /// client built this way find the rights checked already.
    pub(crate) async fn connect(&self, probe: &LockKeys) -> Result<(), LockError> {
        self.conn.ensure_open().await?;
        self.acknowledged.ensure_open().await?;
        self.rights_checked(probe).await
    }

    /// Checks once, before this client's first lock, that its user may run everything the
    /// protocol runs (`Refused` naming the command it may not). A check that fails for another
    /// reason (Redis down, a Cluster slot migrating: a script naming keys that do not exist
    /// there is refused with `TRYAGAIN` until it ends) does not hold the acquire up: it is made
    /// again at the next one.
    async fn rights_checked(&self, keys: &LockKeys) -> Result<(), LockError> {
        if self.rights.initialized() {
            return Ok(());
        }
        let checked = self
            .rights
            .get_or_try_init(|| async {
                let probes = keys.rights_probes();
                let names = &probes;
                let (connection, within) = self.ordered();
                let _: i64 = connection
                    .request_within(within, |mut conn| async move {
                        RIGHTS.call(names).invoke(&mut conn).await
                    })
                    .await?;
                Ok::<(), LockError>(())
            })
            .await;
        match checked {
            Err(e @ LockError::Refused { .. }) => Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "the rights check failed; made again at the next acquire");
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }

    /// One attempt; `pin` records the connection it went on (see [`Pinned`]).
    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        token: &str,
        ask: &Ask,
        pin: &Pinned,
    ) -> Result<Attempt, LockError> {
        self.rights_checked(keys).await?;
        if ask.shared {
            return self.share(keys, token, ask, pin).await;
        }
        if !ask.fencing && !ask.waiting && !ask.fair {
            return self.try_set(keys, token, ask.ttl_ms, pin).await;
        }
        let ((answer, acked), kind): ((Vec<i64>, _), _) = if ask.fair {
            let fair = acquire::Fair {
                keys,
                token,
                ttl_ms: ask.ttl_ms,
                fencing: ask.fencing,
                join: ask.join,
                claimed: ask.claimed,
                sharded: self.deployment.sharded(),
            };
            (
                self.run_acknowledged(Some(pin), || fair.call()).await?,
                Kind::Fair,
            )
        } else {
            let exclusive = acquire::Exclusive {
                keys,
                token,
                ttl_ms: ask.ttl_ms,
                fencing: ask.fencing,
                join: ask.join,
                marks: self.deployment.marks(),
                claimed: ask.claimed,
            };
            (
                self.run_acknowledged(Some(pin), || exclusive.call()).await?,
                Kind::Plain,
            )
        };
        let attempt = acquire::attempt(&answer, ask.fencing);
        self.unless_replicated(attempt, acked, keys, token, kind).await
    }

    /// One attempt at a share of a read-write lock (share.lua).
    async fn share(
        &self,
        keys: &LockKeys,
        token: &str,
        ask: &Ask,
        pin: &Pinned,
    ) -> Result<Attempt, LockError> {
        let share = Share {
            keys,
            token,
            ttl_ms: ask.ttl_ms,
            fencing: ask.fencing,
            marks: ask.join && self.deployment.marks(),
        };
        let (answer, acked): (Vec<i64>, _) = self.run_acknowledged(Some(pin), || share.call()).await?;
        let attempt = acquire::attempt(&answer, ask.fencing);
        self.unless_replicated(attempt, acked, keys, token, Kind::Shared)
            .await
    }

    /// The cheapest attempt, one command: `SET NX PX … GET` answers the value it found, so a
    /// retried request recognises its own token, and any other value (or another type, which
    /// `GET` refuses with `WRONGTYPE`) is someone else's. It does not learn the holder's ttl.
    async fn try_set(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_ms: u64,
        pin: &Pinned,
    ) -> Result<Attempt, LockError> {
        let set = || {
            let mut set = redis::Cmd::with_capacity(7, keys.lock.len() + token.len() + 40);
            set.arg("SET")
                .arg(&keys.lock)
                .arg(token)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .arg("GET");
            set
        };
        let bound = (&self.conn, self.subscriber.timeouts.response);
        let found: Result<(Option<Vec<u8>>, Option<usize>), LockError> =
            self.acknowledged.set(bound, pin, (&keys.lock, set)).await;
        let held = Attempt::Held {
            pttl_ms: None,
            behind: false,
            claimed: false,
            kept: None,
        };
        let (attempt, acked) = match found {
            Ok((None, acked)) => (Attempt::Acquired { fence: None }, acked),
            Ok((Some(value), _)) if value == token.as_bytes() => {
                // Already ours: sent again after a broken connection, or left by an earlier
                // attempt of this call on a RedLock master. Its expiry must count from this
                // attempt, and a `WAIT` must have a write of this connection to wait for.
                let renewed = self.renew_acknowledged(keys, token, ttl_ms, pin).await?;
                match renewed {
                    (true, acked) => (Attempt::Acquired { fence: None }, acked),
                    (false, _) => return Ok(held),
                }
            }
            Ok((Some(_), _)) => return Ok(held),
            Err(LockError::Unavailable { source }) if is_wrong_type(&source) => return Ok(held),
            Err(e) => return Err(e),
        };
        self.unless_replicated(attempt, acked, keys, token, Kind::Plain)
            .await
    }

    /// Renews one lock on the acquire connection, acknowledged by replicas when they are asked
    /// for: whether it was still ours, and how many acknowledged.
    async fn renew_acknowledged(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_ms: u64,
        pin: &Pinned,
    ) -> Result<(bool, Option<usize>), LockError> {
        let one = [(keys, token, ttl_ms)];
        let (renewed, acked): (Vec<i64>, _) = self.run_acknowledged(Some(pin), || renew::call(&one)).await?;
        Ok((renewed.first().is_some_and(|&r| renew::renewed(r)), acked))
    }

    /// What the renewal found for each lock. With replica acknowledgement asked for, the renew
    /// script is followed by `WAIT` in the same round trip, on the acquire connection (so the
    /// `WAIT` has the renewal's write to wait for; on a Cluster, per slot's primary): a renewal
    /// too few replicas acknowledged is [`Renewal::NotReplicated`], and moves no validity.
    pub(crate) async fn renew_many(
        &self,
        locks: &[(&LockKeys, &str, u64)],
    ) -> Result<Vec<Renewal>, LockError> {
        let groups = self.deployment.by_slot(locks);
        if let [_] = groups.as_slice() {
            return self.renew_together(locks).await;
        }
        self.renew_by_slot(locks, groups).await
    }

    /// On a Cluster one script may only touch keys of one slot: the parts of a batch are sent
    /// at once (each to its slot's primary). Each part is judged on its own: a shard that
    /// failed leaves its locks undecided, not the locks of the shards that renewed theirs; only
    /// when every part failed is the whole renewal an error.
    async fn renew_by_slot(
        &self,
        locks: &[(&LockKeys, &str, u64)],
        groups: Vec<Vec<usize>>,
    ) -> Result<Vec<Renewal>, LockError> {
        let parts = groups.into_iter().map(|indices| async move {
            let part: Vec<_> = indices.iter().map(|&i| locks[i]).collect();
            (self.renew_together(&part).await, indices)
        });
        let mut renewed = vec![Renewal::Undecided; locks.len()];
        let (mut answered, mut failure) = (false, None);
        for (answer, indices) in futures_util::future::join_all(parts).await {
            match answer {
                Ok(answers) => {
                    answered = true;
                    for (i, answer) in indices.into_iter().zip(answers) {
                        renewed[i] = answer;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, locks = indices.len(), "renewal of one slot's locks failed");
                    failure = Some(e);
                }
            }
        }
        match failure {
            Some(e) if !answered => Err(e),
            _ => Ok(renewed),
        }
    }

    /// One renew script for `locks` (of one slot, on a Cluster). With replica acknowledgement
    /// asked for, it is followed by `WAIT` in the same round trip, on the acquire connection
    /// (so the `WAIT` has the renewal's write to wait for).
    async fn renew_together(&self, locks: &[(&LockKeys, &str, u64)]) -> Result<Vec<Renewal>, LockError> {
        let (renewed, acked): (Vec<i64>, _) = self.run_acknowledged(None, || renew::call(locks)).await?;
        Ok(self.acknowledged.renewals(renewed, acked))
    }

    pub(crate) async fn leave_queue(
        &self,
        keys: &LockKeys,
        token: &str,
        claimed: bool,
    ) -> Result<(), LockError> {
        let publish = self.deployment.publish();
        // On the acquire connection, as a release: an attempt abandoned in flight (which may
        // claim) reaches Redis before its withdrawal.
        let (connection, within) = self.ordered();
        connection
            .request_within(within, |mut conn| async move {
                let mut pipe = redis::pipe();
                pipe.zrem(keys.queue(), token)
                    .ignore()
                    .zrem(keys.kept(), token)
                    .ignore()
                    .zrem(keys.writers(), token)
                    .ignore();
                if claimed {
                    // Readers held back by the claim try again (best effort, as in the release
                    // script: without channel rights they wake on their timers).
                    pipe.cmd(publish)
                        .arg(&keys.channel)
                        .arg("claim withdrawn")
                        .ignore();
                }
                pipe.ignore_errors().query_async::<()>(&mut conn).await
            })
            .await
    }

    /// [`Store::release`], after what was sent on the connection `pin` recorded (the
    /// release of an acquire whose answer never came); `quietly`: without waking this client's
    /// own next waiter (a RedLock client releases on every master and wakes it once).
    pub(crate) async fn release_after(
        &self,
        keys: &LockKeys,
        token: &str,
        hold_ms: u64,
        kind: Kind,
        pin: Option<&Pinned>,
        quietly: bool,
    ) -> Result<bool, LockError> {
        let released = match self.give_back(keys, token, hold_ms, kind, pin).await? {
            Released::NotOurs => false,
            // Other readers still share the lock: nobody can enter because this one left.
            Released::ShareLeft => return Ok(true),
            Released::Ours | Released::Unannounced | Released::Undecided => true,
        };
        if released && kind != Kind::Fair && !quietly {
            // This client's own next waiter need not hear it from Redis (its subscriber skips
            // the announcement, which carries this client's id). A fair release names the next
            // waiter instead, wherever it is.
            self.subscriber.wakeups.notify(&keys.channel);
        }
        Ok(released)
    }

    /// Gives the lock back: the common release (`unlock.lua`) first for a plain lock not kept
    /// for a minimum hold, and the full one (`release.lua`) for everything else and whatever
    /// the common one cannot decide ([`Kind::Shared`] is only a hint: a read share given to the
    /// common release is handed on). Never [`Released::Undecided`].
    async fn give_back(
        &self,
        keys: &LockKeys,
        token: &str,
        hold_ms: u64,
        kind: Kind,
        pin: Option<&Pinned>,
    ) -> Result<Released, LockError> {
        let (announcement, marks, sharded) = (
            self.subscriber.announcement.as_str(),
            self.deployment.marks(),
            self.deployment.sharded(),
        );
        // On the acquire connection: a release sent after an acquire whose answer never came
        // (cancelled, timed out) must reach Redis after it.
        let (connection, within) = self.ordered();
        if kind == Kind::Plain && hold_ms == 0 {
            let unlock = &Unlock {
                keys,
                token,
                announcement,
                marks,
                sharded,
            };
            let released: i64 = connection
                .request_after(pin, within, |mut conn| async move {
                    unlock.call().invoke(&mut conn).await
                })
                .await?;
            match Released::from_answer(released) {
                Released::Undecided => {}
                Released::Unannounced => {
                    self.subscriber.pubsub_denied();
                    return Ok(Released::Unannounced);
                }
                released => return Ok(released),
            }
        }
        let release = &Release {
            keys,
            token,
            hold_ms,
            announcement,
            // Only a fair release reads the line (and may take the next holder's fencing
            // token); it always announces, naming the next in line.
            fair: kind == Kind::Fair,
            marks,
            sharded,
        };
        let released: i64 = connection
            .request_after(pin, within, |mut conn| async move {
                release.call().invoke(&mut conn).await
            })
            .await?;
        let released = Released::from_answer(released);
        if released == Released::Unannounced {
            self.subscriber.pubsub_denied();
        }
        Ok(released)
    }

    pub(crate) async fn is_locked(&self, keys: &LockKeys) -> Result<bool, LockError> {
        self.conn
            .request(|mut conn| async move { conn.exists(&keys.lock).await })
            .await
    }

    pub(crate) async fn remaining_ttl(&self, keys: &LockKeys) -> Result<Option<Duration>, LockError> {
        let pttl: i64 = self
            .conn
            .request(|mut conn| async move { conn.pttl(&keys.lock).await })
            .await?;
        Ok(u64::try_from(pttl).ok().map(Duration::from_millis))
    }

    /// The lock's value and remaining life, if the key exists (a value of another type reads as
    /// empty: not a lock of ours).
    pub(crate) async fn holder(
        &self,
        keys: &LockKeys,
    ) -> Result<Option<(Stored, Option<Duration>)>, LockError> {
        let (value, pttl): (Result<Option<Vec<u8>>, ()>, i64) = self
            .conn
            .request(|mut conn| async move {
                let answers: Vec<redis::Value> = redis::pipe()
                    .cmd("GET")
                    .arg(&keys.lock)
                    .cmd("PTTL")
                    .arg(&keys.lock)
                    .ignore_errors()
                    .query_async(&mut conn)
                    .await?;
                let mut answers = answers.into_iter();
                let value = answers
                    .next()
                    .and_then(|v| v.extract_error().ok())
                    .map_or(Err(()), |v| Option::<Vec<u8>>::from_redis_value(v).map_err(drop));
                let pttl = answers.next().map_or(Ok(-2), |v| {
                    i64::from_redis_value(v.extract_error()?).map_err(redis::RedisError::from)
                })?;
                Ok((value, pttl))
            })
            .await?;
        let life = u64::try_from(pttl).ok().map(Duration::from_millis);
        Ok(match value {
            Ok(Some(value)) => Some((Stored::One(value), life)),
            Ok(None) => None,
            Err(()) if pttl != -2 => Some((self.shares(keys).await?, life)),
            Err(()) => None,
        })
    }

    /// A key that is not a string: a read-write lock's readers (their live shares), or a value
    /// this library did not write (read as empty).
    async fn shares(&self, keys: &LockKeys) -> Result<Stored, LockError> {
        let (fields, time): (redis::Value, (u64, u64)) = self
            .conn
            .request(|mut conn| async move {
                redis::pipe()
                    .cmd("HGETALL")
                    .arg(&keys.lock)
                    .cmd("TIME")
                    .ignore_errors()
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        let now_ms = time.0 * 1000 + time.1 / 1000;
        let Ok(fields) = Vec::<(Vec<u8>, Vec<u8>)>::from_redis_value(fields) else {
            return Ok(Stored::One(Vec::new()));
        };
        if !fields.iter().any(|(f, v)| f == b"mode" && v == b"read") {
            return Ok(Stored::One(Vec::new()));
        }
        let mut readers: Vec<Vec<u8>> = fields
            .into_iter()
            .filter(|(field, expiry)| {
                field != b"mode"
                    && std::str::from_utf8(expiry)
                        .ok()
                        .and_then(|e| e.parse::<u64>().ok())
                        .is_some_and(|e| e > now_ms)
            })
            .map(|(field, _)| field)
            .collect();
        readers.sort_unstable();
        Ok(Stored::Shares(readers))
    }

    pub(crate) async fn force_release(&self, keys: &LockKeys) -> Result<bool, LockError> {
        let marks = self.deployment.marks();
        let (deleted,): (i64,) = self
            .conn
            .request(|mut conn| async move {
                let mut pipe = redis::pipe();
                pipe.del(&keys.lock);
                if marks {
                    // Its waiting mark goes with it (the announcement below is unconditional).
                    pipe.del(keys.waiting()).ignore();
                }
                pipe.query_async(&mut conn).await
            })
            .await?;
        if deleted == 1 {
            // Best effort, as in the release script: a user without channel rights still
            // deletes, and waiters then wake on their timers.
            let publish = self.deployment.publish();
            let told: Result<i64, LockError> = self
                .conn
                .request(|mut conn| async move {
                    redis::cmd(publish)
                        .arg(&keys.channel)
                        .arg("released")
                        .query_async(&mut conn)
                        .await
                })
                .await;
            if matches!(told, Err(LockError::Refused { .. })) {
                self.subscriber.pubsub_denied();
            }
        }
        Ok(deleted == 1)
    }

    pub(crate) fn wakeups(&self) -> &Arc<Wakeups> {
        &self.subscriber.wakeups
    }

    pub(crate) fn response_timeout(&self) -> Duration {
        self.subscriber.timeouts.response
    }

    pub(crate) async fn listen(&self, registration: &Registration) {
        let channel = registration.channel();
        if self.subscriber.listening(channel) {
            return;
        }
        // As a task of its own: a waiter that must ask again before its place lapses stops
        // waiting for a slow subscription, which goes on.
        let _ = self.listen_detached(channel).await;
    }

    /// [`listen`](Self::listen) as a task of its own, which goes on if the caller stops waiting
    /// for it (a RedLock master slow to subscribe must not hold up the others).
    pub(crate) fn listen_detached(&self, channel: &str) -> tokio::task::JoinHandle<()> {
        let (subscriber, channel) = (Arc::clone(&self.subscriber), channel.to_owned());
        tokio::spawn(async move { subscriber.listen(&channel).await })
    }
}

impl Store for RedisBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // A lock handed over by a fair release was not acknowledged by replicas: with
            // replica acknowledgement, the waiter asks, and its attempt is.
            hand_over: !self.acknowledged.waits(),
            ..Capabilities::ALL
        }
    }

    fn connect<'a>(&'a self, probe: &'a LockKeys) -> Answer<'a, ()> {
        Box::pin(RedisBackend::connect(self, probe))
    }

    fn attempt<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ask: &'a Ask,
        pin: &'a Pinned,
    ) -> Answer<'a, Attempt> {
        Box::pin(self.acquire(keys, token, ask, pin))
    }

    fn renew_many<'a>(&'a self, locks: &'a [(&'a LockKeys, &'a str, u64)]) -> Answer<'a, Vec<Renewal>> {
        Box::pin(RedisBackend::renew_many(self, locks))
    }

    fn release<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        hold_ms: u64,
        kind: Kind,
        after: Option<&'a Pinned>,
    ) -> Answer<'a, bool> {
        Box::pin(self.release_after(keys, token, hold_ms, kind, after, false))
    }

    fn leave_queue<'a>(&'a self, keys: &'a LockKeys, token: &'a str, claimed: bool) -> Answer<'a, ()> {
        Box::pin(RedisBackend::leave_queue(self, keys, token, claimed))
    }

    fn holder<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, Option<(Stored, Option<Duration>)>> {
        Box::pin(RedisBackend::holder(self, keys))
    }

    fn is_locked<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, bool> {
        Box::pin(RedisBackend::is_locked(self, keys))
    }

    fn remaining_ttl<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, Option<Duration>> {
        Box::pin(RedisBackend::remaining_ttl(self, keys))
    }

    fn force_release<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, bool> {
        Box::pin(RedisBackend::force_release(self, keys))
    }

    fn response_timeout(&self) -> Duration {
        RedisBackend::response_timeout(self)
    }

    fn wakeups(&self) -> &Arc<Wakeups> {
        RedisBackend::wakeups(self)
    }

    fn listen<'a>(
        &'a self,
        registration: &'a Registration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        Box::pin(RedisBackend::listen(self, registration))
    }
}

impl Drop for RedisBackend {
    fn drop(&mut self) {
        self.subscriber.stop();
    }
}

fn is_wrong_type(e: &crate::BoxError) -> bool {
    e.downcast_ref::<redis::RedisError>()
        .is_some_and(|e| e.code() == Some("WRONGTYPE"))
}
