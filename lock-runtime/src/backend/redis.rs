//! Redis, however deployed (one server, a Sentinel-managed primary, a Cluster): a request
//! connection shared by every lock of the client, the three scripts, replica acknowledgement,
//! and one shared subscriber connection for wake-ups (sharded pub/sub on a Cluster).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::{AsyncCommands, FromRedisValue, RedisResult};
use tokio::sync::{mpsc, Mutex};
use tokio::time::Instant;

use super::connection::{lock, Connection, Pinned, Place, Timeouts};
use super::scripts::{Call, Lua, ACQUIRE, RELEASE, RENEW, RIGHTS, SHARE, UNLOCK};
use super::{Ask, Attempt, Kind, LockKeys, Renewal, Stored};
use crate::background::Background;
use crate::error::TimedOut;
use crate::options::{ceil_millis, FAIR_PLACE_KEPT};
use crate::wakeups::{HandedOver, Registration, Wakeups};
use crate::LockError;

/// What the release script answers when it released the lock but Redis refused to let it
/// announce the release (an ACL without rights on the channel).
const RELEASED_UNANNOUNCED: i64 = 2;
/// What the release script answers when it gave back a share of a read-write lock that other
/// readers still share: nothing was announced, since nobody can enter because of it.
const SHARE_LEFT: i64 = 3;
/// unlock.lua's answer when release.lua must decide (another type at the key, or our token
/// marked released).
const NOT_PLAIN: i64 = -1;

/// A fair release's hand-over, `g:<fence>:<kept>:<token>`: the fencing token taken for the
/// waiter (0: none, the key has no counter), the stamp of the place it was handed over for, and
/// the waiter's token.
fn handed_over(said: &[u8]) -> Option<(HandedOver, &[u8])> {
    let mut parts = said.strip_prefix(b"g:")?.splitn(3, |&b| b == b':');
    let mut number = || -> Option<u64> { std::str::from_utf8(parts.next()?).ok()?.parse().ok() };
    let (fence, kept) = (number()?, number()?);
    Some((HandedOver { fence, kept }, parts.next()?))
}

/// How many replicas must acknowledge an acquire, and how long the primary waits for them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replicas {
    pub(crate) wanted: usize,
    pub(crate) timeout: Duration,
}

