//! The etcd keys of one lock (see the module doc of [`super`]), and the ranges that read them.

/// Between a lock's name and its keys: a byte UTF-8 never has, so no other lock's name (names
/// and prefixes are `str`) falls in one of this lock's ranges, whatever characters (`}`
/// included) the keys have.
const SEP: u8 = 0xff;
/// The line: every holder and waiter, `l` then `w/` (exclusive, or a writer) or `r/` (a
/// reader), then the token.
const LINE: u8 = b'l';
const WRITER: &[u8] = b"w/";
const READER: &[u8] = b"r/";
/// The last fenced writer's token, kept a while after its release for the readers after it.
const FENCE: &[u8] = b"fence";
/// A semaphore's permits: `p/<count>/<permit>` (both 4 digits), each held by one caller.
const PERMITS: &[u8] = b"p/";
/// A semaphore's waiters, in line by create revision: `q/` then the token.
const QUEUE: &[u8] = b"q/";

/// The keys of one lock.
#[derive(Debug, Clone)]
pub(super) struct Names {
    /// The lock's name (`<prefix>{<key>}`): every key of the lock starts with it and 0xff.
    lock: String,
}

/// The end of the range of keys that start with `start` (which ends in `/`: `/` + 1 is `0`).
fn end_of(start: &[u8]) -> Vec<u8> {
    let mut end = start.to_vec();
    end.pop();
    end.push(b'0');
    end
}

/// What a key of a lock is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part<'k> {
    /// A place in line of an exclusive holder or waiter (a writer), with its token.
    Writer(&'k [u8]),
    /// A reader's place in line, with its token.
    Reader(&'k [u8]),
    /// The last fenced writer's token.
    Fence,
    /// A semaphore's permit `permit` of `count`, held.
    Permit { count: u32, permit: u32 },
    /// A semaphore's waiter, with its token.
    Queued(&'k [u8]),
}

impl Names {
    /// The keys of the lock named `lock`.
    pub(super) fn for_lock(lock: &str) -> Self {
        Names {
            lock: lock.to_owned(),
        }
    }

    fn under(&self, parts: &[&[u8]]) -> Vec<u8> {
        let len = parts.iter().map(|p| p.len()).sum::<usize>();
        let mut name = Vec::with_capacity(self.lock.len() + 1 + len);
        name.extend_from_slice(self.lock.as_bytes());
        name.push(SEP);
        for part in parts {
            name.extend_from_slice(part);
        }
        name
    }

    /// The place in line of `token`: a writer's, or (`shared`) a reader's.
    pub(super) fn place(&self, token: &str, shared: bool) -> Vec<u8> {
        let kind = if shared { READER } else { WRITER };
        self.under(&[&[LINE], kind, token.as_bytes()])
    }

    /// The last fenced writer's token (its value, 20 decimal digits).
    pub(super) fn fence(&self) -> Vec<u8> {
        self.under(&[FENCE])
    }

    /// Permit `permit` of a semaphore of `count` permits.
    pub(super) fn permit(&self, count: u32, permit: u32) -> Vec<u8> {
        self.under(&[PERMITS, format!("{count:04}/{permit:04}").as_bytes()])
    }

    /// Every permit held, whatever the count: `[start, end)`.
    pub(super) fn permits(&self) -> (Vec<u8>, Vec<u8>) {
        let start = self.under(&[PERMITS]);
        let end = end_of(&start);
        (start, end)
    }

    /// The permits held of a semaphore of `count`: `[start, end)`.
    pub(super) fn permits_of(&self, count: u32) -> (Vec<u8>, Vec<u8>) {
        let start = self.under(&[PERMITS, format!("{count:04}/").as_bytes()]);
        let end = end_of(&start);
        (start, end)
    }

    /// The permits held of any count but `count`: the two ranges around
    /// [`permits_of`](Self::permits_of).
    pub(super) fn permits_not_of(&self, count: u32) -> [(Vec<u8>, Vec<u8>); 2] {
        let (all, all_end) = self.permits();
        let (mine, mine_end) = self.permits_of(count);
        [(all, mine), (mine_end, all_end)]
    }

    /// The semaphore waiter `token`'s place in its line.
    pub(super) fn queued(&self, token: &str) -> Vec<u8> {
        self.under(&[QUEUE, token.as_bytes()])
    }

    /// Every semaphore waiter's place: `[start, end)`.
    pub(super) fn queue(&self) -> (Vec<u8>, Vec<u8>) {
        let start = self.under(&[QUEUE]);
        let end = end_of(&start);
        (start, end)
    }

    /// Every place in line: `[start, end)`.
    pub(super) fn line(&self) -> (Vec<u8>, Vec<u8>) {
        (self.under(&[&[LINE]]), self.under(&[&[LINE + 1]]))
    }

    /// The writers' places: `[start, end)`.
    pub(super) fn writers(&self) -> (Vec<u8>, Vec<u8>) {
        let start = self.under(&[&[LINE], WRITER]);
        let end = end_of(&start);
        (start, end)
    }

    /// Every key of the lock: `[start, end)`.
    #[cfg(test)]
    fn all(&self) -> (Vec<u8>, Vec<u8>) {
        let start = self.under(&[]);
        let mut end = self.lock.as_bytes().to_vec();
        end.extend_from_slice(&[SEP, SEP]);
        (start, end)
    }

    /// What a key of this lock is (`None`: not one of its keys).
    pub(super) fn classify<'k>(&self, key: &'k [u8]) -> Option<Part<'k>> {
        let rest = key.strip_prefix(self.lock.as_bytes())?.strip_prefix(&[SEP])?;
        split(rest)
    }
}

