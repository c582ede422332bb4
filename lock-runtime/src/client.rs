//! [`LockClient`]: taking locks, waiting for them, and running code under them.

use std::future::Future;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::backend::connection::{client_for_url, Place, Timeouts, TlsMaterial};
use crate::backend::memory::MemoryBackend;
use crate::backend::redis::RedisBackend;
use crate::backend::redis::Replicas;
use crate::backend::redlock::RedlockBackend;
use crate::backend::{Ask, Attempt, Backend, Kind, LockKeys, Pinned};
use crate::error::ShutDown;
use crate::guard::{release_in_background, release_state, Abandoned, LockGuard, LockState};
use crate::held::HeldLocks;
use crate::holder::Holder;
use crate::telemetry::{self, Labels};
use crate::wakeups::Registration;
use crate::watchdog::Watchdog;
use crate::{scope, LockError, LockMode, LockOptions, FAIR_PLACE_KEPT};

/// The longest key accepted, in bytes, before the prefix is added.
pub const MAX_KEY_LEN: usize = 1024;
/// The default key prefix: `order:42` is stored at `lock:{order:42}`.
pub const DEFAULT_PREFIX: &str = "lock:";
/// How long [`LockClientBuilder::build`] waits for a connection by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long any one Redis request may take by default before it fails as
/// [`LockError::Unavailable`].
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest a waiter sleeps between attempts: it is woken by the holder's release, or at the
/// holder's expiry, and at the latest after this, in case a release message was missed.
pub const MAX_WAIT_NAP: Duration = Duration::from_secs(2);

/// Takes, waits for and releases locks. Cheap to clone (the connection is shared), `Send + Sync`.
///
/// One client keeps one multiplexed Redis connection for every lock it takes (opened at
/// [`build`](LockClientBuilder::build) or at first use, replaced when it breaks or goes silent),
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
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match self.backend() {
            Backend::Redis(_) => "redis",
            Backend::Redlock(_) => "redlock",
            Backend::Memory(_) => "in-memory",
        };
        f.debug_struct("LockClient")
            .field("backend", &backend)
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub(crate) struct Inner {
    backend: Backend,
    prefix: String,
    /// Stored with every lock this client takes (see [`LockClient::holder`]).
    owner: String,
    /// Metrics carry the key's class (see [`LockClientBuilder::metrics_key_class`]).
    metrics_key_class: bool,
    watchdog: Arc<Watchdog>,
    held: Arc<HeldLocks>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.watchdog.stop();
    }
}

impl LockClient {
    /// Connects to one Redis server: `redis://host:port`, `redis://user:pass@host:port/db`, or
    /// `rediss://…` (TLS, with the `tls` feature), with the default prefix and timeouts.
    pub async fn connect(url: &str) -> Result<LockClient, LockError> {
        LockClient::builder().url(url).build().await
    }

    /// A process-local backend with the same semantics (ttl, tokens, fencing, waiting, watchdog)
    /// on tokio's clock: for tests of code that takes locks, and demos without Redis. It locks
    /// nothing across processes.
    pub fn in_memory() -> LockClient {
        LockClient::from_backend(
            Backend::Memory(Box::new(MemoryBackend::new())),
            DEFAULT_PREFIX.to_owned(),
            crate::holder::default_owner(),
            false,
        )
    }

    /// A builder for a client with a custom prefix or timeouts.
    pub fn builder() -> LockClientBuilder {
        LockClientBuilder::default()
    }

