//! Distributed locks on Redis (or PostgreSQL, with the `postgres` feature) for async Rust,
//! correct by default.
//!
//! A lock is taken atomically (one `SET key token NX PX`, or one script), renewed while it is held
//! (the watchdog), tracked against a local monotonic clock so that a holder *knows* when it may no
//! longer hold it, and released with a token-checked script on every exit path: return, error,
//! panic and cancellation. Waiters are woken by the release itself (pub/sub), not by a timer.
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_runtime::{LockClient, LockOptions};
//!
//! # async fn demo() -> Result<(), lock_runtime::LockError> {
//! let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
//! let options = LockOptions::new(Duration::from_secs(30)).watchdog(true).fencing(true);
//! locks
//!     .run("order:42", &options, async {
//!         let token = lock_runtime::current().and_then(|l| l.fencing_token());
//!         // charge the order once; hand `token` to storage that rejects older ones
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! The data model: the lock on key `k` lives at `<prefix>{k}` (default prefix `lock:`) and holds
//! the holder's value (a fresh UUID v4 and the client's owner label, see [`Holder`]); its fencing counter is `<prefix>{k}:fence`; releases are
//! announced on `<prefix>{k}:released` when someone waits (a waiter marks the lock at
//! `<prefix>{k}:waiting`; on a Cluster, always); fair waiters line up in `<prefix>{k}:queue`. Readers of a
//! read-write lock ([`LockMode::Shared`]) share the lock key as a hash of their values, and writers
//! waiting for them claim their turn in `<prefix>{k}:writers`. The whole protocol is one
//! `SET NX PX GET` (an uncontended acquire) and the five scripts under `src/scripts/`.

// docs.rs documents with `--cfg docsrs` on nightly (see `[package.metadata.docs.rs]`); there
// `doc_cfg` labels every feature-gated item with the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
// Without Redis, parts of the seam that only Redis speaks (replica acknowledgement, a pinned
// connection, a release that names a waiter) go unused; the build with it checks them.
#![cfg_attr(not(feature = "redis"), allow(dead_code, unused_imports))]

/// This crate's README (the page crates.io shows), compiled as doc tests so it stays true. Only
/// files inside the package can be included here (`cargo package` builds the crate alone): the
/// workspace README's examples are compiled by the unpublished `lock-tests` package instead.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod acquire;
#[cfg(feature = "cli")]
#[cfg_attr(docsrs, doc(cfg(feature = "cli")))]
pub mod admin;
mod background;
mod builder;
mod client;
mod core;
mod error;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod fencing;
mod guard;
mod held;
mod holder;
mod options;
mod redact;
mod scope;
mod state;
mod store;
#[cfg(test)]
mod store_tests;
mod telemetry;
mod view;
mod wakeups;
mod watchdog;

/// What is Redis's own, for code that reads a Redis store itself (a dashboard, a cleanup job,
/// tests): the names a lock owns there.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis {
    pub use crate::store::redis::keys;
}

/// The names a lock owns in Redis: the old name of [`redis::keys`].
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[deprecated(since = "0.1.0", note = "moved to lock_runtime::redis::keys")]
pub mod keys {
    pub use crate::store::redis::keys::*;
}

/// Fenced writes in PostgreSQL: the old name of [`fencing::postgres`].
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[deprecated(since = "0.1.0", note = "renamed lock_runtime::fencing::postgres")]
pub mod postgres {
    pub use crate::fencing::postgres::{check_fence, create_fence_table, FENCES_TABLE};
}

pub use acquire::MAX_WAIT_NAP;
pub use builder::{LockClientBuilder, MAX_PREFIX_LEN};
pub use client::{default_client, set_default_client, LockClient};
pub use error::{BoxError, LockError, ShutDown, TimedOut};
pub use guard::LockGuard;
pub use holder::Holder;
pub use store::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT};

/// The longest key accepted, in bytes, before the prefix is added.
pub const MAX_KEY_LEN: usize = 1024;
/// The most distinct keys one multi-key call takes
/// ([`LockClient::acquire_all`](crate::LockClient::acquire_all)).
pub const MAX_KEYS: usize = 64;
/// The default key prefix: on Redis, `order:42` is stored at `lock:{order:42}`.
pub const DEFAULT_PREFIX: &str = "lock:";
pub use options::{
    LockMode, LockOptions, OnLost, FAIR_PLACE_KEPT, MAX_DURATION, MAX_PERMITS, MIN_TTL, MIN_WATCHDOG_TTL,
};
pub use scope::{current, LockInfo};

