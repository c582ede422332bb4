//! Reading locks: which keys are locks (SCAN, on every primary of a Cluster), and what each one
//! holds, in one atomic MULTI/EXEC per page of keys (per key on a Cluster, where a transaction
//! stays in one slot); and the `list` and `show` commands over them.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use futures_util::{StreamExt, TryStreamExt};
use lock_runtime::keys::LockKeys;
use redis::{FromRedisValue, Value};

use crate::error::Error;
use crate::output::Out;
use crate::target::{Conn, Target};

/// How many keys one SCAN call looks at, and how many locks one read covers (on one server).
const PAGE: usize = 500;

/// How many reads are in flight at once (on a Cluster, one per key).
const READS_IN_FLIGHT: usize = 16;

/// What a release kept for its minimum hold appends to the holder's value.
const RELEASED: &str = ":released";

/// One key as found: its lock (if any), fencing counter and waiters.
#[derive(Debug, Clone)]
pub(crate) struct LockView {
    /// The user's key, without prefix and braces.
    pub(crate) key: String,
    /// The Redis key of its lock, `<prefix>{key}`.
    pub(crate) lock_key: String,
    pub(crate) holding: Holding,
    /// The lock key's remaining life; `None` when free, or (a foreign value) without expiry.
    pub(crate) ttl_ms: Option<u64>,
    pub(crate) fence: Fence,
    /// Fair waiters whose place in line has not lapsed.
    pub(crate) fair_waiters: u64,
    /// Writers waiting for a read-write lock's readers to leave (whose claims have not lapsed).
    pub(crate) waiting_writers: u64,
    /// When the answer arrived, on this machine's monotonic clock.
    pub(crate) read_at: Instant,
}

/// What the lock key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holding {
    /// Nothing: the lock is free.
    Free,
    /// One holder's value `<uuid> <owner>`; `released`: given back and kept until its minimum
    /// hold ends (the value then ends in `:released`).
    Exclusive {
        value: String,
        owner: String,
        released: bool,
    },
    /// The shared holders of a read-write lock (whose shares have not expired).
    Shared { readers: Vec<Reader> },
    /// Something this library did not write: `kind` is its Redis type, `value` a printable
    /// excerpt of a string.
    Foreign { kind: String, value: Option<String> },
}

/// One shared holder of a read-write lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reader {
    /// Its value, `<uuid> <owner>`.
    pub(crate) value: String,
    pub(crate) owner: String,
    /// How long its share has left.
    pub(crate) ttl_ms: u64,
}

/// The fencing counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fence {
    /// No counter: no fenced acquire yet (or Redis lost it).
    None,
    /// The last fencing token handed out.
    Token(u64),
    /// Something that is not a counter of ours.
    Other(String),
}

/// `lockctl list`: the locks held now whose keys match `pattern`, sorted by key.
pub(crate) async fn list(target: &Target, pattern: &str, out: &mut Out) -> Result<(), Error> {
    let mut conn = target.connection().await?;
    let views = held(&mut conn, target.prefix(), pattern).await?;
    out.list(pattern, &views)
}

/// `lockctl show`: everything about one key, held or not.
pub(crate) async fn show(target: &Target, key: &str, out: &mut Out) -> Result<(), Error> {
    check_key(key)?;
    let mut conn = target.connection().await?;
    let view = read_one(&mut conn, target.prefix(), key).await?;
    out.show(&view)
}

/// Refuses keys no lock can have (the library's rule: 1 to 1024 bytes).
pub(crate) fn check_key(key: &str) -> Result<(), Error> {
    if key.is_empty() || key.len() > lock_runtime::MAX_KEY_LEN {
        return Err(Error::Usage(format!(
            "a lock key is 1 to {} bytes long",
            lock_runtime::MAX_KEY_LEN
        )));
    }
    Ok(())
}

