//! `lockctl --etcd ENDPOINTS …`: the same four commands on the library's etcd store (the `etcd`
//! feature). It reads the keys the library writes under the prefix (`<prefix>{key}` the holder,
//! and after it, past a 0xff byte, `r/<token>` readers' shares, `q/<token>` fair waiters,
//! `w/<token>` waiting writers, `fence` the last fenced writer's revision), all in one read, so every lock is seen at one
//! revision; `release --force` deletes the holder's key in one transaction that compares it with
//! what was read and shown (its value and lease), then revokes that lease, as the library's
//! forced release does (the holder's renewals find it gone); waiters hear the deletion on their
//! watch. `watch` looks every interval, and at once when a key under the prefix changes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, WatchOptions};
use lock_runtime::keys::LockKeys;

use crate::error::Error;
use crate::inspect::{self, Fence, Holding, LockView, Reader};
use crate::output::Out;
use crate::release;
use crate::watch::{self, Plan};
use crate::Command;

/// The etcd store, through one client.
struct Etcd {
    client: Client,
    prefix: String,
    timeout: Duration,
}

/// What one lock's keys hold, as read.
#[derive(Default)]
struct Keys {
    holder: Option<(String, i64)>,
    /// Each reader's value and lease.
    shares: Vec<(String, i64)>,
    places: u64,
    claims: u64,
    fence: Option<u64>,
}

/// The user's key and what kind of key of its lock `name` is: `<prefix>{key}` the holder, and
/// after it, past a 0xff byte, `r/…`, `q/…`, `w/…` or `fence`.
fn split<'a>(prefix: &str, name: &'a [u8]) -> Option<(&'a str, Part)> {
    let rest = name.strip_prefix(prefix.as_bytes())?.strip_prefix(b"{")?;
    let (lock, part) = match rest.iter().position(|&b| b == 0xff) {
        Some(at) => {
            let helper = &rest[at + 1..];
            let part = if helper.starts_with(b"r/") {
                Part::Share
            } else if helper.starts_with(b"q/") {
                Part::Place
            } else if helper.starts_with(b"w/") {
                Part::Claim
            } else if helper == b"fence" {
                Part::Fence
            } else {
                return None;
            };
            (&rest[..at], part)
        }
        None => (rest, Part::Holder),
    };
    let key = std::str::from_utf8(lock.strip_suffix(b"}")?).ok()?;
    Some((key, part))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Holder,
    Share,
    Place,
    Claim,
    Fence,
}

