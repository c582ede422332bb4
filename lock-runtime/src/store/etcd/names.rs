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
    #[cfg(test)]
    fn classify<'k>(&self, key: &'k [u8]) -> Option<Part<'k>> {
        let rest = key.strip_prefix(self.lock.as_bytes())?.strip_prefix(&[SEP])?;
        split(rest)
    }
}

/// What a key is, from what follows its lock's name and 0xff.
pub(super) fn split(rest: &[u8]) -> Option<Part<'_>> {
    if rest == FENCE {
        return Some(Part::Fence);
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