    fn from_backend(backend: Backend, prefix: String, owner: String, metrics_key_class: bool) -> LockClient {
        LockClient {
            inner: Arc::new(Inner {
                backend,
                prefix,
                owner,
                metrics_key_class,
                watchdog: Arc::default(),
                held: Arc::default(),
            }),
        }
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    pub(crate) fn watchdog(&self) -> &Arc<Watchdog> {
        &self.inner.watchdog
    }

    pub(crate) fn held(&self) -> &Arc<HeldLocks> {
        &self.inner.held
    }

    /// A handle that does not keep the client alive (for its own background tasks).
    pub(crate) fn downgrade(&self) -> Weak<Inner> {
        Arc::downgrade(&self.inner)
    }

    pub(crate) fn upgrade(inner: &Weak<Inner>) -> Option<LockClient> {
        inner.upgrade().map(|inner| LockClient { inner })
    }

    /// Which client a held lock belongs to, for reentrancy.
    fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The prefix put before every key.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    fn keys(&self, key: &str) -> Result<LockKeys, LockError> {
        let reason = if key.is_empty() {
            "the key is empty"
        } else if key.len() > MAX_KEY_LEN {
            "the key is longer than 1024 bytes"
        } else {
            return Ok(LockKeys::new(&self.inner.prefix, key));
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

    /// Takes the lock on `key`, waiting up to `options.wait` if it is held.
    ///
    /// Fails with [`LockError::Busy`] when the wait runs out, [`LockError::Unavailable`] when
    /// Redis cannot be reached in time, and `InvalidKey`/`InvalidOptions` for bad input. Note that
    /// a bare `acquire` is its own owner: unlike [`run`](LockClient::run), it is not reentrant.
    pub async fn acquire(&self, key: &str, options: &LockOptions) -> Result<LockGuard, LockError> {
        let keys = self.checked(key, options)?;
        self.acquire_keys(key, keys, options).await
    }

    /// The key's names, once the key and the options are found valid; a bad one is counted as
    /// an `invalid` acquire in the metrics.
    fn checked(&self, key: &str, options: &LockOptions) -> Result<LockKeys, LockError> {
        let checked = self.keys(key).and_then(|keys| options.validate().map(|()| keys));
        if let Err(e) = &checked {
            let shared = options.get_mode() == LockMode::Shared;
            let labels = Labels::new(shared, key, self.inner.metrics_key_class);
            telemetry::acquire(&labels, telemetry::failure(e), Duration::ZERO, Duration::ZERO);
        }
        checked
    }

    /// Attempts until the lock is taken or the wait runs out. Every way out goes through
    /// `outcome`, which records it (a plain fn: a wrapping `async fn` would nest this future one
    /// level deeper in every caller's, and deep futures overflow rustc's layout query limit).
    async fn acquire_keys(
        &self,
        key: &str,
        keys: LockKeys,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let called = Instant::now();
        let shared = options.get_mode() == LockMode::Shared;
        // How long the attempt that decided the call took, and whether the call made it at once.
        let mut deciding = Decided::default();
        let outcome = |result: Result<LockGuard, LockError>, deciding: Decided| {
            let labels = Labels::new(shared, key, self.inner.metrics_key_class);
            // A call its first attempt decided took that attempt's time (one clock read fewer
            // on the common path).
            let whole = if deciding.at_once {
                deciding.attempt
            } else {
                called.elapsed()
            };
            telemetry::acquire(&labels, telemetry::outcome(&result), deciding.attempt, whole);
            result
        };
        let backend = self.backend();
        if matches!(backend, Backend::Redlock(_)) && (options.is_fencing() || options.is_fair()) {
            return outcome(
                Err(LockError::invalid_options(
                "a RedLock client offers neither fencing (no single counter) nor fair mode (no single line)",
                )),
                deciding,
            );
        }
        if matches!(backend, Backend::Redlock(_)) && shared {
            return outcome(
                Err(LockError::invalid_options(
                    "a RedLock client offers no read-write locks (shares on a majority of masters \
                 could not keep writers out across a master's restart)",
                )),
                deciding,
            );
        }
        let deadline = called + options.get_wait();
        let will_wait = !options.get_wait().is_zero();
        let fair = options.is_fair();
        // One token for every attempt of this call: it is also a fair waiter's place in line.
        let token = crate::holder::new_value(&self.inner.owner);
        // A fair waiter's place in line, or a waiting writer's claim on a read-write lock: given
        // up if the call ends without the lock.
        let mut place = (fair && will_wait).then(|| QueuePlace::new(self, &keys, &token).fair());
        let mut claimed = false;
        let mut wakeup: Option<Registration> = None;
        // Until refused once, no holder's expiry is known.
        let mut pttl_ms = None;
        // The place a fair waiter's last refused attempt kept (its stamp), and when that attempt
        // was sent: a lock handed over for that place is valid from then.
        let mut last_kept: Option<(u64, Instant)> = None;
        // Local waiters queue in order: a newcomer that would wait joins the end of the queue
        // instead of barging in ahead of waiters already there, and tries when woken. (A fair
        // waiter asks at once: its place in line is taken in the store.)
        let mut sleep_first = false;
        if will_wait && !fair && backend.wakeups().queued(&keys.channel) > 0 {
            wakeup = Some(backend.wakeups().register(&keys.channel, None));
            sleep_first = true;
        }
        // An attempt made at once is sent as the call began (as far as a lock's validity, which
        // counts from the send, can tell): one clock read fewer on the common path.
        let mut at_once = (!sleep_first).then_some(called);
        loop {
            if let Some(wakeup) = &wakeup {
                // A fair waiter or a claiming writer must ask again before its place lapses:
                // by the end of its nap, however the subscriber fares (a subscription cut short
                // goes on by itself). Anyone else waits for it up to the own deadline.
                let keeps_place = fair || claimed;
                let nap_end = (keeps_place || sleep_first).then(|| {
                    let now = Instant::now();
                    now + nap(pttl_ms, keeps_place).min(deadline.saturating_duration_since(now))
                });
                let listen_until = nap_end.filter(|_| keeps_place).unwrap_or(deadline);
                let _ = tokio::time::timeout_at(listen_until, backend.listen(wakeup)).await;
                if let (true, Some(nap_end)) = (std::mem::take(&mut sleep_first), nap_end) {
                    tokio::select! {
                        () = wakeup.woken() => {}
                        () = tokio::time::sleep_until(nap_end) => {}
                    }
                }
            }
            // A fair release may have handed this waiter the lock: it holds it without asking,
            // when the hand-over was for the place its last attempt kept (one for an earlier
            // place may have lapsed since, and gone to the next in line; a fencing waiter the
            // release could take no token for, and one whose locks replicas must acknowledge,
            // ask instead: the lock is theirs already, if it still is).
            let handed = wakeup.as_ref().and_then(Registration::handed_over);
            let lease = FAIR_PLACE_KEPT.min(options.ttl());
            let handed = match (handed, last_kept) {
                // Enough of the lease left to be worth holding (else asking extends it to the
                // ttl).
                (Some(handed), Some((kept, sent)))
                    if handed.kept == kept
                        && Instant::now() + lease / 2 < sent + lease
                        && !(options.is_fencing() && handed.fence == 0)
                        && backend.takes_hand_overs() =>
                {
                    Some((handed.fence, sent))
                }
                _ => None,
            };
            // Counted before the check, so shutdown either refuses this attempt or waits for it
            // (until its lock, if it takes one, is registered). A lock handed over is given back
            // as the place is dropped.
            let in_flight = self.held().acquiring();
            if self.held().is_closed() {
                return outcome(Err(LockError::unavailable(ShutDown)), deciding);
            }
            // The lock's validity counts from `valid_from` for `lease`: when the attempt that
            // took it was sent, for its ttl; for a lock handed over, when the attempt whose place
            // it was handed over for was sent, for what was left of that place.
            let (attempt, started, (valid_from, lease)) = if let Some((fence, sent)) = handed {
                tracing::debug!(key, "lock handed over by a fair release");
                deciding = Decided::default(); // no request decided it
                let fence = options.is_fencing().then_some(fence);
                (Attempt::Acquired { fence }, Instant::now(), (sent, lease))
            } else {
                let ask = Ask {
                    ttl_ms: options.ttl_ms(),
                    fencing: options.is_fencing(),
                    waiting: wakeup.is_some(),
                    fair,
                    join: will_wait,
                    shared,
                    claimed,
                };
                let first = at_once.take();
                let started = first.unwrap_or_else(Instant::now);
                let pending = PendingAcquire::new(self, (key, &keys), &token, &ask);
                let answer = backend.acquire(&keys, &token, &ask, &pending.pin).await;
                deciding = Decided {
                    attempt: started.elapsed(),
                    at_once: first.is_some(),
                };
                match answer {
                    Ok(answer) => {
                        pending.settled();
                        (answer, started, (started, options.ttl()))
                    }
                    Err(e) => return outcome(Err(e), deciding), // `pending` releases in the background as it drops
                }
            };
            match attempt {
                Attempt::Acquired { fence } => {
                    match wakeup {
                        // A reader passes the wake-up on: the next waiter may be a reader too.
                        Some(wakeup) if shared => drop(wakeup),
                        Some(wakeup) => wakeup.acquired(),
                        None => {}
                    }
                    if let Some(place) = place {
                        place.taken();
                    }
                    tracing::debug!(key, fence, "lock acquired");
                    // Taken at `started` (a minimum hold and the hold time count from there:
                    // after the release, for a lock handed over).
                    let mut state =
                        LockState::new(key, keys, token, fence, options, started, (valid_from, lease));
                    state.by_key_class = self.inner.metrics_key_class;
                    let guard =
                        LockGuard::new(self.clone(), state, options.is_watchdog(), (valid_from, lease));
                    drop(in_flight); // registered: shutdown will find it
                    return outcome(Ok(guard), deciding);
                }
                Attempt::Held {
                    pttl_ms: left,
                    behind,
                    claimed: claim,
                    kept,
                } => {
                    if claim && !claimed {
                        claimed = true;
                        place = Some(
                            place
                                .take()
                                .unwrap_or_else(|| QueuePlace::new(self, &keys, &token))
                                .claimed(),
                        );
                    }
                    if Instant::now() >= deadline {
                        tracing::debug!(key, "lock busy");
                        return outcome(Err(LockError::Busy { key: key.to_owned() }), deciding);
                    }
                    // The call goes on: it will not have taken only this attempt's time.
                    deciding.at_once = false;
                    pttl_ms = left;
                    last_kept = kept.map(|kept| (kept, started));
                    if wakeup.is_none() {
                        // First refusal: listen for the release, then try again at once, so a
                        // release between that attempt and the subscription is not missed. An
                        // uncontended acquire never pays for the subscription. A fair waiter
                        // with others ahead in line need not: no release before its turn names it.
                        let name = fair.then_some(token.as_str());
                        wakeup = Some(backend.wakeups().register(&keys.channel, name));
                        sleep_first = behind;
                    } else {
                        sleep_first = true;
                    }
                }
                Attempt::NotReplicated { acked, wanted } => {
                    // Given back by the backend already.
                    let refused = LockError::NotReplicated {
                        key: key.to_owned(),
                        acked,
                        wanted,
                    };
                    return outcome(Err(refused), deciding);
                }
            }
        }
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
        let keys = self.checked(key, options)?;
        if let Some(outer) = scope::held(self.id(), &keys.lock) {
            return self.run_nested(key, &outer, options, body).await;
        }
        // Boxed: the acquire's state machine would otherwise sit inside every guarded future,
        // nested bodies included.
        let guard = Box::pin(self.acquire_keys(key, keys, options)).await?;
        let state = Arc::clone(guard.state());
        let outcome = scope::enter(
            self.id(),
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
        scope::enter(self.id(), Arc::clone(state), body).await
    }

    /// Whether anyone holds the lock on `key` right now.
    pub async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        let keys = self.keys(key)?;
        self.backend().is_locked(&keys).await
    }

    /// How long the lock on `key` has left, `None` when nobody holds it (or, on Redis, when
    /// the key exists without an expiry, which a lock never does).
    pub async fn remaining_ttl(&self, key: &str) -> Result<Option<Duration>, LockError> {
        let keys = self.keys(key)?;
        self.backend().remaining_ttl(&keys).await
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
        let keys = self.keys(key)?;
        let found = self.backend().holder(&keys).await?;
        Ok(found.map(|(stored, remaining)| Holder::from_stored(&stored, remaining)))
    }

    /// Deletes the lock on `key` whoever holds it, and wakes its waiters; `true` if there was
    /// one. An administrative tool (as Redisson's `forceUnlock`): the holder finds out at its next
    /// renewal, or when its validity runs out.
    pub async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        let keys = self.keys(key)?;
        self.backend().force_release(&keys).await
    }

    /// How many of this client's callers are waiting for `key` right now, queued in the order
    /// they began waiting (a release wakes the first of them).
    pub fn waiting(&self, key: &str) -> Result<usize, LockError> {
        let keys = self.keys(key)?;
        Ok(self.backend().wakeups().queued(&keys.channel))
    }

    /// Gives back every lock this client holds, for a process that is stopping (a SIGTERM
    /// handler, the end of `main`): without it, the locks of a stopping process stay held until
    /// their ttl ends, and the other instances wait that long.
    ///
    /// It stops the watchdog, marks every held lock lost (so guarded bodies with
    /// `on_lost = "abort"` stop), releases each one (token-checked, minimum holds honoured), and
    /// waits for releases already in flight in the background (dropped guards, abandoned
    /// acquires), each bounded by the response timeout. Afterwards every acquire fails with
    /// [`LockError::Unavailable`] (source [`ShutDown`]). Calling it again does nothing more.
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
        self.held().close();
        let bound = self.backend().response_timeout();
        // An acquire already on the wire may still take a lock: wait for it to be registered.
        if tokio::time::timeout(bound, self.held().acquires_settled())
            .await
            .is_err()
        {
            tracing::warn!(
                "shutdown: acquires still in flight after {bound:?}; their locks, if taken, will expire"
            );
        }
        self.watchdog().stop();
        let locks = self.held().take_all();
        for state in &locks {
            if state.give_up() {
                tracing::debug!(key = %state.key, "lock given back by shutdown");
            }
        }
        let releases = locks.iter().map(|state| release_state(self, state));
        for (state, released) in locks.iter().zip(join_all(releases).await) {
            if let Err(e) = released {
                tracing::warn!(key = %state.key, error = %e, "lock release at shutdown failed; the lock will expire");
            }
        }
        if tokio::time::timeout(bound, self.held().released_all())
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
        self.watchdog().len()
    }

    /// How many locks this client's waiters are listening on right now (each is one
    /// subscribed channel on Redis). Zero when nobody waits: subscriptions do not pile up.
    pub fn waiting_channels(&self) -> usize {
        self.backend().wakeups().len()
    }
}

/// An acquire request in flight. If it is dropped before its answer is seen (the caller was
/// cancelled, or the answer timed out), the script may still have taken the lock on the server,
/// with nobody to release it for a whole ttl: so the token-checked release is sent in the
/// background. It follows the acquire on the same connection, and is harmless if the lock was
/// never taken. An attempt that may have claimed the writers' turn of a read-write lock gives
/// the claim up too, so that it does not hold readers back until it lapses.
struct PendingAcquire<'a> {
    client: &'a LockClient,
    key: &'a str,
    keys: &'a LockKeys,
    token: &'a str,
    kind: Kind,
    may_claim: bool,
    settled: bool,
    /// The connection the attempt went on, for its release if its answer never comes (kept
    /// inline: nothing is allocated for it on the common path).
    pin: Pinned,
}

