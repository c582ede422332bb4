//! A process-local store with the semantics of the Redis one, on tokio's clock (so tests of
//! user code may pause and advance time). Locks are named `<prefix><key>`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::{
    Ask, Asked, Attempt, Capabilities, Flight, ForceReleased, Kind, Lock, Notices, Release, Released,
    Renewal, Renewing, Store, StoreAdmin,
};
use crate::options::{ceil_millis, FAIR_PLACE_KEPT};
use crate::view::{glob_matches, Fence, Holding, LockView, Reader, RELEASED};
use crate::wakeups::HandedOver;
use crate::LockError;

#[derive(Debug)]
struct Held {
    token: String,
    expires_at: Instant,
}

/// The shared holders of a read-write lock: each reader's token and when its share expires.
#[derive(Debug, Default)]
struct Shares {
    readers: HashMap<String, Instant>,
}

impl Shares {
    /// When the last share ends.
    fn last(&self) -> Option<Instant> {
        self.readers.values().max().copied()
    }
}

/// The name a fair semaphore's line of `lock` is kept under among the queues: its own, not a
/// fair lock's (neither's release meets the other's waiters).
fn permits_line(lock: &str) -> String {
    format!("{lock}#permits")
}

/// The permits of a semaphore that are taken: its count, and each holder's permit and lease.
#[derive(Debug)]
struct Permits {
    permits: u32,
    /// By token.
    holders: HashMap<String, PermitHeld>,
}

#[derive(Debug)]
struct PermitHeld {
    permit: u32,
    expires_at: Instant,
    fence: Option<u64>,
    /// Given back and kept until its minimum hold ends: not renewed, and a second release stands.
    released: bool,
}

#[derive(Debug, Default)]
struct Table {
    /// Semaphores with a permit taken, by lock key (a key is here or in `locks`/`shares`).
    semaphores: HashMap<String, Permits>,
    locks: HashMap<String, Held>,
    /// Read-write locks held by readers, by lock key (a key is in `locks` or here, never both).
    shares: HashMap<String, Shares>,
    /// Writers waiting for readers to leave, by lock key: each one's token and when its claim
    /// lapses. No new reader enters while one stands.
    claims: HashMap<String, HashMap<String, Instant>>,
    /// Fencing counters: the last token and when the counter expires (as fence.lua's, an hour
    /// after its last token, or the lease if longer). A key's first token is 1.
    fences: HashMap<String, (u64, Instant)>,
    /// Fair queues, by lock name.
    queues: HashMap<String, Queue>,
    /// Orders arrivals in every queue.
    arrivals: u64,
    /// Names each keeping of a fair place (as acquire.lua's `kept`).
    stamps: u64,
    /// Acquires since the last sweep of what expired, and how many entries that sweep kept: the
    /// next sweep comes after as many acquires again (at least [`SWEEP_AFTER`]), so sweeping
    /// costs O(1) per acquire and nothing expired outlives long what Redis would keep.
    since_sweep: usize,
    kept_by_sweep: usize,
    /// The highest token of every counter that expired: a counter made anew starts above it,
    /// so a key's tokens rise across its counter's expiry (as fence.lua floors them by the
    /// server's clock).
    expired_tokens: u64,
}

/// The fewest acquires between two sweeps.
const SWEEP_AFTER: usize = 1024;

/// How long a fencing counter outlives its last token, at least (fence.lua's hour).
const FENCE_KEPT: Duration = Duration::from_secs(3600);

/// Fair waiters of one lock: tokens by arrival, and when each one's place lapses.
#[derive(Debug, Default)]
struct Queue {
    order: BTreeMap<u64, String>,
    /// Per waiter: its arrival, until when its place is kept, and the stamp of the attempt
    /// that kept it.
    places: HashMap<String, (u64, Instant, u64)>,
}

