//! The Rust half of `share.lua`: one attempt at a share of a read-write lock. Its answer reads
//! as an exclusive attempt's ([`acquire::attempt`](super::acquire::attempt)): `{1, fence}` or
//! `{0, ms}`.

use std::borrow::Cow;

use super::super::keys;
use super::{mark_at, Call, SHARE};

/// One attempt at a read share.
#[derive(Debug)]
pub(crate) struct Share<'a> {
    /// The lock's key.
    pub(crate) lock: &'a str,
    pub(crate) token: &'a str,
    pub(crate) ttl_ms: u64,
    /// Read the last writer's token.
    pub(crate) fencing: bool,
    /// The caller will wait, and the deployment marks: a refusal marks the lock as waited for.
    pub(crate) marks: bool,
}

impl Share<'_> {
    /// `KEYS`: the lock, the waiting writers, the counter (with fencing), the mark (when it
    /// marks). `ARGV`: token, ttl, fencing, where the mark is.
    pub(crate) fn call(&self) -> Call {
        let lock = self.lock;
        let mut named = vec![Cow::Borrowed(lock), Cow::Owned(keys::writers(lock))];
        if self.fencing {
            named.push(Cow::Owned(keys::fence(lock)));
        }
        let mark = mark_at(&mut named, lock, self.marks);
        let mut call = SHARE.call(&named);
        call.arg(self.token)
            .arg(self.ttl_ms)
            .arg(if self.fencing { "1" } else { "0" })
            .arg(mark);
        call
    }
}
