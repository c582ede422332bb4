//! The fenced store every critical section writes to (a Redis server of its own, never
//! disturbed), and the check of the log it keeps.

use std::collections::HashMap;
use std::sync::Arc;

use redis::{AsyncCommands, Commands};

use crate::Fallible;

/// What a section writes: its first write, one every poll of a long body, its last.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Enter,
    Poll,
    Set(u64),
}

/// A worker's handle on the store.
#[derive(Clone)]
pub struct Store {
    conn: redis::aio::MultiplexedConnection,
    script: Arc<redis::Script>,
}

impl Store {
    pub async fn connect(url: &str) -> Fallible<Store> {
        let conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        Ok(Store {
            conn,
            script: Arc::new(redis::Script::new(include_str!("store.lua"))),
        })
    }

    /// A fenced write by section `section` of key `key`; whether the store accepted it.
    pub async fn write(&self, key: u64, token: u64, section: &str, op: Op) -> redis::RedisResult<bool> {
        let (name, value) = match op {
            Op::Enter => ("enter", 0),
            Op::Poll => ("poll", 0),
            Op::Set(value) => ("set", value),
        };
        let mut conn = self.conn.clone();
        let accepted: i64 = self
            .script
            .key(hash(key))
            .key(log(key))
            .arg(token)
            .arg(section)
            .arg(name)
            .arg(value)
            .invoke_async(&mut conn)
            .await?;
        Ok(accepted == 1)
    }

    /// The key's counter, as the last accepted `set` left it.
    pub async fn value(&self, key: u64) -> redis::RedisResult<u64> {
        let mut conn = self.conn.clone();
        let value: Option<u64> = conn.hget(hash(key), "value").await?;
        Ok(value.unwrap_or(0))
    }
}

fn hash(key: u64) -> String {
    format!("store:{{{key}}}")
}

fn log(key: u64) -> String {
    format!("log:{{{key}}}")
}

/// The coordinator's view of the store (blocking).
pub struct Reader {
    conn: redis::Connection,
}

impl Reader {
    pub fn connect(url: &str) -> Fallible<Reader> {
        let conn = redis::Client::open(url)?.get_connection()?;
        Ok(Reader { conn })
    }

    /// Reads every key's log and counter back and checks them; `struck` are the moments
    /// (ms since the epoch) faults struck, each measured by when every key had a write
    /// accepted again after it.
    pub fn verdict(&mut self, keys: u64, struck: &[u64]) -> Fallible<(Verdict, Vec<Option<u64>>)> {
        let mut verdict = Verdict::default();
        let mut recovered: Vec<Option<u64>> = vec![Some(0); struck.len()];
        for k in 0..keys {
            let lines: Vec<String> = self.conn.lrange(log(k), 0, -1)?;
            let entries = lines
                .iter()
                .map(|line| Entry::parse(line).ok_or_else(|| format!("bad log entry {line:?}")))
                .collect::<Result<Vec<_>, _>>()?;
            let fields: HashMap<String, u64> = self.conn.hgetall(hash(k))?;
            let field = |name: &str| fields.get(name).copied().unwrap_or(0);
            verdict.add(&check_log(&entries, field("value"), field("increments")));
            for (at, r) in struck.iter().zip(&mut recovered) {
                let next = entries
                    .iter()
                    .find(|e| e.accepted && e.ms > *at)
                    .map(|e| e.ms - at);
                *r = match (*r, next) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
            }
        }
        Ok((verdict, recovered))
    }
}

/// One line of a key's log.
#[derive(Debug, PartialEq)]
struct Entry<'a> {
    section: &'a str,
    op: &'a str,
    accepted: bool,
    /// The store's clock, ms since the epoch.
    ms: u64,
}

impl<'a> Entry<'a> {
    /// `<token> <section> <op> <1|0> <ms>`.
    fn parse(line: &'a str) -> Option<Entry<'a>> {
        let mut parts = line.split(' ');
        let _token: u64 = parts.next()?.parse().ok()?;
        let section = parts.next()?;
        let op = parts.next()?;
        let accepted = match parts.next()? {
            "1" => true,
            "0" => false,
            _ => return None,
        };
        let ms = parts.next()?.parse().ok()?;
        Some(Entry {
            section,
            op,
            accepted,
            ms,
        })
    }
}

/// What the logs show, summed over the keys.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// Critical sections that entered (wrote at least once).
    pub sections: u64,
    /// Sections that entered while another section of the key was still running: that one
    /// wrote again after this one's first write.
    pub overlaps: u64,
    /// Sections whose body went on (wrote again) after the next section of the key entered.
    pub late_bodies: u64,
    /// Writes of a late body that the store accepted: the harm fencing exists to prevent.
    pub stale_accepted: u64,
    /// Writes the store refused for a token lower than one it had accepted.
    pub fenced_refused: u64,
    /// Increments that did not survive: accepted `set`s minus the final counter.
    pub lost_updates: u64,
}

