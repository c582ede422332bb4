//! A store written as a new one would be: one module implementing [`Store`], given to the client
//! by one constructor. Here it keeps its locks in an in-memory store and counts the requests
//! that reach it, and it offers what it is told to; the client's waiting, watchdog, validity,
//! fencing, fair and read-write paths, and its checks of the options, need nothing else.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::memory::MemoryBackend;
use crate::backend::{
    Answer, Ask, Attempt, Capabilities, Kind, LockKeys, Offered, Pinned, Renewal, Store, Stored,
};
use crate::core::Core;
use crate::wakeups::Wakeups;
use crate::{LockClient, LockError, LockMode, LockOptions};

#[derive(Debug)]
struct Counting {
    inner: MemoryBackend,
    offers: Capabilities,
    requests: AtomicUsize,
}

impl Counting {
    fn counted<'a, T: Send + 'a>(&'a self, answer: Answer<'a, T>) -> Answer<'a, T> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        answer
    }
}

impl Store for Counting {
    fn capabilities(&self) -> Capabilities {
        self.offers
    }

    fn attempt<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ask: &'a Ask,
        pin: &'a Pinned,
    ) -> Answer<'a, Attempt> {
        self.counted(self.inner.attempt(keys, token, ask, pin))
    }

    fn renew_many<'a>(&'a self, locks: &'a [(&'a LockKeys, &'a str, u64)]) -> Answer<'a, Vec<Renewal>> {
        self.counted(Store::renew_many(&self.inner, locks))
    }

    fn release<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        hold_ms: u64,
        kind: Kind,
        after: Option<&'a Pinned>,
    ) -> Answer<'a, bool> {
        self.counted(Store::release(&self.inner, keys, token, hold_ms, kind, after))
    }

    fn leave_queue<'a>(&'a self, keys: &'a LockKeys, token: &'a str, claimed: bool) -> Answer<'a, ()> {
        self.counted(Store::leave_queue(&self.inner, keys, token, claimed))
    }

    fn holder<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, Option<(Stored, Option<Duration>)>> {
        self.counted(Store::holder(&self.inner, keys))
    }

    fn force_release<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, bool> {
        self.counted(Store::force_release(&self.inner, keys))
    }

    fn response_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn wakeups(&self) -> &Arc<Wakeups> {
        Store::wakeups(&self.inner)
    }
}

fn client(offers: Capabilities) -> (LockClient, Arc<Counting>) {
    let store = Arc::new(Counting {
        inner: MemoryBackend::new(),
        offers,
        requests: AtomicUsize::new(0),
    });
    let core = Core::new(store.clone(), "lock:".into(), "test".into(), false);
    (LockClient::from_core(core), store)
}

fn ttl() -> LockOptions {
    LockOptions::new(Duration::from_secs(3))
}

#[tokio::test(start_paused = true)]
async fn a_store_in_one_module_gets_every_kind_of_lock() {
    let (locks, store) = client(Capabilities {
        name: "counting",
        ..Capabilities::ALL
    });
    // Fencing tokens rise.
    let fenced = ttl().fencing(true);
    let first = locks.acquire("k", &fenced).await.unwrap();
    let token = first.fencing_token().unwrap();
    // A waiter is woken by the release, and gets a larger token.
    let waiting = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let guard = locks
                .acquire("k", &ttl().fencing(true).wait(Duration::from_secs(10)))
                .await
                .unwrap();
            guard.fencing_token().unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(first.release().await.unwrap());
    assert!(waiting.await.unwrap() > token);
    // The watchdog renews through the store: held well past its ttl.
    let renewed = locks.acquire("w", &ttl().watchdog(true)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!renewed.is_lost());
    assert!(locks.holder("w").await.unwrap().is_some());
    assert!(renewed.release().await.unwrap());
    // Fair and shared locks, and run.
    let fair = locks.acquire("f", &ttl().fair(true)).await.unwrap();
    assert!(fair.release().await.unwrap());
    let shared = ttl().mode(LockMode::Shared);
    let (a, b) = (
        locks.acquire("s", &shared).await.unwrap(),
        locks.acquire("s", &shared).await.unwrap(),
    );
    assert!(matches!(
        locks.acquire("s", &ttl()).await,
        Err(LockError::Busy { .. })
    ));
    drop((a.release().await, b.release().await));
    assert_eq!(locks.run("r", &ttl(), async { 7 }).await.unwrap(), 7);
    locks.shutdown().await;
    assert!(store.requests.load(Ordering::Relaxed) > 10);
}

#[tokio::test]
async fn options_a_store_does_not_offer_are_refused_before_any_request() {
    let (locks, store) = client(Capabilities {
        name: "plain",
        fencing: Offered::No("it keeps no counter"),
        fair: Offered::No("it keeps no line"),
        shared: Offered::No("it keeps no shares"),
        hand_over: false,
    });
    for options in [
        ttl().fencing(true),
        ttl().fair(true),
        ttl().mode(LockMode::Shared),
    ] {
        let refused = locks.acquire("k", &options).await;
        let Err(LockError::InvalidOptions { reason }) = refused else {
            panic!("{refused:?}");
        };
        assert!(reason.starts_with("a plain client offers no "), "{reason}");
        assert!(reason.contains("it keeps no"), "{reason}");
        let ran = locks.run("k", &options, async {}).await;
        assert!(matches!(ran, Err(LockError::InvalidOptions { .. })), "{ran:?}");
    }
    assert_eq!(store.requests.load(Ordering::Relaxed), 0);
    // What it offers works.
    let guard = locks.acquire("k", &ttl()).await.unwrap();
    assert!(guard.release().await.unwrap());
    assert_eq!(store.requests.load(Ordering::Relaxed), 2);
    // A call nested in one that holds the lock acquires nothing, so it is not asked: a shared
    // or fair call inside an exclusive one runs.
    let inner = locks
        .run("n", &ttl(), async {
            let shared = locks.run("n", &ttl().mode(LockMode::Shared), async { 1 }).await;
            let fair = locks.run("n", &ttl().fair(true), async { 2 }).await;
            (shared.unwrap(), fair.unwrap())
        })
        .await
        .unwrap();
    assert_eq!(inner, (1, 2));
    assert_eq!(store.requests.load(Ordering::Relaxed), 4);
}
