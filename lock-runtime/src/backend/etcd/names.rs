//! The etcd keys of one lock (see the module doc of [`super`]), and the comparisons on them.

use etcd_client::{Compare, CompareOp};

use crate::backend::LockKeys;

const SHARES: &str = ":r/";
const LINE: &str = ":q/";
const CLAIMS: &str = ":w/";
const FENCE: &str = ":fence";

/// The keys of one lock.
#[derive(Debug)]
pub(super) struct Names {
    /// The holder's key (`<prefix>{<key>}`).
    pub(super) lock: String,
}

/// The end of the range of keys that start with `start` (which ends in `/`: `/` + 1 is `0`).
fn end_of(start: &str) -> String {
    let mut end = start.to_owned();
    end.pop();
    end.push('0');
    end
}

impl Names {
    pub(super) fn new(keys: &LockKeys) -> Self {
        Names::for_lock(keys.lock())
    }

    /// The keys of the lock whose holder's key is `lock`.
    pub(super) fn for_lock(lock: &str) -> Self {
        Names {
            lock: lock.to_owned(),
        }
    }

    fn under(&self, set: &str, token: &str) -> String {
        let mut name = String::with_capacity(self.lock.len() + set.len() + token.len());
        name.push_str(&self.lock);
        name.push_str(set);
        name.push_str(token);
        name
    }

    /// The last fenced writer's mark: its mod revision is that writer's fencing token (written
    /// in the transaction that took the lock; kept, without a lease, as Redis keeps its counter).
    pub(super) fn fence(&self) -> String {
        self.under(FENCE, "")
    }

    /// A reader's share.
    pub(super) fn share(&self, token: &str) -> String {
        self.under(SHARES, token)
    }

    /// A fair waiter's place in line.
    pub(super) fn place(&self, token: &str) -> String {
        self.under(LINE, token)
    }

    /// A waiting writer's claim.
    pub(super) fn claim(&self, token: &str) -> String {
        self.under(CLAIMS, token)
    }

    pub(super) fn shares_start(&self) -> String {
        self.under(SHARES, "")
    }

    pub(super) fn shares_end(&self) -> String {
        end_of(&self.shares_start())
    }

    pub(super) fn line_start(&self) -> String {
        self.under(LINE, "")
    }

    pub(super) fn line_end(&self) -> String {
        end_of(&self.line_start())
    }

    fn claims_start(&self) -> String {
        self.under(CLAIMS, "")
    }

    /// Every key in the set has this create revision (none, for 0: an empty range compares as
    /// one key that does not exist).
    fn all_created(start: String, op: CompareOp, revision: i64) -> Compare {
        let end = end_of(&start);
        Compare::create_revision(start, op, revision).with_range(end)
    }

    pub(super) fn no_shares(&self) -> Compare {
        Names::all_created(self.shares_start(), CompareOp::Equal, 0)
    }

    pub(super) fn some_shares(&self) -> Compare {
        Names::all_created(self.shares_start(), CompareOp::Greater, 0)
    }

    pub(super) fn no_claims(&self) -> Compare {
        Names::all_created(self.claims_start(), CompareOp::Equal, 0)
    }

    /// Nobody is in line before the waiter whose place has this create revision (nobody is in
    /// line, for a waiter without one).
    pub(super) fn first_in_line(&self, place: Option<i64>) -> Compare {
        match place {
            Some(place) => Names::all_created(self.line_start(), CompareOp::Greater, place - 1),
            None => Names::all_created(self.line_start(), CompareOp::Equal, 0),
        }
    }

    /// What a key under this lock is.
    pub(super) fn classify<'k>(&self, key: &'k [u8]) -> Option<Part<'k>> {
        let rest = key.strip_prefix(self.lock.as_bytes())?;
        if rest.is_empty() {
            return Some(Part::Holder);
        }
        if let Some(token) = rest.strip_prefix(SHARES.as_bytes()) {
            return Some(Part::Share(token));
        }
        if let Some(token) = rest.strip_prefix(LINE.as_bytes()) {
            return Some(Part::Place(token));
        }
        if let Some(token) = rest.strip_prefix(CLAIMS.as_bytes()) {
            return Some(Part::Claim(token));
        }
        None
    }
}

/// A key under a lock, as [`Names::classify`] tells it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Part<'k> {
    Holder,
    Share(&'k [u8]),
    Place(&'k [u8]),
    Claim(&'k [u8]),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_of_a_lock_and_their_ranges() {
        let names = Names::new(&LockKeys::new("lock:", "order:1"));
        assert_eq!(names.lock, "lock:{order:1}");
        assert_eq!(names.share("t"), "lock:{order:1}:r/t");
        assert_eq!(names.place("t"), "lock:{order:1}:q/t");
        assert_eq!(names.claim("t"), "lock:{order:1}:w/t");
        assert_eq!(names.line_end(), "lock:{order:1}:q0");
        assert_eq!(names.fence(), "lock:{order:1}:fence");
        assert_eq!(names.classify(b"lock:{order:1}:fence"), None);
        assert_eq!(names.classify(b"lock:{order:1}"), Some(Part::Holder));
        assert_eq!(names.classify(b"lock:{order:1}:q/ab"), Some(Part::Place(b"ab")));
        assert_eq!(names.classify(b"lock:{order:1}:r/ab"), Some(Part::Share(b"ab")));
        assert_eq!(names.classify(b"lock:{order:1}:w/ab"), Some(Part::Claim(b"ab")));
        // Another lock whose name starts with this one's.
        assert_eq!(names.classify(b"lock:{order:1}}"), None);
        assert_eq!(names.classify(b"lock:{order:2}"), None);
    }
}
