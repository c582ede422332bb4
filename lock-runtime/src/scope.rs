//! The locks held by the current call chain: reentrancy and [`current`].
//!
//! A guarded body runs inside a task-local frame naming its lock. A guarded call made from inside
//! it (directly or deeper, on the same task) finds the frame and runs without acquiring again;
//! tasks spawned from the body start with no frame, so they are other owners.

use std::future::Future;
use std::sync::Arc;

use crate::state::LockState;

/// The lock held around the current code: see [`current`].
#[derive(Clone)]
pub struct LockInfo {
    key: String,
    fencing_token: Option<u64>,
    permit: Option<u32>,
    state: Arc<LockState>,
    /// A multi-key set's other locks, in the set's canonical order.
    more: Vec<Arc<LockState>>,
}

impl std::fmt::Debug for LockInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockInfo")
            .field("key", &self.key)
            .field("fencing_token", &self.fencing_token)
            .field("permit", &self.permit)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl PartialEq for LockInfo {
    /// The same lock, taken once: the same key and state.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }
}

impl Eq for LockInfo {}

impl LockInfo {
    /// Whether the lock is lost: its key expired, was deleted or taken, or its validity ran
    /// out; for a multi-key set, any of its keys. A body run with `on_lost = "continue"` checks
    /// this before each write that the lock must cover (with `"abort"`, the body is simply
    /// stopped).
    pub fn is_lost(&self) -> bool {
        self.states().any(|state| state.is_lost())
    }

    /// Resolves when the lock is lost (never, if it is not); for a multi-key set, when any of
    /// its keys is: to race work against it, as `tokio::select!` does with a guard's
    /// [`lost`](crate::LockGuard::lost).
    pub async fn lost(&self) {
        if self.more.is_empty() {
            return self.state.lost().await;
        }
        let each = self.states().map(|state| Box::pin(state.lost()));
        futures_util::future::select_all(each).await;
    }

    /// The key as the caller gave it, without the prefix.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lock's fencing token, when it was taken with `fencing`.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// The permit held (`0..n`), when the lock is a semaphore
    /// ([`LockOptions::permits`](crate::LockOptions::permits) above 1); `None` for a lock.
    /// With fencing, a storage that fences per permit keeps the highest token per
    /// `(key, permit)`: holders of different permits write at the same time.
    pub fn permit(&self) -> Option<u32> {
        self.permit
    }

    /// Every key held: one, or a multi-key set's keys in their canonical order
    /// ([`LockClient::run_all`](crate::LockClient::run_all)); [`key`](Self::key) is the first.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.states().map(|state| state.key())
    }

    /// The fencing token of `key`, one of the keys held (each key of a multi-key set has its
    /// own); `None` for a key not held, or held without a token.
    pub fn fencing_token_for(&self, key: &str) -> Option<u64> {
        self.state_of(key).and_then(|state| state.fence)
    }

    /// The permit held of `key`, one of the keys held (a multi-key set of semaphores holds a
    /// permit of each key); `None` for a key not held, or held as a lock.
    pub fn permit_for(&self, key: &str) -> Option<u32> {
        self.state_of(key).and_then(|state| state.permit)
    }

    fn states(&self) -> impl Iterator<Item = &Arc<LockState>> {
        std::iter::once(&self.state).chain(&self.more)
    }

    fn state_of(&self, key: &str) -> Option<&Arc<LockState>> {
        self.states().find(|state| state.key() == key)
    }
}

#[derive(Debug)]
pub(crate) struct Frame {
    /// Which client (backend and prefix) holds it.
    client: usize,
    info: LockInfo,
    pub(crate) state: Arc<LockState>,
    /// A multi-key set's other locks.
    pub(crate) more: Vec<Arc<LockState>>,
    /// Nested calls on this frame's key, made from its body, take turns on this: two of them
    /// joined in one body do not run their bodies at the same time, as two reentrant calls of
    /// one thread could not. Each nested call runs in a frame of its own, so calls nested in it
    /// take turns on its frame instead, and never wait for themselves.
    pub(crate) turns: tokio::sync::Mutex<()>,
    /// The frame on whose `turns` this frame's call took its turn (its address), if it did.
    turn_of: Option<usize>,
    parent: Option<Arc<Frame>>,
}

