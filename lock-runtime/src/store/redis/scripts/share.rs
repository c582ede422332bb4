//! The Rust half of `share.lua`: one attempt at a share of a read-write lock. Its answer reads
//! as an exclusive attempt's ([`acquire::attempt`](super::acquire::attempt)): `{1, fence}` or
//! `{0, ms}`.

use std::borrow::Cow;

use super::super::keys;
use super::{flag, mark_at, Call, Caller, SHARE};
use crate::store::Ask;

impl Caller<'_> {
    /// `share.lua`: one attempt at a read share. `KEYS`: the lock, the waiting writers, the
    /// counter (with fencing: a share reads the last writer's token), the mark (when the caller
    /// will wait and the deployment marks). `ARGV`: token, ttl, fencing, where the mark is.
    pub(crate) fn share(&self, ask: &Ask) -> Call {
        let lock = self.lock;
        let mut named = vec![Cow::Borrowed(lock), Cow::Owned(keys::writers(lock))];
        if ask.fencing {
            named.push(Cow::Owned(keys::fence(lock)));
        }
        let mark = mark_at(&mut named, lock, ask.join && self.deployment.marks());
        let mut call = SHARE.call(&named);
        call.arg(self.token)
            .arg(ask.ttl_ms)
            .arg(flag(ask.fencing))
            .arg(mark);
        call
    }
}
