//! A held lock as its taker sees it: the guard, which extends it, tells when it is lost, and
//! releases it on every path (a dropped guard releases in the background).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::core::{release_held, release_in_background, Abandoned, Core};
use crate::options::{ceil_millis, MIN_TTL};
use crate::state::{Applied, LockState};
use crate::store::{Renewal, Undecided};
use crate::telemetry;
use crate::LockError;

/// A lock held by this process. Release it with [`release`](LockGuard::release); dropping it
/// releases in the background.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// use lock_runtime::{LockClient, LockOptions};
///
/// let client = LockClient::connect("redis://127.0.0.1:6379").await?;
/// let guard = client
///     .acquire("report:daily", &LockOptions::new(Duration::from_secs(30)).watchdog(true))
///     .await?;
/// // ... work while `guard.is_lost()` is false ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "a lock is released as soon as its guard is dropped"]
pub struct LockGuard {
    core: Arc<Core>,
    state: Arc<LockState>,
    /// Its id with the client's watchdog, when it is renewed.
    watched: Option<u64>,
    /// Its id among the client's held locks.
    held: u64,
    released: bool,
    /// A multi-key set's other locks ([`LockClient::acquire_all`](crate::LockClient::acquire_all)),
    /// in the set's canonical order after this one; empty for one lock.
    more: Vec<LockGuard>,
}

/// Short, and without the lock's token (the capability to renew or release it, which guards
/// printed into logs or panic messages must not carry): the key, the mode, the fencing token,
/// the validity left, whether it is lost, and the store.
impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.state.kind {
            crate::store::Kind::Shared => "shared",
            crate::store::Kind::Permit => "permit",
            _ => "exclusive",
        };
        let mut f = f.debug_struct("LockGuard");
        f.field("key", &self.key()).field("mode", &mode);
        if let Some(permit) = self.permit() {
            f.field("permit", &permit);
        }
        if !self.more.is_empty() {
            f.field("keys", &self.keys().collect::<Vec<_>>());
        }
        f.field("fencing_token", &self.fencing_token())
            .field(
                "valid_for",
                &self.state.valid_until().saturating_duration_since(Instant::now()),
            )
            .field("lost", &self.is_lost())
            .field("store", &self.core.store.capabilities().name)
            .finish()
    }
}

impl LockGuard {
    /// A held lock, set to expire `lease` after `sent` ([`LockState::new`]). The watchdog
    /// renews it with `watchdog`; a lock handed over by a fair release for less than its ttl it
    /// extends to its ttl a third of the lease in either way (once, without `watchdog`), so a
    /// lock released before then costs no request at all.
    pub(crate) fn new(
        core: Arc<Core>,
        state: LockState,
        watchdog: bool,
        (sent, lease): (Instant, Duration),
    ) -> Self {
        let state = Arc::new(state);
        let watched = (watchdog || lease < state.ttl).then(|| {
            core.watchdog
                .watch(&core.store, Arc::clone(&state), (sent, lease), !watchdog)
        });
        let held = core.held.insert(Arc::clone(&state));
        LockGuard {
            core,
            state,
            watched,
            held,
            released: false,
            more: Vec::new(),
        }
    }

    /// Renews this lock every ttl/3, whatever the options said of the watchdog, until
    /// [`stop_keeping`](Self::stop_keeping): a set's earlier lock while the set waits for its
    /// later ones (the caller has not started, and a set never answers with a lock that lapsed
    /// meanwhile). Returns what `stop_keeping` needs to put it back as it was.
    pub(crate) fn keep(&mut self) -> Kept {
        match self.watched {
            Some(id) => match self.core.watchdog.set_once(id, false) {
                Some(true) => Kept::WasOnce,
                _ => Kept::Already,
            },
            None => {
                let lease = (self.state.taken_at, self.state.ttl);
                let id = self
                    .core
                    .watchdog
                    .watch(&self.core.store, Arc::clone(&self.state), lease, false);
                self.watched = Some(id);
                Kept::WasNot
            }
        }
    }

    /// Renews it as its options said again, after [`keep`](Self::keep).
    pub(crate) fn stop_keeping(&mut self, kept: Kept) {
        match (kept, self.watched) {
            (Kept::WasNot, Some(id)) => {
                self.core.watchdog.unwatch(id);
                self.watched = None;
            }
            (Kept::WasOnce, Some(id)) => {
                self.core.watchdog.set_once(id, true);
            }
            _ => {}
        }
    }

