//! `lockctl` end to end: the built binary against a real `redis-server`, with locks taken by
//! the library.
//!
//! Cargo hands an integration test the path of its own package's binaries only
//! (`CARGO_BIN_EXE_lockctl`), so this test lives here rather than in `lock-tests`; and since
//! the binary needs the `cli` feature, `lock-tests` turns that feature on through a
//! dev-dependency, which `cargo test --workspace` unifies into this package's build. Alone:
//! `cargo test -p lock-runtime --features cli --test lockctl`.
//!
//! The servers come from a small spawner below, not from the test kit (`lock-tests` depends on
//! this crate): one server, a Redis Cluster of three primaries made by hand (`CLUSTER
//! ADDSLOTSRANGE`, `CLUSTER MEET`), and a primary with one Redis Sentinel. No test sleeps and
//! hopes: each waits for what it needs, with a deadline.

#![cfg(feature = "cli")]
// A test fails by panicking, with what it was doing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockGuard, LockOptions};
use serde_json::Value;

/// How long anything a test waits for may take.
const DEADLINE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// list

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_each_lock_with_its_owner_ttl_and_fence_and_skips_auxiliary_keys() {
    let redis = Redis::spawn();
    let billing_1 = client(&redis, "billing-1").await;
    let billing_2 = client(&redis, "billing-2").await;
    let fenced = billing_1
        .acquire("order:5", &minute().fencing(true))
        .await
        .unwrap();
    let _plain = billing_2.acquire("order:7", &minute()).await.unwrap();
    let far = (redis.time_ms().await + 60_000).to_string();
    redis
        .run(&[
            &["SET", "lock:{gone}:fence", "3"],
            &["ZADD", "lock:{order:5}:queue", "1", "waiter"],
            &["ZADD", "lock:{order:5}:queue:kept", &far, "waiter"],
            &["ZADD", "lock:{order:7}:writers", &far, "writer"],
            &["SET", "unrelated", "x"],
        ])
        .await;

    let listed = json(&lockctl(&redis, &["--json", "list"]).await);
    let locks = listed.as_array().expect("an array");
    assert_eq!(keys(locks), ["order:5", "order:7"], "{listed}");
    let (order_5, order_7) = (&locks[0], &locks[1]);
    assert_eq!(order_5["owner"], "billing-1");
    assert_eq!(order_5["state"], "held");
    assert_eq!(order_5["fence"].as_u64(), fenced.fencing_token());
    assert_eq!(order_5["fair_waiters"], 1);
    assert!(order_5["value"].as_str().unwrap().ends_with(" billing-1"));
    assert_eq!(order_7["owner"], "billing-2");
    assert_eq!(order_7["fence"], Value::Null, "no fenced acquire on order:7");
    assert_eq!(order_7["waiting_writers"], 1);
    for lock in locks {
        let ttl = lock["ttl_ms"].as_u64().unwrap();
        assert!(ttl > 0 && ttl <= 60_000, "{lock}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_takes_a_pattern_over_the_keys() {
    let redis = Redis::spawn();
    let locks = client(&redis, "billing-1").await;
    let _held: Vec<LockGuard> = vec![
        locks.acquire("order:5", &minute()).await.unwrap(),
        locks.acquire("order:7", &minute()).await.unwrap(),
        locks.acquire("invoice:1", &minute()).await.unwrap(),
    ];

    let orders = json(&lockctl(&redis, &["list", "order:*", "--json"]).await);
    assert_eq!(keys(orders.as_array().unwrap()), ["order:5", "order:7"]);
    let one = json(&lockctl(&redis, &["--json", "list", "invoice:?"]).await);
    assert_eq!(keys(one.as_array().unwrap()), ["invoice:1"]);
    let none = json(&lockctl(&redis, &["--json", "list", "payment:*"]).await);
    assert_eq!(none, serde_json::json!([]));
    let all = json(&lockctl(&redis, &["--json", "list"]).await);
    assert_eq!(keys(all.as_array().unwrap()), ["invoice:1", "order:5", "order:7"]);
    let other_prefix = json(&lockctl(&redis, &["--json", "--prefix", "jobs:", "list"]).await);
    assert_eq!(other_prefix, serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_prints_a_table_for_people() {
    let redis = Redis::spawn();
    let fenced = client(&redis, "billing-1")
        .await
        .acquire("order:5", &minute().fencing(true))
        .await
        .unwrap();
    let _other = client(&redis, "billing-2")
        .await
        .acquire("order:7", &minute())
        .await
        .unwrap();

    let out = stdout(&lockctl(&redis, &["list"]).await);
    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0], ["KEY", "OWNER", "TTL", "FENCE", "WAITING"], "{out}");
    let token = fenced.fencing_token().unwrap().to_string();
    assert_eq!(lines[1][..2], ["order:5", "billing-1"], "{out}");
    assert_eq!(lines[1][3..], [token.as_str(), "-"], "{out}");
    assert_eq!(lines[2][..2], ["order:7", "billing-2"], "{out}");
    assert_eq!(lines[2][3..], ["-", "-"], "{out}");
    assert!(lines[1][2].ends_with('s'), "a ttl such as 59.9s: {out}");
    assert_eq!(lines.len(), 3, "{out}");

    let empty = stdout(&lockctl(&redis, &["list", "nothing:*"]).await);
    assert_eq!(empty.trim(), "no locks held matching nothing:*");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_holders_and_foreign_values_are_shown_as_such() {
    let redis = Redis::spawn();
    let now = redis.time_ms().await;
    let (reader_1, reader_2, gone) = (
        format!("{:032x} reader-1", 1),
        format!("{:032x} reader-2", 2),
        format!("{:032x} reader-gone", 3),
    );
    let (soon, later, past) = (
        (now + 30_000).to_string(),
        (now + 60_000).to_string(),
        (now - 1_000).to_string(),
    );
    redis
        .run(&[
            &[
                "HSET",
                "lock:{prices}",
                "mode",
                "read",
                &reader_1,
                &soon,
                &reader_2,
                &later,
                &gone,
                &past,
            ],
            &["PEXPIRE", "lock:{prices}", "60000"],
            &["ZADD", "lock:{prices}:writers", &later, "writer"],
            &["SET", "lock:{weird}", "not a lock"],
        ])
        .await;

    let listed = json(&lockctl(&redis, &["--json", "list"]).await);
    let locks = listed.as_array().unwrap();
    assert_eq!(keys(locks), ["prices", "weird"]);
    let (prices, weird) = (&locks[0], &locks[1]);
    assert_eq!(prices["state"], "shared");
    let owners: Vec<&str> = prices["readers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["owner"].as_str().unwrap())
        .collect();
    assert_eq!(
        owners,
        ["reader-1", "reader-2"],
        "an expired share is not a holder"
    );
    assert_eq!(prices["waiting_writers"], 1);
    assert_eq!(weird["state"], "foreign");
    assert_eq!(weird["value"], "not a lock");
    assert_eq!(weird["ttl_ms"], Value::Null);

    let table = stdout(&lockctl(&redis, &["list"]).await);
    assert!(table.contains("2 readers: reader-1, reader-2"), "{table}");
    assert!(table.contains("(foreign string)"), "{table}");
    let value: String = redis::cmd("GET")
        .arg("lock:{weird}")
        .query_async(&mut redis.raw().await)
        .await
        .unwrap();
    assert_eq!(value, "not a lock", "looking never touches a foreign value");
}

// ---------------------------------------------------------------------------------------------
// show

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_tells_everything_about_one_key() {
    let redis = Redis::spawn();
    let guard = client(&redis, "billing-1")
        .await
        .acquire("order:5", &minute().fencing(true))
        .await
        .unwrap();
    let now = redis.time_ms().await;
    let (kept, lapsed) = ((now + 60_000).to_string(), (now - 1).to_string());
    redis
        .run(&[
            &["ZADD", "lock:{order:5}:queue", "1", "a", "2", "b"],
            &["ZADD", "lock:{order:5}:queue:kept", &kept, "a", &lapsed, "b"],
        ])
        .await;

    let shown = json(&lockctl(&redis, &["--json", "show", "order:5"]).await);
    assert_eq!(shown["key"], "order:5");
    assert_eq!(shown["lock_key"], "lock:{order:5}");
    assert_eq!(shown["state"], "held");
    assert_eq!(shown["owner"], "billing-1");
    assert_eq!(shown["fence"].as_u64(), guard.fencing_token());
    assert_eq!(
        shown["fair_waiters"], 1,
        "a waiter whose place lapsed is not counted"
    );
    assert_eq!(shown["waiting_writers"], 0);
    let ttl = shown["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 0 && ttl <= 60_000);

    let text = stdout(&lockctl(&redis, &["show", "order:5"]).await);
    assert!(text.contains("held by billing-1"), "{text}");
    assert!(
        text.contains(&guard.fencing_token().unwrap().to_string()),
        "{text}"
    );

    assert!(guard.release().await.unwrap());
    let free = json(&lockctl(&redis, &["--json", "show", "order:5"]).await);
    assert_eq!(free["state"], "free");
    assert_eq!(free["owner"], Value::Null);
    assert!(free["fence"].is_u64(), "the counter outlives the lock: {free}");
}

// ---------------------------------------------------------------------------------------------
// release

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_without_force_is_refused_and_the_lock_stays() {
    let redis = Redis::spawn();
    let locks = client(&redis, "billing-1").await;
    let _guard = locks.acquire("order:5", &minute()).await.unwrap();

    let out = lockctl_raw(&redis, &["release", "order:5", "--yes"], "").await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = stderr(&out);
    assert!(err.contains("--force") && err.contains("order:5"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let holder = locks.holder("order:5").await.unwrap().expect("still held");
    assert_eq!(holder.owner(), Some("billing-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_with_force_frees_the_lock_and_wakes_its_waiter() {
    let redis = Redis::spawn();
    let holder = client(&redis, "billing-1").await;
    let _stuck = holder.acquire("order:5", &minute()).await.unwrap();
    let waiter = client(&redis, "billing-2").await;
    let waiting = tokio::spawn(async move {
        let got = waiter.acquire("order:5", &minute().wait(DEADLINE)).await;
        (Instant::now(), got)
    });
    let raw = redis.raw().await;
    eventually("the waiter listens for the release", || {
        let mut raw = raw.clone();
        async move {
            let channels: Vec<String> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .query_async(&mut raw)
                .await
                .unwrap();
            channels.iter().any(|c| c == "lock:{order:5}:released")
        }
    })
    .await;

    let out = lockctl(&redis, &["--json", "release", "order:5", "--force", "--yes"]).await;
    let released_at = Instant::now();
    let report = json(&out);
    assert_eq!(report["released"], true);
    assert_eq!(report["previous"]["owner"], "billing-1");
    let (got_at, got) = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap();
    let guard = got.expect("the waiter takes the lock");
    assert!(
        got_at.saturating_duration_since(released_at) < lock_runtime::MAX_WAIT_NAP / 2,
        "woken by the announcement, not by its timer"
    );
    let now = holder
        .holder("order:5")
        .await
        .unwrap()
        .expect("held by the waiter");
    assert_eq!(now.owner(), Some("billing-2"));
    drop(guard);

    let again = json(&lockctl(&redis, &["--json", "release", "nothing", "--force", "--yes"]).await);
    assert_eq!(again["released"], false);
}

/// Issue 23: `release --force` deletes by comparing the key with what it read, in one script:
/// a holder that took the lock in between (after the read, `--yes` or not) is never deleted.
/// The window between read and delete is too short to hit from outside, so this runs the script
/// lockctl sends, with the value read before the lock changed hands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_with_force_never_deletes_a_holder_that_took_the_lock_since() {
    let redis = Redis::spawn();
    let first = client(&redis, "billing-1").await;
    let second = client(&redis, "billing-2").await;
    let mut raw = redis.raw().await;
    let guard = first.acquire("order:7", &minute()).await.unwrap();
    let read: String = redis::cmd("GET")
        .arg("lock:{order:7}")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(guard.release().await.unwrap());
    let taken = second.acquire("order:7", &minute()).await.unwrap();
    let force = redis::Script::new(include_str!("../src/store/redis/scripts/force.lua"));
    let conn = raw.clone();
    let run = |kind: &'static str, value: String| {
        let (force, mut raw) = (force.clone(), conn.clone());
        async move {
            force
                .key("lock:{order:7}")
                .key("lock:{order:7}:waiting")
                .arg(kind)
                .arg(value)
                .arg("lock:{order:7}:released")
                .invoke_async::<i64>(&mut raw)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        run("string", read.clone()).await,
        -1,
        "changed hands: not deleted"
    );
    assert_eq!(run("hash", "read".into()).await, -1, "another type: not deleted");
    let now = first.holder("order:7").await.unwrap().expect("still held");
    assert_eq!(now.owner(), Some("billing-2"));
    let current: String = redis::cmd("GET")
        .arg("lock:{order:7}")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        run("string", format!("{current}:released")).await,
        1,
        "kept for a hold: the same holder"
    );
    assert_eq!(run("string", current).await, 0, "gone already");
    // A foreign string (lockctl shows an excerpt of it) goes, unless a lock took its place.
    let _: () = redis::cmd("SET")
        .arg("lock:{order:7}")
        .arg("not a lock")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        run("string", String::new()).await,
        1,
        "a foreign string is deleted"
    );
    let again = second.acquire("order:7", &minute()).await.unwrap();
    assert_eq!(
        run("string", String::new()).await,
        -1,
        "a lock took the foreign value's place"
    );
    drop(again);
    drop(taken);
}

/// Issue 23: keys, owners and values are request data; lockctl's text output shows control
/// characters escaped, so a key cannot rewrite the operator's terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_output_escapes_what_it_prints() {
    let redis = Redis::spawn();
    let holder = client(&redis, "billing-1").await;
    let _held = holder.acquire("evil\u{1b}[2J\nforged", &minute()).await.unwrap();
    for args in [&["list"][..], &["show", "evil\u{1b}[2J\nforged"]] {
        let out = stdout(&lockctl(&redis, args).await);
        assert!(
            !out.contains('\u{1b}'),
            "{args:?}: a raw escape reached the terminal: {out:?}"
        );
        assert!(out.contains("evil\\u{1b}[2J\\u{a}forged"), "{args:?}: {out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_asks_before_it_deletes() {
    let redis = Redis::spawn();
    let locks = client(&redis, "billing-1").await;
    let _guard = locks.acquire("order:5", &minute()).await.unwrap();

    let declined = lockctl_raw(&redis, &["release", "order:5", "--force"], "n\n").await;
    assert_eq!(declined.status.code(), Some(1));
    let err = stderr(&declined);
    assert!(
        err.contains("release lock order:5 held by billing-1? [y/N]"),
        "{err}"
    );
    assert!(
        locks.is_locked("order:5").await.unwrap(),
        "kept when the answer is no"
    );
    let no_answer = lockctl_raw(&redis, &["release", "order:5", "--force"], "").await;
    assert_eq!(no_answer.status.code(), Some(1), "end of input is no");
    assert!(locks.is_locked("order:5").await.unwrap());

    let confirmed = lockctl_raw(&redis, &["release", "order:5", "--force"], "y\n").await;
    assert!(confirmed.status.success(), "{confirmed:?}");
    assert!(stdout(&confirmed).contains("released order:5 (was held by billing-1)"));
    assert!(!locks.is_locked("order:5").await.unwrap());
}

// ---------------------------------------------------------------------------------------------
// watch

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_acquisitions_and_releases_as_they_happen() {
    let redis = Redis::spawn();
    let locks = client(&redis, "billing-1").await;
    let mut watch = Watch::start(
        &redis,
        &[
            "--json",
            "watch",
            "order:*",
            "--interval-ms",
            "50",
            "--for-ms",
            "60000",
        ],
    );

    let guard = locks.acquire("order:5", &minute()).await.unwrap();
    let _ignored = locks.acquire("invoice:1", &minute()).await.unwrap();
    let acquired = watch.next_event();
    assert_eq!(
        event_of(&acquired),
        ["acquired", "order:5", "billing-1"],
        "{acquired}"
    );
    assert!(acquired["ttl_ms"].as_u64().unwrap() <= 60_000, "{acquired}");
    assert!(guard.release().await.unwrap());
    let released = watch.next_event();
    assert_eq!(
        event_of(&released),
        ["released", "order:5", "billing-1"],
        "{released}"
    );
    watch.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_one_line_per_event_for_people() {
    let redis = Redis::spawn();
    let locks = client(&redis, "billing-1").await;
    let mut watch = Watch::start(&redis, &["watch", "--interval-ms", "50"]);

    let guard = locks.acquire("order:5", &minute()).await.unwrap();
    let acquired = watch.next_line();
    assert!(
        acquired.contains("  order:5  acquired by billing-1 (ttl "),
        "{acquired}"
    );
    assert!(guard.release().await.unwrap());
    let released = watch.next_line();
    assert!(
        released.ends_with("  order:5  released by billing-1"),
        "{released}"
    );
    watch.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_stops_after_for_ms_and_when_stdout_closes() {
    let redis = Redis::spawn();
    let timed = Watch::start(&redis, &["watch", "--for-ms", "200"]);
    let out = timed.finish();
    assert!(out.status.success(), "{out:?}");

    let mut closed = Watch::start(&redis, &["watch", "--interval-ms", "50"]);
    closed.close_stdout();
    let locks = client(&redis, "billing-1").await;
    let _guard = locks.acquire("order:5", &minute()).await.unwrap();
    let out = closed.finish();
    assert!(
        out.status.success(),
        "a closed stdout ends the watch quietly: {out:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Redis Cluster (--cluster) and Sentinel (--sentinel)

/// Issue 30: on a Cluster, `list` walks every primary: locks whose slots three different
/// primaries own are all listed (and `show` reads any of them), from any seed node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_list_shows_the_locks_of_every_shard() {
    let cluster = Cluster::spawn().await;
    let locks = cluster_client(&cluster, "billing-1").await;
    let keys = cluster.keys_on_every_shard("order").await;
    let mut held = Vec::new();
    for key in &keys {
        held.push(locks.acquire(key, &minute().fencing(true)).await.unwrap());
    }
    let _other = locks.acquire("invoice:1", &minute()).await.unwrap();

    let listed = json(&lockctl_at(&cluster.target(), &["--json", "list", "order:*"]).await);
    let mut expected: Vec<&str> = keys.iter().map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(keys_of(&listed), expected, "{listed}");
    for (lock, guard) in listed.as_array().unwrap().iter().zip(sorted(&held)) {
        assert_eq!(lock["owner"], "billing-1", "{lock}");
        assert_eq!(lock["fence"].as_u64(), guard.fencing_token(), "{lock}");
    }
    // Seed nodes given one --url each, and a single seed: the same locks.
    let repeated: Vec<String> = cluster
        .nodes
        .iter()
        .flat_map(|n| ["--url".to_owned(), n.url()])
        .chain(["--cluster".to_owned()])
        .collect();
    let again = json(&lockctl_at(&repeated, &["--json", "list"]).await);
    assert_eq!(keys_of(&again).len(), keys.len() + 1, "{again}");
    let one_seed = ["--cluster".to_owned(), "--url".to_owned(), cluster.nodes[2].url()];
    for key in &keys {
        let shown = json(&lockctl_at(&one_seed, &["--json", "show", key]).await);
        assert_eq!(shown["state"], "held", "{shown}");
        assert_eq!(shown["owner"], "billing-1", "{shown}");
    }
}

/// Issue 30: on a Cluster the library's waiters listen with SSUBSCRIBE, so `release --force`
/// announces with SPUBLISH, as the library's own release does. The operator answers just after
/// one of the waiter's attempts: its next attempt of its own would come a nap later, at least
/// 1.7 s (`MAX_WAIT_NAP` less its 15% of jitter; the holder's ttl is a minute), so taking the lock
/// within 1 s of that attempt is the announcement's doing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_release_with_force_wakes_a_waiter_of_the_library_at_once() {
    let cluster = Cluster::spawn().await;
    let holder = cluster_client(&cluster, "billing-1").await;
    let _stuck = holder.acquire("order:5", &minute()).await.unwrap();
    let waiter = cluster_client(&cluster, "billing-2").await;
    let waiting = tokio::spawn(async move {
        let got = waiter.acquire("order:5", &minute().wait(DEADLINE)).await;
        (Instant::now(), got)
    });
    let shard = cluster.node_of("lock:{order:5}").await;
    eventually("the waiter listens on the lock's shard (SSUBSCRIBE)", || async {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("SHARDCHANNELS")
            .query_async(&mut shard.raw().await)
            .await
            .unwrap();
        channels.iter().any(|c| c == "lock:{order:5}:released")
    })
    .await;

    let command = bin_command_at(&cluster.target(), &["--json", "release", "order:5", "--force"]);
    let asking = Asking::start(&command, "[y/N]");
    let before = shard.script_calls().await;
    eventually("the waiter asks again, on its timer", || async {
        shard.script_calls().await > before
    })
    .await;
    let attempted_at = Instant::now();
    let out = asking.answer("y\n");
    assert!(out.status.success(), "{out:?}");
    let report = json(&out);
    assert_eq!(report["released"], true, "{report}");
    assert_eq!(report["previous"]["owner"], "billing-1");
    let (got_at, got) = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap();
    let guard = got.expect("the waiter takes the lock");
    let after = got_at.saturating_duration_since(attempted_at);
    assert!(
        after < lock_runtime::MAX_WAIT_NAP / 2,
        "woken by the SPUBLISH, not by its timer: took the lock {after:?} after its last attempt"
    );
    let now = holder
        .holder("order:5")
        .await
        .unwrap()
        .expect("held by the waiter");
    assert_eq!(now.owner(), Some("billing-2"));
    drop(guard);
}

/// Issue 30: on a Cluster `watch` hears releases by SSUBSCRIBE to the channel of each lock it
/// saw held (sharded pub/sub has no patterns), on every shard. It looks only once here (the
/// interval is ten minutes), so each release it prints was heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_watch_prints_releases_as_they_are_announced() {
    let cluster = Cluster::spawn().await;
    let locks = cluster_client(&cluster, "billing-1").await;
    let keys = cluster.keys_on_every_shard("order").await;
    let mut held = Vec::new();
    for key in &keys {
        held.push(locks.acquire(key, &minute()).await.unwrap());
    }
    let command = bin_command_at(
        &cluster.target(),
        &["--json", "watch", "order:*", "--interval-ms", "600000"],
    );
    let mut watch = Watch::start_command(&command);
    for (key, guard) in keys.iter().zip(held) {
        assert!(guard.release().await.unwrap());
        let released = watch.next_event();
        assert_eq!(
            event_of(&released),
            ["released", key.as_str(), "billing-1"],
            "{released}"
        );
        assert_eq!(released["announced"], true, "{released}");
    }
    watch.stop();
}

/// The rights the guide (docs/operating.md) names for lockctl on a Cluster, word for word, are
/// enough for `list`,
/// `watch` (hearing releases) and `release --force` (its SPUBLISH, which the script sends with
/// `pcall`, included: no node logs a refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_rights_the_guide_names_are_enough() {
    let cluster = Cluster::spawn().await;
    let guide = include_str!("../../docs/operating.md");
    let rules = guide
        .lines()
        .find(|l| l.starts_with("ACL SETUSER lockctl ") && l.contains("+spublish"))
        .expect("the guide names lockctl's rights on a Cluster");
    let words: Vec<&str> = rules.split_whitespace().collect();
    for node in &cluster.nodes {
        node.run(&[&words]).await;
    }
    let urls: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://lockctl:secret@127.0.0.1:{}", n.port))
        .collect();
    let target = vec!["--cluster".to_owned(), "--url".to_owned(), urls.join(",")];
    let locks = cluster_client(&cluster, "billing-1").await;
    let keys = cluster.keys_on_every_shard("order").await;
    let mut held = Vec::new();
    for key in &keys {
        held.push(locks.acquire(key, &minute()).await.unwrap());
    }

    let listed = json(&lockctl_at(&target, &["--json", "list"]).await);
    assert_eq!(keys_of(&listed).len(), keys.len(), "{listed}");
    let command = bin_command_at(&target, &["--json", "watch", "--interval-ms", "600000"]);
    let mut watch = Watch::start_command(&command);
    let first = held.remove(0);
    assert!(first.release().await.unwrap());
    let released = watch.next_event();
    assert_eq!(released["announced"], true, "heard: {released}");
    watch.stop();
    let report = json(&lockctl_at(&target, &["--json", "release", &keys[1], "--force", "--yes"]).await);
    assert_eq!(report["released"], true, "{report}");
    for node in &cluster.nodes {
        let refusals: Vec<Value> = redis::cmd("ACL")
            .arg("LOG")
            .query_async::<Vec<redis::Value>>(&mut node.raw().await)
            .await
            .unwrap()
            .into_iter()
            .map(|entry| Value::String(format!("{entry:?}")))
            .collect();
        assert!(refusals.is_empty(), "node {}: {refusals:?}", node.port);
    }
}

/// Issue 30: the rights the guide names for lockctl on one server, word for word, are enough
/// for `list`, `show`, `watch` (hearing releases by `PSUBSCRIBE`) and `release --force` (its
/// `PUBLISH` included: the server logs no refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rights_the_guide_names_are_enough() {
    let redis = Redis::spawn();
    let guide = include_str!("../../docs/operating.md");
    let rules = guide
        .lines()
        .find(|l| l.starts_with("ACL SETUSER lockctl ") && l.contains("+publish"))
        .expect("the guide names lockctl's rights on one server");
    let words: Vec<&str> = rules.split_whitespace().collect();
    redis.run(&[&words]).await;
    let target = vec![
        "--url".to_owned(),
        format!("redis://lockctl:secret@127.0.0.1:{}", redis.port),
    ];
    let locks = client(&redis, "billing-1").await;
    let _plain = locks.acquire("order:1", &minute()).await.unwrap();
    let _fenced = locks.acquire("order:2", &minute().fencing(true)).await.unwrap();
    let _read = locks
        .acquire("order:3", &minute().mode(lock_runtime::LockMode::Shared))
        .await
        .unwrap();
    let fair = locks.acquire("order:4", &minute().fair(true)).await.unwrap();

    let listed = json(&lockctl_at(&target, &["--json", "list"]).await);
    assert_eq!(
        keys_of(&listed),
        ["order:1", "order:2", "order:3", "order:4"],
        "{listed}"
    );
    let shown = json(&lockctl_at(&target, &["--json", "show", "order:2"]).await);
    assert_eq!(shown["state"], "held", "{shown}");
    let command = bin_command_at(&target, &["--json", "watch", "--interval-ms", "600000"]);
    let mut watch = Watch::start_command(&command);
    // A fair release always announces (a plain one only when someone waits).
    assert!(fair.release().await.unwrap());
    let released = watch.next_event();
    assert_eq!(released["announced"], true, "heard: {released}");
    watch.stop();
    for key in ["order:1", "order:2", "order:3"] {
        let report = json(&lockctl_at(&target, &["--json", "release", key, "--force", "--yes"]).await);
        assert_eq!(report["released"], true, "{key}: {report}");
    }
    let refusals: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut redis.raw().await)
        .await
        .unwrap();
    assert!(refusals.is_empty(), "{refusals:?}");
}

/// Issue 30: with `--sentinel`, the URLs are sentinels; list, show and release work on the
/// primary they name (and release wakes a waiter there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinels_list_show_and_release_reach_the_primary() {
    let sentinel = Sentinel::spawn().await;
    let holder = sentinel.client("billing-1").await;
    let fenced = holder.acquire("order:5", &minute().fencing(true)).await.unwrap();
    let target = sentinel.target();

    let listed = json(&lockctl_at(&target, &["--json", "list"]).await);
    assert_eq!(keys_of(&listed), ["order:5"], "{listed}");
    assert_eq!(listed[0]["owner"], "billing-1");
    assert_eq!(listed[0]["fence"].as_u64(), fenced.fencing_token());
    let shown = json(&lockctl_at(&target, &["--json", "show", "order:5"]).await);
    assert_eq!(shown["state"], "held", "{shown}");

    let waiter = sentinel.client("billing-2").await;
    let waiting = tokio::spawn(async move { waiter.acquire("order:5", &minute().wait(DEADLINE)).await });
    let report = json(&lockctl_at(&target, &["--json", "release", "order:5", "--force", "--yes"]).await);
    assert_eq!(report["released"], true, "{report}");
    let guard = tokio::time::timeout(DEADLINE, waiting)
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter takes the lock");
    let now = holder
        .holder("order:5")
        .await
        .unwrap()
        .expect("held by the waiter");
    assert_eq!(now.owner(), Some("billing-2"));
    let direct = json(&lockctl(&sentinel.primary, &["--json", "list"]).await);
    assert_eq!(
        direct[0]["owner"], "billing-2",
        "the sentinel named this primary: {direct}"
    );
    drop(guard);
}

/// Issue 38: with `--redlock`, the URLs are independent masters; a lock is listed and shown held
/// when a majority hold it (one master's stray value is not a lock), `release --force` frees it
/// on every master and wakes a waiter, and `watch` sees it come and go, through the library's
/// RedLock store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_list_show_release_and_watch_count_a_majority() {
    let masters = [Redis::spawn(), Redis::spawn(), Redis::spawn()];
    let urls: Vec<String> = masters.iter().map(Redis::url).collect();
    let target = vec!["--redlock".to_owned(), "--url".to_owned(), urls.join(",")];
    let redlock = |owner: &'static str| {
        let urls = urls.clone();
        async move {
            LockClient::builder()
                .redlock(&urls)
                .owner(owner)
                .build()
                .await
                .unwrap_or_else(|e| panic!("cannot connect to the masters: {e}"))
        }
    };
    let holder = redlock("billing-1").await;
    let held = holder.acquire("order:5", &minute()).await.unwrap();
    // A value on one master only: no majority holds it.
    masters[0]
        .run(&[&[
            "SET",
            "lock:{order:9}",
            "0123456789abcdef0123456789abcdef stray",
            "PX",
            "60000",
        ]])
        .await;

    let listed = json(&lockctl_at(&target, &["--json", "list"]).await);
    assert_eq!(keys_of(&listed), ["order:5"], "{listed}");
    assert_eq!(listed[0]["owner"], "billing-1", "{listed}");
    assert_eq!(listed[0]["fence"], Value::Null, "RedLock has no counter");
    let ttl = listed[0]["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "{listed}");
    let shown = json(&lockctl_at(&target, &["--json", "show", "order:9"]).await);
    assert_eq!(shown["state"], "free", "one master of three: {shown}");

    let mut watch = Watch::start_command(&bin_command_at(
        &target,
        &["--json", "watch", "order:*", "--interval-ms", "50"],
    ));
    assert!(held.release().await.unwrap());
    let released = watch.next_event();
    assert_eq!(
        event_of(&released),
        ["released", "order:5", "billing-1"],
        "{released}"
    );
    let _again = holder.acquire("order:5", &minute()).await.unwrap();
    let acquired = watch.next_event();
    assert_eq!(
        event_of(&acquired),
        ["acquired", "order:5", "billing-1"],
        "{acquired}"
    );
    watch.stop();

    let waiter = redlock("billing-2").await;
    let waiting = tokio::spawn(async move { waiter.acquire("order:5", &minute().wait(DEADLINE)).await });
    let report = json(&lockctl_at(&target, &["--json", "release", "order:5", "--force", "--yes"]).await);
    assert_eq!(report["released"], true, "{report}");
    assert_eq!(report["previous"]["owner"], "billing-1");
    let guard = tokio::time::timeout(DEADLINE, waiting)
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter takes the lock");
    let now = holder
        .holder("order:5")
        .await
        .unwrap()
        .expect("held by the waiter");
    assert_eq!(now.owner(), Some("billing-2"));
    drop(guard);
}

/// Deployment options that do not fit together are usage errors (exit code 2), said before
/// anything connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_options_that_do_not_fit_are_usage_errors() {
    let url = "redis://127.0.0.1:1".to_owned();
    for (target, says) in [
        (vec!["--url", &url, "--url", &url], "--cluster"),
        (vec!["--url", &url, "--sentinel"], "--master-name"),
        (vec!["--url", &url, "--master-name", "mymaster"], "--sentinel"),
        (
            vec!["--url", &url, "--cluster", "--sentinel", "--master-name", "m"],
            "--cluster",
        ),
        (vec!["--url", "127.0.0.1:1", "--cluster"], "no scheme"),
    ] {
        let target: Vec<String> = target.into_iter().map(str::to_owned).collect();
        let out = run(&bin_command_at(&target, &["list"]), "");
        assert_eq!(out.status.code(), Some(2), "{target:?}: {out:?}");
        assert!(stderr(&out).contains(says), "{target:?}: {}", stderr(&out));
    }
}

// ---------------------------------------------------------------------------------------------
// errors

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_down_is_one_clear_line_and_exit_code_1() {
    // Bound, never listening: connections to it are refused, and no server can take it.
    let refusing = tokio::net::TcpSocket::new_v4().unwrap();
    refusing.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = refusing.local_addr().unwrap().port();
    let url = format!("redis://127.0.0.1:{port}");
    for command in [
        &["list"][..],
        &["show", "order:5"],
        &["release", "order:5", "--force", "--yes"],
        &["watch"],
    ] {
        let out = run(&bin_command(&url, command), "");
        assert_eq!(out.status.code(), Some(1), "{command:?}: {out:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{command:?}: {err}");
        assert!(
            err.starts_with(&format!("lockctl: cannot reach Redis at {url}: ")),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let hidden = run(
        &bin_command(&format!("redis://ops:s3cret@127.0.0.1:{port}"), &["list"]),
        "",
    );
    assert!(
        !stderr(&hidden).contains("s3cret"),
        "credentials are never printed"
    );
    let bad = run(&bin_command("127.0.0.1:6379", &["list"]), "");
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("no scheme"));
}

// ---------------------------------------------------------------------------------------------
// helpers

/// Options with a one-minute ttl.
fn minute() -> LockOptions {
    LockOptions::new(Duration::from_secs(60))
}

/// A lock client with owner label `owner`.
async fn client(redis: &Redis, owner: &str) -> LockClient {
    LockClient::builder()
        .url(&redis.url())
        .owner(owner)
        .build()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", redis.url()))
}

/// A watch event's kind, key and owner.
fn event_of(event: &Value) -> [&str; 3] {
    ["event", "key", "owner"].map(|field| event[field].as_str().unwrap_or("(none)"))
}

fn keys(locks: &[Value]) -> Vec<&str> {
    locks.iter().map(|l| l["key"].as_str().unwrap()).collect()
}

/// `lockctl --url <redis> ARGS`, which must succeed.
async fn lockctl(redis: &Redis, args: &[&str]) -> Output {
    let out = lockctl_raw(redis, args, "").await;
    assert!(out.status.success(), "lockctl {args:?} failed: {out:?}");
    out
}

/// `lockctl --url <redis> ARGS` with `input` on stdin, off the async workers (the test's lock
/// clients keep running meanwhile).
async fn lockctl_raw(redis: &Redis, args: &[&str], input: &str) -> Output {
    let command = bin_command(&redis.url(), args);
    let input = input.to_owned();
    tokio::task::spawn_blocking(move || run(&command, &input))
        .await
        .unwrap()
}

/// The binary's command line.
fn bin_command(url: &str, args: &[&str]) -> Vec<String> {
    bin_command_at(&["--url".to_owned(), url.to_owned()], args)
}

/// The binary's command line, with `target` (the options that say where the locks are) first.
fn bin_command_at(target: &[String], args: &[&str]) -> Vec<String> {
    let mut command = vec![env!("CARGO_BIN_EXE_lockctl").to_owned()];
    command.extend(target.iter().cloned());
    command.extend(args.iter().map(|a| (*a).to_owned()));
    command
}

/// `lockctl TARGET ARGS`, which must succeed, off the async workers.
async fn lockctl_at(target: &[String], args: &[&str]) -> Output {
    let command = bin_command_at(target, args);
    let out = tokio::task::spawn_blocking(move || run(&command, ""))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "lockctl {target:?} {args:?} failed: {out:?}"
    );
    out
}

/// Starts `command` (lockctl, without `$REDIS_URL` from the test's environment) with its
/// stdin, stdout and stderr piped to the test.
fn spawn_piped(command: &[String]) -> Child {
    Command::new(&command[0])
        .args(&command[1..])
        .env_remove("LOCKCTL_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", command[0]))
}

/// Runs `command` with `input` on stdin; killed and failed if it has not ended by the deadline.
fn run(command: &[String], input: &str) -> Output {
    let mut child = spawn_piped(command);
    let mut stdin = child.stdin.take().unwrap();
    // A command that does not read its input closes the pipe: that is no error here.
    let _ = stdin.write_all(input.as_bytes());
    drop(stdin);
    wait_with_deadline(child, command)
}

/// Waits for `child` to end, reading its output meanwhile (a full pipe would stall it).
fn wait_with_deadline(mut child: Child, command: &[String]) -> Output {
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || read_all(&mut stdout));
    let err = std::thread::spawn(move || read_all(&mut stderr));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("{command:?} still running after {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn read_all(from: &mut impl Read) -> Vec<u8> {
    let mut bytes = Vec::new();
    let _ = from.read_to_end(&mut bytes);
    bytes
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(out)))
}

