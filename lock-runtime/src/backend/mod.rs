//! Where locks live. The guard, the watchdog and the wait loop speak only to a [`Store`]: what
//! one attempt, renewal and release do in it, how waiters hear of releases, and what it offers
//! ([`Capabilities`]), which the client checks once per call against the options. A store is one
//! module implementing the trait: Redis (one server, Sentinel and Cluster, one implementation
//! whose [`Deployment`](deployment::Deployment) knows where requests go and how releases are
//! announced), RedLock (over Redis stores), PostgreSQL (with the `postgres` feature), etcd (with the `etcd`
//! feature) and the in-memory store.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub(crate) use crate::keys::LockKeys;
use crate::wakeups::{Registration, Wakeups};
use crate::{LockError, LockMode, LockOptions};
pub(crate) use connection::Pinned;

#[cfg(feature = "cluster")]
pub(crate) mod cluster;
pub(crate) mod conn;
pub(crate) mod connection;
pub(crate) mod deployment;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod memory;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod redis;
pub(crate) mod redlock;
pub(crate) mod replicas;
pub(crate) mod scripts;
#[cfg(feature = "sentinel")]
pub(crate) mod sentinel;
pub(crate) mod subscriber;

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

/// What a store's request answers. Boxed, as a `dyn Future + Send`, at the seam: a caller's
/// future then holds a pointer, not the store's state machines (redis-rs's are deep), so proving
/// a user's spawned task `Send` (and laying out its future) stops at the box. Without it,
/// ordinary user code (a spawned fn that acquires and releases) overflowed rustc's default query
/// depth. One allocation per request; the contention and pair_cost benches measure it.
pub(crate) type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, LockError>> + Send + 'a>>;

/// Where locks live: what one attempt, renewal and release do there. Every method is one request
/// (or one quorum of them), bounded by the store's response timeout; the client does the waiting,
/// the renewing, the validity and the bookkeeping around them, the same for every store.
pub(crate) trait Store: Send + Sync + std::fmt::Debug {
    /// What this store offers; the client refuses options it does not, before any request.
    fn capabilities(&self) -> Capabilities;

    /// Connects now, and checks on `probe`'s names that this client may run everything the
    /// protocol runs ([`LockClientBuilder::build`](crate::LockClientBuilder::build)). A store
    /// with nothing to connect to answers at once.
    fn connect<'a>(&'a self, _probe: &'a LockKeys) -> Answer<'a, ()> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// One attempt; idempotent for one token. `pin` records the connection it went on, for the
    /// release of an attempt whose answer never comes ([`release`](Self::release) `after` it).
    fn attempt<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ask: &'a Ask,
        pin: &'a Pinned,
    ) -> Answer<'a, Attempt>;

    /// Lengthens each lock's lease to its ttl if it still holds its token (never shortens it),
    /// in one request where the store allows: what it found for each.
    fn renew_many<'a>(&'a self, locks: &'a [(&'a LockKeys, &'a str, u64)]) -> Answer<'a, Vec<Renewal>>;

    /// Deletes the lock (or, with `hold_ms > 0`, lets it expire in `hold_ms`) if it still holds
    /// `token`, and wakes a waiter (a fair lock: the head of the line); `false` if it was no
    /// longer ours. A share of a read-write lock is recognised by its token: it goes, and the
    /// last share to go wakes a waiter ([`Kind`] is a hint that spares a first try; without it
    /// the release is right all the same). `after`: the release of an acquire whose answer never
    /// came, sent after it (on the connection it went on, where that matters).
    fn release<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        hold_ms: u64,
        kind: Kind,
        after: Option<&'a Pinned>,
    ) -> Answer<'a, bool>;

    /// Gives up `token`'s place in the fair line and its claim as a waiting writer (a waiter
    /// that stops waiting). `claimed`: it may have claimed the writers' turn, so readers held
    /// back by the claim are told to try again. A store that offers neither fair nor shared
    /// locks has no line to leave.
    fn leave_queue<'a>(&'a self, _keys: &'a LockKeys, _token: &'a str, _claimed: bool) -> Answer<'a, ()> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// The lock's stored value(s) and remaining life, if it is held.
    fn holder<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, Option<(Stored, Option<Duration>)>>;

    /// Whether anyone holds the lock.
    fn is_locked<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, bool> {
        Box::pin(async move { Ok(self.holder(keys).await?.is_some()) })
    }

    /// The lock's remaining life, `None` when it is not held (or never expires).
    fn remaining_ttl<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, Option<Duration>> {
        Box::pin(async move { Ok(self.holder(keys).await?.and_then(|(_, life)| life)) })
    }

    /// Deletes the lock whoever holds it, and wakes its waiters; `true` if there was one.
    fn force_release<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, bool>;

    /// How long one request may take.
    fn response_timeout(&self) -> Duration;

    /// This client's waiters, by lock: the store wakes them as it hears of releases.
    fn wakeups(&self) -> &Arc<Wakeups>;

    /// Makes sure releases of the registration's lock reach it (Redis: the channel is
    /// subscribed). Best effort: on failure the waiter still wakes at the holder's expiry. A
    /// store whose releases wake its waiters directly (in memory) has nothing to do.
    fn listen<'a>(
        &'a self,
        _registration: &'a Registration,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(std::future::ready(()))
    }
}

impl dyn Store {
    /// [`renew_many`](Store::renew_many) of one lock.
    pub(crate) async fn renew(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl_ms: u64,
    ) -> Result<Renewal, LockError> {
        let renewed = self.renew_many(&[(keys, token, ttl_ms)]).await?;
        Ok(renewed.first().copied().unwrap_or(Renewal::Undecided))
    }
}

/// Whether a store offers something; when not, why (said in the `InvalidOptions` refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offered {
    Yes,
    No(&'static str),
}

/// What a store offers beyond the plain exclusive lock that every store has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// The store's name, in messages and `Debug` ("redis", "RedLock", "in-memory").
    pub(crate) name: &'static str,
    /// Fencing tokens: one counter per key, raised with every acquire.
    pub(crate) fencing: Offered,
    /// Fair mode: one line per key, the head comes first.
    pub(crate) fair: Offered,
    /// Read-write locks (shares).
    pub(crate) shared: Offered,
    /// A fair release hands the lock to the next in line, who may hold it without asking (not
    /// where every acquire must be acknowledged by replicas: the release's write was not
    /// waited for, so the waiter asks, and its attempt is acknowledged).
    pub(crate) hand_over: bool,
}

impl Capabilities {
    /// Everything (the in-memory store; Redis without replica acknowledgement).
    pub(crate) const ALL: Capabilities = Capabilities {
        name: "redis",
        fencing: Offered::Yes,
        fair: Offered::Yes,
        shared: Offered::Yes,
        hand_over: true,
    };

    /// Refuses options this store does not offer, saying why.
    pub(crate) fn check(&self, options: &LockOptions) -> Result<(), LockError> {
        let asked = [
            (options.is_fencing(), self.fencing, "fencing"),
            (options.is_fair(), self.fair, "fair mode"),
            (
                options.get_mode() == LockMode::Shared,
                self.shared,
                "read-write locks",
            ),
        ];
        for (asked, offered, what) in asked {
            if let (true, Offered::No(why)) = (asked, offered) {
                return Err(LockError::invalid_options(format!(
                    "a {} client offers no {what} ({why})",
                    self.name
                )));
            }
        }
        Ok(())
    }
}
