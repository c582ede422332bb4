//! Locks across separate OS processes (the `lock-worker` binary of this package): fair waiters
//! get the lock in the order they arrived, a waiter killed while first in line is skipped, and a
//! process told to stop gives its locks back.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lock_runtime::FAIR_PLACE_KEPT;
use lock_tests::{connect, eventually, ttl, RedisServer, SECOND};
use redis::AsyncCommands;
use tokio::time::Instant;

/// Starts a worker that waits (fairly) for `key` and logs `name` to `log` once it holds it.
fn worker(server: &RedisServer, key: &str, name: &str, log: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_lock-worker"))
        .args([&server.url(), key, name, log, "20", "fair"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start lock-worker: {e}"))
}

async fn in_line(server: &RedisServer, key: &str) -> usize {
    let mut raw = server.raw().await;
    raw.zcard(format!("lock:{{{key}}}:queue")).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_in_four_processes_get_the_lock_in_arrival_order() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    let holder = client.acquire("procs", &ttl(60_000).fair(true)).await.unwrap();
    let mut workers = Vec::new();
    for i in 0..4 {
        workers.push(worker(&server, "procs", &i.to_string(), "procs:log"));
        eventually(10 * SECOND, "the worker is in line", || async {
            in_line(&server, "procs").await == i + 1
        })
        .await;
    }
    holder.release().await.unwrap();
    for mut w in workers {
        let status = tokio::task::spawn_blocking(move || w.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "{status}");
    }
    let log: Vec<String> = server.raw().await.lrange("procs:log", 0, -1).await.unwrap();
    assert_eq!(
        log,
        ["0", "1", "2", "3"],
        "order of acquisition = order of arrival"
    );
    assert_eq!(in_line(&server, "procs").await, 0, "nobody left in line");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_killed_first_in_line_is_skipped_within_the_bound() {
    let server = RedisServer::spawn();
    let client = connect(&server.url()).await;
    let holder = client.acquire("killed", &ttl(60_000).fair(true)).await.unwrap();
    let mut first = worker(&server, "killed", "first", "killed:log");
    eventually(10 * SECOND, "the first worker is in line", || async {
        in_line(&server, "killed").await == 1
    })
    .await;
    let mut second = worker(&server, "killed", "second", "killed:log");
    eventually(10 * SECOND, "the second worker is in line", || async {
        in_line(&server, "killed").await == 2
    })
    .await;
    first.kill().unwrap(); // SIGKILL: it cannot leave the line
    first.wait().unwrap();
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let mut raw = server.raw().await;
    eventually(10 * SECOND, "the second worker holds the lock", || async {
        let log: Vec<String> = raw.clone().lrange("killed:log", 0, -1).await.unwrap();
        !log.is_empty()
    })
    .await;
    let took = released_at.elapsed();
    let status = tokio::task::spawn_blocking(move || second.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
    let log: Vec<String> = raw.lrange("killed:log", 0, -1).await.unwrap();
    assert_eq!(log, ["second"]);
    // The dead waiter's place lapses FAIR_PLACE_KEPT after its last ask (before the release);
    // the next waiter asks at least every 300 ms and then holds the lock at once. The holder's
    // ttl (a minute) is never waited out. The rest is slack for a loaded machine (the log is
    // polled every 5 ms).
    let bound = FAIR_PLACE_KEPT + Duration::from_millis(300 + 400);
    assert!(
        took < bound,
        "the dead waiter held up the line for {took:?} (bound {bound:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_shuts_down_on_sigterm_leaves_its_locks_free() {
    use std::io::BufRead;
    let server = RedisServer::spawn();
    let mut holder = Command::new(env!("CARGO_BIN_EXE_lock-worker"))
        .args([&server.url(), "term", "holder", "term:log", "0", "until-sigterm"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start lock-worker: {e}"));
    let stdout = holder.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(line.trim(), "held");
    let client = connect(&server.url()).await;
    for key in ["term", "term:renewed"] {
        assert!(
            client.is_locked(key).await.unwrap(),
            "{key} is held before SIGTERM"
        );
    }
    let status = Command::new("kill")
        .args(["-TERM", &holder.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status = tokio::task::spawn_blocking(move || holder.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
    // Right after it exited, not after the ttls (30 s and a minute).
    for key in ["term", "term:renewed", "term:dropped"] {
        assert!(
            !client.is_locked(key).await.unwrap(),
            "{key} still held after the process stopped"
        );
    }
}
