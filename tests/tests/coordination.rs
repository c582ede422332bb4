//! Waiting woken by the release, fencing tokens, reentrancy, minimum hold and `current()`, on
//! every deployment (fencing: all but RedLock, which offers none; fair mode: all but RedLock and
//! MySQL).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockOptions, MAX_WAIT_NAP};
use lock_tests::{eventually, in_line, ttl, Target, SECOND};
use tokio::time::Instant;

lock_tests::on_every_deployment!(
    zero_wait_is_one_attempt,
    wait_timeout_is_honoured,
    expiry_without_release_still_ends_the_wait,
    handoff_under_contention,
    nested_calls_on_the_same_key_are_reentrant,
    reentrancy_is_per_call_chain_not_per_client,
    minimum_hold_keeps_the_lock_after_a_fast_body,
    waiting_leaves_no_subscriptions_behind,
    nested_fencing_without_an_outer_token_is_invalid,
    a_nested_call_keeps_its_own_lost_policy,
    an_outer_abort_stops_a_continuing_nested_call,
    a_nested_minimum_hold_extends_the_outer_one,
    nested_calls_joined_in_one_body_take_turns,
    a_continuing_body_can_see_its_lock_lost,
);

/// A release heard by another client's waiter at once: every deployment but MySQL, which has
/// no notifications (tests/tests/mysql.rs: a waiter of another client retries at the next step of
/// its poll's backoff).
mod notified {
    use super::*;

    lock_tests::on_every_deployment_with_notices!(
        release_wakes_the_waiter_before_any_timer,
        a_release_wakes_local_waiters_one_at_a_time_in_arrival_order,
        a_cancelled_waiter_does_not_take_the_next_wake_up_with_it,
        after_a_hand_off_between_clients_the_next_release_still_wakes_the_rest,
    );
}

/// Fencing needs one counter per key: every deployment but RedLock.
mod fenced {
    use super::*;

    lock_tests::on_every_deployment_with_fencing!(
        fencing_tokens_strictly_increase_across_clients,
        stale_holder_write_is_rejected_by_fencing,
        current_is_the_innermost_lock,
    );
}

/// Fair mode needs one line: every deployment but RedLock and MySQL.
mod one_counter {
    use super::*;

    lock_tests::on_every_deployment_with_one_counter!(
        fair_waiters_of_several_clients_get_the_lock_in_arrival_order,
        a_fair_waiter_that_gives_up_leaves_the_line_at_once,
        a_lock_handed_over_in_line_is_kept_for_its_whole_ttl,
        a_fencing_waiter_handed_a_lock_without_a_counter_gets_a_token,
        a_release_without_fair_reaches_a_fair_waiter_at_its_next_attempt,
    );
}

async fn zero_wait_is_one_attempt(t: Target) {
    let c = t.client();
    let held = c.acquire("once", &ttl(5000)).await.unwrap();
    let started = Instant::now();
    assert!(matches!(
        c.acquire("once", &ttl(5000)).await,
        Err(LockError::Busy { .. })
    ));
    assert!(
        started.elapsed() < SECOND,
        "one attempt, no sleeping: {:?}",
        started.elapsed()
    );
    assert_eq!(c.waiting_channels(), 0, "a zero wait never listens");
    held.release().await.unwrap();
}

async fn release_wakes_the_waiter_before_any_timer(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let holder = c.acquire("wake", &ttl(60_000)).await.unwrap();
    let waiter = tokio::spawn({
        let other = other.clone();
        async move {
            let guard = other
                .acquire("wake", &ttl(5000).wait(Duration::from_secs(30)))
                .await;
            (guard, Instant::now())
        }
    });
    eventually(2 * SECOND, "the waiter listens", || async {
        other.waiting_channels() == 1
    })
    .await;
    // Asleep on its (>= 1.7 s) nap after its attempt.
    t.refused_waiter("wake").await;
    let released_at = Instant::now();
    assert!(holder.release().await.unwrap());
    let (guard, acquired_at) = waiter.await.unwrap();
    // The holder's key had a minute left.
    lock_tests::assert_woken_by_the_release(acquired_at - released_at);
    guard.unwrap().release().await.unwrap();
}

async fn wait_timeout_is_honoured(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let holder = c.acquire("patience", &ttl(60_000)).await.unwrap();
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let out = other.acquire("patience", &ttl(1000).wait(wait)).await;
    let waited = started.elapsed();
    assert!(matches!(out, Err(LockError::Busy { .. })), "{out:?}");
    assert!(waited >= wait, "gave up early: {waited:?}");
    assert!(waited < wait + SECOND, "gave up late: {waited:?}");
    holder.release().await.unwrap();
}

