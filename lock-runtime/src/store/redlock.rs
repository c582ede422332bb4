//! RedLock: one lock over N independent Redis masters, held while a majority holds it.
//!
//! Each master is an ordinary [`RedisStore`] (its own connection, the same scripts); this
//! store only says how many must agree. An acquire is sent to every master at once and is
//! decided as soon as a majority said yes (or can no longer say yes): the latency is the slowest
//! of the fastest majority. Renewals count when a majority renewed, and a lock is lost when a
//! majority says it is gone; nothing is ever deleted because a renewal failed. Releases go to
//! every master. Waiters listen on every master (one shared registry, one listener per master),
//! so a release heard from any of them wakes the next waiter.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::redis::connection::lock as locked;
use super::redis::servers::Servers;
use super::redis::urls::{client_for_url, no_insecure_urls};
use super::redis::{keys, RedisStore};
use super::{
    Asked, Attempt, Capabilities, DynStore, Flight, ForceReleased, Kind, Lock, LockView, Offered, Release,
    Released, Renewal, Renewing, Settings, Store, StoreAdmin, StoreConfig, Timeouts, Waking,
};
use crate::builder::addresses;
use crate::error::TimedOut;
use crate::redact::hide_credentials;
use crate::view::{Fence, Holding};
use crate::{LockClientBuilder, LockError};

/// The most masters a client takes (one wake-up listener bit each).
pub(crate) const MAX_MASTERS: usize = 64;

/// How long a waiter waits for its subscriptions before its next attempt.
const LISTEN_WAIT: Duration = Duration::from_millis(250);

/// RedLock's masters, as the builder was told.
#[derive(Clone)]
pub(crate) struct RedlockConfig(Vec<String>);

impl std::fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self.0.iter().map(|u| hide_credentials(u)).collect();
        f.debug_tuple("Redlock").field(&urls).finish()
    }
}

impl StoreConfig for RedlockConfig {
    fn open(&self, settings: Settings) -> Result<Arc<dyn DynStore>, LockError> {
        let urls = &self.0;
        no_insecure_urls(urls)?;
        settings.no_replicas("RedLock: its masters are independent")?;
        if urls.len() > MAX_MASTERS {
            return Err(LockError::invalid_options(format!(
                "RedLock takes at most {MAX_MASTERS} masters"
            )));
        }
        if urls.len() < 3 {
            return Err(LockError::invalid_options(
                "RedLock needs at least 3 independent masters (5 is usual)",
            ));
        }
        let clients = urls
            .iter()
            .map(|url| client_for_url(url, &settings.tls))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(RedlockStore::new(clients, settings)))
    }
}

impl LockClientBuilder {
    /// A quorum of independent Redis masters (RedLock; at least 3, usually 5): a lock is held
    /// while a majority of them hold it. An acquire is sent to all at once and holds once a
    /// majority said yes with validity to spare; renewals count on a majority; a release goes to
    /// all, and waiters hear releases from any. Fencing and fair mode are refused
    /// ([`LockError::InvalidOptions`]): there is no single counter or line. See the guide's
    /// deployments page (`docs/deployments.md`, "RedLock") for when to choose it, and when not.
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
    pub fn redlock(self, urls: impl IntoIterator<Item = impl AsRef<str>>) -> Self {
        self.place(RedlockConfig(addresses(urls)))
    }
}

#[derive(Debug)]
pub(crate) struct RedlockStore {
    /// Shared with the tasks that carry each master's part of an acquire or release, which
    /// finish on their own after the outcome is decided.
    masters: Vec<Arc<RedisStore>>,
    prefix: String,
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

impl RedlockStore {
    /// Connects nothing yet. Each master's subscriber is a listener of its own (its place in
    /// the list), so a release heard from any of them wakes this client's waiters.
    pub(crate) fn new(clients: Vec<redis::Client>, settings: Settings) -> Self {
        let masters = clients
            .into_iter()
            .enumerate()
            .map(|(listener, client)| {
                let settings = Settings {
                    notices: settings.notices.listener(listener),
                    ..settings.clone()
                };
                Arc::new(RedisStore::new(Servers::One(client), settings))
            })
            .collect::<Vec<_>>();
        RedlockStore {
            quorum: masters.len() / 2 + 1,
            masters,
            prefix: settings.prefix,
            stragglers: std::sync::Mutex::default(),
            timeouts: settings.timeouts,
        }
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
        let mut waiting = locked(&self.stragglers);
        // Locks released by now (or never to be, their guard dropped without a runtime) leave
        // only finished tasks behind: their connections need no pin any more.
        waiting.retain(|_, tasks| tasks.iter().any(|t| !t.task.is_finished()));
        waiting.insert(token.to_owned(), tasks);
    }

