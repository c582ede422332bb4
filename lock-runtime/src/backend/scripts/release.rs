//! The Rust half of `unlock.lua` (the common release) and `release.lua` (every other one): what
//! each call puts in `KEYS` and `ARGV`, what the answers mean, and what a release announces on
//! the lock's channel.

use std::borrow::Cow;

use super::{Call, RELEASE, UNLOCK};
use crate::backend::LockKeys;
use crate::wakeups::HandedOver;

/// The common release: a lock that is neither fair nor kept for a minimum hold (`unlock.lua`).
#[derive(Debug)]
pub(crate) struct Unlock<'a> {
    pub(crate) keys: &'a LockKeys,
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
        let keys = self.keys;
        let mut call = if self.marks {
            UNLOCK.call(&[keys.lock.as_str(), keys.waiting().as_str()])
        } else {
            UNLOCK.call(&[&keys.lock])
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
    pub(crate) keys: &'a LockKeys,
    pub(crate) token: &'a str,
    /// How long the lock must still be held (its minimum hold); 0 to delete it now.
    pub(crate) hold_ms: u64,
    pub(crate) announcement: &'a str,
    /// Hand the lock to the next in line, and name it.
    pub(crate) fair: bool,
    pub(crate) marks: bool,
    pub(crate) sharded: bool,
}

impl Release<'_> {
    /// `KEYS`: the lock; for a fair lock its line, places and counter; then its waiting mark
    /// when the deployment marks. `ARGV`: token, hold, announcement, channel, and (only when
    /// one is on) fair and sharded.
    pub(crate) fn call(&self) -> Call {
        let keys = self.keys;
        let mut named = vec![Cow::Borrowed(keys.lock.as_str())];
        if self.fair {
            named.extend([keys.queue(), keys.kept(), keys.fence()].map(Cow::Owned));
        }
        if self.marks {
            named.push(Cow::Owned(keys.waiting()));
        }
        let mut call = RELEASE.call(&named);
        call.arg(self.token)
            .arg(self.hold_ms)
            .arg(self.announcement)
            .arg(&keys.channel);
        if self.fair || self.sharded {
            call.arg(if self.fair { "1" } else { "0" });
        }
        if self.sharded {
            call.arg("1");
        }
        call
    }
}

/// What a release script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
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
}

impl Released {
    pub(crate) fn from_answer(answer: i64) -> Released {
        match answer {
            1 => Released::Ours,
            2 => Released::Unannounced,
            3 => Released::ShareLeft,
            -1 => Released::Undecided,
            _ => Released::NotOurs,
        }
    }
}

/// What one message on a lock's channel says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Said<'a> {
    /// `w:<token>`: a fair release (or the attempt that found the waiters ahead gone) names
    /// whose turn it is.
    Turn(&'a [u8]),
    /// `g:<fence>:<kept>:<token>`: a fair release handed the lock to this waiter: the fencing
    /// token taken for it (0: none, the key has no counter), and the stamp of the place it was
    /// handed over for.
    HandedOver(HandedOver, &'a [u8]),
    /// Anything else: the lock was released (by `unlock.lua`, `release.lua` or `lockctl`, whose
    /// announcement names the releasing client, `c:<id>`), or a claim was withdrawn.
    Released,
}

impl Said<'_> {
    pub(crate) fn parse(said: &[u8]) -> Said<'_> {
        if let Some(waiter) = said.strip_prefix(b"w:") {
            return Said::Turn(waiter);
        }
        match handed_over(said) {
            Some((handed, waiter)) => Said::HandedOver(handed, waiter),
            None => Said::Released,
        }
    }
}

fn handed_over(said: &[u8]) -> Option<(HandedOver, &[u8])> {
    let mut parts = said.strip_prefix(b"g:")?.splitn(3, |&b| b == b':');
    let mut number = || -> Option<u64> { std::str::from_utf8(parts.next()?).ok()?.parse().ok() };
    let (fence, kept) = (number()?, number()?);
    Some((HandedOver { fence, kept }, parts.next()?))
}

#[cfg(test)]
mod tests {
    use super::{handed_over, HandedOver, Said};

    #[test]
    fn a_hand_over_names_its_fencing_token_its_place_and_the_waiter() {
        let handed = |fence, kept| HandedOver { fence, kept };
        assert_eq!(
            handed_over(b"g:1796050340300403:1796050341:90725802f1b2 host:17636"),
            Some((
                handed(1_796_050_340_300_403, 1_796_050_341),
                &b"90725802f1b2 host:17636"[..]
            ))
        );
        assert_eq!(handed_over(b"g:0:12:t"), Some((handed(0, 12), &b"t"[..])));
        // Lua writes a large number it concatenates as 1.79e+15: not a hand-over (the waiter
        // is woken and asks).
        assert_eq!(handed_over(b"g:1.7960503291779e+15:12:t"), None);
        assert_eq!(handed_over(b"g:0:t"), None);
        assert_eq!(handed_over(b"w:t"), None);
        assert_eq!(handed_over(b"c:0123456789abcdef"), None);
        assert_eq!(Said::parse(b"w:t"), Said::Turn(b"t"));
        assert_eq!(Said::parse(b"g:0:12:t"), Said::HandedOver(handed(0, 12), b"t"));
        assert_eq!(Said::parse(b"c:0123456789abcdef"), Said::Released);
        assert_eq!(Said::parse(b"claim withdrawn"), Said::Released);
    }
}
