//! One watchdog per client: a single task renews every held lock that is due, many locks per
//! script, instead of one task and one round trip per lock.
//!
//! Each lock is due ttl/3 after its last successful renewal was sent (a lock handed over by a
//! fair release with a shorter lease, a third of that lease in, and a lock without the
//! watchdog only then). When the earliest lock
//! falls due, every lock due within the next half interval is renewed with it (renewing a little
//! early only moves its expiry later), in scripts of up to [`BATCH`] locks sent together. Each
//! lock's validity counts from its own batch's send time, and a lock found gone or taken is lost
//! alone. Transient errors are retried every ttl/20 (5–500 ms) while a lock is still valid; the
//! renew script never re-creates a missing key. With replica acknowledgement, a renewal too few
//! replicas acknowledged moves no validity: it is retried like a failed one, and the lock is lost
//! when its acknowledged validity ends. A lock with a maximum hold is renewed for at most
//! what is left of it, and not at all once it is reached.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::background::Background;
use crate::options::ceil_millis;
use crate::state::{Applied, LockState};
use crate::store::{DynStore, Renewal};
use crate::telemetry;

/// The most locks one renew script extends.
pub(crate) const BATCH: usize = 200;

/// The locks a client's watchdog renews.
#[derive(Debug, Default)]
pub(crate) struct Watchdog {
    held: Mutex<HashMap<u64, Watched>>,
    /// Told of a newly watched lock that is due before the task's current sleep ends.
    changed: Notify,
    /// Until when the task sleeps (`None`: until told): a lock due later needs no wake-up.
    /// Read and written with `held` locked, so a lock watched while the task picks its sleep is
    /// compared with the sleep it picked.
    wakes_at: Mutex<Option<Instant>>,
    /// Started by the first watched lock, again on another runtime if its own has gone.
    task: Background,
}

#[derive(Debug)]
struct Watched {
    state: Arc<LockState>,
    /// When its next renewal is due.
    due: Instant,
    /// The lease it was last given (its ttl, or a shorter one it was handed over with): it is
    /// renewed up to half an interval of it early along with a lock that fell due, and retried
    /// at its pace.
    lease: Duration,
    /// Renewed once, then no more (a lock without the watchdog, handed over with a short
    /// lease).
    once: bool,
}

/// Renew every ttl/3.
fn interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// After a failed renewal, try again this soon (while the lock is still valid).
fn retry(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(5), Duration::from_millis(500))
}

impl Watchdog {
    fn held(&self) -> MutexGuard<'_, HashMap<u64, Watched>> {
        // Every update is one step, so a poisoned map is still consistent.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Renews `state`'s lock, held for `lease` from `sent` (its ttl, or less for a lock handed
    /// over by a fair release), to its ttl: the first time a third of the lease in, then every
    /// ttl/3 (with `once`, only that first time); returns the id that
    /// [`unwatch`](Self::unwatch) takes.
    pub(crate) fn watch(
        self: &Arc<Self>,
        store: &Arc<dyn DynStore>,
        state: Arc<LockState>,
        (sent, lease): (Instant, Duration),
        once: bool,
    ) -> u64 {
        static IDS: AtomicU64 = AtomicU64::new(0);
        let id = IDS.fetch_add(1, Ordering::Relaxed);
        let due = sent + interval(lease);
        let watched = Watched {
            state,
            due,
            lease,
            once,
        };
        {
            let mut held = self.held();
            held.insert(id, watched);
            let wakes_at = *self.wakes_at.lock().unwrap_or_else(|e| e.into_inner());
            if wakes_at.is_none_or(|at| due < at) {
                self.changed.notify_one();
            }
        }
        self.start(store);
        id
    }

    /// Stops renewing lock `id` (before its release is sent). A renewal already on the wire is
    /// harmless: it is token-checked, and Redis applies it before the release that follows it on
    /// the same connection.
    pub(crate) fn unwatch(&self, id: u64) {
        self.held().remove(&id);
    }

    /// Sets whether lock `id` is renewed once only (`true`) or every ttl/3 until unwatched;
    /// answers what it was, `None` if it is not watched.
    pub(crate) fn set_once(&self, id: u64, once: bool) -> Option<bool> {
        self.held()
            .get_mut(&id)
            .map(|watched| std::mem::replace(&mut watched.once, once))
    }

    /// How many locks are being renewed.
    pub(crate) fn len(&self) -> usize {
        self.held().len()
    }

    /// Starts the task (if it is not running on a live runtime); it holds the store weakly, and
    /// ends once the client is gone.
    fn start(self: &Arc<Self>, store: &Arc<dyn DynStore>) {
        self.task.ensure(|| Arc::clone(self).run(Arc::downgrade(store)));
    }

    /// Stops the task and forgets every lock (the client is gone, or shut down).
    pub(crate) fn stop(&self) {
        self.task.stop();
        self.held().clear();
    }

