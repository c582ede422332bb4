//! The `tracing` events a lock emits: acquired and busy (debug); renewal failed, lost and
//! release failed (warn). Runs on a current-thread runtime, so every task the lock spawns runs
//! under the test's capturing subscriber.

use lock_runtime::LockError;
use lock_tests::{connect, eventually, ttl, Logs, RedisServer, SECOND};

#[tokio::test]
async fn lock_events_are_traced_at_their_levels() {
    let (logs, _capture) = Logs::capture(tracing::Level::DEBUG);

    let mut server = RedisServer::spawn();
    let client = connect(&server.url()).await; // response timeout 500 ms
                                               // Every event names the lock by the user's key, in a field called `key`; a release says
                                               // how long the lock was held.
    let quick = client.acquire("fields", &ttl(3000)).await.unwrap();
    assert!(quick.release().await.unwrap());
    assert!(
        logs.has_all(&["DEBUG", "lock acquired", "key=\"fields\""]),
        "{}",
        logs.text()
    );
    assert!(
        logs.has_all(&["DEBUG", "lock released", "key=fields", "held_ms="]),
        "{}",
        logs.text()
    );
    let guard = client.acquire("events", &ttl(3000).watchdog(true)).await.unwrap();
    assert!(logs.has("DEBUG", "lock acquired"));
    assert!(matches!(
        client.acquire("events", &ttl(1000)).await,
        Err(LockError::Busy { .. })
    ));
    assert!(logs.has("DEBUG", "lock busy"));

    server.pause();
    eventually(3 * SECOND, "a renewal fails while Redis is frozen", || async {
        logs.has("WARN", "lock renewal failed")
    })
    .await;
    server.resume();

    assert!(client.force_release("events").await.unwrap());
    tokio::time::timeout(3 * SECOND, guard.lost()).await.unwrap();
    assert!(logs.has("WARN", "lock lost"));
    drop(guard);

    let out = client.run("doomed", &ttl(1000), async { server.kill() }).await;
    assert!(
        out.is_ok(),
        "a failed release never replaces the body's result: {out:?}"
    );
    assert!(logs.has("WARN", "lock release failed"));
    assert!(
        !logs.text().contains(" lock="),
        "an event names the lock differently:\n{}",
        logs.text()
    );
}

#[tokio::test]
async fn denied_pub_sub_is_said_once_per_client() {
    let (logs, _capture) = Logs::capture(tracing::Level::WARN);

    let server = RedisServer::spawn();
    let mut raw = server.raw().await;
    // Every right locking needs, but none on channels (Redis 7's default for new users).
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "quiet", "on", ">pw", "resetchannels", "~*", "+@all"])
        .query_async(&mut raw)
        .await
        .unwrap();
    let client = connect(&format!("redis://quiet:pw@127.0.0.1:{}", server.port())).await;
    for _ in 0..3 {
        let guard = client.acquire("quiet", &ttl(60_000)).await.unwrap();
        assert!(guard.release().await.unwrap());
    }
    let holder = client.acquire("quiet", &ttl(300)).await.unwrap();
    let out = client.acquire("quiet", &ttl(1000).wait(SECOND)).await; // subscribing is denied too
    out.unwrap().release().await.unwrap();
    drop(holder);
    let text = logs.text();
    assert_eq!(
        text.matches("denies this client pub/sub").count(),
        1,
        "one warning per client:\n{text}"
    );
    assert!(text.contains("WARN"), "{text}");
    assert!(!text.contains("release failed"), "{text}");
}
