//! Redis, however deployed (one server, a Sentinel-managed primary, a Cluster): a request
//! connection shared by every lock of the client, the lock scripts, replica acknowledgement
//! ([`replicas`](super::replicas)), and one shared subscriber connection for wake-ups
//! ([`subscriber`](super::subscriber)); what the deployment changes is its
//! [`Deployment`]'s to say.

use std::sync::Arc;
use std::time::Duration;

use redis::FromRedisValue;

use self::connection::Connection;
use self::deployment::Deployment;
use self::replicas::Acknowledged;
use self::scripts::acquire;
use self::scripts::release::{Admitted, ReleaseAnswer};
use self::scripts::{renew, Call, Caller, RIGHTS, SET};
use self::servers::Servers;
use self::subscriber::Subscriber;
use crate::store::{
    Ask, Asked, Attempt, Capabilities, Flight, Kind, Lock, Release, Released, Renewal, Renewing, SetAsk,
    SetAttempt, Settings, Store, Waking,
};
use crate::LockError;

mod admin;
#[cfg(feature = "cluster")]
mod cluster;
pub(crate) mod config;
pub(crate) mod connection;
mod deployment;
mod errors;
pub mod keys;
mod replicas;
pub(crate) mod scripts;
#[cfg(feature = "sentinel")]
mod sentinel;
pub(crate) mod servers;
mod subscriber;
pub(crate) mod urls;

/// Locks in Redis: one server, a Sentinel-managed primary, or a Cluster.
#[derive(Debug)]
pub(crate) struct RedisStore {
    conn: Connection,
    acknowledged: Acknowledged,
    subscriber: Arc<Subscriber>,
    deployment: Deployment,
    /// Every lock key starts with it.
    prefix: String,
    /// Set once the rights check (`rights.lua`) passed: before the first lock, never at a release.
    rights: tokio::sync::OnceCell<()>,
}