impl Etcd {
    async fn connect(endpoints: &[String], prefix: &str, timeout: Duration) -> Result<Etcd, Error> {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout);
        let client = match tokio::time::timeout(timeout, Client::connect(endpoints, Some(options))).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(Error::Failed(format!("etcd: cannot connect: {e}"))),
            Err(_) => return Err(Error::Failed(format!("etcd: no connection within {timeout:?}"))),
        };
        Ok(Etcd {
            client,
            prefix: prefix.to_owned(),
            timeout,
        })
    }

    async fn within<T>(
        &self,
        what: &str,
        request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.timeout, request).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(Error::Failed(format!("etcd: {what}: {e}"))),
            Err(_) => Err(Error::Failed(format!(
                "etcd: {what}: no answer within {:?}",
                self.timeout
            ))),
        }
    }

    /// Every lock of the prefix whose key matches `pattern` (a glob), free ones too (those with
    /// only a fence key, or waiters).
    async fn rows(&self, pattern: &str) -> Result<Vec<LockView>, Error> {
        let mut kv = self.client.kv_client();
        let read = self
            .within(
                "reading the locks",
                kv.get(self.prefix.as_str(), Some(GetOptions::new().with_prefix())),
            )
            .await?;
        let read_at = Instant::now();
        let mut locks: BTreeMap<String, Keys> = BTreeMap::new();
        for kv in read.kvs() {
            let Some((key, part)) = split(&self.prefix, kv.key()) else {
                continue;
            };
            if !glob_match(pattern, key) {
                continue;
            }
            let value = String::from_utf8_lossy(kv.value()).into_owned();
            let lock = locks.entry(key.to_owned()).or_default();
            match part {
                Part::Holder => lock.holder = Some((value, kv.lease())),
                Part::Share => lock.shares.push((value, kv.lease())),
                Part::Place => lock.places += 1,
                Part::Claim => lock.claims += 1,
                Part::Fence => lock.fence = u64::try_from(kv.mod_revision()).ok(),
            }
        }
        let mut views = Vec::with_capacity(locks.len());
        for (key, keys) in locks {
            views.push(self.view(key, keys, read_at).await?);
        }
        Ok(views)
    }

    /// A lease's remaining life (whole seconds, as etcd keeps it).
    async fn left(&self, lease: i64) -> Result<Option<u64>, Error> {
        if lease == 0 {
            return Ok(None);
        }
        let mut leases = self.client.lease_client();
        let left = self
            .within("reading a lease", leases.time_to_live(lease, None))
            .await?;
        Ok(u64::try_from(left.ttl()).ok().map(|s| s * 1000))
    }

    async fn view(&self, key: String, keys: Keys, read_at: Instant) -> Result<LockView, Error> {
        let (holding, ttl_ms) = match keys.holder {
            Some((value, lease)) => (inspect::parse_value(&value), self.left(lease).await?),
            None if !keys.shares.is_empty() => {
                let mut readers = Vec::with_capacity(keys.shares.len());
                for (value, lease) in keys.shares {
                    readers.push(Reader {
                        owner: inspect::owner_of(&value).unwrap_or_default().to_owned(),
                        ttl_ms: self.left(lease).await?.unwrap_or(0),
                        value,
                    });
                }
                readers.sort_by(|a, b| a.value.cmp(&b.value));
                let ttl = readers.iter().map(|r| r.ttl_ms).max();
                (Holding::Shared { readers }, ttl)
            }
            None => (Holding::Free, None),
        };
        Ok(LockView {
            lock_key: LockKeys::new(&self.prefix, &key).lock().to_owned(),
            key,
            holding,
            ttl_ms,
            fence: keys.fence.map_or(Fence::None, Fence::Token),
            fair_waiters: keys.places,
            waiting_writers: keys.claims,
            read_at,
        })
    }

    async fn held(&self, pattern: &str) -> Result<Vec<LockView>, Error> {
        let views = self.rows(pattern).await?;
        Ok(views.into_iter().filter(|v| v.holding != Holding::Free).collect())
    }

    async fn read_one(&self, key: &str) -> Result<LockView, Error> {
        let found = self.rows(&inspect::glob_escape(key)).await?;
        Ok(found.into_iter().next().unwrap_or_else(|| LockView {
            key: key.to_owned(),
            lock_key: LockKeys::new(&self.prefix, key).lock().to_owned(),
            holding: Holding::Free,
            ttl_ms: None,
            fence: Fence::None,
            fair_waiters: 0,
            waiting_writers: 0,
            read_at: Instant::now(),
        }))
    }

    /// Frees the lock `view` describes if its keys still hold that.
    async fn compare_and_delete(&self, view: &LockView) -> Result<release::Deleted, Error> {
        let lock = LockKeys::new(&self.prefix, &view.key).lock().to_owned();
        let mut kv = self.client.kv_client();
        // The keys and leases to free, read again: a deletion compares each with what was shown.
        let now = self
            .within(
                "reading the lock",
                kv.get(lock.as_str(), Some(GetOptions::new().with_prefix())),
            )
            .await?;
        let wanted: Vec<(Vec<u8>, String, i64)> = now
            .kvs()
            .iter()
            .filter_map(|kv| {
                let name = kv.key();
                let (key, part) = split(&self.prefix, name)?;
                let value = String::from_utf8_lossy(kv.value()).into_owned();
                let shown = match (&view.holding, part) {
                    (Holding::Exclusive { value: shown, .. }, Part::Holder) => *shown == value,
                    (Holding::Shared { readers }, Part::Share) => readers.iter().any(|r| r.value == value),
                    _ => false,
                };
                (key == view.key && shown).then(|| (name.to_vec(), value, kv.lease()))
            })
            .collect();
        if wanted.is_empty() {
            let again = self.read_one(&view.key).await?;
            return Ok(if again.holding == Holding::Free {
                release::Deleted::Gone
            } else {
                release::Deleted::ChangedHands
            });
        }
        let compares: Vec<Compare> = wanted
            .iter()
            .flat_map(|(name, value, lease)| {
                [
                    Compare::value(name.clone(), CompareOp::Equal, value.as_str()),
                    Compare::lease(name.clone(), CompareOp::Equal, *lease),
                ]
            })
            .collect();
        let deletes: Vec<TxnOp> = wanted
            .iter()
            .map(|(name, _, _)| TxnOp::delete(name.clone(), None))
            .collect();
        let deleted = self
            .within(
                "releasing the lock",
                kv.txn(Txn::new().when(compares).and_then(deletes)),
            )
            .await?;
        if !deleted.succeeded() {
            return Ok(release::Deleted::ChangedHands);
        }
        let mut leases = self.client.lease_client();
        for (_, _, lease) in wanted.iter().filter(|(_, _, lease)| *lease != 0) {
            // Best effort: the keys are gone already; a lease that ended meanwhile is no error.
            let _ = tokio::time::timeout(self.timeout, leases.revoke(*lease)).await;
        }
        Ok(release::Deleted::Yes)
    }
}

