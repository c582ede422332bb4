//! The names one lock owns in Redis: the one place that spells them, for the library's scripts'
//! callers, `lockctl`, and tools of operators' own (a dashboard, a cleanup job).
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
//! | `p{k}:released` | the channel (not a key) a release is announced on | — |
//!
//! ```
//! use lock_runtime::keys::LockKeys;
//!
//! let keys = LockKeys::new("lock:", "order:42");
//! assert_eq!(keys.lock(), "lock:{order:42}");
//! assert_eq!(keys.fence(), "lock:{order:42}:fence");
//! assert_eq!(keys.channel(), "lock:{order:42}:released");
//! assert_eq!(LockKeys::user_key("lock:", "lock:{order:42}:fence"), None);
//! assert_eq!(LockKeys::user_key("lock:", "lock:{order:42}"), Some("order:42"));
//! ```

/// The longest key accepted, in bytes, before the prefix is added.
pub const MAX_KEY_LEN: usize = 1024;
/// The default key prefix: `order:42` is stored at `lock:{order:42}`.
pub const DEFAULT_PREFIX: &str = "lock:";

/// The suffix of the fencing counter.
const FENCE: &str = ":fence";
/// The suffix of the waiting mark.
const WAITING: &str = ":waiting";
/// The suffix of the fair line (by arrival).
const QUEUE: &str = ":queue";
/// The suffix of the fair places (by when they lapse).
const KEPT: &str = ":queue:kept";
/// The suffix of the waiting writers' claims.
const WRITERS: &str = ":writers";
/// The suffix of the release channel.
const RELEASED: &str = ":released";

/// Every name one lock owns (see the [module](self) for the table). Made once per acquire: the
/// lock key and its channel are kept, the helpers' names are made when a script needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    pub(crate) lock: String,
    pub(crate) channel: String,
}

impl LockKeys {
    /// The names of the lock on `key` under `prefix`.
    pub fn new(prefix: &str, key: &str) -> Self {
        // Sized once: these are made for every acquire.
        let mut lock = String::with_capacity(prefix.len() + key.len() + 2);
        lock.push_str(prefix);
        lock.push('{');
        lock.push_str(key);
        lock.push('}');
        let mut channel = String::with_capacity(lock.len() + RELEASED.len());
        channel.push_str(&lock);
        channel.push_str(RELEASED);
        LockKeys { lock, channel }
    }

    /// `p{k}`: the lock itself.
    pub fn lock(&self) -> &str {
        &self.lock
    }

    /// `p{k}:released`: the channel a release is announced on (`PUBLISH`; `SPUBLISH` on a
    /// Cluster).
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// `p{k}:fence`: the fencing counter.
    pub fn fence(&self) -> String {
        self.helper(FENCE)
    }

    /// `p{k}:waiting`: set by a refused attempt of a caller that will wait, so that the release
    /// announces itself; a release that finds no mark skips the `PUBLISH` (most releases: nobody
    /// waits). Not on a Redis Cluster, where a script naming a key that does not exist is
    /// refused while its slot migrates: there every release announces.
    pub fn waiting(&self) -> String {
        self.helper(WAITING)
    }

    /// `p{k}:queue`: fair waiters' tokens, in the order they arrived.
    pub fn queue(&self) -> String {
        self.helper(QUEUE)
    }

    /// `p{k}:queue:kept`: fair waiters' tokens, by when their places lapse.
    pub fn kept(&self) -> String {
        self.helper(KEPT)
    }

    /// `p{k}:writers`: the tokens of writers waiting for a read-write lock's readers to leave,
    /// by when their claims lapse; no new reader enters while one stands.
    pub fn writers(&self) -> String {
        self.helper(WRITERS)
    }

    /// Every helper key (not the lock, not the channel), in the order of the module's table.
    pub fn helpers(&self) -> [String; 5] {
        [
            self.fence(),
            self.waiting(),
            self.queue(),
            self.kept(),
            self.writers(),
        ]
    }

    /// The user's key of `name` when it is a lock key under `prefix` (`p{k}`, not a helper):
    /// how a tool that scans for `p{*}` tells locks from their helpers.
    pub fn user_key<'a>(prefix: &str, name: &'a str) -> Option<&'a str> {
        name.strip_prefix(prefix)?.strip_prefix('{')?.strip_suffix('}')
    }

    /// The user's key of `channel` when it is a lock's release channel under `prefix`.
    pub fn user_key_of_channel<'a>(prefix: &str, channel: &'a str) -> Option<&'a str> {
        LockKeys::user_key(prefix, channel.strip_suffix(RELEASED)?)
    }

    /// The three names `rights.lua` writes for a moment (a string, a sorted set and a hash),
    /// to check a client's rights beside a lock it is about to take.
    /// The lock key whose releases `channel` announces.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn lock_of_channel(channel: &str) -> Option<&str> {
        channel.strip_suffix(RELEASED)
    }

    pub(crate) fn rights_probes(&self) -> [String; 3] {
        [":rights", ":rights:z", ":rights:h"].map(|suffix| self.helper(suffix))
    }

    fn helper(&self, suffix: &str) -> String {
        let mut name = String::with_capacity(self.lock.len() + suffix.len());
        name.push_str(&self.lock);
        name.push_str(suffix);
        name
    }
}

#[cfg(test)]
mod tests {
    use super::LockKeys;

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
        assert_eq!(LockKeys::user_key_of_channel("p:", keys.channel()), Some("a}b"));
        assert_eq!(LockKeys::user_key_of_channel("p:", keys.lock()), None);
    }
}
