//! The MySQL store against the hand-written minimum on MariaDB and a `GET_LOCK` named lock, in
//! one run, on a `mariadbd` the kit starts (loopback; the kit's settings, the same for all).
//!
//! ```text
//! cargo bench -p lock-tests --bench mysql                  # about a minute once built
//! BENCH_SCALE=0.1 cargo bench -p lock-tests --bench mysql  # smoke run
//! ```
//!
//! Contenders, each with one client (a sqlx pool of 10 connections, none pinged before use):
//!
//! - **ours, MySQL**: `LockClient::builder().mysql(url)`, `acquire` (ttl 10 s) then `release`:
//!   one statement each (the acquire's `INSERT … ON DUPLICATE KEY UPDATE`, the release's
//!   token-checked `DELETE`).
//! - **hand-written, MySQL**: the minimum a lease row needs: `INSERT … ON DUPLICATE KEY UPDATE
//!   token = IF(expired, new, token), expires_ms = IF(token = new, …)`, then `DELETE … WHERE
//!   name = ? AND token = ?`.
//! - **GET_LOCK, MySQL**: a connection taken from the pool for the section, `GET_LOCK(name, 0)`
//!   then `RELEASE_LOCK(name)` (no expiry, no fencing, a connection held per lock).
//!
//! Measured: (1) one task doing sequential pairs on one key: latency median and p99, pairs/s;
//! (2) 64 tasks on 64 keys, one client: pairs/s; both in 5 interleaved rounds, with the median
//! of the per-round ratios ours / hand-written. (3) The hand-off on one key between 8 clients
//! (one task each; each acquires with a wait, holds 1 ms, releases): from a release's start to
//! the next holder's lock, median and p99 — on MySQL a waiter of another client finds the lock
//! at its next poll; the same fair (the line's head, named by the release), with the ratio of
//! the p99s fair / plain. (4) Read-write: one task's share pairs beside exclusive pairs on one
//! key, and how long a writer waits among three clients' readers looping on its key. Output:
//! the tables, then one JSON line with the same numbers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockClient, LockMode, LockOptions};
use lock_tests::bench::{handoffs, many_task_rounds, median, ms, one_task_rounds, pair_rows, quantile, Naps};
use lock_tests::MariadbServer;
use serde_json::json;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use tokio::time::Instant;

const ROUNDS: usize = 5;
const TASKS: usize = 64;
const WAITERS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contender {
    Ours,
    HandWritten,
    GetLock,
}

const CONTENDERS: [Contender; 3] = [Contender::Ours, Contender::HandWritten, Contender::GetLock];

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Ours => "ours, MySQL",
            Contender::HandWritten => "hand-written, MySQL",
            Contender::GetLock => "GET_LOCK, MySQL",
        }
    }
}

/// The hand-written acquire: the row taken when free or expired (binds: name, token, token).
const TAKE: &str = "INSERT INTO bench_locks (name, token, expires_ms) \
     VALUES (?, ?, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000) + 10000) \
     ON DUPLICATE KEY UPDATE \
       token = IF(expires_ms <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000), \
                  VALUES(token), token), \
       expires_ms = IF(token = VALUES(token), VALUES(expires_ms), expires_ms)";

struct Bench {
    ours: LockClient,
    pool: MySqlPool,
    options: LockOptions,
    tokens: AtomicU64,
}

impl Bench {
    /// One acquire and release of `key` (index `k`) by `who`.
    async fn pair(&self, who: Contender, k: usize) {
        let key = format!("bench-{k}");
        match who {
            Contender::Ours => {
                let guard = self.ours.acquire(&key, &self.options).await.unwrap();
                assert!(guard.release().await.unwrap());
            }
            Contender::HandWritten => {
                let token = format!("{:032x}", self.tokens.fetch_add(1, Ordering::Relaxed));
                let taken = sqlx::query(TAKE)
                    .bind(key.as_bytes())
                    .bind(token.as_bytes())
                    .execute(&self.pool)
                    .await
                    .unwrap();
                assert!(taken.rows_affected() >= 1);
                let deleted = sqlx::query("DELETE FROM bench_locks WHERE name = ? AND token = ?")
                    .bind(key.as_bytes())
                    .bind(token.as_bytes())
                    .execute(&self.pool)
                    .await
                    .unwrap();
                assert_eq!(deleted.rows_affected(), 1);
            }
            Contender::GetLock => {
                let mut conn = self.pool.acquire().await.unwrap();
                let taken: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                    .bind(&key)
                    .fetch_one(&mut *conn)
                    .await
                    .unwrap();
                assert_eq!(taken, Some(1));
                let freed: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                    .bind(&key)
                    .fetch_one(&mut *conn)
                    .await
                    .unwrap();
                assert_eq!(freed, Some(1));
            }
        }
    }
}