impl release::Locks for &Etcd {
    async fn read_one(&mut self, key: &str) -> Result<LockView, Error> {
        Etcd::read_one(self, key).await
    }

    async fn compare_and_delete(&mut self, view: &LockView) -> Result<release::Deleted, Error> {
        Etcd::compare_and_delete(self, view).await
    }
}

/// Runs `command` against the etcd store at `endpoints`.
pub(crate) async fn run(
    command: Command,
    endpoints: &[String],
    prefix: &str,
    timeout: Duration,
    out: &mut Out,
) -> Result<(), Error> {
    let etcd = Etcd::connect(endpoints, prefix, timeout).await?;
    match command {
        Command::List { pattern } => {
            let views = etcd.held(&pattern).await?;
            out.list(&pattern, &views)
        }
        Command::Show { key } => {
            inspect::check_key(&key)?;
            let view = etcd.read_one(&key).await?;
            out.show(&view)
        }
        Command::Release { key, yes, .. } => {
            inspect::check_key(&key)?;
            release::release_from(&mut &etcd, &key, yes, out).await
        }
        Command::Watch {
            pattern,
            interval_ms,
            for_ms,
        } => {
            let plan = Plan {
                pattern,
                interval: Duration::from_millis(interval_ms),
                stop_after: for_ms.map(Duration::from_millis),
            };
            watch_keys(&etcd, &plan, out).await
        }
    }
}

/// `watch`: a look every interval, and one at once when a key under the prefix changes.
async fn watch_keys(etcd: &Etcd, plan: &Plan, out: &mut Out) -> Result<(), Error> {
    let mut seen = look(etcd, &plan.pattern).await?;
    let mut watcher = etcd.client.watch_client();
    let mut changes = etcd
        .within(
            "watching the locks",
            watcher.watch(etcd.prefix.as_str(), Some(WatchOptions::new().with_prefix())),
        )
        .await?;
    eprintln!(
        "lockctl: watching locks matching {} ({} held now; a look every {} ms); Ctrl-C to stop",
        plan.pattern,
        seen.len(),
        plan.interval.as_millis()
    );
    let stop = watch::stop_after(plan.stop_after);
    tokio::pin!(stop);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + plan.interval, plan.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let changed = tokio::select! {
            () = &mut stop => return Ok(()),
            signal = &mut ctrl_c => {
                return signal.map_err(|e| Error::Failed(format!("cannot listen for Ctrl-C: {e}")));
            }
            _ = ticks.tick() => true,
            heard = changes.message() => match heard {
                Ok(Some(response)) => response.events().iter().any(|event| {
                    event.kv().and_then(|kv| split(&etcd.prefix, kv.key()))
                        .is_some_and(|(key, _)| glob_match(&plan.pattern, key))
                }),
                Ok(None) => return Err(Error::Failed("etcd: the watch ended".to_owned())),
                Err(e) => return Err(Error::Failed(format!("etcd: watching the locks: {e}"))),
            },
        };
        if changed {
            let now = look(etcd, &plan.pattern).await?;
            watch::print(out, watch::changes(&seen, &now))?;
            seen = now;
        }
    }
}