    /// This guard, holding `more` with it as one set.
    pub(crate) fn with_more(mut self, more: Vec<LockGuard>) -> LockGuard {
        self.more = more;
        self
    }

    /// The state of every lock it holds, this one first.
    pub(crate) fn states(&self) -> Vec<Arc<LockState>> {
        std::iter::once(&self.state)
            .chain(self.more.iter().map(|g| &g.state))
            .cloned()
            .collect()
    }

    /// Every key it holds: one, or a multi-key set's keys in their canonical order (each once).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.key()).chain(self.more.iter().map(LockGuard::key))
    }

    /// The fencing token taken for `key`, one of the keys this guard holds (a multi-key set's
    /// keys each have their own, strictly increasing per key); `None` when it holds no such key
    /// or took no token.
    pub fn fencing_token_for(&self, key: &str) -> Option<u64> {
        std::iter::once(self)
            .chain(&self.more)
            .find(|g| g.key() == key)
            .and_then(LockGuard::fencing_token)
    }

    /// The permit held of `key`, one of the keys this guard holds (a multi-key set of
    /// semaphores holds a permit of each key); `None` when it holds no such key, or holds it as
    /// a lock.
    pub fn permit_for(&self, key: &str) -> Option<u32> {
        std::iter::once(self)
            .chain(&self.more)
            .find(|g| g.key() == key)
            .and_then(LockGuard::permit)
    }

    pub(crate) fn state(&self) -> &Arc<LockState> {
        &self.state
    }

    /// The key as the caller gave it, without the prefix.
    pub fn key(&self) -> &str {
        self.state.key()
    }

    /// The fencing token taken with the lock, when the options asked for one: strictly greater
    /// than every token handed out for this key before.
    pub fn fencing_token(&self) -> Option<u64> {
        self.state.fence
    }

    /// The permit held (`0..n`), when the options asked for more than one
    /// ([`LockOptions::permits`](crate::LockOptions::permits)): no two holders of the key's
    /// permits at one time hold the same one. `None` for a lock.
    pub fn permit(&self) -> Option<u32> {
        self.state.permit
    }

    /// Whether the lock is lost: the backend said so, or its validity ran out without renewal.
    /// A multi-key set is lost when any of its locks is.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost() || self.more.iter().any(LockGuard::is_lost)
    }

    /// Completes when the lock is lost (never, while it is renewed and ours); a multi-key set,
    /// when any of its locks is.
    pub async fn lost(&self) {
        if self.more.is_empty() {
            return self.state.lost().await;
        }
        let each = self.states();
        let lost = each.iter().map(|state| Box::pin(state.lost()));
        futures_util::future::select_all(lost).await;
    }

    /// Makes the lock expire no sooner than `ttl` from now, if it is still ours;
    /// [`LockError::Lost`] if not. A lease is only ever lengthened: `extend(2 s)` after
    /// `extend(60 s)` keeps the 60 s, in the store and in [`is_lost`](LockGuard::is_lost). With
    /// a [maximum hold](crate::LockOptions::hold_at_most), no further than it. With
    /// [replica acknowledgement](crate::LockClientBuilder::wait_for_replicas), an extend too few
    /// replicas acknowledged is [`LockError::NotReplicated`], and the lock keeps the validity it
    /// had. The watchdog, if any, goes on renewing with the original ttl.
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        self.extend_all(ttl).await.map_err(|e| e.on_key(self.key()))
    }

    /// [`extend`](Self::extend) of every lock it holds, in one request to the store (a
    /// multi-key set's locks in one batch, as the watchdog renews them).
    async fn extend_all(&self, ttl: Duration) -> Result<(), LockError> {
        if ttl < MIN_TTL || ttl > crate::options::MAX_DURATION {
            return Err(LockError::invalid_options(format!(
                "extend ttl {ttl:?} is outside {MIN_TTL:?}..={:?}",
                crate::options::MAX_DURATION
            )));
        }
        let states = self.states();
        if let Some(lost) = states.iter().find(|s| s.is_lost()) {
            return Err(lost_error(lost));
        }
        let sent = Instant::now();
        let mut leases = Vec::with_capacity(states.len());
        for state in &states {
            // None: its maximum hold is reached.
            leases.push(state.renewal(ttl, sent).ok_or_else(|| lost_error(state))?);
        }
        let locks: Vec<_> = states
            .iter()
            .zip(&leases)
            .map(|(s, lease)| (&s.lock, s.token.as_str(), ceil_millis(*lease)))
            .collect();
        let renewed = self
            .core
            .store
            .renew(&locks)
            .await
            .inspect_err(|_| telemetry::renewal_failed())?;
        // Each lock's answer moves its own validity; the first failure is the call's.
        let mut failed = None;
        for (i, (state, lease)) in states.iter().zip(leases).enumerate() {
            let answer = renewed.get(i).copied().unwrap_or(Renewal::Undecided);
            if let (Err(e), None) = (extended(state, sent, lease, answer), &failed) {
                failed = Some(e);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Releases the lock: `Ok(true)` if it was still ours (it is deleted, or with a minimum
    /// hold, left to expire at its end), `Ok(false)` if it had already expired or been taken.
    /// The watchdog stops renewing it before the release is sent.
    ///
    /// If this future is dropped before the answer comes (a timeout around it, a cancelled
    /// task), the guard's `Drop` sends the release again in the background: it is token-checked,
    /// so a second one is harmless, and the lock is never left held.
    pub async fn release(mut self) -> Result<bool, LockError> {
        // A multi-key set: its locks in reverse canonical order, this (the first) last, each
        // whatever the others answered (one that failed is released again in the background by
        // its guard's drop). A waiter for the set, which takes the keys in canonical order,
        // waits on the first: released last, it finds the later ones free already, instead of
        // being woken once per key.
        let more = std::mem::take(&mut self.more);
        let mut released = Ok(true);
        for guard in more.into_iter().rev() {
            let other = Box::pin(guard.release()).await;
            released = both(released, other);
        }
        self.unwatch();
        let first = release_held(&self.core, &self.state).await;
        self.released = true;
        both(released, first)
    }

    fn unwatch(&mut self) {
        if let Some(id) = self.watched.take() {
            self.core.watchdog.unwatch(id);
        }
        self.core.held.forget(self.held);
    }
}

fn lost_error(state: &LockState) -> LockError {
    LockError::Lost {
        key: state.key().to_owned(),
    }
}

/// What an extend's answer for one lock of the guard (`state`, asked for `lease` in a request
/// sent at `sent`) does to it.
fn extended(state: &LockState, sent: Instant, lease: Duration, renewed: Renewal) -> Result<(), LockError> {
    match state.apply(renewed, sent, lease) {
        Applied::Renewed { valid: true, .. } => {
            telemetry::renewed(1);
            Ok(())
        }
        // Answered after the lock's validity ran out: it stays lost.
        Applied::Renewed { valid: false, .. } => Err(lost_error(state)),
        Applied::Gone { newly } => {
            if newly {
                tracing::warn!(key = %state.key(), "lock lost: found gone or taken on extend");
            }
            Err(lost_error(state))
        }
        Applied::Undecided => {
            telemetry::renewal_failed();
            Err(LockError::unavailable(Undecided))
        }
        Applied::NotReplicated { acked, wanted } => {
            telemetry::renewal_failed();
            Err(LockError::NotReplicated {
                key: state.key().to_owned(),
                acked,
                wanted,
            })
        }
    }
}

/// How a lock was renewed before [`LockGuard::keep`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kept {
    /// By the watchdog every ttl/3 already (or not at all, being released).
    Already,
    /// Once, as a lock handed over with a short lease.
    WasOnce,
    /// Not at all.
    WasNot,
}

/// Two releases' answers as one: ours if both were, the first error otherwise.
fn both(a: Result<bool, LockError>, b: Result<bool, LockError>) -> Result<bool, LockError> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(a && b),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // A set's other locks first, the last one first (see `release`).
        while let Some(more) = self.more.pop() {
            drop(more);
        }
        if self.released {
            return;
        }
        self.unwatch();
        release_in_background(Arc::clone(&self.core), Abandoned::Held(Arc::clone(&self.state)));
    }
}
