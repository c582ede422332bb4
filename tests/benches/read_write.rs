//! Read-write locks against the exclusive lock, on a spawned redis-server, in one run with
//! interleaved rounds:
//! 1. one task, sequential acquire + release: an exclusive pair against a shared (read) pair:
//!    median latency, round trips and commands Redis executes per pair;
//! 2. 64 tasks taking shares of one key, against 64 tasks taking exclusive locks on 64 distinct
//!    keys (the most an exclusive lock can do in parallel): pairs per second.
//!
//! Round trips are what the client sends: `SET` (the exclusive fast path) and `EVALSHA`/`EVAL`
//! calls, as counted by `INFO commandstats` (neither the share script nor an uncontended release
//! calls `SET` inside, so the count is the client's alone).
//!
//! `cargo bench -p lock-tests --bench read_write` (add `-- N` for N pairs per round, default
//! 2000).

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockMode, LockOptions};
use lock_tests::RedisServer;

const ROUNDS: usize = 5;
const TASKS: usize = 64;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2000);
    let server = RedisServer::spawn();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let exclusive = LockOptions::new(Duration::from_secs(10));
    let shared = exclusive.clone().mode(LockMode::Shared);
    for options in [&exclusive, &shared] {
        pairs(&client, options, 200).await; // warm connections and script caches
    }

    let (mut latency, mut per_pair) = ([Vec::new(), Vec::new()], [(0.0, 0.0); 2]);
    for _ in 0..ROUNDS {
        for (i, options) in [&exclusive, &shared].into_iter().enumerate() {
            let (sent, executed) = (round_trips(&server).await, server.commands_executed().await);
            latency[i].extend(pairs(&client, options, n).await);
            // Each `INFO commandstats` read by the counters is left out of both counts.
            per_pair[i].0 += (round_trips(&server).await - sent) as f64 / (n * ROUNDS) as f64;
            per_pair[i].1 += (server.commands_executed().await - executed) as f64 / (n * ROUNDS) as f64;
        }
    }
    println!(
        "1 task, sequential acquire + release ({} pairs per mode):",
        n * ROUNDS
    );
    let mut medians = [Duration::ZERO; 2];
    for (i, name) in ["exclusive", "shared (read)"].into_iter().enumerate() {
        latency[i].sort();
        medians[i] = latency[i][latency[i].len() / 2];
        println!(
            "  {name:<14} median {:>8.1?}  round trips {:.2}  commands executed {:.2}",
            medians[i], per_pair[i].0, per_pair[i].1
        );
    }

    let mut throughput = [Vec::new(), Vec::new()];
    for _ in 0..ROUNDS {
        throughput[0].push(parallel(&client, &exclusive, false).await);
        throughput[1].push(parallel(&client, &shared, true).await);
    }
    println!("{TASKS} tasks for 1 s per round, pairs per second (median of {ROUNDS} rounds):");
    let mut rates = [0.0; 2];
    for (i, name) in ["exclusive, 64 distinct keys", "shared, one key"]
        .into_iter()
        .enumerate()
    {
        throughput[i].sort_by(f64::total_cmp);
        rates[i] = throughput[i][ROUNDS / 2];
        println!("  {name:<28} {:>9.0}", rates[i]);
    }
    println!(
        "{{\"sequential_us\":{{\"exclusive\":{:.1},\"shared\":{:.1}}},\"round_trips\":{{\"exclusive\":{:.2},\"shared\":{:.2}}},\"commands\":{{\"exclusive\":{:.2},\"shared\":{:.2}}},\"parallel_pairs_per_s\":{{\"exclusive_distinct_keys\":{:.0},\"shared_one_key\":{:.0}}}}}",
        medians[0].as_secs_f64() * 1e6,
        medians[1].as_secs_f64() * 1e6,
        per_pair[0].0,
        per_pair[1].0,
        per_pair[0].1,
        per_pair[1].1,
        rates[0],
        rates[1],
    );
}

/// `n` sequential pairs on one key: each one's latency.
async fn pairs(client: &LockClient, options: &LockOptions, n: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        client
            .acquire("bench", options)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        samples.push(t.elapsed());
    }
    samples
}

/// The requests a client sent: `SET`, `EVALSHA` and `EVAL` calls.
async fn round_trips(server: &RedisServer) -> u64 {
    let mut sent = 0;
    for command in ["set", "evalsha", "eval"] {
        sent += server.command_calls(command).await;
    }
    sent
}

/// Pairs per second of `TASKS` tasks for one second: on one key (`one_key`) or one key each.
async fn parallel(client: &LockClient, options: &LockOptions, one_key: bool) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(1);
    let tasks = (0..TASKS).map(|i| {
        let (client, options) = (client.clone(), options.clone());
        let key = if one_key {
            "shared".to_owned()
        } else {
            format!("own:{i}")
        };
        tokio::spawn(async move {
            let mut done = 0u64;
            while Instant::now() < deadline {
                client
                    .acquire(&key, &options)
                    .await
                    .unwrap()
                    .release()
                    .await
                    .unwrap();
                done += 1;
            }
            done
        })
    });
    let started = Instant::now();
    let mut total = 0;
    for task in futures_util::future::join_all(tasks).await {
        total += task.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}
