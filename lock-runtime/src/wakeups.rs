//! Local hand-off of "this lock was released" to the waiters of one client: one waiter per
//! release, in the order they began waiting.
//!
//! Each lock's channel has a FIFO queue of this client's waiters. A release wakes only the head
//! of the queue, so a hand-off costs one acquire attempt per client, not one per waiter; the
//! head that fails (someone else barged in) stays at the head and sleeps again. A waiter leaving
//! the queue without the lock (it gave up, its wait ran out, it was cancelled) wakes the next
//! one in its place, so no wake-up is lost with it. A wake-up is a stored permit, so one that
//! arrives while the head is busy with an attempt is seen when it next sleeps.
//!
//! A waiter registers (and, on Redis, makes sure the channel is subscribed) *before* the attempt
//! it will wait after, so a release between that attempt and the wait still reaches it. The
//! last registration of a channel to go removes the entry and asks the backend to unsubscribe,
//! so channels never pile up.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{mpsc, Notify};

#[derive(Debug)]
struct Channel {
    /// This client's waiters, in the order they began waiting; the head is woken next.
    queue: VecDeque<Arc<Waiter>>,
    /// Which listeners confirmed the subscription, one bit each (a RedLock client listens on
    /// every master; other backends have listener 0; in memory all bits are set).
    subscribed: u64,
    /// Which listeners lost their subscription since it was last confirmed: when one confirms
    /// it again, the head of the queue checks its lock once more (a release between its re-check
    /// at the loss and the new subscription went unheard).
    relisten: u64,
}

