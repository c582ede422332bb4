//! The names one lock owns in Redis: the one place that spells them, for the Redis store's
//! scripts' callers, its operators' reads (`lock_runtime::admin`), and tools of operators' own
//! (a dashboard, a cleanup job).
//!
//! For key `k` under prefix `p` (default `lock:`) every name starts with `p{k}`: the braces are
//! literal, so Redis Cluster keeps a lock and its helpers in one slot.
//!
//! | name | what | kept |
//! |---|---|---|
//! | `p{k}` | the lock: the holder's value (a string), or a read-write lock's readers (a hash) | the lease |
//! | `p{k}:fence` | the fencing counter | an hour after the last token |
//! | `p{k}:waiting` | the waiting mark: a waiter was refused, so the release announces itself | the holder's expiry + 1 s |
//! | `p{k}:queue` | fair waiters' tokens, by arrival | while someone asks |
//! | `p{k}:queue:kept` | fair waiters' tokens, by when their places lapse | as the line |
//! | `p{k}:writers` | writers waiting for readers to leave, by when their claims lapse | a claim's life |
//! | `p{k}:permits:queue` | a fair semaphore's waiters' tokens, by arrival | while someone asks |
//! | `p{k}:permits:queue:kept` | a fair semaphore's waiters' tokens, by when their places lapse | as its line |
//! | `p{k}:released` | the channel (not a key) a release is announced on | — |
//!
//! ```
//! use lock_runtime::redis::keys::LockKeys;
//!
//! let keys = LockKeys::new("lock:", "order:42");
//! assert_eq!(keys.lock(), "lock:{order:42}");
//! assert_eq!(keys.fence(), "lock:{order:42}:fence");
//! assert_eq!(keys.channel(), "lock:{order:42}:released");
//! assert_eq!(LockKeys::user_key("lock:", "lock:{order:42}:fence"), None);
//! assert_eq!(LockKeys::user_key("lock:", "lock:{order:42}"), Some("order:42"));
//! ```

pub use crate::{DEFAULT_PREFIX, MAX_KEY_LEN};

/// The suffix of the fencing counter.
const FENCE: &str = ":fence";
/// The suffix of the waiting mark.
pub(crate) const WAITING: &str = ":waiting";
/// The suffix of the fair line (by arrival).
const QUEUE: &str = ":queue";
/// The suffix of the fair places (by when they lapse).
const KEPT: &str = ":queue:kept";
/// The suffix of the waiting writers' claims.
const WRITERS: &str = ":writers";
/// The suffix of a fair semaphore's line (by arrival): its own, not a fair lock's, so that
/// neither's release meets the other's waiters.
const PERMITS_QUEUE: &str = ":permits:queue";
/// The suffix of a fair semaphore's places (by when they lapse).
const PERMITS_KEPT: &str = ":permits:queue:kept";
/// The suffix of the release channel.
const RELEASED: &str = ":released";

/// Every name one lock owns (see the [module](self) for the table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    lock: String,
}

impl LockKeys {
    /// The names of the lock on `key` under `prefix`.
    pub fn new(prefix: &str, key: &str) -> Self {
        LockKeys {
            lock: name(prefix, key),
        }
    }

    /// `p{k}`: the lock itself.
    pub fn lock(&self) -> &str {
        &self.lock
    }

    /// `p{k}:released`: the channel a release is announced on (`PUBLISH`; `SPUBLISH` on a
    /// Cluster).
    pub fn channel(&self) -> String {
        channel(&self.lock)
    }

    /// `p{k}:fence`: the fencing counter.
    pub fn fence(&self) -> String {
        fence(&self.lock)
    }

    /// `p{k}:waiting`: set by a refused attempt of a caller that will wait, so that the release
    /// announces itself; a release that finds no mark skips the `PUBLISH` (most releases: nobody
    /// waits). Not on a Redis Cluster, where a script naming a key that does not exist is
    /// refused while its slot migrates: there every release announces.
    pub fn waiting(&self) -> String {
        waiting(&self.lock)
    }

    /// `p{k}:queue`: fair waiters' tokens, in the order they arrived.
    pub fn queue(&self) -> String {
        queue(&self.lock)
    }

    /// `p{k}:queue:kept`: fair waiters' tokens, by when their places lapse.
    pub fn kept(&self) -> String {
        kept(&self.lock)
    }

    /// `p{k}:writers`: the tokens of writers waiting for a read-write lock's readers to leave,
    /// by when their claims lapse; no new reader enters while one stands.
    pub fn writers(&self) -> String {
        writers(&self.lock)
    }

