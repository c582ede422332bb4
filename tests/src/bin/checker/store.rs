//! The fenced store every critical section writes to (a Redis server of its own, never
//! disturbed), and the check of the log it keeps.

use std::collections::HashMap;
use std::sync::Arc;

use redis::{AsyncCommands, Commands};

use crate::worker::{Load, READER};
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
    transfer: Arc<redis::Script>,
}

impl Store {
    pub async fn connect(url: &str) -> Fallible<Store> {
        let conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        Ok(Store {
            conn,
            script: Arc::new(redis::Script::new(include_str!("store.lua"))),
            transfer: Arc::new(redis::Script::new(include_str!("transfer.lua"))),
        })
    }

    /// Moves `amount` from account `from` to account `to` (each with the token its lock gave
    /// and the balance the section read), both writes fenced and applied together or not at
    /// all; whether the store accepted them.
    pub async fn transfer(
        &self,
        (from, from_token, from_read): (u64, u64, i64),
        (to, to_token, to_read): (u64, u64, i64),
        section: &str,
        amount: i64,
    ) -> redis::RedisResult<bool> {
        let mut conn = self.conn.clone();
        let accepted: i64 = self
            .transfer
            .key(hash(from))
            .key(log(from))
            .key(hash(to))
            .key(log(to))
            .arg(from_token)
            .arg(to_token)
            .arg(section)
            .arg(from_read)
            .arg(to_read)
            .arg(amount)
            .invoke_async(&mut conn)
            .await?;
        Ok(accepted == 1)
    }

