//! ZooKeeper paths: the parent node of a lock (the prefix, then the key as a node name) and the
//! names of its children, laid out as Apache Curator lays them, so that a Curator service and
//! ours meet on the same nodes:
//!
//! - `_c_<uuid>-lock-<seq>`: an exclusive holder or waiter (Curator's `InterProcessMutex`);
//! - `_c_<uuid>-__READ__<seq>`: a reader (Curator's `InterProcessReadWriteLock` read lock);
//! - `_c_<uuid>-__WRIT__<seq>`: Curator's write lock (we never create one, but it excludes).
//!
//! `<seq>` is the 10 digits ZooKeeper appends to a sequential node: one counter per parent,
//! shared by every kind, so sorting by it is the order of arrival. `_c_<uuid>-` is Curator's
//! "protection": a caller finds its own node by its uuid when the answer to its create was lost.
//!
//! One node is not sequential: Curator 5.5 and later (CURATOR-621) downgrades a write lock by
//! creating its holder's read node as a plain ephemeral node named with the write node's
//! sequence, `_c_<uuid>-__READ__<the writer's seq>`, so that it stands where the writer stands
//! (then the write node is deleted, and the read lock holds on). Two nodes then share a
//! sequence: the writer sorts first, and the reader after it is a reader like any other (it
//! holds, and excludes writers behind it, once the write node is gone).

use std::fmt::Write;

/// The mutex's lock name (what follows the protection and precedes the sequence).
const MUTEX: &str = "lock-";
/// The read-write lock's names.
const READ: &str = "__READ__";
const WRITE: &str = "__WRIT__";
/// Curator's protection: `_c_` then a uuid (36 characters with hyphens) then `-`.
const PROTECTED: &str = "_c_";
/// A semaphore's claim of a permit: `_c_<uuid>-permit-<count>-<permit>-<seq>` (count and permit
/// 4 digits each). Not one of Curator's lock names: no Curator recipe sees it.
const PERMIT: &str = "-permit-";
/// A semaphore's waiter: `_c_<uuid>-queue-<seq>`.
const QUEUE: &str = "-queue-";

/// The parent path of every lock, from the client's prefix: `lock:` (the library's default
/// prefix, meant for Redis) is `/locks`; any other prefix must be an absolute path outside
/// ZooKeeper's own `/zookeeper` tree (its quotas and configuration live there).
pub(super) fn parent_path(prefix: &str) -> Result<String, String> {
    if prefix == crate::DEFAULT_PREFIX {
        return Ok("/locks".to_owned());
    }
    let trimmed = prefix.trim_end_matches('/');
    let valid = trimmed.starts_with('/')
        && trimmed[1..].split('/').all(|part| {
            !part.is_empty() && part != "." && part != ".." && part.chars().all(|c| !c.is_control())
        });
    if !valid || trimmed.is_empty() {
        return Err(format!(
            "on ZooKeeper the prefix is the parent path of every lock, an absolute path other \
             than / without empty, . or .. parts (e.g. /locks/billing); got {prefix:?}"
        ));
    }
    if trimmed.split('/').nth(1) == Some("zookeeper") {
        return Err(format!(
            "on ZooKeeper the prefix may not be in /zookeeper, the tree the servers keep for \
             themselves (quotas, configuration): choose another parent path (e.g. /locks); got \
             {prefix:?}"
        ));
    }
    Ok(trimmed.to_owned())
}

/// Whether `key` is a node name as written: letters, digits, `-`, `_`, `:` and `.`, and not
/// `.` or `..`.
fn is_plain(key: &str) -> bool {
    key != "."
        && key != ".."
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':' | b'.'))
}

/// The node name of a key: the key as written when it is [plain](is_plain), else `%` and the
/// key with every other byte written `%XX`. A plain key never holds a `%`, so no escaped key
/// meets a plain one, and escaping is one-to-one.
pub(super) fn node_name(key: &str) -> String {
    if is_plain(key) {
        return key.to_owned();
    }
    let mut name = String::with_capacity(key.len() * 3 + 1);
    name.push('%');
    for byte in key.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b':' | b'.') {
            name.push(char::from(byte));
        } else {
            let _ = write!(name, "%{byte:02X}");
        }
    }
    name
}

