//! What every part of a client shares: its store, its prefix and owner label, its waiters, the
//! locks it holds and the watchdog that renews them. The client's facade, the wait loop and the
//! guards hold it; it knows none of them.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::held::HeldLocks;
use crate::options::ceil_millis;
use crate::state::LockState;
use crate::store::{DynStore, Flight, Kind, Lock, Release, Released, Timeouts};
use crate::telemetry;
use crate::wakeups::Wakeups;
use crate::watchdog::Watchdog;
use crate::{LockError, LockOptions, MAX_KEY_LEN};

/// One client's shared inside.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) store: Arc<dyn DynStore>,
    /// This client's waiters, by lock: the store tells them of releases.
    pub(crate) wakeups: Arc<Wakeups>,
    pub(crate) timeouts: Timeouts,
    pub(crate) prefix: String,
    /// Stored with every lock this client takes (see [`LockClient::holder`](crate::LockClient::holder)).
    pub(crate) owner: String,
    /// Metrics carry the key's class (see
    /// [`LockClientBuilder::metrics_key_class`](crate::LockClientBuilder::metrics_key_class)).
    pub(crate) metrics_key_class: bool,
    pub(crate) watchdog: Arc<Watchdog>,
    pub(crate) held: Arc<HeldLocks>,
}

impl Drop for Core {
    fn drop(&mut self) {
        self.watchdog.stop();
    }
}

impl Core {
    /// A client's inside: `store` tells `wakeups` of releases (it was opened with its notices),
    /// and is told when nobody waits for a lock any more.
    pub(crate) fn new(
        (store, wakeups, timeouts): (Arc<dyn DynStore>, Arc<Wakeups>, Timeouts),
        prefix: String,
        owner: String,
        metrics_key_class: bool,
    ) -> Core {
        let told = Arc::downgrade(&store);
        wakeups.on_idle(move |name| {
            if let Some(store) = told.upgrade() {
                store.unlisten(name);
            }
        });
        let held: Arc<HeldLocks> = Arc::default();
        let holders = Arc::downgrade(&held);
        wakeups.on_lost(move |tokens| {
            if let Some(held) = holders.upgrade() {
                held.lost(tokens);
            }
        });
        Core {
            store,
            wakeups,
            timeouts,
            prefix,
            owner,
            metrics_key_class,
            watchdog: Arc::default(),
            held,
        }
    }

    /// Which client a held lock belongs to, for reentrancy.
    pub(crate) fn id(self: &Arc<Self>) -> usize {
        Arc::as_ptr(self) as usize
    }

    /// The lock on `key` as the store names it, once the key is found valid.
    pub(crate) fn lock(&self, key: &str) -> Result<Lock, LockError> {
        let reason = if key.is_empty() {
            "the key is empty"
        } else if key.len() > MAX_KEY_LEN {
            "the key is longer than 1024 bytes"
        } else if key.contains('\0') {
            // One rule on every store: PostgreSQL's text, ZooKeeper's node names and MySQL's
            // keys cannot hold a NUL byte, so no store takes one.
            "the key contains a NUL byte (\\0), which not every store can hold"
        } else {
            return Ok(Lock::new(key, self.store.name(key)));
        };
        let mut end = key.len().min(64);
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        Err(LockError::InvalidKey {
            key: key[..end].to_owned(),
            reason,
        })
    }

    /// The lock on `key`, once the key and the options are found valid.
    pub(crate) fn checked(&self, key: &str, options: &LockOptions) -> Result<Lock, LockError> {
        let lock = self.lock(key)?;
        options.validate()?;
        Ok(lock)
    }

    /// Refuses options the store does not offer, before an acquire (checked here, once per
    /// call: nothing below asks which store it is). A call nested in one that holds the lock
    /// acquires nothing, and is not asked.
    pub(crate) fn offered(&self, options: &LockOptions) -> Result<(), LockError> {
        self.store.capabilities().check(options)
    }
}