    async fn run(self: Arc<Self>, store: Weak<dyn DynStore>) {
        loop {
            let earliest = {
                let held = self.held();
                let earliest = held.values().map(|w| w.due).min();
                *self.wakes_at.lock().unwrap_or_else(|e| e.into_inner()) = earliest;
                earliest
            };
            match earliest {
                Some(due) if due <= Instant::now() => {}
                Some(due) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(due) => {}
                        () = self.changed.notified() => continue,
                    }
                }
                None => {
                    self.changed.notified().await;
                    continue;
                }
            }
            let Some(store) = store.upgrade() else {
                return;
            };
            self.renew_due(&*store).await;
        }
    }

    /// Renews every lock due now or within the next half interval, in batches sent together.
    async fn renew_due(&self, store: &dyn DynStore) {
        let now = Instant::now();
        let mut due = Vec::new();
        self.held().retain(|&id, watched| {
            if watched.state.is_lost() {
                if watched.state.mark_lost() {
                    tracing::warn!(key = %watched.state.key(), "lock lost: validity ran out before a renewal succeeded");
                }
                return false;
            }
            if watched.due <= now + interval(watched.lease) / 2 {
                if watched.state.renewal(watched.state.ttl, now).is_none() {
                    // Its maximum hold is reached: not renewed again, lost at its validity
                    // (which the hold ends), and looked at then.
                    watched.due = watched.state.valid_until();
                    return true;
                }
                due.push((id, Arc::clone(&watched.state)));
            }
            true
        });
        let batches = due.chunks(BATCH).map(|batch| self.renew_batch(store, batch));
        join_all(batches).await;
    }

    async fn renew_batch(&self, store: &dyn DynStore, batch: &[(u64, Arc<LockState>)]) {
        let sent = Instant::now();
        // Each for its ttl, or what is left of its maximum hold.
        let leases: Vec<Duration> = batch
            .iter()
            // A maximum hold reached since the lock was picked: 1 ms, which lengthens nothing
            // (renewals never shorten a lease) and moves no validity.
            .map(|(_, s)| s.renewal(s.ttl, sent).unwrap_or(Duration::from_millis(1)))
            .collect();
        let locks: Vec<_> = batch
            .iter()
            .zip(&leases)
            .map(|((_, s), lease)| (&s.lock, s.token.as_str(), ceil_millis(*lease)))
            .collect();
        let answer = store.renew(&locks).await;
        match &answer {
            Ok(renewed) => telemetry::renewed(
                renewed
                    .iter()
                    .filter(|r| matches!(r, Renewal::Renewed { .. }))
                    .count() as u64,
            ),
            Err(_) => telemetry::renewal_failed(),
        }
        let mut held = self.held();
        let mut gone = Vec::new();
        for (i, (id, state)) in batch.iter().enumerate() {
            let Some(watched) = held.get_mut(id) else {
                continue; // released meanwhile
            };
            let retry_soon = |watched: &mut Watched| watched.due = Instant::now() + retry(watched.lease);
            match &answer {
                Ok(renewed) => match renewed.get(i).copied().unwrap_or(Renewal::Undecided) {
                    // Renewed once only to reach its ttl, from a store that keeps it for less
                    // than that (a ZooKeeper session shorter than the ttl): a lock without the
                    // watchdog ends where the store's grant ended (docs/deployments.md), so its
                    // validity does not move.
                    Renewal::Renewed {
                        granted_until: Some(until),
                    } if watched.once && until < sent + state.ttl => {
                        tracing::debug!(key = %state.key(), "lock kept by its store for less than its ttl; without the watchdog it ends then");
                        gone.push(*id);
                    }
                    renewal => match state.apply(renewal, sent, leases[i]) {
                        Applied::Renewed { granted, .. } => {
                            // Renewed again a third of the way through what the store keeps
                            // (a late answer moved nothing: the lock is lost at its validity).
                            let cycle = granted.map_or(state.ttl, |kept| {
                                state.ttl.min(kept.max(Duration::from_millis(1)))
                            });
                            watched.due = sent + interval(cycle);
                            watched.lease = cycle;
                            tracing::trace!(key = %state.key(), "lock renewed");
                            if watched.once {
                                gone.push(*id);
                            }
                        }
                        Applied::Gone { newly } => {
                            if newly {
                                tracing::warn!(key = %state.key(), "lock lost: its key is gone or holds another token");
                            }
                            gone.push(*id);
                        }
                        Applied::Undecided => {
                            tracing::warn!(key = %state.key(), "lock renewal undecided (the part of the store holding it: its Cluster shard, too many RedLock masters, its ZooKeeper session, did not answer); retrying while the lock is valid");
                            retry_soon(watched);
                        }
                        Applied::NotReplicated { acked, wanted } => {
                            tracing::warn!(key = %state.key(), acked, wanted, "lock renewal not acknowledged by enough replicas; its validity does not move, retrying while it lasts");
                            retry_soon(watched);
                        }
                    },
                },
                Err(e) => {
                    tracing::warn!(key = %state.key(), error = %e, "lock renewal failed; retrying while the lock is valid");
                    retry_soon(watched);
                }
            }
        }
        for id in gone {
            held.remove(&id);
        }
    }
}
