//! A process-local backend with the semantics of the Redis one, on tokio's clock (so tests of
//! user code may pause and advance time).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::{Attempt, LockKeys};
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
            wakeups: Wakeups::new(None),
        }
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        // Every update below is a single step, so a poisoned store is still consistent.
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn wakeups(&self) -> &Arc<Wakeups> {
        &self.wakeups
    }

    pub(crate) fn acquire(&self, keys: &LockKeys, token: &str, ttl_ms: u64, fencing: bool) -> Attempt {
        let now = Instant::now();
        let mut store = self.store();
        if let Some(held) = store.live(&keys.lock, now) {
            let left = held.expires_at.saturating_duration_since(now);
            return Attempt::Held {
                pttl_ms: Some(crate::options::ceil_millis(left)),
            };
        }
        let fence = fencing.then(|| {
            let counter = store.fences.entry(keys.fence.clone()).or_insert(0);
            *counter += 1;
            *counter
        });
        store.locks.insert(
            keys.lock.clone(),
            Held {
                token: token.to_owned(),
                expires_at: now + Duration::from_millis(ttl_ms),
            },
        );
        Attempt::Acquired { fence }
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

    pub(crate) fn release(&self, keys: &LockKeys, token: &str, hold_ms: u64) -> bool {
        let now = Instant::now();
        {
            let mut store = self.store();
            match store.ours(&keys.lock, token, now) {
                Some(held) if hold_ms > 0 => held.expires_at = now + Duration::from_millis(hold_ms),
                Some(_) => {
                    store.locks.remove(&keys.lock);
                }
                None => return false,
            }
        }
        self.wakeups.notify(&keys.channel);
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