impl<'a> PendingAcquire<'a> {
    fn new(client: &'a LockClient, (key, keys): (&'a str, &'a LockKeys), token: &'a str, ask: &Ask) -> Self {
        PendingAcquire {
            client,
            key,
            keys,
            token,
            kind: Kind::of(ask.fair, ask.shared),
            may_claim: ask.join && !ask.fair && !ask.shared,
            settled: false,
            pin: Pinned::default(),
        }
    }

    /// An answer came: `Acquired` hands the lock to a guard, `Held` took nothing. An error is not
    /// an answer (a timed-out script may still have run), so it leaves the release armed.
    fn settled(mut self) {
        self.settled = true;
    }
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        if !self.settled {
            release_in_background(
                self.client.clone(),
                Abandoned::InFlight {
                    key: self.key.to_owned(),
                    keys: self.keys.clone(),
                    token: self.token.to_owned(),
                    kind: self.kind,
                    pin: std::mem::take(&mut self.pin),
                },
            );
            if self.may_claim {
                drop(QueuePlace::new(self.client, self.keys, self.token).claimed());
            }
        }
    }
}

/// The attempt that decided an acquire call: how long it took, and whether it was made as the
/// call began (then the call took that long too).
#[derive(Debug, Clone, Copy, Default)]
struct Decided {
    attempt: Duration,
    at_once: bool,
}