/// The locks held now whose keys match `pattern`.
async fn look(etcd: &Etcd, pattern: &str) -> Result<watch::Seen, Error> {
    let views = etcd.held(pattern).await?;
    Ok(views
        .into_iter()
        .map(|v| (v.key.clone(), v))
        .collect::<BTreeMap<_, _>>())
}

/// Whether `text` matches a Redis-style glob: `*`, `?`, `[abc]`, `[^a]`, `[a-z]`, `\x`.
pub(crate) fn glob_match(glob: &str, text: &str) -> bool {
    let (glob, text): (Vec<char>, Vec<char>) = (glob.chars().collect(), text.chars().collect());
    matches_from(&glob, &text)
}

fn matches_from(glob: &[char], text: &[char]) -> bool {
    match glob.first() {
        None => text.is_empty(),
        Some('*') => (0..=text.len()).any(|skip| matches_from(&glob[1..], &text[skip..])),
        Some('?') => !text.is_empty() && matches_from(&glob[1..], &text[1..]),
        Some('[') => {
            let Some(close) = glob.iter().skip(2).position(|&c| c == ']').map(|p| p + 2) else {
                return text.first() == Some(&'[') && matches_from(&glob[1..], &text[1..]);
            };
            let Some(&c) = text.first() else { return false };
            let (negated, set) = match glob[1] {
                '^' => (true, &glob[2..close]),
                _ => (false, &glob[1..close]),
            };
            let mut hit = false;
            let mut i = 0;
            while i < set.len() {
                if i + 2 < set.len() && set[i + 1] == '-' {
                    hit |= set[i] <= c && c <= set[i + 2];
                    i += 3;
                } else {
                    hit |= set[i] == c;
                    i += 1;
                }
            }
            hit != negated && matches_from(&glob[close + 1..], &text[1..])
        }
        Some('\\') if glob.len() > 1 => {
            text.first() == Some(&glob[1]) && matches_from(&glob[2..], &text[1..])
        }
        Some(&c) => text.first() == Some(&c) && matches_from(&glob[1..], &text[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::{glob_match, split, Part};

    #[test]
    fn globs_match_as_redis_matches_them() {
        assert!(glob_match("*", "order:7"));
        assert!(glob_match("order:*", "order:7"));
        assert!(!glob_match("order:*", "job:7"));
        assert!(glob_match("a?c", "abc"));
        assert!(glob_match("job.[ab]", "job.b"));
        assert!(!glob_match("job.[^ab]", "job.b"));
        assert!(glob_match("[a-c]x", "bx"));
        assert!(glob_match("lit\\*", "lit*"));
        assert!(!glob_match("lit\\*", "lits"));
    }

    #[test]
    fn the_keys_of_a_lock_are_told_apart() {
        fn part(name: &[u8]) -> Option<(&str, Part)> {
            split("lock:", name)
        }
        assert_eq!(part(b"lock:{order:7}"), Some(("order:7", Part::Holder)));
        assert_eq!(part(b"lock:{order:7}\xffr/t1"), Some(("order:7", Part::Share)));
        assert_eq!(part(b"lock:{order:7}\xffq/t1"), Some(("order:7", Part::Place)));
        assert_eq!(part(b"lock:{order:7}\xffw/t1"), Some(("order:7", Part::Claim)));
        assert_eq!(part(b"lock:{order:7}\xfffence"), Some(("order:7", Part::Fence)));
        assert_eq!(part(b"lock:{a}:r/x}"), Some(("a}:r/x", Part::Holder)));
        assert_eq!(part(b"other:{order:7}"), None);
        assert_eq!(part(b"lock:{order:7}\xfffencex"), None);
    }
}