impl Verdict {
    fn add(&mut self, other: &Verdict) {
        self.sections += other.sections;
        self.overlaps += other.overlaps;
        self.late_bodies += other.late_bodies;
        self.stale_accepted += other.stale_accepted;
        self.fenced_refused += other.fenced_refused;
        self.lost_updates += other.lost_updates;
    }

    /// Whether the run saw no overlap, no late body, no stale write accepted and no lost
    /// update.
    pub fn is_clean(&self) -> bool {
        self.overlaps == 0 && self.late_bodies == 0 && self.stale_accepted == 0 && self.lost_updates == 0
    }
}

/// Checks one key's log, in store order, against its final counter and increment count.
fn check_log(entries: &[Entry<'_>], value: u64, increments: u64) -> Verdict {
    // Each section's span in the log: its first and last entry.
    let mut spans: Vec<(&str, usize, usize)> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        match index.get(e.section) {
            Some(&s) => spans[s].2 = i,
            None => {
                index.insert(e.section, spans.len());
                spans.push((e.section, i, i));
            }
        }
    }
    let mut v = Verdict {
        sections: spans.len() as u64,
        ..Verdict::default()
    };
    // Spans are in order of entry; a section overlaps when an earlier one ends after it began.
    let mut open_until = None;
    for &(_, first, last) in &spans {
        if open_until.is_some_and(|end| end > first) {
            v.overlaps += 1;
        }
        open_until = open_until.max(Some(last));
    }
    // The next section of the key entered at `next_first`: what came after is late.
    for (s, &(_, _, last)) in spans.iter().enumerate() {
        let Some(&(_, next_first, _)) = spans.get(s + 1) else {
            continue;
        };
        if last > next_first {
            v.late_bodies += 1;
        }
    }
    let mut sets = 0u64;
    for (i, e) in entries.iter().enumerate() {
        if !e.accepted {
            v.fenced_refused += 1;
            continue;
        }
        if e.op == "set" {
            sets += 1;
        }
        let s = index[e.section];
        if spans.get(s + 1).is_some_and(|&(_, next_first, _)| i > next_first) {
            v.stale_accepted += 1;
        }
    }
    v.lost_updates = increments.saturating_sub(value) + sets.abs_diff(increments);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(lines: &[&'static str]) -> Vec<Entry<'static>> {
        lines.iter().map(|l| Entry::parse(l).unwrap()).collect()
    }

    #[test]
    fn sections_one_after_the_other_are_clean() {
        let log = entries(&[
            "1 a enter 1 0",
            "1 a set 1 0",
            "2 b enter 1 0",
            "2 b poll 1 0",
            "2 b set 1 0",
        ]);
        let v = check_log(&log, 2, 2);
        assert_eq!(v.sections, 2);
        assert!(v.is_clean(), "{v:?}");
    }

    #[test]
    fn a_late_body_refused_by_fencing_is_an_overlap_and_no_stale_write() {
        let log = entries(&["1 a enter 1 0", "2 b enter 1 0", "1 a set 0 0", "2 b set 1 0"]);
        let v = check_log(&log, 1, 1);
        assert_eq!((v.overlaps, v.late_bodies, v.fenced_refused), (1, 1, 1));
        assert_eq!((v.stale_accepted, v.lost_updates), (0, 0));
    }

    #[test]
    fn a_late_write_accepted_is_stale_and_loses_an_update() {
        // Both read 0 and wrote 1 (tokens out of order, as without fencing).
        let log = entries(&["2 a enter 1 0", "3 b enter 1 0", "3 b set 1 0", "2 a set 1 0"]);
        let v = check_log(&log, 1, 2);
        assert_eq!(
            (v.overlaps, v.late_bodies, v.stale_accepted, v.lost_updates),
            (1, 1, 1, 1)
        );
    }
}
