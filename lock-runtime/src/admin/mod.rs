//! Operators' tools over any store (the `cli` feature): list the locks under a client's prefix
//! with their holders, shares, remaining lease, fencing counter and waiters; show one; release
//! one whoever holds it, but only if it still holds what was seen (never a bare delete); and
//! watch acquisitions, releases, expiries and take-overs as they happen. The same on every
//! store, RedLock included; `lockctl` is a command line over this module.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lock_runtime::LockError> {
//! use lock_runtime::admin::{Admin, ForceReleased};
//!
//! let admin = Admin::new(lock_runtime::LockClient::builder().store("redis://127.0.0.1:6379").build_lazy()?);
//! for lock in admin.list("order:*").await? {
//!     println!("{} held by {:?} for {:?} more", lock.key, lock.holding, lock.remaining);
//! }
//! let stuck = admin.show("job:nightly").await?;
//! if stuck.is_held() && admin.force_release(&stuck).await? == ForceReleased::Changed {
//!     println!("job:nightly changed hands since it was read: left alone");
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use crate::{LockClient, LockError};

mod watch;

pub use crate::store::ForceReleased;
pub use crate::view::{Fence, Holding, LockView, Reader};
pub use watch::{Event, EventKind, HolderMode, Watch};

/// `url` as it may be shown to people: every credential replaced by `<credentials>` (the
/// user-info before the host, and `user`/`password` query parameters), as the library's own
/// messages and `Debug` show URLs.
///
/// ```
/// use lock_runtime::admin::hide_credentials;
/// assert_eq!(hide_credentials("redis://ops:s3cret@10.0.0.1:6379/0"), "redis://<credentials>@10.0.0.1:6379/0");
/// ```
pub fn hide_credentials(url: &str) -> String {
    crate::redact::hide_credentials(url)
}

/// What operators do on a client's store (under its prefix). Read-only but for
/// [`force_release`](Self::force_release); it takes no lock itself.
#[derive(Debug, Clone)]
pub struct Admin {
    client: LockClient,
}

impl Admin {
    /// Operators' tools on `client`'s store. A client built with
    /// [`build_lazy`](crate::LockClientBuilder::build_lazy) connects at the first request, and
    /// needs none of the rights that taking locks does.
    pub fn new(client: LockClient) -> Admin {
        Admin { client }
    }

    /// Which store it is ("redis", "RedLock", "PostgreSQL", "etcd", "in-memory").
    pub fn store(&self) -> &'static str {
        self.client.core().store.capabilities().name
    }

    /// The prefix the locks are under.
    pub fn prefix(&self) -> &str {
        self.client.prefix()
    }

    /// The locks held now whose keys match the glob `pattern` (`*`, `?`, `[abc]`; `*` for all),
    /// sorted by key.
    pub async fn list(&self, pattern: &str) -> Result<Vec<LockView>, LockError> {
        self.client.core().store.list(pattern).await
    }

    /// Everything about the lock on `key`, held or not.
    pub async fn show(&self, key: &str) -> Result<LockView, LockError> {
        let core = self.client.core();
        let lock = core.lock(key)?;
        core.store.inspect(&lock).await
    }

    /// Frees the lock `seen` shows whoever holds it, if it still holds that (the same holder, or
    /// for a read-write lock's readers, readers still), and wakes its waiters. The holder is not
    /// told: it finds out at its next renewal, or when its validity ends.
    pub async fn force_release(&self, seen: &LockView) -> Result<ForceReleased, LockError> {
        let core = self.client.core();
        let lock = core.lock(&seen.key)?;
        let forced = core.store.force_release(&lock, seen).await?;
        if forced == ForceReleased::Freed {
            core.wakeups.released(lock.name());
        }
        Ok(forced)
    }

    /// Watches the locks whose keys match `pattern`: a look every `every`, and one at once at a
    /// lock whose release the store announces (where it announces releases: Redis when someone
    /// waits, and on a Cluster always; PostgreSQL; etcd). The first look is made here.
    pub async fn watch(&self, pattern: &str, every: Duration) -> Result<Watch, LockError> {
        Watch::start(self.client.clone(), pattern, every).await
    }
}