async fn expiry_without_release_still_ends_the_wait(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    // A holder that vanishes without releasing (a crashed process): nothing is published. Its
    // lock lasts its ttl from when its acquire was sent (on ZooKeeper its client deletes the
    // node then), so the wait is timed from there.
    let started = Instant::now();
    std::mem::forget(c.acquire("crashed", &ttl(300)).await.unwrap());
    let guard = other
        .acquire("crashed", &ttl(1000).wait(Duration::from_secs(10)))
        .await
        .expect("the waiter takes the lock once the holder's key expires");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert!(waited < 3 * SECOND, "{waited:?}");
    guard.release().await.unwrap();
}

async fn handoff_under_contention(t: Target) {
    const TASKS: usize = 8;
    const ROUNDS: usize = 200;
    let wait = Duration::from_secs(20);
    let clients = [t.client(), t.other_client().await];
    let inside = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let worst = Arc::new(Mutex::new(Duration::ZERO));
    let tasks = (0..TASKS).map(|i| {
        let (c, inside, rounds, worst) = (
            clients[i % 2].clone(),
            inside.clone(),
            rounds.clone(),
            worst.clone(),
        );
        tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let started = Instant::now();
                let guard = c.acquire("handoff", &ttl(10_000).wait(wait)).await.unwrap();
                let waited = started.elapsed();
                {
                    let mut worst = worst.lock().unwrap();
                    *worst = (*worst).max(waited);
                }
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                rounds.fetch_add(1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                assert!(guard.release().await.unwrap());
            }
        })
    });
    for task in futures_util::future::join_all(tasks).await {
        task.unwrap();
    }
    assert_eq!(rounds.load(Ordering::SeqCst), (TASKS * ROUNDS) as u64);
    let worst = *worst.lock().unwrap();
    assert!(worst <= wait + SECOND, "a waiter overran its deadline: {worst:?}");
}

async fn fencing_tokens_strictly_increase_across_clients(t: Target) {
    let clients = [t.client(), t.other_client().await];
    let seen = Arc::new(Mutex::new(Vec::new()));
    let options = ttl(5000).fencing(true).wait(Duration::from_secs(20));
    let tasks = clients.iter().map(|c| {
        let (c, seen, options) = (c.clone(), seen.clone(), options.clone());
        tokio::spawn(async move {
            for _ in 0..100 {
                c.run("fenced", &options, async {
                    let token = lock_runtime::current().unwrap().fencing_token().unwrap();
                    seen.lock().unwrap().push(token);
                })
                .await
                .unwrap();
            }
        })
    });
    for task in futures_util::future::join_all(tasks).await {
        task.unwrap();
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 200);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "not strictly increasing: {seen:?}"
    );
}

/// Storage that remembers the highest fencing token it accepted and rejects older ones.
#[derive(Default)]
struct FencedStore {
    highest: Mutex<u64>,
    value: Mutex<String>,
}

impl FencedStore {
    fn write(&self, token: u64, value: &str) -> Result<(), String> {
        let mut highest = self.highest.lock().unwrap();
        if token < *highest {
            return Err(format!("token {token} is older than {highest}"));
        }
        *highest = token;
        *self.value.lock().unwrap() = value.to_owned();
        Ok(())
    }
}

async fn stale_holder_write_is_rejected_by_fencing(t: Target) {
    let (a, b) = (t.client(), t.other_client().await);
    let store = FencedStore::default();
    let guard_a = a.acquire("ledger", &ttl(200).fencing(true)).await.unwrap();
    let token_a = guard_a.fencing_token().unwrap();
    // A pauses (a GC pause, a slow disk) past its ttl; the lock expires.
    eventually(2 * SECOND, "A's lease expires", || async {
        !b.is_locked("ledger").await.unwrap()
    })
    .await;
    let guard_b = b.acquire("ledger", &ttl(5000).fencing(true)).await.unwrap();
    let token_b = guard_b.fencing_token().unwrap();
    assert!(token_b > token_a);
    store.write(token_b, "B's write").unwrap();
    // A wakes up and writes, unaware: storage refuses it.
    assert!(store.write(token_a, "A's stale write").is_err());
    assert_eq!(*store.value.lock().unwrap(), "B's write");
    assert!(
        guard_a.is_lost(),
        "A can also see for itself that it lost the lock"
    );
    guard_b.release().await.unwrap();
}