/// The locks held now whose keys match `pattern`, sorted by key.
pub(crate) async fn held(conn: &mut Conn, prefix: &str, pattern: &str) -> Result<Vec<LockView>, Error> {
    let keys = scan(conn, prefix, pattern).await?;
    let per_read = conn.keys_per_transaction(PAGE);
    let pages: Vec<Vec<LockView>> = futures_util::stream::iter(keys.chunks(per_read))
        .map(|page| {
            let mut conn = conn.clone();
            async move { read(&mut conn, prefix, page).await }
        })
        .buffered(READS_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok(pages
        .into_iter()
        .flatten()
        .filter(|v| v.holding != Holding::Free)
        .collect())
}

/// What one key holds now.
pub(crate) async fn read_one(conn: &mut Conn, prefix: &str, key: &str) -> Result<LockView, Error> {
    let mut found = read(conn, prefix, &[key.to_owned()]).await?;
    found
        .pop()
        .ok_or_else(|| Error::Failed(format!("Redis gave no answer about {key}")))
}

/// The user keys of the lock keys matching `pattern`, sorted and without repeats (SCAN may
/// return a key twice). SCAN, not KEYS: it does not block the server on a large keyspace. On a
/// Cluster every primary is walked (each holds the keys of its slots).
async fn scan(conn: &mut Conn, prefix: &str, pattern: &str) -> Result<Vec<String>, Error> {
    let matching = LockKeys::new(&glob_escape(prefix), pattern).lock().to_owned();
    let mut keys = BTreeSet::new();
    for node in conn.nodes().await? {
        let mut cursor: u64 = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&matching)
                .arg("COUNT")
                .arg(PAGE);
            let (next, batch): (u64, Vec<Vec<u8>>) = conn.on_node(&node, scan).await?;
            let names = batch.into_iter().filter_map(|name| String::from_utf8(name).ok());
            keys.extend(names.filter_map(|name| LockKeys::user_key(prefix, &name).map(str::to_owned)));
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(keys.into_iter().collect())
}

/// `text` with Redis glob's special characters escaped, to match it literally.
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

/// The commands read per key, in the order [`parse`] takes their answers.
const READS_PER_KEY: usize = 7;

/// What each of `keys` holds, read in one MULTI/EXEC so that every key is seen at one instant
/// (a lock is not seen free by one command and held by the next). On a Cluster, `keys` is one
/// key, and the transaction goes to the primary owning its slot.
async fn read(conn: &mut Conn, prefix: &str, keys: &[String]) -> Result<Vec<LockView>, Error> {
    let Some(first) = keys.first() else {
        return Ok(Vec::new());
    };
    let now_ms = server_time_ms(conn, LockKeys::new(prefix, first).lock()).await?;
    let mut pipe = redis::pipe();
    pipe.atomic().ignore_errors();
    for key in keys {
        let names = LockKeys::new(prefix, key);
        let lock = names.lock();
        // A command of the wrong type for what the key holds answers with an error, which
        // `ignore_errors` leaves in its place: GET of a hash, HGETALL of a string.
        pipe.cmd("TYPE").arg(lock);
        pipe.cmd("GET").arg(lock);
        pipe.cmd("HGETALL").arg(lock);
        pipe.cmd("PTTL").arg(lock);
        pipe.cmd("GET").arg(names.fence());
        // Fair places and writers' claims are scored by when they lapse: count the live ones.
        let live = format!("({now_ms}");
        pipe.cmd("ZCOUNT").arg(names.kept()).arg(&live).arg("+inf");
        pipe.cmd("ZCOUNT").arg(names.writers()).arg(&live).arg("+inf");
    }
    let answers: Vec<Value> = pipe.query_async(conn).await?;
    if let Some(e) = answers.iter().find_map(unexpected_error) {
        return Err(e.into());
    }
    let read_at = Instant::now();
    if answers.len() != keys.len() * READS_PER_KEY {
        return Err(Error::Failed(format!(
            "unexpected answer from Redis: {} replies for {} reads",
            answers.len(),
            keys.len() * READS_PER_KEY
        )));
    }
    Ok(keys
        .iter()
        .zip(answers.chunks_exact(READS_PER_KEY))
        .map(|(key, answers)| parse(prefix, key, answers, now_ms, read_at))
        .collect())
}

/// An error answer other than the `WRONGTYPE` that reading a key of the other type gives.
fn unexpected_error(answer: &Value) -> Option<redis::RedisError> {
    match answer {
        Value::ServerError(e) if e.code() != "WRONGTYPE" => answer.clone().extract_error().err(),
        _ => None,
    }
}

/// The clock in milliseconds of the server holding `key` (shares and fair places expire by it).
async fn server_time_ms(conn: &mut Conn, key: &str) -> Result<u64, Error> {
    let (secs, micros) = conn.time_at(key).await?;
    Ok(secs * 1000 + micros / 1000)
}

/// One key's answers: TYPE, GET, HGETALL, PTTL, GET fence, ZCOUNT fair places, ZCOUNT writers.
fn parse(prefix: &str, key: &str, answers: &[Value], now_ms: u64, read_at: Instant) -> LockView {
    let kind: String = answer(&answers[0]).unwrap_or_else(|| "none".to_owned());
    let holding = match kind.as_str() {
        "none" => Holding::Free,
        "string" => answer::<Vec<u8>>(&answers[1]).map_or(Holding::Free, |value| parse_string(&value)),
        "hash" => answer::<HashMap<String, String>>(&answers[2])
            .and_then(|fields| parse_shared(&fields, now_ms))
            .unwrap_or_else(|| Holding::Foreign {
                kind: kind.clone(),
                value: None,
            }),
        _ => Holding::Foreign {
            kind: kind.clone(),
            value: None,
        },
    };
    let ttl_ms = answer::<i64>(&answers[3]).and_then(|pttl| u64::try_from(pttl).ok());
    LockView {
        key: key.to_owned(),
        lock_key: LockKeys::new(prefix, key).lock().to_owned(),
        ttl_ms: if holding == Holding::Free { None } else { ttl_ms },
        holding,
        fence: parse_fence(&answers[4]),
        fair_waiters: answer(&answers[5]).unwrap_or(0),
        waiting_writers: answer(&answers[6]).unwrap_or(0),
        read_at,
    }
}

/// An answer of the expected type; `None` for an error (a key of another type) or nil.
fn answer<T: FromRedisValue>(value: &Value) -> Option<T> {
    match value {
        Value::ServerError(_) | Value::Nil => None,
        value => T::from_redis_value_ref(value).ok(),
    }
}

/// A holder's value as the store keeps it (PostgreSQL's rows: text).
#[cfg(any(feature = "postgres", feature = "etcd"))]
pub(crate) fn parse_value(value: &str) -> Holding {
    parse_string(value.as_bytes())
}

/// A string at the lock key: one holder's value, or foreign.
fn parse_string(value: &[u8]) -> Holding {
    let Ok(text) = std::str::from_utf8(value) else {
        return foreign_string(&String::from_utf8_lossy(value));
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
        None => foreign_string(text),
    }
}

/// The owner label of a holder's value `<32 hex digits> <owner>`.
pub(crate) fn owner_of(value: &str) -> Option<&str> {
    let (id, owner) = value.split_once(' ')?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) && !owner.is_empty()).then_some(owner)
}