/// The token-checked release of a held lock (its minimum hold honoured).
pub(crate) async fn release_state(core: &Core, state: &LockState) -> Result<bool, LockError> {
    let released = release_lock(
        core,
        &state.lock,
        &state.token,
        Some(state.hold_until()).filter(|until| *until > state.taken_at),
        state.kind,
    )
    .await;
    // A lock kept for its minimum hold answers a second release (shutdown's, then the guard's)
    // as released too: its hold time is recorded once.
    if matches!(released, Ok(true))
        && !state.release_seen.swap(true, Ordering::Relaxed)
        && (cfg!(feature = "metrics") || tracing::enabled!(tracing::Level::DEBUG))
    {
        let held = state.taken_at.elapsed();
        telemetry::released(&state.labels(), held);
        tracing::debug!(key = %state.key(), held_ms = ceil_millis(held), "lock released");
    }
    released
}

/// [`release_state`], and when it fails (the store restarting in that moment, a connection
/// cut), sent again in the background until it is answered or the lease ends: a
/// token-checked release is harmless twice, and without it the key would stay held to the end
/// of its lease. The first failure is still the answer.
pub(crate) async fn release_held(core: &Arc<Core>, state: &Arc<LockState>) -> Result<bool, LockError> {
    let released = release_state(core, state).await;
    if let Err(e) = &released {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let releasing = core.held.releasing();
            let (core, state, failed) = (Arc::clone(core), Arc::clone(state), e.to_string());
            runtime.spawn(async move {
                let _releasing = releasing;
                send_again(&core, &state, failed).await;
            });
        }
    }
    released
}

/// Sends a failed release again on a bounded backoff (50 ms doubling to 1 s) while the lock's
/// lease lasts; once it is over the store has let the lock go by itself, and the release is
/// given up with a warning and `lock_releases_given_up_total`.
async fn send_again(core: &Core, state: &LockState, mut failed: String) {
    let mut pause = Duration::from_millis(50);
    loop {
        let end = state.valid_until().max(state.hold_until());
        if Instant::now() + pause >= end {
            break;
        }
        tokio::time::sleep(pause).await;
        match release_state(core, state).await {
            Ok(_) => {
                tracing::debug!(key = %state.key(), "lock released on a later try");
                return;
            }
            Err(e) => failed = e.to_string(),
        }
        pause = (pause * 2).min(Duration::from_secs(1));
    }
    telemetry::release_given_up();
    tracing::warn!(key = %state.key(), error = %failed, "lock release failed until the lease ended; the lock expires by itself");
}