async fn nested_calls_on_the_same_key_are_reentrant(t: Target) {
    let c = t.client();
    let options = ttl(5000);
    let out = c
        .run("outer", &options, async {
            let inner = c
                .run("outer", &options, async {
                    // deeper still
                    c.run("outer", &options, async { 3 }).await.unwrap()
                })
                .await
                .unwrap();
            assert!(
                c.is_locked("outer").await.unwrap(),
                "the inner call must not release"
            );
            let other_key = c
                .run("other", &options, async { c.is_locked("other").await.unwrap() })
                .await
                .unwrap();
            assert!(other_key, "a nested call on another key acquires it");
            assert!(!c.is_locked("other").await.unwrap(), "and releases it");
            inner
        })
        .await
        .unwrap();
    assert_eq!(out, 3);
    assert!(
        !c.is_locked("outer").await.unwrap(),
        "the outermost call releases"
    );
}

async fn reentrancy_is_per_call_chain_not_per_client(t: Target) {
    let c = t.client();
    let options = ttl(5000);
    c.run("chain", &options, async {
        // A task spawned from the body is another owner.
        let spawned = tokio::spawn({
            let c = c.clone();
            let options = options.clone();
            async move { c.run("chain", &options, async {}).await }
        });
        assert!(matches!(spawned.await.unwrap(), Err(LockError::Busy { .. })));
        // So is a bare acquire, even on this task.
        assert!(matches!(
            c.acquire("chain", &options).await,
            Err(LockError::Busy { .. })
        ));
    })
    .await
    .unwrap();
    // Two sibling calls polled by one task are two owners too.
    let (a, b) = tokio::join!(
        c.run(
            "siblings",
            &options,
            tokio::time::sleep(Duration::from_millis(100))
        ),
        c.run(
            "siblings",
            &options,
            tokio::time::sleep(Duration::from_millis(100))
        ),
    );
    assert!(a.is_ok() != b.is_ok(), "{a:?} {b:?}");
}

