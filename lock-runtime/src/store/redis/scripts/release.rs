//! The Rust half of `unlock.lua` (the common release) and `release.lua` (every other one): what
//! each call puts in `KEYS` and `ARGV`, what the answers mean, and what a release announces on
//! the lock's channel.

use std::borrow::Cow;

use super::super::keys;
use super::{Call, Caller, RELEASE, UNLOCK};
use crate::store::Kind;
use crate::wakeups::HandedOver;

impl Caller<'_> {
    /// `unlock.lua`, the common release: a lock that is neither fair nor kept for a minimum
    /// hold. `KEYS`: the lock, and its waiting mark when the deployment marks. `ARGV`: token,
    /// `announcement` (told on the channel: this client's id, its own waiters are woken
    /// without it), and `1` on a Cluster.
    pub(crate) fn unlock(&self, announcement: &str) -> Call {
        let lock = self.lock;
        let mut call = if self.deployment.marks() {
            UNLOCK.call_with_helper(lock, keys::WAITING)
        } else {
            UNLOCK.call(&[lock])
        };
        call.arg(self.token).arg(announcement);
        if self.deployment.sharded() {
            call.arg("1");
        }
        call
    }

    /// `release.lua`, any release of a `kind` of lock: a fair one (handed to the next in
    /// line, named), a permit (a fair semaphore's is handed to the head of its line), one kept
    /// `hold_ms` more for its minimum hold (0: deleted now), a read share, and what
    /// [`unlock`](Self::unlock) could not decide. `KEYS`: the lock; for a fair lock its line,
    /// places and counter; for a permit, its semaphore's line and places; then its waiting
    /// mark when the deployment marks. `ARGV`: token, hold, announcement, channel, and (only
    /// when one is on) fair (`1`, or `2` for a permit) and sharded.
    pub(crate) fn release(&self, announcement: &str, hold_ms: u64, kind: Kind) -> Call {
        let lock = self.lock;
        let mut named = vec![Cow::Borrowed(lock)];
        match kind {
            Kind::Fair => {
                named.extend([keys::queue(lock), keys::kept(lock), keys::fence(lock)].map(Cow::Owned))
            }
            Kind::Permit => {
                named.extend([keys::permits_queue(lock), keys::permits_kept(lock)].map(Cow::Owned))
            }
            Kind::Plain | Kind::Shared => {}
        }
        if self.deployment.marks() {
            named.push(Cow::Owned(keys::waiting(lock)));
        }
        let mut call = RELEASE.call(&named);
        call.arg(self.token)
            .arg(hold_ms)
            .arg(announcement)
            .arg(keys::channel(lock));
        let sharded = self.deployment.sharded();
        if matches!(kind, Kind::Fair | Kind::Permit) || sharded {
            call.arg(match kind {
                Kind::Fair => "1",
                Kind::Permit => "2",
                Kind::Plain | Kind::Shared => "0",
            });
        }
        if sharded {
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