impl RedisStore {
    /// A store that connects on first use; what its subscriber hears goes to the settings'
    /// notices (a RedLock master's, to its own listener's).
    pub(crate) fn new(servers: Servers, settings: Settings) -> Self {
        let Settings {
            prefix,
            timeouts,
            replicas,
            notices,
            ..
        } = settings;
        let deployment = Deployment::of(&servers);
        let conn = Connection::new(servers.clone(), timeouts);
        let subscriber = Arc::new(Subscriber::new(
            servers.clone(),
            timeouts,
            notices,
            conn.switched(),
        ));
        RedisStore {
            acknowledged: Acknowledged::new(replicas, &servers, timeouts),
            conn,
            subscriber,
            deployment,
            prefix,
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
        flight: Option<&Flight>,
        call: impl Fn() -> Call,
    ) -> Result<(T, Option<usize>), LockError> {
        let bound = (&self.conn, self.subscriber.timeouts.response);
        self.acknowledged.run(bound, flight, call).await
    }

    /// An acquire that took the lock but that too few replicas acknowledged: gives the lock back
    /// (token-checked, waking the next waiter) and says so.
    async fn unless_replicated(
        &self,
        attempt: Attempt,
        acked: Option<usize>,
        lock: &str,
        token: &str,
        kind: Kind,
    ) -> Result<Attempt, LockError> {
        let (Attempt::Acquired { .. }, Some((acked, wanted))) = (attempt, self.acknowledged.too_few(acked))
        else {
            return Ok(attempt);
        };
        tracing::warn!(
            redis_key = lock,
            acked,
            wanted,
            "too few replicas acknowledged the acquire; giving the lock back"
        );
        // Boxed: a rare path, kept out of every acquire's future.
        if let Err(e) = Box::pin(self.give_back(
            self.caller(lock, token),
            Release {
                hold_ms: 0,
                kind,
                after: None,
            },
        ))
        .await
        {
            tracing::warn!(redis_key = lock, error = %e, "giving back an unreplicated lock failed; it will expire");
        }
        Ok(Attempt::NotReplicated { acked, wanted })
    }

    /// Opens the request connection now, and checks the client's rights (see `rights.lua`): a
    /// server that is down or refuses us fails here, and the acquires of a client built this
    /// way find the rights checked already.
    pub(crate) async fn connect(&self) -> Result<(), LockError> {
        self.conn.ensure_open().await?;
        self.acknowledged.ensure_open().await?;
        self.rights_checked().await
    }

    /// Checks once, before this client's first lock, that its user may run everything the
    /// protocol runs (`Refused` naming the command it may not), on keys under the prefix, where
    /// the user's key rights are. A check that fails for another reason (Redis down, a Cluster
    /// slot migrating: a script naming keys that do not exist there is refused with `TRYAGAIN`
    /// until it ends) does not hold the acquire up: it is made again at the next one.
    async fn rights_checked(&self) -> Result<(), LockError> {
        if self.rights.initialized() {
            return Ok(());
        }
        let checked = self
            .rights
            .get_or_try_init(|| async {
                let probes = keys::rights_probes(&self.prefix);
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

    /// One attempt; `flight` records the connection it went on.
    pub(crate) async fn acquire(
        &self,
        caller: Caller<'_>,
        ask: &Ask,
        flight: &Flight,
    ) -> Result<Attempt, LockError> {
        let Caller { lock, token, .. } = caller;
        self.rights_checked().await?;
        if ask.mode.semaphore() {
            return self.permit(caller, ask, flight).await;
        }
        if ask.mode.shared() {
            return self.share(caller, ask, flight).await;
        }
        if !ask.fencing && !ask.waiting && !ask.mode.fair() {
            return self.try_set(caller, ask.ttl_ms, flight).await;
        }
        let ((answer, acked), kind): ((Vec<i64>, _), _) = if ask.mode.fair() {
            (
                self.run_acknowledged(Some(flight), || caller.fair(ask)).await?,
                Kind::Fair,
            )
        } else {
            (
                self.run_acknowledged(Some(flight), || caller.exclusive(ask))
                    .await?,
                Kind::Plain,
            )
        };
        if let [2, held, ..] = answer[..] {
            return Err(self.permits_differ(lock, u32::try_from(held).unwrap_or_default(), 1));
        }
        let attempt = acquire::attempt(&answer, ask.fencing);
        self.unless_replicated(attempt, acked, lock, token, kind).await
    }

    /// What every attempt and release script is called with: `token` at `lock`, on this
    /// deployment.
    pub(crate) fn caller<'a>(&self, lock: &'a str, token: &'a str) -> Caller<'a> {
        Caller {
            lock,
            token,
            deployment: self.deployment,
        }
    }

    /// One attempt at any free permit of a semaphore (permit.lua).
    async fn permit(&self, caller: Caller<'_>, ask: &Ask, flight: &Flight) -> Result<Attempt, LockError> {
        let Caller { lock, token, .. } = caller;
        let (answer, acked): (Vec<i64>, _) =
            self.run_acknowledged(Some(flight), || caller.permit(ask)).await?;
        let attempt = scripts::permit::attempt(&answer, ask.fencing, ask.mode.permits())
            .map_err(|held| self.permits_differ(lock, held, ask.mode.permits()))?;
        self.unless_replicated(attempt, acked, lock, token, Kind::Permit)
            .await
    }

    /// The refusal of an acquire that asked `asked` permits of the lock at `lock`, held with
    /// `held`.
    fn permits_differ(&self, lock: &str, held: u32, asked: u32) -> LockError {
        let key = crate::store::user_key(&self.prefix, lock).unwrap_or(lock);
        crate::store::permits_differ(key, held, asked)
    }

    /// A lock attempt refused by a hash at the key: a semaphore's, whose count this attempt
    /// (one permit) does not match, or anything else (the refusal stands).
    async fn unless_semaphore(&self, lock: &str, attempt: Attempt) -> Result<Attempt, LockError> {
        if !matches!(attempt, Attempt::Held { .. }) {
            return Ok(attempt);
        }
        let (connection, within) = self.ordered();
        let fields: Result<Vec<Option<String>>, LockError> = connection
            .request_within(within, |mut conn| async move {
                redis::pipe()
                    .hget(lock, "mode")
                    .hget(lock, "permits")
                    .query_async(&mut conn)
                    .await
            })
            .await;
        match fields.as_deref() {
            Ok([Some(mode), Some(count)]) if mode == "permits" => {
                Err(self.permits_differ(lock, count.parse().unwrap_or_default(), 1))
            }
            _ => Ok(attempt),
        }
    }

    /// One attempt at a share of a read-write lock (share.lua).
    async fn share(&self, caller: Caller<'_>, ask: &Ask, flight: &Flight) -> Result<Attempt, LockError> {
        let Caller { lock, token, .. } = caller;
        let (answer, acked): (Vec<i64>, _) =
            self.run_acknowledged(Some(flight), || caller.share(ask)).await?;
        if let [2, held, ..] = answer[..] {
            return Err(self.permits_differ(lock, u32::try_from(held).unwrap_or_default(), 1));
        }
        let attempt = acquire::attempt(&answer, ask.fencing);
        self.unless_replicated(attempt, acked, lock, token, Kind::Shared)
            .await
    }

    /// The cheapest attempt, one command: `SET NX PX … GET` answers the value it found, so a
    /// retried request recognises its own token, and any other value (or another type, which
    /// `GET` refuses with `WRONGTYPE`) is someone else's. It does not learn the holder's ttl.
    async fn try_set(&self, caller: Caller<'_>, ttl_ms: u64, flight: &Flight) -> Result<Attempt, LockError> {
        let Caller { lock, token, .. } = caller;
        let set = || {
            let mut set = redis::Cmd::with_capacity(7, lock.len() + token.len() + 40);
            set.arg("SET")
                .arg(lock)
                .arg(token)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .arg("GET");
            set
        };
        let bound = (&self.conn, self.subscriber.timeouts.response);
        let found: Result<(Option<Vec<u8>>, Option<usize>), LockError> =
            self.acknowledged.set(bound, flight, (lock, set)).await;
        let (attempt, acked) = match found {
            Ok((None, acked)) => (Attempt::acquired(None), acked),
            Ok((Some(value), _)) if value == token.as_bytes() => {
                // Already ours: sent again after a broken connection, or left by an earlier
                // attempt of this call on a RedLock master. Its expiry must count from this
                // attempt, and a `WAIT` must have a write of this connection to wait for.
                let renewed = self.renew_acknowledged(lock, token, ttl_ms, flight).await?;
                match renewed {
                    (true, acked) => (Attempt::acquired(None), acked),
                    (false, _) => return Ok(Attempt::HELD),
                }
            }
            Ok((Some(_), _)) => return Ok(Attempt::HELD),
            Err(LockError::Unavailable { source }) if errors::is_wrong_type(&source) => {
                // A hash: a read-write lock's readers, or a semaphore's holders.
                return Box::pin(self.unless_semaphore(lock, Attempt::HELD)).await;
            }
            Err(e) => return Err(e),
        };
        self.unless_replicated(attempt, acked, lock, token, Kind::Plain)
            .await
    }

    /// Renews one lock on the acquire connection, acknowledged by replicas when they are asked
    /// for: whether it was still ours, and how many acknowledged.
    async fn renew_acknowledged(
        &self,
        lock: &str,
        token: &str,
        ttl_ms: u64,
        flight: &Flight,
    ) -> Result<(bool, Option<usize>), LockError> {
        let (renewed, acked): (Vec<i64>, _) = self
            .run_acknowledged(Some(flight), || renew::call_by_name(&[(lock, token, ttl_ms)]))
            .await?;
        Ok((renewed.first().is_some_and(|&r| renew::renewed(r)), acked))
    }

    /// What the renewal found for each lock. With replica acknowledgement asked for, the renew
    /// script is followed by `WAIT` in the same round trip, on the acquire connection (so the
    /// `WAIT` has the renewal's write to wait for; on a Cluster, per slot's primary): a renewal
    /// too few replicas acknowledged is [`Renewal::NotReplicated`], and moves no validity.
    pub(crate) async fn renew_many(&self, locks: &[Renewing<'_>]) -> Result<Vec<Renewal>, LockError> {
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
        locks: &[Renewing<'_>],
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
    async fn renew_together(&self, locks: &[Renewing<'_>]) -> Result<Vec<Renewal>, LockError> {
        let (renewed, acked): (Vec<i64>, _) = self.run_acknowledged(None, || renew::call(locks)).await?;
        Ok(self.acknowledged.renewals(renewed, acked))
    }

    pub(crate) async fn leave_queue(&self, lock: &str, token: &str, claimed: bool) -> Result<(), LockError> {
        let publish = self.deployment.publish();
        // On the acquire connection, as a release: an attempt abandoned in flight (which may
        // claim) reaches Redis before its withdrawal.
        let (connection, within) = self.ordered();
        connection
            .request_within(within, |mut conn| async move {
                let mut pipe = redis::pipe();
                pipe.zrem(keys::queue(lock), token)
                    .ignore()
                    .zrem(keys::kept(lock), token)
                    .ignore()
                    .zrem(keys::permits_queue(lock), token)
                    .ignore()
                    .zrem(keys::permits_kept(lock), token)
                    .ignore()
                    .zrem(keys::writers(lock), token)
                    .ignore();
                if claimed {
                    // Readers held back by the claim try again (best effort, as in the release
                    // script: without channel rights they wake on their timers).
                    pipe.cmd(publish)
                        .arg(keys::channel(lock))
                        .arg("claim withdrawn")
                        .ignore();
                }
                pipe.ignore_errors().query_async::<()>(&mut conn).await
            })
            .await
    }

    /// Gives the lock back (after what was sent on the connection `after` recorded: the release
    /// of an acquire whose answer never came). A RedLock client releases on each master so.
    pub(crate) async fn release_lock(
        &self,
        caller: Caller<'_>,
        release: Release<'_>,
    ) -> Result<Released, LockError> {
        let kind = release.kind;
        let (answer, admitted) = self.give_back(caller, release).await?;
        Ok(match answer {
            ReleaseAnswer::NotOurs => Released::NotOurs,
            // Other readers still share the lock: nobody can enter because this one left.
            ReleaseAnswer::ShareLeft => Released::Quiet,
            // A fair release named the next waiter, wherever it is.
            _ if kind == Kind::Fair => Released::Quiet,
            // A fair semaphore's hands its permit to the head of the line: this client hands it
            // at once if the waiter is its own (the announcement reaches the others).
            ReleaseAnswer::HandedOver => match admitted {
                Some(Admitted { token, handed }) => Released::HandedOver(token, handed),
                None => Released::Quiet,
            },
            ReleaseAnswer::Ours | ReleaseAnswer::Unannounced | ReleaseAnswer::Undecided => Released::Freed,
        })
    }

    /// Gives the lock back: the common release (`unlock.lua`) first for a plain lock not kept
    /// for a minimum hold, and the full one (`release.lua`) for everything else and whatever
    /// the common one cannot decide ([`Kind::Shared`] is only a hint: a read share given to the
    /// common release is handed on). Never [`ReleaseAnswer::Undecided`]. With
    /// [`ReleaseAnswer::HandedOver`], the waiter named.
    async fn give_back(
        &self,
        caller: Caller<'_>,
        release: Release<'_>,
    ) -> Result<(ReleaseAnswer, Option<Admitted>), LockError> {
        let Release { hold_ms, kind, after } = release;
        let announcement = self.subscriber.announcement.as_str();
        // On the acquire connection: a release sent after an acquire whose answer never came
        // (cancelled, timed out) must reach Redis after it.
        let (connection, within) = self.ordered();
        if kind == Kind::Plain && hold_ms == 0 {
            let released: i64 = connection
                .request_after(after, within, |mut conn| async move {
                    caller.unlock(announcement).invoke(&mut conn).await
                })
                .await?;
            match ReleaseAnswer::from_answer(released) {
                ReleaseAnswer::Undecided => {}
                ReleaseAnswer::Unannounced => {
                    self.subscriber.pubsub_denied();
                    return Ok((ReleaseAnswer::Unannounced, None));
                }
                released => return Ok((released, None)),
            }
        }
        // Only a fair release reads the line (and may take the next holder's fencing token);
        // it always announces, naming the next in line.
        let released: redis::Value = connection
            .request_after(after, within, |mut conn| async move {
                caller
                    .release(announcement, hold_ms, kind)
                    .invoke(&mut conn)
                    .await
            })
            .await?;
        let (released, admitted) = ReleaseAnswer::read(&released);
        if released == ReleaseAnswer::Unannounced {
            self.subscriber.pubsub_denied();
        }
        Ok((released, admitted))
    }

    /// Subscribes the channel of lock `name` unless it is already (the caller bounds the wait).
    pub(crate) async fn listen_to(&self, name: &str) {
        if self.subscriber.listening(name) {
            return;
        }
        // As a task of its own: a waiter that must ask again before its place lapses stops
        // waiting for a slow subscription, which goes on.
        let _ = self.listen_detached(name).await;
    }

    /// [`listen_to`](Self::listen_to) as a task of its own, which goes on if the caller stops
    /// waiting for it (a RedLock master slow to subscribe must not hold up the others).
    pub(crate) fn listen_detached(&self, name: &str) -> tokio::task::JoinHandle<()> {
        let (subscriber, name) = (Arc::clone(&self.subscriber), name.to_owned());
        tokio::spawn(async move { subscriber.listen(&name).await })
    }

    /// Nobody waits for lock `name` any more: its channel may go.
    pub(crate) fn unlisten_to(&self, name: &str) {
        self.subscriber.unlisten(name);
    }
}

impl Store for RedisStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // A lock handed over by a fair release was not acknowledged by replicas: with
            // replica acknowledgement, the waiter asks, and its attempt is.
            waking: Waking::Announced {
                hands_over: !self.acknowledged.waits(),
            },
            ..Capabilities::ALL
        }
    }

    fn name(&self, key: &str) -> String {
        keys::name(&self.prefix, key)
    }

    async fn connect(&self) -> Result<(), LockError> {
        RedisStore::connect(self).await
    }

    async fn attempt(&self, asked: Asked<'_>, flight: &Flight) -> Result<Attempt, LockError> {
        let Asked { lock, token, ask } = asked;
        self.acquire(self.caller(lock.name(), token), ask, flight).await
    }

    /// Every lock of a set, all or none, in one script (`set.lua`): where the deployment can
    /// (one server or primary; a Cluster when the keys share a slot) and no replica must
    /// acknowledge it (a set too few replicas acknowledged is taken one by one instead).
    async fn attempt_set(&self, set: SetAsk<'_>, flight: &Flight) -> Result<Option<SetAttempt>, LockError> {
        let SetAsk { locks, tokens, ask } = set;
        if self.acknowledged.waits() {
            return Ok(None);
        }
        let renewing: Vec<Renewing<'_>> = locks
            .iter()
            .zip(tokens)
            .map(|(l, token)| (l, token.as_str(), ask.ttl_ms))
            .collect();
        if self.deployment.by_slot(&renewing).len() != 1 {
            return Ok(None);
        }
        self.rights_checked().await?;
        let mut keys: Vec<String> = locks.iter().map(|l| l.name().to_owned()).collect();
        if ask.fencing {
            keys.extend(locks.iter().map(|l| keys::fence(l.name())));
        }
        let call = || {
            let mut call = SET.call(&keys);
            call.arg(ask.ttl_ms).arg(if ask.fencing { "1" } else { "0" });
            for token in tokens {
                call.arg(token);
            }
            call
        };
        let (answer, _): (Vec<i64>, _) = self.run_acknowledged(Some(flight), call).await?;
        Ok(Some(match answer.first() {
            Some(1) => SetAttempt::taken(
                answer[1..]
                    .iter()
                    .map(|&f| ask.fencing.then_some(f.unsigned_abs()))
                    .collect(),
            ),
            _ => {
                let at = answer
                    .get(1)
                    .and_then(|&i| usize::try_from(i - 1).ok())
                    .unwrap_or(0);
                // A semaphore's key: refused as a single lock's try is.
                let held = answer.get(3).and_then(|&n| u32::try_from(n).ok());
                if let (Some(held @ 1..), Some(lock)) = (held, locks.get(at)) {
                    return Err(crate::store::permits_differ(lock.key(), held, 1));
                }
                SetAttempt::Refused {
                    at,
                    pttl_ms: answer.get(2).and_then(|&ms| u64::try_from(ms).ok()),
                }
            }
        }))
    }

    async fn renew(&self, locks: &[Renewing<'_>]) -> Result<Vec<Renewal>, LockError> {
        self.renew_many(locks).await
    }

    async fn release(&self, lock: &Lock, token: &str, release: Release<'_>) -> Result<Released, LockError> {
        self.release_lock(self.caller(lock.name(), token), release).await
    }

    async fn leave(&self, lock: &Lock, token: &str, claimed: bool) -> Result<(), LockError> {
        self.leave_queue(lock.name(), token, claimed).await
    }

    async fn listen(&self, lock: &Lock) {
        self.listen_to(lock.name()).await;
    }

    fn unlisten(&self, name: &str) {
        self.unlisten_to(name);
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        self.subscriber.stop();
    }
}
