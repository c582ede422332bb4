//! The Rust half of `force.lua`: an operator's forced release of the lock as it was seen
//! ([`Store::force_release`](crate::store::Store::force_release)).

use super::super::keys;
use super::{Call, FORCE};
use crate::view::Holding;

/// Frees the lock at `lock` if it still holds what `seen` shows.
#[derive(Debug)]
pub(crate) struct Force<'a> {
    /// The lock's key.
    pub(crate) lock: &'a str,
    /// What was seen there.
    pub(crate) seen: &'a Holding,
    /// Announce with `SPUBLISH` (a Cluster).
    pub(crate) sharded: bool,
}

impl Force<'_> {
    /// `KEYS`: the lock and its waiting mark. `ARGV`: the type seen, the value seen (for a
    /// string; `read` for a readers' hash, `''` for anything foreign), the channel, sharded.
    pub(crate) fn call(&self) -> Call {
        let lock = self.lock;
        let mut call = FORCE.call(&[lock, keys::waiting(lock).as_str()]);
        let (kind, value) = match self.seen {
            Holding::Exclusive { value, .. } => ("string", value.as_str()),
            Holding::Shared { .. } => ("hash", "read"),
            Holding::Permits { .. } => ("hash", "permits"),
            Holding::Foreign { kind, .. } => (kind.as_str(), ""),
            Holding::Free => ("none", ""),
        };
        call.arg(kind)
            .arg(value)
            .arg(keys::channel(lock))
            .arg(if self.sharded { "1" } else { "0" });
        call
    }
}

/// What `force.lua` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forced {
    /// Freed, and announced.
    Freed,
    /// Already gone.
    Gone,
    /// It changed hands since it was seen.
    Changed,
}

impl Forced {
    pub(crate) fn from_answer(answer: i64) -> Forced {
        match answer {
            1 => Forced::Freed,
            0 => Forced::Gone,
            _ => Forced::Changed,
        }
    }
}