async fn minimum_hold_keeps_the_lock_after_a_fast_body(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let hold = Duration::from_millis(600);
    let started = Instant::now();
    c.run("job:nightly", &ttl(10_000).hold_at_least(hold), async {})
        .await
        .unwrap();
    assert!(
        c.is_locked("job:nightly").await.unwrap(),
        "released before the minimum hold"
    );
    let left = c.remaining_ttl("job:nightly").await.unwrap().unwrap();
    assert!(left <= hold, "{left:?}");
    assert!(matches!(
        other.acquire("job:nightly", &ttl(1000)).await,
        Err(LockError::Busy { .. })
    ));
    // A waiter is not let in early, and gets in once the hold is over.
    let guard = other
        .acquire("job:nightly", &ttl(1000).wait(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(
        started.elapsed() >= hold - Duration::from_millis(20),
        "{:?}",
        started.elapsed()
    );
    guard.release().await.unwrap();
    // A body that outlasts the minimum hold releases at once.
    c.run(
        "job:slow",
        &ttl(10_000).hold_at_least(Duration::from_millis(50)),
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
        },
    )
    .await
    .unwrap();
    assert!(!c.is_locked("job:slow").await.unwrap());
}

async fn current_is_the_innermost_lock(t: Target) {
    let c = t.client();
    assert!(lock_runtime::current().is_none());
    let fenced = ttl(5000).fencing(true);
    c.run("outer", &fenced, async {
        let outer = lock_runtime::current().unwrap();
        assert_eq!(outer.key(), "outer");
        assert!(outer.fencing_token().is_some_and(|t| t > 0));
        c.run("inner", &ttl(5000), async {
            let inner = lock_runtime::current().unwrap();
            assert_eq!(inner.key(), "inner");
            assert_eq!(inner.fencing_token(), None);
        })
        .await
        .unwrap();
        assert_eq!(lock_runtime::current().unwrap().key(), "outer");
        let spawned = tokio::spawn(async { lock_runtime::current() }).await.unwrap();
        assert!(spawned.is_none(), "a spawned task holds nothing");
    })
    .await
    .unwrap();
    assert!(lock_runtime::current().is_none());
}

async fn waiting_leaves_no_subscriptions_behind(t: Target) {
    const TASKS: usize = 10;
    const CYCLES: usize = 500; // 10 × 500 = 5,000 lock/unlock cycles over 5 keys
    let c = t.client();
    let tasks = (0..TASKS).map(|i| {
        let c = c.clone();
        tokio::spawn(async move {
            let key = format!("leak:{}", i % 5);
            for _ in 0..CYCLES {
                let guard = c
                    .acquire(&key, &ttl(10_000).wait(Duration::from_secs(30)))
                    .await
                    .unwrap();
                guard.release().await.unwrap();
            }
        })
    });
    for task in futures_util::future::join_all(tasks).await {
        task.unwrap();
    }
    assert_eq!(c.waiting_channels(), 0);
    if let Some(server) = t.server() {
        eventually(
            5 * SECOND,
            "every channel is unsubscribed on the server",
            || async { server.subscribed_channels().await.is_empty() },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_survive_a_subscriber_connection_loss() {
    let t = Target::redis().await;
    let c = t.client();
    let holder = c.acquire("survive", &ttl(60_000)).await.unwrap();
    let waiter = tokio::spawn({
        let c = c.clone();
        async move {
            c.acquire("survive", &ttl(5000).wait(Duration::from_secs(30)))
                .await
        }
    });
    eventually(2 * SECOND, "the waiter listens", || async {
        c.waiting_channels() == 1
    })
    .await;
    let server = t.server().unwrap();
    let mut raw = server.raw().await;
    eventually(2 * SECOND, "the waiter's channel is subscribed", || async {
        server.subscribed_channels().await.len() == 1
    })
    .await;
    // Drop every pub/sub client connection from the server side.
    let killed: i64 = ::redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "pubsub"])
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(killed, 1, "one subscriber connection per client");
    eventually(3 * SECOND, "the waiter subscribes again", || async {
        server.subscribed_channels().await.len() == 1
    })
    .await;
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let guard = waiter.await.unwrap().unwrap();
    assert!(
        released_at.elapsed() < MAX_WAIT_NAP / 2,
        "{:?}",
        released_at.elapsed()
    );
    guard.release().await.unwrap();
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<LockClient>();
    check::<lock_runtime::LockGuard>();
    check::<LockError>();
}

async fn nested_fencing_without_an_outer_token_is_invalid(t: Target) {
    let c = t.client();
    let out = c
        .run("unfenced", &ttl(5000), async {
            c.run("unfenced", &ttl(5000).fencing(true), async {}).await
        })
        .await
        .unwrap();
    assert!(matches!(out, Err(LockError::InvalidOptions { .. })), "{out:?}");
}

/// Starts a task waiting for `key` on `client` with `options`, and returns once it is queued
/// behind the ones already there; holding the lock, the task notes `index` in `order`, then
/// releases.
async fn queue_waiter(
    client: &LockClient,
    (key, options): (&'static str, LockOptions),
    index: usize,
    order: &Arc<Mutex<Vec<usize>>>,
) -> tokio::task::JoinHandle<()> {
    let before = lock_tests::waiting(client, key);
    let task = tokio::spawn({
        let (client, order) = (client.clone(), Arc::clone(order));
        async move {
            let guard = client.acquire(key, &options).await.unwrap();
            order.lock().unwrap().push(index);
            guard.release().await.unwrap();
        }
    });
    lock_tests::joined_line(client, key, before).await;
    task
}

async fn a_release_wakes_local_waiters_one_at_a_time_in_arrival_order(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let holder = other.acquire("fifo", &ttl(60_000)).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        tasks.push(queue_waiter(&c, ("fifo", ttl(5000).wait(30 * SECOND)), i, &order).await);
    }
    let released_at = Instant::now();
    holder.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        [0, 1, 2, 3, 4],
        "first come, first served"
    );
    assert!(
        released_at.elapsed() < MAX_WAIT_NAP,
        "each release woke the next waiter; none waited for a timer"
    );
    assert_eq!(c.waiting("fifo").unwrap(), 0);
}

async fn a_cancelled_waiter_does_not_take_the_next_wake_up_with_it(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let holder = other.acquire("cancel", &ttl(60_000)).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let waiter = || ("cancel", ttl(5000).wait(30 * SECOND));
    let first = queue_waiter(&c, waiter(), 0, &order).await;
    let second = queue_waiter(&c, waiter(), 1, &order).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    assert_eq!(c.waiting("cancel").unwrap(), 1);
    let released_at = Instant::now();
    holder.release().await.unwrap();
    second.await.unwrap();
    assert!(
        released_at.elapsed() < MAX_WAIT_NAP / 2,
        "the remaining waiter was woken by the release: {:?}",
        released_at.elapsed()
    );
    assert_eq!(*order.lock().unwrap(), [1]);
}

/// Two clients wait; the first release wakes both, one takes the lock, and the other, refused
/// again, must hear the new holder's release too (on Redis a release is announced only to a
/// lock that a refused waiter marked: the mark goes with each lock, so the loser sets it anew).
async fn after_a_hand_off_between_clients_the_next_release_still_wakes_the_rest(t: Target) {
    let t = Arc::new(t);
    let (c, others) = (t.client(), [t.other_client().await, t.other_client().await]);
    let holder = c.acquire("relay", &ttl(60_000)).await.unwrap();
    let mut waiters = Vec::new();
    let turns_taken = Arc::new(AtomicU64::new(0));
    for other in &others {
        let before = lock_tests::waiting(other, "relay");
        waiters.push(tokio::spawn({
            let (t, other, turns_taken) = (Arc::clone(&t), other.clone(), Arc::clone(&turns_taken));
            async move {
                let guard = other
                    .acquire("relay", &ttl(60_000).wait(30 * SECOND))
                    .await
                    .unwrap();
                let acquired_at = Instant::now();
                // The first to get it holds it until the other waiter, woken by the same
                // release, was refused by it.
                if turns_taken.fetch_add(1, Ordering::SeqCst) == 0 {
                    t.refused_waiter("relay").await;
                }
                let released_at = Instant::now();
                assert!(guard.release().await.unwrap());
                (acquired_at, released_at)
            }
        }));
        lock_tests::joined_line(other, "relay", before).await;
    }
    t.refused_waiter("relay").await;
    let released_at = Instant::now();
    assert!(holder.release().await.unwrap());
    let mut turns = Vec::new();
    for waiter in waiters {
        turns.push(waiter.await.unwrap());
    }
    turns.sort();
    let [(first, first_released), (second, _)] = turns[..] else {
        unreachable!("two waiters")
    };
    lock_tests::assert_woken_by_the_release(first - released_at);
    lock_tests::assert_woken_by_the_release(second - first_released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_costs_one_attempt_not_one_per_waiter() {
    let t = Target::redis().await;
    let (c, other) = (t.client(), t.other_client().await);
    let server = t.server().unwrap();
    let holder = other.acquire("o1", &ttl(60_000)).await.unwrap();
    let scripts_before = server.command_calls("evalsha").await;
    const WAITERS: u64 = 16;
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move {
                let guard = c.acquire("o1", &ttl(5000).wait(30 * SECOND)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
                guard.release().await.unwrap();
            })
        })
        .collect();
    eventually(5 * SECOND, "every waiter queues", || async {
        c.waiting("o1").unwrap() == WAITERS as usize
    })
    .await;
    holder.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let scripts = server.command_calls("evalsha").await - scripts_before;
    // Per waiter: at most one retry when it first queues, one attempt when woken, and its
    // release. Waking every waiter on every release would cost about WAITERS² / 2 attempts.
    assert!(
        scripts <= 3 * WAITERS + 1,
        "{scripts} scripts for {WAITERS} hand-offs"
    );
}

async fn fair_waiters_of_several_clients_get_the_lock_in_arrival_order(t: Target) {
    let clients = [t.client(), t.other_client().await, t.other_client().await];
    let holder = clients[0].acquire("fair", &ttl(60_000).fair(true)).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        // Alternate clients, so the order is kept across them, not just within one. Each is in
        // line (refused once, so it has its place) before the next one comes.
        let fair = ttl(5000).fair(true).wait(30 * SECOND);
        tasks.push(queue_waiter(&clients[i % 3], ("fair", fair), i, &order).await);
    }
    let released_at = Instant::now();
    holder.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        [0, 1, 2, 3, 4, 5],
        "first come, first served"
    );
    assert!(
        released_at.elapsed() < MAX_WAIT_NAP,
        "each release woke the next in line: {:?}",
        released_at.elapsed()
    );
}

