//! Connecting as production runs Redis: TLS with a private CA and client certificates, errors
//! that say whose problem it is, ACL users, restarts, connections that go silent, lazy start,
//! and fencing tokens that survive the loss of their counter.

use std::time::Duration;

use lock_runtime::{LockClient, LockError, MAX_WAIT_NAP};
use lock_tests::{connect, eventually, ttl, FaultProxy, RedisServer, TestCerts, SECOND};
use redis::AsyncCommands;
use tokio::time::Instant;

/// The response timeout of the clients here: silence is noticed after two of them.
const RESPONSE: Duration = Duration::from_millis(500);

fn builder(url: &str) -> lock_runtime::LockClientBuilder {
    LockClient::builder()
        .url(url)
        .connect_timeout(2 * SECOND)
        .response_timeout(RESPONSE)
}

async fn acl(server: &RedisServer, rules: &[&str]) {
    let mut raw = server.raw().await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(rules)
        .query_async(&mut raw)
        .await
        .unwrap();
}

/// The rights the guide (docs/operating.md) tells operators to grant a locking user, word for word.
const LOCKING_RIGHTS: &[&str] = &[
    "on",
    ">pw",
    "resetkeys",
    "resetchannels",
    "~lock:*",
    "&lock:*",
    "-@all",
    "+evalsha",
    "+eval",
    "+get",
    "+set",
    "+incrby",
    "+time",
    "+pttl",
    "+type",
    "+pexpire",
    "+del",
    "+exists",
    "+zadd",
    "+zrem",
    "+zrange",
    "+zrangebyscore",
    "+zscore",
    "+zrank",
    "+hset",
    "+hget",
    "+hgetall",
    "+hdel",
    "+publish",
    "+subscribe",
    "+unsubscribe",
    "+ping",
    "+spublish",
    "+ssubscribe",
    "+sunsubscribe",
    "+wait",
];

fn with_user(server: &RedisServer, user: &str) -> String {
    format!("redis://{user}:pw@127.0.0.1:{}", server.port())
}

