//! The one watch stream of an etcd client: a watch per lock this client's waiters wait for,
//! started by the first of them (from a snapshot of the lock's keys, so no change after it is
//! missed) and cancelled a second after the last one stopped waiting (a lock in steady
//! contention keeps its watch).
//!
//! Each watch keeps a mirror of its lock (held or not, how many shares and claims, the fair line
//! in revision order), so a change wakes the one waiter it concerns: a release wakes the head of
//! the line (which may be another client's: then none of ours), or without a line the head of
//! this client's queue; a share's release only once the last share has gone. A broken stream
//! wakes every waiter to re-check its lock, and the next to wait watches again.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use etcd_client::{Event, EventType, GetOptions, WatchOptions, WatchResponse, WatchStream};
use tokio::sync::{mpsc, oneshot};

use super::names::{Names, Part};
use super::pool::{self, Pool};
use crate::background::Background;
use crate::store::Notices;

/// A waiter's request to hear of the releases of the lock named `name`; `done` is answered once
/// it does.
#[derive(Debug)]
struct Request {
    name: String,
    done: oneshot::Sender<()>,
}

/// The watch task and how to reach it.
#[derive(Debug)]
pub(super) struct Watcher {
    task: Background,
    requests: Mutex<Option<mpsc::UnboundedSender<Request>>>,
    /// Locks nobody waits on any more (from [`unlisten`](Self::unlisten)).
    idle: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<String>>>,
    idle_tx: mpsc::UnboundedSender<String>,
}

impl Watcher {
    pub(super) fn new() -> Self {
        let (idle_tx, idle) = mpsc::unbounded_channel();
        Watcher {
            task: Background::default(),
            requests: Mutex::new(None),
            idle: Arc::new(tokio::sync::Mutex::new(idle)),
            idle_tx,
        }
    }

    /// Nobody of this client waits for lock `name` any more: its watch lingers, then goes.
    pub(super) fn unlisten(&self, name: &str) {
        let _ = self.idle_tx.send(name.to_owned());
    }

    fn slot(&self) -> MutexGuard<'_, Option<mpsc::UnboundedSender<Request>>> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Completes once releases of the lock named `name` reach its waiters (or never, when etcd
    /// cannot be reached: the caller bounds the wait).
    pub(super) async fn watch(&self, pool: &Arc<Pool>, notices: &Notices, name: &str) {
        let (done, watching) = oneshot::channel();
        {
            let mut slot = self.slot();
            if !self.task.is_running() || slot.is_none() {
                let (requests, received) = mpsc::unbounded_channel();
                *slot = Some(requests);
                let notices = notices.clone();
                let idle = Arc::clone(&self.idle);
                let pool = Arc::clone(pool);
                self.task.replace(move || run(pool, notices, received, idle));
            }
            let request = Request {
                name: name.to_owned(),
                done,
            };
            if let Some(requests) = slot.as_ref() {
                // The task only ends with its runtime or the client: the waiter naps then.
                let _ = requests.send(request);
            }
        }
        let _ = watching.await;
    }

    pub(super) fn stop(&self) {
        self.task.stop();
        *self.slot() = None;
    }
}

/// What a watch has seen of its lock.
#[derive(Debug)]
struct Mirror {
    name: String,
    names: Names,
    held: bool,
    shares: usize,
    claims: usize,
    /// The fair line: each place's create revision and token.
    line: BTreeMap<i64, Vec<u8>>,
}

impl Mirror {
    fn new(name: &str) -> Self {
        Mirror {
            name: name.to_owned(),
            names: Names::for_lock(name),
            held: false,
            shares: 0,
            claims: 0,
            line: BTreeMap::new(),
        }
    }

    /// A key that exists (from the snapshot, or put since): `created` for its first version.
    fn put(&mut self, key: &[u8], created: bool, create_revision: i64) {
        match self.names.classify(key) {
            Some(Part::Holder) => self.held = true,
            Some(Part::Share(_)) if created => self.shares += 1,
            Some(Part::Claim(_)) if created => self.claims += 1,
            Some(Part::Place(token)) if created => {
                self.line.insert(create_revision, token.to_vec());
            }
            _ => {}
        }
    }

    /// A key deleted (released, expired, revoked): wakes whom it lets in.
    fn deleted(&mut self, key: &[u8], notices: &Notices) {
        match self.names.classify(key) {
            Some(Part::Holder) => {
                self.held = false;
                if self.shares == 0 {
                    self.wake_next(notices);
                }
            }
            Some(Part::Share(_)) => {
                self.shares = self.shares.saturating_sub(1);
                if self.shares == 0 && !self.held {
                    self.wake_next(notices);
                }
            }
            Some(Part::Claim(_)) => {
                self.claims = self.claims.saturating_sub(1);
                if self.claims == 0 && !self.held {
                    // Readers held back by the claims may enter.
                    notices.released(&self.name);
                }
            }
            Some(Part::Place(token)) => {
                let was_head = self.line.values().next().is_some_and(|head| head == token);
                self.line.retain(|_, place| place != token);
                if was_head && !self.held && self.shares == 0 {
                    self.wake_next(notices);
                }
            }
            None => {}
        }
    }

