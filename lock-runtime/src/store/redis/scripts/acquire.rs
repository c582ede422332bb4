//! The Rust half of `acquire.lua` (an exclusive lock that is not fair) and `fair.lua` (a fair
//! one): what each call puts in `KEYS` and `ARGV`, and what its answer means.

use std::borrow::Cow;

use super::super::keys;
use super::{mark_at, Call, ACQUIRE, FAIR};
use crate::options::ceil_millis;
use crate::store::Attempt;
use crate::FAIR_PLACE_KEPT;

/// `1`/`0`, as the scripts take flags.
fn flag(on: bool) -> &'static str {
    if on {
        "1"
    } else {
        "0"
    }
}

/// One attempt at an exclusive lock that is not fair (`acquire.lua`).
#[derive(Debug)]
pub(crate) struct Exclusive<'a> {
    /// The lock's key.
    pub(crate) lock: &'a str,
    pub(crate) token: &'a str,
    pub(crate) ttl_ms: u64,
    pub(crate) fencing: bool,
    /// The caller will wait: refused by readers, it claims the writers' turn.
    pub(crate) join: bool,
    /// With `join`: a refusal marks the lock as waited for (not on a Cluster).
    pub(crate) marks: bool,
    /// An earlier attempt of this call claimed the writers' turn.
    pub(crate) claimed: bool,
}

impl Exclusive<'_> {
    /// `KEYS`: the lock, its counter (with fencing), then, when the caller will wait, the
    /// waiting writers and the waiting mark. `ARGV`: token, ttl, fencing, and, when it will
    /// wait, where the writers are, how long a claim is kept, whether it claimed before, and
    /// where the mark is.
    pub(crate) fn call(&self) -> Call {
        let lock = self.lock;
        let mut named = vec![Cow::Borrowed(lock)];
        if self.fencing {
            named.push(Cow::Owned(keys::fence(lock)));
        }
        let (mut writers, mut mark) = (String::new(), String::new());
        if self.join {
            named.push(Cow::Owned(keys::writers(lock)));
            writers = named.len().to_string();
            mark = mark_at(&mut named, lock, self.marks);
        }
        let mut call = ACQUIRE.call(&named);
        call.arg(self.token).arg(self.ttl_ms).arg(flag(self.fencing));
        if self.join {
            call.arg(writers)
                .arg(ceil_millis(FAIR_PLACE_KEPT))
                .arg(flag(self.claimed))
                .arg(mark);
        }
        call
    }
}

/// One attempt at a fair lock (`fair.lua`).
#[derive(Debug)]
pub(crate) struct Fair<'a> {
    /// The lock's key.
    pub(crate) lock: &'a str,
    pub(crate) token: &'a str,
    pub(crate) ttl_ms: u64,
    pub(crate) fencing: bool,
    /// The caller will wait: refused, it takes (or keeps) a place in line, and, refused by
    /// readers, claims the writers' turn.
    pub(crate) join: bool,
    /// An earlier attempt of this call claimed the writers' turn.
    pub(crate) claimed: bool,
    /// Announce with `SPUBLISH` (a Cluster).
    pub(crate) sharded: bool,
}

impl Fair<'_> {
    /// `KEYS`: the lock, its counter, the line, the places, and the waiting writers when the
    /// caller will wait. `ARGV`: token, ttl, fencing, how long a place is kept, join, the
    /// channel, sharded, and, when it will wait, how long a claim is kept and whether it claimed
    /// before.
    pub(crate) fn call(&self) -> Call {
        let lock = self.lock;
        let mut named = vec![
            Cow::Borrowed(lock),
            Cow::Owned(keys::fence(lock)),
            Cow::Owned(keys::queue(lock)),
            Cow::Owned(keys::kept(lock)),
        ];
        if self.join {
            named.push(Cow::Owned(keys::writers(lock)));
        }
        let mut call = FAIR.call(&named);
        let kept = ceil_millis(FAIR_PLACE_KEPT);
        call.arg(self.token)
            .arg(self.ttl_ms)
            .arg(flag(self.fencing))
            .arg(kept)
            .arg(flag(self.join))
            .arg(keys::channel(lock))
            .arg(flag(self.sharded));
        if self.join {
            call.arg(kept).arg(flag(self.claimed));
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