/// The key a node name stands for (`None`: not a name [`node_name`] makes).
pub(super) fn key_of(name: &str) -> Option<String> {
    let Some(escaped) = name.strip_prefix('%') else {
        return is_plain(name).then(|| name.to_owned());
    };
    let bytes = escaped.as_bytes();
    let mut key = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = std::str::from_utf8(bytes.get(at + 1..at + 3)?).ok()?;
            key.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            key.push(bytes[at]);
            at += 1;
        }
    }
    // Only the one name `node_name` makes of it (`%zz` is not: `zz` is written plain).
    String::from_utf8(key).ok().filter(|key| node_name(key) == name)
}

/// The lock's parent node: `<parent>/<node name of key>`.
pub(super) fn lock_path(parent: &str, key: &str) -> String {
    let name = node_name(key);
    let mut path = String::with_capacity(parent.len() + 1 + name.len());
    path.push_str(parent);
    path.push('/');
    path.push_str(&name);
    path
}

/// The uuid a token (`<32 hex digits> <owner>`) is known by in node names: its hex digits,
/// hyphenated as Curator writes a `java.util.UUID`.
pub(super) fn uuid_of(token: &str) -> String {
    let id = token.split_once(' ').map_or(token, |(id, _)| id);
    match uuid::Uuid::try_parse(id) {
        Ok(uuid) => uuid.hyphenated().to_string(),
        Err(_) => id.to_owned(),
    }
}

/// What a caller creates (ZooKeeper appends the sequence): `<lock path>/_c_<uuid>-lock-`, or
/// `…-__READ__` for a reader.
pub(super) fn node_prefix(lock: &str, uuid: &str, shared: bool) -> String {
    let kind = if shared { READ } else { MUTEX };
    format!("{lock}/{PROTECTED}{uuid}-{kind}")
}

/// Whether `name` is what a create of `prefix` (a node's name before its sequence) made: the
/// prefix and ZooKeeper's ten digits, nothing else.
pub(super) fn made_by(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|seq| seq.len() == 10 && seq.bytes().all(|b| b.is_ascii_digit()))
}

/// What a semaphore's caller creates to claim `permit` of `count` (ZooKeeper appends the
/// sequence): `<lock path>/_c_<uuid>-permit-<count>-<permit>-`.
pub(super) fn claim_prefix(lock: &str, uuid: &str, count: u32, permit: u32) -> String {
    format!("{lock}/{PROTECTED}{uuid}{PERMIT}{count:04}-{permit:04}-")
}

/// What a semaphore's waiter creates to queue: `<lock path>/_c_<uuid>-queue-`.
pub(super) fn queue_prefix(lock: &str, uuid: &str) -> String {
    format!("{lock}/{PROTECTED}{uuid}{QUEUE}")
}

/// One claim of a semaphore's permit, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Claim {
    /// Its name.
    pub(super) name: String,
    /// The semaphore's count it was made for.
    pub(super) count: u32,
    /// The permit it claims.
    pub(super) permit: u32,
    /// Its sequence number: of two claims of one permit, the older holds it.
    pub(super) seq: i64,
}

/// A claim's count, permit and sequence, when `name` is one.
pub(super) fn parse_claim(name: &str) -> Option<Claim> {
    let at = name.rfind(PERMIT)?;
    let mut parts = name[at + PERMIT.len()..].split('-');
    let mut number = |width: Option<usize>| {
        let part = parts.next()?;
        let fits = width.is_none_or(|w| part.len() == w) && !part.is_empty();
        (fits && part.bytes().all(|b| b.is_ascii_digit())).then(|| part.parse::<i64>().ok())?
    };
    let (count, permit, seq) = (number(Some(4))?, number(Some(4))?, number(None)?);
    if parts.next().is_some() {
        return None;
    }
    Some(Claim {
        name: name.to_owned(),
        count: u32::try_from(count).ok()?,
        permit: u32::try_from(permit).ok()?,
        seq,
    })
}