/// A fair waiter's place in the store's queue, or a waiting writer's claim on a read-write lock
/// (see [`Attempt::Held`]). Unless the lock was taken with it, it is given up
/// in the background when the waiter stops (its wait ran out, an error, a cancelled caller), so
/// the waiters behind it do not wait for the place to lapse.
struct QueuePlace {
    client: LockClient,
    keys: LockKeys,
    token: String,
    /// It may hold a writer's claim: leaving tells the readers it held back.
    claimed: bool,
    /// A place in the fair line: a release may have handed the lock to it meanwhile, so
    /// leaving also gives that back (to the next in line).
    fair: bool,
    taken: bool,
}

impl QueuePlace {
    fn new(client: &LockClient, keys: &LockKeys, token: &str) -> Self {
        QueuePlace {
            client: client.clone(),
            keys: keys.clone(),
            token: token.to_owned(),
            claimed: false,
            fair: false,
            taken: false,
        }
    }

    fn claimed(mut self) -> Self {
        self.claimed = true;
        self
    }

    fn fair(mut self) -> Self {
        self.fair = true;
        self
    }

    /// The lock was taken: the acquire script already removed the place.
    fn taken(mut self) {
        self.taken = true;
    }
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, keys, token, claimed, fair) = (
            self.client.clone(),
            self.keys.clone(),
            std::mem::take(&mut self.token),
            self.claimed,
            self.fair,
        );
        runtime.spawn(async move {
            if let Err(e) = client.backend().leave_queue(&keys, &token, claimed).await {
                tracing::debug!(redis_key = %keys.lock, error = %e, "could not leave the fair queue; the place lapses");
            }
            // Out of line now, so no later release hands it the lock; one before may have
            // (token-checked: nothing happens if none did).
            if fair {
                if let Err(e) = client.backend().release(&keys, &token, 0, Kind::Fair).await {
                    tracing::debug!(redis_key = %keys.lock, error = %e, "could not give back a lock handed over to a waiter that left; it lapses with the waiter's place");
                }
            }
        });
    }
}

