//! The Rust half of `permit.lua`: one attempt at a permit of a semaphore, whatever its count, in
//! one call. Its answer: `{1, fence, permit}` taken, `{0, ms, ahead}` refused (every permit
//! taken, or fair waiters ahead), `{2, count}` the key held with another count.

use std::borrow::Cow;

use super::super::keys;
use super::{flag, mark_at, Call, Caller, PERMIT};
use crate::options::{ceil_millis, FAIR_PLACE_KEPT};
use crate::store::Ask;
use crate::store::Attempt;

impl Caller<'_> {
    /// `permit.lua`: one attempt at any free permit. `KEYS`: the lock, its counter (with
    /// fencing), its mark (when the caller will wait and the deployment marks), its line and
    /// places (a fair semaphore, whose waiters are served in the order they came). `ARGV`:
    /// token, ttl, fencing, the count, where the mark is, where the line is, how long a place
    /// is kept, join (refused, a fair waiter takes or keeps its place in line).
    pub(crate) fn permit(&self, ask: &Ask) -> Call {
        let lock = self.lock;
        let mut named = self.fenced(ask.fencing);
        let mark = mark_at(&mut named, lock, ask.join && self.deployment.marks());
        let line = match ask.mode.fair() {
            true => {
                named.push(Cow::Owned(keys::permits_queue(lock)));
                named.push(Cow::Owned(keys::permits_kept(lock)));
                (named.len() - 1).to_string()
            }
            false => String::new(),
        };
        let mut call = PERMIT.call(&named);
        call.arg(self.token)
            .arg(ask.ttl_ms)
            .arg(flag(ask.fencing))
            .arg(ask.mode.permits())
            .arg(mark)
            .arg(line)
            .arg(ceil_millis(FAIR_PLACE_KEPT))
            .arg(flag(ask.join));
        call
    }
}

/// What `permit.lua` answered: the attempt, or the count the key is held with when it is not
/// the one asked for.
pub(crate) fn attempt(answer: &[i64], fencing: bool, permits: u32) -> Result<Attempt, u32> {
    let at = |i: usize| answer.get(i).copied().unwrap_or(-1);
    match at(0) {
        1 => Ok(Attempt::permit(
            fencing.then_some(at(1).unsigned_abs()),
            u32::try_from(at(2)).unwrap_or_default(),
        )),
        2 => Err(u32::try_from(at(1)).unwrap_or_default()),
        // A fair waiter's place, kept until `at(3)`, may be handed a permit.
        _ => Ok(Attempt::no_permit(
            u64::try_from(at(1)).ok(),
            u64::try_from(at(2)).unwrap_or(0),
            permits,
        )
        .kept(u64::try_from(at(3)).ok().filter(|&kept| kept > 0))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_read_as_permits_refusals_or_another_count() {
        assert_eq!(attempt(&[1, 9, 2], true, 2), Ok(Attempt::permit(Some(9), 2)));
        assert_eq!(attempt(&[1, 0, 0], false, 2), Ok(Attempt::permit(None, 0)));
        assert_eq!(attempt(&[2, 3], false, 2), Err(3));
        assert!(matches!(
            attempt(&[0, 450], false, 2),
            Ok(Attempt::Held {
                pttl_ms: Some(450),
                kept: None,
                ..
            })
        ));
        // A fair waiter's place, which a release may hand a permit.
        assert!(matches!(
            attempt(&[0, -2, 3, 1_796_511_051_000], false, 2),
            Ok(Attempt::Held {
                pttl_ms: None,
                behind: true,
                kept: Some(1_796_511_051_000),
                ..
            })
        ));
        assert!(matches!(
            attempt(&[0, 450, 0, 0], false, 2),
            Ok(Attempt::Held { kept: None, .. })
        ));
    }
}