impl Queue {
    /// Drops waiters whose place lapsed; whether any did.
    fn purge(&mut self, now: Instant) -> bool {
        let before = self.places.len();
        let order = &mut self.order;
        self.places.retain(|_, (arrival, kept, _)| {
            let keep = *kept > now;
            if !keep {
                order.remove(arrival);
            }
            keep
        });
        self.places.len() != before
    }

    fn head(&self) -> Option<&String> {
        self.order.values().next()
    }

    fn leave(&mut self, token: &str) {
        if let Some((arrival, _, _)) = self.places.remove(token) {
            self.order.remove(&arrival);
        }
    }
}

impl Table {
    /// The live holder of `key`; an expired one is removed on the way, as Redis would.
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Held> {
        if self.locks.get(key).is_some_and(|h| h.expires_at <= now) {
            self.locks.remove(key);
        }
        self.locks.get_mut(key)
    }

    fn ours(&mut self, key: &str, token: &str, now: Instant) -> Option<&mut Held> {
        self.live(key, now).filter(|h| h.token == token)
    }

    /// The live readers of `key`; expired shares go on the way, and the entry with the last.
    fn readers(&mut self, key: &str, now: Instant) -> Option<&mut Shares> {
        if let Some(shares) = self.shares.get_mut(key) {
            shares.readers.retain(|_, expires_at| *expires_at > now);
            if shares.readers.is_empty() {
                self.shares.remove(key);
            }
        }
        self.shares.get_mut(key)
    }

    /// The semaphore at `key` with its live holders; lapsed ones go on the way, and the entry
    /// with the last.
    fn permits(&mut self, key: &str, now: Instant) -> Option<&mut Permits> {
        if let Some(permits) = self.semaphores.get_mut(key) {
            permits.holders.retain(|_, held| held.expires_at > now);
            if permits.holders.is_empty() {
                self.semaphores.remove(key);
            }
        }
        self.semaphores.get_mut(key)
    }

    /// The count a key is held with now, when anyone holds it: a lock or read-write lock has 1.
    fn held_count(&mut self, key: &str, now: Instant) -> Option<u32> {
        if self.live(key, now).is_some() || self.readers(key, now).is_some() {
            return Some(1);
        }
        self.permits(key, now).map(|p| p.permits)
    }

    /// When the latest standing claim of a waiting writer on `key` lapses, if one stands.
    fn claimed_until(&mut self, key: &str, now: Instant) -> Option<Instant> {
        let claims = self.claims.get_mut(key)?;
        claims.retain(|_, lapses| *lapses > now);
        let last = claims.values().max().copied();
        if last.is_none() {
            self.claims.remove(key);
        }
        last
    }

    /// The lock's last fencing token, 0 when it has no live counter.
    fn fence(&self, lock: &str, now: Instant) -> u64 {
        match self.fences.get(lock) {
            Some(&(fence, expires_at)) if expires_at > now => fence,
            _ => 0,
        }
    }

    /// Whether the lock has a live fencing counter.
    fn counted(&self, lock: &str, now: Instant) -> bool {
        self.fence(lock, now) > 0
    }

    /// Takes the key's next fencing token, for a lock held `lease` (the counter is kept at least
    /// that long after it).
    fn next_fence(&mut self, lock: &str, now: Instant, lease: Duration) -> u64 {
        let name = lock.to_owned();
        if let Some(&(expired, _)) = self.fences.get(&name).filter(|(_, at)| *at <= now) {
            self.fences.remove(&name);
            self.expired_tokens = self.expired_tokens.max(expired);
        }
        let last = self.fence(lock, now);
        let fence = (last + 1).max(self.expired_tokens + 1);
        let expires_at = now + lease.max(FENCE_KEPT) + Duration::from_secs(1);
        self.fences.insert(name, (fence, expires_at));
        fence
    }