    /// The lock is free: the head of the line's turn, or without a line this client's next.
    fn wake_next(&self, notices: &Notices) {
        match self.line.values().next() {
            Some(head) => notices.turn(&self.name, head, None),
            None => notices.released(&self.name),
        }
    }

    fn seen(&mut self, event: &Event, notices: &Notices) {
        let Some(kv) = event.kv() else { return };
        match event.event_type() {
            EventType::Put => self.put(kv.key(), kv.version() == 1, kv.create_revision()),
            EventType::Delete => self.deleted(kv.key(), notices),
        }
    }
}

/// A watch asked for, not yet confirmed by etcd.
#[derive(Debug)]
struct Pending {
    mirror: Mirror,
    done: Vec<oneshot::Sender<()>>,
}

/// The stream and its watches.
#[derive(Debug, Default)]
struct Watches {
    /// The stream, and the pin of the member it went to.
    stream: Option<(WatchStream, usize)>,
    /// Confirmed watches, by watch id.
    by_id: HashMap<i64, Mirror>,
    /// Each watched lock's watch id.
    by_name: HashMap<String, i64>,
    /// Asked for, in order (etcd confirms them in that order).
    pending: VecDeque<Pending>,
    /// Watches nobody waits on, kept for [`LINGER`] since when they went idle: the next waiter
    /// on the same lock (a lock in steady contention has one at once) finds it watched.
    idle: HashMap<String, Instant>,
}

/// How long a watch nobody waits on is kept before it is cancelled.
const LINGER: Duration = Duration::from_secs(1);

impl Watches {
    async fn add(&mut self, pool: &Pool, request: Request, notices: &Notices) {
        let Request { name, done } = request;
        if self.by_name.contains_key(&name) {
            // Still watched (it lingered): its mirror is up to date.
            self.idle.remove(&name);
            notices.confirmed(&name);
            let _ = done.send(());
            return;
        }
        if let Some(pending) = self.pending.iter_mut().find(|p| p.mirror.name == name) {
            pending.done.push(done);
            return;
        }
        let lock = name.as_str();
        // What the lock's keys are now, then every change after.
        let snapshot = pool
            .ask(|client| async move {
                let keys = GetOptions::new().with_prefix().with_keys_only();
                client.kv_client().get(lock, Some(keys)).await
            })
            .await;
        let snapshot = match snapshot {
            Ok(snapshot) => snapshot,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read a lock to watch it");
                return;
            }
        };
        let mut mirror = Mirror::new(lock);
        for kv in snapshot.kvs() {
            mirror.put(kv.key(), true, kv.create_revision());
        }
        let after = snapshot.header().map_or(0, |h| h.revision()) + 1;
        let options = WatchOptions::new().with_prefix().with_start_revision(after);
        let sent = match self.stream.as_mut() {
            Some((stream, _)) => stream.watch(lock, Some(options)).await.map_err(pool::store_error),
            None => match pool.pinned().await {
                Ok((at, client)) => match client.watch_client().watch(lock, Some(options)).await {
                    Ok(stream) => {
                        self.stream = Some((stream, at));
                        Ok(())
                    }
                    Err(e) => {
                        pool.unpin(at);
                        Err(pool::store_error(e))
                    }
                },
                Err(e) => Err(e),
            },
        };
        match sent {
            Ok(()) => self.pending.push_back(Pending {
                mirror,
                done: vec![done],
            }),
            Err(e) => {
                tracing::debug!(error = %e, "cannot watch a lock for its release");
                self.broken(pool, notices);
            }
        }
    }

    /// Nobody waits on lock `name` any more: its watch lingers, then goes.
    fn went_idle(&mut self, name: String) {
        if self.by_name.contains_key(&name) {
            self.idle.insert(name, Instant::now());
        }
    }

    /// Cancels the watches that have lingered long enough.
    async fn sweep(&mut self, notices: &Notices) {
        let now = Instant::now();
        let done: Vec<String> = self
            .idle
            .iter()
            .filter(|(_, since)| now.duration_since(**since) >= LINGER)
            .map(|(name, _)| name.clone())
            .collect();
        for name in done {
            self.idle.remove(&name);
            self.remove(&name, notices).await;
        }
    }

    /// Cancels lock `name`'s watch unless a waiter came back meanwhile.
    async fn remove(&mut self, name: &str, notices: &Notices) {
        if notices.is_wanted(name) {
            return; // a waiter came back meanwhile
        }
        if let Some(id) = self.by_name.remove(name) {
            self.by_id.remove(&id);
            if let Some((stream, _)) = self.stream.as_mut() {
                let _ = stream.cancel(id).await;
            }
        }
    }

    async fn answer(&mut self, response: WatchResponse, notices: &Notices) {
        let id = response.watch_id();
        if response.created() {
            if let Some(pending) = self.pending.pop_front() {
                let name = pending.mirror.name.clone();
                // Free at the snapshot: a waiter that went to sleep before the watch began
                // (one behind in line) would hear of no release; the one whose turn it is asks.
                if !pending.mirror.held && pending.mirror.shares == 0 {
                    pending.mirror.wake_next(notices);
                }
                self.by_name.insert(name.clone(), id);
                self.by_id.insert(id, pending.mirror);
                notices.confirmed(&name);
                for done in pending.done {
                    let _ = done.send(());
                }
                if !notices.is_wanted(&name) {
                    self.went_idle(name);
                }
            }
        }
        if response.canceled() {
            // Compacted past its start, or refused: its waiters re-check, and watch again.
            if let Some(mirror) = self.by_id.remove(&id) {
                self.by_name.remove(&mirror.name);
                notices.lost(&mirror.name);
            }
            return;
        }
        if let Some(mirror) = self.by_id.get_mut(&id) {
            for event in response.events() {
                mirror.seen(event, notices);
            }
        }
    }

    /// The stream broke: every waiter re-checks its lock (a release may have gone unheard), and
    /// the next to wait watches again.
    fn broken(&mut self, pool: &Pool, notices: &Notices) {
        if let Some((_, at)) = self.stream.take() {
            pool.unpin(at);
        }
        *self = Watches::default();
        notices.lost_all();
    }
}

