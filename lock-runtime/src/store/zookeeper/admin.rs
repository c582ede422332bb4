//! What operators read and do on the ZooKeeper store (`lock_runtime::admin`, `lockctl`), and
//! what `holder` reads: the children of a lock's node (its line, or a semaphore's claims), the
//! holders' data (their tokens; Curator writes the host's address) and the token the last
//! fenced writer left. What a
//! holder has left is known for this client's own locks (until it deletes them); another
//! client's node lasts as long as its session, which ZooKeeper does not show: its remaining
//! time is not given. A forced release deletes the holders' nodes seen (node names are unique
//! per acquisition, so a node deleted is the one seen): their holders' renewals find them gone,
//! and the waiters behind hear the deletions.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use futures_util::future::join_all;
use tokio::time::Instant;
use zookeeper_client::Error as ZkError;

use super::names::{self, Child, Permits};
use super::requests::ask;
use super::{ZkStore, PROBE_TTL_MS};
use crate::store::{ForceReleased, Lock, StoreAdmin};
use crate::view::{glob_matches, Fence, Holding, LockView, Reader, RELEASED};
use crate::LockError;

/// One holder's node, as read.
struct Held {
    data: Vec<u8>,
    czxid: i64,
    /// A semaphore's claim: the permit it holds.
    permit: Option<u32>,
}

/// A lock's line as read: its nodes in line, its holders' nodes, the token the last fenced
/// writer left, and for a semaphore its count and how many queue.
struct Read {
    line: Vec<Child>,
    found: Vec<(String, Held)>,
    left: Option<i64>,
    permits: Option<(u32, usize)>,
}

impl ZkStore {
    /// The line of `lock` read now (behind a `sync`, with the token the last fenced writer
    /// left: one request, as a waiter's look), and its holders' nodes that are still there.
    async fn read_line(&self, lock: &str) -> Result<Read, LockError> {
        let session = self.session(PROBE_TTL_MS).await?;
        let looked = self.look(&session, lock, true, true).await?;
        let line = names::line(&looked.children);
        let claims = Permits::of(&looked.children);
        // A semaphore's holders are its claims that hold; a lock's, the head of its line.
        let permits = claims.holding.first().map(|c| (c.count, claims.queue.len()));
        let holders: Vec<(String, Option<u32>)> = match permits {
            Some(_) => claims
                .holding
                .iter()
                .map(|c| (c.name.clone(), Some(c.permit)))
                .collect(),
            None => names::holders(&line)
                .iter()
                .map(|c| (c.name.clone(), None))
                .collect(),
        };
        let reads = join_all(holders.iter().map(|(name, _)| {
            ask(
                self.ensemble(),
                session.client.get_data(&format!("{lock}/{name}")),
            )
        }))
        .await;
        let mut found = Vec::with_capacity(holders.len());
        for ((name, permit), read) in holders.into_iter().zip(reads) {
            match read? {
                Ok((data, stat)) => found.push((
                    name,
                    Held {
                        data,
                        czxid: stat.czxid,
                        permit,
                    },
                )),
                Err(ZkError::NoNode) => {} // gone meanwhile
                Err(e) => return Err(self.error(&e, lock)),
            }
        }
        Ok(Read {
            line,
            found,
            left: looked.left_fence,
            permits,
        })
    }

    /// What is left of this client's node with `czxid` (`None`: not this client's).
    fn remaining_of(&self, czxid: i64) -> Option<std::time::Duration> {
        let now = Instant::now();
        self.shared
            .book
            .places()
            .values()
            .find(|p| p.czxid == czxid)
            .and_then(|p| p.until)
            .map(|until| until.saturating_duration_since(now))
    }