/// A waiter's queue node's sequence, when `name` is one.
pub(super) fn parse_queued(name: &str) -> Option<i64> {
    let at = name.rfind(QUEUE)?;
    let digits = &name[at + QUEUE.len()..];
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok())?
}

/// A semaphore's nodes among a lock's children: the claims that hold a permit (of each permit,
/// the oldest claim), sorted by permit, and the queue's nodes in order (name, sequence).
#[derive(Debug, Default)]
pub(super) struct Permits {
    pub(super) holding: Vec<Claim>,
    /// Claims that hold nothing: a newer claim of a held permit (its maker gives it up).
    pub(super) losing: Vec<Claim>,
    pub(super) queue: Vec<(String, i64)>,
}

impl Permits {
    pub(super) fn of(names: &[String]) -> Permits {
        let mut claims: Vec<Claim> = names.iter().filter_map(|n| parse_claim(n)).collect();
        claims.sort_by_key(|c| (c.count, c.permit, c.seq));
        let mut permits = Permits::default();
        for claim in claims {
            let taken = permits
                .holding
                .last()
                .is_some_and(|h| (h.count, h.permit) == (claim.count, claim.permit));
            match taken {
                true => permits.losing.push(claim),
                false => permits.holding.push(claim),
            }
        }
        permits.queue = names
            .iter()
            .filter_map(|n| parse_queued(n).map(|seq| (n.clone(), seq)))
            .collect();
        permits.queue.sort_by_key(|(_, seq)| *seq);
        permits
    }

    /// The count of claims made for another count than `count`, if any.
    pub(super) fn other_count(&self, count: u32) -> Option<u32> {
        self.holding.iter().map(|c| c.count).find(|&c| c != count)
    }

    /// Whether the claim `name` holds its permit.
    pub(super) fn holds(&self, name: &str) -> bool {
        self.holding.iter().any(|c| c.name == name)
    }

    /// The lowest permit of `count` nobody claims.
    pub(super) fn free(&self, count: u32) -> Option<u32> {
        (0..count).find(|p| !self.holding.iter().any(|c| c.permit == *p))
    }

    /// Where the queue node `mine` stands in the queue of a semaphore of `count` permits: the
    /// waiter at rank `r` may claim while more than `r` permits are free (the `r`-th free one,
    /// so the first waiters claim different permits at once); the first `count` waiters watch
    /// the claims; any other waiter watches the node `count` places ahead, whose going brings it
    /// among the first.
    pub(super) fn standing(&self, mine: &str, count: u32) -> Standing<'_> {
        let Some(rank) = self.queue.iter().position(|(name, _)| name == mine) else {
            return Standing::Gone;
        };
        let free = (0..count).filter(|p| !self.holding.iter().any(|c| c.permit == *p));
        if let Some(permit) = free.clone().nth(rank) {
            return Standing::Admitted(permit);
        }
        match rank.checked_sub(usize::try_from(count).unwrap_or(usize::MAX)) {
            None => Standing::Next { rank },
            Some(at) => Standing::Behind(&self.queue[at].0),
        }
    }
}

/// Where a waiter's queue node stands ([`Permits::standing`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Standing<'a> {
    /// Not in the queue (an operator deleted it).
    Gone,
    /// Admitted: it claims this permit.
    Admitted(u32),
    /// Among the first waiters (at `rank`), with no permit free for it: it watches the claims
    /// that hold, and the waiters ahead of it (one that goes moves it up).
    Next { rank: usize },
    /// Further back: it watches this node.
    Behind(&'a str),
}

/// The start of the names of `uuid`'s nodes (`_c_<uuid>-`).
pub(super) fn protection(uuid: &str) -> String {
    format!("{PROTECTED}{uuid}-")
}

/// One child of a lock's node, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Child {
    /// Its name.
    pub(super) name: String,
    /// Its sequence number: its place in line.
    pub(super) seq: i64,
    /// A reader's node (`__READ__`); otherwise it excludes (a mutex's or a writer's).
    pub(super) shared: bool,
}