/// How long a holder keeps the lock after the waiter of the other client has been refused, in
/// turn: the waiter is then at different steps of its polling backoff.
const HOLDS: [u64; 6] = [5, 20, 50, 100, 200, 400];

/// `count` hand-offs from one client to the other: a holder takes the lock, the other client's
/// waiter is refused and polls, the holder keeps the lock for the next of [`HOLDS`] and
/// releases. Each sample runs from the release's start to the waiter's lock; the roles swap
/// each time.
async fn across_clients(clients: &[LockClient], count: usize) -> Vec<Duration> {
    let options = LockOptions::new(Duration::from_secs(10));
    let waiting = options.clone().wait(Duration::from_secs(30));
    let mut seen = Vec::with_capacity(count);
    for i in 0..count {
        let (holder, waiter) = (&clients[i % 2], clients[(i + 1) % 2].clone());
        let guard = holder.acquire("across", &options).await.unwrap();
        let before = lock_tests::waiting(&waiter, "across");
        let task = tokio::spawn({
            let (waiter, waiting) = (waiter.clone(), waiting.clone());
            async move {
                let guard = waiter.acquire("across", &waiting).await.unwrap();
                let at = Instant::now();
                assert!(guard.release().await.unwrap());
                at
            }
        });
        lock_tests::joined_line(&waiter, "across", before).await;
        tokio::time::sleep(Duration::from_millis(HOLDS[i % HOLDS.len()])).await;
        let released = Instant::now();
        assert!(guard.release().await.unwrap());
        seen.push(task.await.unwrap() - released);
    }
    seen
}

