//! Where locks live. The client (its wait loop, guards, watchdog, validity, reentrancy and
//! telemetry) speaks to a store only through [`Store`], in the words of locks: a lock's name, a
//! holder's token, a lease, a place in a line, a release and who hears of it. What a store
//! offers beyond the plain exclusive lock ([`Capabilities`]) is checked once per call, before
//! any request.
//!
//! Each store is one folder (or file) here: `redis/` (one server, Sentinel and Cluster: its
//! connection, subscriber, replica acknowledgement, scripts and key names), `redlock.rs` (a
//! quorum of Redis stores), `postgres/` (feature `postgres`), `mysql/` (feature `mysql`),
//! `etcd/` (feature `etcd`), `zookeeper/` (feature `zookeeper`) and `memory.rs`. A store is described by a [`StoreConfig`], which the builder keeps until
//! `build()`: it checks the description and opens the store with the client's [`Settings`].
//!
//! | a store… | through |
//! |---|---|
//! | names a user's key its own way (a Redis hash tag, a row key) | [`Store::name`] |
//! | takes a lock, or says who holds it and, for a caller that will wait, gives it a place in line | [`Store::attempt`] |
//! | lengthens many leases in one request where it can | [`Store::renew`] |
//! | gives a lock back, or keeps it for a minimum hold | [`Store::release`] |
//! | takes a waiter that stops waiting out of its line | [`Store::leave`] |
//! | reads one lock, and lists the locks under its prefix (for operators) | [`Store::inspect`], [`Store::list`] |
//! | frees a lock whoever holds it, if it still holds what was seen | [`Store::force_release`] |
//! | tells this client's waiters of releases, through the [`Notices`] it was opened with | [`Store::listen`], [`Store::unlisten`] |

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::LockError;
use crate::options::{LockMode, LockOptions};
pub(crate) use crate::view::LockView;
pub(crate) use crate::wakeups::Notices;

pub(crate) mod announcement;
pub(crate) mod decode;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) mod line;
pub(crate) mod memory;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(feature = "redis")]
pub(crate) mod redlock;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod sql;
pub(crate) mod url;
#[cfg(feature = "zookeeper")]
pub(crate) mod zookeeper;

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

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: DEFAULT_CONNECT_TIMEOUT,
            response: DEFAULT_RESPONSE_TIMEOUT,
        }
    }
}

/// PEM material for TLS beyond the system's trust store: a private CA, a client certificate.
#[derive(Clone, Default)]
pub(crate) struct TlsMaterial {
    pub(crate) root_ca: Option<Vec<u8>>,
    pub(crate) client_auth: Option<(Vec<u8>, Vec<u8>)>,
}

impl Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("TlsMaterial")
            .field("root_ca", &self.root_ca.is_some())
            .field("client_auth", &self.client_auth.is_some())
            .finish()
    }
}

impl TlsMaterial {
    pub(crate) fn is_empty(&self) -> bool {
        self.root_ca.is_none() && self.client_auth.is_none()
    }
}

/// rustls needs a process-wide crypto provider before a TLS connection: ours (`ring`) is
/// installed unless the application installed one (then `install_default` fails, and theirs is
/// kept).
#[cfg(feature = "tls")]
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Every write acknowledged by this many replicas within this long
/// ([`LockClientBuilder::wait_for_replicas`](crate::LockClientBuilder::wait_for_replicas)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replicas {
    pub(crate) wanted: usize,
    pub(crate) timeout: Duration,
}

/// What every store is opened with: the client's settings that are not the store's own
/// description, and where it tells this client's waiters of releases.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Put before every key (checked not empty).
    pub(crate) prefix: String,
    pub(crate) timeouts: Timeouts,
    pub(crate) tls: TlsMaterial,
    /// Replica acknowledgement, when asked for (a store that cannot give it refuses it).
    pub(crate) replicas: Option<Replicas>,
    pub(crate) notices: Notices,
}

impl Settings {
    /// Refuses replica acknowledgement (`why`: what the store does instead).
    pub(crate) fn no_replicas(&self, why: &str) -> Result<(), LockError> {
        match self.replicas {
            Some(_) => Err(LockError::invalid_options(format!(
                "wait_for_replicas does not apply to {why}"
            ))),
            None => Ok(()),
        }
    }

    /// Refuses the builder's TLS material (`why`: where TLS is set up instead).
    pub(crate) fn no_tls_material(&self, why: &str) -> Result<(), LockError> {
        match self.tls.is_empty() {
            true => Ok(()),
            false => Err(LockError::invalid_options(why.to_owned())),
        }
    }
}

