//! What a store finds at one lock when it looks: who holds it (one holder, shared holders, or a
//! value this library did not write), how long its lease has left, its fencing counter and who
//! waits. Read for [`LockClient::holder`](crate::LockClient::holder) and
//! [`is_locked`](crate::LockClient::is_locked), and shown by operators' tools through
//! `lock_runtime::admin` (the `cli` feature), the same on every store.

use std::time::Duration;

use tokio::time::Instant;

/// One lock as a store found it, at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockView {
    /// The user's key, without the prefix.
    pub key: String,
    /// Where the store keeps it: the Redis key (`<prefix>{<key>}`), the etcd key or the
    /// PostgreSQL row's key.
    pub name: String,
    /// Who holds it.
    pub holding: Holding,
    /// How long its lease has left; `None` when it is free, or (a value this library did not
    /// write) has no expiry.
    pub remaining: Option<Duration>,
    /// Its fencing counter.
    pub fence: Fence,
    /// Fair waiters whose place in line has not lapsed.
    pub queued: u64,
    /// Writers waiting for a read-write lock's readers to leave.
    pub writers: u64,
    /// When the answer arrived, on this machine's monotonic clock.
    pub read_at: Instant,
}

/// Who holds a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Holding {
    /// Nobody: the lock is free.
    Free,
    /// One holder, whose value is `<uuid> <owner>`; `released`: given back and kept until its
    /// minimum hold ends (its value then ends in `:released`).
    Exclusive {
        /// The holder's value, as stored.
        value: String,
        /// The owner label in it.
        owner: String,
        /// Released, and kept for its minimum hold.
        released: bool,
    },
    /// The shared holders of a read-write lock whose shares have not expired.
    Shared {
        /// One per share, sorted by owner and value.
        readers: Vec<Reader>,
    },
    /// The holders of a semaphore's permits ([`LockOptions::permits`](crate::LockOptions::permits))
    /// whose leases have not ended: `permits` is the key's count, and each holder's
    /// [`Reader::permit`] names the permit it holds.
    Permits {
        /// How many permits the key has.
        permits: u32,
        /// One per permit taken, sorted by permit.
        holders: Vec<Reader>,
    },
    /// Something this library did not write: `kind` is what the store calls it (a Redis type),
    /// `value` a printable excerpt when it is text.
    Foreign {
        /// What it is.
        kind: String,
        /// At most 80 characters of it, control characters escaped.
        value: Option<String>,
    },
}

/// One shared holder of a read-write lock, or the holder of one permit of a semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reader {
    /// The permit it holds (`0..n`), for a semaphore's holder; `None` for a reader.
    pub permit: Option<u32>,
    /// Its value, `<uuid> <owner>`.
    pub value: String,
    /// The owner label in it.
    pub owner: String,
    /// How long its share has left.
    pub remaining: Duration,
}

/// A lock's fencing counter.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fence {
    /// No counter: no fenced acquire yet (or the store lost it).
    None,
    /// The last fencing token handed out.
    Token(u64),
    /// Something that is not a counter of ours.
    Other(String),
}

impl Fence {
    /// A store's counter as read (an etcd revision, a ZooKeeper zxid, a SQL column), `None`
    /// when there is none or it is negative (not one this library wrote).
    #[cfg_attr(
        not(any(
            feature = "etcd",
            feature = "zookeeper",
            feature = "postgres",
            feature = "mysql"
        )),
        allow(dead_code)
    )]
    pub(crate) fn counter(counter: Option<i64>) -> Fence {
        counter
            .and_then(|c| u64::try_from(c).ok())
            .map_or(Fence::None, Fence::Token)
    }
}

/// What a release kept for its minimum hold appends to its holder's value.
pub(crate) const RELEASED: &str = ":released";

impl LockView {
    /// `key` found free.
    pub(crate) fn free(key: &str, name: &str) -> LockView {
        LockView {
            key: key.to_owned(),
            name: name.to_owned(),
            holding: Holding::Free,
            remaining: None,
            fence: Fence::None,
            queued: 0,
            writers: 0,
            read_at: Instant::now(),
        }
    }

    /// Whether anyone (or anything) holds it.
    pub fn is_held(&self) -> bool {
        match &self.holding {
            Holding::Free => false,
            Holding::Permits { holders, .. } => !holders.is_empty(),
            _ => true,
        }
    }
}

