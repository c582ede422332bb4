//! Local hand-off of "this lock was released" to the waiters of one client: one waiter per
//! release, in the order they began waiting.
//!
//! Each lock has a FIFO queue of this client's waiters. A release wakes only the head
//! of the queue, so a hand-off costs one acquire attempt per client, not one per waiter; the
//! head that fails (someone else barged in) stays at the head and sleeps again. A waiter leaving
//! the queue without the lock (it gave up, its wait ran out, it was cancelled) wakes the next
//! one in its place, so no wake-up is lost with it. A wake-up is a stored permit, so one that
//! arrives while the head is busy with an attempt is seen when it next sleeps.
//!
//! A waiter registers (and has the store listen for the lock's releases: on Redis, its channel
//! is subscribed) *before* the attempt it will wait after, so a release between that attempt and
//! the wait still reaches it. The last registration of a lock to go removes the entry and tells
//! the store nobody listens any more, so subscriptions never pile up.
//!
//! Stores tell the registry what they hear through [`Notices`], the one narrow way in: a
//! release, the next waiter's turn, and whether their listening for a lock is confirmed or was
//! lost.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::{mpsc, Notify};

/// The waiters of one lock.
#[derive(Debug)]
struct Line {
    /// This client's waiters, in the order they began waiting; the head is woken next.
    queue: VecDeque<Arc<Waiter>>,
    /// Those told of every release of the lock, waiting for nothing (an operator's watch): each
    /// one's id and where it hears the lock's name.
    watchers: Vec<(u64, mpsc::UnboundedSender<String>)>,
    /// Which listeners confirmed they listen for the lock's releases, one bit each (a RedLock
    /// client listens on every master; other stores have listener 0).
    confirmed: u64,
    /// Which listeners lost their listening since it was last confirmed: when one confirms it
    /// again, the head of the queue checks its lock once more (a release between its re-check at
    /// the loss and the new confirmation went unheard).
    relisten: u64,
    /// The lock is a semaphore's: each release frees one permit of several, so releases heard
    /// before the head had its turn wake the next waiters, one each (of a lock, the head
    /// alone: one holder at a time).
    spread: bool,
    /// Of a semaphore's line: releases heard while every waiter was already woken, whose
    /// attempts may all have been sent before them, so that the permits those releases freed
    /// may be seen by nobody. Each goes to the next waiter refused (which tries again at once)
    /// or, when a waiter leaves, to the next not woken yet.
    owed: usize,
    /// A waiter had its place in line, or an operator watched: the store may listen for the
    /// lock, and is told when nobody waits any more. (A fair waiter registered for its first
    /// attempt, which took the lock, never listened.)
    listened: bool,
}

impl Line {
    fn new() -> Line {
        Line {
            queue: VecDeque::new(),
            watchers: Vec::new(),
            confirmed: 0,
            relisten: 0,
            spread: false,
            owed: 0,
            listened: false,
        }
    }

    /// Nobody waits for the lock nor watches it.
    fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.watchers.is_empty()
    }

    fn tell_watchers(&self, name: &str) {
        for (_, to) in &self.watchers {
            // A watch that ended has dropped its receiver: it leaves with its `Watching`.
            let _ = to.send(name.to_owned());
        }
    }

    /// Listener `who` no longer listens: every waiter re-checks its lock (a release may have
    /// gone unheard), and the next one to wait has the store listen again.
    fn lost(&mut self, who: usize) {
        let bit = listener_bit(who);
        if self.confirmed & bit != 0 {
            self.confirmed &= !bit;
            self.relisten |= bit;
            for waiter in &self.queue {
                waiter.wake.notify_one();
            }
        }
    }
}