/// Where the locks of a client live, as the builder was told (one per store: a Redis
/// deployment, RedLock's masters, a database URL, etcd's endpoints), until `build()`.
pub(crate) trait StoreConfig: Debug + Send + Sync + std::any::Any {
    /// Checks the description against the client's settings and makes the store; nothing is
    /// connected yet.
    fn open(&self, settings: Settings) -> Result<Arc<dyn DynStore>, LockError>;
}

/// A description that could not be made (a URL whose scheme names no store): it fails at
/// `build()`, with its reason.
#[derive(Debug)]
pub(crate) struct Refused {
    url: String,
    reason: String,
}

impl Refused {
    pub(crate) fn new(url: &str, refusal: LockError) -> Refused {
        Refused {
            url: crate::redact::hide_credentials(url),
            reason: match refusal {
                LockError::InvalidOptions { reason } => reason,
                other => other.to_string(),
            },
        }
    }
}

impl StoreConfig for Refused {
    fn open(&self, _: Settings) -> Result<Arc<dyn DynStore>, LockError> {
        let _ = &self.url;
        Err(LockError::invalid_options(self.reason.clone()))
    }
}

/// One lock as a store names it: the user's key and the store's own name for it
/// ([`Store::name`]), made once per call.
#[derive(Debug, Clone)]
pub(crate) struct Lock {
    name: String,
    key: KeyIn,
}

/// Where a lock's key is kept.
#[derive(Debug, Clone)]
enum KeyIn {
    /// In the name, starting at this byte (a name of the form `…{<key>}`, as [`name`] makes
    /// them: one string for both, made once per call).
    Name(usize),
    /// A string of its own (a name that does not end with the key in braces).
    Own(String),
}

impl Lock {
    pub(crate) fn new(key: &str, name: String) -> Lock {
        let inside = name
            .strip_suffix('}')
            .and_then(|before| before.strip_suffix(key))
            .filter(|before| before.ends_with('{'))
            .map(str::len);
        Lock {
            key: inside.map_or_else(|| KeyIn::Own(key.to_owned()), KeyIn::Name),
            name,
        }
    }

    /// The key as the caller gave it.
    pub(crate) fn key(&self) -> &str {
        match &self.key {
            // At a character boundary: the key's own bytes start there.
            KeyIn::Name(at) => self.name.get(*at..self.name.len() - 1).unwrap_or_default(),
            KeyIn::Own(key) => key,
        }
    }

    /// The store's name for it: what its release notices name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

/// `<prefix>{<key>}`: a lock's name on every store (on Redis the braces make the key a hash
/// tag, and the lock's other keys start with it). Sized once: made for every acquire.
pub(crate) fn name(prefix: &str, key: &str) -> String {
    let mut lock = String::with_capacity(prefix.len() + key.len() + 2);
    lock.push_str(prefix);
    lock.push('{');
    lock.push_str(key);
    lock.push('}');
    lock
}

/// The user's key in a lock's [`name`] under `prefix`.
pub(crate) fn user_key<'a>(prefix: &str, name: &'a str) -> Option<&'a str> {
    name.strip_prefix(prefix)?.strip_prefix('{')?.strip_suffix('}')
}

/// What kind of lock a token holds: its release depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An exclusive lock that is not fair.
    Plain,
    /// An exclusive fair lock: its release hands over to the head of the line.
    Fair,
    /// A share of a read-write lock (a read lock is never fair): the last share to go wakes a
    /// waiter.
    Shared,
    /// A permit of a semaphore: each permit given back wakes a waiter.
    Permit,
}

/// What an attempt asks to hold and how its waiters take turns: every combination the options
/// allow, and no other (a shared lock is never fair; a semaphore is never shared).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// An exclusive lock; its waiters come in no set order.
    Exclusive,
    /// An exclusive lock whose waiters queue in the store: the head of the line comes first.
    Fair,
    /// A share of a read-write lock ([`LockMode::Shared`]).
    Shared,
    /// One of `count` (more than 1) permits of a semaphore, whose attempt takes any free permit
    /// (in one request where the store allows) and is refused with `InvalidOptions` when the
    /// key is held with another count; with `fair`, its waiters queue in the store.
    Permits { count: u32, fair: bool },
}

impl Mode {
    /// The mode of a call with these options (validated: a shared lock is never fair, nor a
    /// semaphore).
    pub(crate) fn of(options: &LockOptions) -> Mode {
        let fair = options.is_fair();
        match options.get_mode() {
            _ if options.is_semaphore() => Mode::Permits {
                count: options.get_permits(),
                fair,
            },
            LockMode::Shared => Mode::Shared,
            LockMode::Exclusive if fair => Mode::Fair,
            LockMode::Exclusive => Mode::Exclusive,
        }
    }