impl Holding {
    /// A value found where one holder's value goes: one holder's, or foreign.
    pub(crate) fn of_value(value: &[u8]) -> Holding {
        let Ok(text) = std::str::from_utf8(value) else {
            return Holding::foreign_text(&String::from_utf8_lossy(value));
        };
        let (token, released) = match text.strip_suffix(RELEASED) {
            Some(token) => (token, true),
            None => (text, false),
        };
        match owner_of(token) {
            Some(owner) => Holding::Exclusive {
                value: text.to_owned(),
                owner: owner.to_owned(),
                released,
            },
            None => Holding::foreign_text(text),
        }
    }

    /// Text this library did not write.
    pub(crate) fn foreign_text(text: &str) -> Holding {
        Holding::Foreign {
            kind: "string".to_owned(),
            value: Some(excerpt(text)),
        }
    }

    /// Whether `value`, found held at the lock, is one this holding shows: the holder's, one
    /// reader's or one permit holder's value, or (what this library did not write) the same
    /// excerpt. A forced release frees only what its caller saw.
    #[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
    pub(crate) fn shows(&self, value: &str) -> bool {
        match self {
            Holding::Free => false,
            Holding::Exclusive { value: shown, .. } => shown == value,
            Holding::Shared { readers } | Holding::Permits { holders: readers, .. } => {
                readers.iter().any(|r| r.value == value)
            }
            Holding::Foreign { value: shown, .. } => shown.as_deref() == Some(excerpt(value).as_str()),
        }
    }

    /// The longest lease among shared holders or permit holders (`None` for other holdings,
    /// whose lease the store reads with the value).
    #[cfg_attr(
        not(any(feature = "etcd", feature = "postgres", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) fn longest_share(&self) -> Option<Duration> {
        match self {
            Holding::Shared { readers } | Holding::Permits { holders: readers, .. } => {
                readers.iter().map(|r| r.remaining).max()
            }
            _ => None,
        }
    }

    /// Shared holders, sorted by owner and value.
    pub(crate) fn shared(mut readers: Vec<Reader>) -> Holding {
        readers.sort_by(|a, b| (&a.owner, &a.value).cmp(&(&b.owner, &b.value)));
        Holding::Shared { readers }
    }

    /// The holders of `permits` permits, sorted by permit (each with one).
    pub(crate) fn permits(permits: u32, mut holders: Vec<Reader>) -> Holding {
        holders.sort_by_key(|h| h.permit);
        Holding::Permits { permits, holders }
    }
}

impl Reader {
    /// The holder of permit `permit` whose value is `value`, with `remaining` left.
    pub(crate) fn of_permit(value: &str, permit: u32, remaining: Duration) -> Reader {
        let token = value.strip_suffix(RELEASED).unwrap_or(value);
        Reader {
            permit: Some(permit),
            owner: owner_of(token).unwrap_or_default().to_owned(),
            ..Reader::of(value, remaining)
        }
    }

    /// A share whose value is `value`, with `remaining` left (its owner empty for a value this
    /// library did not write).
    pub(crate) fn of(value: &str, remaining: Duration) -> Reader {
        Reader {
            permit: None,
            owner: owner_of(value).unwrap_or_default().to_owned(),
            value: value.to_owned(),
            remaining,
        }
    }
}

/// The owner label of a holder's value `<32 hex digits> <owner>`.
pub(crate) fn owner_of(value: &str) -> Option<&str> {
    let (id, owner) = value.split_once(' ')?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) && !owner.is_empty()).then_some(owner)
}

/// At most 80 characters of `text`, control characters escaped, for a terminal.
pub(crate) fn excerpt(text: &str) -> String {
    const MAX: usize = 80;
    let mut shown: String = text.chars().take(MAX).flat_map(char::escape_debug).collect();
    if text.chars().nth(MAX).is_some() {
        shown.push('…');
    }
    shown
}

