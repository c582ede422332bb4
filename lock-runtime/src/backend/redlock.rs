//! RedLock: one lock over N independent Redis masters, held while a majority holds it.
//!
//! Each master is an ordinary [`RedisBackend`] (its own connection, the same scripts); this
//! backend only says how many must agree. An acquire is sent to every master at once and is
//! decided as soon as a majority said yes (or can no longer say yes): the latency is the slowest
//! of the fastest majority. Renewals count when a majority renewed, and a lock is lost when a
//! majority says it is gone; nothing is ever deleted because a renewal failed. Releases go to
//! every master. Waiters listen on every master (one shared registry, one listener per master),
//! so a release heard from any of them wakes the next waiter.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::connection::{lock, Pinned, Place, Timeouts};
use super::redis::RedisBackend;
use super::{Answer, Ask, Attempt, Capabilities, Kind, LockKeys, Offered, Renewal, Store, Stored};
use crate::error::TimedOut;
use crate::wakeups::{Registration, Wakeups};
use crate::LockError;

/// The most masters a client takes (one wake-up listener bit each).
pub(crate) const MAX_MASTERS: usize = 64;

/// How long a waiter waits for its subscriptions before its next attempt.
const LISTEN_WAIT: Duration = Duration::from_millis(250);

#[derive(Debug)]
pub(crate) struct RedlockBackend {
    /// Shared with the tasks that carry each master's part of an acquire or release, which
    /// finish on their own after the outcome is decided.
    masters: Vec<Arc<RedisBackend>>,
    wakeups: Arc<Wakeups>,
    /// Per token of a held lock, the acquire tasks (one per master, by index) that had not
    /// finished when the lock was taken: a release on a master waits for that master's acquire,
    /// so that it cannot overtake it and leave the key behind.
    stragglers: std::sync::Mutex<HashMap<String, Vec<Attempted>>>,
    quorum: usize,
    timeouts: Timeouts,
}

/// Too few masters answered for a majority either way.
#[derive(Debug, thiserror::Error)]
#[error("only {answered} of {masters} RedLock masters answered; {quorum} must agree (last error: {last})")]
pub(crate) struct NoQuorum {
    answered: usize,
    masters: usize,
    quorum: usize,
    last: String,
}

impl RedlockBackend {
    /// Connects nothing yet.
    pub(crate) fn new(clients: Vec<redis::Client>, timeouts: Timeouts) -> Self {
        let (senders, receivers): (Vec<_>, Vec<_>) =
            clients.iter().map(|_| mpsc::unbounded_channel()).unzip();
        let wakeups = Wakeups::new(senders);
        let masters = clients
            .into_iter()
            .zip(receivers)
            .enumerate()
            .map(|(listener, (client, idle))| {
                Arc::new(RedisBackend::listening(
                    Place::Server(client),
                    timeouts,
                    None,
                    (Arc::clone(&wakeups), listener, idle),
                ))
            })
            .collect::<Vec<_>>();
        RedlockBackend {
            quorum: masters.len() / 2 + 1,
            masters,
            wakeups,
            stragglers: std::sync::Mutex::default(),
            timeouts,
        }
    }

    /// Connects to every master; fails unless a majority is reachable.
    pub(crate) async fn connect(&self, probe: &LockKeys) -> Result<(), LockError> {
        let answers = futures_util::future::join_all(self.masters.iter().map(|m| m.connect(probe))).await;
        let reached = answers.iter().filter(|a| a.is_ok()).count();
        if reached >= self.quorum {
            return Ok(());
        }
        // A refusal (credentials, ACL) says more than a timeout.
        let mut errors: Vec<LockError> = answers.into_iter().filter_map(Result::err).collect();
        if let Some(i) = errors.iter().position(|e| matches!(e, LockError::Refused { .. })) {
            return Err(errors.swap_remove(i));
        }
        Err(self.no_quorum(reached, errors.pop()))
    }

    fn no_quorum(&self, answered: usize, last: Option<LockError>) -> LockError {
        LockError::unavailable(NoQuorum {
            answered,
            masters: self.masters.len(),
            quorum: self.quorum,
            last: last.map_or_else(|| "none".to_owned(), |e| e.to_string()),
        })
    }