/// A child's kind and sequence, when it is a lock node of Curator's layout (ours are).
pub(super) fn parse(name: &str) -> Option<Child> {
    // The last lock name in it (a protection uuid never holds one: it is hex and hyphens).
    let (at, kind) = [MUTEX, READ, WRITE]
        .iter()
        .filter_map(|kind| name.rfind(kind).map(|at| (at, *kind)))
        .max_by_key(|(at, _)| *at)?;
    let digits = &name[at + kind.len()..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
        return None;
    }
    Some(Child {
        name: name.to_owned(),
        seq: digits.parse().ok()?,
        shared: kind == READ,
    })
}

/// The lock nodes among `names`, in line order (by sequence; other children are left out).
pub(super) fn line(names: &[String]) -> Vec<Child> {
    let mut line: Vec<Child> = names.iter().filter_map(|n| parse(n)).collect();
    // A downgraded reader shares its writer's sequence: the writer first (see the module doc).
    line.sort_by_key(|c| (c.seq, c.shared));
    line
}

/// Where the node `mine` stands in `line`: `None` if it is not there; `Some(None)` when it
/// holds (an exclusive node first in line, a reader with no excluding node before it);
/// `Some(Some(ahead))` when it waits, `ahead` being the one node it waits for (the one just
/// before it; for a reader, the last excluding node before it).
pub(super) fn standing<'l>(line: &'l [Child], mine: &str) -> Option<Option<&'l Child>> {
    let at = line.iter().position(|c| c.name == mine)?;
    let shared = line[at].shared;
    let before = &line[..at];
    let ahead = if shared {
        before.iter().rev().find(|c| !c.shared)
    } else {
        before.last()
    };
    Some(ahead)
}