    /// Its waiters queue in the store, and the head of the line comes first.
    pub(crate) fn fair(self) -> bool {
        matches!(self, Mode::Fair | Mode::Permits { fair: true, .. })
    }

    /// A share of a read-write lock.
    pub(crate) fn shared(self) -> bool {
        self == Mode::Shared
    }

    /// How many holders the key admits at once: 1 for a lock, more for a semaphore.
    pub(crate) fn permits(self) -> u32 {
        match self {
            Mode::Permits { count, .. } => count,
            _ => 1,
        }
    }

    /// A semaphore's permit.
    pub(crate) fn semaphore(self) -> bool {
        matches!(self, Mode::Permits { .. })
    }

    /// Which release a token taken in this mode needs.
    pub(crate) fn kind(self) -> Kind {
        match self {
            Mode::Exclusive => Kind::Plain,
            Mode::Fair => Kind::Fair,
            Mode::Shared => Kind::Shared,
            Mode::Permits { .. } => Kind::Permit,
        }
    }
}

/// What one acquire attempt asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask {
    pub(crate) ttl_ms: u64,
    pub(crate) fencing: bool,
    /// The caller listens for releases: a refusal should say how long the holder has left (a
    /// first attempt may skip that, to cost one request).
    pub(crate) waiting: bool,
    /// What it asks to hold, and how waiters take turns.
    pub(crate) mode: Mode,
    /// The caller will wait: fair, a refused attempt takes (or keeps) a place in line; not
    /// fair, refused by readers, it claims the writers' turn.
    pub(crate) join: bool,
    /// An earlier attempt of this call claimed the writers' turn: taking the lock ends the claim.
    pub(crate) claimed: bool,
    /// What is left of the caller's wait when it will wait (`join`): a store whose attempt can
    /// block behind another request (PostgreSQL, on a row another session has locked) gives up
    /// within it, so no attempt outlives its caller's wait.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) wait_left: Option<std::time::Duration>,
}

impl Ask {
    /// One attempt at an exclusive lock that is not fair, by a caller that will not wait.
    pub(crate) fn once(ttl_ms: u64, fencing: bool) -> Ask {
        Ask {
            ttl_ms,
            fencing,
            waiting: false,
            mode: Mode::Exclusive,
            join: false,
            claimed: false,
            wait_left: None,
        }
    }
}

/// One attempt's words: the lock, the caller's token for it, and what it asks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked<'a> {
    pub(crate) lock: &'a Lock,
    pub(crate) token: &'a str,
    pub(crate) ask: &'a Ask,
}

impl<'a> Asked<'a> {
    /// `token`'s try at `lock`, asking `ask`.
    pub(crate) fn new(lock: &'a Lock, token: &'a str, ask: &'a Ask) -> Self {
        Asked { lock, token, ask }
    }
}

/// What an attempt at a set of locks asks: every lock (checked, in the set's canonical order,
/// each once), each for its own token (in the same order: a store may keep what it knows of a
/// lock by its token, as for a single one), and how, as one lock's [`Ask`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct SetAsk<'a> {
    pub(crate) locks: &'a [Lock],
    pub(crate) tokens: &'a [String],
    pub(crate) ask: &'a Ask,
}

/// Until when a store keeps what it granted (a lock taken, or renewed) whatever happens to this
/// client, when that is sooner than the lease asked for from the request's send: etcd's session
/// lease, last renewed a while ago; a ZooKeeper session timeout shorter than the ttl. `None`:
/// the whole lease. The lock is valid no longer, and renewed a third of the way there.
pub(crate) type GrantedUntil = Option<tokio::time::Instant>;

/// What a store that keeps a lock until `kept` says of a lease that would end at `asked`.
#[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
pub(crate) fn granted_until(kept: tokio::time::Instant, asked: tokio::time::Instant) -> GrantedUntil {
    (kept < asked).then_some(kept)
}

/// The lease a grant leaves from `sent`: `lease`, or less where the store keeps the lock for less.
pub(crate) fn lease_granted(granted: GrantedUntil, sent: tokio::time::Instant, lease: Duration) -> Duration {
    granted.map_or(lease, |until| lease.min(until.saturating_duration_since(sent)))
}

/// The result of one acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Ours; `fence` is the new fencing token when one was asked for; `granted_until`: see
    /// [`GrantedUntil`]. `permit`: the permit taken, for a semaphore.
    Acquired {
        fence: Option<u64>,
        granted_until: GrantedUntil,
        permit: Option<u32>,
    },
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