#[derive(Debug)]
pub(crate) struct RedisBackend {
    conn: Connection,
    /// With replica acknowledgement: the connection acquires (each followed by `WAIT`, which
    /// holds up everything behind it on its connection) and releases (which must follow an
    /// acquire they may undo) go on, so that renewals, which keep locks valid, never wait for
    /// replicas.
    acked: Option<Connection>,
    subscriber: Arc<Subscriber>,
    replicas: Option<Replicas>,
    /// A Cluster: releases announce with `SPUBLISH`, on the lock's shard.
    sharded: bool,
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
        #[cfg(feature = "cluster")]
        let sharded = matches!(place, Place::Cluster(_));
        #[cfg(not(feature = "cluster"))]
        let sharded = false;
        let conn = Connection::new(place.clone(), timeouts);
        let subscriber = Arc::new(Subscriber::new(
            place.clone(),
            timeouts,
            wakeups,
            listener,
            (idle, conn.switched()),
        ));
        RedisBackend {
            acked: replicas.map(|_| Connection::new(place, timeouts)),
            conn,
            subscriber,
            replicas,
            sharded,
            rights: tokio::sync::OnceCell::new(),
        }
    }

    /// Whether every acquire is acknowledged by replicas.
    pub(crate) fn waits_for_replicas(&self) -> bool {
        self.replicas.is_some()
    }

    /// The connection for acquires and releases, and how long a request on it may take (with
    /// replica acknowledgement, a `WAIT` may be queued ahead; a script unknown to the node costs
    /// a second round with its own `WAIT`).
    fn ordered(&self) -> (&Connection, Duration) {
        match (&self.acked, self.replicas) {
            (Some(acked), Some(replicas)) => {
                (acked, self.subscriber.timeouts.response + 2 * replicas.timeout)
            }
            _ => (&self.conn, self.subscriber.timeouts.response),
        }
    }

    /// Sends `call`; with replica acknowledgement asked for, followed by `WAIT` in the same
    /// round trip: the answer and whether enough replicas acknowledged it.
    async fn run_acknowledged<T: FromRedisValue + Send>(
        &self,
        pin: Option<&Pinned>,
        call: impl Fn() -> Call,
    ) -> Result<(T, Option<usize>), LockError> {
        let call = &call;
        let (connection, within) = self.ordered();
        match self.replicas {
            None => {
                let answer = connection
                    .request_pinned(
                        pin,
                        within,
                        |mut conn| async move { call().invoke(&mut conn).await },
                    )
                    .await?;
                Ok((answer, None))
            }
            Some(replicas) => {
                let (answer, acked) = connection
                    .request_pinned(pin, within, |mut conn| async move {
                        call()
                            .invoke_then_wait(&mut conn, replicas.wanted, replicas.timeout)
                            .await
                    })
                    .await?;
                Ok((answer, Some(acked)))
            }
        }
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
        let (Attempt::Acquired { .. }, Some(acked), Some(replicas)) = (attempt, acked, self.replicas) else {
            return Ok(attempt);
        };
        if acked >= replicas.wanted {
            return Ok(attempt);
        }
        tracing::warn!(
            redis_key = %keys.lock,
            acked,
            wanted = replicas.wanted,
            "too few replicas acknowledged the acquire; giving the lock back"
        );
        // Boxed: a rare path, kept out of every acquire's future.
        if let Err(e) = Box::pin(self.release(keys, token, 0, kind)).await {
            tracing::warn!(redis_key = %keys.lock, error = %e, "giving back an unreplicated lock failed; it will expire");
        }
        Ok(Attempt::NotReplicated {
            acked,
            wanted: replicas.wanted,
        })
    }

    /// Opens the request connection now, and checks the client's rights on `probe`'s keys (see
    /// `rights.lua`): a server that is down or refuses us fails here, and the acquires of a
    /// client built this way find the rights checked already.
    pub(crate) async fn connect(&self, probe: &LockKeys) -> Result<(), LockError> {
        self.conn.ensure_open().await?;
        if let Some(acked) = &self.acked {
            acked.ensure_open().await?;
        }
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
                let probe = format!("{}:rights", keys.lock);
                let names = [format!("{probe}:z"), format!("{probe}:h")];
                let names = [probe.as_str(), names[0].as_str(), names[1].as_str()];
                let (connection, within) = self.ordered();
                let _: i64 = connection
                    .request_within(within, |mut conn| async move {
                        RIGHTS.call(&names).invoke(&mut conn).await
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
        let place_kept = if ask.fair {
            ceil_millis(FAIR_PLACE_KEPT).to_string()
        } else {
            String::new()
        };
        let (place_kept, sharded) = (&place_kept, self.sharded);
        let (answer, acked): (Vec<i64>, _) = self
            .run_acknowledged(Some(pin), || {
                let mut named = vec![keys.lock.clone()];
                if ask.fencing || ask.fair {
                    named.push(keys.fence());
                }
                if ask.fair {
                    named.extend([keys.queue(), keys.kept()]);
                }
                // A caller that will wait may claim the writers' turn of a read-write lock, and
                // marks the lock as waited for when refused (after the writers' key; a fair
                // one need not: a fair release always announces).
                let writers = if ask.join {
                    named.push(keys.writers());
                    let at = named.len().to_string();
                    if !sharded && !ask.fair {
                        named.push(keys.waiting());
                    }
                    at
                } else {
                    String::new()
                };
                let mut call = ACQUIRE.call(&named);
                call.arg(token)
                    .arg(ask.ttl_ms)
                    .arg(if ask.fencing { "1" } else { "0" })
                    .arg(place_kept)
                    .arg(if ask.join { "1" } else { "0" })
                    .arg(&keys.channel)
                    .arg(if sharded { "1" } else { "0" });
                if ask.join {
                    call.arg(writers)
                        .arg(ceil_millis(FAIR_PLACE_KEPT))
                        .arg(if ask.claimed { "1" } else { "0" });
                }
                call
            })
            .await?;
        let (taken, n) = (
            answer.first().copied().unwrap_or(0),
            answer.get(1).copied().unwrap_or(-1),
        );
        let attempt = if taken == 1 {
            Attempt::Acquired {
                fence: ask.fencing.then_some(n.unsigned_abs()),
            }
        } else {
            Attempt::Held {
                pttl_ms: u64::try_from(n).ok(),
                behind: answer.get(2).is_some_and(|&ahead| ahead > 0),
                claimed: answer.get(3) == Some(&1),
                kept: answer
                    .get(4)
                    .and_then(|&kept| u64::try_from(kept).ok())
                    .filter(|&kept| kept > 0),
            }
        };
        self.unless_replicated(attempt, acked, keys, token, Kind::of(ask.fair, false))
            .await
    }

    /// One attempt at a share of a read-write lock (share.lua).
    async fn share(
        &self,
        keys: &LockKeys,
        token: &str,
        ask: &Ask,
        pin: &Pinned,
    ) -> Result<Attempt, LockError> {
        let (answer, acked): (Vec<i64>, _) = self
            .run_acknowledged(Some(pin), || {
                let mut named = vec![keys.lock.clone(), keys.writers()];
                if ask.fencing {
                    named.push(keys.fence());
                }
                // A reader that will wait marks the lock as waited for when refused.
                let mark = if ask.join && !self.sharded {
                    named.push(keys.waiting());
                    named.len().to_string()
                } else {
                    String::new()
                };
                let mut call = SHARE.call(&named);
                call.arg(token)
                    .arg(ask.ttl_ms)
                    .arg(if ask.fencing { "1" } else { "0" })
                    .arg(mark);
                call
            })
            .await?;
        let n = answer.get(1).copied().unwrap_or(-1);
        let attempt = if answer.first() == Some(&1) {
            Attempt::Acquired {
                fence: ask.fencing.then_some(n.unsigned_abs()),
            }
        } else {
            Attempt::Held {
                pttl_ms: u64::try_from(n).ok(),
                behind: false,
                claimed: false,
                kept: None,
            }
        };
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
        let set = &set;
        let (connection, within) = self.ordered();
        let found: Result<(Option<Vec<u8>>, Option<usize>), LockError> = match self.replicas {
            None => connection
                .request_pinned(Some(pin), within, |mut conn| async move {
                    set().query_async(&mut conn).await
                })
                .await
                .map(|found| (found, None)),
            Some(replicas) => connection
                .request_pinned(Some(pin), within, |mut conn| async move {
                    conn.then_wait(set(), keys.lock.as_bytes(), replicas.wanted, replicas.timeout)
                        .await
                })
                .await
                .map(|(found, acked)| (found, Some(acked))),
        };
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
        let (renewed, acked): (Vec<i64>, _) = self
            .run_acknowledged(Some(pin), || {
                let mut call = RENEW.call(&[&keys.lock]);
                call.arg(token).arg(ttl_ms);
                call
            })
            .await?;
        Ok((renewed.first() == Some(&1), acked))
    }

    /// What the renewal found for each lock. With replica acknowledgement asked for, the renew
    /// script is followed by `WAIT` in the same round trip, on the acquire connection (so the
    /// `WAIT` has the renewal's write to wait for; on a Cluster, per slot's primary): a renewal
    /// too few replicas acknowledged is [`Renewal::NotReplicated`], and moves no validity.
    pub(crate) async fn renew_many(
        &self,
        locks: &[(&LockKeys, &str, u64)],
    ) -> Result<Vec<Renewal>, LockError> {
        #[cfg(feature = "cluster")]
        if self.sharded && locks.len() > 1 {
            return self.renew_by_slot(locks).await;
        }
        self.renew_together(locks).await
    }

    /// On a Cluster one script may only touch keys of one slot: a batch is cut by slot, and the
    /// parts are sent at once (each to its slot's primary). Each part is judged on its own: a
    /// shard that failed leaves its locks undecided, not the locks of the shards that renewed
    /// theirs; only when every part failed is the whole renewal an error.
    #[cfg(feature = "cluster")]
    async fn renew_by_slot(&self, locks: &[(&LockKeys, &str, u64)]) -> Result<Vec<Renewal>, LockError> {
        use redis::cluster_routing::Slot;
        let mut by_slot: std::collections::HashMap<Slot, Vec<usize>> = std::collections::HashMap::new();
        for (i, (keys, _, _)) in locks.iter().enumerate() {
            by_slot.entry(Slot::for_key(&keys.lock)).or_default().push(i);
        }
        let parts = by_slot.into_values().map(|indices| async move {
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

    /// One renew script for `locks` (of one slot, on a Cluster), acknowledged by replicas when
    /// they are asked for.
    async fn renew_together(&self, locks: &[(&LockKeys, &str, u64)]) -> Result<Vec<Renewal>, LockError> {
        let call = || {
            let named: Vec<&str> = locks.iter().map(|(keys, _, _)| keys.lock.as_str()).collect();
            let mut call = RENEW.call(&named);
            for (_, token, ttl_ms) in locks {
                call.arg(*token).arg(*ttl_ms);
            }
            call
        };
        let Some(replicas) = self.replicas else {
            let renewed: Vec<i64> = self
                .conn
                .request(|mut conn| async move { call().invoke(&mut conn).await })
                .await?;
            return Ok(renewed.into_iter().map(|r| Renewal::from_ours(r == 1)).collect());
        };
        let (renewed, acked): (Vec<i64>, _) = self.run_acknowledged(None, call).await?;
        let acked = acked.unwrap_or(0);
        if acked < replicas.wanted {
            tracing::debug!(
                acked,
                wanted = replicas.wanted,
                "too few replicas acknowledged a renewal"
            );
        }
        Ok(renewed
            .into_iter()
            .map(|r| match (r == 1, acked >= replicas.wanted) {
                (false, _) => Renewal::Gone,
                (true, true) => Renewal::Renewed,
                (true, false) => Renewal::NotReplicated {
                    acked,
                    wanted: replicas.wanted,
                },
            })
            .collect())
    }

    pub(crate) async fn leave_queue(
        &self,
        keys: &LockKeys,
        token: &str,
        claimed: bool,
    ) -> Result<(), LockError> {
        let publish = if self.sharded { "SPUBLISH" } else { "PUBLISH" };
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

    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        token: &str,
        hold_ms: u64,
        kind: Kind,
    ) -> Result<bool, LockError> {
        self.release_after(keys, token, hold_ms, kind, None, false).await
    }

    /// [`release`](Self::release), after what was sent on the connection `pin` recorded (the
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
        let released = self.give_back(keys, token, hold_ms, kind, pin).await?;
        if released == SHARE_LEFT {
            // Other readers still share the lock: nobody can enter because this one left.
            return Ok(true);
        }
        let released = released != 0;
        if released && kind != Kind::Fair && !quietly {
            // This client's own next waiter need not hear it from Redis (its subscriber skips
            // the announcement, which carries this client's id). A fair release names the next
            // waiter instead, wherever it is.
            self.subscriber.wakeups.notify(&keys.channel);
        }
        Ok(released)
    }

    /// A call of `lua` on a lock whose release announces itself only if a waiter marked it: the
    /// lock key and its waiting mark, but on a Redis Cluster the lock alone (every release
    /// announces there).
    fn call_marked(&self, lua: &'static Lua, keys: &LockKeys) -> Call {
        if self.sharded {
            lua.call(&[&keys.lock])
        } else {
            lua.call(&[keys.lock.as_str(), keys.waiting().as_str()])
        }
    }

    /// The release script's answer: 0 not ours, [`SHARE_LEFT`] a share given back while others
    /// remain, else released (and announced if Redis let us). [`Kind::Shared`] is only a hint:
    /// the common release, tried first for a plain lock not kept for a minimum hold, hands
    /// anything it cannot decide (a read share too) to the full one.
    async fn give_back(
        &self,
        keys: &LockKeys,
        token: &str,
        hold_ms: u64,
        kind: Kind,
        pin: Option<&Pinned>,
    ) -> Result<i64, LockError> {
        let announcement = &self.subscriber.announcement;
        let sharded = self.sharded;
        let fair = kind == Kind::Fair;
        // On the acquire connection: a release sent after an acquire whose answer never came
        // (cancelled, timed out) must reach Redis after it.
        let (connection, within) = self.ordered();
        if kind == Kind::Plain && hold_ms == 0 {
            let released: i64 = connection
                .request_after(pin, within, |mut conn| async move {
                    let mut unlock = self.call_marked(&UNLOCK, keys);
                    unlock.arg(token).arg(announcement);
                    if sharded {
                        unlock.arg("1");
                    }
                    unlock.invoke(&mut conn).await
                })
                .await?;
            if released != NOT_PLAIN {
                if released == RELEASED_UNANNOUNCED {
                    self.subscriber.pubsub_denied();
                }
                return Ok(released);
            }
        }
        let released: i64 = connection
            .request_after(pin, within, |mut conn| async move {
                let mut release = match (fair, sharded) {
                    // Only a fair release reads the line (and may take the next holder's
                    // fencing token); it always announces, naming the next in line.
                    (true, false) => RELEASE.call(&[
                        keys.lock.clone(),
                        keys.queue(),
                        keys.kept(),
                        keys.fence(),
                        keys.waiting(),
                    ]),
                    (true, true) => {
                        RELEASE.call(&[keys.lock.clone(), keys.queue(), keys.kept(), keys.fence()])
                    }
                    (false, _) => self.call_marked(&RELEASE, keys),
                };
                release
                    .arg(token)
                    .arg(hold_ms)
                    .arg(announcement)
                    .arg(&keys.channel);
                if fair || sharded {
                    release.arg(if fair { "1" } else { "0" });
                }
                if sharded {
                    release.arg("1");
                }
                release.invoke(&mut conn).await
            })
            .await?;
        if released == RELEASED_UNANNOUNCED {
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
        let sharded = self.sharded;
        let (deleted,): (i64,) = self
            .conn
            .request(|mut conn| async move {
                let mut pipe = redis::pipe();
                pipe.del(&keys.lock);
                if !sharded {
                    // Its waiting mark goes with it (the announcement below is unconditional).
                    pipe.del(keys.waiting()).ignore();
                }
                pipe.query_async(&mut conn).await
            })
            .await?;
        if deleted == 1 {
            // Best effort, as in the release script: a user without channel rights still
            // deletes, and waiters then wake on their timers.
            let publish = if self.sharded { "SPUBLISH" } else { "PUBLISH" };
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

impl Drop for RedisBackend {
    fn drop(&mut self) {
        self.subscriber.stop();
    }
}

fn is_wrong_type(e: &crate::BoxError) -> bool {
    e.downcast_ref::<redis::RedisError>()
        .is_some_and(|e| e.code() == Some("WRONGTYPE"))
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
struct Subscriber {
    /// How this client announces its releases (`c:` and a random id), so that its own are
    /// skipped when heard back.
    announcement: String,
    place: Place,
    timeouts: Timeouts,
    /// Which listener of `wakeups` this subscriber is.
    listener: usize,
    /// Told when a sentinel announced a new primary: the subscriber leaves the old one too.
    switched: Arc<tokio::sync::Notify>,
    wakeups: Arc<Wakeups>,
    /// Also serialises SUBSCRIBE against UNSUBSCRIBE of the same channel.
    live: Mutex<Option<Live>>,
    /// The task reading the current connection, so dropping the client can always stop it. A
    /// connection whose reader ended (with the runtime it ran on) is dead: it is replaced.
    dispatcher: Background,
    /// The task that unsubscribes idle channels and pings the connection, started by the first
    /// waiter (so a client can be built outside a runtime), and again on a later runtime.
    upkeep: Background,
    /// Channels nobody waits for any more, for the upkeep task (which holds it while it runs).
    idle: Arc<Mutex<mpsc::UnboundedReceiver<String>>>,
    /// Set when the client is dropped: no task starts again.
    stopped: AtomicBool,
    /// No new connection before this instant (set after a failure).
    retry_after: std::sync::Mutex<Option<Instant>>,
    /// Redis refused this client pub/sub (an ACL without channel rights); said once.
    denied_said: AtomicBool,
}

impl Subscriber {
    fn new(
        place: Place,
        timeouts: Timeouts,
        wakeups: Arc<Wakeups>,
        listener: usize,
        (idle, switched): (mpsc::UnboundedReceiver<String>, Arc<tokio::sync::Notify>),
    ) -> Self {
        Subscriber {
            announcement: format!("c:{:016x}", rand::random::<u64>()),
            place,
            listener,
            switched,
            timeouts,
            wakeups,
            live: Mutex::new(None),
            dispatcher: Background::default(),
            upkeep: Background::default(),
            idle: Arc::new(Mutex::new(idle)),
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

    fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.upkeep.stop();
        self.stop_dispatcher();
    }

    /// Says once per client that releases cannot be announced or heard, and what that costs.
    fn pubsub_denied(&self) {
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

    /// Whether [`listen`](Self::listen) has nothing to do for `channel`: it is subscribed, or
    /// the subscriber is cooling down after a failure (and the upkeep task runs).
    fn listening(&self, channel: &str) -> bool {
        self.upkeep.is_running()
            && (self.cooling_down()
                || (self.dispatcher.is_running() && self.wakeups.is_subscribed(channel, self.listener)))
    }

    /// Subscribes `channel` unless it is already. Best effort: on failure the waiter wakes at
    /// the holder's expiry or its nap's end instead.
    async fn listen(self: &Arc<Self>, channel: &str) {
        self.start_upkeep();
        // A connection whose reader ended with the runtime it ran on is dead, subscriptions and
        // all: replaced at once (no cool-down, nothing failed).
        let orphaned = || !self.dispatcher.is_running();
        if !orphaned() && (self.wakeups.is_subscribed(channel, self.listener) || self.cooling_down()) {
            return;
        }
        let mut live = self.live.lock().await;
        if live.is_some() && orphaned() {
            live.take();
            self.wakeups.subscriptions_lost(self.listener);
        }
        if self.wakeups.is_subscribed(channel, self.listener) || self.cooling_down() {
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
        match bounded(self.timeouts.response, current.sink.subscribe(channel)).await {
            Ok(()) => self.wakeups.set_subscribed(channel, self.listener),
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
        let server = match &self.place {
            Place::Server(client) => client.clone(),
            #[cfg(feature = "sentinel")]
            Place::Sentinel(sentinels) => sentinels.primary().await?,
            #[cfg(feature = "cluster")]
            Place::Cluster(cluster) => {
                let (pushes, heard) = mpsc::unbounded_channel();
                let conn = cluster.connect(Some(pushes)).await?;
                return Ok((Sink::Cluster(conn), Heard::Cluster(heard)));
            }
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
        self.wakeups.subscriptions_lost(self.listener);
    }

    async fn dispatch(self: Arc<Self>, generation: u64, mut heard: Heard) {
        while let Some(event) = heard.next().await {
            match event {
                Event::Message(channel, said) => {
                    let channel = String::from_utf8_lossy(&channel);
                    if let Some(waiter) = said.strip_prefix(b"w:") {
                        // A fair release names the next waiter; it may be another client's.
                        self.wakeups.notify_waiter(&channel, waiter, None);
                    } else if let Some((handed, waiter)) = handed_over(&said) {
                        // ... or hands it the lock.
                        self.wakeups.notify_waiter(&channel, waiter, Some(handed));
                    } else if said != self.announcement.as_bytes() {
                        self.wakeups.notify(&channel);
                    }
                }
                #[cfg(feature = "cluster")]
                Event::Unsubscribed(channel) => {
                    // Ours go only when nobody waits; one that still has waiters was ended by
                    // the server (its slot moved): they re-check, and subscribe again.
                    let channel = String::from_utf8_lossy(&channel);
                    if self.wakeups.is_wanted(&channel) {
                        tracing::debug!(%channel, "lock wake-up subscription ended by the server");
                        self.wakeups.subscription_lost(&channel, self.listener);
                    }
                }
                #[cfg(feature = "cluster")]
                Event::Disconnected => {
                    // redis-rs reconnects and subscribes again; what was said meanwhile is lost.
                    self.wakeups.subscriptions_lost(self.listener);
                }
            }
        }
        tracing::debug!("lock wake-up subscriber connection closed");
        let mut live = self.live.lock().await;
        if live.as_ref().is_some_and(|l| l.generation == generation) {
            live.take();
            self.wakeups.subscriptions_lost(self.listener);
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
                        self.wakeups.subscriptions_lost(self.listener);
                    }
                }
                channel = idle.recv() => {
                    let Some(channel) = channel else { return };
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
                _ = ping.tick() => {
                    if self.wakeups.len() == 0 {
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

#[cfg(test)]
mod tests {
    use super::{handed_over, HandedOver};

    #[test]
    fn a_hand_over_names_its_fencing_token_its_place_and_the_waiter() {
        let handed = |fence, kept| HandedOver { fence, kept };
        assert_eq!(
            handed_over(b"g:1796050340300403:1796050341:90725802f1b2 host:17636"),
            Some((
                handed(1_796_050_340_300_403, 1_796_050_341),
                &b"90725802f1b2 host:17636"[..]
            ))
        );
        assert_eq!(handed_over(b"g:0:12:t"), Some((handed(0, 12), &b"t"[..])));
        // Lua writes a large number it concatenates as 1.79e+15: not a hand-over (the waiter
        // is woken and asks).
        assert_eq!(handed_over(b"g:1.7960503291779e+15:12:t"), None);
        assert_eq!(handed_over(b"g:0:t"), None);
        assert_eq!(handed_over(b"w:t"), None);
        assert_eq!(handed_over(b"c:0123456789abcdef"), None);
    }
}