    /// How long one master is given to answer an acquire: much less than the ttl, so that a
    /// slow master cannot eat the lock's validity.
    fn per_master(&self, ttl_ms: u64) -> Duration {
        (Duration::from_millis(ttl_ms) / 10)
            .max(Duration::from_millis(50))
            .min(self.timeouts.response)
    }

    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        token: &str,
        ask: &Ask,
    ) -> Result<Attempt, LockError> {
        let started = Instant::now();
        let bound = self.per_master(ask.ttl_ms);
        // Each master's attempt is a task of its own: the outcome is decided by the first
        // majority to answer, and the stragglers go on to set the key (it is ours, renewed and
        // released with the rest) without holding up the caller.
        let (tx, mut answers) = mpsc::unbounded_channel();
        // Registered for the release of this token if this future is dropped before it decides
        // (a cancelled call): that release then waits for every attempt, instead of overtaking
        // one that is still on its way to its master.
        let mut stragglers = Stragglers {
            backend: self,
            token,
            tasks: Vec::with_capacity(self.masters.len()),
        };
        for master in &self.masters {
            let (master, keys, token, ask, tx) = (
                Arc::clone(master),
                keys.clone(),
                token.to_owned(),
                *ask,
                tx.clone(),
            );
            let pin = Arc::new(Pinned::default());
            let answered = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (pinned, answer) = (Arc::clone(&pin), Arc::clone(&answered));
            let task = tokio::spawn(async move {
                let attempt = master.acquire(&keys, &token, &ask, &pinned);
                let attempt = tokio::time::timeout(bound, attempt).await;
                if matches!(attempt, Ok(Ok(_))) {
                    answer.store(true, std::sync::atomic::Ordering::Release);
                }
                let _ = tx.send(attempt);
            });
            stragglers.tasks.push(Attempted { task, pin, answered });
        }
        drop(tx);
        let (mut yes, mut held, mut failed) = (0, 0, 0);
        let mut soonest_free: Option<u64> = None;
        let mut last_error = None;
        let most_refusals = self.masters.len() - self.quorum;
        while let Some(answer) = answers.recv().await {
            match answer {
                Ok(Ok(Attempt::Acquired { .. })) => yes += 1,
                Ok(Ok(Attempt::Held { pttl_ms, .. })) => {
                    held += 1;
                    if let Some(pttl) = pttl_ms {
                        soonest_free = Some(soonest_free.map_or(pttl, |s: u64| s.min(pttl)));
                    }
                }
                Ok(Ok(Attempt::NotReplicated { .. })) => failed += 1,
                Ok(Err(e)) => {
                    failed += 1;
                    last_error = Some(e);
                }
                Err(_) => {
                    failed += 1;
                    last_error = Some(LockError::unavailable(TimedOut { after: bound }));
                }
            }
            // Stop once the outcome is known: taken; or not takeable and known to be held by
            // others (a majority answered); or too few can still answer.
            let untakeable = held + failed > most_refusals;
            if yes >= self.quorum || (untakeable && yes + held >= self.quorum) || failed > most_refusals {
                break;
            }
        }
        let ttl = Duration::from_millis(ask.ttl_ms);
        let drift = ttl / 100 + Duration::from_millis(2);
        if yes >= self.quorum && started.elapsed() + drift < ttl {
            stragglers.register();
            return Ok(Attempt::Acquired { fence: None });
        }
        // Not held: give back what was taken, on every master, after every attempt has ended
        // (each is bounded), so that no release overtakes the acquire it must undo.
        let attempts = std::mem::take(&mut stragglers.tasks);
        self.release_everywhere(keys, token, attempts).await;
        if yes >= self.quorum {
            // Taken, but too slowly to be of use: try again at once, within the wait.
            return Ok(Attempt::Held {
                pttl_ms: Some(0),
                behind: false,
                claimed: false,
                kept: None,
            });
        }
        if yes + held >= self.quorum {
            // Enough masters answered, and others hold it on too many: try again within the
            // wait (the caller's `Busy` when it runs out).
            return Ok(Attempt::Held {
                pttl_ms: soonest_free,
                behind: false,
                claimed: false,
                kept: None,
            });
        }
        Err(self.no_quorum(yes + held, last_error))
    }

    /// Keeps the attempts still on their way for `token`'s release, which waits for them.
    fn keep_stragglers(&self, token: &str, tasks: Vec<Attempted>) {
        // Every master answered (the common case): Redis ran each attempt, and a release comes
        // after them anyway.
        if tasks
            .iter()
            .all(|t| t.answered.load(std::sync::atomic::Ordering::Acquire))
        {
            return;
        }
        let mut waiting = lock(&self.stragglers);
        // Locks released by now (or never to be, their guard dropped without a runtime) leave
        // only finished tasks behind: their connections need no pin any more.
        waiting.retain(|_, tasks| tasks.iter().any(|t| !t.task.is_finished()));
        waiting.insert(token.to_owned(), tasks);
    }

    /// Token-checked release on every master, errors ignored (a master that is down keeps the
    /// key until its ttl): how a failed acquire cleans up.
    async fn release_everywhere(&self, keys: &LockKeys, token: &str, attempts: Vec<Attempted>) {
        let bound = self.timeouts.response;
        let releases = self.masters.iter().zip(attempts).map(|(m, attempt)| async move {
            // After the attempt ended (each is bounded), on its connection.
            let _ = attempt.task.await;
            let release = m.release_after(keys, token, 0, Kind::Plain, Some(&attempt.pin), true);
            tokio::time::timeout(bound, release).await
        });
        futures_util::future::join_all(releases).await;
    }

    /// Per lock: renewed on a majority, gone on a majority, or undecided (too few answers either
    /// way): retried while the lock is valid.
    pub(crate) async fn renew_many(
        &self,
        locks: &[(&LockKeys, &str, u64)],
    ) -> Result<Vec<Renewal>, LockError> {
        // A slow master (paused, or reconnecting) must not hold up the renewal on the others
        // past the locks' validity: it is given what an acquire is.
        let shortest = locks.iter().map(|(_, _, ttl_ms)| *ttl_ms).min().unwrap_or(0);
        let bound = self.per_master(shortest);
        let answers = futures_util::future::join_all(self.masters.iter().map(|m| async move {
            match tokio::time::timeout(bound, m.renew_many(locks)).await {
                Ok(answer) => answer,
                Err(_) => Err(LockError::unavailable(TimedOut { after: bound })),
            }
        }))
        .await;
        let mut renewed = vec![0usize; locks.len()];
        let mut gone = vec![0usize; locks.len()];
        let mut answered = 0;
        let mut last_error = None;
        for answer in answers {
            match answer {
                Ok(per_lock) => {
                    answered += 1;
                    for (i, ours) in per_lock.into_iter().enumerate().take(locks.len()) {
                        match ours {
                            Renewal::Renewed => renewed[i] += 1,
                            Renewal::Gone => gone[i] += 1,
                            Renewal::Undecided | Renewal::NotReplicated { .. } => {}
                        }
                    }
                }
                Err(e) => last_error = Some(e),
            }
        }
        if answered < self.quorum {
            return Err(self.no_quorum(answered, last_error));
        }
        Ok(renewed
            .into_iter()
            .zip(gone)
            .map(|(renewed, gone)| {
                if renewed >= self.quorum {
                    Renewal::Renewed
                } else if gone >= self.quorum {
                    Renewal::Gone
                } else {
                    Renewal::Undecided
                }
            })
            .collect())
    }

    /// On every master (each given the response timeout: one that is down or reconnecting does
    /// not hold up the answer longer); `true` when a majority still held it, `false` when a
    /// majority no longer did.
    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        token: &str,
        hold_ms: u64,
    ) -> Result<bool, LockError> {
        let bound = self.timeouts.response;
        // As for an acquire: one task per master, decided by the first majority to answer.
        let (tx, mut answers) = mpsc::unbounded_channel();
        let mut acquiring = lock(&self.stragglers)
            .remove(token)
            .unwrap_or_default()
            .into_iter();
        for master in &self.masters {
            let (master, keys, token, tx) = (Arc::clone(master), keys.clone(), token.to_owned(), tx.clone());
            let acquire = acquiring.next();
            tokio::spawn(async move {
                let pin = match acquire {
                    Some(acquire) => {
                        // Bounded: the acquire gives up after its own timeout.
                        let _ = acquire.task.await;
                        Some(acquire.pin)
                    }
                    None => None,
                };
                let release = master.release_after(&keys, &token, hold_ms, Kind::Plain, pin.as_deref(), true);
                let answer = match tokio::time::timeout(bound, release).await {
                    Ok(answer) => answer,
                    Err(_) => Err(LockError::unavailable(TimedOut { after: bound })),
                };
                let _ = tx.send(answer);
            });
        }
        drop(tx);
        let (mut released, mut not_held, mut failed, mut last) = (0, 0, 0, None);
        let most_failures = self.masters.len() - self.quorum;
        while let Some(answer) = answers.recv().await {
            match answer {
                Ok(true) => released += 1,
                Ok(false) => not_held += 1,
                Err(e) => {
                    failed += 1;
                    last = Some(e);
                }
            }
            if released >= self.quorum || not_held >= self.quorum || failed > most_failures {
                break;
            }
        }
        if released > 0 {
            self.wakeups.notify(&keys.channel);
        }
        if released >= self.quorum {
            return Ok(true);
        }
        if not_held >= self.quorum {
            return Ok(false);
        }
        // Undecided: the masters that did not answer may hold it (until its ttl).
        Err(self.no_quorum(released + not_held, last))
    }

    /// Held when a majority of masters hold the key.
    pub(crate) async fn is_locked(&self, keys: &LockKeys) -> Result<bool, LockError> {
        let answers = futures_util::future::join_all(self.masters.iter().map(|m| m.is_locked(keys))).await;
        self.majority(answers, |locked| *locked)
            .map(|(yes, _)| yes >= self.quorum)
    }

    /// How long a majority still holds the key: the quorum-th longest remaining life.
    pub(crate) async fn remaining_ttl(&self, keys: &LockKeys) -> Result<Option<Duration>, LockError> {
        let answers =
            futures_util::future::join_all(self.masters.iter().map(|m| m.remaining_ttl(keys))).await;
        let mut lives: Vec<Duration> = Vec::new();
        let mut answered = 0;
        let mut last = None;
        for answer in answers {
            match answer {
                Ok(life) => {
                    answered += 1;
                    lives.extend(life);
                }
                Err(e) => last = Some(e),
            }
        }
        if answered < self.quorum {
            return Err(self.no_quorum(answered, last));
        }
        lives.sort_unstable_by(|a, b| b.cmp(a));
        Ok(lives.get(self.quorum - 1).copied())
    }

    /// The value a majority of masters hold, and how long a majority still holds it.
    pub(crate) async fn holder(
        &self,
        keys: &LockKeys,
    ) -> Result<Option<(Stored, Option<Duration>)>, LockError> {
        let answers = futures_util::future::join_all(self.masters.iter().map(|m| m.holder(keys))).await;
        let mut seen: Vec<(Stored, Vec<Duration>)> = Vec::new();
        let mut answered = 0;
        let mut last = None;
        for answer in answers {
            match answer {
                Ok(Some((value, life))) => {
                    answered += 1;
                    let life = life.unwrap_or(Duration::MAX);
                    match seen.iter_mut().find(|(v, _)| *v == value) {
                        Some((_, lives)) => lives.push(life),
                        None => seen.push((value, vec![life])),
                    }
                }
                Ok(None) => answered += 1,
                Err(e) => last = Some(e),
            }
        }
        if answered < self.quorum {
            return Err(self.no_quorum(answered, last));
        }
        Ok(seen
            .into_iter()
            .find(|(_, lives)| lives.len() >= self.quorum)
            .map(|(value, mut lives)| {
                lives.sort_unstable_by(|a, b| b.cmp(a));
                let life = lives
                    .get(self.quorum - 1)
                    .copied()
                    .filter(|l| *l != Duration::MAX);
                (value, life)
            }))
    }

    /// Deletes the key on every master; `true` when a majority had it.
    pub(crate) async fn force_release(&self, keys: &LockKeys) -> Result<bool, LockError> {
        let answers =
            futures_util::future::join_all(self.masters.iter().map(|m| m.force_release(keys))).await;
        self.majority(answers, |deleted| *deleted)
            .map(|(yes, _)| yes >= self.quorum)
    }

    /// Counts the answers for which `yes` holds, failing unless a majority answered.
    fn majority<T>(
        &self,
        answers: Vec<Result<T, LockError>>,
        yes: impl Fn(&T) -> bool,
    ) -> Result<(usize, usize), LockError> {
        let (mut count, mut answered, mut last) = (0, 0, None);
        for answer in answers {
            match answer {
                Ok(value) => {
                    answered += 1;
                    count += usize::from(yes(&value));
                }
                Err(e) => last = Some(e),
            }
        }
        if answered < self.quorum {
            return Err(self.no_quorum(answered, last));
        }
        Ok((count, answered))
    }

    /// Subscribes the lock's channel on every master at once, waiting a short while for the
    /// subscriptions (a release between them and the next attempt is then heard); a master that
    /// takes longer (down, reconnecting) subscribes in the background, and meanwhile the others,
    /// or the waiter's timer, wake it.
    pub(crate) async fn listen(&self, registration: &Registration) {
        let subscribing: Vec<_> = self
            .masters
            .iter()
            .map(|m| m.listen_detached(registration.channel()))
            .collect();
        let all = futures_util::future::join_all(subscribing);
        let _ = tokio::time::timeout(LISTEN_WAIT.min(self.timeouts.response), all).await;
    }
}