fn listener_bit(who: usize) -> u64 {
    1u64.checked_shl(u32::try_from(who).unwrap_or(u32::MAX))
        .unwrap_or(0)
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    /// A fair waiter's token: a fair release names the waiter whose turn it is.
    token: Option<String>,
    wake: Notify,
    /// Of a semaphore's line: woken, and the attempt after has not been refused: the next
    /// release wakes another waiter.
    pending: std::sync::atomic::AtomicBool,
    /// The waiter saw its wake-up ([`Registration::woken`]) and makes its attempt for it. One
    /// that leaves pending without having seen it (its attempt was sent before the release)
    /// passes it on: the permit that release freed may still be free.
    seen: std::sync::atomic::AtomicBool,
    /// A fair release handed this waiter the lock.
    handed: Mutex<Option<HandedOver>>,
    /// It has a place in line: counted by [`Wakeups::queued`] (a waiter registered before its
    /// first attempt has one only once that attempt was refused).
    in_line: std::sync::atomic::AtomicBool,
}

/// A fair release handed a waiter the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandedOver {
    /// The fencing token taken for it (0: none, the key has no counter).
    pub(crate) fence: u64,
    /// Which of the waiter's attempts kept the place it was handed over for (what that attempt
    /// was told, [`Attempt::Held`](crate::store::Attempt::Held)'s `kept`).
    pub(crate) kept: u64,
    /// For a semaphore's waiter, the permit handed over.
    pub(crate) permit: Option<u32>,
}

/// Told the name of a lock nobody of this client waits for any more.
type OnIdle = Box<dyn Fn(&str) + Send + Sync>;
/// Told of held locks, by token, that the store says are gone.
type OnLost = Box<dyn Fn(&[String]) + Send + Sync>;

/// This client's waiters, by the name of the lock they wait for.
#[derive(Default)]
pub(crate) struct Wakeups {
    lines: Mutex<HashMap<String, Line>>,
    /// How many waiters are registered: a release with nobody waiting skips the map.
    waiters: AtomicUsize,
    /// Set once, by the client, to tell its store (which may stop listening).
    on_idle: OnceLock<OnIdle>,
    /// Set once, by the client: told of locks the store says are gone.
    on_lost: OnceLock<OnLost>,
}