    async fn view(&self, key: &str, lock: &str) -> Result<LockView, LockError> {
        let Read {
            line,
            found,
            left,
            permits,
        } = self.read_line(lock).await?;
        let read_at = Instant::now();
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        if let Some((permits, queued)) = permits {
            let holders: Vec<Reader> = found
                .iter()
                .map(|(_, held)| {
                    let left = self.remaining_of(held.czxid).unwrap_or_default();
                    let value = String::from_utf8_lossy(&held.data);
                    Reader::of_permit(&value, held.permit.unwrap_or_default(), left)
                })
                .collect();
            let remaining = found.iter().filter_map(|(_, h)| self.remaining_of(h.czxid)).max();
            let newest = found.iter().map(|(_, h)| h.czxid).max();
            return Ok(LockView {
                key: key.to_owned(),
                name: lock.to_owned(),
                holding: Holding::permits(permits, holders),
                remaining,
                fence: Fence::counter(newest),
                queued: count(queued),
                writers: 0,
                read_at,
            });
        }
        let waiting = &line[names::holders(&line).len()..];
        let exclusive = |name: &str| line.iter().any(|c| c.name == name && !c.shared);
        let (holding, remaining, fence) = match found.as_slice() {
            [] => (Holding::Free, None, left),
            [(name, held)] if exclusive(name) => (
                Holding::of_value(&held.data),
                self.remaining_of(held.czxid),
                Some(held.czxid),
            ),
            readers => {
                let shares: Vec<Reader> = readers
                    .iter()
                    .map(|(_, held)| {
                        let left = self.remaining_of(held.czxid).unwrap_or_default();
                        Reader::of(&String::from_utf8_lossy(&held.data), left)
                    })
                    .collect();
                let remaining = readers
                    .iter()
                    .filter_map(|(_, h)| self.remaining_of(h.czxid))
                    .max();
                (Holding::shared(shares), remaining, left)
            }
        };
        let shared = matches!(holding, Holding::Shared { .. });
        Ok(LockView {
            key: key.to_owned(),
            name: lock.to_owned(),
            holding,
            remaining,
            fence: Fence::counter(fence),
            queued: count(waiting.len()),
            writers: if shared {
                count(waiting.iter().filter(|c| !c.shared).count())
            } else {
                0
            },
            read_at,
        })
    }
}

impl StoreAdmin for ZkStore {
    /// What `lock` holds now.
    async fn inspect(&self, lock: &Lock) -> Result<LockView, LockError> {
        self.view(lock.key(), lock.name()).await
    }

    /// The locks held now whose keys match `pattern`.
    async fn list(&self, pattern: &str) -> Result<Vec<LockView>, LockError> {
        let session = self.session(PROBE_TTL_MS).await?;
        let nodes = match ask(self.ensemble(), session.client.list_children(&self.parent)).await? {
            Ok(nodes) => nodes,
            Err(ZkError::NoNode) => Vec::new(),
            Err(e) => return Err(self.error(&e, &self.parent)),
        };
        let mut keys: Vec<(String, String)> = nodes
            .iter()
            .filter_map(|node| names::key_of(node).map(|key| (key, format!("{}/{node}", self.parent))))
            .filter(|(key, _)| glob_matches(pattern, key))
            .collect();
        keys.sort();
        let mut views = Vec::with_capacity(keys.len());
        for (key, lock) in keys {
            let view = self.view(&key, &lock).await?;
            if view.is_held() {
                views.push(view);
            }
        }
        Ok(views)
    }

    /// Frees `lock` if its holders are still the ones `seen` shows.
    async fn force_release(&self, lock: &Lock, seen: &LockView) -> Result<ForceReleased, LockError> {
        let Read { found, .. } = self.read_line(lock.name()).await?;
        if found.is_empty() {
            return Ok(ForceReleased::Gone);
        }
        let shown = |held: &Held| seen.holding.shows(&String::from_utf8_lossy(&held.data));
        if !found.iter().all(|(_, held)| shown(held)) {
            return Ok(ForceReleased::Changed);
        }
        let session = self.session(PROBE_TTL_MS).await?;
        let mut freed = false;
        for (name, held) in &found {
            let path = format!("{}/{name}", lock.name());
            match ask(self.ensemble(), session.client.delete(&path, None)).await? {
                Ok(()) => freed = true,
                Err(ZkError::NoNode) => {}
                Err(e) => return Err(self.error(&e, &path)),
            }
            // This client's own lock: its records go too.
            let token = String::from_utf8_lossy(&held.data);
            let token = token.strip_suffix(RELEASED).unwrap_or(&token);
            if self
                .shared
                .book
                .places()
                .get(token)
                .is_some_and(|p| p.czxid == held.czxid)
            {
                self.shared.book.forget(token);
            }
        }
        Ok(if freed {
            ForceReleased::Freed
        } else {
            ForceReleased::Gone
        })
    }
}
