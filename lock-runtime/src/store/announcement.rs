//! What a release announces to the waiters of other clients, in the same words on every store
//! that announces (Redis's scripts publish it on the lock's channel; PostgreSQL's functions send
//! it with `NOTIFY`): a fair release names the next waiter, or hands it the lock (or a permit,
//! on PostgreSQL); any other
//! release names the client that released (`c:<id>`), whose own waiters were woken without it.

use crate::wakeups::HandedOver;

/// What one message on a lock's channel says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Said<'a> {
    /// `w:<token>`: a fair release (or the attempt that found the waiters ahead gone) names
    /// whose turn it is.
    Turn(&'a [u8]),
    /// `g:<fence>:<kept>:<token>`: a fair release handed the lock to this waiter: the fencing
    /// token taken for it (0: none, the key has no counter), and the stamp of the place it was
    /// handed over for. `p:<fence>:<kept>:<permit>:<token>`: a permit's release handed that
    /// permit of its fair semaphore to this waiter.
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
    // A permit's hand-over says one number more before the token (which may hold colons).
    let (rest, numbers) = match said.strip_prefix(b"p:") {
        Some(rest) => (rest, 3),
        None => (said.strip_prefix(b"g:")?, 2),
    };
    let mut parts = rest.splitn(numbers + 1, |&b| b == b':');
    let mut number = || -> Option<u64> { std::str::from_utf8(parts.next()?).ok()?.parse().ok() };
    let (fence, kept) = (number()?, number()?);
    let permit = match numbers {
        3 => Some(u32::try_from(number()?).ok()?),
        _ => None,
    };
    Some((HandedOver { fence, kept, permit }, parts.next()?))
}

#[cfg(test)]
mod tests {
    use super::{handed_over, HandedOver, Said};

    #[test]
    fn a_hand_over_names_its_fencing_token_its_place_and_the_waiter() {
        let handed = |fence, kept| HandedOver {
            fence,
            kept,
            permit: None,
        };
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

    #[test]
    fn a_permits_hand_over_names_the_permit_too() {
        let permit = HandedOver {
            fence: 7,
            kept: 12,
            permit: Some(3),
        };
        assert_eq!(
            Said::parse(b"p:7:12:3:90725802f1b2 host:17636"),
            Said::HandedOver(permit, b"90725802f1b2 host:17636")
        );
        assert_eq!(handed_over(b"p:7:12:t"), None, "no permit said: not a hand-over");
        assert_eq!(handed_over(b"p:7:12:4294967296:t"), None, "no such permit");
    }
}