impl std::fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wakeups")
            .field("waiters", &self.waiters.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Wakeups {
    pub(crate) fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Who is told when nobody waits for a lock any more (set once; later calls are ignored).
    pub(crate) fn on_idle(&self, told: impl Fn(&str) + Send + Sync + 'static) {
        let _ = self.on_idle.set(Box::new(told));
    }

    /// Who is told of held locks (by token) the store says are gone (set once).
    pub(crate) fn on_lost(&self, told: impl Fn(&[String]) + Send + Sync + 'static) {
        let _ = self.on_lost.set(Box::new(told));
    }

    /// The way a store tells this registry what it hears (as listener 0).
    pub(crate) fn notices(self: &Arc<Self>) -> Notices {
        Notices {
            wakeups: Arc::clone(self),
            listener: 0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Line>> {
        // A panic while holding this lock leaves the map consistent (every update is one step).
        self.lines.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins the end of the queue of the lock named `name`; a fair waiter gives its token.
    pub(crate) fn register(self: &Arc<Self>, name: &str, token: Option<&str>) -> Registration {
        self.register_with(name, token, true)
    }

    /// [`register`](Self::register) before the attempt that takes the waiter's place in line
    /// (a store that queues every waiter): not counted as waiting until
    /// [`Registration::in_line`].
    pub(crate) fn register_early(self: &Arc<Self>, name: &str, token: &str) -> Registration {
        self.register_with(name, Some(token), false)
    }

    fn register_with(self: &Arc<Self>, name: &str, token: Option<&str>, in_line: bool) -> Registration {
        static IDS: AtomicU64 = AtomicU64::new(0);
        let waiter = Arc::new(Waiter {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            token: token.map(str::to_owned),
            wake: Notify::new(),
            pending: std::sync::atomic::AtomicBool::new(false),
            seen: std::sync::atomic::AtomicBool::new(false),
            handed: Mutex::new(None),
            in_line: std::sync::atomic::AtomicBool::new(in_line),
        });
        let mut lines = self.lock();
        let entry = lines.entry(name.to_owned()).or_insert_with(Line::new);
        entry.listened |= in_line;
        entry.queue.push_back(Arc::clone(&waiter));
        self.waiters.fetch_add(1, Ordering::SeqCst);
        Registration {
            waiter,
            name: name.to_owned(),
            owner: Arc::clone(self),
            acquired: false,
        }
    }

    /// How many of this client's waiters queue for the lock named `name`.
    pub(crate) fn queued(&self, name: &str) -> usize {
        if self.waiters.load(Ordering::SeqCst) == 0 {
            return 0; // every uncontended acquire asks: no lock then
        }
        self.lock().get(name).map_or(0, |c| {
            c.queue
                .iter()
                .filter(|w| w.in_line.load(Ordering::Relaxed))
                .count()
        })
    }

    #[cfg_attr(not(feature = "cli"), allow(dead_code))] // operators' watches (`admin`)
    /// Tells `to` the name of the lock named `name` at each release heard (a release, or a fair
    /// release naming the next waiter), until the returned value is dropped; the store listens
    /// for it as for a waiter.
    pub(crate) fn watch(self: &Arc<Self>, name: &str, to: mpsc::UnboundedSender<String>) -> Watching {
        static IDS: AtomicU64 = AtomicU64::new(0);
        let id = IDS.fetch_add(1, Ordering::Relaxed);
        let mut lines = self.lock();
        let line = lines.entry(name.to_owned()).or_insert_with(Line::new);
        line.listened = true;
        line.watchers.push((id, to));
        self.waiters.fetch_add(1, Ordering::SeqCst);
        Watching {
            id,
            name: name.to_owned(),
            owner: Arc::clone(self),
        }
    }

    /// A release of the lock named `name`: wakes the head of its queue (of a semaphore's line,
    /// the first waiter not woken yet; with every waiter woken, the release is owed: see
    /// [`Line::owed`]).
    pub(crate) fn released(&self, name: &str) {
        if self.waiters.load(Ordering::SeqCst) == 0 {
            return;
        }
        if let Some(line) = self.lock().get_mut(name) {
            let next = match line.spread {
                true => {
                    let next = line.queue.iter().find(|w| !w.pending.load(Ordering::SeqCst));
                    if next.is_none() && !line.queue.is_empty() {
                        line.owed = (line.owed + 1).min(line.queue.len());
                    }
                    next
                }
                false => line.queue.front(),
            };
            if let Some(next) = next {
                next.pending.store(true, Ordering::SeqCst);
                next.wake.notify_one();
            }
            line.tell_watchers(name);
        }
    }

    /// The lock named `name` is a semaphore's: see [`Line::spread`].
    pub(crate) fn spread(&self, name: &str) {
        if let Some(line) = self.lock().get_mut(name) {
            line.spread = true;
        }
    }

    /// A fair release named the waiter whose turn it is, and with `handed` handed it the lock:
    /// wakes it, if it is one of ours.
    fn turn(&self, name: &str, token: &[u8], handed: Option<HandedOver>) {
        let lines = self.lock();
        if let Some(line) = lines.get(name) {
            line.tell_watchers(name);
        }
        let named = lines.get(name).and_then(|c| {
            c.queue
                .iter()
                .find(|w| w.token.as_deref().map(str::as_bytes) == Some(token))
        });
        if let Some(waiter) = named {
            if handed.is_some() {
                *waiter.handed.lock().unwrap_or_else(|e| e.into_inner()) = handed;
            }
            waiter.wake.notify_one();
        }
    }

    /// A release of this client named the waiter it admits, and with `handed` handed it what it
    /// gave back: wakes it, if it is one of ours (the store's announcement of it, heard later,
    /// finds it gone or awake).
    pub(crate) fn admitted(&self, name: &str, token: &str, handed: Option<HandedOver>) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.turn(name, token.as_bytes(), handed);
        }
    }

    /// How many locks have local waiters.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn unregister(&self, name: &str, waiter: u64, acquired: bool) {
        let mut lines = self.lock();
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        let Some(entry) = lines.get_mut(name) else {
            return;
        };
        let was_head = entry.queue.front().is_some_and(|w| w.id == waiter);
        let pending = entry
            .queue
            .iter()
            .any(|w| w.id == waiter && w.pending.load(Ordering::SeqCst) && !w.seen.load(Ordering::SeqCst));
        entry.queue.retain(|w| w.id != waiter);
        if entry.is_idle() {
            let listened = entry.listened;
            lines.remove(name);
            drop(lines);
            if let (true, Some(told)) = (listened, self.on_idle.get()) {
                told(name);
            }
        } else if entry.spread {
            // A semaphore's: a wake-up it did not see, then each release owed, goes to the next
            // waiter not woken yet (the permits those releases freed may still be free).
            let mut passed = usize::from(pending) + entry.owed;
            for next in entry.queue.iter().filter(|w| !w.pending.load(Ordering::SeqCst)) {
                if passed == 0 {
                    break;
                }
                passed -= 1;
                next.pending.store(true, Ordering::SeqCst);
                next.wake.notify_one();
            }
            entry.owed = entry.owed.min(passed);
        } else if was_head && !acquired {
            // It may have taken a wake-up meant for the lock's next holder with it: the next
            // waiter tries in its place.
            if let Some(next) = entry.queue.front() {
                next.wake.notify_one();
            }
        }
    }
}

/// How a store tells this client's waiters what it hears: one listener's view of the
/// registry (a RedLock client has one listener per master; every other store, one).
#[derive(Debug, Clone)]
pub(crate) struct Notices {
    wakeups: Arc<Wakeups>,
    listener: usize,
}

impl Notices {
    /// The notices of listener `who` (0 to 63) of the same registry.
    pub(crate) fn listener(&self, who: usize) -> Notices {
        Notices {
            wakeups: Arc::clone(&self.wakeups),
            listener: who,
        }
    }

    /// The lock named `name` was released: the head of this client's queue for it tries.
    pub(crate) fn released(&self, name: &str) {
        self.wakeups.released(name);
    }

    /// A fair release named `token` as the next in line of `name`, and with `handed` handed it
    /// the lock: wakes that waiter, if it is this client's.
    pub(crate) fn turn(&self, name: &str, token: &[u8], handed: Option<HandedOver>) {
        self.wakeups.turn(name, token, handed);
    }

    /// The locks this client holds under `tokens` are gone (the session they were held on
    /// ended): each guard is told at once.
    #[cfg_attr(not(feature = "zookeeper"), allow(dead_code))] // told by the ZooKeeper store
    pub(crate) fn held_lost(&self, tokens: &[String]) {
        if let Some(told) = self.wakeups.on_lost.get() {
            told(tokens);
        }
    }

    /// This listener no longer hears anything (its connection was lost): every lock it listened
    /// for needs listening again, and its waiters re-check at once, since a release may have
    /// gone unheard. Locks it never listened for lost nothing, and are left asleep.
    pub(crate) fn lost_all(&self) {
        for entry in self.wakeups.lock().values_mut() {
            entry.lost(self.listener);
        }
    }

    /// This listener no longer hears the lock named `name` (a cluster slot moved away): its
    /// waiters re-check, and the next of them has the store listen again.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn lost(&self, name: &str) {
        if let Some(entry) = self.wakeups.lock().get_mut(name) {
            entry.lost(self.listener);
        }
    }

    /// Whether this listener confirmed it hears the lock named `name`.
    pub(crate) fn is_confirmed(&self, name: &str) -> bool {
        self.wakeups
            .lock()
            .get(name)
            .is_some_and(|c| c.confirmed & listener_bit(self.listener) != 0)
    }

    /// This listener hears the lock named `name` now; after a loss, the head of its queue checks
    /// its lock once more.
    pub(crate) fn confirmed(&self, name: &str) {
        if let Some(entry) = self.wakeups.lock().get_mut(name) {
            let bit = listener_bit(self.listener);
            entry.confirmed |= bit;
            entry.listened = true;
            if entry.relisten & bit != 0 {
                entry.relisten &= !bit;
                if let Some(head) = entry.queue.front() {
                    head.wake.notify_one();
                }
            }
        }
    }

    /// Whether any of this client's callers waits for any lock.
    pub(crate) fn anyone_waits(&self) -> bool {
        self.wakeups.len() > 0
    }

    /// Whether any of this client's callers waits for the lock named `name` (with its place in
    /// line: a fair waiter registered for its first attempt does not listen yet, and its line,
    /// if it goes without listening, tells the store nothing).
    pub(crate) fn is_wanted(&self, name: &str) -> bool {
        self.wakeups.lock().get(name).is_some_and(|line| line.listened)
    }
}