impl Attempt {
    /// Taken, valid for its ttl.
    pub(crate) fn acquired(fence: Option<u64>) -> Attempt {
        Attempt::Acquired {
            fence,
            granted_until: None,
            permit: None,
        }
    }

    /// Permit `permit` taken, valid for its ttl.
    pub(crate) fn permit(fence: Option<u64>, permit: u32) -> Attempt {
        Attempt::Acquired {
            fence,
            granted_until: None,
            permit: Some(permit),
        }
    }

    /// No permit for this caller: the first holder's lease ends in `pttl_ms` (`None`: not said),
    /// and `ahead` fair waiters are ahead of it in its semaphore's line of `permits`. It is
    /// behind (it sleeps before it asks again) only with at least as many waiters ahead as
    /// permits: then no one release lets it in. The one rule of every store with such a line.
    pub(crate) fn no_permit(pttl_ms: Option<u64>, ahead: u64, permits: u32) -> Attempt {
        Attempt::Held {
            pttl_ms,
            behind: ahead >= u64::from(permits),
            claimed: false,
            kept: None,
        }
    }

    /// Refused, in line behind the place ahead of its own, which it watches: the release that
    /// lets it in is that place's, not any other.
    #[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
    pub(crate) const fn behind() -> Attempt {
        Attempt::Held {
            pttl_ms: None,
            behind: true,
            claimed: false,
            kept: None,
        }
    }

    /// This refusal kept the caller's place in a fair line, which a release may hand the lock
    /// (or a permit) to: `kept` names that keeping (see [`Attempt::Held`]).
    pub(crate) fn kept(self, kept: Option<u64>) -> Attempt {
        match self {
            Attempt::Held {
                pttl_ms,
                behind,
                claimed,
                ..
            } => Attempt::Held {
                pttl_ms,
                behind,
                claimed,
                kept,
            },
            other => other,
        }
    }

    /// Refused, with nothing more to say.
    pub(crate) const HELD: Attempt = Attempt::Held {
        pttl_ms: None,
        behind: false,
        claimed: false,
        kept: None,
    };
}

/// What one attempt at a whole set of locks did ([`Store::attempt_set`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SetAttempt {
    /// Every lock taken, each for its token: each one's fencing token when asked for, in order.
    /// `granted_until`: as for [`Attempt::Acquired`], for every lock of the set.
    Taken {
        fences: Vec<Option<u64>>,
        granted_until: GrantedUntil,
    },
    /// Nothing taken: the lock at this index is held (for how long yet, when known).
    Refused { at: usize, pttl_ms: Option<u64> },
}

impl SetAttempt {
    /// Every lock taken, valid for its ttl, with these fencing tokens.
    pub(crate) fn taken(fences: Vec<Option<u64>>) -> SetAttempt {
        SetAttempt::Taken {
            fences,
            granted_until: None,
        }
    }
}

/// What one renewal found for one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Still ours, and its lease set (acknowledged by the replicas asked for, if any); with
    /// `granted_until` (see [`GrantedUntil`]) the store keeps it only until then, so the
    /// holder's validity moves only that far and the next renewal comes a third of the way there.
    Renewed { granted_until: GrantedUntil },
    /// Gone or someone else's: the lock is lost.
    Gone,
    /// No answer either way for this lock: its Cluster shard failed while others answered, or
    /// a RedLock majority neither renewed it nor found it gone. Retried while the lock is valid.
    Undecided,
    /// Renewed, but fewer replicas than `wait_for_replicas` asked for acknowledged it: the
    /// holder's validity does not move (a failover to a replica could bring back the earlier
    /// expiry). Retried while the acknowledged validity lasts.
    NotReplicated { acked: usize, wanted: usize },
}

impl Renewal {
    /// Renewed for the whole lease asked for.
    pub(crate) const RENEWED: Renewal = Renewal::Renewed { granted_until: None };

    /// A store's yes or no.
    pub(crate) fn from_ours(ours: bool) -> Renewal {
        if ours {
            Renewal::RENEWED
        } else {
            Renewal::Gone
        }
    }
}

/// A renewal that neither a majority renewed nor a majority found gone.
#[derive(Debug, thiserror::Error)]
#[error("the renewal was not answered either way (too few RedLock masters, or its Cluster shard, answered)")]
pub(crate) struct Undecided;

/// One lock to renew: its name, its holder's token and the lease it asks for.
pub(crate) type Renewing<'a> = (&'a Lock, &'a str, u64);

/// How a lock is given back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Release<'a> {
    /// Keep the lock this much longer (what is left of its minimum hold); 0 to free it now.
    pub(crate) hold_ms: u64,
    /// What it is; a hint that spares a store a first try (a share is recognised by its token
    /// whatever this says).
    pub(crate) kind: Kind,
    /// The release of an attempt whose answer never came, sent after it (see [`Flight`]).
    pub(crate) after: Option<&'a Flight>,
}