/// The holders in `line`: the first node if it excludes, else every reader before the first
/// excluding node.
pub(super) fn holders(line: &[Child]) -> &[Child] {
    match line.iter().position(|c| !c.shared) {
        Some(0) => &line[..1.min(line.len())],
        Some(at) => &line[..at],
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_keys_are_node_names_and_others_are_escaped_one_to_one() {
        assert_eq!(node_name("order:42"), "order:42");
        assert_eq!(node_name("a-b_c.d"), "a-b_c.d");
        assert_eq!(node_name("order 42"), "%order%2042");
        assert_eq!(node_name("a/b"), "%a%2Fb");
        assert_eq!(node_name("."), "%.");
        assert_eq!(node_name(".."), "%..");
        assert_eq!(node_name("%"), "%%25");
        assert_eq!(node_name("ordér"), "%ord%C3%A9r");
        let keys = [
            "order:42",
            "order 42",
            "a/b",
            ".",
            "..",
            "%",
            "%25",
            "ordér",
            "Order",
            "zookeeper",
        ];
        let names: std::collections::BTreeSet<String> = keys.iter().map(|k| node_name(k)).collect();
        assert_eq!(names.len(), keys.len(), "two keys met: {names:?}");
        for key in keys {
            assert_eq!(key_of(&node_name(key)).as_deref(), Some(key));
            assert!(!node_name(key).contains('/'));
        }
        assert_eq!(key_of("%zz"), None);
        assert_eq!(key_of("a b"), None);
    }

    #[test]
    fn the_prefix_is_an_absolute_parent_path() {
        assert_eq!(parent_path("lock:").unwrap(), "/locks");
        assert_eq!(parent_path("/locks/billing/").unwrap(), "/locks/billing");
        assert_eq!(parent_path("/zookeepers").unwrap(), "/zookeepers");
        assert_eq!(parent_path("/app/zookeeper").unwrap(), "/app/zookeeper");
        for bad in [
            "billing:",
            "/",
            "//x",
            "/a//b",
            "/a/../b",
            "",
            "/zookeeper",
            "/zookeeper/x/",
        ] {
            assert!(parent_path(bad).is_err(), "{bad}");
        }
        assert_eq!(lock_path("/locks", "order:42"), "/locks/order:42");
    }

    #[test]
    fn curators_names_are_read_and_ours_are_written_like_them() {
        let uuid = uuid_of("0123456789abcdef0123456789abcdef me:1");
        assert_eq!(uuid, "01234567-89ab-cdef-0123-456789abcdef");
        assert_eq!(
            node_prefix("/locks/k", &uuid, false),
            "/locks/k/_c_01234567-89ab-cdef-0123-456789abcdef-lock-"
        );
        assert_eq!(
            node_prefix("/locks/k", &uuid, true),
            "/locks/k/_c_01234567-89ab-cdef-0123-456789abcdef-__READ__"
        );
        let mutex = parse("_c_9b2e7c4a-1111-2222-3333-444455556666-lock-0000000007").unwrap();
        assert_eq!((mutex.seq, mutex.shared), (7, false));
        let read = parse("_c_9b2e7c4a-1111-2222-3333-444455556666-__READ__0000000003").unwrap();
        assert_eq!((read.seq, read.shared), (3, true));
        let write = parse("_c_9b2e7c4a-1111-2222-3333-444455556666-__WRIT__0000000004").unwrap();
        assert_eq!((write.seq, write.shared), (4, false));
        // Curator without protection, and a lock name that is also in the uuid's place.
        assert_eq!(parse("lock-0000000001").map(|c| c.seq), Some(1));
        assert_eq!(parse("_c_x-lock--lock-0000000002").map(|c| c.seq), Some(2));
        for foreign in ["leader", "lock-", "lock-12ab", "_c_x-latch-0000000001"] {
            assert_eq!(parse(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn a_semaphores_claims_and_queue_are_read_and_kept_out_of_the_line() {
        let uuid = "01234567-89ab-cdef-0123-456789abcdef";
        let prefix = claim_prefix("/locks/k", uuid, 4, 2);
        assert_eq!(
            prefix,
            "/locks/k/_c_01234567-89ab-cdef-0123-456789abcdef-permit-0004-0002-"
        );
        let names: Vec<String> = [
            "_c_a-permit-0004-0002-0000000009",
            "_c_b-permit-0004-0002-0000000007",
            "_c_c-permit-0004-0000-0000000008",
            "_c_d-queue-0000000011",
            "_c_e-queue-0000000010",
            "_c_f-permit-0004-02-0000000001",
            "other",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert!(line(&names).is_empty(), "no claim or waiter is a lock node");
        let permits = Permits::of(&names);
        let holding: Vec<(&str, u32)> = permits
            .holding
            .iter()
            .map(|c| (c.name.as_str(), c.permit))
            .collect();
        assert_eq!(
            holding,
            [
                ("_c_c-permit-0004-0000-0000000008", 0),
                ("_c_b-permit-0004-0002-0000000007", 2)
            ]
        );
        assert_eq!(
            permits.losing.len(),
            1,
            "the newer claim of permit 2 holds nothing"
        );
        assert!(permits.holds("_c_b-permit-0004-0002-0000000007"));
        assert!(!permits.holds("_c_a-permit-0004-0002-0000000009"));
        assert_eq!(permits.free(4), Some(1));
        assert_eq!(permits.free(1), None);
        assert_eq!(permits.other_count(4), None);
        assert_eq!(permits.other_count(3), Some(4));
        // Permits 1 and 3 of 4 are free: the first two waiters claim one each.
        let (first, second) = ("_c_e-queue-0000000010", "_c_d-queue-0000000011");
        assert_eq!(permits.standing(first, 4), Standing::Admitted(1));
        assert_eq!(permits.standing(second, 4), Standing::Admitted(3));
        // Of 2, permit 1 is free: the second waiter watches the claims.
        assert_eq!(permits.standing(first, 2), Standing::Admitted(1));
        assert_eq!(permits.standing(second, 2), Standing::Next { rank: 1 });
        // Of 1, none: the second waiter watches the first.
        assert_eq!(permits.standing(first, 1), Standing::Next { rank: 0 });
        assert_eq!(permits.standing(second, 1), Standing::Behind(first));
        assert_eq!(permits.standing("_c_x-queue-0000000012", 4), Standing::Gone);
        assert_eq!(parse_claim("_c_f-permit-0004-02-0000000001"), None);
    }

    #[test]
    fn a_downgraded_reader_stands_behind_its_writer_and_holds_once_it_goes() {
        let uuid = "8d3f0c3e-2d6f-4c4e-9a43-0123456789ab";
        let writer = format!("_c_{uuid}-__WRIT__0000000005");
        let downgraded = format!("_c_{uuid}-__READ__0000000005");
        let ours_writer = "_c_11111111-2222-3333-4444-555555555555-lock-0000000007".to_owned();
        let ours_reader = "_c_11111111-2222-3333-4444-555555555555-__READ__0000000008".to_owned();
        // Listed in either order, the writer sorts first and holds alone.
        for names in [
            vec![
                downgraded.clone(),
                writer.clone(),
                ours_writer.clone(),
                ours_reader.clone(),
            ],
            vec![
                writer.clone(),
                downgraded.clone(),
                ours_writer.clone(),
                ours_reader.clone(),
            ],
        ] {
            let queue = line(&names);
            assert_eq!(queue[0].name, writer);
            assert_eq!(queue[1].name, downgraded);
            assert_eq!(holders(&queue).len(), 1);
            assert!(standing(&queue, &ours_writer).is_some_and(|ahead| ahead.is_some()));
        }
        // The write node gone: the downgraded reader holds; a writer behind waits for it, a
        // reader behind it (no writer between) holds with it.
        let names = vec![downgraded.clone(), ours_reader.clone()];
        let queue = line(&names);
        assert_eq!(holders(&queue).len(), 2);
        assert_eq!(standing(&queue, &ours_reader), Some(None));
        let names = vec![downgraded.clone(), ours_writer.clone()];
        let queue = line(&names);
        assert_eq!(
            standing(&queue, &ours_writer).and_then(|ahead| ahead.map(|c| c.name.clone())),
            Some(downgraded.clone())
        );
    }

    #[test]
    fn a_create_finds_only_the_node_it_made() {
        let prefix = "_c_8d3f-lock-";
        assert!(made_by("_c_8d3f-lock-0000000007", prefix));
        assert!(!made_by("_c_8d3f-lock-000000007", prefix), "nine digits");
        assert!(!made_by("_c_8d3f-lock-__READ__0000000007", prefix));
        let claim = "_c_8d3f-permit-0002-0001-";
        assert!(made_by("_c_8d3f-permit-0002-0001-0000000012", claim));
        assert!(!made_by("_c_8d3f-permit-0002-0001-0000000012-x", claim));
        assert!(!made_by(
            "_c_8d3f-permit-0002-0010-0000000012",
            "_c_8d3f-permit-0002-0001"
        ));
    }

    #[test]
    fn the_line_decides_who_holds_and_whom_a_waiter_watches() {
        let names: Vec<String> = [
            "_c_a-__READ__0000000002",
            "_c_b-lock-0000000001",
            "_c_c-__READ__0000000003",
            "_c_d-__WRIT__0000000004",
            "_c_e-__READ__0000000005",
            "other",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let line = line(&names);
        assert_eq!(line.len(), 5);
        assert_eq!(standing(&line, "_c_b-lock-0000000001"), Some(None));
        assert_eq!(
            standing(&line, "_c_a-__READ__0000000002").unwrap().unwrap().name,
            "_c_b-lock-0000000001"
        );
        assert_eq!(
            standing(&line, "_c_c-__READ__0000000003").unwrap().unwrap().name,
            "_c_b-lock-0000000001"
        );
        assert_eq!(
            standing(&line, "_c_d-__WRIT__0000000004").unwrap().unwrap().name,
            "_c_c-__READ__0000000003"
        );
        assert_eq!(
            standing(&line, "_c_e-__READ__0000000005").unwrap().unwrap().name,
            "_c_d-__WRIT__0000000004"
        );
        assert_eq!(standing(&line, "missing"), None);
        assert_eq!(holders(&line).len(), 1);
        assert_eq!(holders(&line[1..]).len(), 2, "two readers before a writer");
    }
}