    /// `p{k}:permits:queue`: a fair semaphore's waiters' tokens, in the order they arrived.
    pub fn permits_queue(&self) -> String {
        permits_queue(&self.lock)
    }

    /// `p{k}:permits:queue:kept`: a fair semaphore's waiters' tokens, by when their places
    /// lapse.
    pub fn permits_kept(&self) -> String {
        permits_kept(&self.lock)
    }

    /// Every helper key (not the lock, not the channel), in the order of the module's table.
    pub fn helpers(&self) -> [String; 7] {
        [
            self.fence(),
            self.waiting(),
            self.queue(),
            self.kept(),
            self.writers(),
            self.permits_queue(),
            self.permits_kept(),
        ]
    }

    /// The user's key of `name` when it is a lock key under `prefix` (`p{k}`, not a helper):
    /// how a tool that scans for `p{*}` tells locks from their helpers.
    pub fn user_key<'a>(prefix: &str, name: &'a str) -> Option<&'a str> {
        user_key(prefix, name)
    }

    /// The user's key of `channel` when it is a lock's release channel under `prefix`.
    pub fn user_key_of_channel<'a>(prefix: &str, channel: &'a str) -> Option<&'a str> {
        user_key(prefix, lock_of_channel(channel)?)
    }
}

pub(crate) use crate::store::{name, user_key};

/// The release channel of lock `lock`.
pub(crate) fn channel(lock: &str) -> String {
    helper(lock, RELEASED)
}

/// The lock whose releases `channel` announces.
pub(crate) fn lock_of_channel(channel: &str) -> Option<&str> {
    channel.strip_suffix(RELEASED)
}

pub(crate) fn fence(lock: &str) -> String {
    helper(lock, FENCE)
}

pub(crate) fn waiting(lock: &str) -> String {
    helper(lock, WAITING)
}

pub(crate) fn queue(lock: &str) -> String {
    helper(lock, QUEUE)
}

pub(crate) fn kept(lock: &str) -> String {
    helper(lock, KEPT)
}

pub(crate) fn writers(lock: &str) -> String {
    helper(lock, WRITERS)
}

pub(crate) fn permits_queue(lock: &str) -> String {
    helper(lock, PERMITS_QUEUE)
}

pub(crate) fn permits_kept(lock: &str) -> String {
    helper(lock, PERMITS_KEPT)
}

/// The three names `rights.lua` writes for a moment (a string, a sorted set and a hash), to
/// check a client's rights beside the locks it is about to take (under its prefix).
pub(crate) fn rights_probes(prefix: &str) -> [String; 3] {
    let probe = name(prefix, "rights-check");
    [":rights", ":rights:z", ":rights:h"].map(|suffix| helper(&probe, suffix))
}

fn helper(lock: &str, suffix: &str) -> String {
    let mut name = String::with_capacity(lock.len() + suffix.len());
    name.push_str(lock);
    name.push_str(suffix);
    name
}

#[cfg(test)]
mod tests {
    use super::LockKeys;

    /// `lock_runtime::keys`, the old path, still names the same module.
    #[test]
    #[allow(deprecated)]
    fn the_old_path_is_the_same_module() {
        let old = crate::keys::LockKeys::new("lock:", "order:42");
        assert_eq!(old.fence(), LockKeys::new("lock:", "order:42").fence());
    }

    #[test]
    fn the_names_are_the_documented_data_model() {
        let keys = LockKeys::new("lock:", "order:42");
        assert_eq!(keys.lock(), "lock:{order:42}");
        assert_eq!(keys.channel(), "lock:{order:42}:released");
        assert_eq!(
            keys.helpers(),
            [
                "lock:{order:42}:fence",
                "lock:{order:42}:waiting",
                "lock:{order:42}:queue",
                "lock:{order:42}:queue:kept",
                "lock:{order:42}:writers",
                "lock:{order:42}:permits:queue",
                "lock:{order:42}:permits:queue:kept",
            ]
        );
    }

    #[test]
    fn helpers_and_channels_are_told_from_locks() {
        let keys = LockKeys::new("p:", "a}b");
        assert_eq!(LockKeys::user_key("p:", keys.lock()), Some("a}b"));
        for helper in keys.helpers() {
            assert_eq!(LockKeys::user_key("p:", &helper), None, "{helper}");
        }
        assert_eq!(LockKeys::user_key("q:", keys.lock()), None);
        assert_eq!(LockKeys::user_key_of_channel("p:", &keys.channel()), Some("a}b"));
        assert_eq!(LockKeys::user_key_of_channel("p:", keys.lock()), None);
    }
}
