//! Where locks live. The guard, the watchdog and the wait loop speak only to [`Backend`], so a
//! quorum of independent masters or a Redis Cluster plugs in as one more variant with the same
//! five operations, without touching them or the public API.

use std::sync::Arc;

use futures_util::FutureExt as _;
use std::time::Duration;

use crate::wakeups::{Registration, Wakeups};
use crate::LockError;
pub(crate) use connection::Pinned;

#[cfg(feature = "cluster")]
pub(crate) mod cluster;
pub(crate) mod conn;
pub(crate) mod connection;
pub(crate) mod memory;
pub(crate) mod redis;
pub(crate) mod redlock;
pub(crate) mod scripts;
#[cfg(feature = "sentinel")]
pub(crate) mod sentinel;

/// The names one lock uses in its store: all share the `{key}` hash tag, so Redis Cluster puts
/// them in one slot. The two every lock uses are kept; the others are made when needed.
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    /// `<prefix>{<key>}`: holds the holder's token.
    pub(crate) lock: String,
    /// `<prefix>{<key>}:released`: told of every release.
    pub(crate) channel: String,
}

/// The suffix of a lock's wake-up channel.
const RELEASED: &str = ":released";

impl LockKeys {
    pub(crate) fn new(prefix: &str, key: &str) -> Self {
        // Sized once: these are made for every acquire.
        let mut lock = String::with_capacity(prefix.len() + key.len() + 2);
        lock.push_str(prefix);
        lock.push('{');
        lock.push_str(key);
        lock.push('}');
        let mut channel = String::with_capacity(lock.len() + RELEASED.len());
        channel.push_str(&lock);
        channel.push_str(RELEASED);
        LockKeys { lock, channel }
    }

    /// `<prefix>{<key>}:fence`: the fencing counter.
    pub(crate) fn fence(&self) -> String {
        format!("{}:fence", self.lock)
    }

    /// `<prefix>{<key>}:queue`: fair waiters' tokens, in the order they arrived.
    pub(crate) fn queue(&self) -> String {
        format!("{}:queue", self.lock)
    }

    /// `<prefix>{<key>}:queue:kept`: fair waiters' tokens, by when their places lapse.
    pub(crate) fn kept(&self) -> String {
        format!("{}:queue:kept", self.lock)
    }

    /// `<prefix>{<key>}:writers`: the tokens of writers waiting for a read-write lock's readers
    /// to leave, by when their claims lapse; no new reader enters while one stands.
    pub(crate) fn writers(&self) -> String {
        format!("{}:writers", self.lock)
    }

    /// `<prefix>{<key>}:waiting`: set by a refused attempt of a caller that will wait, so that
    /// the release announces itself; a release that finds no mark skips the `PUBLISH` (most
    /// releases: nobody waits). Not on a Redis Cluster, where a script naming a key that does
    /// not exist is refused while its slot migrates: there every release announces.
    pub(crate) fn waiting(&self) -> String {
        format!("{}:waiting", self.lock)
    }
}

/// Which release a held lock needs: it picks the script and the keys it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An exclusive lock that is not fair: its release announces itself only if a waiter
    /// marked it (always on a Redis Cluster, and when the lock is kept for a minimum hold).
    Plain,
    /// An exclusive fair lock: its release names the next waiter in line, wherever it is.
    Fair,
    /// A share of a read-write lock (a read lock is never fair): the last share to go wakes a
    /// waiter.
    Shared,
}

impl Kind {
    /// A lock taken with these options (validated: a shared lock is never fair).
    pub(crate) fn of(fair: bool, shared: bool) -> Kind {
        match (fair, shared) {
            (_, true) => Kind::Shared,
            (true, false) => Kind::Fair,
            (false, false) => Kind::Plain,
        }
    }
}

/// What one acquire attempt asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask {
    pub(crate) ttl_ms: u64,
    pub(crate) fencing: bool,
    /// The caller is waiting: a refusal should say how long the holder has left (a first
    /// attempt may skip that, to cost one command).
    pub(crate) waiting: bool,
    /// Waiters queue in the store, and the head of the queue comes first.
    pub(crate) fair: bool,
    /// With `fair`: take a place in the queue when refused (the caller will wait). Without:
    /// the caller will wait, so it claims the writers' turn when readers refuse it.
    pub(crate) join: bool,
    /// A share of a read-write lock ([`LockMode::Shared`](crate::LockMode::Shared)).
    pub(crate) shared: bool,
    /// An earlier attempt of this call claimed the writers' turn: taking the lock ends the claim.
    pub(crate) claimed: bool,
}