/// `text` with glob's special characters (`*`, `?`, `[`, `]`, `\`) escaped, to match it
/// literally.
pub(crate) fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Whether `key` matches the glob `pattern` (`*` any run, `?` one character, `[abc]` and
/// `[a-z]` one of a set, `\` escapes), as Redis's `SCAN MATCH` reads one: for stores that filter
/// their keys themselves.
pub(crate) fn glob_matches(pattern: &str, key: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let key: Vec<char> = key.chars().collect();
    glob_at(&pattern, &key)
}

fn glob_at(pattern: &[char], key: &[char]) -> bool {
    let Some((&first, rest)) = pattern.split_first() else {
        return key.is_empty();
    };
    match first {
        '*' => (0..=key.len()).any(|skip| glob_at(rest, &key[skip..])),
        '?' => !key.is_empty() && glob_at(rest, &key[1..]),
        '[' => {
            let Some((&c, key_rest)) = key.split_first() else {
                return false;
            };
            let Some(end) = rest.iter().position(|&p| p == ']') else {
                return c == '[' && glob_at(rest, key_rest);
            };
            let (set, after) = (&rest[..end], &rest[end + 1..]);
            let (negated, set) = match set.split_first() {
                Some(('^', set)) => (true, set),
                _ => (false, set),
            };
            let mut found = false;
            let mut i = 0;
            while i < set.len() {
                if i + 2 < set.len() && set[i + 1] == '-' {
                    found |= set[i] <= c && c <= set[i + 2];
                    i += 3;
                } else {
                    found |= set[i] == c;
                    i += 1;
                }
            }
            found != negated && glob_at(after, key_rest)
        }
        '\\' if !rest.is_empty() => key.first() == Some(&rest[0]) && glob_at(&rest[1..], &key[1..]),
        c => key.first() == Some(&c) && glob_at(rest, &key[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn values_are_read_as_holders_or_foreign() {
        let held = Holding::of_value(format!("{ID} billing-1").as_bytes());
        assert!(
            matches!(held, Holding::Exclusive { ref owner, released: false, .. } if owner == "billing-1")
        );
        let kept = Holding::of_value(format!("{ID} job runner 7:released").as_bytes());
        assert!(
            matches!(kept, Holding::Exclusive { ref owner, released: true, .. } if owner == "job runner 7")
        );
        assert!(
            matches!(Holding::of_value(b"hello\n"), Holding::Foreign { value: Some(ref v), .. } if v == "hello\\n")
        );
        assert!(matches!(
            Holding::of_value(b"nothex billing-1"),
            Holding::Foreign { .. }
        ));
    }

    #[test]
    fn a_holding_shows_only_the_values_it_was_read_with() {
        let one = format!("{ID} billing-1");
        let other = format!("{ID} billing-2");
        let held = Holding::of_value(one.as_bytes());
        assert!(held.shows(&one) && !held.shows(&other));
        let second = Duration::from_secs(1);
        let permits = Holding::permits(3, vec![Reader::of_permit(&other, 2, second)]);
        assert!(permits.shows(&other) && !permits.shows(&one));
        let readers = Holding::shared(vec![Reader::of(&one, second), Reader::of(&other, second)]);
        assert!(readers.shows(&one) && readers.shows(&other));
        let foreign = Holding::of_value(b"hello\n");
        assert!(foreign.shows("hello\n") && !foreign.shows("hello"));
        assert!(!Holding::Free.shows(&one));
    }

    #[test]
    fn shares_lease_the_longest_and_counters_read_as_fences() {
        let (short, long) = (Duration::from_millis(5), Duration::from_millis(900));
        let readers = Holding::shared(vec![Reader::of("a", long), Reader::of("b", short)]);
        assert_eq!(readers.longest_share(), Some(long));
        let none_held = Holding::permits(4, Vec::new());
        assert_eq!(none_held.longest_share(), None);
        assert_eq!(Holding::of_value(ID.as_bytes()).longest_share(), None);
        assert_eq!(Fence::counter(Some(17)), Fence::Token(17));
        assert_eq!(Fence::counter(Some(-1)), Fence::None);
        assert_eq!(Fence::counter(None), Fence::None);
    }

    #[test]
    fn globs_match_as_redis_scan_does() {
        for (pattern, key, matches) in [
            ("*", "order:5", true),
            ("order:*", "order:5", true),
            ("order:*", "invoice:1", false),
            ("invoice:?", "invoice:1", true),
            ("invoice:?", "invoice:12", false),
            ("o[rx]der:5", "order:5", true),
            ("order:[0-4]", "order:5", false),
            ("order:[^0-4]", "order:5", true),
            ("a\\*b", "a*b", true),
            ("a\\*b", "axb", false),
            ("", "", true),
        ] {
            assert_eq!(glob_matches(pattern, key), matches, "{pattern} {key}");
        }
    }
}
