//! [`LockClient`]: taking locks, waiting for them, and running code under them.

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::acquire::Acquire;
use crate::core::{release_state, Core};
use crate::guard::LockGuard;
use crate::holder::Holder;
use crate::store::memory::MemoryStore;
use crate::store::{ForceReleased, Kind, Lock, Timeouts};
use crate::telemetry::{self, Labels};
use crate::{scope, LockError, LockMode, LockOptions, DEFAULT_PREFIX};

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

    /// `checked`, counted in the metrics if it is a refusal.
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
        checked
    }

    /// The wait loop ([`Acquire`]) for a checked key.
    fn acquire_lock<'a>(
        &'a self,
        key: &'a str,
        lock: Lock,
        options: &'a LockOptions,
    ) -> impl Future<Output = Result<LockGuard, LockError>> + Send + 'a {
        Acquire {
            core: &self.core,
            key,
            lock,
            options,
        }
        .run()
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
            return self.run_nested(key, &outer, options, body).await;
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
            tracing::warn!(key, error = %e, "lock release failed; the lock will expire");
        }
        outcome
    }

    /// A call on a key that an enclosing call of this call chain holds: it runs without acquiring,
    /// after the other nested calls of that enclosing body that came first (they take turns),
    /// under its own lost-lock policy, and its minimum hold extends the lock's.
    async fn run_nested<F: Future>(
        &self,
        key: &str,
        outer: &scope::Frame,
        options: &LockOptions,
        body: F,
    ) -> Result<F::Output, LockError> {
        let state = &outer.state;
        if state.kind == Kind::Shared && options.get_mode() == LockMode::Exclusive {
            return Err(LockError::invalid_options(format!(
                "an exclusive call on `{key}` inside a shared (read) call on it would wait for \
                 itself: take the outermost call exclusive (a shared call inside an exclusive \
                 one runs)"
            )));
        }
        if options.is_fencing() && state.fence.is_none() {
            return Err(LockError::invalid_options(format!(
                "a nested call on `{key}` asks for a fencing token, but the enclosing call \
                 holds the lock without one: ask for `fencing` on the outermost call"
            )));
        }
        let _turn = outer.turns.lock().await;
        if state.is_lost() {
            return Err(LockError::Lost { key: key.to_owned() });
        }
        state.hold_at_least_until(Instant::now() + options.get_hold_at_least());
        let body = state.run_body(options.get_on_lost(), body);
        scope::enter(self.core.id(), Arc::clone(state), body).await
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
    /// acquires, cancelled fair waiters giving up their places), each bounded by the response
    /// timeout. Afterwards every acquire fails with
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
        let releases = locks.iter().map(|state| release_state(&self.core, state));
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