async fn a_fair_waiter_that_gives_up_leaves_the_line_at_once(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let fair = ttl(60_000).fair(true);
    let holder = c.acquire("line", &fair).await.unwrap();
    // First in line, but gives up.
    let out = other
        .acquire("line", &fair.clone().wait(Duration::from_millis(200)))
        .await;
    assert!(matches!(out, Err(LockError::Busy { .. })), "{out:?}");
    let next = in_line(&c, "line", ttl(5000).fair(true).wait(30 * SECOND)).await;
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let guard = next.await.unwrap().unwrap();
    assert!(
        released_at.elapsed() < lock_runtime::FAIR_PLACE_KEPT / 2,
        "the one that gave up left the line; nobody waited for its place to lapse: {:?}",
        released_at.elapsed()
    );
    guard.release().await.unwrap();
}

/// A fair release hands the lock to the next in line (without that waiter asking) for a lease
/// no longer than its place's; the new holder's client extends it to its ttl, without the
/// watchdog, so it is neither lost nor left to expire when held past that lease.
async fn a_lock_handed_over_in_line_is_kept_for_its_whole_ttl(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let fenced = ttl(60_000).fair(true).fencing(true);
    let holder = c.acquire("handed", &fenced).await.unwrap();
    let waiter = in_line(
        &other,
        "handed",
        ttl(5000).fair(true).fencing(true).wait(30 * SECOND),
    )
    .await;
    let before = holder.fencing_token().unwrap();
    holder.release().await.unwrap();
    let guard = waiter.await.unwrap().unwrap();
    let taken_at = Instant::now();
    assert!(
        guard.fencing_token().unwrap() > before,
        "a token above the last holder's"
    );
    eventually(
        3 * SECOND,
        "the handed-over lock is extended to its ttl",
        || async {
            // Asked of the holder's own client: on ZooKeeper only it knows its lease.
            other
                .remaining_ttl("handed")
                .await
                .unwrap()
                .is_some_and(|left| left > lock_runtime::FAIR_PLACE_KEPT + SECOND)
        },
    )
    .await;
    // Past the lease it was handed over with: still valid, still held.
    tokio::time::sleep_until(taken_at + lock_runtime::FAIR_PLACE_KEPT + Duration::from_millis(200)).await;
    assert!(!guard.is_lost(), "the extension counts for the holder too");
    assert!(c.is_locked("handed").await.unwrap());
    assert!(guard.release().await.unwrap());
}