/// One master's attempt of an acquire: its task, and the connection it went on.
#[derive(Debug)]
struct Attempted {
    task: JoinHandle<()>,
    pin: Arc<Pinned>,
    /// Its master answered it (then Redis ran it: nothing of it is still on the way).
    answered: Arc<std::sync::atomic::AtomicBool>,
}

/// One acquire's per-master attempts, in master order: kept for the token's release when the
/// lock is taken or the acquire is dropped undecided, so that the release goes to each master
/// only after that master's attempt ended, and on the connection it went on.
struct Stragglers<'a> {
    backend: &'a RedlockBackend,
    token: &'a str,
    tasks: Vec<Attempted>,
}

impl Stragglers<'_> {
    fn register(&mut self) {
        self.backend
            .keep_stragglers(self.token, std::mem::take(&mut self.tasks));
    }
}

impl Drop for Stragglers<'_> {
    fn drop(&mut self) {
        if !self.tasks.is_empty() {
            self.register();
        }
    }
}

impl Store for RedlockBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            name: "RedLock",
            fencing: Offered::No("no single counter"),
            fair: Offered::No("no single line"),
            shared: Offered::No(
                "shares on a majority of masters could not keep writers out across a master's restart",
            ),
            hand_over: false,
        }
    }

    fn connect<'a>(&'a self, probe: &'a LockKeys) -> Answer<'a, ()> {
        Box::pin(RedlockBackend::connect(self, probe))
    }

    fn attempt<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ask: &'a Ask,
        _: &'a Pinned,
    ) -> Answer<'a, Attempt> {
        Box::pin(self.acquire(keys, token, ask))
    }

    fn renew_many<'a>(&'a self, locks: &'a [(&'a LockKeys, &'a str, u64)]) -> Answer<'a, Vec<Renewal>> {
        Box::pin(RedlockBackend::renew_many(self, locks))
    }

    /// A release after an acquire whose answer never came waits for each master's attempt
    /// (the stragglers) instead of following it on its connection.
    fn release<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        hold_ms: u64,
        _: Kind,
        _: Option<&'a Pinned>,
    ) -> Answer<'a, bool> {
        Box::pin(RedlockBackend::release(self, keys, token, hold_ms))
    }

    fn holder<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, Option<(Stored, Option<Duration>)>> {
        Box::pin(RedlockBackend::holder(self, keys))
    }

    fn is_locked<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, bool> {
        Box::pin(RedlockBackend::is_locked(self, keys))
    }

    fn remaining_ttl<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, Option<Duration>> {
        Box::pin(RedlockBackend::remaining_ttl(self, keys))
    }

    fn force_release<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, bool> {
        Box::pin(RedlockBackend::force_release(self, keys))
    }

    fn response_timeout(&self) -> Duration {
        self.timeouts.response
    }

    fn wakeups(&self) -> &Arc<Wakeups> {
        &self.wakeups
    }

    fn listen<'a>(&'a self, registration: &'a Registration) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(RedlockBackend::listen(self, registration))
    }
}
