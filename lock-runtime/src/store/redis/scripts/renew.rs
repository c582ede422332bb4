//! The Rust half of `renew.lua`: many locks renewed in one call (of one slot, on a Cluster).

use super::{Call, RENEW};
use crate::store::Renewing;

/// `KEYS`: each lock; `ARGV`: each one's token and ttl, in turn.
pub(crate) fn call(locks: &[Renewing<'_>]) -> Call {
    let named: Vec<(&str, &str, u64)> = locks
        .iter()
        .map(|(lock, token, ttl_ms)| (lock.name(), *token, *ttl_ms))
        .collect();
    call_by_name(&named)
}

/// [`call`] for locks given by their keys.
pub(crate) fn call_by_name(locks: &[(&str, &str, u64)]) -> Call {
    let named: Vec<&str> = locks.iter().map(|(lock, _, _)| *lock).collect();
    let mut call = RENEW.call(&named);
    for (_, token, ttl_ms) in locks {
        call.arg(*token).arg(*ttl_ms);
    }
    call
}

/// The answer, per lock: 1 renewed (still ours), 0 gone or someone else's.
pub(crate) fn renewed(answer: i64) -> bool {
    answer == 1
}