// ---------------------------------------------------------------------------------------------
// TLS

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca_takes_waits_for_and_fences_locks() {
    let certs = TestCerts::generate();
    let server = RedisServer::spawn_tls(&certs, false);
    let client = builder(&server.tls_url())
        .tls_root_ca(certs.ca_pem())
        .build()
        .await
        .unwrap();
    exercise(&server, &client, "tls").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate() {
    let certs = TestCerts::generate();
    let server = RedisServer::spawn_tls(&certs, true);
    let client = builder(&server.tls_url())
        .tls_root_ca(certs.ca_pem())
        .tls_client_auth(certs.client_cert_pem(), certs.client_key_pem())
        .build()
        .await
        .unwrap();
    exercise(&server, &client, "mtls").await;

    // With TLS 1.3 the server may only say so at the first request, not the handshake.
    let without = builder(&server.tls_url())
        .tls_root_ca(certs.ca_pem())
        .build_lazy()
        .unwrap();
    let out = without.acquire("mtls", &ttl(1000)).await;
    assert!(
        matches!(
            out,
            Err(LockError::Refused { .. } | LockError::Unavailable { .. })
        ),
        "a server that requires a client certificate refuses one without: {out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_wrong_ca_is_refused_with_a_clear_error() {
    let certs = TestCerts::generate();
    let server = RedisServer::spawn_tls(&certs, false);
    let out = builder(&server.tls_url())
        .tls_root_ca(certs.wrong_ca_pem())
        .build()
        .await;
    let Err(LockError::Refused { reason, .. }) = &out else {
        panic!("a wrong CA is a configuration error: {out:?}");
    };
    assert!(reason.contains("tls_root_ca"), "{reason}");
    // Without any CA, the system trust store does not know the private CA either.
    let out = builder(&server.tls_url()).build().await;
    assert!(matches!(out, Err(LockError::Refused { .. })), "{out:?}");
}

#[test]
fn tls_material_is_checked_without_connecting() {
    let out = LockClient::builder()
        .url("rediss://127.0.0.1:1")
        .tls_root_ca(b"not a certificate")
        .build_lazy();
    assert!(matches!(out, Err(LockError::InvalidOptions { .. })), "{out:?}");
    let out = LockClient::builder()
        .url("redis://127.0.0.1:1")
        .tls_root_ca(TestCerts::generate().ca_pem())
        .build_lazy();
    assert!(
        matches!(&out, Err(LockError::InvalidOptions { reason }) if reason.contains("rediss://")),
        "{out:?}"
    );
}

/// Takes, waits for (woken by the release) and fences locks on `client`.
async fn exercise(server: &RedisServer, client: &LockClient, key: &str) {
    let fenced = ttl(60_000).fencing(true);
    let first = client.acquire(key, &fenced).await.unwrap();
    let first_token = first.fencing_token();
    assert!(first_token.is_some());
    // A fencing waiter's attempts are all scripts: its first, refused, then the one it makes
    // once it listens, after which it sleeps.
    let scripts_before = server.command_calls("evalsha").await;
    let waiter = tokio::spawn({
        let (client, key) = (client.clone(), key.to_owned());
        async move {
            let guard = client
                .acquire(&key, &ttl(5000).fencing(true).wait(30 * SECOND))
                .await;
            (guard, Instant::now())
        }
    });
    eventually(5 * SECOND, "the waiter listens and was refused again", || async {
        server.command_calls("evalsha").await >= scripts_before + 2
    })
    .await;
    let released_at = Instant::now();
    assert!(first.release().await.unwrap());
    let (second, acquired_at) = waiter.await.unwrap();
    let second = second.unwrap();
    lock_tests::assert_woken_by_the_release(acquired_at - released_at);
    assert!(second.fencing_token() > first_token);
    assert!(second.release().await.unwrap());
}

// ---------------------------------------------------------------------------------------------
// Errors that say whose problem it is

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_mistakes_are_refused_not_unavailable() {
    let server = RedisServer::spawn();
    acl(&server, &["locker", "on", ">pw", "~*", "&*", "+@all"]).await;

    let out = builder(&format!("redis://locker:wrong@127.0.0.1:{}", server.port()))
        .build()
        .await;
    let Err(LockError::Refused { reason, .. }) = &out else {
        panic!("a wrong password: {out:?}");
    };
    assert!(reason.contains("password"), "{reason}");

    let out = builder(&format!("redis://nobody:pw@127.0.0.1:{}", server.port()))
        .build()
        .await;
    assert!(
        matches!(out, Err(LockError::Refused { .. })),
        "an unknown user: {out:?}"
    );

    let out = builder(&format!("{}/99", server.url())).build().await;
    let Err(LockError::Refused { reason, .. }) = &out else {
        panic!("a database index out of range: {out:?}");
    };
    assert!(reason.contains("database index"), "{reason}");

    // Redis down is still Unavailable: retrying later will help.
    let mut gone = RedisServer::spawn();
    let url = gone.url();
    gone.kill();
    let out = builder(&url).build().await;
    assert!(matches!(out, Err(LockError::Unavailable { .. })), "{out:?}");
}

#[test]
fn a_url_without_a_scheme_says_to_add_one() {
    let out = LockClient::builder().url("127.0.0.1:6379").build_lazy();
    let Err(LockError::InvalidOptions { reason }) = &out else {
        panic!("{out:?}");
    };
    assert!(reason.contains("redis://"), "{reason}");
}

/// Issue 23: `#insecure` would turn certificate checks off; credentials never show in `Debug`,
/// whichever form the URL takes.
#[test]
fn insecure_urls_are_refused_and_credentials_never_shown() {
    for builder in [
        LockClient::builder().url("rediss://127.0.0.1:6380/#insecure"),
        LockClient::builder().cluster(["redis://127.0.0.1:7000", "rediss://127.0.0.1:7001#insecure"]),
        LockClient::builder().redlock(["redis://a:1", "redis://b:1", "rediss://c:1#insecure"]),
    ] {
        let out = builder.build_lazy();
        let Err(LockError::InvalidOptions { reason }) = &out else {
            panic!("{out:?}");
        };
        assert!(reason.contains("#insecure"), "{reason}");
    }
    for url in [
        "redis://user:hunter2@127.0.0.1:6379/1",
        "redis+unix:///run/redis.sock?db=1&pass=hunter2",
        "unix:///run/redis.sock?user=me&password=hunter2",
    ] {
        let shown = format!("{:?}", LockClient::builder().url(url));
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_without_the_rights_locking_needs_is_refused() {
    let server = RedisServer::spawn();
    // Everything but scripts.
    acl(
        &server,
        &["noscripts", "on", ">pw", "~*", "&*", "+@all", "-evalsha", "-eval"],
    )
    .await;
    // Checked at build, which fails with the refusal...
    let built = builder(&with_user(&server, "noscripts")).build().await;
    assert!(matches!(built, Err(LockError::Refused { .. })), "{built:?}");
    // ... and, for a client built lazily, at its first acquire. An uncontended acquire is a
    // plain SET, which this user may send; but the release is a script: the rights check
    // refuses the client before it takes a lock it could not release.
    let client = builder(&with_user(&server, "noscripts")).build_lazy().unwrap();
    let out = client.acquire("acl", &ttl(1000)).await;
    let Err(LockError::Refused { reason, .. }) = &out else {
        panic!("{out:?}");
    };
    assert!(reason.contains("ACL"), "{reason}");
    let mut raw = server.raw().await;
    let exists: bool = raw.exists("lock:{acl}").await.unwrap();
    assert!(!exists, "no lock taken that its release would be refused for");
    let out = client.acquire("acl-fenced", &ttl(1000).fencing(true)).await;
    assert!(matches!(out, Err(LockError::Refused { .. })), "{out:?}");

    // Scripts, but not on the lock's keys.
    acl(&server, &["otherkeys", "on", ">pw", "~cache:*", "&*", "+@all"]).await;
    let built = builder(&with_user(&server, "otherkeys")).build().await;
    assert!(matches!(built, Err(LockError::Refused { .. })), "{built:?}");
    let client = builder(&with_user(&server, "otherkeys")).build_lazy().unwrap();
    let out = client.acquire("acl", &ttl(1000)).await;
    assert!(matches!(out, Err(LockError::Refused { .. })), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_rights_are_enough_for_everything() {
    let server = RedisServer::spawn();
    let mut rules = vec!["locker"];
    rules.extend_from_slice(LOCKING_RIGHTS);
    acl(&server, &rules).await;
    let client = builder(&with_user(&server, "locker")).build().await.unwrap();
    exercise(&server, &client, "rights").await;
    let guard = client
        .acquire(
            "rights",
            &ttl(300).watchdog(true).hold_at_least(Duration::from_millis(50)),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await; // renewed at least once
    assert!(!guard.is_lost());
    assert!(client.is_locked("rights").await.unwrap());
    assert!(client.remaining_ttl("rights").await.unwrap().is_some());
    assert!(guard.release().await.unwrap());
    let _held = client.acquire("forced", &ttl(60_000)).await.unwrap();
    assert!(client.force_release("forced").await.unwrap());
    // Semaphores (permit.lua and its release, a waiter's mark) and multi-key sets (set.lua)
    // under the same line: it names every command their scripts run.
    let other = builder(&with_user(&server, "locker")).build().await.unwrap();
    // A semaphore with fencing and a minimum hold, and a fair one (its line of its own): two
    // holders, then a waiter of another client let in by their releases.
    let semaphores = [
        (
            "rights:sem",
            ttl(5000)
                .permits(2)
                .fencing(true)
                .hold_at_least(Duration::from_millis(20)),
        ),
        ("rights:fair", ttl(5000).permits(2).fair(true)),
    ];
    for (key, sem) in semaphores {
        let (p0, p1) = (
            client.acquire(key, &sem).await.unwrap(),
            client.acquire(key, &sem).await.unwrap(),
        );
        let waiter = tokio::spawn({
            let (other, sem) = (other.clone(), sem.clone());
            async move { other.acquire(key, &sem.wait(10 * SECOND)).await }
        });
        lock_tests::joined_line(&other, key, 0).await;
        assert!(p0.release().await.unwrap() && p1.release().await.unwrap());
        assert!(waiter.await.unwrap().unwrap().release().await.unwrap());
    }
    let set = client
        .acquire_all(["rights:a", "rights:b"], &ttl(5000).fencing(true))
        .await
        .unwrap();
    assert!(set.fencing_token_for("rights:b").is_some());
    assert!(set.release().await.unwrap());
}

/// Issues 23 and 30: the documented line is enough for every kind of lock (fair, shared, fenced,
/// with a waiter, kept for a minimum hold), and a user that lacks a right is refused before its
/// first lock, naming it, instead of taking a lock its release is then refused for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_a_right_is_refused_before_its_first_lock() {
    let server = RedisServer::spawn();
    let mut raw = server.raw().await;
    let mut rules = vec!["complete"];
    rules.extend_from_slice(LOCKING_RIGHTS);
    acl(&server, &rules).await;
    let client = builder(&with_user(&server, "complete")).build().await.unwrap();
    let other = builder(&with_user(&server, "complete")).build().await.unwrap();
    for (key, options) in [
        ("kinds:fair", ttl(5000).fair(true).fencing(true)),
        (
            "kinds:shared",
            ttl(5000).mode(lock_runtime::LockMode::Shared).fencing(true),
        ),
        ("kinds:held", ttl(5000).hold_at_least(Duration::from_millis(20))),
    ] {
        let guard = client.acquire(key, &options).await.unwrap();
        let waiter = tokio::spawn({
            let (other, options) = (
                other.clone(),
                options.clone().mode(lock_runtime::LockMode::Exclusive),
            );
            async move { other.acquire(key, &options.wait(10 * SECOND)).await }
        });
        lock_tests::joined_line(&other, key, 0).await;
        assert!(guard.release().await.unwrap(), "{key}");
        let next = waiter.await.unwrap().unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(next.release().await.unwrap(), "{key}");
    }

    // Every right but one: the client is refused at its first acquire, even an uncontended one
    // (a bare SET it could take), naming the right it lacks.
    for missing in ["+evalsha", "+zadd", "+hdel", "+incrby"] {
        let user = format!("without-{}", &missing[1..]);
        let mut rules = vec![user.as_str()];
        rules.extend(LOCKING_RIGHTS.iter().filter(|r| *r != &missing));
        acl(&server, &rules).await;
        // At build; and for a client built lazily, at its first acquire.
        let built = builder(&with_user(&server, &user)).build().await;
        let client = builder(&with_user(&server, &user)).build_lazy().unwrap();
        let out = client.acquire("refused", &ttl(60_000)).await;
        for out in [built.map(|_| ()), out.map(|_| ())] {
            let Err(LockError::Refused { source, .. }) = &out else {
                panic!("{missing}: {out:?}");
            };
            let named = source.to_string().to_ascii_lowercase();
            assert!(named.contains(&missing[1..]), "{missing} not named: {named}");
        }
        let keys: Vec<String> = raw.keys("lock:{refused}*").await.unwrap();
        assert!(keys.is_empty(), "{missing}: left behind {keys:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_channel_rights_still_releases_and_waiters_use_timers() {
    let server = RedisServer::spawn();
    let mut rules = vec!["nochannels"];
    rules.extend(LOCKING_RIGHTS.iter().filter(|r| **r != "&lock:*"));
    acl(&server, &rules).await;
    let client = builder(&with_user(&server, "nochannels")).build().await.unwrap();
    let mut raw = server.raw().await;

    let guard = client.acquire("quiet", &ttl(60_000)).await.unwrap();
    assert_eq!(
        guard.release().await.ok(),
        Some(true),
        "the key was deleted: that is a release, whatever PUBLISH answered"
    );
    let exists: bool = raw.exists("lock:{quiet}").await.unwrap();
    assert!(!exists);

    let holder = client.acquire("quiet", &ttl(60_000)).await.unwrap();
    let waiter = tokio::spawn({
        let client = client.clone();
        async move { client.acquire("quiet", &ttl(5000).wait(10 * SECOND)).await }
    });
    server.waiter_refused("quiet").await; // then it naps
    assert!(holder.release().await.unwrap());
    let woken = tokio::time::timeout(MAX_WAIT_NAP + SECOND, waiter)
        .await
        .expect("a waiter that cannot hear releases wakes on its timer")
        .unwrap();
    woken.unwrap().release().await.unwrap();
    assert!(client.force_release("never").await.is_ok());
}

// ---------------------------------------------------------------------------------------------
// Restarts and silent connections

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_first_request_of_an_idle_client_succeeds() {
    let mut server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    client
        .acquire("before", &ttl(1000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    server.restart();
    let guard = client.acquire("after", &ttl(1000)).await;
    assert!(guard.is_ok(), "the first acquire after a restart: {guard:?}");
    assert!(guard.unwrap().release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_resubscribe_after_a_restart() {
    let mut server = RedisServer::spawn();
    let (waiting, holding) = (connect(&server.url()).await, connect(&server.url()).await);
    // Subscribe once before the restart.
    let held = holding.acquire("resub", &ttl(60_000)).await.unwrap();
    let out = waiting
        .acquire("resub", &ttl(1000).wait(Duration::from_millis(300)))
        .await;
    assert!(matches!(out, Err(LockError::Busy { .. })), "{out:?}");
    drop(held);
    server.restart();

    let held = holding.acquire("resub", &ttl(60_000)).await.unwrap();
    woken_by_the_release(&server, &waiting, held, "resub", 3 * SECOND).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_reset_mid_use_is_retried_on_a_new_one() {
    let server = RedisServer::spawn();
    let proxy = FaultProxy::start(server.port());
    let client = builder(&proxy.url()).build().await.unwrap();
    let guard = client.acquire("reset", &ttl(60_000).fencing(true)).await.unwrap();
    proxy.reset_all();
    assert!(
        client.is_locked("reset").await.unwrap(),
        "one retry on a fresh connection"
    );
    assert!(guard.release().await.unwrap());
    assert!(proxy.accepted() >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_replaced() {
    let server = RedisServer::spawn();
    let proxy = FaultProxy::start(server.port());
    let client = builder(&proxy.url()).build().await.unwrap();
    client
        .acquire("silent", &ttl(1000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.blackhole_existing();
    let silenced = Instant::now();
    let bound = 2 * SECOND + 3 * RESPONSE;
    loop {
        match client.acquire("silent", &ttl(1000)).await {
            Ok(guard) => {
                guard.release().await.unwrap();
                break;
            }
            Err(LockError::Unavailable { .. }) => assert!(
                silenced.elapsed() < bound,
                "still failing {:?} after the connection went silent",
                silenced.elapsed()
            ),
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(silenced.elapsed() < bound, "{:?}", silenced.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_subscriber_connection_is_replaced() {
    let server = RedisServer::spawn();
    let proxy = FaultProxy::start(server.port());
    let waiting = builder(&proxy.url()).build().await.unwrap();
    let holding = connect(&server.url()).await;
    let held = holding.acquire("sub", &ttl(60_000)).await.unwrap();
    let out = waiting
        .acquire("sub", &ttl(1000).wait(Duration::from_millis(300)))
        .await;
    assert!(matches!(out, Err(LockError::Busy { .. })), "{out:?}"); // subscriber connection open
                                                                    // Its channel is unsubscribed once idle: then a subscription seen later is a new one.
    eventually(2 * SECOND, "the idle channel is unsubscribed", || async {
        server.subscribed_channels().await.is_empty()
    })
    .await;
    proxy.blackhole_existing();
    // The request connection is replaced first (see above), then the waiter's subscription
    // fails on the silent subscriber connection, which is replaced in its turn.
    let deadline = Instant::now() + 2 * SECOND + 3 * RESPONSE;
    while waiting.is_locked("sub").await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the request connection was not replaced"
        );
    }
    woken_by_the_release(&server, &waiting, held, "sub", 2 * SECOND + 3 * RESPONSE).await;
}

/// `held` is released while `waiting` waits for `key`: the waiter (subscribed within `within`,
/// on whatever connection it now has) must be woken by the release, not by a timer.
async fn woken_by_the_release(
    server: &RedisServer,
    waiting: &LockClient,
    held: lock_runtime::LockGuard,
    key: &'static str,
    within: Duration,
) {
    let waiter = tokio::spawn({
        let waiting = waiting.clone();
        async move {
            let guard = waiting.acquire(key, &ttl(5000).wait(30 * SECOND)).await;
            (guard, Instant::now())
        }
    });
    let channel = format!("lock:{{{key}}}:released");
    eventually(within, "the waiter subscribes", || async {
        server.subscribed_channels().await == [channel.as_str()]
    })
    .await;
    server.waiter_refused(key).await;
    let released_at = Instant::now();
    assert!(held.release().await.unwrap());
    let (guard, acquired_at) = waiter.await.unwrap();
    lock_tests::assert_woken_by_the_release(acquired_at - released_at);
    guard.unwrap().release().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Lazy start

#[test]
fn build_lazy_needs_neither_redis_nor_a_runtime() {
    let client = LockClient::builder().url("redis://127.0.0.1:1").build_lazy();
    assert!(client.is_ok(), "{client:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_client_starts_while_redis_is_down_and_works_once_it_is_up() {
    let mut server = RedisServer::spawn();
    server.kill();
    let client = builder(&server.url()).build_lazy().unwrap();
    let out = client.acquire("lazy", &ttl(1000)).await;
    assert!(matches!(out, Err(LockError::Unavailable { .. })), "{out:?}");
    server.restart();
    let guard = client.acquire("lazy", &ttl(1000)).await.unwrap();
    assert!(guard.release().await.unwrap());
}

// ---------------------------------------------------------------------------------------------
// Fencing across data loss

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_never_go_back_after_a_restart_without_persistence() {
    let mut server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    let fenced = ttl(5000).fencing(true);
    let mut before = Vec::new();
    for _ in 0..3 {
        let guard = client.acquire("ledger", &fenced).await.unwrap();
        before.extend(guard.fencing_token());
        guard.release().await.unwrap();
    }
    assert!(before.windows(2).all(|w| w[0] < w[1]), "{before:?}");
    server.restart();
    let mut raw = server.raw().await;
    let counter: Option<u64> = raw.get("lock:{ledger}:fence").await.unwrap();
    assert_eq!(counter, None, "the restart lost the counter");
    let guard = client.acquire("ledger", &fenced).await.unwrap();
    let after = guard.fencing_token().unwrap();
    assert!(
        before.iter().all(|&t| after > t),
        "token {after} after the restart, {before:?} before"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acquire_script_is_idempotent_for_its_token() {
    // A request sent again after its connection broke must not take a second token.
    let server = RedisServer::spawn();
    let mut raw = server.raw().await;
    let acquire = redis::Script::new(concat!(
        include_str!("../../lock-runtime/src/store/redis/scripts/fence.lua"),
        include_str!("../../lock-runtime/src/store/redis/scripts/taking.lua"),
        include_str!("../../lock-runtime/src/store/redis/scripts/acquire.lua")
    ));
    let call = |token: &'static str| {
        let mut invocation = acquire.prepare_invoke();
        invocation
            .key("lock:{idem}")
            .key("lock:{idem}:fence")
            .arg(token)
            .arg(5000)
            .arg("1");
        invocation
    };
    let (taken, first): (i64, u64) = call("t1").invoke_async(&mut raw).await.unwrap();
    let (again, second): (i64, u64) = call("t1").invoke_async(&mut raw).await.unwrap();
    assert_eq!((taken, again), (1, 1));
    assert_eq!(first, second, "the retry sees its own token, not a new one");
    let (refused, _): (i64, i64) = call("t2").invoke_async(&mut raw).await.unwrap();
    assert_eq!(refused, 0, "another token is still refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_attempt_fails_with_nothing_changed_when_the_writers_key_is_foreign() {
    // A writer that claimed its turn removes its claim once it has set the lock: a writers' key
    // of another type is found before that, so the script fails without taking the lock.
    let server = RedisServer::spawn();
    let mut raw = server.raw().await;
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../lock-runtime/src/store/redis/scripts/"
    );
    let source = |name: &str| std::fs::read_to_string(format!("{dir}{name}")).unwrap();
    let _: () = raw.set("lock:{foreign}:writers", "not a claim").await.unwrap();
    for (name, fair) in [("acquire.lua", false), ("fair.lua", true)] {
        let script = redis::Script::new(&[source("fence.lua"), source("taking.lua"), source(name)].concat());
        let mut call = script.prepare_invoke();
        call.key("lock:{foreign}");
        if fair {
            // fair.lua: lock, counter, line, places, writers; token, ttl, fencing, place kept,
            // join, channel, sharded, claim kept, claimed.
            call.key("lock:{foreign}:fence")
                .key("lock:{foreign}:queue")
                .key("lock:{foreign}:queue:kept")
                .key("lock:{foreign}:writers")
                .arg("t")
                .arg(5000)
                .arg("0")
                .arg(1000)
                .arg("1")
                .arg("lock:{foreign}:released")
                .arg("0")
                .arg(1000)
                .arg("1");
        } else {
            // acquire.lua: lock, writers; token, ttl, fencing, writers' place, claim kept,
            // claimed, mark's place.
            call.key("lock:{foreign}:writers")
                .arg("t")
                .arg(5000)
                .arg("0")
                .arg("2")
                .arg(1000)
                .arg("1")
                .arg("");
        }
        let failed: redis::RedisResult<Vec<i64>> = call.invoke_async(&mut raw).await;
        let e = failed.expect_err(name);
        assert!(e.to_string().contains("is not a sorted set"), "{e}");
        let taken: bool = raw.exists("lock:{foreign}").await.unwrap();
        assert!(!taken, "the lock was set before the check failed");
        let line: bool = raw.exists("lock:{foreign}:queue").await.unwrap();
        assert!(!line, "a place was taken before the check failed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_client_built_by_the_user_is_taken_as_is() {
    let server = RedisServer::spawn();
    let client = LockClient::builder()
        .redis_client(redis::Client::open(server.url()).unwrap())
        .build()
        .await
        .unwrap();
    let guard = client.acquire("theirs", &ttl(1000)).await.unwrap();
    assert!(guard.release().await.unwrap());

    let both = LockClient::builder()
        .url(&server.url())
        .redis_client(redis::Client::open(server.url()).unwrap())
        .build_lazy();
    assert!(matches!(both, Err(LockError::InvalidOptions { .. })), "{both:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_owner_label_is_shown_and_foreign_values_have_none() {
    let server = RedisServer::spawn();
    let client = builder(&server.url())
        .owner("billing-worker-7")
        .build()
        .await
        .unwrap();
    let guard = client.acquire("labelled", &ttl(60_000)).await.unwrap();
    let holder = client.holder("labelled").await.unwrap().unwrap();
    assert_eq!(holder.owner(), Some("billing-worker-7"));
    let value: String = server.raw().await.get("lock:{labelled}").await.unwrap();
    let (id, owner) = value.split_once(' ').unwrap();
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "a UUID v4: {value}"
    );
    assert_eq!(owner, "billing-worker-7");
    assert!(guard.release().await.unwrap());

    let _: () = server
        .raw()
        .await
        .set("lock:{foreign}", "not ours")
        .await
        .unwrap();
    let foreign = client.holder("foreign").await.unwrap().unwrap();
    assert_eq!((foreign.owner(), foreign.remaining()), (None, None));
    let out = builder(&server.url()).owner("").build_lazy();
    assert!(matches!(out, Err(LockError::InvalidOptions { .. })), "{out:?}");
}

/// Nothing listening at the address: `build()` fails within the connect timeout with one line
/// that names the store and the address it tried (issue 45: it said only "Connection refused").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_is_named_with_its_address() {
    let port = lock_tests::free_port();
    let started = Instant::now();
    let refused = builder(&format!("redis://127.0.0.1:{port}")).build().await;
    assert!(started.elapsed() < 2 * SECOND + SECOND, "{:?}", started.elapsed());
    let Err(LockError::Unavailable { source }) = &refused else {
        panic!("{refused:?}")
    };
    let said = source.to_string();
    assert!(
        said.starts_with(&format!("Redis at 127.0.0.1:{port}: cannot connect")),
        "{said}"
    );
}
