//! A held lock: its validity clock, its lost signal, and its release on every path.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{Kind, LockKeys, Pinned, Renewal};
use crate::options::{ceil_millis, drift, MIN_TTL};
use crate::telemetry::{self, Labels};
use crate::{LockClient, LockError, LockOptions, OnLost};

#[derive(Debug, Clone, Copy)]
struct Status {
    /// With a minimum hold, the lock is kept until then even when released earlier.
    hold_until: Instant,
    /// Past this instant without a renewal the lock may be someone else's.
    valid_until: Instant,
    /// Sticky: set when the backend said the lock is gone, or validity ran out.
    lost: bool,
}

/// What the guard, its watchdog and the reentrancy scope share about one held lock.
#[derive(Debug)]
pub(crate) struct LockState {
    pub(crate) key: String,
    pub(crate) keys: LockKeys,
    pub(crate) token: String,
    pub(crate) fence: Option<u64>,
    pub(crate) ttl: Duration,
    /// Plain, fair (its release names the next waiter in line) or a share of a read-write lock.
    pub(crate) kind: Kind,
    /// When the acquire that took it was sent (for the hold time on release).
    pub(crate) taken_at: Instant,
    /// Metrics are labelled with the key's class.
    pub(crate) by_key_class: bool,
    /// With a maximum hold: no renewal moves its validity past this instant.
    hold_limit: Option<Instant>,
    /// A release of it succeeded already (its hold time is recorded).
    release_seen: AtomicBool,
    /// Small on purpose (a `Mutex` and one `Notify`, not a `watch` channel): a client may hold
    /// many thousands of locks.
    status: std::sync::Mutex<Status>,
    /// Told of every change of `status`.
    changed: Notify,
}

impl LockState {
    /// `started` is when the lock was taken (a minimum hold and the hold time count from there).
    /// It expires `lease` after `sent`: the acquire request's send time and its ttl (so the
    /// request's own flight time is never counted as held time), or for a lock a fair release
    /// handed over, the waiter's attempt whose place it was handed over for and what was left of
    /// that place (which may be sooner than its ttl).
    pub(crate) fn new(
        key: &str,
        keys: LockKeys,
        token: String,
        fence: Option<u64>,
        options: &LockOptions,
        started: Instant,
        (sent, lease): (Instant, Duration),
    ) -> Self {
        let ttl = options.ttl();
        let hold_limit = options.get_hold_at_most().map(|most| started + most);
        let valid_until = sent + lease.saturating_sub(drift(lease));
        LockState {
            key: key.to_owned(),
            keys,
            token,
            fence,
            ttl,
            kind: Kind::of(options.is_fair(), options.get_mode() == crate::LockMode::Shared),
            taken_at: started,
            by_key_class: false,
            hold_limit,
            release_seen: AtomicBool::new(false),
            status: std::sync::Mutex::new(Status {
                hold_until: started + options.get_hold_at_least(),
                valid_until: hold_limit.map_or(valid_until, |limit| valid_until.min(limit)),
                lost: false,
            }),
            changed: Notify::new(),
        }
    }

    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        // Every update is one step, so a poisoned status is still consistent.
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `change` to the status and tells waiters, if it says it changed anything.
    fn update(&self, change: impl FnOnce(&mut Status) -> bool) -> bool {
        let changed = change(&mut self.status());
        if changed {
            self.changed.notify_waiters();
        }
        changed
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.status().valid_until
    }

    pub(crate) fn is_lost(&self) -> bool {
        let status = *self.status();
        status.lost || Instant::now() >= status.valid_until
    }

    /// Marks the lock lost (and counts it); returns whether it was not already.
    pub(crate) fn mark_lost(&self) -> bool {
        self.update(|s| {
            let newly = !std::mem::replace(&mut s.lost, true);
            if newly {
                // Counted before anyone waiting for the loss is told of it.
                telemetry::lost(&self.labels());
            }
            newly
        })
    }

    /// Marks the lock lost because this process gives it back (shutdown): not counted as lost.
    pub(crate) fn give_up(&self) -> bool {
        self.update(|s| !std::mem::replace(&mut s.lost, true))
    }

