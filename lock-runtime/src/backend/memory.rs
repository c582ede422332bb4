//! A process-local backend with the semantics of the Redis one, on tokio's clock (so tests of
//! user code may pause and advance time).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::{Ask, Attempt, LockKeys};
use crate::options::{ceil_millis, FAIR_PLACE_KEPT};
use crate::wakeups::Wakeups;

#[derive(Debug)]
struct Held {
    token: String,
    expires_at: Instant,
}

#[derive(Debug, Default)]
struct Store {
    locks: HashMap<String, Held>,
    fences: HashMap<String, u64>,
    /// Fair queues, by queue key.
    queues: HashMap<String, Queue>,
    /// Orders arrivals in every queue.
    arrivals: u64,
}

/// Fair waiters of one lock: tokens by arrival, and when each one's place lapses.
#[derive(Debug, Default)]
struct Queue {
    order: BTreeMap<u64, String>,
    places: HashMap<String, (u64, Instant)>,
}

impl Queue {
    /// Drops waiters whose place lapsed; whether any did.
    fn purge(&mut self, now: Instant) -> bool {
        let before = self.places.len();
        let order = &mut self.order;
        self.places.retain(|_, (arrival, kept)| {
            let keep = *kept > now;
            if !keep {
                order.remove(arrival);
            }
            keep
        });
        self.places.len() != before
    }

    fn head(&self) -> Option<&String> {
        self.order.values().next()
    }

    fn leave(&mut self, token: &str) {
        if let Some((arrival, _)) = self.places.remove(token) {
            self.order.remove(&arrival);
        }
    }
}

impl Store {
    /// The live holder of `key`; an expired one is removed on the way, as Redis would.
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Held> {
        if self.locks.get(key).is_some_and(|h| h.expires_at <= now) {
            self.locks.remove(key);
        }
        self.locks.get_mut(key)
    }

    fn ours(&mut self, key: &str, token: &str, now: Instant) -> Option<&mut Held> {
        self.live(key, now).filter(|h| h.token == token)
    }
}

#[derive(Debug)]
pub(crate) struct MemoryBackend {
    store: Mutex<Store>,
    wakeups: Arc<Wakeups>,
}

impl MemoryBackend {
    pub(crate) fn new() -> Self {
        MemoryBackend {
            store: Mutex::default(),
            wakeups: Wakeups::new(Vec::new()),
        }
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        // Every update below is a single step, so a poisoned store is still consistent.
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn wakeups(&self) -> &Arc<Wakeups> {
        &self.wakeups
    }

    pub(crate) fn acquire(&self, keys: &LockKeys, token: &str, ask: &Ask) -> Attempt {
        let now = Instant::now();
        let mut store = self.store();
        let holder = store
            .live(&keys.lock, now)
            .map(|h| (h.token == token, h.expires_at));
        if let Some((true, _)) = holder {
            let fence = ask
                .fencing
                .then(|| store.fences.get(&keys.fence()).copied().unwrap_or(0));
            return Attempt::Acquired { fence };
        }
        if ask.fair {
            let store = &mut *store;
            let queue = store.queues.entry(keys.queue()).or_default();
            let purged = queue.purge(now);
            let head = queue.head().cloned();
            if holder.is_some() || head.as_deref().is_some_and(|h| h != token) {
                if ask.join {
                    let kept = now + FAIR_PLACE_KEPT;
                    match queue.places.get_mut(token) {
                        Some(place) => place.1 = kept,
                        None => {
                            store.arrivals += 1;
                            queue.order.insert(store.arrivals, token.to_owned());
                            queue.places.insert(token.to_owned(), (store.arrivals, kept));
                        }
                    }
                }
                if holder.is_none() && purged {
                    // The lock is free and the waiters ahead of the new head are gone.
                    if let Some(head) = head {
                        self.wakeups.notify_waiter(&keys.channel, head.as_bytes());
                    }
                }
                let pttl_ms =
                    holder.map(|(_, expires_at)| ceil_millis(expires_at.saturating_duration_since(now)));
                let behind = queue.order.values().next().is_some_and(|first| first != token)
                    && queue.places.contains_key(token);
                return Attempt::Held { pttl_ms, behind };
            }
            queue.leave(token);
        }
        if let Some((_, expires_at)) = holder {
            return Attempt::Held {
                pttl_ms: Some(ceil_millis(expires_at.saturating_duration_since(now))),
                behind: false,
            };
        }
        let fence = ask.fencing.then(|| {
            let counter = store.fences.entry(keys.fence()).or_insert(0);
            *counter += 1;
            *counter
        });
        store.locks.insert(
            keys.lock.clone(),
            Held {
                token: token.to_owned(),
                expires_at: now + Duration::from_millis(ask.ttl_ms),
            },
        );
        Attempt::Acquired { fence }
    }

    pub(crate) fn leave_queue(&self, keys: &LockKeys, token: &str) {
        if let Some(queue) = self.store().queues.get_mut(&keys.queue()) {
            queue.leave(token);
        }
    }

    pub(crate) fn renew(&self, keys: &LockKeys, token: &str, ttl_ms: u64) -> bool {
        let now = Instant::now();
        match self.store().ours(&keys.lock, token, now) {
            Some(held) => {
                held.expires_at = now + Duration::from_millis(ttl_ms);
                true
            }
            None => false,
        }
    }

    pub(crate) fn release(&self, keys: &LockKeys, token: &str, hold_ms: u64, fair: bool) -> bool {
        let now = Instant::now();
        let next = {
            let mut store = self.store();
            // As in release.lua: a lock kept for its minimum hold is marked released, so a
            // renewal applied after the release cannot extend it; a second release stands.
            let kept = format!("{token}:released");
            let held = store
                .live(&keys.lock, now)
                .filter(|h| h.token == token || h.token == kept);
            match held {
                Some(held) if hold_ms > 0 && held.token == kept => return true,
                Some(held) if hold_ms > 0 => {
                    held.token = kept;
                    held.expires_at = now + Duration::from_millis(hold_ms);
                }
                Some(_) => {
                    store.locks.remove(&keys.lock);
                }
                None => return false,
            }
            let queue = if fair {
                store.queues.get_mut(&keys.queue())
            } else {
                None
            };
            queue.and_then(|q| {
                q.purge(now);
                q.head().cloned()
            })
        };
        match next {
            Some(head) => self.wakeups.notify_waiter(&keys.channel, head.as_bytes()),
            None => self.wakeups.notify(&keys.channel),
        }
        true
    }

    pub(crate) fn is_locked(&self, keys: &LockKeys) -> bool {
        self.store().live(&keys.lock, Instant::now()).is_some()
    }

    pub(crate) fn remaining_ttl(&self, keys: &LockKeys) -> Option<Duration> {
        let now = Instant::now();
        self.store()
            .live(&keys.lock, now)
            .map(|h| h.expires_at.saturating_duration_since(now))
    }

    /// The lock's value and remaining life, if it is held.
    pub(crate) fn holder(&self, keys: &LockKeys) -> Option<(Vec<u8>, Option<Duration>)> {
        let now = Instant::now();
        self.store().live(&keys.lock, now).map(|h| {
            (
                h.token.clone().into_bytes(),
                Some(h.expires_at.saturating_duration_since(now)),
            )
        })
    }

    pub(crate) fn force_release(&self, keys: &LockKeys) -> bool {
        let removed = {
            let mut store = self.store();
            store.live(&keys.lock, Instant::now()).is_some() && store.locks.remove(&keys.lock).is_some()
        };
        if removed {
            self.wakeups.notify(&keys.channel);
        }
        removed
    }
}