    /// Every so often, drops what expired: locks, shares, claims, fair lines and counters that
    /// nobody touched since (each is also dropped when it is next looked at).
    fn sweep(&mut self, now: Instant) {
        self.since_sweep += 1;
        if self.since_sweep < self.kept_by_sweep.max(SWEEP_AFTER) {
            return;
        }
        self.since_sweep = 0;
        self.locks.retain(|_, held| held.expires_at > now);
        self.semaphores.retain(|_, permits| {
            permits.holders.retain(|_, held| held.expires_at > now);
            !permits.holders.is_empty()
        });
        self.shares.retain(|_, shares| {
            shares.readers.retain(|_, expires_at| *expires_at > now);
            !shares.readers.is_empty()
        });
        self.claims.retain(|_, claims| {
            claims.retain(|_, lapses| *lapses > now);
            !claims.is_empty()
        });
        self.queues.retain(|_, queue| {
            queue.purge(now);
            !queue.places.is_empty()
        });
        let mut expired_tokens = self.expired_tokens;
        self.fences.retain(|_, (fence, expires_at)| {
            let keep = *expires_at > now;
            if !keep {
                expired_tokens = expired_tokens.max(*fence);
            }
            keep
        });
        self.expired_tokens = expired_tokens;
        self.kept_by_sweep = self.semaphores.len()
            + self.locks.len()
            + self.shares.len()
            + self.claims.len()
            + self.queues.len()
            + self.fences.len();
    }

    /// How many entries the store keeps (for the sweep's test).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.len() + self.shares.len() + self.claims.len() + self.queues.len() + self.fences.len()
    }
}

fn ms_until(at: Instant, now: Instant) -> u64 {
    ceil_millis(at.saturating_duration_since(now))
}

#[derive(Debug)]
pub(crate) struct MemoryStore {
    store: Mutex<Table>,
    prefix: String,
    /// Releases wake waiters directly: there is nothing to listen on.
    notices: Notices,
}

impl MemoryStore {
    pub(crate) fn new(prefix: &str, notices: Notices) -> Self {
        MemoryStore {
            store: Mutex::default(),
            prefix: prefix.to_owned(),
            notices,
        }
    }

    fn store(&self) -> MutexGuard<'_, Table> {
        // Every update below is a single step, so a poisoned store is still consistent.
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn acquire(&self, lock: &str, token: &str, ask: &Ask) -> Result<Attempt, LockError> {
        if ask.mode.semaphore() {
            return self.take_permit(lock, token, ask);
        }
        if let Some(held) = self.store().permits(lock, Instant::now()).map(|p| p.permits) {
            return Err(super::permits_differ(self.key_of(lock), held, ask.mode.permits()));
        }
        if ask.mode.shared() {
            return Ok(self.share(lock, token, ask));
        }
        Ok(self.exclusive(lock, token, ask))
    }