/// How long a waiter sleeps before trying again, unless a release wakes it first: until the
/// holder's key expires (never past [`MAX_WAIT_NAP`]; a fair waiter, never past [`FAIR_NAP`],
/// which keeps its place in line), less up to 15% of jitter so that waiters on one lock do not
/// all retry at the same instant.
fn nap(pttl_ms: Option<u64>, fair: bool) -> Duration {
    let longest = if fair { FAIR_NAP } else { MAX_WAIT_NAP };
    let until_expiry = pttl_ms.map_or(longest, Duration::from_millis);
    until_expiry.min(longest).mul_f64(rand::random_range(0.85..=1.0))
}

/// The longest a fair waiter sleeps between attempts: well within [`FAIR_PLACE_KEPT`], so a
/// live waiter never loses its place.
const FAIR_NAP: Duration = Duration::from_millis(300);

/// Configures a [`LockClient`].
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// use lock_runtime::LockClient;
///
/// let locks = LockClient::builder()
///     .url("redis://127.0.0.1:6379/0")
///     .prefix("billing:lock:")
///     .connect_timeout(Duration::from_secs(2))
///     .response_timeout(Duration::from_millis(500))
///     .build()
///     .await?;
/// # let _ = locks; Ok(()) }
/// ```
///
/// With TLS and a private CA (the `tls` feature), started before Redis is reachable:
///
/// ```no_run
/// # #[cfg(feature = "tls")]
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use lock_runtime::LockClient;
///
/// let locks = LockClient::builder()
///     .url("rediss://locker:secret@redis.internal:6380")
///     .tls_root_ca(&std::fs::read("/etc/redis/ca.pem")?)
///     .tls_client_auth(&std::fs::read("client.pem")?, &std::fs::read("client.key")?)
///     .build_lazy()?; // connects on first use
/// # let _ = locks; Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClientBuilder {
    url: Option<String>,
    redis_client: Option<redis::Client>,
    cluster: Option<Vec<String>>,
    sentinel: Option<(Vec<String>, String)>,
    redlock: Option<Vec<String>>,
    replicas: Option<(usize, Duration)>,
    owner: Option<String>,
    metrics_key_class: bool,
    tls: TlsMaterial,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl Default for LockClientBuilder {
    fn default() -> Self {
        LockClientBuilder {
            url: None,
            redis_client: None,
            cluster: None,
            sentinel: None,
            redlock: None,
            replicas: None,
            owner: None,
            metrics_key_class: false,
            tls: TlsMaterial::default(),
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
        }
    }
}