/// A writer of `clients[0]` takes the lock `count` times while a reader of each other client
/// takes and gives back shares in a loop (holding each 1 ms): how long each of the writer's
/// acquires waited (its claim keeps new readers out; the readers' last release lets it in).
async fn writer_among_readers(clients: &[LockClient], count: usize) -> Vec<Duration> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = clients[1..]
        .iter()
        .cloned()
        .map(|client| {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let read = LockOptions::new(Duration::from_secs(10))
                    .mode(LockMode::Shared)
                    .wait(Duration::from_secs(30));
                while !stop.load(Ordering::SeqCst) {
                    let guard = client.acquire("rw-mixed", &read).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    assert!(guard.release().await.unwrap());
                }
            })
        })
        .collect();
    let write = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(30));
    let mut waits = Vec::with_capacity(count);
    for _ in 0..count {
        let at = Instant::now();
        let guard = clients[0].acquire("rw-mixed", &write).await.unwrap();
        waits.push(at.elapsed());
        assert!(guard.release().await.unwrap());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for reader in readers {
        reader.await.unwrap();
    }
    waits
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let naps = Naps::install();
    let scale = lock_tests::bench::scale();
    let server = MariadbServer::spawn();
    // The minimum: no ping before each checkout either (as the store's own pool).
    let pool = MySqlPoolOptions::new()
        .max_connections(10)
        .test_before_acquire(false)
        .connect(&server.url())
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE bench_locks (name VARBINARY(1300) NOT NULL PRIMARY KEY, \
         token VARBINARY(2048) NOT NULL, expires_ms BIGINT NOT NULL) ENGINE = InnoDB",
    )
    .execute(&pool)
    .await
    .unwrap();
    let bench = Arc::new(Bench {
        ours: LockClient::builder().mysql(&server.url()).build().await.unwrap(),
        pool: pool.clone(),
        options: LockOptions::new(Duration::from_secs(10)),
        tokens: AtomicU64::new(0),
    });
    // Warm up: connections, prepared statements.
    for who in CONTENDERS {
        for k in 0..TASKS {
            bench.pair(who, k).await;
            bench.pair(who, k).await;
        }
    }
    let n = CONTENDERS.len();

    eprintln!("one task, sequential pairs");
    let per_round = ((400.0 * scale) as usize).max(20);
    let pair = {
        let bench = Arc::clone(&bench);
        Arc::new(move |i: usize, k: usize| {
            let bench = Arc::clone(&bench);
            async move { bench.pair(CONTENDERS[i], k).await }
        })
    };
    let mut one = one_task_rounds(n, ROUNDS, per_round, &*pair).await;

    eprintln!("{TASKS} tasks on {TASKS} keys");
    let window = Duration::from_secs_f64((2.0 * scale).max(0.2));
    let mut many = many_task_rounds(n, ROUNDS, TASKS, window, pair).await;

    eprintln!("hand-off, {WAITERS} clients on one key");
    let count = ((300.0 * scale) as usize).max(40);
    let mut clients = Vec::new();
    for _ in 0..WAITERS {
        clients.push(LockClient::builder().mysql(&server.url()).build().await.unwrap());
    }
    handoffs(&clients, "warm", WAITERS * 4, false).await;
    naps.take();
    let mut handoff = handoffs(&clients, "handoff", count, false).await;
    let handoff_naps = naps.take();
    eprintln!("fair hand-off, {WAITERS} clients on one key");
    handoffs(&clients, "warm-fair", WAITERS * 4, true).await;
    naps.take();
    let mut fair = handoffs(&clients, "handoff-fair", count, true).await;
    let fair_naps = naps.take();
    eprintln!("read-write: shares and exclusive pairs, one task; a writer among readers");
    let rounds = ((300.0 * scale) as usize).max(30);
    let (mut shares, mut exclusive) = (Vec::new(), Vec::new());
    let shared = LockOptions::new(Duration::from_secs(10)).mode(LockMode::Shared);
    for _ in 0..rounds {
        for (options, seen) in [(&shared, &mut shares), (&bench.options, &mut exclusive)] {
            let at = Instant::now();
            let guard = bench.ours.acquire("rw", options).await.unwrap();
            assert!(guard.release().await.unwrap());
            seen.push(at.elapsed());
        }
    }
    let mut writer_waits = writer_among_readers(&clients[..4], rounds).await;
    eprintln!("hand-off between two clients, the waiter polling");
    let mut across = across_clients(&clients[..2], ((60.0 * scale) as usize).max(12)).await;

    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&pool)
        .await
        .unwrap_or_default();
    println!("MariaDB {version} on loopback, {per_round} pairs per contender in each of {ROUNDS} rounds");
    let names: Vec<&str> = CONTENDERS.iter().map(|c| c.name()).collect();
    let rows = pair_rows(&names, &mut one, &mut many);
    let (one_ratio, wide_ratio) = (median(&mut one.ratio), median(&mut many.ratio));
    println!("ours / hand-written on MySQL: {one_ratio:.2} (one task), {wide_ratio:.2} (64 tasks)");
    let (h50, h99) = (quantile(&mut handoff, 0.5), quantile(&mut handoff, 0.99));
    println!("\nhand-off, {WAITERS} clients on one key, {count} hand-offs");
    // MySQL's waiters poll (no notifications): the waits of one client's first waiter end by
    // a nap whenever another client released.
    println!(
        "{:<28} {:>8.3}ms {:>8.3}ms  {handoff_naps} waits ended by a nap",
        "MySQL, 8 clients",
        ms(h50),
        ms(h99)
    );
    let (f50, f99) = (quantile(&mut fair, 0.5), quantile(&mut fair, 0.99));
    println!(
        "{:<28} {:>8.3}ms {:>8.3}ms  {fair_naps} waits ended by a nap; fair / plain p99 {:.2}",
        "MySQL, 8 clients, fair",
        ms(f50),
        ms(f99),
        ms(f99) / ms(h99).max(f64::MIN_POSITIVE)
    );
    let (s50, s99) = (quantile(&mut shares, 0.5), quantile(&mut shares, 0.99));
    let (x50, x99) = (quantile(&mut exclusive, 0.5), quantile(&mut exclusive, 0.99));
    println!("\nread-write, one task, {rounds} pairs each (a share is one transaction each way)");
    println!("{:<28} {:>8.3}ms {:>8.3}ms", "MySQL, share", ms(s50), ms(s99));
    println!("{:<28} {:>8.3}ms {:>8.3}ms", "MySQL, exclusive", ms(x50), ms(x99));
    let (w50, w99) = (
        quantile(&mut writer_waits, 0.5),
        quantile(&mut writer_waits, 0.99),
    );
    println!(
        "{:<28} {:>8.3}ms {:>8.3}ms  (3 clients' readers in a loop, each holding 1 ms)",
        "MySQL, a writer's wait",
        ms(w50),
        ms(w99)
    );
    let (a50, a99) = (quantile(&mut across, 0.5), quantile(&mut across, 0.99));
    let worst = across.iter().max().copied().unwrap_or_default();
    println!(
        "{:<28} {:>8.3}ms {:>8.3}ms  (max {:.1} ms; holds of {HOLDS:?} ms)",
        "MySQL, to another client",
        ms(a50),
        ms(a99),
        ms(worst)
    );
    println!(
        "{}",
        json!({
            "bench": "mysql",
            "pairs": rows,
            "ratio_one_task": one_ratio,
            "ratio_64_tasks": wide_ratio,
            "handoff": {"median_ms": ms(h50), "p99_ms": ms(h99), "waits_ended_by_a_nap": handoff_naps},
            "handoff_fair": {"median_ms": ms(f50), "p99_ms": ms(f99), "waits_ended_by_a_nap": fair_naps},
            "share_pair": {"median_ms": ms(s50), "p99_ms": ms(s99)},
            "exclusive_pair": {"median_ms": ms(x50), "p99_ms": ms(x99)},
            "writer_among_readers_wait": {"median_ms": ms(w50), "p99_ms": ms(w99)},
            "handoff_to_another_client": {"median_ms": ms(a50), "p99_ms": ms(a99), "max_ms": ms(worst)},
        })
    );
}