/// An operator's watch of one lock's releases ([`Wakeups::watch`]); dropping it ends it.
#[derive(Debug)]
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub(crate) struct Watching {
    id: u64,
    name: String,
    owner: Arc<Wakeups>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        let mut lines = self.owner.lock();
        self.owner.waiters.fetch_sub(1, Ordering::SeqCst);
        let Some(entry) = lines.get_mut(&self.name) else {
            return;
        };
        entry.watchers.retain(|(id, _)| *id != self.id);
        if entry.is_idle() {
            lines.remove(&self.name);
            drop(lines);
            if let Some(told) = self.owner.on_idle.get() {
                told(&self.name);
            }
        }
    }
}

/// One waiter's place in a lock's queue; dropping it leaves the queue.
#[derive(Debug)]
pub(crate) struct Registration {
    waiter: Arc<Waiter>,
    name: String,
    owner: Arc<Wakeups>,
    acquired: bool,
}

impl Registration {
    /// Completes at the first wake-up since the last one seen (a release heard while this
    /// waiter was the head, or its turn passed on by a waiter that left).
    pub(crate) async fn woken(&self) {
        self.waiter.wake.notified().await;
        self.waiter.seen.store(true, Ordering::SeqCst);
    }

    /// Its attempt was refused: of a semaphore's line, the next release may wake it again, and
    /// a release owed ([`Line::owed`]) wakes it at once.
    pub(crate) fn refused(&self) {
        self.waiter.seen.store(false, Ordering::SeqCst);
        self.waiter.pending.store(false, Ordering::SeqCst);
        let mut lines = self.owner.lock();
        if let Some(line) = lines.get_mut(&self.name).filter(|line| line.owed > 0) {
            line.owed -= 1;
            self.waiter.pending.store(true, Ordering::SeqCst);
            self.waiter.wake.notify_one();
        }
    }

