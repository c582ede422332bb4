//! The Rust half of `renew.lua`: many locks renewed in one call (of one slot, on a Cluster).

use super::{Call, RENEW};
use crate::backend::LockKeys;

/// `KEYS`: each lock; `ARGV`: each one's token and ttl, in turn.
pub(crate) fn call(locks: &[(&LockKeys, &str, u64)]) -> Call {
    let named: Vec<&str> = locks.iter().map(|(keys, _, _)| keys.lock.as_str()).collect();
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
