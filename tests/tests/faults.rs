//! What only a real Redis can do to a lock: go down, freeze, restart empty, forget its scripts,
//! or hold something at the lock's key that is not a lock.

use std::time::Duration;

use lock_runtime::{LockClient, LockError};
use lock_tests::{connect, eventually, ttl, RedisServer, SECOND};
use redis::AsyncCommands;
use tokio::time::Instant;

fn is_unavailable<T: std::fmt::Debug>(r: &Result<T, LockError>) -> bool {
    matches!(r, Err(LockError::Unavailable { .. }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_a_dead_server_is_unavailable_not_a_hang() {
    let mut server = RedisServer::spawn();
    let url = server.url();
    server.kill();
    let started = Instant::now();
    let out = LockClient::builder()
        .url(&url)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await;
    assert!(is_unavailable(&out), "{out:?}");
    assert!(started.elapsed() < 5 * SECOND, "took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_url_is_invalid_options() {
    let out = LockClient::connect("http://not-redis").await;
    assert!(matches!(out, Err(LockError::InvalidOptions { .. })), "{out:?}");
    let out = LockClient::builder().build().await;
    assert!(matches!(out, Err(LockError::InvalidOptions { .. })), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_after_connect_is_unavailable() {
    let mut server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    server.kill();
    let started = Instant::now();
    let out = client.acquire("down", &ttl(1000)).await;
    assert!(is_unavailable(&out), "{out:?}");
    let out = client.run("down", &ttl(1000).wait(SECOND), async {}).await;
    assert!(is_unavailable(&out), "{out:?}");
    assert!(started.elapsed() < 5 * SECOND, "took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_is_unavailable_within_the_response_timeout() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await; // response timeout 500 ms
    server.pause();
    let started = Instant::now();
    let out = client.acquire("frozen", &ttl(1000)).await;
    let took = started.elapsed();
    server.resume();
    assert!(is_unavailable(&out), "{out:?}");
    assert!(took < 3 * SECOND, "took {took:?}");
}

/// Not just the first request: after two unanswered ones the connection counts as silent and
/// the next request opens a new one, which against a frozen server (the kernel still accepts,
/// nothing answers) would wait the whole connect timeout. Each request stays within its
/// response timeout, the open included; the open goes on in the background, and a request
/// after the server thaws finds its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_to_a_frozen_server_ends_within_the_response_timeout() {
    let server = RedisServer::spawn();
    let response = Duration::from_millis(500);
    let client = lock_tests::test_builder(&server.url())
        .connect_timeout(Duration::from_secs(20))
        .response_timeout(response)
        .build()
        .await
        .unwrap();
    let held = client.acquire("frozen-held", &ttl(60_000)).await.unwrap();
    server.pause();
    // Far above the response timeout, far below the connect timeout.
    let bound = response + 2 * SECOND;
    let mut took = Vec::new();
    for i in 0..6 {
        let started = Instant::now();
        let out = match i % 3 {
            0 => client.acquire(&format!("frozen-{i}"), &ttl(1000)).await.map(drop),
            1 => client.is_locked("frozen-held").await.map(drop),
            _ => client.holder("frozen-held").await.map(drop),
        };
        took.push(started.elapsed());
        assert!(is_unavailable(&out), "request {i}: {out:?}");
    }
    server.resume();
    assert!(
        took.iter().all(|t| *t < bound),
        "a request waited past {bound:?}: {took:?}"
    );
    eventually(
        5 * SECOND,
        "requests work again once the server thaws",
        || async { client.is_locked("frozen-held").await.is_ok_and(|locked| locked) },
    )
    .await;
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_past_the_ttl_means_lost() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    let guard = client.acquire("paused", &ttl(300).watchdog(true)).await.unwrap();
    server.pause();
    let lost = tokio::time::timeout(3 * SECOND, guard.lost()).await;
    server.resume();
    assert!(
        lost.is_ok(),
        "a holder that cannot renew must learn it lost the lock"
    );
    assert!(guard.is_lost());
    // Even though the key may still be there (it was frozen too), the loss is sticky.
    assert!(matches!(guard.extend(SECOND).await, Err(LockError::Lost { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_while_held_means_lost_and_then_works_again() {
    let mut server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    let guard = client.acquire("restart", &ttl(300).watchdog(true)).await.unwrap();
    server.restart();
    tokio::time::timeout(3 * SECOND, guard.lost())
        .await
        .expect("the holder learns its lock vanished with the restart");
    drop(guard);
    let deadline = Instant::now() + 5 * SECOND;
    let fresh = loop {
        match client.acquire("restart", &ttl(5000)).await {
            Ok(guard) => break guard,
            Err(LockError::Unavailable { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("no fresh acquire after the restart: {e:?}"),
        }
    };
    assert!(fresh.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_del_is_noticed_by_the_watchdog() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    let guard = client.acquire("del", &ttl(300).watchdog(true)).await.unwrap();
    let mut raw = server.raw().await;
    let deleted: i64 = raw.del("lock:{del}").await.unwrap();
    assert_eq!(deleted, 1);
    tokio::time::timeout(2 * SECOND, guard.lost())
        .await
        .expect("lost after DEL");
    let exists: bool = raw.exists("lock:{del}").await.unwrap();
    assert!(!exists, "the watchdog must never re-create a missing key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_model_is_as_documented() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    let mut raw = server.raw().await;
    let guard = client
        .acquire("order:42", &ttl(5000).fencing(true))
        .await
        .unwrap();
    let token: String = raw.get("lock:{order:42}").await.unwrap();
    let (id, owner) = token.split_once(' ').expect("<uuid> <owner>");
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "a UUID v4 as 32 hex digits: {token}"
    );
    assert_eq!(
        owner,
        format!("{}:{}", owner.rsplit_once(':').unwrap().0, std::process::id()),
        "<hostname>:<pid>"
    );
    let fence: u64 = raw.get("lock:{order:42}:fence").await.unwrap();
    assert_eq!(Some(fence), guard.fencing_token());
    let pttl: i64 = raw.pttl("lock:{order:42}").await.unwrap();
    assert!((3000..=5000).contains(&pttl), "{pttl}");
    let fence_ttl: i64 = raw.pttl("lock:{order:42}:fence").await.unwrap();
    assert!(
        (3_590_000..=3_601_000).contains(&fence_ttl),
        "the fencing counter expires an hour after its last token: {fence_ttl}"
    );
    guard.release().await.unwrap();
    let again = client.acquire("order:42", &ttl(5000)).await.unwrap();
    let second: String = raw.get("lock:{order:42}").await.unwrap();
    assert_ne!(token, second, "a fresh token for every acquisition");
    again.release().await.unwrap();

    let prefixed = LockClient::builder()
        .url(&server.url())
        .prefix("billing:")
        .build()
        .await
        .unwrap();
    let guard = prefixed.acquire("x", &ttl(5000)).await.unwrap();
    let exists: bool = raw.exists("billing:{x}").await.unwrap();
    assert!(exists);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_at_the_key_are_busy_and_left_intact() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    let mut raw = server.raw().await;
    let _: () = raw.set("lock:{string}", "not-a-token").await.unwrap();
    let _: () = raw.hset("lock:{hash}", "field", "value").await.unwrap();
    let _: () = raw.rpush("lock:{list}", "item").await.unwrap();
    for key in ["string", "hash", "list"] {
        let out = client.acquire(key, &ttl(1000)).await;
        assert!(matches!(out, Err(LockError::Busy { .. })), "{key}: {out:?}");
        assert!(!client.force_release("never-held").await.unwrap());
    }
    let s: String = raw.get("lock:{string}").await.unwrap();
    assert_eq!(s, "not-a-token");
    let ttl_left: i64 = raw.pttl("lock:{string}").await.unwrap();
    assert_eq!(ttl_left, -1, "a foreign value's expiry is not touched");
    let h: String = raw.hget("lock:{hash}", "field").await.unwrap();
    assert_eq!(h, "value");
    let l: Vec<String> = raw.lrange("lock:{list}", 0, -1).await.unwrap();
    assert_eq!(l, ["item"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_fence_counter_fails_cleanly_without_a_lock() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    let mut raw = server.raw().await;
    let _: () = raw.hset("lock:{fenced}:fence", "f", "v").await.unwrap();
    let out = client.acquire("fenced", &ttl(1000).fencing(true)).await;
    assert!(is_unavailable(&out), "{out:?}");
    let exists: bool = raw.exists("lock:{fenced}").await.unwrap();
    assert!(!exists, "no lock key without its fencing token");
    for bad in ["-1", "1.5", "abc"] {
        let _: () = raw.set("lock:{negative}:fence", bad).await.unwrap();
        let out = client.acquire("negative", &ttl(1000).fencing(true)).await;
        assert!(is_unavailable(&out), "{bad}: {out:?}");
        let exists: bool = raw.exists("lock:{negative}").await.unwrap();
        assert!(!exists, "{bad}: no lock key");
        let counter: String = raw.get("lock:{negative}:fence").await.unwrap();
        assert_eq!(counter, bad, "a failed script changes nothing");
    }
}

/// Issue 23: a counter INCRBY would overflow, or a fair line of another type, fails the script
/// before it writes anything: no lock key is left without its token, and none is deleted by a
/// release that then fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_check_every_helper_key_before_they_write() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    let mut raw = server.raw().await;
    let huge = "9223372036854775800";
    let _: () = raw.set("lock:{huge}:fence", huge).await.unwrap();
    let out = client.acquire("huge", &ttl(1000).fencing(true)).await;
    assert!(is_unavailable(&out), "{out:?}");
    let exists: bool = raw.exists("lock:{huge}").await.unwrap();
    assert!(!exists, "no lock key without its fencing token");
    let counter: String = raw.get("lock:{huge}:fence").await.unwrap();
    assert_eq!(counter, huge, "a failed script changes nothing");

    let guard = client.acquire("line", &ttl(5000).fair(true)).await.unwrap();
    let _: () = raw.set("lock:{line}:queue", "not a line").await.unwrap();
    let out = guard.release().await;
    assert!(is_unavailable(&out), "{out:?}");
    let exists: bool = raw.exists("lock:{line}").await.unwrap();
    assert!(exists, "a release that failed deleted nothing");
}

/// Issue 23: no key a lock uses is left without an expiry: a service locking a million ids a day
/// must not keep a million keys a day.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_helper_key_expires() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    let other = connect(&server.url()).await;
    let mut raw = server.raw().await;
    let fair = ttl(5000).fair(true).fencing(true);
    let guard = client.acquire("helpers", &fair).await.unwrap();
    let waiter = lock_tests::in_line(&other, "helpers", fair.clone().wait(10 * SECOND)).await;
    for key in [
        "lock:{helpers}",
        "lock:{helpers}:fence",
        "lock:{helpers}:queue",
        "lock:{helpers}:queue:kept",
    ] {
        let left: i64 = raw.pttl(key).await.unwrap();
        assert!(left > 0, "{key} has no expiry ({left})");
    }
    for key in ["lock:{helpers}:queue", "lock:{helpers}:queue:kept"] {
        let left: i64 = raw.pttl(key).await.unwrap();
        assert!(
            left <= 2000,
            "{key} outlives its last waiter's place by more than a second: {left} ms"
        );
    }
    guard.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    let keys: Vec<String> = raw.keys("lock:{helpers}*").await.unwrap();
    for key in keys {
        let left: i64 = raw.pttl(&key).await.unwrap();
        assert!(left > 0, "{key} is left without an expiry ({left})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_script_flush() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    client
        .acquire("flush", &ttl(1000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut raw = server.raw().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();
    let guard = client.acquire("flush", &ttl(1000)).await.unwrap();
    assert!(guard.release().await.unwrap());
}

#[test]
fn guard_dropped_outside_a_runtime_is_left_to_expire() {
    let server = RedisServer::spawn();
    let url = server.url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let guard = runtime.block_on(async {
        let client = connect(&url).await;
        client.acquire("orphan", &ttl(200).watchdog(true)).await.unwrap()
    });
    drop(runtime);
    // No runtime on this thread: the drop must neither panic nor hang.
    drop(guard);
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = connect(&url).await;
        eventually(2 * SECOND, "the orphaned lock expires", || async {
            !client.is_locked("orphan").await.unwrap()
        })
        .await;
    });
}

/// Reads a counter from `INFO`: `field:value` in `stats`, or `calls=` of a command in
/// `commandstats`.
async fn info_counter(raw: &mut redis::aio::MultiplexedConnection, section: &str, field: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg(section).query_async(raw).await.unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| {
            let rest = rest.trim_start_matches(':').trim_start_matches("calls=");
            rest.split([',', '\r']).next()?.parse().ok()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_cancelled_in_flight_leaves_no_orphan_lock() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    let options = ttl(20_000);
    client.run("warm", &options, async {}).await.unwrap(); // scripts loaded
    server.pause();
    // The request is on the wire when the caller gives up; a frozen Redis runs it later.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(100),
        client.run("orphan", &options, async {}),
    )
    .await;
    assert!(cancelled.is_err());
    server.resume();
    eventually(3 * SECOND, "the abandoned acquire's lock is released", || async {
        !client.is_locked("orphan").await.unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_timed_out_leaves_no_orphan_lock() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await; // response timeout 500 ms
    let options = ttl(20_000);
    client.run("warm", &options, async {}).await.unwrap();
    server.pause();
    let out = client.run("orphan", &options, async {}).await;
    server.resume();
    assert!(is_unavailable(&out), "{out:?}");
    eventually(3 * SECOND, "the timed-out acquire's lock is released", || async {
        !client.is_locked("orphan").await.unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_a_frozen_server_give_up_in_parallel() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await; // response timeout 500 ms
    let holder = client.acquire("w", &ttl(30_000)).await.unwrap();
    server.pause();
    let started = Instant::now();
    let waiters: Vec<_> = (0..6)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let key = if i % 2 == 0 {
                    "w".to_owned()
                } else {
                    format!("w{i}")
                };
                client
                    .acquire(&key, &ttl(5000).wait(Duration::from_millis(100)))
                    .await
                    .map(drop)
            })
        })
        .collect();
    for waiter in waiters {
        let out = waiter.await.unwrap();
        assert!(is_unavailable(&out), "{out:?}");
    }
    let took = started.elapsed();
    server.resume();
    drop(holder);
    assert!(took < 2 * SECOND, "waiters queued behind each other: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_refusing_subscribe_is_not_hammered() {
    let server = RedisServer::spawn();
    let mut raw = server.raw().await;
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "default", "-subscribe"])
        .query_async(&mut raw)
        .await
        .unwrap();
    let client = connect(&server.url()).await;
    let holder = client.acquire("refused", &ttl(60_000)).await.unwrap();
    let connections = info_counter(&mut raw, "stats", "total_connections_received").await;
    let attempts = info_counter(&mut raw, "commandstats", "cmdstat_evalsha").await;
    let out = client
        .acquire("refused", &ttl(5000).wait(Duration::from_millis(600)))
        .await;
    assert!(matches!(out, Err(LockError::Busy { .. })), "{out:?}");
    let connections = info_counter(&mut raw, "stats", "total_connections_received").await - connections;
    let attempts = info_counter(&mut raw, "commandstats", "cmdstat_evalsha").await - attempts;
    // One subscriber connection tried, then timers: a couple of attempts, not a loop.
    assert!(connections <= 2, "{connections} new connections");
    assert!(attempts <= 6, "{attempts} acquire attempts in 600 ms");
    holder.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_wait_opens_no_subscription() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    let mut raw = server.raw().await;
    for _ in 0..10 {
        let guard = client.acquire("free", &ttl(5000).wait(SECOND)).await.unwrap();
        guard.release().await.unwrap();
    }
    let subscribers: String = redis::cmd("CLIENT")
        .arg(&["LIST", "TYPE", "pubsub"])
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(subscribers.trim().is_empty(), "{subscribers}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_retries_through_a_short_freeze() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await; // response timeout 500 ms
    let guard = client.acquire("freeze", &ttl(3000).watchdog(true)).await.unwrap();
    // Frozen across the first renewal (due at 1 s): it times out at 1.5 s, and the retries
    // go on while the lock is still valid (until ~2.97 s).
    server.pause();
    tokio::time::sleep(Duration::from_millis(1700)).await; // the freeze itself
    server.resume();
    eventually(3 * SECOND, "a retried renewal extends the lock", || async {
        client
            .remaining_ttl("freeze")
            .await
            .unwrap()
            .is_some_and(|left| left > Duration::from_millis(2500))
    })
    .await;
    assert!(
        !guard.is_lost(),
        "a transient error must not lose a still-valid lock"
    );
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_answered_after_its_validity_never_runs_the_body() {
    let server = RedisServer::spawn();
    let proxy = lock_tests::FaultProxy::start(server.port());
    let client = connect(&proxy.url()).await;
    client.run("warm", &ttl(1000), async {}).await.unwrap(); // scripts loaded
    proxy.delay(Duration::from_millis(80)); // a round trip of at least 160 ms
    let ran = std::sync::atomic::AtomicBool::new(false);
    let out = client
        .run("late", &ttl(100), async {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
        })
        .await;
    assert!(matches!(out, Err(LockError::Lost { .. })), "{out:?}");
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "the body ran on a lock whose validity had passed before it was known to be held"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_pair_executes_four_commands() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    client
        .acquire("lean", &ttl(1000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap(); // scripts loaded
    let before = server.commands_executed().await;
    for _ in 0..10 {
        client
            .acquire("lean", &ttl(1000))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let per_pair = (server.commands_executed().await - before) as f64 / 10.0;
    // SET NX PX GET; EVALSHA running GET, DEL (of the lock and its waiting mark): nobody waits,
    // so nothing is published.
    assert!(per_pair <= 4.0, "{per_pair} commands per acquire + release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_announced_only_when_someone_waits() {
    let server = RedisServer::spawn();
    let (holder, waiter) = (connect(&server.url()).await, connect(&server.url()).await);
    let mut raw = server.raw().await;
    let published = server.command_calls("publish").await;
    holder
        .acquire("heard", &ttl(60_000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(
        server.command_calls("publish").await,
        published,
        "a release nobody waited for was announced"
    );

    let guard = holder.acquire("heard", &ttl(60_000)).await.unwrap();
    let waiting = lock_tests::in_line(&waiter, "heard", ttl(60_000).wait(30 * SECOND)).await;
    // The waiter's attempt after subscribing marks the lock, until a second past its expiry.
    eventually(5 * SECOND, "the waiter marks the lock", || {
        let mut raw = raw.clone();
        async move { raw.exists::<_, bool>("lock:{heard}:waiting").await.unwrap() }
    })
    .await;
    let mark_ttl: i64 = raw.pttl("lock:{heard}:waiting").await.unwrap();
    let lock_ttl: i64 = raw.pttl("lock:{heard}").await.unwrap();
    assert!(mark_ttl > lock_ttl, "mark {mark_ttl} ms, lock {lock_ttl} ms");
    let released_at = Instant::now();
    assert!(guard.release().await.unwrap());
    let taken = waiting.await.unwrap().unwrap();
    lock_tests::assert_woken_by_the_release(released_at.elapsed());
    assert_eq!(server.command_calls("publish").await, published + 1);
    assert!(
        !raw.exists::<_, bool>("lock:{heard}:waiting").await.unwrap(),
        "the mark goes with the lock it was set for"
    );
    taken.release().await.unwrap();
    assert_eq!(
        server.command_calls("publish").await,
        published + 1,
        "the next holder's waiters set their own mark"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_renews_locks_in_batches() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    let options = ttl(900).watchdog(true);
    let mut guards = Vec::new();
    for i in 0..300 {
        guards.push(client.acquire(&format!("batch:{i}"), &options).await.unwrap());
    }
    let (scripts, renewals) = (
        server.command_calls("evalsha").await,
        server.command_calls("pexpire").await,
    );
    tokio::time::sleep(Duration::from_millis(1000)).await; // three renewal intervals
    let scripts = server.command_calls("evalsha").await - scripts;
    let renewals = server.command_calls("pexpire").await - renewals;
    assert!(renewals >= 600, "{renewals} renewals of 300 locks in 1 s");
    assert!(
        renewals >= 50 * scripts,
        "{renewals} renewals in {scripts} scripts: not batched"
    );
    assert!(guards.iter().all(|g| !g.is_lost()));
    for guard in guards {
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_applied_after_a_release_with_a_minimum_hold_cannot_extend_it() {
    // The watchdog may have sent a renewal just before the guard's release, which Redis applies
    // after it (another connection after a reconnect, or a batch sent a moment later): it must
    // not give the held-back lock a whole ttl again.
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    let mut raw = server.raw().await;
    let options = ttl(60_000).hold_at_least(Duration::from_millis(300));
    let guard = client.acquire("late", &options).await.unwrap();
    let token: String = raw.get("lock:{late}").await.unwrap();
    assert!(guard.release().await.unwrap());
    let renew = redis::Script::new(include_str!(
        "../../lock-runtime/src/store/redis/scripts/renew.lua"
    ));
    let renewed: Vec<i64> = renew
        .key("lock:{late}")
        .arg(&token)
        .arg(60_000)
        .invoke_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(renewed, [0], "a released lock is not renewed");
    let left: i64 = raw.pttl("lock:{late}").await.unwrap();
    assert!(
        (0..=300).contains(&left),
        "kept for its minimum hold only: {left} ms left"
    );
    // A release sent again (its answer was lost) still stands, and changes nothing.
    let release = redis::Script::new(concat!(
        include_str!("../../lock-runtime/src/store/redis/scripts/fence.lua"),
        include_str!("../../lock-runtime/src/store/redis/scripts/release.lua")
    ));
    let again: i64 = release
        .key("lock:{late}")
        .key("lock:{late}:released")
        .arg(&token)
        .arg(300)
        .arg("c:test")
        .invoke_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(again, 1);
    let after: i64 = raw.pttl("lock:{late}").await.unwrap();
    assert!(after <= left, "{after} > {left}");
}

/// Issue 23: the release of an acquire abandoned in flight goes after it, on the connection it
/// went on, even when that connection was replaced meanwhile. Here the acquire's `SET` is held
/// up in a proxy, the connection counts as silent (two requests unanswered) and is replaced,
/// and the acquire is cancelled: before, its release went on the new connection, reached Redis
/// first and found nothing, and the `SET` then took the lock for nobody, for its whole ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_acquires_release_is_not_overtaken_on_a_new_connection() {
    let server = RedisServer::spawn();
    let proxy = lock_tests::FaultProxy::start(server.port());
    let client = connect(&proxy.url()).await; // answers within 500 ms
    client.run("warm", &ttl(1000), async {}).await.unwrap();
    proxy.delay(Duration::from_millis(1500)); // each way
    let started = Instant::now();
    let probes = tokio::spawn({
        let client = client.clone();
        async move { tokio::join!(client.is_locked("probe-1"), client.is_locked("probe-2")) }
    });
    tokio::time::sleep(Duration::from_millis(250)).await;
    let acquiring = tokio::spawn({
        let client = client.clone();
        async move { client.acquire("overtaken", &ttl(60_000)).await }
    });
    let (first, second) = probes.await.unwrap();
    assert!(
        is_unavailable(&first) && is_unavailable(&second),
        "{first:?} {second:?}"
    );
    // The connection is silent now: the next request opens a new one, which the proxy relays
    // at once, while the acquire's SET still waits in it on the old one.
    proxy.relay();
    assert!(
        !acquiring.is_finished(),
        "the acquire gave up before it was cancelled: {:?}",
        started.elapsed()
    );
    acquiring.abort();
    let mut raw = server.raw().await;
    eventually(
        5 * SECOND,
        "the lock the abandoned acquire took is given back",
        || {
            let mut raw = raw.clone();
            async move {
                // Past the delay, so the SET has reached Redis.
                started.elapsed() > Duration::from_millis(2500)
                    && !raw.exists::<_, bool>("lock:{overtaken}").await.unwrap()
            }
        },
    )
    .await;
    let _: () = raw.del("lock:{overtaken}").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_an_acquire_on_the_wire() {
    // The acquire has reached Redis (the key is set) but its answer is still on its way when
    // shutdown begins: shutdown must still find that lock and give it back.
    let server = RedisServer::spawn();
    let proxy = lock_tests::FaultProxy::start(server.port());
    let client = connect(&proxy.url()).await;
    client.run("warm", &ttl(1000), async {}).await.unwrap();
    proxy.delay(Duration::from_millis(150)); // each way
    let acquiring = tokio::spawn({
        let client = client.clone();
        async move { client.acquire("wire", &ttl(60_000)).await }
    });
    let mut raw = server.raw().await;
    eventually(2 * SECOND, "the acquire reaches Redis", || {
        let mut raw = raw.clone();
        async move { raw.exists::<_, bool>("lock:{wire}").await.unwrap() }
    })
    .await;
    client.shutdown().await;
    let exists: bool = raw.exists("lock:{wire}").await.unwrap();
    assert!(!exists, "the lock taken by the acquire in flight was given back");
    let guard = acquiring.await.unwrap().unwrap();
    assert!(guard.is_lost(), "its holder knows it was given back");
}

/// A cancelled fair waiter gives its place up in the background; shutdown waits for that as for
/// any background release, so once it returns the place is gone, even when the withdrawal is
/// slow to reach Redis (150 ms each way here). A place left behind would have the holder's
/// release hand the lock to a waiter that is gone, for up to `FAIR_PLACE_KEPT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_a_cancelled_fair_waiter_to_leave_the_line() {
    let server = RedisServer::spawn();
    let proxy = lock_tests::FaultProxy::start(server.port());
    let (holder, leaving) = (connect(&server.url()).await, connect(&proxy.url()).await);
    let fair = ttl(60_000).fair(true);
    let guard = holder.acquire("leaving", &fair).await.unwrap();
    let waiter = lock_tests::in_line(&leaving, "leaving", fair.clone().wait(30 * SECOND)).await;
    let mut raw = server.raw().await;
    let line: usize = raw.zcard("lock:{leaving}:queue").await.unwrap();
    assert_eq!(line, 1, "the waiter has its place");
    proxy.delay(Duration::from_millis(150));
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled()); // dropped: it gives its place up
    leaving.shutdown().await;
    let line: usize = raw.zcard("lock:{leaving}:queue").await.unwrap();
    assert_eq!(
        line, 0,
        "shutdown returned before the cancelled waiter left the line"
    );
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_common_release_hands_what_it_cannot_decide_to_the_full_one() {
    let server = RedisServer::spawn();
    let mut raw = server.raw().await;
    let unlock = redis::Script::new(include_str!(
        "../../lock-runtime/src/store/redis/scripts/unlock.lua"
    ));
    let conn = server.raw().await;
    let run = |key: &'static str, token: &'static str| {
        let (unlock, mut raw) = (unlock.clone(), conn.clone());
        async move {
            let answer: i64 = unlock
                .key(key)
                .key(format!("{key}:waiting"))
                .arg(token)
                .arg("c:test")
                .invoke_async(&mut raw)
                .await
                .unwrap();
            answer
        }
    };
    // A read share of ours, in the readers' hash: release.lua's to give back.
    let _: () = raw.hset("lock:{shared}", "mode", "read").await.unwrap();
    let _: () = raw.hset("lock:{shared}", "t1", 1).await.unwrap();
    assert_eq!(run("lock:{shared}", "t1").await, -1);
    assert!(
        raw.exists::<_, bool>("lock:{shared}").await.unwrap(),
        "left to release.lua"
    );
    // Released before and kept for its minimum hold: release.lua says that release stands.
    let _: () = raw.set("lock:{kept}", "t1:released").await.unwrap();
    assert_eq!(run("lock:{kept}", "t1").await, -1);
    // Another holder's, or nothing: not ours, untouched.
    let _: () = raw.set("lock:{other}", "t2").await.unwrap();
    assert_eq!(run("lock:{other}", "t1").await, 0);
    assert_eq!(raw.get::<_, String>("lock:{other}").await.unwrap(), "t2");
    assert_eq!(run("lock:{none}", "t1").await, 0);
    // Ours: deleted, announced only with a waiting mark beside it.
    let published = server.command_calls("publish").await;
    let _: () = raw.set("lock:{mine}", "t1").await.unwrap();
    assert_eq!(run("lock:{mine}", "t1").await, 1);
    assert!(!raw.exists::<_, bool>("lock:{mine}").await.unwrap());
    assert_eq!(server.command_calls("publish").await, published);
    let _: () = raw.set("lock:{mine}", "t1").await.unwrap();
    let _: () = raw.set("lock:{mine}:waiting", "1").await.unwrap();
    assert_eq!(run("lock:{mine}", "t1").await, 1);
    assert!(!raw.exists::<_, bool>("lock:{mine}:waiting").await.unwrap());
    assert_eq!(server.command_calls("publish").await, published + 1);
}

/// A fair waiter asks again at least every 300 ms, so that its place (kept a second after each
/// ask) never lapses while it lives, even when the subscription it listens for releases on
/// hangs: here every new connection through the proxy hangs (the subscriber's among them),
/// for longer than the place is kept, while the request connection works. The first waiter
/// in line must still be served first when the lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_keeps_its_place_while_its_subscription_hangs() {
    use lock_tests::FaultProxy;
    let server = RedisServer::spawn();
    let proxy = FaultProxy::start(server.port());
    // Both bounds well past the second a place is kept.
    let first = lock_tests::test_builder(&proxy.url())
        .connect_timeout(3 * SECOND)
        .response_timeout(2 * SECOND)
        .build()
        .await
        .unwrap();
    let other = connect(&server.url()).await;
    let fair = ttl(30_000).fair(true).wait(20 * SECOND);
    let holder = other.acquire("hung-sub", &ttl(30_000).fair(true)).await.unwrap();
    proxy.silence_new(true);
    let first_waiter = lock_tests::in_line(&first, "hung-sub", fair.clone()).await;
    let second_waiter = lock_tests::in_line(&other, "hung-sub", fair).await;
    // Longer than the first waiter's place would last if its asks waited behind the
    // subscription (its first one hangs for the whole response timeout).
    tokio::time::sleep(lock_runtime::FAIR_PLACE_KEPT + 2 * SECOND).await;
    holder.release().await.unwrap();
    let guard = tokio::time::timeout(10 * SECOND, first_waiter)
        .await
        .expect("the first in line never got the lock")
        .unwrap()
        .unwrap();
    assert!(
        !second_waiter.is_finished(),
        "the second in line got the lock first"
    );
    guard.release().await.unwrap();
    let second = second_waiter.await.unwrap().unwrap();
    second.release().await.unwrap();
    proxy.silence_new(false);
}

/// A release the network swallows (a blackholed path: the request never reaches Redis, so the
/// lock stays) is sent again in the background while the lease lasts: the key comes free soon
/// after the path heals, not at the end of its 20 s lease. `run` still answers with the body's
/// output, its release failing the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_release_is_sent_again_while_the_lease_lasts() {
    let server = RedisServer::spawn();
    let proxy = lock_tests::FaultProxy::start(server.port());
    let client = connect(&proxy.url()).await;
    let watcher = connect(&server.url()).await;
    let lease = ttl(20_000);

    let guard = client.acquire("retry:guard", &lease).await.unwrap();
    proxy.blackhole();
    let answer = guard.release().await;
    assert!(is_unavailable(&answer), "{answer:?}");
    assert!(
        watcher.is_locked("retry:guard").await.unwrap(),
        "the swallowed release freed nothing"
    );
    proxy.relay();
    eventually(8 * SECOND, "the release sent again frees the key", || async {
        !watcher.is_locked("retry:guard").await.unwrap()
    })
    .await;

    let output = client
        .run("retry:run", &lease, async {
            proxy.blackhole();
            7
        })
        .await;
    assert!(matches!(output, Ok(7)), "the body's output stands: {output:?}");
    assert!(watcher.is_locked("retry:run").await.unwrap());
    proxy.relay();
    eventually(
        8 * SECOND,
        "the run's release sent again frees the key",
        || async { !watcher.is_locked("retry:run").await.unwrap() },
    )
    .await;
}