    /// The labels of this lock's metrics.
    pub(crate) fn labels(&self) -> Labels<'_> {
        Labels::new(self.kind == Kind::Shared, &self.key, self.by_key_class)
    }

    /// Records a successful renewal sent at `sent` for `ttl`, unless the lock was already lost
    /// (a renewal that lands after validity ran out does not resurrect it). Validity only ever
    /// moves out: the store never shortens a lease (`PEXPIRE … GT`), so after renewals for 60 s
    /// and then 2 s it expires no earlier than the 60 s one set, whatever order the answers are
    /// handled in; each renewal's expiry counts from its send, which the store applied later.
    /// With a maximum hold, validity never passes it.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) {
        self.update(|s| {
            let until = sent + ttl.saturating_sub(drift(ttl));
            let until = self.hold_limit.map_or(until, |limit| until.min(limit));
            if s.lost || Instant::now() >= s.valid_until || until <= s.valid_until {
                return false;
            }
            s.valid_until = until;
            true
        });
    }

    /// The lease a renewal sent at `now` asks for: `ttl`, or with a maximum hold what is left
    /// of it; `None` once it is reached (nothing to renew: the lock is lost at its validity).
    pub(crate) fn renewal(&self, ttl: Duration, now: Instant) -> Option<Duration> {
        match self.hold_limit {
            None => Some(ttl),
            Some(limit) => {
                let left = limit.saturating_duration_since(now);
                (!left.is_zero()).then(|| ttl.min(left))
            }
        }
    }

    /// Runs `body` while the lock holds, under the lost-lock policy.
    ///
    /// The body is never polled once validity has passed: validity is checked before every
    /// poll of it, which costs no cooperative budget, and the lost signal is polled outside
    /// tokio's budget. So a body that always has ready work (and so exhausts the budget on
    /// every poll) is still stopped at the end of its lease, and a lock whose acquire answer
    /// came back after its validity never runs the body at all.
    pub(crate) async fn run_body<F: Future>(&self, policy: OnLost, body: F) -> Result<F::Output, LockError> {
        let mut body = std::pin::pin!(body);
        let mut lost = std::pin::pin!(tokio::task::unconstrained(self.lost()));
        let finished = std::future::poll_fn(|cx| {
            if self.is_lost() {
                if self.mark_lost() {
                    tracing::warn!(key = %self.key, "lock validity ran out without a renewal; lock lost");
                }
                return Poll::Ready(None);
            }
            if lost.as_mut().poll(cx).is_ready() {
                return Poll::Ready(None);
            }
            body.as_mut().poll(cx).map(Some)
        })
        .await;
        if let Some(out) = finished {
            return Ok(out);
        }
        match policy {
            OnLost::Abort => {
                tracing::warn!(key = %self.key, "lock lost while held; aborting the guarded code");
                Err(LockError::Lost {
                    key: self.key.clone(),
                })
            }
            OnLost::Continue => {
                tracing::warn!(key = %self.key, "lock lost while held; the guarded code continues (on_lost = continue)");
                Ok(body.await)
            }
        }
    }

    /// Keeps the lock at least until `until` when it is released (a nested call's minimum hold
    /// adds to the outermost one's).
    pub(crate) fn hold_at_least_until(&self, until: Instant) {
        let mut status = self.status();
        status.hold_until = status.hold_until.max(until);
    }

    pub(crate) fn hold_until(&self) -> Instant {
        self.status().hold_until
    }

    /// Completes once the lock is lost: marked so, or past its validity.
    pub(crate) async fn lost(&self) {
        loop {
            // Created before the status is read, so a change in between is not missed.
            let changed = self.changed.notified();
            let status = *self.status();
            if status.lost {
                return;
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(status.valid_until) => {
                    if Instant::now() >= self.valid_until() {
                        if self.mark_lost() {
                            tracing::warn!(key = %self.key, "lock validity ran out without a renewal; lock lost");
                        }
                        return;
                    }
                }
            }
        }
    }
}

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
#[derive(Debug)]
#[must_use = "a lock is released as soon as its guard is dropped"]
pub struct LockGuard {
    client: LockClient,
    state: Arc<LockState>,
    /// Its id with the client's watchdog, when it is renewed.
    watched: Option<u64>,
    /// Its id among the client's held locks.
    held: u64,
    released: bool,
}