/// A release hands the lock over with a fencing token only when the key has a counter: a
/// fencing waiter handed a lock without one asks, and gets its token then.
async fn a_fencing_waiter_handed_a_lock_without_a_counter_gets_a_token(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let holder = c.acquire("uncounted", &ttl(60_000).fair(true)).await.unwrap();
    let waiter = in_line(
        &other,
        "uncounted",
        ttl(5000).fair(true).fencing(true).wait(30 * SECOND),
    )
    .await;
    holder.release().await.unwrap();
    let guard = waiter.await.unwrap().unwrap();
    assert!(guard.fencing_token().is_some_and(|token| token > 0));
    assert!(guard.release().await.unwrap());
}

/// A waiter that leaves after a release handed it the lock (cancelled before it saw the
/// hand-over) gives it back to the next in line at once: nobody waits for the lease to lapse.
/// In memory, on a paused clock, so the cancellation lands between the two.
#[tokio::test(start_paused = true)]
async fn a_lock_handed_to_a_waiter_that_left_goes_to_the_next_in_line() {
    let c = LockClient::in_memory();
    let holder = c.acquire("left", &ttl(60_000).fair(true)).await.unwrap();
    let fair = ttl(5000).fair(true).wait(30 * SECOND);
    let first = in_line(&c, "left", fair.clone()).await;
    let second = in_line(&c, "left", fair).await;
    let released_at = Instant::now();
    holder.release().await.unwrap(); // hands the lock to the first waiter ...
    first.abort(); // ... which is cancelled before it runs again
    let guard = second.await.unwrap().unwrap();
    assert!(
        released_at.elapsed() < lock_runtime::FAIR_PLACE_KEPT / 2,
        "the lock went on at once, not when the first waiter's lease lapsed: {:?}",
        released_at.elapsed()
    );
    guard.release().await.unwrap();
}