async fn next(
    stream: &mut Option<(WatchStream, usize)>,
) -> Result<Option<WatchResponse>, etcd_client::Error> {
    match stream.as_mut() {
        Some((stream, _)) => stream.message().await,
        None => std::future::pending().await,
    }
}

/// Serves requests and hands on what the stream says, until the task is aborted (with its
/// client) or its runtime ends.
async fn run(
    pool: Arc<Pool>,
    notices: Notices,
    mut requests: mpsc::UnboundedReceiver<Request>,
    idle: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<String>>>,
) {
    let mut idle = idle.lock().await;
    let mut watches = Watches::default();
    let mut sweeps = tokio::time::interval(LINGER);
    sweeps.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = sweeps.tick() => watches.sweep(&notices).await,
            request = requests.recv() => match request {
                Some(request) => watches.add(&pool, request, &notices).await,
                None => return,
            },
            Some(name) = idle.recv() => watches.went_idle(name),
            answer = next(&mut watches.stream) => match answer {
                Ok(Some(response)) => watches.answer(response, &notices).await,
                Ok(None) => watches.broken(&pool, &notices),
                Err(e) => {
                    tracing::debug!(error = %e, "the lock release watch broke");
                    watches.broken(&pool, &notices);
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wakeups::{Registration, Wakeups};
    use futures_util::FutureExt;

    fn is_woken(waiter: &Registration) -> bool {
        waiter.woken().now_or_never().is_some()
    }

    #[test]
    fn a_release_wakes_the_head_of_the_line_and_the_last_share_a_writer() {
        let wakeups = Wakeups::new();
        let notices = wakeups.notices();
        let mut mirror = Mirror::new("lock:{k}");
        let first = wakeups.register("lock:{k}", Some("a"));
        let second = wakeups.register("lock:{k}", Some("b"));
        mirror.put(b"lock:{k}", true, 10);
        mirror.put(b"lock:{k}\xffq/b", true, 12);
        mirror.put(b"lock:{k}\xffq/a", true, 11);
        mirror.deleted(b"lock:{k}", &notices);
        // "a" came first: its turn, not "b"'s.
        assert!(is_woken(&first));
        assert!(!is_woken(&second));
        // "a" takes it: its place goes while the lock is held, which wakes nobody.
        mirror.put(b"lock:{k}", true, 13);
        mirror.deleted(b"lock:{k}\xffq/a", &notices);
        assert!(!is_woken(&second));
        mirror.deleted(b"lock:{k}", &notices);
        assert!(is_woken(&second));
        drop((first, second));

        let writer = wakeups.register("lock:{k}", None);
        mirror.line.clear();
        mirror.put(b"lock:{k}\xffr/x", true, 20);
        mirror.put(b"lock:{k}\xffr/y", true, 21);
        mirror.put(b"lock:{k}\xffr/y", false, 21); // a share moved to another lease
        mirror.deleted(b"lock:{k}\xffr/x", &notices);
        assert!(!is_woken(&writer), "a reader still shares it");
        mirror.deleted(b"lock:{k}\xffr/y", &notices);
        assert!(is_woken(&writer));
    }
}