impl Channel {
    /// Listener `who`'s subscription is gone: every waiter re-checks its lock (a release may
    /// have gone unheard), and the next one to wait subscribes again.
    fn lost(&mut self, who: usize) {
        let bit = listener_bit(who);
        if self.subscribed & bit != 0 {
            self.subscribed &= !bit;
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
    /// A fair release handed this waiter the lock.
    handed: Mutex<Option<HandedOver>>,
}

/// A fair release handed a waiter the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandedOver {
    /// The fencing token taken for it (0: none, the key has no counter).
    pub(crate) fence: u64,
    /// Which of the waiter's attempts kept the place it was handed over for (what that attempt
    /// was told, [`Attempt::Held`](crate::backend::Attempt::Held)'s `kept`).
    pub(crate) kept: u64,
}

/// The channels this client's waiters listen on.
#[derive(Debug, Default)]
pub(crate) struct Wakeups {
    channels: Mutex<HashMap<String, Channel>>,
    /// How many waiters are registered: a release with nobody waiting skips the lock.
    waiters: AtomicUsize,
    /// Told the name of a channel nobody waits on any more (Redis: each listener, to
    /// unsubscribe it).
    on_idle: Vec<mpsc::UnboundedSender<String>>,
}

impl Wakeups {
    /// Wake-ups heard by one listener per `on_idle` sender (none: in memory, nothing to
    /// subscribe).
    pub(crate) fn new(on_idle: Vec<mpsc::UnboundedSender<String>>) -> Arc<Self> {
        Arc::new(Wakeups {
            channels: Mutex::default(),
            waiters: AtomicUsize::new(0),
            on_idle,
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        // A panic while holding this lock leaves the map consistent (every update is one step).
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins the end of `channel`'s queue; a fair waiter gives its token.
    pub(crate) fn register(self: &Arc<Self>, channel: &str, token: Option<&str>) -> Registration {
        static IDS: AtomicU64 = AtomicU64::new(0);
        let waiter = Arc::new(Waiter {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            token: token.map(str::to_owned),
            wake: Notify::new(),
            handed: Mutex::new(None),
        });
        let mut channels = self.lock();
        let entry = channels.entry(channel.to_owned()).or_insert_with(|| Channel {
            queue: VecDeque::new(),
            subscribed: if self.on_idle.is_empty() { u64::MAX } else { 0 },
            relisten: 0,
        });
        entry.queue.push_back(Arc::clone(&waiter));
        self.waiters.fetch_add(1, Ordering::SeqCst);
        Registration {
            waiter,
            channel: channel.to_owned(),
            owner: Arc::clone(self),
            acquired: false,
        }
    }

    /// How many of this client's waiters queue for `channel`.
    pub(crate) fn queued(&self, channel: &str) -> usize {
        if self.waiters.load(Ordering::SeqCst) == 0 {
            return 0; // every uncontended acquire asks: no lock then
        }
        self.lock().get(channel).map_or(0, |c| c.queue.len())
    }

    /// A release of `channel`'s lock: wakes the head of its queue.
    pub(crate) fn notify(&self, channel: &str) {
        if self.waiters.load(Ordering::SeqCst) == 0 {
            return;
        }
        if let Some(head) = self.lock().get(channel).and_then(|c| c.queue.front()) {
            head.wake.notify_one();
        }
    }

    /// A fair release named the waiter whose turn it is, and with `handed` handed it the lock:
    /// wakes it, if it is one of ours.
    pub(crate) fn notify_waiter(&self, channel: &str, token: &[u8], handed: Option<HandedOver>) {
        let channels = self.lock();
        let named = channels.get(channel).and_then(|c| {
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

    /// The subscriber connection was lost: every subscribed channel needs subscribing again,
    /// and its waiters re-check their lock at once, since a release may have gone unheard.
    /// Channels that were never subscribed lost nothing, and are left asleep.
    pub(crate) fn subscriptions_lost(&self, who: usize) {
        for entry in self.lock().values_mut() {
            entry.lost(who);
        }
    }

    /// The server dropped this one subscription (a cluster slot moved away): its waiters
    /// re-check, and the next of them subscribes again.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn subscription_lost(&self, channel: &str, who: usize) {
        if let Some(entry) = self.lock().get_mut(channel) {
            entry.lost(who);
        }
    }

    pub(crate) fn is_subscribed(&self, channel: &str, who: usize) -> bool {
        self.lock()
            .get(channel)
            .is_some_and(|c| c.subscribed & listener_bit(who) != 0)
    }

    /// Listener `who` confirmed `channel`'s subscription; after a loss, the head of its queue
    /// checks its lock once more.
    pub(crate) fn set_subscribed(&self, channel: &str, who: usize) {
        if let Some(entry) = self.lock().get_mut(channel) {
            let bit = listener_bit(who);
            entry.subscribed |= bit;
            if entry.relisten & bit != 0 {
                entry.relisten &= !bit;
                if let Some(head) = entry.queue.front() {
                    head.wake.notify_one();
                }
            }
        }
    }

    pub(crate) fn is_wanted(&self, channel: &str) -> bool {
        self.lock().contains_key(channel)
    }

    /// How many channels have local waiters.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn unregister(&self, channel: &str, waiter: u64, acquired: bool) {
        let mut channels = self.lock();
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        let Some(entry) = channels.get_mut(channel) else {
            return;
        };
        let was_head = entry.queue.front().is_some_and(|w| w.id == waiter);
        entry.queue.retain(|w| w.id != waiter);
        if entry.queue.is_empty() {
            channels.remove(channel);
            drop(channels);
            for tx in &self.on_idle {
                // The receiver only goes away with the client; nothing to do then.
                let _ = tx.send(channel.to_owned());
            }
        } else if was_head && !acquired {
            // It may have taken a wake-up meant for the lock's next holder with it: the next
            // waiter tries in its place.
            if let Some(next) = entry.queue.front() {
                next.wake.notify_one();
            }
        }
    }
}

/// One waiter's place in a channel's queue; dropping it leaves the queue.
#[derive(Debug)]
pub(crate) struct Registration {
    waiter: Arc<Waiter>,
    channel: String,
    owner: Arc<Wakeups>,
    acquired: bool,
}

impl Registration {
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// Completes at the first wake-up since the last one seen (a release heard while this
    /// waiter was the head, or its turn passed on by a waiter that left).
    pub(crate) async fn woken(&self) {
        self.waiter.wake.notified().await;
    }

    /// Whether a fair release handed this waiter the lock; asked once.
    pub(crate) fn handed_over(&self) -> Option<HandedOver> {
        self.waiter
            .handed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Leaves the queue holding the lock: the next waiter is woken by this one's release, not
    /// now.
    pub(crate) fn acquired(mut self) {
        self.acquired = true;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.owner
            .unregister(&self.channel, self.waiter.id, self.acquired);
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
    async fn a_release_wakes_the_head_only_and_idle_channels_go() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let wakeups = Wakeups::new(vec![tx]);
        let a = wakeups.register("c", None);
        let b = wakeups.register("c", None);
        wakeups.notify("c");
        assert!(is_woken(&a).await, "the wake-up before the wait was lost");
        assert!(!is_woken(&b).await, "only the head is woken");
        a.acquired();
        assert!(!is_woken(&b).await, "a head that took the lock passes nothing on");
        wakeups.notify("c");
        assert!(is_woken(&b).await);
        assert_eq!(wakeups.len(), 1);
        drop(b);
        assert_eq!(wakeups.len(), 0);
        assert_eq!(rx.recv().await.as_deref(), Some("c"));
    }

    /// A subscription confirmed again after a loss has the head check its lock once more (a
    /// release between its re-check at the loss and the new subscription went unheard); a first
    /// subscription wakes nobody.
    #[tokio::test]
    async fn a_subscription_confirmed_again_after_a_loss_wakes_the_head_once() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let wakeups = Wakeups::new(vec![tx]);
        let a = wakeups.register("c", None);
        let b = wakeups.register("c", None);
        wakeups.set_subscribed("c", 0);
        assert!(!is_woken(&a).await, "a first subscription wakes nobody");
        wakeups.subscriptions_lost(0);
        assert!(
            is_woken(&a).await && is_woken(&b).await,
            "a loss wakes every waiter"
        );
        wakeups.set_subscribed("c", 0);
        assert!(is_woken(&a).await, "confirmed again: the head checks once more");
        assert!(!is_woken(&b).await, "only the head");
        wakeups.set_subscribed("c", 0);
        assert!(!is_woken(&a).await, "once");
    }

    #[tokio::test]
    async fn a_head_that_leaves_without_the_lock_passes_its_turn_on() {
        let wakeups = Wakeups::new(Vec::new());
        let a = wakeups.register("c", None);
        let b = wakeups.register("c", None);
        let c = wakeups.register("c", None);
        wakeups.notify("c");
        drop(a); // woken, then gave up before trying
        assert!(is_woken(&b).await, "the next waiter tries in its place");
        assert!(!is_woken(&c).await);
        drop(c); // not the head: leaving wakes nobody
        assert!(!is_woken(&b).await);
    }
}