/// What a key is, from what follows its lock's name and 0xff.
pub(super) fn split(rest: &[u8]) -> Option<Part<'_>> {
    if rest == FENCE {
        return Some(Part::Fence);
    }
    if let Some(waiter) = rest.strip_prefix(QUEUE) {
        return Some(Part::Queued(waiter));
    }
    if let Some(permit) = rest.strip_prefix(PERMITS) {
        let text = std::str::from_utf8(permit).ok()?;
        let (count, permit) = text.split_once('/')?;
        let digits =
            |d: &str| (d.len() == 4 && d.bytes().all(|b| b.is_ascii_digit())).then(|| d.parse().ok())?;
        return Some(Part::Permit {
            count: digits(count)?,
            permit: digits(permit)?,
        });
    }
    let place = rest.strip_prefix(&[LINE])?;
    if let Some(token) = place.strip_prefix(WRITER) {
        return Some(Part::Writer(token));
    }
    place.strip_prefix(READER).map(Part::Reader)
}

/// The value of a fence key: a token, as 20 decimal digits (so that etcd's byte-wise comparison
/// orders them as numbers).
pub(super) fn fence_value(token: i64) -> String {
    format!("{token:020}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_of_a_lock_and_their_ranges() {
        let names = Names::for_lock("lock:{order:1}");
        assert_eq!(names.place("t", false), b"lock:{order:1}\xfflw/t");
        assert_eq!(names.place("t", true), b"lock:{order:1}\xfflr/t");
        assert_eq!(names.fence(), b"lock:{order:1}\xfffence");
        let (start, end) = names.line();
        assert_eq!(
            (start.as_slice(), end.as_slice()),
            (&b"lock:{order:1}\xffl"[..], &b"lock:{order:1}\xffm"[..])
        );
        let (start, end) = names.writers();
        assert_eq!(
            (start.as_slice(), end.as_slice()),
            (&b"lock:{order:1}\xfflw/"[..], &b"lock:{order:1}\xfflw0"[..])
        );
        for key in [names.place("t", false), names.place("t", true)] {
            assert!(start_end(&names.line(), &key));
            assert!(start_end(&names.all(), &key));
        }
        assert!(!start_end(&names.writers(), &names.place("t", true)));
        assert!(start_end(&names.all(), &names.fence()));
        assert_eq!(names.classify(&names.fence()), Some(Part::Fence));
        assert_eq!(
            names.classify(b"lock:{order:1}\xfflw/ab"),
            Some(Part::Writer(b"ab"))
        );
        assert_eq!(
            names.classify(b"lock:{order:1}\xfflr/ab"),
            Some(Part::Reader(b"ab"))
        );
        let permit = names.permit(4, 2);
        assert_eq!(permit, b"lock:{order:1}\xffp/0004/0002");
        assert_eq!(
            names.classify(&permit),
            Some(Part::Permit { count: 4, permit: 2 })
        );
        assert!(start_end(&names.permits(), &permit) && start_end(&names.permits_of(4), &permit));
        assert!(!start_end(&names.permits_of(3), &permit) && !start_end(&names.line(), &permit));
        for range in names.permits_not_of(4) {
            assert!(!start_end(&range, &permit));
        }
        let [below, above] = names.permits_not_of(4);
        assert!(start_end(&below, &names.permit(3, 9)) && start_end(&above, &names.permit(5, 0)));
        let queued = names.queued("t");
        assert_eq!(names.classify(&queued), Some(Part::Queued(b"t")));
        assert!(start_end(&names.queue(), &queued) && !start_end(&names.line(), &queued));
        for key in [permit, queued] {
            assert!(start_end(&names.all(), &key));
        }
        // Other locks whose names start with this one's, whatever their keys hold.
        assert_eq!(names.classify(b"lock:{order:1}}"), None);
        assert_eq!(names.classify(b"lock:{order:1}:lw/x}"), None);
        assert_eq!(names.classify(b"lock:{order:2}\xfflw/x"), None);
        assert_eq!(fence_value(42), "00000000000000000042");
    }

    fn start_end((start, end): &(Vec<u8>, Vec<u8>), key: &[u8]) -> bool {
        start.as_slice() <= key && key < end.as_slice()
    }

    #[test]
    fn no_lock_key_falls_in_another_locks_ranges() {
        let a = Names::for_lock("lock:{a}");
        for key in ["a}:lw/x", "a}\u{ff}lw/x", "a}", "a}}", "a}\u{ff}\u{ff}"] {
            let other = Names::for_lock(&format!("lock:{{{key}}}"));
            for mine in [other.place("x", false), other.place("x", true), other.fence()] {
                assert!(!start_end(&a.all(), &mine), "{key}");
            }
        }
    }
}