tokio::task_local! {
    static HELD: Arc<Frame>;
}

/// The innermost lock held by this call chain, inside a body run by
/// [`LockClient::run`](crate::LockClient::run) or `#[distributed_lock]`; `None` elsewhere,
/// including in tasks spawned from such a body.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// use lock_runtime::{LockClient, LockOptions};
///
/// let client = LockClient::in_memory();
/// let options = LockOptions::new(Duration::from_secs(5)).fencing(true);
/// let token = client
///     .run("ledger", &options, async { lock_runtime::current().and_then(|l| l.fencing_token()) })
///     .await?;
/// assert_eq!(token, Some(1));
/// assert!(lock_runtime::current().is_none());
/// # Ok(()) }
/// ```
pub fn current() -> Option<LockInfo> {
    HELD.try_with(|frame| frame.info.clone()).ok()
}

/// The innermost frame of this call chain that holds `lock_key` through `client`, if any.
pub(crate) fn held(client: usize, lock_key: &str) -> Option<Arc<Frame>> {
    HELD.try_with(|innermost| {
        let mut frame = Some(innermost);
        while let Some(f) = frame {
            if f.client == client && f.state_for(lock_key).is_some() {
                return Some(Arc::clone(f));
            }
            frame = f.parent.as_ref();
        }
        None
    })
    .ok()
    .flatten()
}

/// Takes a turn among the calls nested in `outer`'s body, unless this call chain is inside one
/// of them already (a call nested in a nested call runs in its turn: waiting for it would be
/// waiting for itself).
pub(crate) async fn take_turn(outer: &Frame) -> Option<tokio::sync::MutexGuard<'_, ()>> {
    let outer_at = std::ptr::from_ref(outer) as usize;
    let inside = HELD
        .try_with(|innermost| {
            let mut frame = Some(innermost);
            while let Some(f) = frame {
                if Arc::as_ptr(f) as usize == outer_at {
                    return false;
                }
                if f.turn_of == Some(outer_at) {
                    return true;
                }
                frame = f.parent.as_ref();
            }
            false
        })
        .unwrap_or(false);
    match inside {
        true => None,
        false => Some(outer.turns.lock().await),
    }
}

impl Frame {
    /// The state of the lock named `lock_key` in this frame, if it holds it.
    pub(crate) fn state_for(&self, lock_key: &str) -> Option<&Arc<LockState>> {
        std::iter::once(&self.state)
            .chain(&self.more)
            .find(|s| s.lock.name() == lock_key)
    }
}

/// Runs `body` with `state`'s lock pushed onto this call chain's held locks.
pub(crate) fn enter<F: Future>(
    client: usize,
    state: Arc<LockState>,
    body: F,
) -> impl Future<Output = F::Output> {
    enter_set(client, (state, Vec::new()), None, body)
}

/// Runs `body` with a set of locks (`state` names it in [`current`], `more` are the others)
/// pushed onto this call chain's held locks as one frame; `turn_of` is the frame whose turn
/// the call took ([`take_turn`]), if it took one.
pub(crate) fn enter_set<F: Future>(
    client: usize,
    (state, more): (Arc<LockState>, Vec<Arc<LockState>>),
    turn_of: Option<&Frame>,
    body: F,
) -> impl Future<Output = F::Output> {
    let frame = Frame {
        client,
        info: LockInfo {
            key: state.key().to_owned(),
            fencing_token: state.fence,
            permit: state.permit,
            state: Arc::clone(&state),
            more: more.clone(),
        },
        state,
        more,
        turns: tokio::sync::Mutex::new(()),
        turn_of: turn_of.map(|outer| std::ptr::from_ref(outer) as usize),
        parent: HELD.try_with(Arc::clone).ok(),
    };
    HELD.scope(Arc::new(frame), body)
}
