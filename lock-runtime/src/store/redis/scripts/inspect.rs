//! The Rust half of `inspect.lua`: one lock as it is now, read at one instant.

use std::collections::HashMap;
use std::time::Duration;

use redis::{FromRedisValue, Value};

use super::super::keys;
use super::{Call, INSPECT};
use crate::view::{excerpt, owner_of, Fence, Holding, Reader};

/// `KEYS`: the lock, its counter, its fair places, its writers' claims.
pub(crate) fn call(lock: &str) -> Call {
    INSPECT.call(&[
        lock.to_owned(),
        keys::fence(lock),
        keys::kept(lock),
        keys::writers(lock),
    ])
}

/// What the script found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub(crate) holding: Holding,
    pub(crate) remaining: Option<Duration>,
    pub(crate) fence: Fence,
    pub(crate) queued: u64,
    pub(crate) writers: u64,
}

/// Reads the script's answer.
pub(crate) fn found(answer: Vec<Value>) -> Found {
    let mut answer = answer.into_iter();
    let mut next = || answer.next().unwrap_or(Value::Nil);
    let kind = String::from_redis_value(next()).unwrap_or_default();
    let value = next();
    let pttl = i64::from_redis_value(next()).unwrap_or(-2);
    let fence_state = i64::from_redis_value(next()).unwrap_or(0);
    let fence = next();
    let queued = u64::from_redis_value(next()).unwrap_or(0);
    let writers = u64::from_redis_value(next()).unwrap_or(0);
    let now_ms = u64::from_redis_value(next()).unwrap_or(0);
    let holding = match kind.as_str() {
        "none" => Holding::Free,
        "string" => Vec::<u8>::from_redis_value(value).map_or(Holding::Free, |v| Holding::of_value(&v)),
        "hash" => HashMap::<String, String>::from_redis_value(value)
            .ok()
            .and_then(|fields| shared(&fields, now_ms).or_else(|| permits(&fields, now_ms)))
            .unwrap_or_else(|| Holding::Foreign {
                kind: kind.clone(),
                value: None,
            }),
        _ => Holding::Foreign {
            kind: kind.clone(),
            value: None,
        },
    };
    let fence = match fence_state {
        0 => Fence::None,
        1 => match String::from_redis_value(fence) {
            Ok(text) => text
                .parse()
                .map_or_else(|_| Fence::Other(excerpt(&text)), Fence::Token),
            Err(_) => Fence::Other("unreadable".to_owned()),
        },
        _ => Fence::Other("not a string".to_owned()),
    };
    Found {
        remaining: u64::try_from(pttl)
            .ok()
            .filter(|_| !matches!(holding, Holding::Free))
            .map(Duration::from_millis),
        holding,
        fence,
        queued,
        writers,
    }
}

/// A hash at the lock key that is a semaphore's (`mode` = `permits`, `permits` = its count, then
/// one field per holder: its value (`:released` appended while kept for its minimum hold), and
/// `<ms its lease ends>:<permit>:<fence>`), or `None` when it is not.
pub(crate) fn permits(fields: &HashMap<String, String>, now_ms: u64) -> Option<Holding> {
    if fields.get("mode").map(String::as_str) != Some("permits") {
        return None;
    }
    let count = fields.get("permits")?.parse().ok()?;
    let mut holders = Vec::new();
    for (value, lease) in fields
        .iter()
        .filter(|(f, _)| !matches!(f.as_str(), "mode" | "permits"))
    {
        let mut parts = lease.split(':');
        let ends: u64 = parts.next()?.parse().ok()?;
        let permit: u32 = parts.next()?.parse().ok()?;
        if ends > now_ms {
            holders.push(Reader::of_permit(
                value,
                permit,
                Duration::from_millis(ends - now_ms),
            ));
        }
    }
    Some(Holding::permits(count, holders))
}

/// A hash at the lock key: the shares of a read-write lock (`mode` = `read`, then one field per
/// reader: its value, and the server time in ms its share expires), or `None` when it is not.
pub(crate) fn shared(fields: &HashMap<String, String>, now_ms: u64) -> Option<Holding> {
    if fields.get("mode").map(String::as_str) != Some("read") {
        return None;
    }
    let mut readers = Vec::new();
    for (value, expires) in fields.iter().filter(|(field, _)| field.as_str() != "mode") {
        // A field that is not a reader's value: not a read-write lock of ours.
        owner_of(value)?;
        let expires: u64 = expires.parse().ok()?;
        if expires > now_ms {
            readers.push(Reader::of(value, Duration::from_millis(expires - now_ms)));
        }
    }
    Some(Holding::shared(readers))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn shares_are_read_and_expired_ones_left_out() {
        let fields = HashMap::from([
            ("mode".to_owned(), "read".to_owned()),
            (format!("{ID} reader-b"), "2000".to_owned()),
            (format!("{ID} reader-a"), "1500".to_owned()),
            (format!("{ID} reader-gone"), "900".to_owned()),
        ]);
        let Some(Holding::Shared { readers }) = shared(&fields, 1000) else {
            panic!("not read as shared");
        };
        let seen: Vec<_> = readers
            .iter()
            .map(|r| (r.owner.as_str(), r.remaining.as_millis()))
            .collect();
        assert_eq!(seen, [("reader-a", 500), ("reader-b", 1000)]);
        let mut other = fields.clone();
        other.insert("mode".to_owned(), "write".to_owned());
        assert_eq!(shared(&other, 1000), None);
        other.insert("mode".to_owned(), "read".to_owned());
        other.insert("junk".to_owned(), "1".to_owned());
        assert_eq!(shared(&other, 1000), None);
    }

    #[test]
    fn an_answer_reads_as_what_was_found() {
        let answer = |kind: &str, value: Value, fence_state: i64, fence: Value| {
            vec![
                Value::BulkString(kind.as_bytes().to_vec()),
                value,
                Value::Int(29_000),
                Value::Int(fence_state),
                fence,
                Value::Int(2),
                Value::Int(1),
                Value::Int(1_000_000),
            ]
        };
        let held = found(answer(
            "string",
            Value::BulkString(format!("{ID} billing-1").into_bytes()),
            1,
            Value::BulkString(b"17".to_vec()),
        ));
        assert!(matches!(held.holding, Holding::Exclusive { ref owner, .. } if owner == "billing-1"));
        assert_eq!(held.remaining, Some(Duration::from_secs(29)));
        assert_eq!((held.fence, held.queued, held.writers), (Fence::Token(17), 2, 1));
        let free = found(answer("none", Value::Nil, 0, Value::Nil));
        assert_eq!(
            (free.holding, free.remaining, free.fence),
            (Holding::Free, None, Fence::None)
        );
        let odd = found(answer("list", Value::Nil, 2, Value::Nil));
        assert!(matches!(odd.holding, Holding::Foreign { ref kind, .. } if kind == "list"));
        assert_eq!(odd.fence, Fence::Other("not a string".to_owned()));
    }
}