/// Waits for `condition`, checking every 5 ms; fails after the deadline.
async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !condition().await {
        assert!(started.elapsed() < DEADLINE, "not within {DEADLINE:?}: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A running `lockctl watch`, its output lines read as they come.
struct Watch {
    child: Child,
    /// Its stdout, until the first line is asked for (or the test closes it).
    stdout: Option<ChildStdout>,
    lines: Option<mpsc::Receiver<String>>,
    stderr: mpsc::Receiver<String>,
}

impl Watch {
    /// Starts it and waits until it says it is watching (subscribed, first look taken), so
    /// that whatever the test does next is a change it sees.
    fn start(redis: &Redis, args: &[&str]) -> Watch {
        Watch::start_command(&bin_command(&redis.url(), args))
    }

    /// [`start`](Self::start) with a whole command line (another deployment's options).
    fn start_command(command: &[String]) -> Watch {
        let mut child = Command::new(&command[0])
            .args(&command[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take();
        let stderr = lines_of(child.stderr.take().unwrap());
        let ready = stderr
            .recv_timeout(DEADLINE)
            .expect("lockctl watch says it is watching");
        assert!(ready.starts_with("lockctl: watching"), "{ready}");
        Watch {
            child,
            stdout,
            lines: None,
            stderr,
        }
    }

    fn next_line(&mut self) -> String {
        if let Some(stdout) = self.stdout.take() {
            self.lines = Some(lines_of(stdout));
        }
        let lines = self.lines.as_ref().expect("stdout is open");
        lines.recv_timeout(DEADLINE).unwrap_or_else(|_| {
            let errors: Vec<String> = self.stderr.try_iter().collect();
            panic!("no line from lockctl watch within {DEADLINE:?}; stderr: {errors:?}")
        })
    }

    fn next_event(&mut self) -> Value {
        let line = self.next_line();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// Closes our end of its stdout (before any line was read): its next write fails.
    fn close_stdout(&mut self) {
        assert!(self.lines.is_none(), "close before reading");
        self.stdout = None;
    }

    /// Waits for it to end by itself.
    fn finish(mut self) -> Output {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let stderr = self.stderr.try_iter().collect::<Vec<_>>().join("\n").into_bytes();
                return Output {
                    status,
                    stdout: Vec::new(),
                    stderr,
                };
            }
            assert!(
                started.elapsed() < DEADLINE,
                "lockctl watch did not stop by itself"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines of `from`, sent as they are read; the channel closes at end of input.
fn lines_of(from: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { return };
            if send.send(line).is_err() {
                return;
            }
        }
    });
    receive
}

fn keys_of(listed: &Value) -> Vec<&str> {
    keys(listed.as_array().expect("an array"))
}

/// Guards in the order of their keys.
fn sorted(guards: &[LockGuard]) -> Vec<&LockGuard> {
    let mut sorted: Vec<&LockGuard> = guards.iter().collect();
    sorted.sort_by(|a, b| a.key().cmp(b.key()));
    sorted
}

/// A lock client of `cluster` (`.cluster(urls)`) with owner label `owner`.
async fn cluster_client(cluster: &Cluster, owner: &str) -> LockClient {
    LockClient::builder()
        .cluster(cluster.nodes.iter().map(Redis::url))
        .owner(owner)
        .build()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the cluster: {e}"))
}

/// A Redis Cluster of three primaries without replicas, made by hand (`CLUSTER ADDSLOTSRANGE`,
/// `CLUSTER MEET`): node `i` serves the `i`-th third of the slots.
struct Cluster {
    nodes: Vec<Redis>,
}

impl Cluster {
    const SLOTS: u16 = 16384;

    /// Starts it and waits until every node says `cluster_state:ok` and knows the others.
    async fn spawn() -> Cluster {
        let nodes: Vec<Redis> = (0..3)
            .map(|_| {
                Redis::spawn_with(|dir, _| {
                    vec![
                        "--cluster-enabled".into(),
                        "yes".into(),
                        "--cluster-config-file".into(),
                        dir.join("nodes.conf").into_os_string(),
                        "--cluster-node-timeout".into(),
                        "5000".into(),
                    ]
                })
            })
            .collect();
        for (i, node) in nodes.iter().enumerate() {
            let slots = Cluster::slots_of(i);
            node.run(&[
                // Distinct epochs before meeting, as `redis-cli --cluster create` sets them.
                &["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()],
                &[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &slots.start.to_string(),
                    &(slots.end - 1).to_string(),
                ],
            ])
            .await;
        }
        for node in &nodes[1..] {
            let port = node.port.to_string();
            nodes[0].run(&[&["CLUSTER", "MEET", "127.0.0.1", &port]]).await;
        }
        let cluster = Cluster { nodes };
        eventually("every node to serve the whole settled cluster", || async {
            for node in &cluster.nodes {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut node.raw().await)
                    .await
                    .unwrap();
                if !(info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")) {
                    return false;
                }
            }
            true
        })
        .await;
        cluster
    }

    /// The slots node `i` serves.
    fn slots_of(i: usize) -> std::ops::Range<u16> {
        let third = |i: usize| u16::try_from(i * usize::from(Cluster::SLOTS) / 3).unwrap();
        third(i)..third(i + 1)
    }

    /// `--cluster --url <every node, comma-separated>`.
    fn target(&self) -> Vec<String> {
        let urls: Vec<String> = self.nodes.iter().map(Redis::url).collect();
        vec!["--cluster".to_owned(), "--url".to_owned(), urls.join(",")]
    }

    /// The node serving the slot of `redis_key`.
    async fn node_of(&self, redis_key: &str) -> &Redis {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(redis_key)
            .query_async(&mut self.nodes[0].raw().await)
            .await
            .unwrap();
        let i = (0..3).find(|&i| Cluster::slots_of(i).contains(&slot)).unwrap();
        &self.nodes[i]
    }

    /// Lock keys `<stem>:1`, `<stem>:2`, … until each node serves at least one of them.
    async fn keys_on_every_shard(&self, stem: &str) -> Vec<String> {
        let mut keys = Vec::new();
        let mut served = std::collections::BTreeSet::new();
        for n in 1..100 {
            let key = format!("{stem}:{n}");
            let node = self.node_of(&format!("lock:{{{key}}}")).await;
            if served.insert(node.port) {
                keys.push(key);
            }
            if served.len() == self.nodes.len() {
                return keys;
            }
        }
        panic!("no keys found on every shard");
    }
}

/// A primary and one Redis Sentinel monitoring it as `mymaster`.
struct Sentinel {
    primary: Redis,
    sentinel: Redis,
}

impl Sentinel {
    const MASTER_NAME: &'static str = "mymaster";

    /// Starts both and waits until the sentinel names the primary.
    async fn spawn() -> Sentinel {
        let primary = Redis::spawn();
        let primary_port = primary.port;
        let sentinel = Redis::spawn_with(move |dir, port| {
            let config = dir.join("sentinel.conf");
            let text = format!(
                "port {port}\nbind 127.0.0.1\nsentinel monitor {} 127.0.0.1 {primary_port} 1\n",
                Sentinel::MASTER_NAME
            );
            std::fs::write(&config, text).unwrap();
            vec![config.into_os_string(), "--sentinel".into()]
        });
        let setup = Sentinel { primary, sentinel };
        eventually("the sentinel to name the primary", || async {
            let address: Option<(String, u16)> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(Sentinel::MASTER_NAME)
                .query_async(&mut setup.sentinel.raw().await)
                .await
                .unwrap();
            address.is_some_and(|(_, port)| port == primary_port)
        })
        .await;
        setup
    }

    /// `--sentinel --master-name mymaster --url <the sentinel>`.
    fn target(&self) -> Vec<String> {
        ["--sentinel", "--master-name", Sentinel::MASTER_NAME, "--url"]
            .into_iter()
            .map(str::to_owned)
            .chain([self.sentinel.url()])
            .collect()
    }

    /// A lock client through the sentinel (`.sentinel(urls, master_name)`).
    async fn client(&self, owner: &str) -> LockClient {
        LockClient::builder()
            .sentinel([self.sentinel.url()], Sentinel::MASTER_NAME)
            .owner(owner)
            .build()
            .await
            .unwrap_or_else(|e| panic!("cannot connect through the sentinel: {e}"))
    }
}

/// A running lockctl that has asked a question on stderr and waits for the answer.
struct Asking {
    child: Child,
    command: Vec<String>,
}

impl Asking {
    /// Starts `command` and waits until its stderr shows `question`.
    fn start(command: &[String], question: &str) -> Asking {
        let mut child = spawn_piped(command);
        // The question ends without a newline: read byte by byte until it is there.
        let mut stderr = child.stderr.take().unwrap();
        let mut said = Vec::new();
        let started = Instant::now();
        while !String::from_utf8_lossy(&said).contains(question) {
            assert!(
                started.elapsed() < DEADLINE,
                "{command:?} did not ask {question:?}: {}",
                String::from_utf8_lossy(&said)
            );
            let mut byte = [0u8; 1];
            match stderr.read(&mut byte) {
                Ok(1) => said.push(byte[0]),
                _ => panic!(
                    "{command:?} ended before asking: {}",
                    String::from_utf8_lossy(&said)
                ),
            }
        }
        child.stderr = Some(stderr);
        Asking {
            child,
            command: command.to_vec(),
        }
    }

    /// Answers, and waits for it to end.
    fn answer(mut self, answer: &str) -> Output {
        let mut stdin = self.child.stdin.take().unwrap();
        stdin.write_all(answer.as_bytes()).unwrap();
        drop(stdin);
        wait_with_deadline(self.child, &self.command)
    }
}

/// A `redis-server` on a free loopback port, without persistence, killed on drop.
struct Redis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Redis {
    fn spawn() -> Redis {
        Redis::spawn_with(|_, _| Vec::new())
    }

    /// A `redis-server` whose command line starts with `leading(dir, port)` (a config file, or
    /// more options), before the options every test server has.
    fn spawn_with(leading: impl Fn(&Path, u16) -> Vec<OsString>) -> Redis {
        for attempt in 0..20 {
            let port = free_port();
            let dir =
                std::env::temp_dir().join(format!("lockctl-test-{}-{port}-{attempt}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let binary = std::env::var_os("REDIS_SERVER").unwrap_or_else(|| "redis-server".into());
            let child = Command::new(&binary)
                .args(leading(&dir, port))
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .arg("--dir")
                .arg(&dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot run redis-server (install it, or set $REDIS_SERVER): {e}")
                });
            let mut redis = Redis { child, port, dir };
            if redis.answers() {
                return redis;
            }
            // Most likely the port (or a cluster node's bus port) was taken meanwhile: another.
            drop(redis);
        }
        panic!("redis-server did not start in 20 tries");
    }

    /// Waits until it answers PING; `false` if it exited first.
    fn answers(&mut self) -> bool {
        let started = Instant::now();
        while started.elapsed() < DEADLINE {
            if ping(self.port) {
                return true;
            }
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!(
            "redis-server on port {} did not answer within {DEADLINE:?}",
            self.port
        );
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn raw(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// Runs each command, as a test sets up keys the library would not write.
    async fn run(&self, commands: &[&[&str]]) {
        let mut raw = self.raw().await;
        for command in commands {
            let mut cmd = redis::cmd(command[0]);
            cmd.arg(&command[1..]);
            let _: redis::Value = cmd
                .query_async(&mut raw)
                .await
                .unwrap_or_else(|e| panic!("{command:?}: {e}"));
        }
    }

    /// How many scripts it has run (`EVAL`, `EVALSHA` and their read-only forms, from `INFO
    /// commandstats`): the library's attempts to acquire.
    async fn script_calls(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.raw().await)
            .await
            .unwrap();
        info.lines()
            .filter(|line| line.starts_with("cmdstat_eval"))
            .filter_map(|line| {
                line.split_once("calls=")?
                    .1
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// The server's clock in milliseconds.
    async fn time_ms(&self) -> u64 {
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut self.raw().await)
            .await
            .unwrap();
        secs * 1000 + micros / 1000
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok() && stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL (`--url postgres://…`): the machine's server (`$LOCK_TEST_POSTGRES_URL`, else
// `postgres://postgres@127.0.0.1:5432/test`), each test under a prefix of its own.

/// The machine's PostgreSQL and a prefix no other test or run uses; the options that point
/// lockctl there.
#[cfg(feature = "postgres")]
fn postgres_target(test: &str) -> (String, String, Vec<String>) {
    let url = std::env::var("LOCK_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let prefix = format!("lockctl.{}.{test}:", std::process::id());
    let target = vec![
        "--url".to_owned(),
        url.clone(),
        "--prefix".to_owned(),
        prefix.clone(),
    ];
    (url, prefix, target)
}

#[cfg(feature = "postgres")]
async fn postgres_client(url: &str, prefix: &str, owner: &str) -> LockClient {
    LockClient::builder()
        .postgres(url)
        .prefix(prefix)
        .owner(owner)
        .build()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_list_and_show_read_the_rows_the_library_writes() {
    let (url, prefix, target) = postgres_target("list");
    let billing = postgres_client(&url, &prefix, "billing-1").await;
    let reports = postgres_client(&url, &prefix, "reports-1").await;
    let fenced = billing.acquire("order:5", &minute().fencing(true)).await.unwrap();
    let read = minute().mode(lock_runtime::LockMode::Shared);
    let shares = [
        reports.acquire("prices", &read).await.unwrap(),
        billing.acquire("prices", &read).await.unwrap(),
    ];
    let free = billing.acquire("gone", &minute()).await.unwrap();
    assert!(free.release().await.unwrap());

    let listed = json(&lockctl_at(&target, &["--json", "list"]).await);
    let locks = listed.as_array().expect("an array");
    assert_eq!(keys(locks), ["order:5", "prices"], "{listed}");
    assert_eq!(locks[0]["owner"], "billing-1");
    assert_eq!(locks[0]["state"], "held");
    assert_eq!(locks[0]["fence"].as_u64(), fenced.fencing_token());
    let ttl = locks[0]["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "{listed}");
    assert_eq!(locks[1]["state"], "shared");
    let mut owners: Vec<&str> = locks[1]["readers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["owner"].as_str().unwrap())
        .collect();
    owners.sort_unstable();
    assert_eq!(owners, ["billing-1", "reports-1"]);

    let only = json(&lockctl_at(&target, &["--json", "list", "order:*"]).await);
    assert_eq!(keys_of(&only), ["order:5"], "{only}");
    let shown = json(&lockctl_at(&target, &["--json", "show", "gone"]).await);
    assert_eq!(shown["state"], "free", "{shown}");
    let text = stdout(&lockctl_at(&target, &["list"]).await);
    assert!(text.contains("order:5") && text.contains("billing-1"), "{text}");
    for share in shares {
        share.release().await.unwrap();
    }
    fenced.release().await.unwrap();
    // A fenced lock's row keeps its token for an hour: this test's go now.
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query("DELETE FROM lock_runtime_locks WHERE starts_with(key, $1)")
        .bind(&prefix)
        .execute(&pool)
        .await
        .unwrap();
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_release_with_force_frees_the_lock_and_wakes_its_waiter() {
    let (url, prefix, target) = postgres_target("release");
    let holder = postgres_client(&url, &prefix, "billing-1").await;
    let _stuck = holder.acquire("order:5", &minute()).await.unwrap();
    let waiter = postgres_client(&url, &prefix, "billing-2").await;
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            let got = waiter.acquire("order:5", &minute().wait(DEADLINE)).await;
            (Instant::now(), got)
        }
    });
    eventually("the waiter waits", || async {
        waiter.waiting("order:5").unwrap() == 1
    })
    .await;

    let report = json(&lockctl_at(&target, &["--json", "release", "order:5", "--force", "--yes"]).await);
    let released_at = Instant::now();
    assert_eq!(report["released"], true, "{report}");
    assert_eq!(report["previous"]["owner"], "billing-1");
    let (got_at, got) = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap();
    let guard = got.expect("the waiter takes the lock");
    assert!(
        got_at.saturating_duration_since(released_at) < lock_runtime::MAX_WAIT_NAP / 2,
        "woken by the announcement, not by its timer"
    );
    let now = holder
        .holder("order:5")
        .await
        .unwrap()
        .expect("held by the waiter");
    assert_eq!(now.owner(), Some("billing-2"));
    assert!(guard.release().await.unwrap());
    let again = json(&lockctl_at(&target, &["--json", "release", "order:5", "--force", "--yes"]).await);
    assert_eq!(again["released"], false);
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_watch_prints_acquisitions_and_releases() {
    let (url, prefix, target) = postgres_target("watch");
    let locks = postgres_client(&url, &prefix, "billing-1").await;
    let mut watch = Watch::start_command(&bin_command_at(
        &target,
        &[
            "--json",
            "watch",
            "order:*",
            "--interval-ms",
            "50",
            "--for-ms",
            "60000",
        ],
    ));
    let guard = locks.acquire("order:5", &minute()).await.unwrap();
    let _ignored = locks.acquire("invoice:1", &minute()).await.unwrap();
    let acquired = watch.next_event();
    assert_eq!(
        event_of(&acquired),
        ["acquired", "order:5", "billing-1"],
        "{acquired}"
    );
    assert!(guard.release().await.unwrap());
    let released = watch.next_event();
    assert_eq!(
        event_of(&released),
        ["released", "order:5", "billing-1"],
        "{released}"
    );
    watch.stop();
}

// ---------------------------------------------------------------------------------------------
// etcd (the `etcd` feature): one member is enough for what lockctl reads and writes

/// One `etcd` member on free loopback ports, in a temp dir, killed on drop.
#[cfg(feature = "etcd")]
struct Etcd {
    child: Child,
    port: u16,
    dir: PathBuf,
}

#[cfg(feature = "etcd")]
impl Etcd {
    fn spawn() -> Etcd {
        let (port, peer) = (free_port(), free_port());
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("lockctl-etcd-{}-{port}", std::process::id()));
        let client_url = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(std::env::var_os("ETCD").unwrap_or_else(|| "etcd".into()))
            .arg("--data-dir")
            .arg(&dir)
            .args([
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args([
                "--initial-cluster",
                &format!("default={peer_url}"),
                "--log-level",
                "warn",
                "--logger",
                "zap",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start etcd (Debian: apt-get install etcd-server): {e}"));
        let etcd = Etcd { child, port, dir };
        let deadline = Instant::now() + DEADLINE;
        while !etcd.healthy() {
            assert!(Instant::now() < deadline, "etcd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        etcd
    }

    fn healthy(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        if stream.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_err() {
            return false;
        }
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer.contains("\"health\":\"true\"")
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// lockctl's options for this member, with `prefix`.
    fn target(&self, prefix: &str) -> Vec<String> {
        vec![
            "--url".to_owned(),
            self.endpoint().replacen("http://", "etcd://", 1),
            "--prefix".to_owned(),
            prefix.to_owned(),
        ]
    }

    async fn client(&self, prefix: &str, owner: &str) -> LockClient {
        LockClient::builder()
            .etcd([self.endpoint()])
            .prefix(prefix)
            .owner(owner)
            .build()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to etcd: {e}"))
    }
}

#[cfg(feature = "etcd")]
impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_list_and_show_read_the_keys_the_library_writes() {
    let etcd = tokio::task::spawn_blocking(Etcd::spawn).await.unwrap();
    let target = etcd.target("lock:");
    let billing = etcd.client("lock:", "billing-1").await;
    let reports = etcd.client("lock:", "reports-1").await;
    let fenced = billing.acquire("order:5", &minute().fencing(true)).await.unwrap();
    let read = minute().mode(lock_runtime::LockMode::Shared);
    let shares = [
        reports.acquire("prices", &read).await.unwrap(),
        billing.acquire("prices", &read).await.unwrap(),
    ];
    let free = billing.acquire("gone", &minute().fencing(true)).await.unwrap();
    assert!(free.release().await.unwrap());

    let listed = json(&lockctl_at(&target, &["--json", "list"]).await);
    let locks = listed.as_array().expect("an array");
    assert_eq!(keys(locks), ["order:5", "prices"], "{listed}");
    assert_eq!(locks[0]["owner"], "billing-1");
    assert_eq!(locks[0]["state"], "held");
    assert_eq!(locks[0]["fence"].as_u64(), fenced.fencing_token());
    let ttl = locks[0]["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "{listed}");
    assert_eq!(locks[1]["state"], "shared");
    let mut owners: Vec<&str> = locks[1]["readers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["owner"].as_str().unwrap())
        .collect();
    owners.sort_unstable();
    assert_eq!(owners, ["billing-1", "reports-1"]);

    let only = json(&lockctl_at(&target, &["--json", "list", "order:*"]).await);
    assert_eq!(keys_of(&only), ["order:5"], "{only}");
    let shown = json(&lockctl_at(&target, &["--json", "show", "gone"]).await);
    assert_eq!(shown["state"], "free", "{shown}");
    let text = stdout(&lockctl_at(&target, &["list"]).await);
    assert!(text.contains("order:5") && text.contains("billing-1"), "{text}");
    for share in shares {
        share.release().await.unwrap();
    }
    fenced.release().await.unwrap();
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_release_with_force_frees_the_lock_and_wakes_its_waiter() {
    let etcd = tokio::task::spawn_blocking(Etcd::spawn).await.unwrap();
    let target = etcd.target("lock:");
    let holder = etcd.client("lock:", "billing-1").await;
    let stuck = holder.acquire("order:5", &minute().watchdog(true)).await.unwrap();
    let waiter = etcd.client("lock:", "billing-2").await;
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            let got = waiter.acquire("order:5", &minute().wait(DEADLINE)).await;
            (Instant::now(), got)
        }
    });
    eventually("the waiter waits", || async {
        waiter.waiting("order:5").unwrap() == 1
    })
    .await;

    let report = json(&lockctl_at(&target, &["--json", "release", "order:5", "--force", "--yes"]).await);
    let released_at = Instant::now();
    assert_eq!(report["released"], true, "{report}");
    assert_eq!(report["previous"]["owner"], "billing-1");
    let (got_at, got) = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap();
    let guard = got.expect("the waiter takes the lock");
    assert!(
        got_at.saturating_duration_since(released_at) < lock_runtime::MAX_WAIT_NAP / 2,
        "woken by the watch, not by its timer"
    );
    let now = holder
        .holder("order:5")
        .await
        .unwrap()
        .expect("held by the waiter");
    assert_eq!(now.owner(), Some("billing-2"));
    // The old holder's renewals find its lease gone.
    eventually("the forced-out holder knows", || async { stuck.is_lost() }).await;
    assert!(guard.release().await.unwrap());
    let again = json(&lockctl_at(&target, &["--json", "release", "order:5", "--force", "--yes"]).await);
    assert_eq!(again["released"], false);
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_watch_prints_acquisitions_and_releases() {
    let etcd = tokio::task::spawn_blocking(Etcd::spawn).await.unwrap();
    let target = etcd.target("lock:");
    let locks = etcd.client("lock:", "billing-1").await;
    let mut watch = Watch::start_command(&bin_command_at(
        &target,
        &[
            "--json",
            "watch",
            "order:*",
            "--interval-ms",
            "50",
            "--for-ms",
            "60000",
        ],
    ));
    let guard = locks.acquire("order:5", &minute()).await.unwrap();
    let _ignored = locks.acquire("invoice:1", &minute()).await.unwrap();
    let acquired = watch.next_event();
    assert_eq!(
        event_of(&acquired),
        ["acquired", "order:5", "billing-1"],
        "{acquired}"
    );
    assert!(guard.release().await.unwrap());
    let released = watch.next_event();
    assert_eq!(
        event_of(&released),
        ["released", "order:5", "billing-1"],
        "{released}"
    );
    watch.stop();
}
