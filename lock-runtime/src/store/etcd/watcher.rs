//! The one watch stream of an etcd client: for each of its waiters, a watch of the one place in
//! line just ahead of the waiter's own (no herd: a release wakes the next waiter only, whichever
//! client it belongs to), from the revision the waiter read it at, so a deletion after that read
//! is never missed. The deletion wakes the waiter by its token; its next attempt looks again.
//!
//! A watch etcd cancels (its start revision was compacted away) wakes its waiter to look again
//! and watch from a newer revision; a stream that breaks wakes every waiter it watched for, and
//! the next watch opens a new stream (on the next member, if the last one failed).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchResponse, WatchStream};
use tokio::sync::mpsc;

use super::pool::{self, Pool};
use crate::background::Background;
use crate::store::Notices;

/// Whom a watch wakes: a waiter's lock and token.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Waiter {
    name: String,
    token: String,
}

impl Waiter {
    fn wake(&self, notices: &Notices) {
        notices.turn(&self.name, self.token.as_bytes(), None);
    }
}

#[derive(Debug)]
enum Request {
    /// Wake `waiter` once `key` (or, with `end`, any key in `[key, end)`) is deleted at or
    /// after revision `from`.
    Watch {
        waiter: Waiter,
        key: Vec<u8>,
        end: Option<Vec<u8>>,
        from: i64,
    },
    /// `token` no longer waits.
    Cancel { token: String },
}

/// The watch task and how to reach it.
#[derive(Debug, Default)]
pub(super) struct Watcher {
    task: Background,
    requests: Mutex<Option<mpsc::UnboundedSender<Request>>>,
}

impl Watcher {
    fn slot(&self) -> MutexGuard<'_, Option<mpsc::UnboundedSender<Request>>> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, pool: &Arc<Pool>, notices: &Notices, request: Request) {
        let mut slot = self.slot();
        if !self.task.is_running() || slot.is_none() {
            let (requests, received) = mpsc::unbounded_channel();
            *slot = Some(requests);
            let (pool, notices) = (Arc::clone(pool), notices.clone());
            self.task.replace(move || run(pool, notices, received));
        }
        if let Some(requests) = slot.as_ref() {
            // The task only ends with its runtime or the client.
            let _ = requests.send(request);
        }
    }

    /// Wakes the waiter `token` of the lock named `name` once `key` (the place ahead of it) is
    /// deleted at or after revision `from`. Replaces the waiter's earlier watch.
    pub(super) fn watch(
        &self,
        pool: &Arc<Pool>,
        notices: &Notices,
        (name, token): (&str, &str),
        key: Vec<u8>,
        from: i64,
    ) {
        self.watch_range(pool, notices, (name, token), (key, None), from);
    }

    /// Wakes the waiter `token` of the lock named `name` once any key in `[start, end)` (a
    /// semaphore's permits, for its oldest waiter) is deleted at or after revision `from`.
    /// Replaces the waiter's earlier watch.
    pub(super) fn watch_range(
        &self,
        pool: &Arc<Pool>,
        notices: &Notices,
        (name, token): (&str, &str),
        (key, end): (Vec<u8>, Option<Vec<u8>>),
        from: i64,
    ) {
        let waiter = Waiter {
            name: name.to_owned(),
            token: token.to_owned(),
        };
        self.send(
            pool,
            notices,
            Request::Watch {
                waiter,
                key,
                end,
                from,
            },
        );
    }

    /// The waiter `token` no longer waits.
    pub(super) fn cancel(&self, pool: &Arc<Pool>, notices: &Notices, token: &str) {
        if self.task.is_running() {
            let token = token.to_owned();
            self.send(pool, notices, Request::Cancel { token });
        }
    }

    pub(super) fn stop(&self) {
        self.task.stop();
        *self.slot() = None;
    }
}

/// The stream and its watches.
#[derive(Debug, Default)]
struct Watches {
    /// The stream, and the pin of the member it went to.
    stream: Option<(WatchStream, usize)>,
    /// Confirmed watches, by watch id.
    by_id: HashMap<i64, Waiter>,
    /// Asked for, in order (etcd confirms them in that order); `None`: no longer wanted, to
    /// cancel once confirmed.
    pending: std::collections::VecDeque<Option<Waiter>>,
}

