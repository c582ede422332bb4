//! The etcd keys of one lock (see the module doc of [`super`]), and the comparisons on them.

use etcd_client::{Compare, CompareOp};

/// Between a lock's key and its helpers' names: a byte UTF-8 never has, so no other lock's key
/// (keys and prefixes are `str`) falls in a helper's range or looks like a helper, whatever
/// characters (`}` included) the keys have.
const SEP: u8 = 0xff;
const SHARES: &[u8] = b"r/";
const LINE: &[u8] = b"q/";
const CLAIMS: &[u8] = b"w/";
const FENCE: &[u8] = b"fence";

/// The keys of one lock.
#[derive(Debug)]
pub(super) struct Names {
    /// The holder's key (`<prefix>{<key>}`).
    pub(super) lock: String,
}

/// The end of the range of keys that start with `start` (which ends in `/`: `/` + 1 is `0`).
fn end_of(start: &[u8]) -> Vec<u8> {
    let mut end = start.to_vec();
    end.pop();
    end.push(b'0');
    end
}

impl Names {
    /// The keys of the lock whose holder's key is `lock`.
    pub(super) fn for_lock(lock: &str) -> Self {
        Names {
            lock: lock.to_owned(),
        }
    }

    fn under(&self, set: &[u8], token: &str) -> Vec<u8> {
        let mut name = Vec::with_capacity(self.lock.len() + 1 + set.len() + token.len());
        name.extend_from_slice(self.lock.as_bytes());
        name.push(SEP);
        name.extend_from_slice(set);
        name.extend_from_slice(token.as_bytes());
        name
    }

    /// The last fenced writer's mark: its mod revision is that writer's fencing token (written
    /// in the transaction that took the lock; kept, without a lease, as Redis keeps its counter).
    pub(super) fn fence(&self) -> Vec<u8> {
        self.under(FENCE, "")
    }

    /// A reader's share.
    pub(super) fn share(&self, token: &str) -> Vec<u8> {
        self.under(SHARES, token)
    }

    /// A fair waiter's place in line.
    pub(super) fn place(&self, token: &str) -> Vec<u8> {
        self.under(LINE, token)
    }

    /// A waiting writer's claim.
    pub(super) fn claim(&self, token: &str) -> Vec<u8> {
        self.under(CLAIMS, token)
    }

    pub(super) fn shares_start(&self) -> Vec<u8> {
        self.under(SHARES, "")
    }

    pub(super) fn shares_end(&self) -> Vec<u8> {
        end_of(&self.shares_start())
    }

    pub(super) fn line_start(&self) -> Vec<u8> {
        self.under(LINE, "")
    }

    pub(super) fn line_end(&self) -> Vec<u8> {
        end_of(&self.line_start())
    }

    fn claims_start(&self) -> Vec<u8> {
        self.under(CLAIMS, "")
    }

    /// Every key in the set has this create revision (none, for 0: an empty range compares as
    /// one key that does not exist).
    fn all_created(start: Vec<u8>, op: CompareOp, revision: i64) -> Compare {
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
        let rest = rest.strip_prefix(&[SEP])?;
        if let Some(token) = rest.strip_prefix(SHARES) {
            return Some(Part::Share(token));
        }
        if let Some(token) = rest.strip_prefix(LINE) {
            return Some(Part::Place(token));
        }
        if let Some(token) = rest.strip_prefix(CLAIMS) {
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
        let names = Names::for_lock("lock:{order:1}");
        assert_eq!(names.lock, "lock:{order:1}");
        assert_eq!(names.share("t"), b"lock:{order:1}\xffr/t");
        assert_eq!(names.place("t"), b"lock:{order:1}\xffq/t");
        assert_eq!(names.claim("t"), b"lock:{order:1}\xffw/t");
        assert_eq!(names.line_end(), b"lock:{order:1}\xffq0");
        assert_eq!(names.fence(), b"lock:{order:1}\xfffence");
        assert_eq!(names.classify(b"lock:{order:1}\xfffence"), None);
        assert_eq!(names.classify(b"lock:{order:1}"), Some(Part::Holder));
        assert_eq!(
            names.classify(b"lock:{order:1}\xffq/ab"),
            Some(Part::Place(b"ab"))
        );
        assert_eq!(
            names.classify(b"lock:{order:1}\xffr/ab"),
            Some(Part::Share(b"ab"))
        );
        assert_eq!(
            names.classify(b"lock:{order:1}\xffw/ab"),
            Some(Part::Claim(b"ab"))
        );
        // Other locks whose names start with this one's, whatever their keys hold.
        assert_eq!(names.classify(b"lock:{order:1}}"), None);
        assert_eq!(names.classify(b"lock:{order:1}:r/x}"), None);
        assert_eq!(names.classify(b"lock:{order:2}"), None);
    }

    #[test]
    fn no_lock_key_falls_in_another_locks_helper_ranges() {
        let a = Names::for_lock("lock:{a}");
        for key in ["a}:r/x", "a}\u{ff}r/x", "a}", "a}:q/x"] {
            let other = format!("lock:{{{key}}}");
            let other = other.as_bytes();
            for (start, end) in [(a.shares_start(), a.shares_end()), (a.line_start(), a.line_end())] {
                assert!(!(start.as_slice() <= other && other < end.as_slice()), "{key}");
            }
        }
    }
}