/// A hand-over names the place it was made for (what the waiter's attempt that kept it was
/// told): one for another place (made before the waiter's last attempt, and lapsed since, the
/// lock gone to the next in line) is not taken as the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_for_another_place_is_not_taken_as_the_lock() {
    use ::redis::AsyncCommands;
    let t = Target::redis().await;
    let (c, other) = (t.client(), t.other_client().await);
    let mut raw = t.server().unwrap().raw().await;
    let holder = c.acquire("stale", &ttl(60_000).fair(true)).await.unwrap();
    let waiter = in_line(
        &other,
        "stale",
        ttl(5000).fair(true).wait(Duration::from_millis(1500)),
    )
    .await;
    let line: Vec<String> = raw.zrange("lock:{stale}:queue", 0, -1).await.unwrap();
    let kept: u64 = raw.zscore("lock:{stale}:queue:kept", &line[0]).await.unwrap();
    // As a release would announce a hand-over made for an earlier place of this waiter.
    let _: () = raw
        .publish("lock:{stale}:released", format!("g:0:{}:{}", kept - 700, line[0]))
        .await
        .unwrap();
    let out = waiter.await.unwrap();
    assert!(
        matches!(out, Err(LockError::Busy { .. })),
        "the holder still holds it: {:?}",
        out.map(|guard| guard.key().to_owned())
    );
    holder.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_barges_ahead_of_the_fair_line_until_its_head_lapses() {
    use ::redis::AsyncCommands;
    let t = Target::redis().await;
    let c = t.client();
    let mut raw = t.server().unwrap().raw().await;
    // A waiter of another process is first in line, its place kept for a minute; the lock is free.
    let _: () = raw.zadd("lock:{barge}:queue", "elsewhere", 1).await.unwrap();
    let kept_until: u64 = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        + Duration::from_secs(60))
    .as_millis()
    .try_into()
    .unwrap();
    let _: () = raw
        .zadd("lock:{barge}:queue:kept", "elsewhere", kept_until)
        .await
        .unwrap();
    let fair = ttl(5000).fair(true);
    let out = c.acquire("barge", &fair).await;
    assert!(
        matches!(out, Err(LockError::Busy { .. })),
        "a fair try must not barge: {out:?}"
    );
    let out = c
        .acquire("barge", &fair.clone().wait(Duration::from_millis(300)))
        .await;
    assert!(
        matches!(out, Err(LockError::Busy { .. })),
        "nor a fair wait: {out:?}"
    );
    eventually(2 * SECOND, "the waiter that gave up leaves the line", || {
        let mut raw = raw.clone();
        async move {
            let line: Vec<String> = raw.zrange("lock:{barge}:queue", 0, -1).await.unwrap();
            line == ["elsewhere"]
        }
    })
    .await;
    // Its place lapses: the line moves on.
    let _: () = raw.zadd("lock:{barge}:queue:kept", "elsewhere", 1).await.unwrap();
    let guard = c.acquire("barge", &fair).await.unwrap();
    let line: usize = raw.zcard("lock:{barge}:queue").await.unwrap();
    assert_eq!(line, 0);
    guard.release().await.unwrap();
}

async fn a_nested_call_keeps_its_own_lost_policy(t: Target) {
    let c = t.client();
    let finished = AtomicBool::new(false);
    let outer = c
        .run(
            "policy",
            &ttl(150).on_lost(lock_runtime::OnLost::Continue),
            async {
                // No watchdog: the 150 ms lease runs out while the nested body sleeps.
                c.run("policy", &ttl(150), async {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    finished.store(true, Ordering::SeqCst);
                })
                .await
            },
        )
        .await;
    let nested = outer.expect("the outer call continues, as it asked");
    assert!(matches!(nested, Err(LockError::Lost { .. })), "{nested:?}");
    assert!(
        !finished.load(Ordering::SeqCst),
        "the nested body was aborted, as it asked"
    );
}

/// The converse: the outer call aborts when its lock is lost, and a nested call that asked to
/// continue is inside the outer body, so it stops too (its body is dropped with the outer one).
async fn an_outer_abort_stops_a_continuing_nested_call(t: Target) {
    let c = t.client();
    let finished = AtomicBool::new(false);
    let outer = c
        .run(
            "outer-abort",
            &ttl(150).on_lost(lock_runtime::OnLost::Abort),
            async {
                // No watchdog: the 150 ms lease runs out while the nested body sleeps.
                c.run(
                    "outer-abort",
                    &ttl(150).on_lost(lock_runtime::OnLost::Continue),
                    async {
                        tokio::time::sleep(Duration::from_millis(400)).await;
                        finished.store(true, Ordering::SeqCst);
                    },
                )
                .await
            },
        )
        .await;
    assert!(matches!(outer, Err(LockError::Lost { .. })), "{outer:?}");
    // The body borrowed `finished` and is gone with the call: it never got to its end.
    assert!(
        !finished.load(Ordering::SeqCst),
        "the outer call waited for the nested body instead of aborting it"
    );
}