impl Watches {
    fn forget(&mut self, token: &str) -> Vec<i64> {
        for pending in &mut self.pending {
            if pending.as_ref().is_some_and(|w| w.token == token) {
                *pending = None;
            }
        }
        let ids: Vec<i64> = self
            .by_id
            .iter()
            .filter(|(_, w)| w.token == token)
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            self.by_id.remove(id);
        }
        ids
    }

    async fn cancel(&mut self, ids: Vec<i64>) {
        if let Some((stream, _)) = self.stream.as_mut() {
            for id in ids {
                let _ = stream.cancel(id).await;
            }
        }
    }

    async fn serve(&mut self, pool: &Pool, notices: &Notices, request: Request) {
        match request {
            Request::Cancel { token } => {
                let ids = self.forget(&token);
                self.cancel(ids).await;
            }
            Request::Watch {
                waiter,
                key,
                end,
                from,
            } => {
                let ids = self.forget(&waiter.token);
                self.cancel(ids).await;
                let options = WatchOptions::new()
                    .with_start_revision(from)
                    .with_filters([WatchFilterType::NoPut]);
                let options = match end {
                    Some(end) => options.with_range(end),
                    None => options,
                };
                // Bounded: a member that takes the request and never answers must not hold up
                // every other waiter's watch.
                let within = pool.timeouts.response;
                let timed_out = |at: usize| {
                    pool.unpin(at);
                    crate::LockError::unavailable(format!(
                        "etcd at {}: no watch within {within:?}",
                        crate::redact::hide_credentials(pool.endpoint(at))
                    ))
                };
                let sent = match self.stream.as_mut() {
                    Some((stream, at)) => {
                        match tokio::time::timeout(within, stream.watch(key, Some(options))).await {
                            Ok(sent) => sent.map_err(|e| pool::store_error(pool.endpoint(*at), &e)),
                            Err(_) => Err(timed_out(*at)),
                        }
                    }
                    None => match pool.pinned().await {
                        Ok((at, client)) => {
                            let mut watches = client.watch_client();
                            match tokio::time::timeout(within, watches.watch(key, Some(options))).await {
                                Ok(Ok(stream)) => {
                                    self.stream = Some((stream, at));
                                    Ok(())
                                }
                                Ok(Err(e)) => {
                                    pool.unpin(at);
                                    Err(pool::store_error(pool.endpoint(at), &e))
                                }
                                Err(_) => Err(timed_out(at)),
                            }
                        }
                        Err(e) => Err(e),
                    },
                };
                match sent {
                    Ok(()) => self.pending.push_back(Some(waiter)),
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot watch the place ahead of a waiter");
                        waiter.wake(notices);
                        self.broken(pool, notices);
                    }
                }
            }
        }
    }

    async fn answer(&mut self, response: &WatchResponse, notices: &Notices) {
        let id = response.watch_id();
        if response.created() {
            match self.pending.pop_front() {
                Some(Some(waiter)) => {
                    self.by_id.insert(id, waiter);
                }
                Some(None) => self.cancel(vec![id]).await,
                None => {}
            }
        }
        let deleted = response
            .events()
            .iter()
            .any(|event| event.event_type() == EventType::Delete);
        if deleted || response.canceled() {
            // Its place ahead went (or, compacted past its start, may have): it looks again.
            if let Some(waiter) = self.by_id.remove(&id) {
                waiter.wake(notices);
            }
        }
    }

    /// The stream broke: every waiter it watched for looks again (a deletion may have gone
    /// unheard), and the next watch opens a new stream.
    fn broken(&mut self, pool: &Pool, notices: &Notices) {
        if let Some((_, at)) = self.stream.take() {
            pool.unpin(at);
        }
        for waiter in self.by_id.values().chain(self.pending.iter().flatten()) {
            waiter.wake(notices);
        }
        *self = Watches::default();
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
async fn run(pool: Arc<Pool>, notices: Notices, mut requests: mpsc::UnboundedReceiver<Request>) {
    let mut watches = Watches::default();
    loop {
        tokio::select! {
            request = requests.recv() => match request {
                Some(request) => watches.serve(&pool, &notices, request).await,
                None => return,
            },
            answer = next(&mut watches.stream) => match answer {
                Ok(Some(response)) => watches.answer(&response, &notices).await,
                Ok(None) => watches.broken(&pool, &notices),
                Err(e) => {
                    tracing::debug!(error = %e, "the etcd watch stream broke");
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
    fn a_broken_stream_wakes_every_waiter_it_watched_for() {
        let wakeups = Wakeups::new();
        let notices = wakeups.notices();
        let (a, b, c) = (
            wakeups.register("lock:{k}", Some("a")),
            wakeups.register("lock:{k}", Some("b")),
            wakeups.register("lock:{k}", Some("c")),
        );
        let waiter = |token: &str| Waiter {
            name: "lock:{k}".to_owned(),
            token: token.to_owned(),
        };
        let mut watches = Watches::default();
        watches.by_id.insert(7, waiter("a"));
        watches.pending.push_back(Some(waiter("b")));
        watches.pending.push_back(None);
        let pool = Pool::new(
            vec!["http://127.0.0.1:1".to_owned()],
            Default::default(),
            Default::default(),
        );
        watches.broken(&pool, &notices);
        assert!(is_woken(&a) && is_woken(&b));
        assert!(!is_woken(&c), "not watched for: nothing to hear");
        assert!(watches.by_id.is_empty() && watches.pending.is_empty());
    }
}