/// What a release did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Released {
    /// It had expired or been taken: nothing was done.
    NotOurs,
    /// Given back (freed, or kept for its minimum hold): this client's next waiter may try now.
    Freed,
    /// Given back, with nothing for this client's waiters to do: other readers still share it,
    /// or the store named the next waiter itself (a fair hand-over).
    Quiet,
    /// Given back, and the store named the waiter it admits (by its token; a fair semaphore's
    /// release): this client wakes it at once if it is one of its own, without waiting for the
    /// store's announcement, which every other client hears.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Named(String),
    /// Given back, and handed over to that waiter (a permit of a fair semaphore, on
    /// PostgreSQL): this client hands it at once if the waiter is its own.
    HandedOver(String, crate::wakeups::HandedOver),
}

/// The route one attempt took to the store, for the release of an attempt whose answer never
/// came (the caller was cancelled, the answer timed out): a store that keeps several
/// connections records which one the attempt went on, so that the release follows it there and
/// cannot overtake it (an attempt that lands after its own release would take the lock for
/// nobody). One word, kept inline by the caller: nothing is allocated for it.
#[derive(Debug, Default)]
pub(crate) struct Flight(AtomicU64);

impl Flight {
    /// No route recorded.
    const NONE: u64 = 0;

    /// Records the route (a store's own number for a connection; not 0).
    pub(crate) fn set(&self, route: u64) {
        self.0.store(route, Ordering::Relaxed);
    }

    /// The route recorded, if any.
    pub(crate) fn get(&self) -> Option<u64> {
        Some(self.0.load(Ordering::Relaxed)).filter(|&r| r != Flight::NONE)
    }
}

/// Whether a store offers something; when not, why (said in the `InvalidOptions` refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offered {
    Yes,
    No(&'static str),
}

/// The refusal of an acquire asking `asked` permits of `key`, which is held with `held` (a lock
/// or a read-write lock counts 1): the count is stored with the key, and never obeyed silently.
pub(crate) fn permits_differ(key: &str, held: u32, asked: u32) -> LockError {
    let what = |n: u32| match n {
        1 => "1 permit (an ordinary lock)".to_owned(),
        n => format!("{n} permits"),
    };
    LockError::invalid_options(format!(
        "key {key:?} is held with {}, and this acquire asks for {}: every caller of one key must \
         ask for the same count",
        what(held),
        what(asked)
    ))
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
    /// Semaphores: more than one permit per key.
    pub(crate) permits: Offered,
    /// How its waiters learn that they may try again.
    pub(crate) waking: Waking,
}

/// How a store's waiters learn that they may try again: the one thing about waiting that
/// differs between stores (the client's wait loop does the rest the same for every store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waking {
    /// Every release is announced to every client listening for the lock (Redis pub/sub,
    /// PostgreSQL `NOTIFY`, in process): a waiter listens once refused, and a fair release names
    /// the head of the line ([`Notices::turn`]). `hands_over`: that release hands the lock to
    /// the head, who may hold it without asking (not where every acquire must be acknowledged
    /// by replicas: the release's write was not waited for, so the waiter asks, and its attempt
    /// is acknowledged).
    Announced { hands_over: bool },
    /// Every waiting call queues in the store (fair or not): its first attempt takes a place in
    /// line, which lasts as long as the client does, and the store wakes it by its token
    /// ([`Notices::turn`]) when the place ahead of it goes; its next attempt only looks. The
    /// client registers such a waiter before its first attempt, and does not re-ask to keep
    /// the place. `watched`: the store wakes it whatever happens ahead of it (ZooKeeper: the
    /// node ahead deleted or changed, the session ended, or the watch failed all wake it), so
    /// it naps only as a safety net ([`WATCHED_NAP`](crate::acquire)), not every 2 s.
    Queued { watched: bool },
    /// Another client's release does not reach this client's waiters (MySQL has no
    /// notifications): a waiter tries again on a short backoff ([`POLL_NAPS`](crate::acquire)),
    /// not only at the holder's expiry.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Polled,
}

impl Capabilities {
    /// Everything (the in-memory store; Redis without replica acknowledgement).
    pub(crate) const ALL: Capabilities = Capabilities {
        name: "redis",
        fencing: Offered::Yes,
        fair: Offered::Yes,
        shared: Offered::Yes,
        permits: Offered::Yes,
        waking: Waking::Announced { hands_over: true },
    };

