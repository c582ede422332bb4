//! What operators read and do on the etcd store (`lock_runtime::admin`, `lockctl`), and what
//! `holder` reads: every key of a lock (its places in line, the last fenced writer's token),
//! read in one request so a lock is seen at one revision; the holders are the oldest place (a
//! writer) or the readers before the oldest writer, or a semaphore's permit keys. A forced
//! release deletes the holders' places (or permits) in one transaction comparing each with what
//! was seen (its value and create revision): the holders' renewals find them gone, and the
//! waiters behind hear the deletion.
//! No lease is revoked: a session lease holds its client's other locks too.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp};
use tokio::time::Instant;

use super::names::{split, Part};
use super::EtcdStore;
use crate::store::{ForceReleased, Lock, StoreAdmin};
use crate::view::{glob_escape, glob_matches, Fence, Holding, LockView, Reader, RELEASED};
use crate::LockError;

/// A place in line as read: its create revision, whether a writer's, the key-value.
type Seen = (i64, bool, KeyValue);

/// What one lock's keys hold, as read.
#[derive(Default)]
struct Keys {
    /// Its places in line.
    line: Vec<Seen>,
    fence: Option<i64>,
    /// A semaphore's permits held: its count, the permit, the key-value.
    permits: Vec<(u32, u32, KeyValue)>,
    /// How many wait for a semaphore's permit.
    queued: usize,
}

impl Keys {
    /// The holders (the oldest writer, or the readers before the oldest writer) and the
    /// waiters, in line order.
    fn split(&mut self) -> (Vec<&Seen>, Vec<&Seen>) {
        self.line.sort_by_key(|(created, _, _)| *created);
        let first_writer = self.line.iter().position(|(_, writer, _)| *writer);
        let holding = match first_writer {
            Some(0) => 1,
            Some(at) => at,
            None => self.line.len(),
        };
        let (holders, waiters) = self.line.split_at(holding);
        (holders.iter().collect(), waiters.iter().collect())
    }
}

impl EtcdStore {
    /// The user's key and what kind of key of its lock `name` is.
    fn split<'a>(&self, name: &'a [u8]) -> Option<(&'a str, Part<'a>)> {
        let rest = name.strip_prefix(self.prefix.as_bytes())?.strip_prefix(b"{")?;
        let at = rest.iter().position(|&b| b == 0xff)?;
        let part = split(&rest[at + 1..])?;
        let key = std::str::from_utf8(rest[..at].strip_suffix(b"}")?).ok()?;
        Some((key, part))
    }

    /// Every key under `from` (the prefix, or one lock's name).
    async fn read(&self, from: &str) -> Result<Vec<KeyValue>, LockError> {
        let from = from.to_owned();
        let read = self
            .pool()
            .ask(|client| {
                let from = from.clone();
                async move {
                    client
                        .kv_client()
                        .get(from, Some(GetOptions::new().with_prefix()))
                        .await
                }
            })
            .await?;
        Ok(read.kvs().to_vec())
    }

    /// Every lock whose key matches `pattern` (a glob), read under `from` (the prefix, or one
    /// lock's name), free ones too (those with only a fence key).
    async fn rows(&self, from: &str, pattern: &str) -> Result<Vec<LockView>, LockError> {
        let read = self.read(from).await?;
        let read_at = Instant::now();
        let mut locks: BTreeMap<String, Keys> = BTreeMap::new();
        for kv in read {
            let Some((key, part)) = self.split(kv.key()) else {
                continue;
            };
            if !glob_matches(pattern, key) {
                continue;
            }
            let lock = locks.entry(key.to_owned()).or_default();
            match part {
                Part::Writer(_) => lock.line.push((kv.create_revision(), true, kv)),
                Part::Reader(_) => lock.line.push((kv.create_revision(), false, kv)),
                Part::Fence => lock.fence = Some(super::fence_of(&kv)),
                Part::Permit { count, permit } => lock.permits.push((count, permit, kv)),
                Part::Queued(_) => lock.queued += 1,
            }
        }
        let mut views = Vec::with_capacity(locks.len());
        for (key, keys) in locks {
            views.push(self.view(key, keys, read_at).await?);
        }
        Ok(views)
    }

    /// What is left of `kv`'s lock: its lease's remaining whole seconds, or when this client
    /// holds it, until this client deletes it (no later than its session is kept).
    async fn remaining(&self, kv: &KeyValue) -> Result<Duration, LockError> {
        let value = String::from_utf8_lossy(kv.value());
        let token = value.strip_suffix(RELEASED).unwrap_or(&value);
        let now = Instant::now();
        let ours = self
            .shared
            .book
            .places()
            .get(token)
            .filter(|p| p.created == kv.create_revision())
            .and_then(|p| p.until);
        if let Some(until) = ours {
            if let Some(session) = self.shared.sessions.by_id(kv.lease()) {
                return Ok(until.min(session.kept_until).saturating_duration_since(now));
            }
        }
        let left = match kv.lease() {
            0 => None,
            lease => self.pool().time_to_live(lease).await?,
        };
        let left = left.unwrap_or_default();
        Ok(ours.map_or(left, |until| left.min(until.saturating_duration_since(now))))
    }

    async fn view(&self, key: String, mut keys: Keys, read_at: Instant) -> Result<LockView, LockError> {
        let name = super::Store::name(self, &key);
        if let Some(&(count, _, _)) = keys.permits.first() {
            // A semaphore: each permit held, with its holder (and the newest permit's token).
            let mut holders = Vec::with_capacity(keys.permits.len());
            for (_, permit, kv) in &keys.permits {
                let left = self.remaining(kv).await?;
                holders.push(Reader::of_permit(
                    &String::from_utf8_lossy(kv.value()),
                    *permit,
                    left,
                ));
            }
            let newest = keys.permits.iter().map(|(_, _, kv)| kv.create_revision()).max();
            let holding = Holding::permits(count, holders);
            return Ok(LockView {
                key,
                name,
                remaining: holding.longest_share(),
                holding,
                fence: Fence::counter(newest),
                queued: u64::try_from(keys.queued).unwrap_or(u64::MAX),
                writers: 0,
                read_at,
            });
        }
        let fence_kept = keys.fence;
        let (holders, waiters) = keys.split();
        let waiting_writers = waiters.iter().filter(|(_, writer, _)| *writer).count();
        let (remaining, holding, fence) = match holders.as_slice() {
            [] => (None, Holding::Free, fence_kept),
            [(created, true, kv)] => (
                Some(self.remaining(kv).await?),
                Holding::of_value(kv.value()),
                Some(*created),
            ),
            readers => {
                let mut shares = Vec::with_capacity(readers.len());
                for (_, _, kv) in readers {
                    let left = self.remaining(kv).await?;
                    shares.push(Reader::of(&String::from_utf8_lossy(kv.value()), left));
                }
                let holding = Holding::shared(shares);
                (holding.longest_share(), holding, fence_kept)
            }
        };
        let shared = matches!(holding, Holding::Shared { .. });
        Ok(LockView {
            key,
            name,
            holding,
            remaining,
            fence: Fence::counter(fence),
            queued: u64::try_from(waiters.len()).unwrap_or(u64::MAX),
            writers: if shared {
                u64::try_from(waiting_writers).unwrap_or(u64::MAX)
            } else {
                0
            },
            read_at,
        })
    }
}