    /// The user's key of the lock named `lock`.
    fn key_of<'a>(&self, lock: &'a str) -> &'a str {
        lock.strip_prefix(&self.prefix).unwrap_or(lock)
    }

    /// A permit of a semaphore: the lowest free one, as permit.lua takes it.
    fn take_permit(&self, lock: &str, token: &str, ask: &Ask) -> Result<Attempt, LockError> {
        let now = Instant::now();
        let lease = Duration::from_millis(ask.ttl_ms);
        let mut store = self.store();
        store.sweep(now);
        match store.held_count(lock, now) {
            Some(held) if held != ask.mode.permits() => {
                return Err(super::permits_differ(self.key_of(lock), held, ask.mode.permits()))
            }
            _ => {}
        }
        let permits = store
            .semaphores
            .entry(lock.to_owned())
            .or_insert_with(|| Permits {
                permits: ask.mode.permits(),
                holders: HashMap::new(),
            });
        if let Some(held) = permits.holders.get_mut(token).filter(|h| !h.released) {
            // Already ours (a request sent again): its lease counts from this attempt.
            held.expires_at = held.expires_at.max(now + lease);
            return Ok(Attempt::permit(held.fence, held.permit));
        }
        let taken: std::collections::HashSet<u32> = permits.holders.values().map(|h| h.permit).collect();
        let free = (0..permits.permits).find(|p| !taken.contains(p));
        let (free_count, first_end) = (
            permits.permits.saturating_sub(permits.holders.len() as u32),
            permits.holders.values().map(|h| h.expires_at).min(),
        );
        // A fair semaphore's waiters ahead of the caller in its line (as permit.lua's: its own,
        // not a fair lock's).
        let line = permits_line(lock);
        let ahead = match ask.mode.fair() {
            true => {
                let queue = store.queues.entry(line.clone()).or_default();
                queue.purge(now);
                match queue.places.get(token) {
                    Some((arrival, _, _)) => queue.order.range(..*arrival).count(),
                    None => queue.order.len(),
                }
            }
            false => 0,
        };
        let free = match free {
            Some(free) if ahead < free_count as usize => free,
            _ => {
                if ask.mode.fair() && ask.join {
                    let store = &mut *store;
                    let queue = store.queues.entry(line).or_default();
                    let kept = now + FAIR_PLACE_KEPT;
                    match queue.places.get_mut(token) {
                        Some(place) => place.1 = kept,
                        None => {
                            store.arrivals += 1;
                            queue.order.insert(store.arrivals, token.to_owned());
                            queue.places.insert(token.to_owned(), (store.arrivals, kept, 0));
                        }
                    }
                }
                return Ok(Attempt::no_permit(
                    first_end.map(|at| ms_until(at, now)),
                    u64::try_from(ahead).unwrap_or(u64::MAX),
                    ask.mode.permits(),
                ));
            }
        };
        if ask.mode.fair() {
            if let Some(queue) = store.queues.get_mut(&line) {
                queue.leave(token);
            }
        }
        let fence = ask.fencing.then(|| store.next_fence(lock, now, lease));
        let held = PermitHeld {
            permit: free,
            expires_at: now + lease,
            fence,
            released: false,
        };
        if let Some(permits) = store.semaphores.get_mut(lock) {
            permits.holders.insert(token.to_owned(), held);
        }
        Ok(Attempt::permit(fence, free))
    }

    /// An exclusive lock, fair or not (acquire.lua, fair.lua).
    fn exclusive(&self, lock: &str, token: &str, ask: &Ask) -> Attempt {
        let now = Instant::now();
        let lease = Duration::from_millis(ask.ttl_ms);
        let mut store = self.store();
        store.sweep(now);
        if let Some(held) = store.ours(lock, token, now) {
            // Already ours: a fair turn handed over by a release (as acquire.lua, its expiry
            // counts from this attempt, and without a counter then it takes its token now).
            held.expires_at = now + lease;
            let fence = ask.fencing.then(|| match store.fence(lock, now) {
                0 => store.next_fence(lock, now, lease),
                fence => fence,
            });
            return Attempt::acquired(fence);
        }
        // Someone else's: until when.
        let mut holder = store.live(lock, now).map(|h| h.expires_at);
        // Readers share it: a writer that will wait claims its turn, so no new reader enters.
        let mut claimed = false;
        if let Some(last) = store.readers(lock, now).and_then(|shares| shares.last()) {
            if ask.join {
                store
                    .claims
                    .entry(lock.to_owned())
                    .or_default()
                    .insert(token.to_owned(), now + FAIR_PLACE_KEPT);
                claimed = true;
            }
            holder = Some(last);
        }
        if ask.mode.fair() {
            let store = &mut *store;
            let queue = store.queues.entry(lock.to_owned()).or_default();
            let purged = queue.purge(now);
            let head = queue.head().cloned();
            if holder.is_some() || head.as_deref().is_some_and(|h| h != token) {
                let mut stamp = None;
                if ask.join {
                    let kept = now + FAIR_PLACE_KEPT;
                    store.stamps += 1;
                    stamp = Some(store.stamps);
                    match queue.places.get_mut(token) {
                        Some(place) => (place.1, place.2) = (kept, store.stamps),
                        None => {
                            store.arrivals += 1;
                            queue.order.insert(store.arrivals, token.to_owned());
                            queue
                                .places
                                .insert(token.to_owned(), (store.arrivals, kept, store.stamps));
                        }
                    }
                }
                if holder.is_none() && purged {
                    // The lock is free and the waiters ahead of the new head are gone.
                    if let Some(head) = head {
                        self.notices.turn(lock, head.as_bytes(), None);
                    }
                }
                let pttl_ms = holder.map(|expires_at| ms_until(expires_at, now));
                let behind = queue.order.values().next().is_some_and(|first| first != token)
                    && queue.places.contains_key(token);
                return Attempt::Held {
                    pttl_ms,
                    behind,
                    claimed,
                    kept: stamp,
                };
            }
            queue.leave(token);
        }
        if let Some(expires_at) = holder {
            return Attempt::Held {
                pttl_ms: Some(ms_until(expires_at, now)),
                behind: false,
                claimed,
                kept: None,
            };
        }
        if ask.claimed {
            if let Some(claims) = store.claims.get_mut(lock) {
                claims.remove(token);
            }
        }
        let fence = ask.fencing.then(|| store.next_fence(lock, now, lease));
        store.locks.insert(
            lock.to_owned(),
            Held {
                token: token.to_owned(),
                expires_at: now + Duration::from_millis(ask.ttl_ms),
            },
        );
        Attempt::acquired(fence)
    }

    /// A share of a read-write lock, as share.lua takes it.
    fn share(&self, lock: &str, token: &str, ask: &Ask) -> Attempt {
        let now = Instant::now();
        let mut store = self.store();
        store.sweep(now);
        let refused = |pttl_ms| Attempt::Held {
            pttl_ms: Some(pttl_ms),
            behind: false,
            claimed: false,
            kept: None,
        };
        if let Some(writer) = store.live(lock, now) {
            return refused(ms_until(writer.expires_at, now));
        }
        let ours = store
            .readers(lock, now)
            .is_some_and(|shares| shares.readers.contains_key(token));
        if !ours {
            if let Some(lapses) = store.claimed_until(lock, now) {
                return refused(ms_until(lapses, now));
            }
        }
        let fence = ask.fencing.then(|| store.fence(lock, now));
        store
            .shares
            .entry(lock.to_owned())
            .or_default()
            .readers
            .insert(token.to_owned(), now + Duration::from_millis(ask.ttl_ms));
        Attempt::acquired(fence)
    }

    pub(crate) fn leave_queue(&self, lock: &str, token: &str, claimed: bool) {
        let withdrawn = {
            let mut store = self.store();
            if let Some(queue) = store.queues.get_mut(lock) {
                queue.leave(token);
            }
            if let Some(queue) = store.queues.get_mut(&permits_line(lock)) {
                queue.leave(token);
            }
            store
                .claims
                .get_mut(lock)
                .and_then(|claims| claims.remove(token))
                .is_some()
        };
        if claimed && withdrawn {
            // Readers held back by the claim try again.
            self.notices.released(lock);
        }
    }

    pub(crate) fn renew(&self, lock: &str, token: &str, ttl_ms: u64) -> bool {
        let now = Instant::now();
        let expires_at = now + Duration::from_millis(ttl_ms);
        let mut store = self.store();
        // As renew.lua: a lease is only ever lengthened.
        if let Some(held) = store.ours(lock, token, now) {
            held.expires_at = held.expires_at.max(expires_at);
            return true;
        }
        if let Some(share) = store
            .readers(lock, now)
            .and_then(|shares| shares.readers.get_mut(token))
        {
            *share = (*share).max(expires_at);
            return true;
        }
        match store
            .permits(lock, now)
            .and_then(|p| p.holders.get_mut(token))
            .filter(|h| !h.released)
        {
            Some(held) => {
                held.expires_at = held.expires_at.max(expires_at);
                true
            }
            None => false,
        }
    }

    /// Gives a permit back (or keeps it for its minimum hold); `None` when `token` holds no
    /// permit of `lock`.
    fn release_permit(&self, lock: &str, token: &str, hold_ms: u64) -> Option<Released> {
        let now = Instant::now();
        let mut store = self.store();
        let permits = store.permits(lock, now)?;
        let held = permits.holders.get_mut(token)?;
        if hold_ms > 0 {
            if held.released {
                return Some(Released::Quiet);
            }
            held.released = true;
            held.expires_at = now + Duration::from_millis(hold_ms);
            // The client wakes its next waiter: one per permit given back.
            return Some(Released::Freed);
        }
        permits.holders.remove(token);
        let free = permits.permits as usize - permits.holders.len().min(permits.permits as usize);
        if permits.holders.is_empty() {
            store.semaphores.remove(lock);
        }
        // A fair semaphore's release names the waiter it admits (as release.lua's): with `free`
        // permits free, the waiters at ranks below `free` may take one, and those ahead of the
        // last were told by the releases before.
        let admitted = store.queues.get_mut(&permits_line(lock)).and_then(|queue| {
            queue.purge(now);
            queue.order.values().nth(free.checked_sub(1)?).cloned()
        });
        drop(store);
        match admitted {
            Some(waiter) => {
                self.notices.turn(lock, waiter.as_bytes(), None);
                Some(Released::Quiet)
            }
            // The client wakes its next waiter: one per permit given back.
            None => Some(Released::Freed),
        }
    }

    pub(crate) fn release(&self, lock: &str, token: &str, hold_ms: u64, fair: bool) -> Released {
        if let Some(released) = self.release_permit(lock, token, hold_ms) {
            return released;
        }
        let now = Instant::now();
        let next = {
            let mut store = self.store();
            // As in release.lua: a lock kept for its minimum hold is marked released, so a
            // renewal applied after the release cannot extend it; a second release stands.
            let kept = format!("{token}{RELEASED}");
            let held = store
                .live(lock, now)
                .filter(|h| h.token == token || h.token == kept);
            match held {
                Some(held) if hold_ms > 0 && held.token == kept => return Released::Quiet,
                Some(held) if hold_ms > 0 => {
                    held.token = kept;
                    held.expires_at = now + Duration::from_millis(hold_ms);
                }
                Some(_) => {
                    store.locks.remove(lock);
                }
                None => {
                    // A share of a read-write lock: the last one to go wakes a waiter.
                    let Some(shares) = store.readers(lock, now) else {
                        return Released::NotOurs;
                    };
                    if shares.readers.remove(token).is_none() {
                        return Released::NotOurs;
                    }
                    if !shares.readers.is_empty() {
                        return Released::Quiet;
                    }
                    store.shares.remove(lock);
                }
            }
            let freed = !store.locks.contains_key(lock);
            let store = &mut *store;
            let queue = if fair { store.queues.get_mut(lock) } else { None };
            let head = queue.and_then(|q| {
                q.purge(now);
                let head = q.head().cloned()?;
                let &(_, kept, stamp) = q.places.get(&head)?;
                Some((q, head, kept, stamp))
            });
            match head {
                // As release.lua: the lock goes to the head of the line until its place would
                // have lapsed, with a fencing token when the key has a counter.
                Some((queue, head, kept, stamp)) if freed => {
                    queue.leave(&head);
                    store.locks.insert(
                        lock.to_owned(),
                        Held {
                            token: head.clone(),
                            expires_at: kept,
                        },
                    );
                    let counted = store.counted(lock, now);
                    let lease = kept.saturating_duration_since(now);
                    let fence = if counted {
                        store.next_fence(lock, now, lease)
                    } else {
                        0
                    };
                    Some((
                        head,
                        Some(HandedOver {
                            fence,
                            kept: stamp,
                            permit: None,
                        }),
                    ))
                }
                Some((_, head, _, _)) => Some((head, None)),
                None => None,
            }
        };
        match next {
            Some((head, handed)) => {
                self.notices.turn(lock, head.as_bytes(), handed);
                Released::Quiet
            }
            // The client wakes its next waiter.
            None => Released::Freed,
        }
    }

    /// The lock as it is now.
    fn view(&self, key: &str, lock: &str) -> LockView {
        let now = Instant::now();
        let mut store = self.store();
        let mut view = LockView::free(key, lock);
        if let Some(held) = store.live(lock, now) {
            view.holding = Holding::of_value(held.token.as_bytes());
            view.remaining = Some(held.expires_at.saturating_duration_since(now));
        } else if let Some(shares) = store.readers(lock, now) {
            view.remaining = shares.last().map(|at| at.saturating_duration_since(now));
            let readers = shares
                .readers
                .iter()
                .map(|(token, at)| Reader::of(token, at.saturating_duration_since(now)))
                .collect();
            view.holding = Holding::shared(readers);
        } else if let Some(permits) = store.permits(lock, now) {
            view.remaining = permits
                .holders
                .values()
                .map(|h| h.expires_at.saturating_duration_since(now))
                .max();
            let holders = permits
                .holders
                .iter()
                .map(|(token, h)| {
                    let value = match h.released {
                        true => format!("{token}{RELEASED}"),
                        false => token.clone(),
                    };
                    Reader::of_permit(&value, h.permit, h.expires_at.saturating_duration_since(now))
                })
                .collect();
            view.holding = Holding::permits(permits.permits, holders);
        }
        view.fence = match store.fence(lock, now) {
            0 => Fence::None,
            token => Fence::Token(token),
        };
        if let Some(queue) = store.queues.get_mut(lock) {
            queue.purge(now);
            view.queued = queue.places.len() as u64;
        }
        view.writers = store
            .claims
            .get(lock)
            .map_or(0, |c| c.values().filter(|lapses| **lapses > now).count() as u64);
        view
    }

    /// The locks held now whose keys match `pattern`.
    fn held(&self, pattern: &str) -> Vec<LockView> {
        let now = Instant::now();
        let names: Vec<String> = {
            let store = self.store();
            let held = store
                .locks
                .iter()
                .filter(|(_, h)| h.expires_at > now)
                .map(|(n, _)| n);
            let shared = store
                .shares
                .iter()
                .filter(|(_, s)| s.last().is_some_and(|at| at > now))
                .map(|(n, _)| n);
            let semaphores = store
                .semaphores
                .iter()
                .filter(|(_, p)| p.holders.values().any(|h| h.expires_at > now))
                .map(|(n, _)| n);
            held.chain(shared).chain(semaphores).cloned().collect()
        };
        let mut views: Vec<LockView> = names
            .iter()
            .filter_map(|name| {
                let key = name.strip_prefix(&self.prefix)?;
                glob_matches(pattern, key).then(|| self.view(key, name))
            })
            .filter(LockView::is_held)
            .collect();
        views.sort_by(|a, b| a.key.cmp(&b.key));
        views
    }

    /// Frees the lock if it still holds what `seen` shows, and wakes a waiter.
    fn force(&self, lock: &str, seen: &LockView) -> ForceReleased {
        let now = Instant::now();
        let forced = {
            let mut store = self.store();
            let token = |value: &str| value.strip_suffix(RELEASED).unwrap_or(value).to_owned();
            // Whether what was seen is still there, and now given back.
            let freed = match &seen.holding {
                Holding::Free | Holding::Foreign { .. } => None,
                Holding::Exclusive { value, .. } => Some(
                    store
                        .live(lock, now)
                        .is_some_and(|held| token(&held.token) == token(value))
                        && store.locks.remove(lock).is_some(),
                ),
                Holding::Permits { .. } => {
                    Some(store.permits(lock, now).is_some() && store.semaphores.remove(lock).is_some())
                }
                Holding::Shared { .. } => {
                    Some(store.readers(lock, now).is_some() && store.shares.remove(lock).is_some())
                }
            };
            match freed {
                // Nothing of ours was seen there.
                None => ForceReleased::Gone,
                Some(true) => ForceReleased::Freed,
                Some(false) => ForceReleased::unless_held(store.held_count(lock, now).is_some()),
            }
        };
        if forced == ForceReleased::Freed {
            self.notices.released(lock);
        }
        forced
    }
}