    /// Everything, as [`ALL`](Self::ALL) offers it, by the store named `name`.
    pub(crate) const fn all(name: &'static str) -> Capabilities {
        Capabilities {
            name,
            ..Capabilities::ALL
        }
    }

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
            (options.is_semaphore(), self.permits, "semaphores (permits)"),
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

/// Where locks live: what one attempt, renewal and release do there. Every request is one
/// round trip (or one quorum of them) where the store allows, bounded by the response timeout;
/// the client does the waiting, renewing, validity and bookkeeping around them, the same for
/// every store. Written with `async fn`; the client holds stores as [`DynStore`], which one
/// blanket impl provides.
pub(crate) trait Store: Send + Sync + Debug + 'static {
    /// What this store offers; the client refuses options it does not, before any request.
    fn capabilities(&self) -> Capabilities;

    /// The store's name for the lock on `key` (the key is checked), made once per call.
    fn name(&self, key: &str) -> String;

    /// Connects now, and checks that this client may do everything the protocol does (`Refused`
    /// naming what it may not); for [`build`](crate::LockClientBuilder::build). A store with
    /// nothing to connect to answers at once.
    fn connect(&self) -> impl Future<Output = Result<(), LockError>> + Send {
        std::future::ready(Ok(()))
    }

    /// One attempt; idempotent for one token (a request sent again finds its own lock). `flight`
    /// records the route it took, for [`release`](Self::release) `after` it.
    fn attempt(
        &self,
        asked: Asked<'_>,
        flight: &Flight,
    ) -> impl Future<Output = Result<Attempt, LockError>> + Send;

    /// Takes every lock of the set (see [`SetAsk`]) in one request, or none of them; `None`
    /// where the store cannot here (the client then takes them one by one). Asked only for
    /// exclusive locks that are not fair, of more than one key, by a caller that is not waiting
    /// yet; with `ask.join` the caller will wait, and goes on key by key when refused (a refusal
    /// need not name the lock that refused it). `flight` records the route, for the release of
    /// each lock after it if its answer never comes.
    fn attempt_set(
        &self,
        _set: SetAsk<'_>,
        _flight: &Flight,
    ) -> impl Future<Output = Result<Option<SetAttempt>, LockError>> + Send {
        std::future::ready(Ok(None))
    }

    /// Lengthens each lock's lease to its ttl if it still holds its token (never shortens it),
    /// in one request where the store allows: what it found for each, in order.
    fn renew(&self, locks: &[Renewing<'_>]) -> impl Future<Output = Result<Vec<Renewal>, LockError>> + Send;

    /// Gives the lock back if it still holds `token` (or keeps it `hold_ms` longer), and tells
    /// waiters elsewhere (a fair lock: the head of the line).
    fn release(
        &self,
        lock: &Lock,
        token: &str,
        release: Release<'_>,
    ) -> impl Future<Output = Result<Released, LockError>> + Send;

    /// How long after the client gave up on an attempt (no answer within the response timeout,
    /// or its caller cancelled) the store may still apply it where that attempt's release can
    /// get there first and find nothing: a pool's other connection, where a store with one
    /// connection sends the release after the attempt on its route ([`Flight`]). The release
    /// of such an attempt that found nothing is sent again this long after. `None`: a release
    /// cannot overtake its attempt.
    fn late_attempts(&self) -> Option<Duration> {
        None
    }

    /// Takes `token` out of the lock's line and withdraws its claim as a waiting writer (a
    /// waiter that stops waiting). `claimed`: it may have claimed the writers' turn, so readers
    /// held back by the claim are told to try again. A store without a line has nothing to do.
    fn leave(
        &self,
        _lock: &Lock,
        _token: &str,
        _claimed: bool,
    ) -> impl Future<Output = Result<(), LockError>> + Send {
        std::future::ready(Ok(()))
    }

    /// Makes sure releases of `lock` reach this client's waiters (Redis: its channel is
    /// subscribed). Best effort: on failure a waiter still wakes at the holder's expiry. A store
    /// whose releases reach the notices directly (in memory) has nothing to do.
    fn listen(&self, _lock: &Lock) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// Nobody of this client waits for the lock named `name` any more (Redis: its channel may be
    /// unsubscribed).
    fn unlisten(&self, _name: &str) {}
}

/// What operators ask of a store (`LockClient::admin`, lockctl): reads and forced releases, off
/// the hot path. Implemented in each store's `admin.rs`.
pub(crate) trait StoreAdmin: Send + Sync {
    /// The lock as it is now.
    fn inspect(&self, lock: &Lock) -> impl Future<Output = Result<LockView, LockError>> + Send;

    /// The locks held now whose keys match the glob `pattern` (`*`, `?`, `[abc]`), sorted by key.
    #[cfg_attr(not(feature = "cli"), allow(dead_code))] // for operators (`admin`)
    fn list(&self, pattern: &str) -> impl Future<Output = Result<Vec<LockView>, LockError>> + Send;

    /// Frees the lock whoever holds it, if it still holds what `seen` shows, and wakes its
    /// waiters: `Ok(false)` when it was free by then, [`ForceReleased::Changed`] when it changed
    /// hands.
    fn force_release(
        &self,
        lock: &Lock,
        seen: &LockView,
    ) -> impl Future<Output = Result<ForceReleased, LockError>> + Send;
}

/// What a forced release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForceReleased {
    /// Freed, and its waiters told.
    Freed,
    /// Nothing to free: the lock was free by then.
    Gone,
    /// Left alone: another holder has it since it was seen.
    Changed,
}

impl ForceReleased {
    /// A forced release that freed nothing, told by the lock as read after it: `Changed` when
    /// someone holds it now, `Gone` when it is free.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn not_freed(now: &LockView) -> ForceReleased {
        ForceReleased::unless_held(now.is_held())
    }