/// The result of one acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Ours; `fence` is the new fencing token when one was asked for.
    Acquired { fence: Option<u64> },
    /// Held by someone (or something) else; `pttl_ms` is its remaining life when it has one.
    /// `behind`: a fair waiter with others ahead of it in line (the next release names one of
    /// them, not it). `claimed`: refused by readers, the caller claimed the writers' turn, which
    /// lapses unless it asks again within [`FAIR_PLACE_KEPT`](crate::FAIR_PLACE_KEPT).
    /// `kept`: a fair waiter's place was kept by this attempt, and this stamp names it (a
    /// release that hands the lock over names the stamp it handed it over for).
    Held {
        pttl_ms: Option<u64>,
        behind: bool,
        claimed: bool,
        kept: Option<u64>,
    },
    /// Taken, but fewer replicas than asked for acknowledged it, so it was given back.
    NotReplicated { acked: usize, wanted: usize },
}

/// What a lock key holds, as read for [`LockClient::holder`](crate::LockClient::holder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stored {
    /// One holder's value (or a value this library did not write).
    One(Vec<u8>),
    /// A read-write lock's shared holders: each reader's value, sorted.
    Shares(Vec<Vec<u8>>),
}

/// What one renewal found for one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Still ours, and its lease set (acknowledged by the replicas asked for, if any).
    Renewed,
    /// Gone or someone else's: the lock is lost.
    Gone,
    /// No answer either way for this lock: its Cluster shard failed while others answered, or
    /// a RedLock majority neither renewed it nor found it gone. Retried while the lock is valid.
    Undecided,
    /// Renewed on the primary, but fewer replicas than `wait_for_replicas` asked for
    /// acknowledged it: the holder's validity does not move (a failover to a replica could bring
    /// back the earlier expiry). Retried while the acknowledged validity lasts.
    NotReplicated { acked: usize, wanted: usize },
}

impl Renewal {
    /// A store's yes or no.
    pub(crate) fn from_ours(ours: bool) -> Renewal {
        if ours {
            Renewal::Renewed
        } else {
            Renewal::Gone
        }
    }
}

/// A renewal that neither a majority renewed nor a majority found gone.
#[derive(Debug, thiserror::Error)]
#[error("the renewal was not answered either way (too few RedLock masters, or its Cluster shard, answered)")]
pub(crate) struct Undecided;

#[derive(Debug)]
pub(crate) enum Backend {
    Redis(Box<redis::RedisBackend>),
    /// A quorum over independent masters.
    Redlock(Box<redlock::RedlockBackend>),
    Memory(Box<memory::MemoryBackend>),
}