/// The release of what an abandoned attempt may have taken, sent again on [`send_again`]'s
/// backoff after a failure (the store down, a row locked past the response timeout) while that
/// may last (`until`): given up, the lock would be held for nobody until its ttl.
async fn give_back_until(
    core: &Core,
    (lock, token): (&Lock, &str),
    release: Release<'_>,
    until: Instant,
) -> Result<bool, LockError> {
    let mut pause = Duration::from_millis(50);
    loop {
        let released = give_back(core, lock, token, release).await;
        if released.is_ok() || Instant::now() + pause >= until {
            return released;
        }
        tracing::debug!(key = %lock.key(), "the release of an abandoned acquire failed; sent again");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// The token-checked release; with a minimum hold (`hold_until`) left, the lock is kept until
/// then.
async fn release_lock(
    core: &Core,
    lock: &Lock,
    token: &str,
    hold_until: Option<Instant>,
    kind: Kind,
) -> Result<bool, LockError> {
    let hold_ms = hold_until.map_or(0, |until| {
        ceil_millis(until.saturating_duration_since(Instant::now()))
    });
    let release = Release {
        hold_ms,
        kind,
        after: None,
    };
    let released = give_back(core, lock, token, release)
        .await
        .inspect_err(|_| telemetry::release_failed())?;
    let key = lock.key();
    if !released {
        tracing::debug!(key, "lock had expired or been taken before its release");
    } else if hold_ms > 0 {
        tracing::debug!(key, hold_ms, "lock kept for its minimum hold");
    }
    Ok(released)
}

/// The store's release, and the wake-up of this client's next waiter it leaves to the client:
/// `true` when it was ours.
pub(crate) async fn give_back(
    core: &Core,
    lock: &Lock,
    token: &str,
    release: Release<'_>,
) -> Result<bool, LockError> {
    match core.store.release(lock, token, release).await? {
        Released::NotOurs => Ok(false),
        Released::Freed => {
            // This client's own next waiter need not hear it from the store (which skips this
            // client's own announcements, where it has any).
            core.wakeups.released(lock.name());
            Ok(true)
        }
        Released::Quiet => Ok(true),
        Released::Named(waiter) => {
            core.wakeups.admitted(lock.name(), &waiter, None);
            Ok(true)
        }
        Released::HandedOver(waiter, handed) => {
            core.wakeups.admitted(lock.name(), &waiter, Some(handed));
            Ok(true)
        }
    }
}

/// Releases from a spawned task: for a dropped guard (`state`), and for an acquire abandoned in
/// flight (`key`, `keys`, `token`). Outside a tokio runtime there is nothing to send it from, and
/// the lock is left to expire at its ttl.
pub(crate) fn release_in_background(core: Arc<Core>, lock: Abandoned) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(key = %lock.key(), "no tokio runtime to release from; the lock is left to expire");
        return;
    };
    let releasing = core.held.releasing();
    runtime.spawn(async move {
        let _releasing = releasing;
        let released = match &lock {
            Abandoned::Held(state) => match release_state(&core, state).await {
                Err(e) => {
                    send_again(&core, state, e.to_string()).await;
                    return;
                }
                released => released,
            },
            Abandoned::InFlight {
                lock,
                token,
                kind,
                flight,
                of_set,
                ttl,
            } => {
                // What the attempt may have taken lasts its ttl from when the store applies it,
                // which is no later than the store answers (or gives up) a request.
                let lasts_until = Instant::now() + *ttl + core.timeouts.response * 2;
                // After the acquire, on the route it took, even if that was replaced meanwhile:
                // a release on a newer one could reach the store first, and the acquire would
                // then take the lock for nobody.
                let release = Release {
                    hold_ms: 0,
                    kind: *kind,
                    after: Some(flight),
                };
                let mut released = give_back_until(&core, (lock, token), release, lasts_until).await;
                // The attempt may take this lock after its release found nothing: a set's
                // request (one statement locks a set's rows one after another, and this
                // release can reach a later row before the statement does), and any attempt on
                // a store whose release can overtake it (`late_attempts`). Given back once more
                // when any such request has ended (token-checked: harmless if the lock was
                // never taken).
                let set_ended = of_set.then(|| core.timeouts.response * 2 + Duration::from_secs(1));
                if let (Ok(false), Some(ended)) = (&released, set_ended.max(core.store.late_attempts())) {
                    tokio::time::sleep(ended).await;
                    released = give_back_until(&core, (lock, token), release, lasts_until).await;
                }
                if matches!(released, Ok(false)) {
                    tracing::debug!(key = %lock.key(), "an abandoned acquire had not taken the lock");
                }
                released.inspect_err(|_| telemetry::release_failed())
            }
        };
        if let Err(e) = released {
            tracing::warn!(key = %lock.key(), error = %e, "background lock release failed; the lock will expire");
        }
    });
}

/// A lock to release in the background.
#[derive(Debug)]
pub(crate) enum Abandoned {
    /// A held lock whose guard was dropped.
    Held(Arc<LockState>),
    /// An acquire whose answer never came: it may have taken the lock.
    InFlight {
        lock: Lock,
        token: String,
        kind: Kind,
        /// The route it took: its release follows it there.
        flight: Flight,
        /// One lock of a set attempt in one request: given back once more a while later.
        of_set: bool,
        /// The ttl the attempt asked for.
        ttl: Duration,
    },
}

impl Abandoned {
    fn key(&self) -> &str {
        match self {
            Abandoned::Held(state) => state.key(),
            Abandoned::InFlight { lock, .. } => lock.key(),
        }
    }
}