    /// A forced release that freed nothing: `Changed` when someone `held` the lock after it,
    /// `Gone` when it was free.
    pub(crate) fn unless_held(held: bool) -> ForceReleased {
        match held {
            true => ForceReleased::Changed,
            false => ForceReleased::Gone,
        }
    }
}

/// What a store's request answers, boxed as a `dyn Future + Send` at the seam: a caller's future
/// then holds a pointer, not the store's state machines (redis-rs's are deep), so proving a
/// user's spawned task `Send` (and laying out its future) stops at the box. Without it, ordinary
/// user code (a spawned fn that acquires and releases) overflowed rustc's default query depth.
/// One allocation per request; the instructions and contention benches measure it.
pub(crate) type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, LockError>> + Send + 'a>>;

/// [`Store`] as the client holds it (`Arc<dyn DynStore>`): the same methods, each answer boxed.
/// Implemented once, for every store (with its [`StoreAdmin`]).
pub(crate) trait DynStore: Send + Sync + Debug {
    fn capabilities(&self) -> Capabilities;
    fn name(&self, key: &str) -> String;
    fn connect(&self) -> Answer<'_, ()>;
    fn attempt<'a>(&'a self, asked: Asked<'a>, flight: &'a Flight) -> Answer<'a, Attempt>;
    fn attempt_set<'a>(&'a self, set: SetAsk<'a>, flight: &'a Flight) -> Answer<'a, Option<SetAttempt>>;
    fn renew<'a>(&'a self, locks: &'a [Renewing<'a>]) -> Answer<'a, Vec<Renewal>>;
    fn release<'a>(&'a self, lock: &'a Lock, token: &'a str, release: Release<'a>) -> Answer<'a, Released>;
    fn late_attempts(&self) -> Option<Duration>;
    fn leave<'a>(&'a self, lock: &'a Lock, token: &'a str, claimed: bool) -> Answer<'a, ()>;
    fn inspect<'a>(&'a self, lock: &'a Lock) -> Answer<'a, LockView>;
    #[cfg_attr(not(feature = "cli"), allow(dead_code))]
    fn list<'a>(&'a self, pattern: &'a str) -> Answer<'a, Vec<LockView>>;
    fn force_release<'a>(&'a self, lock: &'a Lock, seen: &'a LockView) -> Answer<'a, ForceReleased>;
    fn listen<'a>(&'a self, lock: &'a Lock) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
    fn unlisten(&self, name: &str);
}

impl<S: Store + StoreAdmin> DynStore for S {
    fn capabilities(&self) -> Capabilities {
        Store::capabilities(self)
    }

    fn name(&self, key: &str) -> String {
        Store::name(self, key)
    }