    /// An account's balance (the `--sets` load), as the last accepted transfer left it.
    pub async fn balance(&self, key: u64) -> redis::RedisResult<i64> {
        let mut conn = self.conn.clone();
        let value: Option<i64> = conn.hget(hash(key), "value").await?;
        Ok(value.unwrap_or(0))
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
    /// (ms since the epoch) faults struck, each measured by when every key had a section enter
    /// after it (a long body already inside when it struck does not count).
    /// A semaphore's permits are checked each on its own resource (no two holders of one permit
    /// at once, so at most `permits` per key, the worker refusing a permit outside the count),
    /// and a key has recovered once a section of any of its permits entered.
    /// The `--sets` load's accounts are checked each on its own log, their lost updates by
    /// the balances each accepted transfer read (the one before it must have left exactly
    /// that), and the sum of every balance must still be 0.
    pub fn verdict(&mut self, load: Load, struck: &[u64]) -> Fallible<(Verdict, Vec<Option<u64>>)> {
        let mut verdict = Verdict::default();
        let mut sum: i64 = 0;
        let mut recovered: Vec<Option<u64>> = vec![Some(0); struck.len()];
        for k in 0..load.keys {
            let mut lines: Vec<Vec<String>> = Vec::new();
            for permit in 0..load.permits {
                lines.push(self.conn.lrange(log(load.resource(k, permit)), 0, -1)?);
            }
            let mut entered: Vec<u64> = Vec::new();
            for (permit, lines) in (0..load.permits).zip(&lines) {
                let resource = load.resource(k, permit);
                let entries = lines
                    .iter()
                    .map(|line| Entry::parse(line).ok_or_else(|| format!("bad log entry {line:?}")))
                    .collect::<Result<Vec<_>, _>>()?;
                let fields: HashMap<String, i64> = self.conn.hgetall(hash(resource))?;
                let field = |name: &str| fields.get(name).copied().unwrap_or(0);
                let mut checked =
                    check_log(&entries, field("value").max(0) as u64, field("increments") as u64);
                if load.sets {
                    checked.lost_updates = unchained(&entries);
                    sum += field("value");
                }
                verdict.add(&checked);
                entered.extend(
                    entries
                        .iter()
                        .filter(|e| e.accepted && e.op == "enter")
                        .map(|e| e.ms),
                );
            }
            entered.sort_unstable();
            for (at, r) in struck.iter().zip(&mut recovered) {
                let next = entered.iter().find(|&&ms| ms > *at).map(|ms| ms - at);
                *r = match (*r, next) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
            }
        }
        verdict.sum_drift = sum.unsigned_abs();
        Ok((verdict, recovered))
    }
}

/// Accepted transfers of one account that did not read what the accepted one before it wrote
/// (0 before the first): each is an update lost.
fn unchained(entries: &[Entry<'_>]) -> u64 {
    let mut balance = 0;
    let mut lost = 0;
    for e in entries.iter().filter(|e| e.accepted && e.op == "set") {
        let (Some(from), Some(to)) = (e.from, e.to) else {
            continue;
        };
        if from != balance {
            lost += 1;
        }
        balance = to;
    }
    lost
}

/// One line of a key's log.
#[derive(Debug, PartialEq)]
struct Entry<'a> {
    token: u64,
    section: &'a str,
    op: &'a str,
    accepted: bool,
    /// The store's clock, ms since the epoch.
    ms: u64,
    /// A transfer's balance read and written (the `--sets` load).
    from: Option<i64>,
    to: Option<i64>,
}

impl<'a> Entry<'a> {
    /// `<token> <section> <op> <1|0> <ms>[ <from> <to>]`.
    fn parse(line: &'a str) -> Option<Entry<'a>> {
        let mut parts = line.split(' ');
        let token: u64 = parts.next()?.parse().ok()?;
        let section = parts.next()?;
        let op = parts.next()?;
        let accepted = match parts.next()? {
            "1" => true,
            "0" => false,
            _ => return None,
        };
        let ms = parts.next()?.parse().ok()?;
        let from = parts.next().map(str::parse).transpose().ok()?;
        let to = parts.next().map(str::parse).transpose().ok()?;
        Some(Entry {
            token,
            section,
            op,
            accepted,
            ms,
            from,
            to,
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
    /// Increments that did not survive: accepted `set`s minus the final counter (for the
    /// `--sets` load: accepted transfers that read another balance than the last one written).
    pub lost_updates: u64,
    /// How far the sum of every account's balance moved from 0 (the `--sets` load).
    pub sum_drift: u64,
}

impl Verdict {
    fn add(&mut self, other: &Verdict) {
        self.sections += other.sections;
        self.overlaps += other.overlaps;
        self.late_bodies += other.late_bodies;
        self.stale_accepted += other.stale_accepted;
        self.fenced_refused += other.fenced_refused;
        self.lost_updates += other.lost_updates;
        self.sum_drift += other.sum_drift;
    }

    /// Whether the run saw no overlap, no late body, no stale write accepted and no lost
    /// update.
    pub fn is_clean(&self) -> bool {
        self.overlaps == 0
            && self.late_bodies == 0
            && self.stale_accepted == 0
            && self.lost_updates == 0
            && self.sum_drift == 0
    }
}

/// Checks one key's log (in the order the store saw the writes) against its final counter.
/// Sections are taken in the order the lock went to them, by fencing token (without tokens, all
/// 0, by their first write): "the next holder" is the next token, whatever order the writes of
/// two holders arrived in. A reader (its section ends in [`READER`]) holds its writer's token,
/// and comes after it: a writer and the readers after it are steps, and the readers of one step
/// may overlap each other, never another step.
fn check_log(entries: &[Entry<'_>], value: u64, increments: u64) -> Verdict {
    struct Span {
        token: u64,
        reader: bool,
        first: usize,
        last: usize,
    }
    let mut spans: Vec<Span> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        match index.get(e.section) {
            Some(&s) => spans[s].last = i,
            None => {
                index.insert(e.section, spans.len());
                spans.push(Span {
                    token: e.token,
                    reader: e.section.ends_with(READER),
                    first: i,
                    last: i,
                });
            }
        }
    }
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&s| (spans[s].token, spans[s].reader, spans[s].first));
    // Steps: a writer alone, or the readers of one token together.
    let mut steps: Vec<Vec<usize>> = Vec::new();
    for &s in &order {
        match steps.last_mut() {
            Some(step)
                if spans[s].reader && spans[step[0]].reader && spans[step[0]].token == spans[s].token =>
            {
                step.push(s);
            }
            _ => steps.push(vec![s]),
        }
    }
    // Where the next step's first write is in the log, for each section.
    let mut next_first: Vec<Option<usize>> = vec![None; spans.len()];
    for pair in steps.windows(2) {
        let next = pair[1].iter().map(|&s| spans[s].first).min();
        for &s in &pair[0] {
            next_first[s] = next;
        }
    }
    let mut v = Verdict {
        sections: spans.len() as u64,
        ..Verdict::default()
    };
    // A section overlaps when a holder of an earlier step wrote again after it began.
    let mut open_until = None;
    for step in &steps {
        for &s in step {
            if open_until.is_some_and(|end| end > spans[s].first) {
                v.overlaps += 1;
            }
        }
        let last = step.iter().map(|&s| spans[s].last).max();
        open_until = open_until.max(last);
    }
    for (s, span) in spans.iter().enumerate() {
        if next_first[s].is_some_and(|next| span.last > next) {
            v.late_bodies += 1;
        }
    }
    for (i, e) in entries.iter().enumerate() {
        if !e.accepted {
            v.fenced_refused += 1;
        } else if next_first[index[e.section]].is_some_and(|next| i > next) {
            v.stale_accepted += 1;
        }
    }
    v.lost_updates = increments.saturating_sub(value);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(lines: &[&'static str]) -> Vec<Entry<'static>> {
        lines.iter().map(|l| Entry::parse(l).unwrap()).collect()
    }

    #[test]
    fn transfers_that_read_what_the_last_one_wrote_lose_nothing() {
        let log = entries(&[
            "1 a enter 1 0",
            "1 a set 1 0 0 -5",
            "2 b enter 1 0",
            "2 b set 1 0 -5 2",
            "3 c set 0 0 -5 9",
        ]);
        assert_eq!(unchained(&log), 0, "a refused transfer is no update");
        let lost = entries(&["1 a set 1 0 0 -5", "2 b set 1 0 0 3"]);
        assert_eq!(unchained(&lost), 1, "b read the balance before a's transfer");
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
    fn a_late_first_write_of_an_earlier_holder_makes_it_the_late_one() {
        // Token 5 took the lock first but its first write arrived after token 6's.
        let log = entries(&["6 b enter 1 0", "5 a enter 0 0", "6 b set 1 0"]);
        let v = check_log(&log, 1, 1);
        assert_eq!((v.overlaps, v.late_bodies, v.fenced_refused), (1, 1, 1));
        assert_eq!(
            (v.stale_accepted, v.lost_updates),
            (0, 0),
            "b is the rightful holder"
        );
    }

    #[test]
    fn without_tokens_the_log_order_decides() {
        let log = entries(&["0 a enter 1 0", "0 b enter 1 0", "0 a set 1 0", "0 b set 1 0"]);
        let v = check_log(&log, 1, 2);
        assert_eq!(
            (v.overlaps, v.late_bodies, v.stale_accepted, v.lost_updates),
            (1, 1, 1, 1)
        );
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

    #[test]
    fn readers_of_one_writer_may_overlap_each_other() {
        let log = entries(&[
            "5 w set 1 0",
            "5 a.r enter 1 0",
            "5 b.r enter 1 0",
            "5 a.r poll 1 0",
            "5 b.r poll 1 0",
            "6 x enter 1 0",
            "6 x set 1 0",
        ]);
        let v = check_log(&log, 2, 2);
        assert_eq!(
            (v.overlaps, v.late_bodies, v.stale_accepted, v.lost_updates),
            (0, 0, 0, 0)
        );
    }

    #[test]
    fn a_reader_still_reading_when_the_next_writer_entered_overlaps() {
        let log = entries(&[
            "5 w set 1 0",
            "5 a.r enter 1 0",
            "6 x enter 1 0",
            "5 a.r poll 0 0",
            "6 x set 1 0",
        ]);
        let v = check_log(&log, 2, 2);
        assert_eq!((v.overlaps, v.late_bodies, v.fenced_refused), (1, 1, 1));
        // A writer among readers of its own token overlaps them too.
        let log = entries(&[
            "5 a.r enter 1 0",
            "5 w enter 1 0",
            "5 a.r poll 1 0",
            "5 w set 1 0",
        ]);
        assert_eq!(check_log(&log, 1, 1).overlaps, 1);
    }
}