// Every call into a networked store is boxed as a `dyn Future + Send` here, at the seam: a
// caller's future then holds a pointer, not redis-rs's state machines, so proving a user's spawned
// task `Send` (and laying out its future) stops at the box. Without it, ordinary user code (a
// spawned fn that acquires and releases) overflowed rustc's default query depth. One allocation
// per request; the contention and pair_cost benches measure it.
impl Backend {
    /// One attempt; idempotent for one token. `pin` records the connection it went on, for the
    /// release of an attempt whose answer never comes ([`release_after`](Self::release_after)).
    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        token: &str,
        ask: &Ask,
        pin: &Pinned,
    ) -> Result<Attempt, LockError> {
        match self {
            Backend::Redis(b) => b.acquire(keys, token, ask, pin).boxed().await,
            Backend::Redlock(b) => b.acquire(keys, token, ask).boxed().await,
            Backend::Memory(b) => Ok(b.acquire(keys, token, ask)),
        }
    }

    /// Gives up `token`'s place in the fair queue and its claim as a waiting writer (a waiter
    /// that stops waiting). `claimed`: it may have claimed the writers' turn, so readers held
    /// back by the claim are told to try again.
    pub(crate) async fn leave_queue(
        &self,
        keys: &LockKeys,
        token: &str,
        claimed: bool,
    ) -> Result<(), LockError> {
        match self {
            Backend::Redis(b) => b.leave_queue(keys, token, claimed).boxed().await,
            // Fair mode and read-write locks are refused on RedLock: there is no line to leave.
            Backend::Redlock(_) => Ok(()),
            Backend::Memory(b) => {
                b.leave_queue(keys, token, claimed);
                Ok(())
            }
        }
    }

    /// Lengthens the lock's lease to `ttl_ms` if it still holds `token` (never shortens it).
    pub(crate) async fn renew(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_ms: u64,
    ) -> Result<Renewal, LockError> {
        let renewed = self.renew_many(&[(keys, token, ttl_ms)]).await?;
        Ok(renewed.first().copied().unwrap_or(Renewal::Undecided))
    }

    /// [`renew`](Self::renew) for many locks in one request (per Cluster slot): what it found
    /// for each.
    pub(crate) async fn renew_many(
        &self,
        locks: &[(&LockKeys, &str, u64)],
    ) -> Result<Vec<Renewal>, LockError> {
        match self {
            Backend::Redis(b) => b.renew_many(locks).boxed().await,
            Backend::Redlock(b) => b.renew_many(locks).boxed().await,
            Backend::Memory(b) => Ok(locks
                .iter()
                .map(|(keys, token, ttl_ms)| Renewal::from_ours(b.renew(keys, token, *ttl_ms)))
                .collect()),
        }
    }

    /// Deletes the lock (or, with `hold_ms > 0`, lets it expire in `hold_ms`) if it still holds
    /// `token`, and wakes a waiter (a fair lock: the head of the queue); `false` if it was no
    /// longer ours. A share of a read-write lock is recognised by its token: it goes, and the
    /// last share to go wakes a waiter ([`Kind::Shared`] says it is one, sparing Redis a first
    /// try at the common release; without it the release is right all the same).
    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        token: &str,
        hold_ms: u64,
        kind: Kind,
    ) -> Result<bool, LockError> {
        match self {
            Backend::Redis(b) => b.release(keys, token, hold_ms, kind).boxed().await,
            Backend::Redlock(b) => b.release(keys, token, hold_ms).boxed().await,
            Backend::Memory(b) => Ok(b.release(keys, token, hold_ms, kind == Kind::Fair)),
        }
    }

    /// [`release`](Self::release) of an acquire whose answer never came: after it, on the
    /// connection it went on (a RedLock release waits for each master's attempt instead).
    pub(crate) async fn release_after(
        &self,
        keys: &LockKeys,
        token: &str,
        kind: Kind,
        pin: &Pinned,
    ) -> Result<bool, LockError> {
        match self {
            Backend::Redis(b) => {
                b.release_after(keys, token, 0, kind, Some(pin), false)
                    .boxed()
                    .await
            }
            _ => self.release(keys, token, 0, kind).await,
        }
    }

    pub(crate) async fn is_locked(&self, keys: &LockKeys) -> Result<bool, LockError> {
        match self {
            Backend::Redis(b) => b.is_locked(keys).boxed().await,
            Backend::Redlock(b) => b.is_locked(keys).boxed().await,
            Backend::Memory(b) => Ok(b.is_locked(keys)),
        }
    }

    /// The lock's remaining life, `None` when it is not held (or never expires).
    pub(crate) async fn remaining_ttl(&self, keys: &LockKeys) -> Result<Option<Duration>, LockError> {
        match self {
            Backend::Redis(b) => b.remaining_ttl(keys).boxed().await,
            Backend::Redlock(b) => b.remaining_ttl(keys).boxed().await,
            Backend::Memory(b) => Ok(b.remaining_ttl(keys)),
        }
    }

    /// The lock's stored value(s) and remaining life, if it is held.
    pub(crate) async fn holder(
        &self,
        keys: &LockKeys,
    ) -> Result<Option<(Stored, Option<Duration>)>, LockError> {
        match self {
            Backend::Redis(b) => b.holder(keys).boxed().await,
            Backend::Redlock(b) => b.holder(keys).boxed().await,
            Backend::Memory(b) => Ok(b.holder(keys)),
        }
    }

    pub(crate) async fn force_release(&self, keys: &LockKeys) -> Result<bool, LockError> {
        match self {
            Backend::Redis(b) => b.force_release(keys).boxed().await,
            Backend::Redlock(b) => b.force_release(keys).boxed().await,
            Backend::Memory(b) => Ok(b.force_release(keys)),
        }
    }

    /// How long one request may take.
    pub(crate) fn response_timeout(&self) -> Duration {
        match self {
            Backend::Redis(b) => b.response_timeout(),
            Backend::Redlock(b) => b.response_timeout(),
            Backend::Memory(_) => crate::DEFAULT_RESPONSE_TIMEOUT,
        }
    }

    /// Whether a lock a fair release handed over may be held as it is: not when replicas must
    /// acknowledge every acquire (the release's write was not waited for; the waiter asks, and
    /// its attempt is acknowledged).
    pub(crate) fn takes_hand_overs(&self) -> bool {
        match self {
            Backend::Redis(b) => !b.waits_for_replicas(),
            Backend::Redlock(_) => false,
            Backend::Memory(_) => true,
        }
    }

    pub(crate) fn wakeups(&self) -> &Arc<Wakeups> {
        match self {
            Backend::Redis(b) => b.wakeups(),
            Backend::Redlock(b) => b.wakeups(),
            Backend::Memory(b) => b.wakeups(),
        }
    }

    /// Makes sure releases of the registration's lock reach it (Redis: the channel is
    /// subscribed). Best effort: on failure the waiter still wakes at the holder's expiry.
    pub(crate) async fn listen(&self, registration: &Registration) {
        match self {
            Backend::Redis(b) => b.listen(registration).boxed().await,
            Backend::Redlock(b) => b.listen(registration).boxed().await,
            Backend::Memory(_) => {}
        }
    }
}