/// Every call is answered when first polled (there is no request to wait for).
impl Store for MemoryStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::all("in-memory")
    }

    fn name(&self, key: &str) -> String {
        let mut name = String::with_capacity(self.prefix.len() + key.len());
        name.push_str(&self.prefix);
        name.push_str(key);
        name
    }

    async fn attempt(&self, asked: Asked<'_>, _: &Flight) -> Result<Attempt, crate::LockError> {
        self.acquire(asked.lock.name(), asked.token, asked.ask)
    }

    async fn renew(&self, locks: &[Renewing<'_>]) -> Result<Vec<Renewal>, crate::LockError> {
        Ok(locks
            .iter()
            .map(|(lock, token, ttl_ms)| {
                Renewal::from_ours(MemoryStore::renew(self, lock.name(), token, *ttl_ms))
            })
            .collect())
    }

    async fn release(
        &self,
        lock: &Lock,
        token: &str,
        release: Release<'_>,
    ) -> Result<Released, crate::LockError> {
        Ok(MemoryStore::release(
            self,
            lock.name(),
            token,
            release.hold_ms,
            release.kind == Kind::Fair,
        ))
    }

    async fn leave(&self, lock: &Lock, token: &str, claimed: bool) -> Result<(), crate::LockError> {
        self.leave_queue(lock.name(), token, claimed);
        Ok(())
    }
}