/// Turns an async fn into a critical section guarded by a distributed lock.
///
/// ```no_run
/// use lock_runtime::{distributed_lock, LockError};
///
/// # struct Receipt;
/// #[derive(Debug)]
/// enum PayError { Lock(LockError), Declined }
/// impl From<LockError> for PayError {
///     fn from(e: LockError) -> Self { PayError::Lock(e) }
/// }
///
/// #[distributed_lock(key = "order:<id>", ttl_ms = 30000, watchdog)]
/// async fn pay(id: u64, amount_cents: u64) -> Result<Receipt, PayError> {
///     // runs only while this process holds `order:<id>`
/// #   Ok(Receipt)
/// }
/// ```
///
/// Before the body runs, the key is rendered and the lock taken (one atomic script); while it runs,
/// the lock is renewed (`watchdog`) and watched; when the body finishes, by a value, an `Err`, `?`
/// or an early `return`, the lock is released with a token-checked script before the fn returns.
/// A panic, or the future being dropped (a `tokio::time::timeout`, a client that hung up), releases
/// it in the background. A lock that cannot be taken or is lost becomes the fn's error through
/// `E: From<LockError>`. The signature stays as written, so the fn is still an `async fn`, its
/// future is `Send` whenever the body's is, and other attributes stack.
///
/// # Arguments
///
/// | argument | default | meaning |
/// |---|---|---|
/// | `key = "…"` | required | The lock's key: text plus `<name>` or `<name.field.path>` placeholders naming parameters (also names bound in patterns, such as `Path(order_id): Path<u64>`, and `self`), rendered with `Display`. Must render to 1..=1024 bytes without a NUL byte, else [`LockError::InvalidKey`] (any other character, a newline or spaces included, is part of the key as written). |
/// | `ttl_ms = N` | `30000` | The lease in milliseconds (at least 10; at least 60 with `watchdog`). |
/// | `watchdog` | off | Renew every ttl/3 while the body runs. Without it the ttl is a hard lease: the body is lost at its end. |
/// | `wait_ms = N` | `0` | How long to wait for a holder, woken by its release. `0`: one attempt, then [`LockError::Busy`]. Independent of `ttl_ms`: a wait longer than the ttl is fine (a holder that renews may keep the lock for several ttls; the wait bounds only this call). |
/// | `fencing` | off | Take a fencing token, strictly increasing per key; read it with [`current()`]. |
/// | `fair` | off | Waiters get the lock in the order they began waiting, across all clients and processes ([`LockOptions::fair`]). |
/// | `hold_at_least_ms = N` | `0` | Keep the lock at least this long after it was taken, so a fast scheduled job does not run again elsewhere in the same period. |
/// | `hold_at_most_ms = N` | none | Never hold the lock longer than this after it was taken ([`LockOptions::hold_at_most`], ShedLock's `lockAtMostFor`): the watchdog does not renew it past this, and the lost-lock policy applies there, so a hung body cannot keep the lock forever. At least the ttl (a compile error for two literals). |
/// | `on_lost = "abort" \| "continue"` | `"abort"` | When the lock is lost mid-body: drop the body and return [`LockError::Lost`], or let it finish with a warning. |
/// | `read` | off | A shared lock ([`LockMode::Shared`]): any number of `read` callers of the key at once, none while a `write` (exclusive) caller holds it. Not with `fair` (a read lock cannot be fair yet: waiting writers are preferred over new readers) nor with `hold_at_least_ms`/`hold_at_least` (readers do not exclude each other, so there is nothing to hold others out of). |
/// | `write` | — | An exclusive lock ([`LockMode::Exclusive`]), which is also what neither flag gives, said explicitly: the other side of `read` on the same key. Not with `read`. |
/// | `keys = ["…", …]` | — | Instead of `key`: a set of key templates, each rendered as `key` is, held all or none ([`LockClient::run_all`]): taken in one canonical order (no deadlock between calls naming them in any order), duplicates once, losing any is losing the set. Not with `key`. |
/// | `permits = N` / `permits = EXPR` | 1 | A semaphore ([`LockOptions::permits`]): up to N callers of the key at once, each holding one permit (`lock_runtime::current().unwrap().permit()`). A literal is checked (1 to [`MAX_PERMITS`]); an expression is a `u32`. Not with `read`/`write`: a compile error. With `fair`, waiters get permits in the order they came. |
/// | `client = EXPR` | the default client | A [`LockClient`], `&LockClient` or `Arc<LockClient>`, from an expression over the parameters (`client = self.locks`, `client = state.locks`), evaluated once before the lock is taken. Without it, [`default_client()`], or [`LockError::NotConfigured`]. |
/// | `ttl = EXPR`, `wait = EXPR`, `hold_at_least = EXPR`, `hold_at_most = EXPR` | — | The same durations from code: any `Duration` expression (a `const`, a configuration value, a parameter), instead of the `_ms` form. Checked at run time ([`LockError::InvalidOptions`]). |
/// | `options = EXPR` | — | A whole [`LockOptions`] (or a reference to one), e.g. from configuration; no other option argument may be given with it. |
/// | `crate = "path"` | `::lock_runtime` | Where the runtime is, when it is re-exported under another name. |
///
/// The key is not a `format!` string: `{` and `}` are literal text, so `key = "order:{id}"` would
/// be the same key on every call. Where `{name}` names a parameter (or `self`), that is a compile
/// error that says to write `<name>`; other braces (`{}`, JSON-like `{"tenant":"eu"}`, a `{region}`
/// that names no parameter) stay literal text.
///
/// Mistakes are compile errors pointing at the token at fault: a fn that is not `async`, a
/// missing, unknown (the message lists the valid ones, and names the closest one to a misspelling:
/// `ttl_msec` gets "did you mean `ttl_ms`?") or repeated argument, `ttl_ms = 0`, a `_ms` duration
/// that is not an integer literal, a `ttl = …` that is not a `Duration`, two arguments for one
/// option (`ttl_ms` with `ttl`; `read` with `write`; `options` with any other), `read` with `fair`
/// or a minimum hold, an `on_lost` that is neither value, a placeholder that names no parameter
/// or field or is empty or unclosed, a `{name}` placeholder written `format!`-style, and a return
/// type that is not `Result<T, E>` (reported on the return type) or whose `E` has no
/// `From<LockError>` (reported on `E`: "add `impl From<lock_runtime::LockError> for E`").
///
/// # `#[async_trait]` (tonic services)
///
/// On a method of an `#[async_trait]` impl, `#[distributed_lock]` goes on the method as usual:
///
/// ```ignore
/// #[async_trait]
/// impl Orders for OrderService {
///     #[distributed_lock(key = "order:<id>", client = self.locks)]
///     async fn pay(&self, id: u64) -> Result<String, Status> { /* … */ }
/// }
/// ```
///
/// `#[async_trait]` sits on the impl, so it always expands first, whatever the order of the
/// method's own attributes: the lock attribute then sees a fn returning
/// `Pin<Box<dyn Future<Output = R> + Send>>` whose body is `Box::pin(async move { … })`, and
/// guards the method's body inside that block (the key, the client and the options are evaluated
/// there, with every parameter and pattern binding in scope, and `self` as usual). The same
/// boxed shape written by hand is guarded too. It stacks with `#[tracing::instrument]` in either
/// order, and the lock is taken inside the span.
///
/// # Examples
///
/// Each argument in use, on the in-memory backend:
///
/// ```
/// use std::sync::Arc;
/// use lock_runtime::{distributed_lock, LockClient, LockError};
///
/// struct Shop { locks: LockClient }
///
/// impl Shop {
///     /// `client = self.locks`, a field path in the key, a wait for the holder.
///     #[distributed_lock(key = "stock:<item.sku>", client = self.locks, wait_ms = 2000)]
///     async fn reserve(&self, item: &Item) -> Result<u32, LockError> {
///         Ok(item.count)
///     }
/// }
/// struct Item { sku: &'static str, count: u32 }
///
/// /// A fenced write: the token goes with the write to storage that rejects older ones.
/// #[distributed_lock(key = "ledger:<account>", client = locks, fencing, ttl_ms = 10000, watchdog)]
/// async fn post(locks: &LockClient, account: u32) -> Result<u64, LockError> {
///     Ok(lock_runtime::current().and_then(|l| l.fencing_token()).unwrap_or(0))
/// }
///
/// /// A read lock: readers of one key share it; a writer (`write`, or neither) has it alone.
/// #[distributed_lock(key = "prices:<region>", client = locks, read)]
/// async fn price(locks: &LockClient, region: &str) -> Result<u32, LockError> {
///     Ok(42)
/// }
///
/// /// A scheduled job that holds its lock for at least a minute, and is left to finish if the
/// /// lock is lost.
/// #[distributed_lock(key = "job:cleanup", client = locks, hold_at_least_ms = 60000, on_lost = "continue")]
/// async fn cleanup(locks: Arc<LockClient>) -> anyhow::Result<()> {
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> anyhow::Result<()> {
/// let locks = LockClient::in_memory();
/// let shop = Shop { locks: locks.clone() };
/// assert_eq!(shop.reserve(&Item { sku: "A-1", count: 3 }).await?, 3);
/// assert_eq!(post(&locks, 7).await?, 1);
/// assert_eq!(post(&locks, 7).await?, 2);
/// assert_eq!(price(&locks, "eu").await?, 42);
/// cleanup(Arc::new(locks.clone())).await?;
/// assert!(locks.is_locked("job:cleanup").await?, "held for the minimum hold");
///
/// // The default client serves fns without `client = …`.
/// lock_runtime::set_default_client(locks);
/// #[distributed_lock(key = "report:<day>")]
/// async fn report(day: u32) -> Result<u32, LockError> { Ok(day) }
/// assert_eq!(report(1).await?, 1);
/// # Ok(()) }
/// ```
#[cfg(feature = "macros")]
#[doc(inline)]
pub use lock_macros::distributed_lock;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
