//! [`LockClient`]: taking locks, waiting for them, and running code under them.

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::acquire::{Acquire, SetTaken};
use crate::core::{release_held, Core};
use crate::guard::{Kept, LockGuard};
use crate::holder::Holder;
use crate::state::LockState;
use crate::store::memory::MemoryStore;
use crate::store::{ForceReleased, Kind, Lock, Timeouts};
use crate::telemetry::{self, Labels};
use crate::{scope, LockError, LockMode, LockOptions, DEFAULT_PREFIX, MAX_KEYS};

/// Takes, waits for and releases locks. Cheap to clone (the connection is shared), `Send + Sync`.
///
/// One client keeps one multiplexed Redis connection for every lock it takes (opened at
/// [`build`](crate::LockClientBuilder::build) or at first use, replaced when it breaks or goes silent),
/// one more, opened at the first wait, on which waiters hear of releases, and one watchdog task
/// that renews all of its locks in batches.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// use lock_runtime::{LockClient, LockOptions};
///
/// let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
/// let options = LockOptions::new(Duration::from_secs(30)).watchdog(true);
/// let receipt = locks
///     .run("order:42", &options, async {
///         // at most one holder of `order:42` runs this at a time
///         "charged"
///     })
///     .await?;
/// # let _ = receipt; Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClient {
    core: Arc<Core>,
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClient")
            .field("store", &self.core.store.capabilities().name)
            .field("prefix", &self.core.prefix)
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// Connects to one Redis server: `redis://host:port`, `redis://user:pass@host:port/db`, or
    /// `rediss://…` (TLS, with the `tls` feature), or to a PostgreSQL database:
    /// `postgres://user:pass@host:port/db` (or `postgresql://…`, with the `postgres` feature),
    /// or to one etcd endpoint: `etcd://host:port` (with the `etcd` feature; a cluster's
    /// members go to [`LockClientBuilder::etcd`](crate::LockClientBuilder::etcd)), with the
    /// default prefix and timeouts.
    pub async fn connect(url: &str) -> Result<LockClient, LockError> {
        LockClient::builder().store(url).build().await
    }

    /// A process-local backend with the same semantics (ttl, tokens, fencing, waiting, watchdog)
    /// on tokio's clock: for tests of code that takes locks, and demos without Redis. It locks
    /// nothing across processes.
    pub fn in_memory() -> LockClient {
        let wakeups = crate::wakeups::Wakeups::new();
        let store = Arc::new(MemoryStore::new(DEFAULT_PREFIX, wakeups.notices()));
        LockClient::from_core(Core::new(
            (store, wakeups, Timeouts::default()),
            DEFAULT_PREFIX.to_owned(),
            crate::holder::default_owner(),
            false,
        ))
    }

    pub(crate) fn from_core(core: Core) -> LockClient {
        LockClient { core: Arc::new(core) }
    }

    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// The prefix put before every key.
    pub fn prefix(&self) -> &str {
        &self.core.prefix
    }

    /// Takes the lock on `key`, waiting up to `options.wait` if it is held.
    ///
    /// Fails with [`LockError::Busy`] when the wait runs out, [`LockError::Unavailable`] when
    /// Redis cannot be reached in time, and `InvalidKey`/`InvalidOptions` for bad input. Note that
    /// a bare `acquire` is its own owner: unlike [`run`](LockClient::run), it is not reentrant.
    pub async fn acquire(&self, key: &str, options: &LockOptions) -> Result<LockGuard, LockError> {
        let lock = self.checked(key, options)?;
        self.offered(key, options)?;
        self.acquire_lock(key, lock, options).await
    }

    /// The lock on `key`, once the key and the options are found valid; a bad one is counted as
    /// an `invalid` acquire in the metrics.
    fn checked(&self, key: &str, options: &LockOptions) -> Result<Lock, LockError> {
        let checked = self.core.checked(key, options);
        self.refused(key, options, checked)
    }

    /// Refuses options the store does not offer (counted as an `invalid` acquire).
    fn offered(&self, key: &str, options: &LockOptions) -> Result<(), LockError> {
        self.refused(key, options, self.core.offered(options))
    }

    /// `checked`, counted in the metrics if it is a refusal, which names the key.
    fn refused<T>(
        &self,
        key: &str,
        options: &LockOptions,
        checked: Result<T, LockError>,
    ) -> Result<T, LockError> {
        if let Err(e) = &checked {
            let shared = options.get_mode() == LockMode::Shared;
            let labels = Labels::new(shared, key, self.core.metrics_key_class);
            telemetry::acquire(&labels, telemetry::failure(e), Duration::ZERO, Duration::ZERO);
        }
        checked.map_err(|e| e.on_key(key))
    }

    /// The wait loop ([`Acquire`]) for a checked key.
    fn acquire_lock<'a>(
        &'a self,
        key: &'a str,
        lock: Lock,
        options: &'a LockOptions,
    ) -> impl Future<Output = Result<LockGuard, LockError>> + Send + 'a {
        let acquire = Acquire {
            core: &self.core,
            key,
            lock,
            options,
        }
        .run();
        // A store's refusal (a semaphore asked with another count, say) names the key too.
        async move { acquire.await.map_err(|e| e.on_key(key)) }
    }

    /// Runs `body` while holding the lock on `key`: acquires (waiting up to `options.wait`),
    /// runs the body under the watchdog and the lost-lock policy, and releases before returning.
    ///
    /// - The body's output comes back as `Ok`, whatever it is (an `Err` of the body's own is
    ///   `Ok(Err(..))` here); a failed release is logged and never replaces it.
    /// - Lost while running: with [`OnLost::Abort`](crate::OnLost::Abort) the body is dropped
    ///   and this returns [`LockError::Lost`]; with `Continue` it finishes, with a warning.
    /// - Panic or cancellation of this future releases the lock in the background.
    /// - Reentrant: called from inside a body that already holds `key` through this client
    ///   (on the same task), it runs `body` at once, and leaves the release to the outer call.
    ///
    /// The body may borrow locals (no `'static` bound). The future is `Send` when `body` and its
    /// output are (the output is kept across the release).
    pub async fn run<F: Future>(
        &self,
        key: &str,
        options: &LockOptions,
        body: F,
    ) -> Result<F::Output, LockError> {
        // Boxed once, before anything else: the body is then moved around as a pointer, so
        // the future of a guarded call (and of calls nested in it) holds it only once.
        let body = Box::pin(body);
        let lock = self.checked(key, options)?;
        if let Some(outer) = scope::held(self.core.id(), lock.name()) {
            let state = outer
                .state_for(lock.name())
                .cloned()
                .unwrap_or_else(|| Arc::clone(&outer.state));
            return self.run_nested(key, (&outer, &state), options, body).await;
        }
        self.offered(key, options)?;
        // Boxed: the acquire's state machine would otherwise sit inside every guarded future,
        // nested bodies included.
        let guard = Box::pin(self.acquire_lock(key, lock, options)).await?;
        let state = Arc::clone(guard.state());
        let outcome = scope::enter(
            self.core.id(),
            Arc::clone(&state),
            state.run_body(options.get_on_lost(), body),
        )
        .await;
        if let Err(e) = Box::pin(guard.release()).await {
            tracing::warn!(key, error = %e, "lock release failed; it is sent again in the background while the lease lasts");
        }
        outcome
    }

    /// A call on a key that an enclosing call of this call chain holds: it runs without acquiring,
    /// after the other nested calls of that enclosing body that came first (they take turns),
    /// under its own lost-lock policy, and its minimum hold extends the lock's.
    async fn run_nested<F: Future>(
        &self,
        key: &str,
        (outer, state): (&scope::Frame, &Arc<LockState>),
        options: &LockOptions,
        body: F,
    ) -> Result<F::Output, LockError> {
        Self::may_nest(key, state, options)?;
        let turn = scope::take_turn(outer).await;
        if state.is_lost() {
            return Err(LockError::Lost { key: key.to_owned() });
        }
        state.hold_at_least_until(Instant::now() + options.get_hold_at_least());
        let body = state.run_body(options.get_on_lost(), body);
        let turn_of = turn.is_some().then_some(outer);
        scope::enter_set(self.core.id(), (Arc::clone(state), Vec::new()), turn_of, body).await
    }

    /// Refuses a nested call on `key` that the enclosing call's lock (`state`) cannot serve
    /// (docs/attribute.md, "Nesting"): a lock serves a call of the same mode or a weaker one (a
    /// shared call inside an exclusive one), a permit serves a call for a permit of the same
    /// count; anything else would run its body beside other holders (an exclusive call inside a
    /// permit or a share) or wait for itself, so it is refused at once, naming both calls.
    fn may_nest(key: &str, state: &LockState, options: &LockOptions) -> Result<(), LockError> {
        let asked = options.get_mode();
        let serves = match state.kind {
            Kind::Permit => options.get_permits() == state.permits,
            Kind::Shared => !options.is_semaphore() && asked == LockMode::Shared,
            Kind::Plain | Kind::Fair => !options.is_semaphore(),
        };
        if !serves {
            let nested = match (options.is_semaphore(), asked) {
                (true, _) => format!("a call for a permit of {} on {key:?}", options.get_permits()),
                (false, LockMode::Shared) => format!("a shared (read) call on {key:?}"),
                (false, _) => format!("an exclusive call on {key:?}"),
            };
            let (outer, why) = match state.kind {
                Kind::Permit => (
                    format!("a call holding a permit of {} on it", state.permits),
                    "it would run beside the other permits' holders, or ask the key for another count",
                ),
                Kind::Shared => (
                    "a shared (read) call on it".to_owned(),
                    "it would run beside the other readers, or wait for itself",
                ),
                Kind::Plain | Kind::Fair => (
                    "an exclusive call on it".to_owned(),
                    "the key is held as a lock, not as a semaphore's permit",
                ),
            };
            return Err(LockError::invalid_options(format!(
                "{nested} inside {outer} cannot run in the lock the enclosing call holds: {why}; \
                 take the outermost call in the mode the inner one needs (an exclusive call \
                 serves exclusive and shared calls, a permit serves calls for the same count)"
            )));
        }
        if options.is_fencing() && state.fence.is_none() {
            return Err(LockError::invalid_options(format!(
                "a nested call on {key:?} asks for a fencing token, but the enclosing call \
                 holds the lock without one: ask for `fencing` on the outermost call"
            )));
        }
        Ok(())
    }

    /// Refuses a set nested in a call chain that holds some of its keys, when a key it holds
    /// comes after one it would take in the canonical order: the set would take that key
    /// after a later one, and could wait in a cycle with another caller's set of the same keys
    /// (which takes them in order). `locks` is the set, in canonical order; `held` says which
    /// of them the chain holds.
    fn may_take_the_rest(locks: &[Lock], held: &[bool]) -> Result<(), LockError> {
        let first_missing = held.iter().position(|h| !h);
        let last_held = held.iter().rposition(|h| *h);
        match (first_missing, last_held) {
            (Some(missing), Some(later)) if later > missing => {
                let names = |pick: bool| {
                    locks
                        .iter()
                        .zip(held)
                        .filter(|(_, h)| **h == pick)
                        .map(|(lock, _)| format!("`{}`", lock.key()))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                Err(LockError::invalid_options(format!(
                    "a set on {} nested in a call that holds {}: it would take {} after `{}`, \
                     against the keys' canonical order, and could wait in a cycle with another \
                     caller's set of the same keys; take the whole set in the outermost call",
                    locks
                        .iter()
                        .map(|lock| format!("`{}`", lock.key()))
                        .collect::<Vec<_>>()
                        .join(", "),
                    names(true),
                    names(false),
                    locks[later].key(),
                )))
            }
            _ => Ok(()),
        }
    }

    /// Takes every lock of a set of keys, or none: the keys (any order, duplicates taken once)
    /// are taken in one canonical order (the keys' bytes, sorted), so two calls that
    /// name the same keys in any order never wait for each other in a cycle; `options.wait`
    /// bounds the whole set (each key waits for what is left of it); a key refused, or any
    /// error, gives back the locks taken before the call answers (a cancelled call's guards
    /// give them back in the background). The guard holds the set: one watchdog renews its
    /// locks in the client's batches, it is lost when any of them is, and
    /// [`LockGuard::fencing_token_for`] gives each key's token. An empty set, or more than
    /// [`MAX_KEYS`] distinct keys, is [`LockError::InvalidKey`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// use lock_runtime::{LockClient, LockOptions};
    ///
    /// let locks = LockClient::in_memory();
    /// let options = LockOptions::new(Duration::from_secs(10)).fencing(true);
    /// let both = locks.acquire_all(["account:7", "account:3"], &options).await?;
    /// assert_eq!(both.keys().collect::<Vec<_>>(), ["account:3", "account:7"]);
    /// assert!(both.fencing_token_for("account:7").is_some());
    /// // Either order is the same set: a second caller waits or is refused, never half-in.
    /// assert!(locks.acquire_all(["account:3", "account:7"], &options).await.is_err());
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire_all<I, K>(&self, keys: I, options: &LockOptions) -> Result<LockGuard, LockError>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        let locks = self.checked_set(keys, options)?;
        if let Some(first) = locks.first() {
            self.offered(first.key(), options)?;
        }
        Box::pin(self.acquire_set(locks, options)).await
    }

    /// The locks of a set of keys, checked, in canonical order, each once.
    fn checked_set<I, K>(&self, keys: I, options: &LockOptions) -> Result<Vec<Lock>, LockError>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        let mut locks = Vec::new();
        for key in keys {
            locks.push(self.checked(key.as_ref(), options)?);
        }
        locks.sort_by(|a, b| a.key().cmp(b.key()));
        locks.dedup_by(|a, b| a.key() == b.key());
        let reason = match locks.len() {
            0 => "the set of keys is empty",
            n if n > MAX_KEYS => "more than 64 distinct keys in one set",
            _ => return Ok(locks),
        };
        Err(LockError::InvalidKey {
            key: locks.first().map_or_else(String::new, |l| l.key().to_owned()),
            reason,
        })
    }

    /// Takes `locks` (checked, in canonical order) one by one within one deadline, giving back
    /// what it took when one fails.
    async fn acquire_set(&self, locks: Vec<Lock>, options: &LockOptions) -> Result<LockGuard, LockError> {
        let deadline = Instant::now() + options.get_wait();
        // One request for the whole set where the store can (exclusive locks, not fair): a
        // refusal then costs nothing to give back, and a caller that waits goes on key by key.
        let plain =
            !options.is_fair() && options.get_mode() == LockMode::Exclusive && !options.is_semaphore();
        if locks.len() > 1 && plain {
            match Box::pin(crate::acquire::take_set_at_once(&self.core, &locks, options)).await? {
                SetTaken::All(guard) => return Ok(guard),
                SetTaken::Refused(key) if options.get_wait().is_zero() => {
                    return Err(LockError::Busy { key });
                }
                SetTaken::Refused(_) | SetTaken::NotHere => {}
            }
        }
        loop {
            match Box::pin(self.take_in_order(&locks, options, deadline)).await? {
                Ok(guard) => return Ok(guard),
                // A key lost while the set waited for a later one (an operator's forced
                // release, a store that lost it): all given back; taken again while the wait
                // lasts.
                Err(lost) if Instant::now() >= deadline => return Err(LockError::Busy { key: lost }),
                Err(_) => {}
            }
        }
    }

    /// Takes `locks` (checked, in canonical order) one by one within `deadline`. Each lock taken
    /// is kept (renewed) while the set waits for the later ones, and every one is found valid
    /// before the set answers: `Ok(Err(key))` when `key` was lost meanwhile (everything given
    /// back). A lock refused, or any error, gives back what was taken.
    async fn take_in_order(
        &self,
        locks: &[Lock],
        options: &LockOptions,
        deadline: Instant,
    ) -> Result<Result<LockGuard, String>, LockError> {
        let mut taken: Vec<(LockGuard, Kept)> = Vec::with_capacity(locks.len());
        let mut failed = None;
        for (i, lock) in locks.iter().enumerate() {
            let left = options
                .clone()
                .wait(deadline.saturating_duration_since(Instant::now()));
            match self.acquire_lock(lock.key(), lock.clone(), &left).await {
                Ok(mut guard) => {
                    // The last one starts the caller's body at once: nothing to keep it for.
                    let kept = match i + 1 < locks.len() {
                        true => guard.keep(),
                        false => Kept::Already,
                    };
                    taken.push((guard, kept));
                }
                Err(e) => {
                    failed = Some(Err(e));
                    break;
                }
            }
        }
        if failed.is_none() {
            if let Some((guard, _)) = taken.iter().find(|(guard, _)| guard.is_lost()) {
                tracing::warn!(key = %guard.key(), "a set's lock was lost while the set waited for its later keys; taking the set again");
                failed = Some(Ok(Err(guard.key().to_owned())));
            }
        }
        if let Some(failed) = failed {
            // Given back before the call answers, the last taken first.
            while let Some((guard, _)) = taken.pop() {
                let key = guard.key().to_owned();
                if let Err(e) = guard.release().await {
                    tracing::warn!(key = %key, error = %e, "giving back a set's lock failed; it will expire");
                }
            }
            return failed;
        }
        let mut guards = taken.into_iter().map(|(mut guard, kept)| {
            guard.stop_keeping(kept);
            guard
        });
        match guards.next() {
            Some(first) => Ok(Ok(first.with_more(guards.collect()))),
            None => Err(LockError::InvalidKey {
                key: String::new(),
                reason: "the set of keys is empty",
            }),
        }
    }

    /// Runs `body` while holding every lock of a set of keys ([`acquire_all`](Self::acquire_all)):
    /// the body is stopped (or, with [`OnLost::Continue`](crate::OnLost::Continue), let go on)
    /// when any of them is lost, and all are released before returning. Keys this call chain
    /// already holds (a nested call on a subset of an enclosing set) are not taken again; a body
    /// nested in it finds every key held ([`current`](crate::current) names the first, and
    /// [`LockInfo::fencing_token_for`](crate::LockInfo::fencing_token_for) each one's token).
    pub async fn run_all<I, K, F>(
        &self,
        keys: I,
        options: &LockOptions,
        body: F,
    ) -> Result<F::Output, LockError>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
        F: Future,
    {
        let body = Box::pin(body);
        let locks = self.checked_set(keys, options)?;
        // Keys an enclosing call holds run in its locks; the rest are taken as a set.
        let frames: Vec<Option<Arc<scope::Frame>>> = locks
            .iter()
            .map(|lock| scope::held(self.core.id(), lock.name()))
            .collect();
        let is_held: Vec<bool> = frames.iter().map(Option::is_some).collect();
        Self::may_take_the_rest(&locks, &is_held)?;
        let (mut held, mut missing, mut turns) = (Vec::new(), Vec::new(), None);
        for (lock, frame) in locks.into_iter().zip(frames) {
            match frame {
                Some(frame) => {
                    let state = frame
                        .state_for(lock.name())
                        .cloned()
                        .unwrap_or_else(|| Arc::clone(&frame.state));
                    Self::may_nest(lock.key(), &state, options)?;
                    held.push(state);
                    turns.get_or_insert(frame);
                }
                None => missing.push(lock),
            }
        }
        let guard = match missing.first() {
            None => None,
            Some(first) => {
                self.offered(first.key(), options)?;
                Some(Box::pin(self.acquire_set(missing, options)).await?)
            }
        };
        let turn = match (&guard, &turns) {
            (None, Some(frame)) => scope::take_turn(frame).await,
            _ => None,
        };
        let turn_of = match turn {
            Some(_) => turns.as_deref(),
            None => None,
        };
        let mut set = held;
        if let Some(guard) = &guard {
            set.extend(guard.states());
        }
        set.sort_by(|a, b| a.key().cmp(b.key()));
        if guard.is_none() {
            if let Some(lost) = set.iter().find(|s| s.is_lost()) {
                return Err(LockError::Lost {
                    key: lost.key().to_owned(),
                });
            }
            for state in &set {
                state.hold_at_least_until(Instant::now() + options.get_hold_at_least());
            }
        }
        let outcome = {
            let each: Vec<&LockState> = set.iter().map(|s| &**s).collect();
            let guarded = crate::state::run_guarded(&each, options.get_on_lost(), body);
            let mut frame = set.iter().cloned();
            match frame.next() {
                Some(first) => {
                    scope::enter_set(self.core.id(), (first, frame.collect()), turn_of, guarded).await
                }
                None => guarded.await,
            }
        };
        if let Some(guard) = guard {
            if let Err(e) = Box::pin(guard.release()).await {
                tracing::warn!(error = %e, "releasing a set of locks failed; each is sent again in the background while its lease lasts");
            }
        }
        outcome
    }

    /// Whether anyone holds the lock on `key` right now.
    pub async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        let lock = self.core.lock(key)?;
        Ok(self.core.store.inspect(&lock).await?.is_held())
    }

    /// How long the lock on `key` has left, `None` when nobody holds it (or, on Redis, when
    /// the key exists without an expiry, which a lock never does).
    pub async fn remaining_ttl(&self, key: &str) -> Result<Option<Duration>, LockError> {
        let lock = self.core.lock(key)?;
        Ok(self.core.store.inspect(&lock).await?.remaining)
    }

    /// Who holds the lock on `key`, and for how long yet; `None` when nobody does. For operators
    /// (who is blocking this job?), not for deciding whether to proceed: the answer may be out
    /// of date by the time it arrives.
    ///
    /// ```no_run
    /// # async fn demo(locks: lock_runtime::LockClient) -> Result<(), lock_runtime::LockError> {
    /// if let Some(holder) = locks.holder("order:42").await? {
    ///     println!("held by {:?} for {:?} more", holder.owner(), holder.remaining());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn holder(&self, key: &str) -> Result<Option<Holder>, LockError> {
        let lock = self.core.lock(key)?;
        let seen = self.core.store.inspect(&lock).await?;
        Ok(Holder::from_view(&seen))
    }

    /// Deletes the lock on `key` whoever holds it, and wakes its waiters; `true` if there was
    /// one. An administrative tool (as Redisson's `forceUnlock`): the holder finds out at its next
    /// renewal, or when its validity runs out.
    pub async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        let lock = self.core.lock(key)?;
        // What it holds, then freed if it still holds that: a holder that came meanwhile is
        // looked at again (a few times: locks that change hands faster than that are not stuck).
        for _ in 0..3 {
            let seen = self.core.store.inspect(&lock).await?;
            if !seen.is_held() {
                return Ok(false);
            }
            match self.core.store.force_release(&lock, &seen).await? {
                ForceReleased::Freed => {
                    self.core.wakeups.released(lock.name());
                    return Ok(true);
                }
                ForceReleased::Gone => return Ok(false),
                ForceReleased::Changed => {}
            }
        }
        Ok(true)
    }

    /// How many of this client's callers are waiting for `key` right now, queued in the order
    /// they began waiting (a release wakes the first of them).
    pub fn waiting(&self, key: &str) -> Result<usize, LockError> {
        let lock = self.core.lock(key)?;
        Ok(self.core.wakeups.queued(lock.name()))
    }

    /// Gives back every lock this client holds, for a process that is stopping (a SIGTERM
    /// handler, the end of `main`): without it, the locks of a stopping process stay held until
    /// their ttl ends, and the other instances wait that long.
    ///
    /// It stops the watchdog, marks every held lock lost (so guarded bodies with
    /// `on_lost = "abort"` stop), releases each one (token-checked, minimum holds honoured), and
    /// waits for releases already in flight in the background (dropped guards, abandoned
    /// acquires, cancelled fair waiters giving up their places), for at most the response
    /// timeout. (On PostgreSQL and MySQL the release of an acquire abandoned in flight that
    /// found nothing is sent again a few seconds later, in case the attempt landed after it:
    /// shutdown does not wait that long, and says so in a warning.) Afterwards every acquire fails with
    /// [`LockError::Unavailable`] (source [`ShutDown`](crate::ShutDown)). Calling it again does nothing more.
    ///
    /// ```no_run
    /// # async fn serve() {}
    /// # async fn demo(locks: lock_runtime::LockClient) {
    /// tokio::select! {
    ///     () = serve() => {}
    ///     _ = tokio::signal::ctrl_c() => {}
    /// }
    /// locks.shutdown().await; // the other instances can take the locks at once
    /// # }
    /// ```
    pub async fn shutdown(&self) {
        self.core.held.close();
        let bound = self.core.timeouts.response;
        // An acquire already on the wire may still take a lock: wait for it to be registered.
        if tokio::time::timeout(bound, self.core.held.acquires_settled())
            .await
            .is_err()
        {
            tracing::warn!(
                "shutdown: acquires still in flight after {bound:?}; their locks, if taken, will expire"
            );
        }
        self.core.watchdog.stop();
        let locks = self.core.held.take_all();
        for state in &locks {
            if state.give_up() {
                tracing::debug!(key = %state.key(), "lock given back by shutdown");
            }
        }
        let releases = locks.iter().map(|state| release_held(&self.core, state));
        for (state, released) in locks.iter().zip(join_all(releases).await) {
            if let Err(e) = released {
                tracing::warn!(key = %state.key(), error = %e, "lock release at shutdown failed; the lock will expire");
            }
        }
        if tokio::time::timeout(bound, self.core.held.released_all())
            .await
            .is_err()
        {
            tracing::warn!(
                "shutdown: background lock releases still in flight after {bound:?}; those locks will expire"
            );
        }
    }

    /// How many locks this client's watchdog renews right now.
    pub fn watched_locks(&self) -> usize {
        self.core.watchdog.len()
    }

    /// How many locks this client's waiters are listening on right now (each is one
    /// subscribed channel on Redis). Zero when nobody waits: subscriptions do not pile up.
    pub fn waiting_channels(&self) -> usize {
        self.core.wakeups.len()
    }
}

static DEFAULT_CLIENT: RwLock<Option<LockClient>> = RwLock::new(None);

/// Sets the client that `#[distributed_lock]` uses when no `client = …` is given, replacing
/// any earlier one.
pub fn set_default_client(client: LockClient) {
    let mut slot = DEFAULT_CLIENT.write().unwrap_or_else(|e| e.into_inner());
    *slot = Some(client);
}

/// The client set by [`set_default_client`], if any.
pub fn default_client() -> Option<LockClient> {
    DEFAULT_CLIENT.read().unwrap_or_else(|e| e.into_inner()).clone()
}