impl StoreAdmin for MemoryStore {
    async fn inspect(&self, lock: &Lock) -> Result<LockView, crate::LockError> {
        Ok(self.view(lock.key(), lock.name()))
    }

    async fn list(&self, pattern: &str) -> Result<Vec<LockView>, crate::LockError> {
        Ok(self.held(pattern))
    }

    async fn force_release(&self, lock: &Lock, seen: &LockView) -> Result<ForceReleased, crate::LockError> {
        Ok(self.force(lock.name(), seen))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(fencing: bool) -> Ask {
        Ask::once(100, fencing)
    }

    /// Issue 23: nothing a lock leaves behind outlives its expiry for long, however many keys
    /// are locked once and never again, and tokens still rise after a counter expired.
    #[tokio::test(start_paused = true)]
    async fn expired_locks_and_counters_are_swept_and_tokens_still_rise() {
        let memory = MemoryStore::new("lock:", crate::wakeups::Wakeups::new().notices());
        let first = "lock:first";
        let Attempt::Acquired {
            fence: Some(before), ..
        } = memory.acquire(first, "t0", &ask(true)).unwrap()
        else {
            panic!("not acquired");
        };
        for i in 0..3 * SWEEP_AFTER {
            let keys = format!("lock:k{i}");
            assert!(matches!(
                memory.acquire(&keys, "t", &ask(true)).unwrap(),
                Attempt::Acquired { .. }
            ));
        }
        assert!(memory.store().len() > 2 * SWEEP_AFTER);
        tokio::time::advance(FENCE_KEPT + Duration::from_secs(2)).await;
        // Swept within as many acquires as the last sweep kept entries (about 2 per key).
        let mut acquires = 0;
        while !memory.store().fences.is_empty() {
            acquires += 1;
            assert!(acquires <= 8 * SWEEP_AFTER, "not swept after {acquires} acquires");
            let keys = format!("lock:new{acquires}");
            assert!(matches!(
                memory.acquire(&keys, "t", &ask(false)).unwrap(),
                Attempt::Acquired { .. }
            ));
        }
        assert!(memory.store().len() <= acquires, "{}", memory.store().len());
        let Attempt::Acquired {
            fence: Some(after), ..
        } = memory.acquire(first, "t1", &ask(true)).unwrap()
        else {
            panic!("not acquired");
        };
        assert!(after > before, "{after} <= {before}");
    }
}