impl std::fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password: show where it points, not who logs in.
        let url = self.url.as_deref().map(crate::redact::hide_credentials);
        f.debug_struct("LockClientBuilder")
            .field("url", &url)
            .field("redis_client", &self.redis_client)
            .field(
                "cluster",
                &self.cluster.as_ref().map(|urls| {
                    urls.iter()
                        .map(|u| crate::redact::hide_credentials(u))
                        .collect::<Vec<_>>()
                }),
            )
            .field(
                "sentinel",
                &self.sentinel.as_ref().map(|(urls, name)| {
                    (
                        urls.iter()
                            .map(|u| crate::redact::hide_credentials(u))
                            .collect::<Vec<_>>(),
                        name,
                    )
                }),
            )
            .field(
                "redlock",
                &self.redlock.as_ref().map(|urls| {
                    urls.iter()
                        .map(|u| crate::redact::hide_credentials(u))
                        .collect::<Vec<_>>()
                }),
            )
            .field("wait_for_replicas", &self.replicas)
            .field("owner", &self.owner)
            .field("tls", &self.tls)
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .finish()
    }
}

impl LockClientBuilder {
    /// The Redis server: `redis://[user:password@]host:port[/db]`, or `rediss://…` for TLS
    /// (with the `tls` feature). Give this or [`redis_client`](Self::redis_client).
    pub fn url(mut self, url: &str) -> Self {
        self.url = Some(url.to_owned());
        self
    }

    /// The Redis server, as a `redis::Client` you built: for anything redis-rs supports that
    /// this builder does not name (your own TLS setup, RESP3, a Unix socket, …). Give this or
    /// [`url`](Self::url).
    pub fn redis_client(mut self, client: redis::Client) -> Self {
        self.redis_client = Some(client);
        self
    }