fn foreign_string(text: &str) -> Holding {
    Holding::Foreign {
        kind: "string".to_owned(),
        value: Some(excerpt(text)),
    }
}

/// At most 80 characters of `text`, control characters escaped, for a terminal.
fn excerpt(text: &str) -> String {
    const MAX: usize = 80;
    let mut shown: String = text.chars().take(MAX).flat_map(char::escape_debug).collect();
    if text.chars().nth(MAX).is_some() {
        shown.push('…');
    }
    shown
}

/// A hash at the lock key: the shares of a read-write lock (`mode` = `read`, then one field per
/// reader: its value, and the server time in ms its share expires), or `None` when it is not.
fn parse_shared(fields: &HashMap<String, String>, now_ms: u64) -> Option<Holding> {
    if fields.get("mode").map(String::as_str) != Some("read") {
        return None;
    }
    let mut readers = Vec::new();
    for (value, expires) in fields.iter().filter(|(field, _)| field.as_str() != "mode") {
        let owner = owner_of(value)?;
        let expires: u64 = expires.parse().ok()?;
        if expires > now_ms {
            readers.push(Reader {
                value: value.clone(),
                owner: owner.to_owned(),
                ttl_ms: expires - now_ms,
            });
        }
    }
    readers.sort_by(|a, b| (&a.owner, &a.value).cmp(&(&b.owner, &b.value)));
    Some(Holding::Shared { readers })
}

/// The fencing counter's answer.
fn parse_fence(value: &Value) -> Fence {
    match value {
        Value::Nil => Fence::None,
        Value::ServerError(_) => Fence::Other("not a string".to_owned()),
        value => match String::from_redis_value_ref(value) {
            Ok(text) => text
                .parse()
                .map_or_else(|_| Fence::Other(excerpt(&text)), Fence::Token),
            Err(_) => Fence::Other("unreadable".to_owned()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn lock_keys_and_auxiliary_keys_are_told_apart() {
        assert_eq!(LockKeys::user_key("lock:", "lock:{order:5}"), Some("order:5"));
        assert_eq!(LockKeys::user_key("lock:", "lock:{a}b}"), Some("a}b"));
        for aux in [
            "lock:{order:5}:fence",
            "lock:{order:5}:queue",
            "lock:{order:5}:writers",
            "lock:x",
            "other",
        ] {
            assert_eq!(LockKeys::user_key("lock:", aux), None, "{aux}");
        }
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn values_are_read_as_holders_or_foreign() {
        let held = parse_string(format!("{ID} billing-1").as_bytes());
        assert!(
            matches!(held, Holding::Exclusive { ref owner, released: false, .. } if owner == "billing-1")
        );
        let kept = parse_string(format!("{ID} job runner 7:released").as_bytes());
        assert!(
            matches!(kept, Holding::Exclusive { ref owner, released: true, .. } if owner == "job runner 7")
        );
        assert!(
            matches!(parse_string(b"hello\n"), Holding::Foreign { value: Some(ref v), .. } if v == "hello\\n")
        );
        assert!(matches!(
            parse_string(b"nothex billing-1"),
            Holding::Foreign { .. }
        ));
    }

    #[test]
    fn shares_are_read_and_expired_ones_left_out() {
        let fields = HashMap::from([
            ("mode".to_owned(), "read".to_owned()),
            (format!("{ID} reader-b"), "2000".to_owned()),
            (format!("{ID} reader-a"), "1500".to_owned()),
            (format!("{ID} reader-gone"), "900".to_owned()),
        ]);
        let Some(Holding::Shared { readers }) = parse_shared(&fields, 1000) else {
            panic!("not read as shared");
        };
        let seen: Vec<_> = readers.iter().map(|r| (r.owner.as_str(), r.ttl_ms)).collect();
        assert_eq!(seen, [("reader-a", 500), ("reader-b", 1000)]);
        let mut other = fields.clone();
        other.insert("mode".to_owned(), "write".to_owned());
        assert_eq!(parse_shared(&other, 1000), None);
        other.insert("mode".to_owned(), "read".to_owned());
        other.insert("junk".to_owned(), "1".to_owned());
        assert_eq!(parse_shared(&other, 1000), None);
    }
}
