//! A store written as a new one would be: one module implementing [`Store`], given to the client
//! by one constructor. Here it keeps its locks in an in-memory store and counts the requests
//! that reach it, and it offers what it is told to; the client's waiting, watchdog, validity,
//! fencing, fair and read-write paths, and its checks of the options, need nothing else.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::core::Core;
use crate::store::memory::MemoryStore;
use crate::store::{
    Asked, Attempt, Capabilities, Flight, ForceReleased, Lock, LockView, Offered, Release, Released, Renewal,
    Renewing, Store, StoreAdmin, Timeouts, Waking,
};
use crate::wakeups::Wakeups;
use crate::{LockClient, LockError, LockMode, LockOptions};

#[derive(Debug)]
struct Counting {
    inner: MemoryStore,
    offers: Capabilities,
    requests: AtomicUsize,
    /// When set, the answer of the next refused attempt is held back until this is notified
    /// (the request reached the store; its answer is slow to come back).
    hold_refusal: std::sync::Mutex<Option<Arc<tokio::sync::Notify>>>,
    /// Attempts refused.
    refusals: AtomicUsize,
    /// How long each release takes to reach the store (a round trip).
    release_takes: std::sync::Mutex<Duration>,
}

impl Counting {
    fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    fn holds_a_refusal(&self) -> bool {
        self.hold_refusal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

impl Store for Counting {
    fn capabilities(&self) -> Capabilities {
        self.offers
    }

    fn name(&self, key: &str) -> String {
        Store::name(&self.inner, key)
    }

    async fn attempt(&self, asked: Asked<'_>, flight: &Flight) -> Result<Attempt, LockError> {
        self.count();
        let answer = Store::attempt(&self.inner, asked, flight).await;
        if matches!(answer, Ok(Attempt::Held { .. })) {
            self.refusals.fetch_add(1, Ordering::Relaxed);
            let gate = self.hold_refusal.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(gate) = gate {
                gate.notified().await;
            }
        }
        answer
    }

    async fn renew(&self, locks: &[Renewing<'_>]) -> Result<Vec<Renewal>, LockError> {
        self.count();
        Store::renew(&self.inner, locks).await
    }

    async fn release(&self, lock: &Lock, token: &str, release: Release<'_>) -> Result<Released, LockError> {
        self.count();
        let takes = *self.release_takes.lock().unwrap_or_else(|e| e.into_inner());
        if !takes.is_zero() {
            tokio::time::sleep(takes).await;
        }
        Store::release(&self.inner, lock, token, release).await
    }

    async fn leave(&self, lock: &Lock, token: &str, claimed: bool) -> Result<(), LockError> {
        self.count();
        Store::leave(&self.inner, lock, token, claimed).await
    }
}

impl StoreAdmin for Counting {
    async fn inspect(&self, lock: &Lock) -> Result<LockView, LockError> {
        self.count();
        StoreAdmin::inspect(&self.inner, lock).await
    }

    async fn list(&self, pattern: &str) -> Result<Vec<LockView>, LockError> {
        self.count();
        StoreAdmin::list(&self.inner, pattern).await
    }

    async fn force_release(&self, lock: &Lock, seen: &LockView) -> Result<ForceReleased, LockError> {
        self.count();
        StoreAdmin::force_release(&self.inner, lock, seen).await
    }
}

fn client(offers: Capabilities) -> (LockClient, Arc<Counting>) {
    let wakeups = Wakeups::new();
    let store = Arc::new(Counting {
        inner: MemoryStore::new("lock:", wakeups.notices()),
        offers,
        requests: AtomicUsize::new(0),
        hold_refusal: std::sync::Mutex::new(None),
        refusals: AtomicUsize::new(0),
        release_takes: std::sync::Mutex::new(Duration::ZERO),
    });
    let core = Core::new(
        (store.clone(), wakeups, Timeouts::default()),
        "lock:".into(),
        "test".into(),
        false,
    );
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
        permits: Offered::No("it keeps no permits"),
        waking: Waking::Announced { hands_over: false },
    });
    for options in [
        ttl().fencing(true),
        ttl().fair(true),
        ttl().mode(LockMode::Shared),
        ttl().permits(3),
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

/// Issue 55: a fair semaphore's line order and this client's local order of its waiters differ
/// (the answer to the first waiter's first attempt came back after the second had registered).
/// A release admits the waiter first in line, and wakes it: it does not wake the local first
/// waiter, which is refused, and leave the permit idle until the admitted one's nap ends.
#[tokio::test(start_paused = true)]
async fn a_fair_semaphores_release_wakes_the_waiter_it_admits() {
    let (locks, store) = client(Capabilities {
        name: "held back",
        ..Capabilities::ALL
    });
    let two = ttl().permits(2).fair(true);
    let held = locks.acquire("s", &two).await.unwrap();
    let other = locks.acquire("s", &two).await.unwrap();
    let waits = two.clone().wait(Duration::from_secs(30));
    let gate = Arc::new(tokio::sync::Notify::new());
    *store.hold_refusal.lock().unwrap() = Some(Arc::clone(&gate));
    let waiter = |locks: LockClient, waits: LockOptions| {
        tokio::spawn(async move {
            let guard = locks.acquire("s", &waits).await.unwrap();
            (tokio::time::Instant::now(), guard)
        })
    };
    // First in line: its refusal is held back on the way.
    let first = waiter(locks.clone(), waits.clone());
    while store.holds_a_refusal() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Second in line, first to wait here.
    let second = waiter(locks.clone(), waits.clone());
    while locks.waiting("s").unwrap() < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    gate.notify_one();
    while locks.waiting("s").unwrap() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let released = tokio::time::Instant::now();
    assert!(held.release().await.unwrap());
    let (entered, guard) = first.await.unwrap();
    assert!(
        entered - released < Duration::from_millis(50),
        "the waiter first in line took the permit {:?} after its release",
        entered - released
    );
    assert!(
        !second.is_finished(),
        "the second in line barged ahead of the first"
    );
    assert!(other.release().await.unwrap());
    let (_, last) = second.await.unwrap();
    drop((guard.release().await, last.release().await));
}

/// Issue 55: a fair release reaches a waiter whose refused attempt's answer is still on its way
/// (the release came after the attempt had taken its place in line, before the waiter read the
/// answer): a fair waiter is registered before its first attempt, so the hand-over finds it. It
/// was lost before, and the waiter, refused behind others, slept out its nap (255–300 ms).
#[tokio::test(start_paused = true)]
async fn a_hand_over_before_a_fair_waiter_read_its_refusal_reaches_it() {
    for permits in [1, 2] {
        let (locks, store) = client(Capabilities {
            name: "held back",
            ..Capabilities::ALL
        });
        let options = match permits {
            1 => ttl().fair(true),
            n => ttl().fair(true).permits(n),
        };
        let waits = options.clone().wait(Duration::from_secs(30));
        let mut holders = Vec::new();
        for _ in 0..permits {
            holders.push(locks.acquire("k", &options).await.unwrap());
        }
        // As many waiters ahead as permits: the last one's refusal says it is behind.
        let mut ahead = Vec::new();
        for n in 1..=permits as usize {
            let (other, waits) = (locks.clone(), waits.clone());
            ahead.push(tokio::spawn(async move { other.acquire("k", &waits).await }));
            while locks.waiting("k").unwrap() < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let gate = Arc::new(tokio::sync::Notify::new());
        *store.hold_refusal.lock().unwrap() = Some(Arc::clone(&gate));
        let last = {
            let (locks, waits) = (locks.clone(), waits.clone());
            tokio::spawn(async move {
                let guard = locks.acquire("k", &waits).await.unwrap();
                (tokio::time::Instant::now(), guard)
            })
        };
        while store.holds_a_refusal() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Its refusal is on the way back: the holders go, the waiters ahead take their turns,
        // and one of them gives its turn back, to the last waiter.
        for holder in holders {
            assert!(holder.release().await.unwrap());
        }
        let mut turns = Vec::new();
        for waiter in ahead {
            turns.push(waiter.await.unwrap().unwrap());
        }
        let released = tokio::time::Instant::now();
        assert!(turns.pop().unwrap().release().await.unwrap());
        gate.notify_one();
        let (entered, guard) = last.await.unwrap();
        assert!(
            entered - released < Duration::from_millis(50),
            "{permits} permit(s): the last waiter took its turn {:?} after the release",
            entered - released
        );
        assert!(guard.release().await.unwrap());
        for turn in turns {
            assert!(turn.release().await.unwrap());
        }
    }
}

/// Issue 55: a set is given back in reverse canonical order, so a waiter for the same set
/// (which takes the keys in canonical order, and so waits on the first) is woken once, when
/// the last release frees the first key, and finds the others free: not woken on the first
/// key to be refused on each later one still held, once per key.
#[tokio::test(start_paused = true)]
async fn a_set_given_back_wakes_a_waiter_for_it_once() {
    let (locks, store) = client(Capabilities {
        name: "slow releases",
        ..Capabilities::ALL
    });
    let keys = ["a", "b", "c", "d"];
    let held = locks.acquire_all(keys, &ttl()).await.unwrap();
    let waiting = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .acquire_all(keys, &ttl().wait(Duration::from_secs(30)))
                .await
        })
    };
    while locks.waiting("a").unwrap() < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    *store.release_takes.lock().unwrap() = Duration::from_millis(5);
    let refused = store.refusals.load(Ordering::Relaxed);
    assert!(held.release().await.unwrap());
    let set = waiting.await.unwrap().unwrap();
    assert_eq!(
        store.refusals.load(Ordering::Relaxed) - refused,
        0,
        "the waiter was refused on keys still held after it was woken"
    );
    assert!(set.release().await.unwrap());
}
