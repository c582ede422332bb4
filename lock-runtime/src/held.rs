//! The locks a client holds and the releases it has in flight, so that
//! [`LockClient::shutdown`](crate::LockClient::shutdown) can give every one of them back.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::state::LockState;

/// Shards of the registry: every acquire and release touches it, from every task of the client
/// at once, so one lock would be contended.
const SHARDS: usize = 16;

/// One shard: locks by their id.
type Shard = HashMap<u64, Arc<LockState>, BuildHasherDefault<IdHasher>>;

/// Ids are handed out in sequence, once each: they are their own hash (SipHash, the default,
/// would cost more than the rest of an insert, on every acquire).
#[derive(Debug, Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 ids are hashed; anything else folds in byte by byte.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, id: u64) {
        // hashbrown takes its bucket from the low bits and its tag from the high ones: the
        // shard's own ids (every SHARDS-th) are spread over both.
        self.0 = (id / SHARDS as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[derive(Debug, Default)]
pub(crate) struct HeldLocks {
    locks: [Mutex<Shard>; SHARDS],
    /// Set by shutdown: no new acquires.
    closed: AtomicBool,
    /// Acquire attempts on the wire, not yet settled into a held (registered) lock or a refusal:
    /// shutdown waits for them, so a lock taken by one is not missed.
    acquiring: InFlight,
    /// Background releases not finished yet.
    releasing: Arc<InFlight>,
}

/// A count of operations in flight, and a way to wait until there are none.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    count: AtomicUsize,
    none: Notify,
}

impl InFlight {
    /// Counts one operation until the returned value is dropped.
    pub(crate) fn enter(self: &Arc<Self>) -> Pending {
        self.count.fetch_add(1, Ordering::SeqCst);
        Pending(Arc::clone(self))
    }

    /// Completes when nothing is in flight.
    pub(crate) async fn none(&self) {
        loop {
            let notified = self.none.notified();
            if self.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl InFlight {
    fn leave(&self) {
        if self.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.none.notify_waiters();
        }
    }
}

/// One operation in flight, for a spawned task.
#[derive(Debug)]
pub(crate) struct Pending(Arc<InFlight>);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// One acquire attempt in flight.
#[derive(Debug)]
pub(crate) struct Attempting<'a>(&'a InFlight);

impl Drop for Attempting<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

impl HeldLocks {
    fn shard(&self, id: u64) -> MutexGuard<'_, Shard> {
        // Every update is one step, so a poisoned map is still consistent.
        self.locks[id as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Records a lock taken; returns the id that [`forget`](Self::forget) takes.
    pub(crate) fn insert(&self, state: Arc<LockState>) -> u64 {
        static IDS: AtomicU64 = AtomicU64::new(0);
        let id = IDS.fetch_add(1, Ordering::Relaxed);
        self.shard(id).insert(id, state);
        id
    }

    /// The store says the locks held under `tokens` are gone (their session ended): each is
    /// lost at once (its `lost()` fires, an aborting body stops), not at its next renewal.
    pub(crate) fn lost(&self, tokens: &[String]) {
        for shard in &self.locks {
            let states: Vec<Arc<LockState>> = shard
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .filter(|state| tokens.iter().any(|t| *t == state.token))
                .cloned()
                .collect();
            for state in states {
                if state.mark_lost() {
                    tracing::warn!(key = %state.key(), "lock lost: the store ended the session it was held on");
                }
            }
        }
    }

    /// The lock is being released by its guard (or was given back by shutdown).
    pub(crate) fn forget(&self, id: u64) {
        self.shard(id).remove(&id);
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Every lock still held, now forgotten: shutdown releases them.
    pub(crate) fn take_all(&self) -> Vec<Arc<LockState>> {
        (0..SHARDS as u64)
            .flat_map(|shard| {
                self.shard(shard)
                    .drain()
                    .map(|(_, state)| state)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Counts an acquire attempt until the returned value is dropped (after its lock, if it
    /// took one, is registered). Borrowed, not an `Arc`: it is on every attempt's path.
    pub(crate) fn acquiring(&self) -> Attempting<'_> {
        self.acquiring.count.fetch_add(1, Ordering::SeqCst);
        Attempting(&self.acquiring)
    }

    /// Counts a background release until the returned value is dropped.
    pub(crate) fn releasing(&self) -> Pending {
        self.releasing.enter()
    }

    /// Completes when no acquire attempt is in flight.
    pub(crate) async fn acquires_settled(&self) {
        self.acquiring.none().await;
    }

    /// Completes when no background release is in flight.
    pub(crate) async fn released_all(&self) {
        self.releasing.none().await;
    }
}