impl LockGuard {
    /// A held lock, set to expire `lease` after `sent` ([`LockState::new`]). The watchdog
    /// renews it with `watchdog`; a lock handed over by a fair release for less than its ttl it
    /// extends to its ttl a third of the lease in either way (once, without `watchdog`), so a
    /// lock released before then costs no request at all.
    pub(crate) fn new(
        client: LockClient,
        state: LockState,
        watchdog: bool,
        (sent, lease): (Instant, Duration),
    ) -> Self {
        let state = Arc::new(state);
        let watched = (watchdog || lease < state.ttl).then(|| {
            client
                .watchdog()
                .watch(&client, Arc::clone(&state), (sent, lease), !watchdog)
        });
        let held = client.held().insert(Arc::clone(&state));
        LockGuard {
            client,
            state,
            watched,
            held,
            released: false,
        }
    }

    pub(crate) fn state(&self) -> &Arc<LockState> {
        &self.state
    }

    /// The key as the caller gave it, without the prefix.
    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// The fencing token taken with the lock, when the options asked for one: strictly greater
    /// than every token handed out for this key before.
    pub fn fencing_token(&self) -> Option<u64> {
        self.state.fence
    }

    /// Whether the lock is lost: the backend said so, or its validity ran out without renewal.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Completes when the lock is lost (never, while it is renewed and ours).
    pub async fn lost(&self) {
        self.state.lost().await;
    }

    /// Makes the lock expire no sooner than `ttl` from now, if it is still ours;
    /// [`LockError::Lost`] if not. A lease is only ever lengthened: `extend(2 s)` after
    /// `extend(60 s)` keeps the 60 s, in the store and in [`is_lost`](LockGuard::is_lost). With
    /// a [maximum hold](LockOptions::hold_at_most), no further than it. With
    /// [replica acknowledgement](crate::LockClientBuilder::wait_for_replicas), an extend too few
    /// replicas acknowledged is [`LockError::NotReplicated`], and the lock keeps the validity it
    /// had. The watchdog, if any, goes on renewing with the original ttl.
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        if ttl < MIN_TTL || ttl > crate::options::MAX_DURATION {
            return Err(LockError::invalid_options(format!(
                "extend ttl {ttl:?} is outside {MIN_TTL:?}..={:?}",
                crate::options::MAX_DURATION
            )));
        }
        if self.state.is_lost() {
            return Err(self.lost_error());
        }
        let sent = Instant::now();
        let Some(ttl) = self.state.renewal(ttl, sent) else {
            return Err(self.lost_error()); // its maximum hold is reached
        };
        let backend = self.client.backend();
        let renewed = backend
            .renew(&self.state.keys, &self.state.token, ceil_millis(ttl))
            .await
            .inspect_err(|_| telemetry::renewal_failed())?;
        match renewed {
            Renewal::Renewed => {
                self.state.renewed(sent, ttl);
                telemetry::renewed(1);
                Ok(())
            }
            Renewal::Gone => {
                if self.state.mark_lost() {
                    tracing::warn!(key = %self.state.key, "lock lost: found gone or taken on extend");
                }
                Err(self.lost_error())
            }
            Renewal::Undecided => {
                telemetry::renewal_failed();
                Err(LockError::unavailable(crate::backend::Undecided))
            }
            Renewal::NotReplicated { acked, wanted } => {
                telemetry::renewal_failed();
                Err(LockError::NotReplicated {
                    key: self.state.key.clone(),
                    acked,
                    wanted,
                })
            }
        }
    }

    /// Releases the lock: `Ok(true)` if it was still ours (it is deleted, or with a minimum
    /// hold, left to expire at its end), `Ok(false)` if it had already expired or been taken.
    /// The watchdog stops renewing it before the release is sent.
    ///
    /// If this future is dropped before the answer comes (a timeout around it, a cancelled
    /// task), the guard's `Drop` sends the release again in the background: it is token-checked,
    /// so a second one is harmless, and the lock is never left held.
    pub async fn release(mut self) -> Result<bool, LockError> {
        self.unwatch();
        let released = release_state(&self.client, &self.state).await;
        self.released = true;
        released
    }

    fn unwatch(&mut self) {
        if let Some(id) = self.watched.take() {
            self.client.watchdog().unwatch(id);
        }
        self.client.held().forget(self.held);
    }

    fn lost_error(&self) -> LockError {
        LockError::Lost {
            key: self.state.key.clone(),
        }
    }
}