    /// Whether a fair release handed this waiter the lock; asked once.
    pub(crate) fn handed_over(&self) -> Option<HandedOver> {
        self.waiter
            .handed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Whether this waiter is the first of this client's queue for its lock (the one a release
    /// of this client wakes).
    pub(crate) fn is_head(&self) -> bool {
        let lines = self.owner.lock();
        lines
            .get(&self.name)
            .and_then(|line| line.queue.front())
            .is_some_and(|head| head.id == self.waiter.id)
    }

    /// The waiter has its place in line now (see [`Wakeups::register_early`]).
    pub(crate) fn in_line(&self) {
        self.waiter.in_line.store(true, Ordering::Relaxed);
        if let Some(line) = self.owner.lock().get_mut(&self.name) {
            line.listened = true;
        }
    }

    /// Whether it has its place in line ([`in_line`](Self::in_line), or registered so).
    pub(crate) fn is_in_line(&self) -> bool {
        self.waiter.in_line.load(Ordering::Relaxed)
    }

    /// Leaves the queue holding the lock: the next waiter is woken by this one's release, not
    /// now.
    pub(crate) fn acquired(mut self) {
        self.acquired = true;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.owner.unregister(&self.name, self.waiter.id, self.acquired);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn is_woken(r: &Registration) -> bool {
        tokio::time::timeout(Duration::from_millis(50), r.woken())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_release_wakes_the_head_only_and_idle_locks_go() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let wakeups = Wakeups::new();
        wakeups.on_idle(move |name| {
            let _ = tx.send(name.to_owned());
        });
        let a = wakeups.register("c", None);
        let b = wakeups.register("c", None);
        wakeups.released("c");
        assert!(is_woken(&a).await, "the wake-up before the wait was lost");
        assert!(!is_woken(&b).await, "only the head is woken");
        a.acquired();
        assert!(!is_woken(&b).await, "a head that took the lock passes nothing on");
        wakeups.released("c");
        assert!(is_woken(&b).await);
        assert_eq!(wakeups.len(), 1);
        drop(b);
        assert_eq!(wakeups.len(), 0);
        assert_eq!(rx.recv().await.as_deref(), Some("c"));
    }

    /// Listening confirmed again after a loss has the head check its lock once more (a
    /// release between its re-check at the loss and the new confirmation went unheard); a first
    /// confirmation wakes nobody.
    #[tokio::test]
    async fn listening_confirmed_again_after_a_loss_wakes_the_head_once() {
        let wakeups = Wakeups::new();
        let notices = wakeups.notices();
        let a = wakeups.register("c", None);
        let b = wakeups.register("c", None);
        notices.confirmed("c");
        assert!(!is_woken(&a).await, "a first confirmation wakes nobody");
        notices.lost_all();
        assert!(
            is_woken(&a).await && is_woken(&b).await,
            "a loss wakes every waiter"
        );
        notices.confirmed("c");
        assert!(is_woken(&a).await, "confirmed again: the head checks once more");
        assert!(!is_woken(&b).await, "only the head");
        notices.confirmed("c");
        assert!(!is_woken(&a).await, "once");
    }

    #[tokio::test]
    async fn a_head_that_leaves_without_the_lock_passes_its_turn_on() {
        let wakeups = Wakeups::new();
        let a = wakeups.register("c", None);
        let b = wakeups.register("c", None);
        let c = wakeups.register("c", None);
        wakeups.released("c");
        drop(a); // woken, then gave up before trying
        assert!(is_woken(&b).await, "the next waiter tries in its place");
        assert!(!is_woken(&c).await);
        drop(c); // not the head: leaving wakes nobody
        assert!(!is_woken(&b).await);
    }

    /// Of a semaphore's line, a release heard while every waiter is already woken is owed, not
    /// given to the head again (whose second wake-up left with it when its attempt took a
    /// permit): the next waiter refused tries again at once, and when a waiter leaves, the next
    /// one not woken yet is woken for it.
    #[tokio::test]
    async fn a_release_heard_while_every_waiter_is_woken_is_not_lost() {
        let wakeups = Wakeups::new();
        let a = wakeups.register("s", None);
        let b = wakeups.register("s", None);
        wakeups.spread("s");
        wakeups.released("s");
        wakeups.released("s");
        assert!(is_woken(&a).await && is_woken(&b).await);
        wakeups.released("s"); // both are trying already
        a.acquired(); // a's attempt took a permit
        b.refused(); // b's lost a race for the other
        assert!(is_woken(&b).await, "the third release's permit waits for b");
        assert!(!is_woken(&b).await, "once");

        let c = wakeups.register("s", None);
        wakeups.released("s"); // c is woken
        assert!(is_woken(&c).await);
        wakeups.released("s"); // b and c are trying: owed
        let d = wakeups.register("s", None);
        c.acquired(); // c leaves with a permit: the owed release goes to d
        assert!(
            is_woken(&d).await,
            "a waiter that left passed the owed release on"
        );
        assert!(!is_woken(&b).await);
    }

    #[tokio::test]
    async fn a_watch_hears_every_release_and_turn_of_its_lock() {
        let wakeups = Wakeups::new();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let watching = wakeups.watch("c", tx);
        wakeups.released("c");
        wakeups.notices().turn("c", b"someone", None);
        wakeups.released("other");
        assert_eq!(rx.recv().await.as_deref(), Some("c"));
        assert_eq!(rx.recv().await.as_deref(), Some("c"));
        assert!(rx.try_recv().is_err());
        assert_eq!(wakeups.queued("c"), 0, "a watch is no waiter");
        drop(watching);
        assert_eq!(wakeups.len(), 0);
    }
}
