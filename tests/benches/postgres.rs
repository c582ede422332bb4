//! The PostgreSQL store against the hand-written minimum on PostgreSQL, a session advisory lock
//! and this library on Redis, in one run, on servers the kit starts (one `postgres`, one
//! `redis-server`, loopback).
//!
//! ```text
//! cargo bench -p lock-tests --bench postgres                  # about a minute once built
//! BENCH_SCALE=0.1 cargo bench -p lock-tests --bench postgres  # smoke run
//! ```
//!
//! Contenders, each with one client (a sqlx pool of 10 connections on PostgreSQL):
//!
//! - **ours, PostgreSQL**: `LockClient::builder().postgres(url)`, `acquire` (ttl 10 s) then
//!   `release`: one statement each (`lock_runtime_v1_acquire`, `lock_runtime_v1_release`).
//! - **hand-written, PostgreSQL**: the minimum a lease lock on PostgreSQL needs, on the same
//!   kind of pool: `INSERT INTO bench_locks … ON CONFLICT (key) DO UPDATE … WHERE
//!   bench_locks.expires_at <= clock_timestamp() RETURNING 1`, then `DELETE FROM bench_locks
//!   WHERE key = $1 AND token = $2`.
//! - **advisory, PostgreSQL**: a session advisory lock: a connection taken from the pool for the
//!   whole section, `pg_try_advisory_lock(k)`, then `pg_advisory_unlock(k)` (no expiry, no
//!   fencing, a connection held per lock).
//! - **ours, Redis**: `LockClient::connect(redis_url)`, the same acquire and release.
//!
//! Measured: (1) one task doing sequential pairs on one key: latency median and p99, pairs/s;
//! (2) 64 tasks on 64 keys, all on one client: pairs/s; both in 5 interleaved rounds (the
//! contenders take turns within each round, so machine noise hits each alike), with the median
//! of the per-round ratios ours / hand-written. (3) The hand-off on one key: 8 clients (one task
//! each) take turns, each acquiring with a wait, holding it 1 ms and releasing: from a release's
//! start to the next holder's lock, median and p99, on PostgreSQL and on Redis; on PostgreSQL
//! also the statements the server ran per hand-off (`pg_stat_statements`, in a database of
//! their own; every request is one statement), by statement: the release, the woken waiters'
//! attempts; and on every store the waits that ended by a nap rather than a wake-up. (4) A
//! semaphore's attempt with 4 and with 1,024 permits held (refused, and a take and release with
//! one free): medians, and their ratio. Output:
//! the tables, then one JSON line with the same numbers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};
use lock_tests::bench::{handoffs, median, ms, quantile, Naps};
use lock_tests::{PostgresServer, RedisServer};
use serde_json::json;
use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::time::Instant;

const ROUNDS: usize = 5;
const TASKS: usize = 64;
const WAITERS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contender {
    OursPostgres,
    HandWritten,
    Advisory,
    OursRedis,
}

const CONTENDERS: [Contender; 4] = [
    Contender::OursPostgres,
    Contender::HandWritten,
    Contender::Advisory,
    Contender::OursRedis,
];

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::OursPostgres => "ours, PostgreSQL",
            Contender::HandWritten => "hand-written, PostgreSQL",
            Contender::Advisory => "advisory lock, PostgreSQL",
            Contender::OursRedis => "ours, Redis",
        }
    }
}

struct Bench {
    postgres: LockClient,
    redis: LockClient,
    pool: PgPool,
    options: LockOptions,
    tokens: AtomicU64,
}

