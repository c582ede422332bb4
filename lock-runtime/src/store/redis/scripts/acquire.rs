//! The Rust half of `acquire.lua` (an exclusive lock that is not fair) and `fair.lua` (a fair
//! one): what each call puts in `KEYS` and `ARGV`, and what its answer means.

use std::borrow::Cow;

use super::super::keys;
use super::{flag, mark_at, Call, Caller, ACQUIRE, FAIR};
use crate::options::ceil_millis;
use crate::store::{Ask, Attempt};
use crate::FAIR_PLACE_KEPT;

impl Caller<'_> {
    /// `acquire.lua`. `KEYS`: the lock, its counter (with fencing), then, when the caller will
    /// wait, the waiting writers and the waiting mark (not on a Cluster). `ARGV`: token, ttl,
    /// fencing, and, when it will wait, where the writers are, how long a claim is kept,
    /// whether it claimed before, and where the mark is. Refused by readers, a caller that
    /// will wait claims the writers' turn.
    pub(crate) fn exclusive(&self, ask: &Ask) -> Call {
        let lock = self.lock;
        let mut named = self.fenced(ask.fencing);
        let (mut writers, mut mark) = (String::new(), String::new());
        if ask.join {
            named.push(Cow::Owned(keys::writers(lock)));
            writers = named.len().to_string();
            mark = mark_at(&mut named, lock, self.deployment.marks());
        }
        let mut call = ACQUIRE.call(&named);
        call.arg(self.token).arg(ask.ttl_ms).arg(flag(ask.fencing));
        if ask.join {
            call.arg(writers)
                .arg(ceil_millis(FAIR_PLACE_KEPT))
                .arg(flag(ask.claimed))
                .arg(mark);
        }
        call
    }

    /// `fair.lua`. `KEYS`: the lock, its counter, the line, the places, and the waiting
    /// writers when the caller will wait. `ARGV`: token, ttl, fencing, how long a place is
    /// kept, join, the channel, sharded (`SPUBLISH` on a Cluster), and, when it will wait, how
    /// long a claim is kept and whether it claimed before. Refused, a caller that will wait
    /// takes (or keeps) a place in line, and, refused by readers, claims the writers' turn.
    pub(crate) fn fair(&self, ask: &Ask) -> Call {
        let lock = self.lock;
        let mut named = vec![
            Cow::Borrowed(lock),
            Cow::Owned(keys::fence(lock)),
            Cow::Owned(keys::queue(lock)),
            Cow::Owned(keys::kept(lock)),
        ];
        if ask.join {
            named.push(Cow::Owned(keys::writers(lock)));
        }
        let mut call = FAIR.call(&named);
        let kept = ceil_millis(FAIR_PLACE_KEPT);
        call.arg(self.token)
            .arg(ask.ttl_ms)
            .arg(flag(ask.fencing))
            .arg(kept)
            .arg(flag(ask.join))
            .arg(keys::channel(lock))
            .arg(flag(self.deployment.sharded()));
        if ask.join {
            call.arg(kept).arg(flag(ask.claimed));
        }
        call
    }
}

/// What an attempt's script answered (`acquire.lua`, `fair.lua`, `share.lua`), as an
/// [`Attempt`]: `{1, fence}` taken (fence 0 without fencing), or `{0, pttl, ahead, claimed,
/// kept}` refused, where the elements after `pttl` are there only when they say something.
pub(crate) fn attempt(answer: &[i64], fencing: bool) -> Attempt {
    let (taken, n) = (
        answer.first().copied().unwrap_or(0),
        answer.get(1).copied().unwrap_or(-1),
    );
    if taken == 1 {
        return Attempt::acquired(fencing.then_some(n.unsigned_abs()));
    }
    Attempt::Held {
        // -1: a foreign value without expiry; -2: free, but fair waiters come first.
        pttl_ms: u64::try_from(n).ok(),
        behind: answer.get(2).is_some_and(|&ahead| ahead > 0),
        claimed: answer.get(3) == Some(&1),
        kept: answer
            .get(4)
            .and_then(|&kept| u64::try_from(kept).ok())
            .filter(|&kept| kept > 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_read_as_attempts() {
        assert_eq!(attempt(&[1, 7], true), Attempt::acquired(Some(7)));
        assert_eq!(attempt(&[1, 0], false), Attempt::acquired(None));
        let held = |pttl_ms, behind, claimed, kept| Attempt::Held {
            pttl_ms,
            behind,
            claimed,
            kept,
        };
        assert_eq!(attempt(&[0, 900], false), held(Some(900), false, false, None));
        assert_eq!(attempt(&[0, -1], false), held(None, false, false, None));
        assert_eq!(
            attempt(&[0, 900, 0, 1], false),
            held(Some(900), false, true, None)
        );
        assert_eq!(
            attempt(&[0, -2, 2, 0, 55], true),
            held(None, true, false, Some(55))
        );
        assert_eq!(
            attempt(&[0, 10, 0, 0, 0], true),
            held(Some(10), false, false, None)
        );
    }
}