    /// A Redis Cluster (the `cluster` feature, on by default), given some of its nodes: the
    /// client learns the rest, sends each request to the primary owning the lock's slot
    /// (following MOVED/ASK while slots migrate and failovers), and wakes waiters with sharded
    /// pub/sub on that slot.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .cluster(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
    ///     .wait_for_replicas(1, std::time::Duration::from_millis(100))
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    pub fn cluster<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.cluster = Some(urls.into_iter().map(|u| u.as_ref().to_owned()).collect());
        self
    }

    /// A primary managed by Redis Sentinel (the `sentinel` feature, on by default): `urls` are
    /// the sentinels', `master_name` the name they monitor it under. Each connection asks the
    /// sentinels for the primary (and checks its `ROLE`); after a failover (announced by the
    /// sentinels, or found by a request that reached the demoted node or a dead connection) the
    /// client reconnects to the new primary. The primary is reached with the first URL's user,
    /// password, database and TLS mode.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .sentinel(["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"], "locks")
    ///     .wait_for_replicas(1, std::time::Duration::from_millis(100))
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    pub fn sentinel<I, S>(mut self, urls: I, master_name: &str) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.sentinel = Some((
            urls.into_iter().map(|u| u.as_ref().to_owned()).collect(),
            master_name.to_owned(),
        ));
        self
    }

    /// A quorum of independent Redis masters (RedLock; at least 3, usually 5): a lock is held
    /// while a majority of them hold it. An acquire is sent to all at once and holds once a
    /// majority said yes with validity to spare; renewals count on a majority; a release goes to
    /// all, and waiters hear releases from any. Fencing and fair mode are refused
    /// ([`LockError::InvalidOptions`]): there is no single counter or line. See the README's
    /// "RedLock" section for when to choose it, and when not.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .redlock([
    ///         "redis://10.0.1.1:6379",
    ///         "redis://10.0.2.1:6379",
    ///         "redis://10.0.3.1:6379",
    ///         "redis://10.0.4.1:6379",
    ///         "redis://10.0.5.1:6379",
    ///     ])
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    pub fn redlock<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.redlock = Some(urls.into_iter().map(|u| u.as_ref().to_owned()).collect());
        self
    }

    /// Every acquire (with its fencing counter) counts only once `replicas` replicas have
    /// acknowledged it: `WAIT replicas timeout` is sent right behind the acquire, in the same
    /// round trip. When fewer acknowledge within `timeout`, the lock is given back and the
    /// acquire fails with [`LockError::NotReplicated`]. A lock acknowledged this way survives a
    /// failover to one of those replicas. Renewals and releases do not wait.
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.replicas = Some((replicas, timeout));
        self
    }

    /// Trusts the CA certificate(s) in `pem` for a `rediss://` server, instead of the system's
    /// trust store: for servers whose certificate a private CA signed.
    pub fn tls_root_ca(mut self, pem: &[u8]) -> Self {
        self.tls.root_ca = Some(pem.to_vec());
        self
    }

    /// Presents this client certificate (PEM chain and its PEM private key) to a `rediss://`
    /// server started with `--tls-auth-clients yes`.
    pub fn tls_client_auth(mut self, cert_pem: &[u8], key_pem: &[u8]) -> Self {
        self.tls.client_auth = Some((cert_pem.to_vec(), key_pem.to_vec()));
        self
    }

    /// A label stored with every lock this client takes (default `<hostname>:<pid>`), shown by
    /// [`LockClient::holder`]: name the service instance, so an operator can see who holds a
    /// lock. 1 to 256 bytes without control characters.
    pub fn owner(mut self, owner: &str) -> Self {
        self.owner = Some(owner.to_owned());
        self
    }

    /// Labels every metric (feature `metrics`) with `key_class`, the key's text before its first
    /// `:` (`order:42` → `order`), to tell lock families apart without a series per key. Off by
    /// default; keys whose text before the first `:` is unbounded would make as many series.
    pub fn metrics_key_class(mut self, on: bool) -> Self {
        self.metrics_key_class = on;
        self
    }

    /// Put before every key (default [`DEFAULT_PREFIX`], `"lock:"`).
    pub fn prefix(mut self, prefix: &str) -> Self {
        prefix.clone_into(&mut self.prefix);
        self
    }

    /// How long to wait for a connection (default [`DEFAULT_CONNECT_TIMEOUT`], 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long any one request may take (default [`DEFAULT_RESPONSE_TIMEOUT`], 2 s). Keep it
    /// well below your ttls: a renewal that takes longer than the lock's validity loses it.
    /// Two requests in a row without an answer, and the connection is replaced.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Connects, so that a server that is down or refuses this client is reported at start:
    /// [`LockError::Unavailable`] when it cannot be reached within the connect timeout,
    /// [`LockError::Refused`] when it answers but refuses (credentials, database index, an ACL
    /// without a right locking needs: checked here, on keys under the prefix), and
    /// [`LockError::InvalidOptions`] for a missing or malformed URL, bad TLS material or a zero
    /// timeout.
    pub async fn build(self) -> Result<LockClient, LockError> {
        let client = self.build_lazy()?;
        // The rights check's keys: under the prefix, where the user's key rights are.
        let probe = LockKeys::new(client.prefix(), "rights-check");
        match client.backend() {
            Backend::Redis(backend) => backend.connect(&probe).await?,
            Backend::Redlock(backend) => backend.connect(&probe).await?,
            Backend::Memory(_) => {}
        }
        Ok(client)
    }

    /// Checks the configuration (URL, timeouts, TLS material) without connecting; the first
    /// operation connects. A service can start while Redis is down: its operations fail with
    /// [`LockError::Unavailable`] until Redis is back, and then work.
    pub fn build_lazy(self) -> Result<LockClient, LockError> {
        self.no_insecure_urls()?;
        if self.connect_timeout.is_zero() || self.response_timeout.is_zero() {
            return Err(LockError::invalid_options("timeouts must be greater than zero"));
        }
        let timeouts = Timeouts {
            connect: self.connect_timeout,
            response: self.response_timeout,
        };
        let replicas = match self.replicas {
            None => None,
            Some((0, _)) => {
                return Err(LockError::invalid_options(
                    "wait_for_replicas needs at least 1 replica (leave it out to not wait)",
                ))
            }
            Some((_, timeout)) if timeout.is_zero() => {
                // `WAIT n 0` would block until the replicas answer, however long that takes.
                return Err(LockError::invalid_options(
                    "the wait_for_replicas timeout must be greater than zero",
                ));
            }
            Some((wanted, timeout)) => Some(Replicas { wanted, timeout }),
        };
        if let Some(urls) = &self.redlock {
            return self.build_redlock(urls, timeouts, replicas.is_some());
        }
        let answer_within = timeouts.response + replicas.map_or(Duration::ZERO, |r| 2 * r.timeout);
        let place = self.place(timeouts, answer_within)?;
        let backend = Box::new(RedisBackend::new(place, timeouts, replicas));
        let owner = self.owner_label()?;
        Ok(LockClient::from_backend(
            Backend::Redis(backend),
            self.prefix,
            owner,
            self.metrics_key_class,
        ))
    }

    /// Refuses a URL whose `#insecure` fragment would turn TLS certificate checks off (redis-rs
    /// honours it when any crate in the build enables its insecure TLS feature): a lock that
    /// guards money does not talk to whoever answers.
    fn no_insecure_urls(&self) -> Result<(), LockError> {
        let urls = self
            .url
            .iter()
            .chain(self.cluster.iter().flatten())
            .chain(self.sentinel.iter().flat_map(|(urls, _)| urls))
            .chain(self.redlock.iter().flatten());
        for url in urls {
            if url
                .split_once('#')
                .is_some_and(|(_, fragment)| fragment.eq_ignore_ascii_case("insecure"))
            {
                return Err(LockError::invalid_options(format!(
                    "{}: `#insecure` would turn TLS certificate verification off; trust a private \
                     CA with .tls_root_ca(…) instead",
                    crate::redact::hide_credentials(url)
                )));
            }
        }
        Ok(())
    }

    fn build_redlock(
        &self,
        urls: &[String],
        timeouts: Timeouts,
        replicas: bool,
    ) -> Result<LockClient, LockError> {
        self.one_place()?;
        if replicas {
            return Err(LockError::invalid_options(
                "wait_for_replicas does not apply to RedLock: its masters are independent",
            ));
        }
        if urls.len() > crate::backend::redlock::MAX_MASTERS {
            return Err(LockError::invalid_options(format!(
                "RedLock takes at most {} masters",
                crate::backend::redlock::MAX_MASTERS
            )));
        }
        if urls.len() < 3 {
            return Err(LockError::invalid_options(
                "RedLock needs at least 3 independent masters (5 is usual)",
            ));
        }
        let clients = urls
            .iter()
            .map(|url| client_for_url(url, &self.tls))
            .collect::<Result<Vec<_>, _>>()?;
        let backend = Box::new(RedlockBackend::new(clients, timeouts));
        Ok(LockClient::from_backend(
            Backend::Redlock(backend),
            self.prefix.clone(),
            self.owner_label()?,
            self.metrics_key_class,
        ))
    }

    /// The owner label: the one given (checked), else `<hostname>:<pid>`.
    fn owner_label(&self) -> Result<String, LockError> {
        match &self.owner {
            Some(owner) => {
                crate::holder::check_owner(owner)?;
                Ok(owner.clone())
            }
            None => Ok(crate::holder::default_owner()),
        }
    }

    /// Checks that exactly one of the ways to say where the locks live was given.
    fn one_place(&self) -> Result<(), LockError> {
        let given = [
            self.url.is_some(),
            self.redis_client.is_some(),
            self.cluster.is_some(),
            self.sentinel.is_some(),
            self.redlock.is_some(),
        ];
        match given.iter().filter(|&&g| g).count() {
            0 => Err(LockError::invalid_options(
                "no Redis given to the builder (.url(…), .redis_client(…), .cluster(…), .sentinel(…) or .redlock(…))",
            )),
            1 => Ok(()),
            _ => Err(LockError::invalid_options(
                "give the builder one of .url(…), .redis_client(…), .cluster(…), .sentinel(…) or .redlock(…), not several",
            )),
        }
    }

    /// Where the locks live, for every deployment but RedLock.
    fn place(&self, timeouts: Timeouts, answer_within: Duration) -> Result<Place, LockError> {
        self.one_place()?;
        if let Some(url) = &self.url {
            return Ok(Place::Server(client_for_url(url, &self.tls)?));
        }
        if let Some(client) = &self.redis_client {
            if !self.tls.is_empty() {
                return Err(LockError::invalid_options(
                    "TLS certificates go into the redis::Client given to .redis_client(…), not the builder",
                ));
            }
            return Ok(Place::Server(client.clone()));
        }
        #[cfg(feature = "cluster")]
        if let Some(urls) = &self.cluster {
            let cluster =
                crate::backend::cluster::ClusterPlace::new(urls, &self.tls, timeouts, answer_within)?;
            return Ok(Place::Cluster(Arc::new(cluster)));
        }
        #[cfg(feature = "sentinel")]
        if let Some((urls, master_name)) = &self.sentinel {
            let sentinels = crate::backend::sentinel::Sentinels::new(urls, master_name, &self.tls)?;
            return Ok(Place::Sentinel(Arc::new(sentinels)));
        }
        let _ = (timeouts, answer_within);
        Err(LockError::invalid_options(
            "this deployment needs a lock-runtime feature that is off",
        ))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_debug_hides_credentials() {
        let shown = format!(
            "{:?}",
            LockClient::builder().url("redis://user:secret@host:6379/0")
        );
        assert!(!shown.contains("secret") && !shown.contains("user"), "{shown}");
        assert!(shown.contains("redis://<credentials>@host:6379/0"), "{shown}");
    }

    #[test]
    fn naps_end_by_the_holders_expiry_and_are_bounded() {
        for _ in 0..100 {
            let n = nap(Some(100), false);
            assert!(
                n <= Duration::from_millis(100) && n >= Duration::from_millis(85),
                "{n:?}"
            );
            assert!(nap(None, false) <= MAX_WAIT_NAP);
            assert!(nap(Some(60_000), false) <= MAX_WAIT_NAP);
            assert!(nap(None, true) <= FAIR_NAP && FAIR_NAP * 3 < crate::FAIR_PLACE_KEPT);
        }
    }
}