impl Bench {
    /// One acquire and release of `key` (index `k`) by `who`.
    async fn pair(&self, who: Contender, k: usize) {
        let key = format!("bench-{k}");
        match who {
            Contender::OursPostgres | Contender::OursRedis => {
                let client = if who == Contender::OursRedis {
                    &self.redis
                } else {
                    &self.postgres
                };
                let guard = client.acquire(&key, &self.options).await.unwrap();
                assert!(guard.release().await.unwrap());
            }
            Contender::HandWritten => {
                let token = format!("{:032x}", self.tokens.fetch_add(1, Ordering::Relaxed));
                let taken: Option<i32> = sqlx::query_scalar(
                    "INSERT INTO bench_locks (key, token, expires_at) \
                     VALUES ($1, $2, clock_timestamp() + interval '10 seconds') \
                     ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at \
                     WHERE bench_locks.expires_at <= clock_timestamp() RETURNING 1",
                )
                .bind(&key)
                .bind(&token)
                .fetch_optional(&self.pool)
                .await
                .unwrap();
                assert!(taken.is_some());
                let deleted = sqlx::query("DELETE FROM bench_locks WHERE key = $1 AND token = $2")
                    .bind(&key)
                    .bind(&token)
                    .execute(&self.pool)
                    .await
                    .unwrap();
                assert_eq!(deleted.rows_affected(), 1);
            }
            Contender::Advisory => {
                let mut conn = self.pool.acquire().await.unwrap();
                let id = i64::try_from(k).unwrap() + 1_000_000;
                let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                    .bind(id)
                    .fetch_one(&mut *conn)
                    .await
                    .unwrap();
                assert!(taken);
                let freed: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
                    .bind(id)
                    .fetch_one(&mut *conn)
                    .await
                    .unwrap();
                assert!(freed);
            }
        }
    }
}

/// Hand-offs on PostgreSQL, timed, with the statements the server ran for them
/// (pg_stat_statements, reset first, in the hand-off database).
struct Counted {
    latency: Vec<Duration>,
    /// Waits a nap ended rather than a wake-up.
    naps: u64,
    per_handoff: f64,
    by_statement: Vec<(String, f64)>,
}

impl Counted {
    async fn run(
        clients: &[LockClient],
        statements: &PgPool,
        naps: &Naps,
        count: usize,
        fair: bool,
    ) -> Counted {
        sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(statements)
            .await
            .unwrap();
        let key = if fair { "fair" } else { "plain" };
        naps.take();
        let latency = handoffs(clients, key, count, fair).await;
        let napped = naps.take();
        let ran: Vec<(String, i64)> = sqlx::query_as(
            "SELECT query, calls FROM pg_stat_statements \
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'handoff') \
               AND query NOT ILIKE '%pg_stat_statements%' ORDER BY calls DESC",
        )
        .fetch_all(statements)
        .await
        .unwrap();
        let per_handoff = ran.iter().map(|(_, calls)| *calls).sum::<i64>() as f64 / count as f64;
        let by_statement = ran
            .iter()
            .map(|(query, calls)| (statement_name(query), *calls as f64 / count as f64))
            .collect();
        Counted {
            latency,
            naps: napped,
            per_handoff,
            by_statement,
        }
    }

    fn report(&mut self, name: &str) -> serde_json::Value {
        let (p50, p99) = (
            quantile(&mut self.latency, 0.5),
            quantile(&mut self.latency, 0.99),
        );
        println!(
            "{name:<28} {:>8.3}ms {:>8.3}ms  {} waits ended by a nap; {:.1} statements per hand-off:",
            ms(p50),
            ms(p99),
            self.naps,
            self.per_handoff
        );
        for (statement, per) in &self.by_statement {
            println!("    {per:>5.2} × {statement}");
        }
        json!({"median_ms": ms(p50), "p99_ms": ms(p99), "waits_ended_by_a_nap": self.naps,
            "statements_per_handoff": self.per_handoff,
            "by_statement": self.by_statement.iter()
                .map(|(s, n)| json!({"statement": s, "per_handoff": n})).collect::<Vec<_>>()})
    }
}

