//! What operators read and do on the etcd store (`lock_runtime::admin`, `lockctl`), and what
//! `holder` reads: every key of a lock (the holder, past a 0xff byte the readers' shares `r/…`,
//! fair waiters `q/…`, waiting writers `w/…` and the last fenced writer's `fence`), read in one
//! request so a lock is seen at one revision; and a forced release that deletes the holder's
//! keys in one transaction comparing each with what was seen (its value and lease), then revokes
//! their leases, so the holder's renewals find them gone and waiters hear the deletion.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp};
use tokio::time::Instant;

use super::{EtcdStore, RELEASED};
use crate::store::{ForceReleased, Lock};
use crate::view::{glob_escape, glob_matches, Fence, Holding, LockView, Reader};
use crate::LockError;

/// What kind of key of its lock a key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Holder,
    Share,
    Place,
    Claim,
    Fence,
}

/// What one lock's keys hold, as read.
#[derive(Default)]
struct Keys {
    holder: Option<KeyValue>,
    shares: Vec<KeyValue>,
    places: u64,
    claims: u64,
    fence: Option<u64>,
}

impl EtcdStore {
    /// The user's key and what kind of key of its lock `name` is.
    fn split<'a>(&self, name: &'a [u8]) -> Option<(&'a str, Part)> {
        let rest = name.strip_prefix(self.prefix.as_bytes())?.strip_prefix(b"{")?;
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

    /// Every lock whose key matches `pattern` (a glob), read under `from` (the prefix, or one
    /// lock's key), free ones too (those with only a fence key, or waiters).
    async fn rows(&self, from: &str, pattern: &str) -> Result<Vec<LockView>, LockError> {
        let from = from.to_owned();
        let read = self
            .pool
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
        let read_at = Instant::now();
        let mut locks: BTreeMap<String, Keys> = BTreeMap::new();
        for kv in read.kvs() {
            let Some((key, part)) = self.split(kv.key()) else {
                continue;
            };
            if !glob_matches(pattern, key) {
                continue;
            }
            let lock = locks.entry(key.to_owned()).or_default();
            match part {
                Part::Holder => lock.holder = Some(kv.clone()),
                Part::Share => lock.shares.push(kv.clone()),
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

    /// What is left of `kv`'s lock: its lease's remaining whole seconds, or less when this
    /// client holds it and ends it sooner (see `Lease::valid_until`).
    async fn remaining(&self, kv: &KeyValue) -> Result<Option<Duration>, LockError> {
        if kv.lease() == 0 {
            return Ok(None);
        }
        let Some(left) = self.pool.time_to_live(kv.lease()).await? else {
            return Ok(None);
        };
        let value = String::from_utf8_lossy(kv.value());
        let token = value.strip_suffix(RELEASED).unwrap_or(&value);
        let ours = self
            .leases()
            .get(token)
            .filter(|ours| ours.holds(kv))
            .map(|ours| ours.valid_until.saturating_duration_since(Instant::now()));
        Ok(Some(ours.map_or(left, |ours| ours.min(left))))
    }

    async fn view(&self, key: String, keys: Keys, read_at: Instant) -> Result<LockView, LockError> {
        let name = super::Store::name(self, &key);
        let (holding, remaining) = match keys.holder {
            Some(kv) => (Holding::of_value(kv.value()), self.remaining(&kv).await?),
            None if !keys.shares.is_empty() => {
                let mut readers = Vec::with_capacity(keys.shares.len());
                for kv in &keys.shares {
                    let left = self.remaining(kv).await?.unwrap_or_default();
                    readers.push(Reader::of(&String::from_utf8_lossy(kv.value()), left));
                }
                let remaining = readers.iter().map(|r| r.remaining).max();
                (Holding::shared(readers), remaining)
            }
            None => (Holding::Free, None),
        };
        Ok(LockView {
            key,
            name,
            holding,
            remaining,
            fence: keys.fence.map_or(Fence::None, Fence::Token),
            queued: keys.places,
            writers: keys.claims,
            read_at,
        })
    }

    /// The locks held now whose keys match `pattern`.
    pub(super) async fn held(&self, pattern: &str) -> Result<Vec<LockView>, LockError> {
        let views = self.rows(&self.prefix, pattern).await?;
        Ok(views.into_iter().filter(LockView::is_held).collect())
    }

    /// What `lock` holds now.
    pub(super) async fn read_one(&self, lock: &Lock) -> Result<LockView, LockError> {
        let found = self.rows(lock.name(), &glob_escape(lock.key())).await?;
        Ok(found
            .into_iter()
            .next()
            .unwrap_or_else(|| LockView::free(lock.key(), lock.name())))
    }

    /// Frees `lock` if its keys still hold what `seen` shows.
    pub(super) async fn force(&self, lock: &Lock, seen: &LockView) -> Result<ForceReleased, LockError> {
        let from = lock.name().to_owned();
        // The keys and leases to free, read again: the deletion compares each with what was seen.
        let now = self
            .pool
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
        let wanted: Vec<(Vec<u8>, Vec<u8>, i64)> = now
            .kvs()
            .iter()
            .filter_map(|kv| {
                let (key, part) = self.split(kv.key())?;
                let value = String::from_utf8_lossy(kv.value());
                let shown = match (&seen.holding, part) {
                    (Holding::Exclusive { value: shown, .. }, Part::Holder) => *shown == value,
                    (Holding::Shared { readers }, Part::Share) => readers.iter().any(|r| r.value == value),
                    _ => false,
                };
                (key == lock.key() && shown).then(|| (kv.key().to_vec(), kv.value().to_vec(), kv.lease()))
            })
            .collect();
        if wanted.is_empty() {
            let again = self.read_one(lock).await?;
            return Ok(if again.is_held() {
                ForceReleased::Changed
            } else {
                ForceReleased::Gone
            });
        }
        let compares: Vec<Compare> = wanted
            .iter()
            .flat_map(|(name, value, lease)| {
                [
                    Compare::value(name.clone(), CompareOp::Equal, value.clone()),
                    Compare::lease(name.clone(), CompareOp::Equal, *lease),
                ]
            })
            .collect();
        let deletes: Vec<TxnOp> = wanted
            .iter()
            .map(|(name, _, _)| TxnOp::delete(name.clone(), None))
            .collect();
        let deleted = self.pool.txn(Txn::new().when(compares).and_then(deletes)).await?;
        if !deleted.succeeded() {
            return Ok(ForceReleased::Changed);
        }
        for (_, _, lease) in wanted.iter().filter(|(_, _, lease)| *lease != 0) {
            // Best effort: the keys are gone already; a lease that ended meanwhile is no error.
            let _ = self.pool.revoke(*lease).await;
        }
        Ok(ForceReleased::Freed)
    }
}