    fn connect(&self) -> Answer<'_, ()> {
        Box::pin(Store::connect(self))
    }

    fn attempt<'a>(&'a self, asked: Asked<'a>, flight: &'a Flight) -> Answer<'a, Attempt> {
        Box::pin(Store::attempt(self, asked, flight))
    }

    fn attempt_set<'a>(&'a self, set: SetAsk<'a>, flight: &'a Flight) -> Answer<'a, Option<SetAttempt>> {
        Box::pin(Store::attempt_set(self, set, flight))
    }

    fn renew<'a>(&'a self, locks: &'a [Renewing<'a>]) -> Answer<'a, Vec<Renewal>> {
        Box::pin(Store::renew(self, locks))
    }

    fn release<'a>(&'a self, lock: &'a Lock, token: &'a str, release: Release<'a>) -> Answer<'a, Released> {
        Box::pin(Store::release(self, lock, token, release))
    }

    fn late_attempts(&self) -> Option<Duration> {
        Store::late_attempts(self)
    }

    fn leave<'a>(&'a self, lock: &'a Lock, token: &'a str, claimed: bool) -> Answer<'a, ()> {
        Box::pin(Store::leave(self, lock, token, claimed))
    }

    fn inspect<'a>(&'a self, lock: &'a Lock) -> Answer<'a, LockView> {
        Box::pin(StoreAdmin::inspect(self, lock))
    }

    fn list<'a>(&'a self, pattern: &'a str) -> Answer<'a, Vec<LockView>> {
        Box::pin(StoreAdmin::list(self, pattern))
    }

    fn force_release<'a>(&'a self, lock: &'a Lock, seen: &'a LockView) -> Answer<'a, ForceReleased> {
        Box::pin(StoreAdmin::force_release(self, lock, seen))
    }

    fn listen<'a>(&'a self, lock: &'a Lock) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(Store::listen(self, lock))
    }

    fn unlisten(&self, name: &str) {
        Store::unlisten(self, name);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{granted_until, lease_granted, name, Kind, Lock, Mode};
    use crate::{LockMode, LockOptions};

    /// A lock keeps its key inside its name where the name ends with it in braces, and the key
    /// it answers is the one it was made with, whatever the key holds (braces, characters of
    /// several bytes) and whatever form the name has.
    #[test]
    fn a_lock_answers_its_key_and_name_as_made() {
        for key in ["k", "order:42", "a{b", "a}b", "{", "}", "{}", "ключ", "x{ключ}"] {
            for prefix in ["lock:", "", "p{", "}"] {
                let lock = Lock::new(key, name(prefix, key));
                assert_eq!((lock.key(), lock.name()), (key, name(prefix, key).as_str()));
            }
            for other in ["lock:other", "rights-check-1", "p{k}", "{", ""] {
                let lock = Lock::new(key, other.to_owned());
                assert_eq!((lock.key(), lock.name()), (key, other));
                let copy = lock.clone();
                assert_eq!((copy.key(), copy.name()), (lock.key(), lock.name()));
            }
        }
        // A name that does not hold the key in braces keeps the key given, not the name's.
        assert_eq!(Lock::new("b", name("p:", "a")).key(), "b");
    }

    /// A grant shorter than the lease asked for bounds it; a longer one, or none, leaves it.
    #[test]
    fn a_grant_bounds_the_lease_only_when_sooner() {
        let sent = tokio::time::Instant::now();
        let lease = Duration::from_secs(10);
        let asked = sent + lease;
        let short = sent + Duration::from_secs(4);
        assert_eq!(granted_until(short, asked), Some(short));
        assert_eq!(granted_until(asked, asked), None);
        assert_eq!(granted_until(sent + Duration::from_secs(30), asked), None);
        assert_eq!(lease_granted(Some(short), sent, lease), Duration::from_secs(4));
        assert_eq!(lease_granted(None, sent, lease), lease);
        // Counted from the request's send: a grant already over leaves nothing.
        assert_eq!(
            lease_granted(Some(sent), sent + Duration::from_secs(1), lease),
            Duration::ZERO
        );
    }

    /// Each combination the options allow is one mode, and says what the stores read off it.
    #[test]
    fn the_options_make_one_mode_each() {
        let base = LockOptions::new(Duration::from_secs(1));
        let cases = [
            (base.clone(), Mode::Exclusive, (false, false, 1, Kind::Plain)),
            (base.clone().fair(true), Mode::Fair, (true, false, 1, Kind::Fair)),
            (
                base.clone().mode(LockMode::Shared),
                Mode::Shared,
                (false, true, 1, Kind::Shared),
            ),
            (
                base.clone().permits(3),
                Mode::Permits {
                    count: 3,
                    fair: false,
                },
                (false, false, 3, Kind::Permit),
            ),
            (
                base.clone().permits(3).fair(true),
                Mode::Permits { count: 3, fair: true },
                (true, false, 3, Kind::Permit),
            ),
            // One permit is the ordinary lock.
            (
                base.clone().permits(1).fair(true),
                Mode::Fair,
                (true, false, 1, Kind::Fair),
            ),
        ];
        for (options, mode, (fair, shared, permits, kind)) in cases {
            let made = Mode::of(&options);
            assert_eq!(made, mode, "{options:?}");
            assert_eq!(
                (made.fair(), made.shared(), made.permits(), made.kind()),
                (fair, shared, permits, kind),
                "{mode:?}"
            );
            assert_eq!(made.semaphore(), permits > 1, "{mode:?}");
        }
    }
}