/// A pool of the hand-off database, with pg_stat_statements made there.
async fn handoff_pool(url: &str) -> PgPool {
    let pool = PgPool::connect(url).await.unwrap();
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

/// What a statement is, in a few words: the function it calls, or its first words.
fn statement_name(query: &str) -> String {
    if let Some(at) = query.find("lock_runtime_v1_") {
        let name: String = query[at..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        return name;
    }
    query.split_whitespace().take(4).collect::<Vec<_>>().join(" ")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let naps = Naps::install();
    let scale = lock_tests::bench::scale();
    let pg = PostgresServer::spawn_with(&["shared_preload_libraries=pg_stat_statements"]);
    let redis = RedisServer::spawn();
    // The minimum: no ping before each checkout either (as the store's own pool).
    let pool = PgPoolOptions::new()
        .max_connections(10)
        .test_before_acquire(false)
        .connect(&pg.url())
        .await
        .unwrap();
    sqlx::query("CREATE TABLE bench_locks (key text PRIMARY KEY, token text NOT NULL, expires_at timestamptz NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let bench = Arc::new(Bench {
        postgres: LockClient::builder().postgres(&pg.url()).build().await.unwrap(),
        redis: LockClient::connect(&redis.url()).await.unwrap(),
        pool: pool.clone(),
        options: LockOptions::new(Duration::from_secs(10)),
        tokens: AtomicU64::new(0),
    });
    // Warm up: connections, prepared statements, plans.
    for who in CONTENDERS {
        for k in 0..TASKS {
            bench.pair(who, k).await;
            bench.pair(who, k).await;
        }
    }

    eprintln!("one task, sequential pairs");
    let per_round = ((400.0 * scale) as usize).max(20);
    let mut latency: Vec<Vec<Duration>> = vec![Vec::new(); 4];
    let mut rate: Vec<Vec<f64>> = vec![Vec::new(); 4];
    let mut ratio = Vec::new();
    for round in 0..ROUNDS {
        let mut round_rate = [0.0; 4];
        for turn in 0..4 {
            let i = (turn + round) % 4;
            let started = Instant::now();
            for _ in 0..per_round {
                let t = Instant::now();
                bench.pair(CONTENDERS[i], 0).await;
                latency[i].push(t.elapsed());
            }
            round_rate[i] = per_round as f64 / started.elapsed().as_secs_f64();
            rate[i].push(round_rate[i]);
        }
        ratio.push(round_rate[0] / round_rate[1]);
    }

    eprintln!("{TASKS} tasks on {TASKS} keys");
    let window = Duration::from_secs_f64((2.0 * scale).max(0.2));
    let mut wide: Vec<Vec<f64>> = vec![Vec::new(); 4];
    let mut wide_ratio = Vec::new();
    for round in 0..ROUNDS {
        let mut round_rate = [0.0; 4];
        for turn in 0..4 {
            let i = (turn + round) % 4;
            let done = Arc::new(AtomicU64::new(0));
            let until = Instant::now() + window;
            let tasks: Vec<_> = (0..TASKS)
                .map(|k| {
                    let (bench, done) = (Arc::clone(&bench), Arc::clone(&done));
                    tokio::spawn(async move {
                        while Instant::now() < until {
                            bench.pair(CONTENDERS[i], k).await;
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                })
                .collect();
            let started = Instant::now();
            for task in tasks {
                task.await.unwrap();
            }
            round_rate[i] = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
            wide[i].push(round_rate[i]);
        }
        wide_ratio.push(round_rate[0] / round_rate[1]);
    }

    eprintln!("hand-off, {WAITERS} clients on one key");
    let count = ((500.0 * scale) as usize).max(40);
    // In a database of their own, where the statements run are the hand-offs' alone.
    sqlx::query("CREATE DATABASE handoff")
        .execute(&pool)
        .await
        .unwrap();
    let handoff_url = format!("postgres://postgres@127.0.0.1:{}/handoff", pg.port());
    let pg_clients = |n| {
        let url = handoff_url.clone();
        async move {
            let mut clients = Vec::new();
            for _ in 0..n {
                clients.push(LockClient::builder().postgres(&url).build().await.unwrap());
            }
            clients
        }
    };
    let clients = pg_clients(WAITERS).await;
    let statements = handoff_pool(&handoff_url).await;
    handoffs(&clients, "warm", WAITERS * 4, false).await;
    let mut plain = Counted::run(&clients, &statements, &naps, count, false).await;
    handoffs(&clients, "warm-fair", WAITERS * 4, true).await;
    let mut fair = Counted::run(&clients, &statements, &naps, count, true).await;
    drop(clients);
    let mut redis_clients = Vec::new();
    for _ in 0..WAITERS {
        redis_clients.push(LockClient::connect(&redis.url()).await.unwrap());
    }
    handoffs(&redis_clients, "warm", WAITERS * 4, false).await;
    naps.take();
    let mut redis_handoff = handoffs(&redis_clients, "handoff", count, false).await;
    let redis_naps = naps.take();

    eprintln!("semaphores: an attempt with 4 and with 1,024 permits held");
    let samples = ((200.0 * scale) as usize).max(20);
    let small = permit_cost(&bench.postgres, 4, samples).await;
    let large = permit_cost(&bench.postgres, 1024, samples).await;

    println!(
        "PostgreSQL {} and redis-server on loopback, {} pairs per contender in each of {ROUNDS} rounds",
        pg_version(&pool).await,
        per_round
    );
    println!(
        "\n{:<28} {:>10} {:>10} {:>10} {:>12}",
        "one task", "median", "p99", "pairs/s", "64 tasks/s"
    );
    let mut rows = Vec::new();
    for (i, who) in CONTENDERS.iter().enumerate() {
        let (p50, p99) = (quantile(&mut latency[i], 0.5), quantile(&mut latency[i], 0.99));
        let (one, many) = (median(&mut rate[i]), median(&mut wide[i]));
        println!(
            "{:<28} {:>8.3}ms {:>8.3}ms {:>10.0} {:>12.0}",
            who.name(),
            ms(p50),
            ms(p99),
            one,
            many
        );
        rows.push(
            json!({"contender": who.name(), "median_ms": ms(p50), "p99_ms": ms(p99),
            "pairs_per_s": one, "pairs_per_s_64_tasks": many}),
        );
    }
    let (one_ratio, wide_ratio) = (median(&mut ratio), median(&mut wide_ratio));
    println!("ours / hand-written on PostgreSQL: {one_ratio:.2} (one task), {wide_ratio:.2} (64 tasks)");
    let (r50, r99) = (
        quantile(&mut redis_handoff, 0.5),
        quantile(&mut redis_handoff, 0.99),
    );
    println!("\nhand-off, {WAITERS} clients on one key, {count} hand-offs");
    let plain = plain.report("PostgreSQL (NOTIFY)");
    let fair = fair.report("PostgreSQL, fair");
    println!(
        "{:<28} {:>8.3}ms {:>8.3}ms  {redis_naps} waits ended by a nap",
        "Redis (pub/sub)",
        ms(r50),
        ms(r99)
    );
    println!("\nsemaphore, one attempt (median of {samples})   refused, all held   take + release, one free");
    for (n, (refused, take)) in [(4, small), (1024, large)] {
        println!("{n:>5} permits {:>36.3}ms {:>24.3}ms", ms(refused), ms(take));
    }
    println!(
        "1,024 / 4: {:.2} (refused), {:.2} (take + release)",
        ms(large.0) / ms(small.0),
        ms(large.1) / ms(small.1)
    );
    println!(
        "{}",
        json!({
            "bench": "postgres",
            "semaphore_attempt": {
                "refused_ms": {"4": ms(small.0), "1024": ms(large.0)},
                "take_release_ms": {"4": ms(small.1), "1024": ms(large.1)},
            },
            "pairs": rows,
            "ratio_one_task": one_ratio,
            "ratio_64_tasks": wide_ratio,
            "handoff": {
                "postgres": plain,
                "postgres_fair": fair,
                "redis": {"median_ms": ms(r50), "p99_ms": ms(r99), "waits_ended_by_a_nap": redis_naps},
            },
        })
    );
}

/// What one attempt at a semaphore costs with every one of its `n` permits held (refused: the
/// attempt reads every holder), and one take and release with all but one held: medians.
async fn permit_cost(client: &LockClient, n: u32, samples: usize) -> (Duration, Duration) {
    let key = format!("permits-{n}");
    let options = LockOptions::new(Duration::from_secs(120)).permits(n);
    let mut held = Vec::with_capacity(n as usize);
    for _ in 0..n - 1 {
        held.push(client.acquire(&key, &options).await.unwrap());
    }
    let mut take = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        let guard = client.acquire(&key, &options).await.unwrap();
        guard.release().await.unwrap();
        take.push(started.elapsed());
    }
    held.push(client.acquire(&key, &options).await.unwrap());
    let mut refused = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        assert!(
            client.acquire(&key, &options).await.is_err(),
            "every permit is held"
        );
        refused.push(started.elapsed());
    }
    for guard in held {
        guard.release().await.unwrap();
    }
    (quantile(&mut refused, 0.5), quantile(&mut take, 0.5))
}

async fn pg_version(pool: &PgPool) -> String {
    sqlx::query_scalar("SHOW server_version")
        .fetch_one(pool)
        .await
        .unwrap_or_default()
}