impl StoreAdmin for EtcdStore {
    /// What `lock` holds now.
    async fn inspect(&self, lock: &Lock) -> Result<LockView, LockError> {
        let found = self.rows(lock.name(), &glob_escape(lock.key())).await?;
        Ok(found
            .into_iter()
            .next()
            .unwrap_or_else(|| LockView::free(lock.key(), lock.name())))
    }

    /// The locks held now whose keys match `pattern`.
    async fn list(&self, pattern: &str) -> Result<Vec<LockView>, LockError> {
        let views = self.rows(&self.prefix, pattern).await?;
        Ok(views.into_iter().filter(LockView::is_held).collect())
    }

    /// Frees `lock` if its holders are still the ones `seen` shows.
    async fn force_release(&self, lock: &Lock, seen: &LockView) -> Result<ForceReleased, LockError> {
        let mut keys = Keys::default();
        for kv in self.read(lock.name()).await? {
            match self.split(kv.key()) {
                Some((key, Part::Permit { count, permit })) if key == lock.key() => {
                    keys.permits.push((count, permit, kv));
                }
                Some((key, Part::Writer(_))) if key == lock.key() => {
                    keys.line.push((kv.create_revision(), true, kv))
                }
                Some((key, Part::Reader(_))) if key == lock.key() => {
                    keys.line.push((kv.create_revision(), false, kv))
                }
                _ => {}
            }
        }
        let permits: Vec<Seen> = std::mem::take(&mut keys.permits)
            .into_iter()
            .map(|(_, _, kv)| (kv.create_revision(), true, kv))
            .collect();
        let (mut holders, _) = keys.split();
        holders.extend(permits.iter());
        if holders.is_empty() {
            return Ok(ForceReleased::Gone);
        }
        if !holders
            .iter()
            .all(|(_, _, kv)| seen.holding.shows(&String::from_utf8_lossy(kv.value())))
        {
            return Ok(ForceReleased::Changed);
        }
        // In transactions of at most etcd's operations (a semaphore may have more holders).
        let mut freed = true;
        for chunk in holders.chunks(super::MAX_TXN_OPS) {
            let compares: Vec<Compare> = chunk
                .iter()
                .map(|(created, _, kv)| {
                    Compare::create_revision(kv.key().to_vec(), CompareOp::Equal, *created)
                })
                .collect();
            let deletes: Vec<TxnOp> = chunk
                .iter()
                .map(|(_, _, kv)| TxnOp::delete(kv.key().to_vec(), None))
                .collect();
            let deleted = self
                .pool()
                .txn(Txn::new().when(compares).and_then(deletes))
                .await?;
            freed &= deleted.succeeded();
        }
        Ok(if freed {
            ForceReleased::Freed
        } else {
            ForceReleased::Changed
        })
    }
}
