//! Local fan-out of "this lock was released" to the waiters of one client.
//!
//! Each lock's channel has one entry with a counter behind a `watch`; every release message bumps
//! it. A waiter registers (and, on Redis, makes sure the channel is subscribed) *before* the
//! attempt it will wait after, so a release that lands between that attempt and the wait still
//! changes the counter it then waits on. The last registration of a channel to go removes the entry and asks
//! the backend to unsubscribe, so channels never pile up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{mpsc, watch};

#[derive(Debug)]
struct Channel {
    bumps: watch::Sender<u64>,
    waiters: usize,
    /// The backend confirmed the subscription (always true in memory).
    subscribed: bool,
}

/// The channels this client's waiters listen on.
#[derive(Debug, Default)]
pub(crate) struct Wakeups {
    channels: Mutex<HashMap<String, Channel>>,
    /// Told the name of a channel nobody waits on any more (Redis: to unsubscribe it).
    on_idle: Option<mpsc::UnboundedSender<String>>,
}

impl Wakeups {
    pub(crate) fn new(on_idle: Option<mpsc::UnboundedSender<String>>) -> Arc<Self> {
        Arc::new(Wakeups {
            channels: Mutex::default(),
            on_idle,
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        // A panic while holding this lock leaves the map consistent (every update is one step).
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts listening on `channel`; the returned registration sees every bump from now on.
    pub(crate) fn register(self: &Arc<Self>, channel: &str) -> Registration {
        let mut channels = self.lock();
        let entry = channels.entry(channel.to_owned()).or_insert_with(|| Channel {
            bumps: watch::Sender::new(0),
            waiters: 0,
            subscribed: self.on_idle.is_none(),
        });
        entry.waiters += 1;
        Registration {
            rx: entry.bumps.subscribe(),
            channel: channel.to_owned(),
            owner: Arc::clone(self),
        }
    }

    /// Wakes every local waiter of `channel`.
    pub(crate) fn notify(&self, channel: &str) {
        if let Some(entry) = self.lock().get(channel) {
            entry.bumps.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// The subscriber connection was lost: every subscribed channel needs subscribing again,
    /// and its waiters re-check their lock at once, since a release may have gone unheard.
    /// Channels that were never subscribed lost nothing, and are left asleep.
    pub(crate) fn subscriptions_lost(&self) {
        for entry in self.lock().values_mut() {
            if std::mem::replace(&mut entry.subscribed, false) {
                entry.bumps.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    pub(crate) fn is_subscribed(&self, channel: &str) -> bool {
        self.lock().get(channel).is_some_and(|c| c.subscribed)
    }

    pub(crate) fn set_subscribed(&self, channel: &str) {
        if let Some(entry) = self.lock().get_mut(channel) {
            entry.subscribed = true;
        }
    }

    pub(crate) fn is_wanted(&self, channel: &str) -> bool {
        self.lock().contains_key(channel)
    }

    /// How many channels have local waiters.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn unregister(&self, channel: &str) {
        let mut channels = self.lock();
        let idle = match channels.get_mut(channel) {
            Some(entry) => {
                entry.waiters -= 1;
                entry.waiters == 0
            }
            None => false,
        };
        if idle {
            channels.remove(channel);
            drop(channels);
            if let Some(tx) = &self.on_idle {
                // The receiver only goes away with the client; nothing to do then.
                let _ = tx.send(channel.to_owned());
            }
        }
    }
}

/// One waiter's interest in one channel; dropping it ends the interest.
#[derive(Debug)]
pub(crate) struct Registration {
    rx: watch::Receiver<u64>,
    channel: String,
    owner: Arc<Wakeups>,
}

impl Registration {
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// Completes at the first bump since the registration or since the last `bumped()`.
    pub(crate) async fn bumped(&mut self) {
        if self.rx.changed().await.is_err() {
            // The sender lives as long as this registration does; never reached.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.owner.unregister(&self.channel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bump_after_register_is_seen_and_idle_channels_go() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let wakeups = Wakeups::new(Some(tx));
        let mut a = wakeups.register("c");
        let b = wakeups.register("c");
        wakeups.notify("c");
        tokio::time::timeout(std::time::Duration::from_secs(1), a.bumped())
            .await
            .unwrap_or_else(|_| panic!("the bump before the wait was lost"));
        drop(a);
        assert_eq!(wakeups.len(), 1);
        drop(b);
        assert_eq!(wakeups.len(), 0);
        assert_eq!(rx.recv().await.as_deref(), Some("c"));
    }
}