/// The token-checked release of a held lock (its minimum hold honoured).
pub(crate) async fn release_state(client: &LockClient, state: &LockState) -> Result<bool, LockError> {
    let released = release_lock(
        client,
        &state.key,
        &state.keys,
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
        tracing::debug!(key = %state.key, held_ms = ceil_millis(held), "lock released");
    }
    released
}

/// The token-checked release; with a minimum hold (`hold_until`) left, the lock is kept until
/// then.
async fn release_lock(
    client: &LockClient,
    key: &str,
    keys: &LockKeys,
    token: &str,
    hold_until: Option<Instant>,
    kind: Kind,
) -> Result<bool, LockError> {
    let hold_ms = hold_until.map_or(0, |until| {
        ceil_millis(until.saturating_duration_since(Instant::now()))
    });
    let released = client
        .backend()
        .release(keys, token, hold_ms, kind)
        .await
        .inspect_err(|_| telemetry::release_failed())?;
    if !released {
        tracing::debug!(key, "lock had expired or been taken before its release");
    } else if hold_ms > 0 {
        tracing::debug!(key, hold_ms, "lock kept for its minimum hold");
    }
    Ok(released)
}

/// Releases from a spawned task: for a dropped guard (`state`), and for an acquire abandoned in
/// flight (`key`, `keys`, `token`). Outside a tokio runtime there is nothing to send it from, and
/// the lock is left to expire at its ttl.
pub(crate) fn release_in_background(client: LockClient, lock: Abandoned) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(key = %lock.key(), "no tokio runtime to release from; the lock is left to expire");
        return;
    };
    let releasing = client.held().releasing();
    runtime.spawn(async move {
        let _releasing = releasing;
        let released = match &lock {
            Abandoned::Held(state) => release_state(&client, state).await,
            Abandoned::InFlight {
                key,
                keys,
                token,
                kind,
                pin,
            } => {
                // After the acquire, on its connection, even if that was replaced meanwhile: a
                // release on a newer one could reach Redis first, and the acquire would then
                // take the lock for nobody.
                let released = client.backend().release_after(keys, token, *kind, pin).await;
                if matches!(released, Ok(false)) {
                    tracing::debug!(key, "an abandoned acquire had not taken the lock");
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
        key: String,
        keys: LockKeys,
        token: String,
        kind: Kind,
        /// The connection it went on: its release follows it there.
        pin: Pinned,
    },
}

impl Abandoned {
    fn key(&self) -> &str {
        match self {
            Abandoned::Held(state) => &state.key,
            Abandoned::InFlight { key, .. } => key,
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.unwatch();
        release_in_background(self.client.clone(), Abandoned::Held(Arc::clone(&self.state)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(ttl: Duration, started: Instant) -> LockState {
        LockState::new(
            "k",
            LockKeys::new("lock:", "k"),
            "t".into(),
            None,
            &LockOptions::new(ttl),
            started,
            (started, ttl),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn validity_only_moves_out_whatever_order_renewals_are_answered_in() {
        let ttl = Duration::from_secs(10);
        let t0 = Instant::now();
        let lock = state(ttl, t0);
        let watchdog_sent = t0 + Duration::from_secs(3);
        let extend_sent = t0 + Duration::from_secs(4);
        tokio::time::advance(Duration::from_secs(5)).await;
        // An extend shorter than what is left of the first lease moves nothing.
        lock.renewed(extend_sent, Duration::from_secs(5));
        assert_eq!(lock.valid_until(), t0 + ttl - drift(ttl));
        // An extend that goes further does.
        lock.renewed(extend_sent, Duration::from_secs(8));
        let eight = Duration::from_secs(8);
        assert_eq!(lock.valid_until(), extend_sent + eight - drift(eight));
        // The watchdog's answer (sent before it, longer) is handled after it: the longer lease
        // stands.
        lock.renewed(watchdog_sent, Duration::from_secs(30));
        let thirty = Duration::from_secs(30);
        assert_eq!(lock.valid_until(), watchdog_sent + thirty - drift(thirty));
        // A shorter extend sent later does not shorten it: the store kept the later expiry.
        lock.renewed(extend_sent + Duration::from_millis(500), Duration::from_secs(2));
        assert_eq!(lock.valid_until(), watchdog_sent + thirty - drift(thirty));
    }
}
