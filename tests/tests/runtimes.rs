//! One client used from one tokio runtime after another, as a `static` or default client is across
//! `#[tokio::test]`s (each test has a runtime of its own). Issue 23: the client's background
//! tasks (the watchdog, the wake-up subscriber) were started once, on the first runtime, and
//! died with it: on the next runtime no watchdog lock was renewed again, and no waiter heard a
//! release. Each must start again on the runtime that needs it.

use std::time::Duration;

use lock_runtime::LockClient;
use lock_tests::{assert_woken_by_the_release, ttl, RedisServer};
use std::time::Instant;

fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => panic!("a runtime: {e}"),
    }
}

/// On `runtime`: a watchdog lock with a 300 ms ttl is still held, and in the store, 1 s later.
fn watchdog_renews_on(runtime: &tokio::runtime::Runtime, locks: &LockClient, key: &str) {
    runtime.block_on(async {
        let guard = locks.acquire(key, &ttl(300).watchdog(true)).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !guard.is_lost(),
            "the watchdog did not renew the lock on this runtime"
        );
        assert!(locks.is_locked(key).await.unwrap());
        assert!(guard.release().await.unwrap());
    });
}

/// On `runtime`: a waiter is woken by the release itself, not by its nap's end (the holder's
/// ttl is 30 s, so the nap is long).
fn waiter_wakes_on(
    runtime: &tokio::runtime::Runtime,
    server: &RedisServer,
    (locks, other): (&LockClient, &LockClient),
    key: &'static str,
) {
    runtime.block_on(async {
        let guard = locks.acquire(key, &ttl(30_000)).await.unwrap();
        let waiter = lock_tests::spawn_waiter(other.clone(), key, Duration::from_secs(10));
        // Asleep: its second attempt, made once it listens, left the waiting mark.
        server.waiter_refused(key).await;
        let released = Instant::now();
        assert!(guard.release().await.unwrap());
        let (taken_at, taken) = waiter.await.unwrap();
        assert_woken_by_the_release(taken_at - released);
        assert!(taken.unwrap().release().await.unwrap());
    });
}

#[test]
fn a_client_goes_on_working_on_a_second_runtime_redis() {
    let server = RedisServer::spawn();
    let first = runtime();
    let (locks, other) = first.block_on(async {
        (
            lock_tests::connect(&server.url()).await,
            lock_tests::connect(&server.url()).await,
        )
    });
    watchdog_renews_on(&first, &locks, "runtimes:dog");
    waiter_wakes_on(&first, &server, (&locks, &other), "runtimes:wake");
    drop(first);
    let second = runtime();
    watchdog_renews_on(&second, &locks, "runtimes:dog");
    waiter_wakes_on(&second, &server, (&locks, &other), "runtimes:wake");
}

#[test]
fn a_client_goes_on_working_on_a_second_runtime_memory() {
    let locks = LockClient::in_memory();
    let first = runtime();
    watchdog_renews_on(&first, &locks, "runtimes:dog");
    drop(first);
    let second = runtime();
    watchdog_renews_on(&second, &locks, "runtimes:dog");
}
