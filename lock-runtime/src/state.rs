//! What the guard, its watchdog, the wait loop and the reentrancy scope share about one held
//! lock: its names and token, its validity clock, its lost signal, and its minimum hold.

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::options::drift;
use crate::store::{lease_granted, Kind, Lock, Renewal};
use crate::telemetry::{self, Labels};
use crate::{LockError, LockOptions, OnLost};

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
    /// The user's key and the store's name for it.
    pub(crate) lock: Lock,
    pub(crate) token: String,
    pub(crate) fence: Option<u64>,
    /// The permit held, for a semaphore.
    pub(crate) permit: Option<u32>,
    /// How many permits the key's semaphore has (1: a lock, exclusive or shared).
    pub(crate) permits: u32,
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
    pub(crate) release_seen: AtomicBool,
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
        (lock, kind): (Lock, Kind),
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
            lock,
            token,
            fence,
            permit: None,
            permits: options.get_permits(),
            ttl,
            kind,
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

    /// The key as the caller gave it.
    pub(crate) fn key(&self) -> &str {
        self.lock.key()
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
        Labels::new(self.kind == Kind::Shared, self.key(), self.by_key_class)
    }

    /// Records a successful renewal sent at `sent` for `ttl`, unless the lock was already lost
    /// (a renewal that lands after validity ran out does not resurrect it). Validity only ever
    /// moves out: the store never shortens a lease (`PEXPIRE … GT`), so after renewals for 60 s
    /// and then 2 s it expires no earlier than the 60 s one set, whatever order the answers are
    /// handled in; each renewal's expiry counts from its send, which the store applied later.
    /// With a maximum hold, validity never passes it.
    /// Answers whether the lock was still valid when the renewal was counted (`false`: it was
    /// lost or had run out, and stays so).
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) -> bool {
        let mut valid = true;
        self.update(|s| {
            let until = sent + ttl.saturating_sub(drift(ttl));
            let until = self.hold_limit.map_or(until, |limit| until.min(limit));
            if s.lost || Instant::now() >= s.valid_until {
                valid = false;
                return false;
            }
            if until <= s.valid_until {
                return false;
            }
            s.valid_until = until;
            true
        });
        valid
    }

    /// What a renewal's answer for this lock, asked for `lease` in a request sent at `sent`,
    /// does to it: one reading of [`Renewal`] for the watchdog and an explicit extend alike.
    /// Renewed, its validity moves to `sent` plus the lease (or to where the store keeps it,
    /// if sooner); gone or taken, it is marked lost; undecided or not replicated, nothing moves.
    pub(crate) fn apply(&self, renewal: Renewal, sent: Instant, lease: Duration) -> Applied {
        match renewal {
            Renewal::Renewed { granted_until } => {
                let valid = self.renewed(sent, lease_granted(granted_until, sent, lease));
                let granted = granted_until.map(|until| until.saturating_duration_since(sent));
                Applied::Renewed { valid, granted }
            }
            Renewal::Gone => Applied::Gone {
                newly: self.mark_lost(),
            },
            Renewal::Undecided => Applied::Undecided,
            Renewal::NotReplicated { acked, wanted } => Applied::NotReplicated { acked, wanted },
        }
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
        run_guarded(&[self], policy, body).await
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
                            tracing::warn!(key = %self.key(), "lock validity ran out without a renewal; lock lost");
                        }
                        return;
                    }
                }
            }
        }
    }
}

/// Runs `body` while every lock of `set` is held (one lock, or a multi-key set: losing any one
/// of them is losing the set), as [`LockState::run_body`] says: never polled past any lock's
/// validity, and stopped or let go on by `policy` once one is lost.
pub(crate) async fn run_guarded<F: Future>(
    set: &[&LockState],
    policy: OnLost,
    body: F,
) -> Result<F::Output, LockError> {
    let mut body = std::pin::pin!(body);
    let lost = async {
        match set {
            [one] => one.lost().await,
            many => {
                let each = many.iter().map(|state| Box::pin(state.lost()));
                futures_util::future::select_all(each).await;
            }
        }
    };
    let mut lost = std::pin::pin!(tokio::task::unconstrained(lost));
    let finished = std::future::poll_fn(|cx| {
        if let Some(gone) = set.iter().find(|state| state.is_lost()) {
            if gone.mark_lost() {
                tracing::warn!(key = %gone.key(), "lock validity ran out without a renewal; lock lost");
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
    let key = set
        .iter()
        .find(|state| state.is_lost())
        .or(set.first())
        .map_or("", |state| state.key());
    match policy {
        OnLost::Abort => {
            tracing::warn!(key, "lock lost while held; aborting the guarded code");
            Err(LockError::Lost { key: key.to_owned() })
        }
        OnLost::Continue => {
            tracing::warn!(
                key,
                "lock lost while held; the guarded code continues (on_lost = continue)"
            );
            Ok(body.await)
        }
    }
}

/// What [`LockState::apply`] did with a renewal's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// Renewed: `valid` is whether the lock was still valid when counted (`false`: the answer
    /// came after its validity ran out, and it stays lost); `granted`, how long the store keeps
    /// it when less than asked (its next renewal comes a third of the way there).
    Renewed { valid: bool, granted: Option<Duration> },
    /// Gone or taken: lost (`newly`: marked so by this answer).
    Gone { newly: bool },
    /// No answer either way for this lock: retried while it is valid.
    Undecided,
    /// Too few replicas acknowledged it: its validity did not move.
    NotReplicated { acked: usize, wanted: usize },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(ttl: Duration, started: Instant) -> LockState {
        LockState::new(
            (Lock::new("k", "lock:{k}".to_owned()), Kind::Plain),
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