    /// Token-checked release on every master, errors ignored (a master that is down keeps the
    /// key until its ttl): how a failed acquire cleans up.
    async fn release_everywhere(&self, lock: &str, token: &str, attempts: Vec<Attempted>) {
        let bound = self.timeouts.response;
        let releases = self.masters.iter().zip(attempts).map(|(m, attempt)| async move {
            // After the attempt ended (each is bounded), on its connection.
            let _ = attempt.task.await;
            let release = m.release_lock(
                m.caller(lock, token),
                Release {
                    hold_ms: 0,
                    kind: Kind::Plain,
                    after: Some(&attempt.flight),
                },
            );
            tokio::time::timeout(bound, release).await
        });
        futures_util::future::join_all(releases).await;
    }
}

/// One master's attempt of an acquire: its task, and the connection it went on.
#[derive(Debug)]
struct Attempted {
    task: JoinHandle<()>,
    flight: Arc<Flight>,
    /// Its master answered it (then Redis ran it: nothing of it is still on the way).
    answered: Arc<std::sync::atomic::AtomicBool>,
}

/// One acquire's per-master attempts, in master order: kept for the token's release when the
/// lock is taken or the acquire is dropped undecided, so that the release goes to each master
/// only after that master's attempt ended, and on the connection it went on.
struct Stragglers<'a> {
    backend: &'a RedlockStore,
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

impl Store for RedlockStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            name: "RedLock",
            fencing: Offered::No("no single counter"),
            fair: Offered::No("no single line"),
            shared: Offered::No(
                "shares on a majority of masters could not keep writers out across a master's restart",
            ),
            permits: Offered::No(
                "each master would count its holders on its own: with more than one permit, \
                 more callers than permits can each win a majority of masters",
            ),
            waking: Waking::Announced { hands_over: false },
        }
    }

    fn name(&self, key: &str) -> String {
        keys::name(&self.prefix, key)
    }

    /// Connects to every master; fails unless a majority is reachable.
    async fn connect(&self) -> Result<(), LockError> {
        let answers = futures_util::future::join_all(self.masters.iter().map(|m| m.connect())).await;
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

    /// Sent to every master at once, each given a tenth of the ttl (at least 50 ms, at most the
    /// response timeout); decided by the first majority to answer, held only while that majority
    /// answered within the lock's validity.
    async fn attempt(&self, asked: Asked<'_>, _: &Flight) -> Result<Attempt, LockError> {
        let Asked { lock, token, ask } = asked;
        let lock = lock.name();
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
            let (master, lock, token, ask, tx) = (
                Arc::clone(master),
                lock.to_owned(),
                token.to_owned(),
                *ask,
                tx.clone(),
            );
            let flight = Arc::new(Flight::default());
            let answered = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (flown, answer) = (Arc::clone(&flight), Arc::clone(&answered));
            let task = tokio::spawn(async move {
                let attempt = master.acquire(master.caller(&lock, &token), &ask, &flown);
                let attempt = tokio::time::timeout(bound, attempt).await;
                if matches!(attempt, Ok(Ok(_))) {
                    answer.store(true, std::sync::atomic::Ordering::Release);
                }
                let _ = tx.send(attempt);
            });
            stragglers.tasks.push(Attempted {
                task,
                flight,
                answered,
            });
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
            return Ok(Attempt::acquired(None));
        }
        // Not held: give back what was taken, on every master, after every attempt has ended
        // (each is bounded), so that no release overtakes the acquire it must undo.
        let attempts = std::mem::take(&mut stragglers.tasks);
        self.release_everywhere(lock, token, attempts).await;
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

    /// Per lock: renewed on a majority, gone on a majority, or undecided (too few answers either
    /// way): retried while the lock is valid.
    async fn renew(&self, locks: &[Renewing<'_>]) -> Result<Vec<Renewal>, LockError> {
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
                            // Redis masters renew for the whole lease asked.
                            Renewal::Renewed { .. } => renewed[i] += 1,
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
                    Renewal::RENEWED
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
    ///
    /// A release after an acquire whose answer never came waits for each master's attempt
    /// (the stragglers) instead of following it on its connection.
    async fn release(&self, lock: &Lock, token: &str, release: Release<'_>) -> Result<Released, LockError> {
        let (lock, hold_ms) = (lock.name(), release.hold_ms);
        let bound = self.timeouts.response;
        // As for an acquire: one task per master, decided by the first majority to answer.
        let (tx, mut answers) = mpsc::unbounded_channel();
        let mut acquiring = locked(&self.stragglers)
            .remove(token)
            .unwrap_or_default()
            .into_iter();
        for master in &self.masters {
            let (master, lock, token, tx) =
                (Arc::clone(master), lock.to_owned(), token.to_owned(), tx.clone());
            let acquire = acquiring.next();
            tokio::spawn(async move {
                let flight = match acquire {
                    Some(acquire) => {
                        // Bounded: the acquire gives up after its own timeout.
                        let _ = acquire.task.await;
                        Some(acquire.flight)
                    }
                    None => None,
                };
                let release = master.release_lock(
                    master.caller(&lock, &token),
                    Release {
                        hold_ms,
                        kind: Kind::Plain,
                        after: flight.as_deref(),
                    },
                );
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
                Ok(Released::NotOurs) => not_held += 1,
                Ok(_) => released += 1,
                Err(e) => {
                    failed += 1;
                    last = Some(e);
                }
            }
            if released >= self.quorum || not_held >= self.quorum || failed > most_failures {
                break;
            }
        }
        if released >= self.quorum {
            return Ok(Released::Freed);
        }
        if not_held >= self.quorum {
            return Ok(Released::NotOurs);
        }
        // Undecided: the masters that did not answer may hold it (until its ttl).
        Err(self.no_quorum(released + not_held, last))
    }

    /// Subscribes the lock's channel on every master at once, waiting a short while for the
    /// subscriptions (a release between them and the next attempt is then heard); a master that
    /// takes longer (down, reconnecting) subscribes in the background, and meanwhile the others,
    /// or the waiter's timer, wake it.
    async fn listen(&self, lock: &Lock) {
        let name = lock.name();
        let subscribing: Vec<_> = self.masters.iter().map(|m| m.listen_detached(name)).collect();
        let all = join_all(subscribing);
        let _ = tokio::time::timeout(LISTEN_WAIT.min(self.timeouts.response), all).await;
    }

    fn unlisten(&self, name: &str) {
        for master in &self.masters {
            master.unlisten_to(name);
        }
    }
}

impl StoreAdmin for RedlockStore {
    /// The lock as a majority of masters hold it: the holder a majority agree on, for as long
    /// as a majority still hold it (the quorum-th longest remaining life); held by no one
    /// majority (a split), it is shown as held, by no one in particular.
    async fn inspect(&self, lock: &Lock) -> Result<LockView, LockError> {
        let answers = join_all(self.masters.iter().map(|m| StoreAdmin::inspect(&**m, lock))).await;
        let (mut seen, mut answered, mut held, mut last) =
            (Vec::<(Holding, Vec<Duration>)>::new(), 0, 0, None);
        for answer in answers {
            match answer {
                Ok(view) => {
                    answered += 1;
                    if !view.is_held() {
                        continue;
                    }
                    held += 1;
                    let life = view.remaining.unwrap_or(Duration::MAX);
                    match seen.iter_mut().find(|(h, _)| *h == view.holding) {
                        Some((_, lives)) => lives.push(life),
                        None => seen.push((view.holding, vec![life])),
                    }
                }
                Err(e) => last = Some(e),
            }
        }
        if answered < self.quorum {
            return Err(self.no_quorum(answered, last));
        }
        let mut view = LockView::free(lock.key(), lock.name());
        if let Some((holding, mut lives)) = seen.into_iter().find(|(_, lives)| lives.len() >= self.quorum) {
            lives.sort_unstable_by(|a, b| b.cmp(a));
            view.holding = holding;
            view.remaining = lives
                .get(self.quorum - 1)
                .copied()
                .filter(|l| *l != Duration::MAX);
        } else if held >= self.quorum {
            view.holding = Holding::Foreign {
                kind: "no majority".to_owned(),
                value: None,
            };
        }
        view.fence = Fence::None;
        Ok(view)
    }

    /// The locks a majority of masters hold, matching `pattern`.
    async fn list(&self, pattern: &str) -> Result<Vec<LockView>, LockError> {
        let answers = join_all(self.masters.iter().map(|m| StoreAdmin::list(&**m, pattern))).await;
        let mut found = std::collections::BTreeSet::<String>::new();
        let (mut answered, mut last) = (0, None);
        for answer in answers {
            match answer {
                Ok(views) => {
                    answered += 1;
                    found.extend(views.into_iter().map(|v| v.key));
                }
                Err(e) => last = Some(e),
            }
        }
        if answered < self.quorum {
            return Err(self.no_quorum(answered, last));
        }
        let mut views = Vec::with_capacity(found.len());
        for key in found {
            let lock = Lock::new(&key, Store::name(self, &key));
            let view = StoreAdmin::inspect(self, &lock).await?;
            if view.is_held() {
                views.push(view);
            }
        }
        Ok(views)
    }

    /// Frees the lock on every master that still holds what `seen` shows: freed once a
    /// majority no longer holds it.
    async fn force_release(&self, lock: &Lock, seen: &LockView) -> Result<ForceReleased, LockError> {
        let answers = join_all(
            self.masters
                .iter()
                .map(|m| StoreAdmin::force_release(&**m, lock, seen)),
        )
        .await;
        let (mut freed, mut gone, mut changed, mut last) = (0, 0, 0, None);
        for answer in answers {
            match answer {
                Ok(ForceReleased::Freed) => freed += 1,
                Ok(ForceReleased::Gone) => gone += 1,
                Ok(ForceReleased::Changed) => changed += 1,
                Err(e) => last = Some(e),
            }
        }
        if freed + gone + changed < self.quorum {
            return Err(self.no_quorum(freed + gone + changed, last));
        }
        Ok(if freed + gone < self.quorum {
            ForceReleased::Changed
        } else if freed > 0 {
            ForceReleased::Freed
        } else {
            ForceReleased::Gone
        })
    }
}