async fn a_nested_minimum_hold_extends_the_outer_one(t: Target) {
    let c = t.client();
    let started = Instant::now();
    c.run("nested-hold", &ttl(5000), async {
        c.run(
            "nested-hold",
            &ttl(5000).hold_at_least(Duration::from_millis(400)),
            async {},
        )
        .await
        .unwrap();
    })
    .await
    .unwrap();
    assert!(
        c.is_locked("nested-hold").await.unwrap(),
        "the outermost release keeps the lock for the nested call's minimum hold"
    );
    eventually(3 * SECOND, "the hold ends", || async {
        !c.is_locked("nested-hold").await.unwrap()
    })
    .await;
    assert!(started.elapsed() >= Duration::from_millis(400));
}

async fn nested_calls_joined_in_one_body_take_turns(t: Target) {
    let c = t.client();
    let inside = AtomicU64::new(0);
    let most = AtomicU64::new(0);
    let nested = |n: u64| {
        let (c, inside, most) = (&c, &inside, &most);
        async move {
            c.run("turns", &ttl(5000), async {
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(30)).await;
                // A call nested one level deeper still runs: it does not wait for itself.
                c.run("turns", &ttl(5000), async {}).await.unwrap();
                inside.fetch_sub(1, Ordering::SeqCst);
                n
            })
            .await
            .unwrap()
        }
    };
    let (a, b, d) = c
        .run("turns", &ttl(5000), async {
            tokio::join!(nested(1), nested(2), nested(3))
        })
        .await
        .unwrap();
    assert_eq!((a, b, d), (1, 2, 3));
    assert_eq!(most.load(Ordering::SeqCst), 1, "nested bodies overlapped");
}

#[tokio::test]
async fn nested_guarded_futures_hold_their_body_once() {
    // Each layer holds its body once, behind a pointer, so nesting grows the future linearly;
    // before, every layer held its body two or three times, and three levels of nesting joined
    // in one body overflowed a worker thread's stack.
    let c = LockClient::in_memory();
    let o = ttl(5000);
    let one = std::mem::size_of_val(&c.run("x", &o, async {}));
    let three = std::mem::size_of_val(&c.run("x", &o, async {
        c.run("x", &o, async { c.run("x", &o, async {}).await }).await
    }));
    assert!(three <= 4 * one, "one level: {one} bytes, three: {three} bytes");
}

/// With `on_lost = "continue"`, the body asks `current()` whether its lock is lost, and can wait
/// for it.
async fn a_continuing_body_can_see_its_lock_lost(t: Target) {
    let c = t.client();
    let options = ttl(200).on_lost(lock_runtime::OnLost::Continue);
    let out = c
        .run("seen-lost", &options, async {
            let lock = lock_runtime::current().expect("inside a guarded body");
            assert!(!lock.is_lost());
            tokio::time::timeout(5 * SECOND, lock.lost())
                .await
                .expect("a lease without a watchdog is lost at its end");
            assert!(lock.is_lost());
            assert!(lock_runtime::current().is_some_and(|l| l.is_lost() && l == lock));
            "finished"
        })
        .await;
    assert_eq!(out.ok(), Some("finished"));
}

/// A holder that did not ask for `fair` releases without announcing to a fair waiter (a fair
/// waiter sets no waiting mark, and the release does not look at the line), so the waiter finds
/// the lock free at its next attempt: within the 300 ms a fair waiter asks again at the most
/// (plus slack for a loaded machine), never at the end of a plain waiter's nap (1.7 s or more)
/// or of the holder's ttl (a minute).
async fn a_release_without_fair_reaches_a_fair_waiter_at_its_next_attempt(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let holder = c.acquire("unfair-release", &ttl(60_000)).await.unwrap();
    let waiter = in_line(
        &other,
        "unfair-release",
        ttl(5000).fair(true).wait(Duration::from_secs(30)),
    )
    .await;
    let released_at = Instant::now();
    assert!(holder.release().await.unwrap());
    let guard = waiter.await.unwrap().unwrap();
    let took = released_at.elapsed();
    let bound = Duration::from_millis(300 + 400);
    assert!(
        took < bound,
        "the fair waiter took {took:?} after the release (bound {bound:?})"
    );
    guard.release().await.unwrap();
}
