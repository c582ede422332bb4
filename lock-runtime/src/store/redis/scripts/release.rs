//! The Rust half of `unlock.lua` (the common release) and `release.lua` (every other one): what
//! each call puts in `KEYS` and `ARGV`, what the answers mean, and what a release announces on
//! the lock's channel.

use std::borrow::Cow;

use super::super::keys;
use super::{Call, RELEASE, UNLOCK};
use crate::wakeups::HandedOver;

/// The common release: a lock that is neither fair nor kept for a minimum hold (`unlock.lua`).
#[derive(Debug)]
pub(crate) struct Unlock<'a> {
    /// The lock's key.
    pub(crate) lock: &'a str,
    pub(crate) token: &'a str,
    /// Told on the channel (this client's id: its own waiters are woken without it).
    pub(crate) announcement: &'a str,
    /// The release is announced only if a waiter marked the lock (not on a Cluster).
    pub(crate) marks: bool,
    /// Announce with `SPUBLISH` (a Cluster).
    pub(crate) sharded: bool,
}

impl Unlock<'_> {
    /// `KEYS`: the lock, and its waiting mark when the deployment marks. `ARGV`: token,
    /// announcement, and `1` on a Cluster.
    pub(crate) fn call(&self) -> Call {
        let lock = self.lock;
        let mut call = if self.marks {
            UNLOCK.call_with_helper(lock, keys::WAITING)
        } else {
            UNLOCK.call(&[lock])
        };
        call.arg(self.token).arg(self.announcement);
        if self.sharded {
            call.arg("1");
        }
        call
    }
}

/// Any release (`release.lua`): a fair one, one kept for a minimum hold, a read share, and what
/// `unlock.lua` could not decide.
#[derive(Debug)]
pub(crate) struct Release<'a> {
    /// The lock's key.
    pub(crate) lock: &'a str,
    pub(crate) token: &'a str,
    /// How long the lock must still be held (its minimum hold); 0 to delete it now.
    pub(crate) hold_ms: u64,
    pub(crate) announcement: &'a str,
    /// Hand the lock to the next in line, and name it.
    pub(crate) fair: bool,
    /// A semaphore's permit: a fair semaphore's release hands it to the head of its line.
    pub(crate) permit: bool,
    pub(crate) marks: bool,
    pub(crate) sharded: bool,
}

impl Release<'_> {
    /// `KEYS`: the lock; for a fair lock its line, places and counter; for a permit, its
    /// semaphore's line and places; then its waiting mark when the deployment marks. `ARGV`:
    /// token, hold, announcement, channel, and (only when one is on) fair (`1`, or `2` for a
    /// permit) and sharded.
    pub(crate) fn call(&self) -> Call {
        let lock = self.lock;
        let mut named = vec![Cow::Borrowed(lock)];
        if self.fair {
            named.extend([keys::queue(lock), keys::kept(lock), keys::fence(lock)].map(Cow::Owned));
        } else if self.permit {
            named.extend([keys::permits_queue(lock), keys::permits_kept(lock)].map(Cow::Owned));
        }
        if self.marks {
            named.push(Cow::Owned(keys::waiting(lock)));
        }
        let mut call = RELEASE.call(&named);
        call.arg(self.token)
            .arg(self.hold_ms)
            .arg(self.announcement)
            .arg(keys::channel(lock));
        if self.fair || self.permit || self.sharded {
            call.arg(match (self.fair, self.permit) {
                (true, _) => "1",
                (false, true) => "2",
                (false, false) => "0",
            });
        }
        if self.sharded {
            call.arg("1");
        }
        call
    }
}

/// What a release script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseAnswer {
    /// It had expired, or been taken by someone else.
    NotOurs,
    /// Given back (deleted, or kept for its minimum hold) and announced if anyone waits.
    Ours,
    /// Given back, but Redis refused the announcement (an ACL without rights on the channel):
    /// waiters elsewhere wake on their timers.
    Unannounced,
    /// A read share given back while other readers still share the lock: nothing announced,
    /// since nobody can enter because of it.
    ShareLeft,
    /// `unlock.lua` cannot decide (another type at the key, our token marked released):
    /// `release.lua` must.
    Undecided,
    /// A fair semaphore's permit handed over to the first waiter of its line, named on the
    /// channel (the waiter and what it was handed come with the answer).
    HandedOver,
}

/// The waiter a fair semaphore's release handed its permit to, and what it handed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Admitted {
    pub(crate) token: String,
    pub(crate) handed: HandedOver,
}

impl ReleaseAnswer {
    /// What `release.lua` answered: a number, or `{5, token, kept, permit}` naming the waiter a
    /// fair semaphore's release handed its permit to (until its place, kept until `kept`, would
    /// have lapsed).
    pub(crate) fn read(answer: &redis::Value) -> (ReleaseAnswer, Option<Admitted>) {
        match answer {
            redis::Value::Int(n) => (ReleaseAnswer::from_answer(*n), None),
            redis::Value::Array(items) => match items.as_slice() {
                [redis::Value::Int(5), redis::Value::BulkString(token), redis::Value::Int(kept), redis::Value::Int(permit)] =>
                {
                    let handed = HandedOver {
                        fence: 0,
                        kept: kept.unsigned_abs(),
                        permit: u32::try_from(*permit).ok(),
                    };
                    let admitted = String::from_utf8(token.clone())
                        .ok()
                        .map(|token| Admitted { token, handed });
                    (ReleaseAnswer::HandedOver, admitted)
                }
                _ => (ReleaseAnswer::Undecided, None),
            },
            _ => (ReleaseAnswer::Undecided, None),
        }
    }

    pub(crate) fn from_answer(answer: i64) -> ReleaseAnswer {
        match answer {
            1 => ReleaseAnswer::Ours,
            2 => ReleaseAnswer::Unannounced,
            3 => ReleaseAnswer::ShareLeft,
            -1 => ReleaseAnswer::Undecided,
            _ => ReleaseAnswer::NotOurs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_over_names_the_waiter_its_place_and_the_permit() {
        let int = redis::Value::Int;
        let answer = redis::Value::Array(vec![
            int(5),
            redis::Value::BulkString(b"t host:1".to_vec()),
            int(1_796_511_051_000),
            int(3),
        ]);
        let handed = HandedOver {
            fence: 0,
            kept: 1_796_511_051_000,
            permit: Some(3),
        };
        assert_eq!(
            ReleaseAnswer::read(&answer),
            (
                ReleaseAnswer::HandedOver,
                Some(Admitted {
                    token: "t host:1".to_owned(),
                    handed
                })
            )
        );
        assert_eq!(ReleaseAnswer::read(&int(1)), (ReleaseAnswer::Ours, None));
        assert_eq!(ReleaseAnswer::read(&int(0)), (ReleaseAnswer::NotOurs, None));
    }
}
