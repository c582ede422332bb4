//! The etcd store against the hand-written minimum on etcd, and this library on Redis, in one
//! run, on servers the kit starts (a 3-member etcd cluster and one `redis-server`, loopback).
//!
//! ```text
//! cargo bench -p lock-tests --bench etcd                  # about a minute once built
//! BENCH_SCALE=0.1 cargo bench -p lock-tests --bench etcd  # smoke run
//! ```
//!
//! Contenders, each with one client:
//!
//! - **ours, etcd**: `LockClient::builder().etcd(endpoints)`, `acquire` (ttl 10 s) then
//!   `release`: one transaction on the client's session lease, one deletion.
//! - **recipe, etcd**: etcd's `concurrency` package's mutex written by hand through etcd-client
//!   (its balanced channel over the three members): a session lease granted once and kept
//!   alive, a transaction that puts the caller's key under the lock's prefix with the lease if it
//!   has no create revision and reads the prefix's oldest key, and a deletion: the minimum.
//! - **hand-written, etcd**: a lease per lock: a lease grant (10 s), a transaction that puts the
//!   key with the lease if it has no create revision, and a transaction that deletes it if its
//!   mod revision is still the one taken (the lease is left to end by itself).
//! - **ours, Redis**: `LockClient::connect(redis_url)`, the same acquire and release.
//!
//! Measured: (1) one task doing sequential pairs on one key: latency median and p99, pairs/s;
//! (2) 64 tasks on 64 keys, all on one client: pairs/s; both in 5 interleaved rounds, with the
//! median of the per-round ratios ours / recipe. One transaction's round trip (a put, one task):
//! median and p99. (3) The hand-off on one key: 8 clients
//! (one task each) take turns, each acquiring with a wait, holding it 1 ms and releasing: from a
//! release's start to the next holder's lock, median and p99, plain and fair, on etcd and Redis;
//! on etcd also what the members served per hand-off, by gRPC method (from their `/metrics`).
//! Output: the tables, then one JSON line with the same numbers.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use lock_runtime::{LockClient, LockOptions};
use lock_tests::bench::{handoffs, median, ms, quantile, Naps};
use lock_tests::{EtcdCluster, RedisServer};
use serde_json::json;
use tokio::time::Instant;

const ROUNDS: usize = 5;
const TASKS: usize = 64;
const WAITERS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contender {
    OursEtcd,
    Recipe,
    HandWritten,
    OursRedis,
}

const CONTENDERS: [Contender; 4] = [
    Contender::OursEtcd,
    Contender::Recipe,
    Contender::HandWritten,
    Contender::OursRedis,
];

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::OursEtcd => "ours, etcd",
            Contender::Recipe => "recipe, etcd",
            Contender::HandWritten => "hand-written, etcd",
            Contender::OursRedis => "ours, Redis",
        }
    }
}

struct Bench {
    etcd: LockClient,
    redis: LockClient,
    raw: etcd_client::Client,
    /// The recipe's session lease.
    session: i64,
    options: LockOptions,
}

impl Bench {
    /// One acquire and release of `key` (index `k`) by `who`.
    async fn pair(&self, who: Contender, k: usize) {
        let key = format!("bench-{k}");
        match who {
            Contender::OursEtcd | Contender::OursRedis => {
                let client = if who == Contender::OursRedis {
                    &self.redis
                } else {
                    &self.etcd
                };
                let guard = client.acquire(&key, &self.options).await.unwrap();
                assert!(guard.release().await.unwrap());
            }
            Contender::Recipe => {
                // concurrency.Mutex: the caller's key is the lock's prefix and its lease.
                let prefix = format!("recipe:{key}/");
                let mine = format!("{prefix}{:x}", self.session);
                let oldest = GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1);
                let take = Txn::new()
                    .when([Compare::create_revision(mine.as_str(), CompareOp::Equal, 0)])
                    .and_then([
                        TxnOp::put(
                            mine.as_str(),
                            "",
                            Some(PutOptions::new().with_lease(self.session)),
                        ),
                        TxnOp::get(prefix.as_str(), Some(oldest.clone())),
                    ])
                    .or_else([
                        TxnOp::get(mine.as_str(), None),
                        TxnOp::get(prefix.as_str(), Some(oldest)),
                    ]);
                let taken = self.raw.kv_client().txn(take).await.unwrap();
                let revision = taken.header().unwrap().revision();
                let owner = match &taken.op_responses()[1] {
                    TxnOpResponse::Get(got) => got.kvs()[0].create_revision(),
                    _ => unreachable!("a read"),
                };
                assert_eq!(owner, revision, "uncontended: the caller's key is the oldest");
                self.raw.kv_client().delete(mine.as_str(), None).await.unwrap();
            }
            Contender::HandWritten => {
                let key = format!("hand:{key}");
                let lease = self.raw.lease_client().grant(10, None).await.unwrap().id();
                let take = Txn::new()
                    .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key.as_str(),
                        "token",
                        Some(PutOptions::new().with_lease(lease)),
                    )]);
                let taken = self.raw.kv_client().txn(take).await.unwrap();
                assert!(taken.succeeded());
                let revision = taken.header().unwrap().revision();
                let give_back = Txn::new()
                    .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, revision)])
                    .and_then([TxnOp::delete(key.as_str(), None)]);
                assert!(self.raw.kv_client().txn(give_back).await.unwrap().succeeded());
            }
        }
    }
}

/// Hand-offs on etcd, timed, with what the members served for them.
struct Counted {
    latency: Vec<Duration>,
    /// Waits a nap ended rather than a wake-up.
    naps: u64,
    per_handoff: BTreeMap<String, f64>,
}

impl Counted {
    async fn run(
        cluster: &EtcdCluster,
        clients: &[LockClient],
        naps: &Naps,
        count: usize,
        fair: bool,
    ) -> Counted {
        let key = if fair { "fair" } else { "plain" };
        let before = cluster.served();
        naps.take();
        let latency = handoffs(clients, key, count, fair).await;
        let napped = naps.take();
        let after = cluster.served();
        let per_handoff = after
            .iter()
            .map(|(method, n)| {
                (
                    method.clone(),
                    (n - before.get(method).unwrap_or(&0.0)) / count as f64,
                )
            })
            .filter(|(_, n)| *n >= 0.005)
            .collect();
        Counted {
            latency,
            naps: napped,
            per_handoff,
        }
    }

    fn report(&mut self, name: &str) -> serde_json::Value {
        let (p50, p99) = (
            quantile(&mut self.latency, 0.5),
            quantile(&mut self.latency, 0.99),
        );
        let requests: f64 = self
            .per_handoff
            .iter()
            .filter(|(method, _)| !method.starts_with("Watch"))
            .map(|(_, n)| n)
            .sum();
        let watch_sent = self.per_handoff.get("Watch sent").copied().unwrap_or(0.0);
        println!(
            "{name:<24} {:>8.3}ms {:>8.3}ms  {} waits ended by a nap; {requests:.2} requests and {watch_sent:.2} watch responses per hand-off:",
            ms(p50),
            ms(p99),
            self.naps,
        );
        for (method, per) in &self.per_handoff {
            println!("    {per:>5.2} × {method}");
        }
        json!({"median_ms": ms(p50), "p99_ms": ms(p99), "waits_ended_by_a_nap": self.naps,
            "requests_per_handoff": requests,
            "watch_responses_per_handoff": watch_sent, "by_method": self.per_handoff})
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let naps = Naps::install();
    let scale = lock_tests::bench::scale();
    let cluster = EtcdCluster::spawn();
    let redis = RedisServer::spawn();
    let endpoints = cluster.endpoints();
    let raw = etcd_client::Client::connect(&endpoints, None).await.unwrap();
    let session = raw.lease_client().grant(10, None).await.unwrap().id();
    let (mut keeper, mut kept) = raw.lease_client().keep_alive(session).await.unwrap();
    let keeping = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(3)).await;
            keeper.keep_alive().await.unwrap();
            kept.message().await.unwrap();
        }
    });
    let bench = Arc::new(Bench {
        etcd: LockClient::builder().etcd(&endpoints).build().await.unwrap(),
        redis: LockClient::connect(&redis.url()).await.unwrap(),
        raw,
        session,
        options: LockOptions::new(Duration::from_secs(10)),
    });
    for who in CONTENDERS {
        for k in 0..TASKS {
            bench.pair(who, k).await;
        }
    }

    eprintln!("one task, sequential pairs");
    let per_round = ((300.0 * scale) as usize).max(20);
    let n = CONTENDERS.len();
    let mut latency: Vec<Vec<Duration>> = vec![Vec::new(); n];
    let mut rate: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut ratio = Vec::new();
    for round in 0..ROUNDS {
        let mut round_rate = vec![0.0; n];
        for turn in 0..n {
            let i = (turn + round) % n;
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
    let mut wide: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut wide_ratio = Vec::new();
    for round in 0..ROUNDS {
        let mut round_rate = vec![0.0; n];
        for turn in 0..n {
            let i = (turn + round) % n;
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

    eprintln!("one transaction's round trip");
    let mut round_trip = Vec::new();
    for _ in 0..per_round {
        let put = Txn::new().and_then([TxnOp::put("bench:round-trip", "x", None)]);
        let t = Instant::now();
        bench.raw.kv_client().txn(put).await.unwrap();
        round_trip.push(t.elapsed());
    }
    let (rt50, rt99) = (quantile(&mut round_trip, 0.5), quantile(&mut round_trip, 0.99));

    eprintln!("hand-off, {WAITERS} clients on one key");
    let count = ((300.0 * scale) as usize).max(40);
    let mut clients = Vec::new();
    for _ in 0..WAITERS {
        clients.push(LockClient::builder().etcd(&endpoints).build().await.unwrap());
    }
    handoffs(&clients, "warm", WAITERS * 4, false).await;
    let mut plain = Counted::run(&cluster, &clients, &naps, count, false).await;
    handoffs(&clients, "warm-fair", WAITERS * 4, true).await;
    let mut fair = Counted::run(&cluster, &clients, &naps, count, true).await;
    drop(clients);
    let mut redis_clients = Vec::new();
    for _ in 0..WAITERS {
        redis_clients.push(LockClient::connect(&redis.url()).await.unwrap());
    }
    handoffs(&redis_clients, "warm", WAITERS * 4, false).await;
    naps.take();
    let mut redis_handoff = handoffs(&redis_clients, "handoff", count, false).await;
    let redis_naps = naps.take();

    println!("a 3-member etcd cluster and redis-server on loopback, {per_round} pairs per contender in each of {ROUNDS} rounds");
    println!(
        "\n{:<24} {:>10} {:>10} {:>10} {:>12}",
        "one task", "median", "p99", "pairs/s", "64 tasks/s"
    );
    let mut rows = Vec::new();
    for (i, who) in CONTENDERS.iter().enumerate() {
        let (p50, p99) = (quantile(&mut latency[i], 0.5), quantile(&mut latency[i], 0.99));
        let (one, many) = (median(&mut rate[i]), median(&mut wide[i]));
        println!(
            "{:<24} {:>8.3}ms {:>8.3}ms {:>10.0} {:>12.0}",
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
    println!("ours / recipe on etcd: {one_ratio:.2} (one task), {wide_ratio:.2} (64 tasks)");
    println!(
        "one transaction's round trip: {:.3}ms median, {:.3}ms p99",
        ms(rt50),
        ms(rt99)
    );
    let (r50, r99) = (
        quantile(&mut redis_handoff, 0.5),
        quantile(&mut redis_handoff, 0.99),
    );
    println!("\nhand-off, {WAITERS} clients on one key, {count} hand-offs");
    let plain = plain.report("etcd (watch)");
    let fair = fair.report("etcd, fair");
    keeping.abort();
    println!(
        "{:<24} {:>8.3}ms {:>8.3}ms  {redis_naps} waits ended by a nap",
        "Redis (pub/sub)",
        ms(r50),
        ms(r99)
    );
    let handoff_p99 = plain["p99_ms"].as_f64().unwrap_or(f64::NAN);
    println!(
        "etcd hand-off p99 / one transaction's median round trip: {:.2}",
        handoff_p99 / ms(rt50)
    );
    println!(
        "{}",
        json!({
            "bench": "etcd",
            "pairs": rows,
            "ratio_to_recipe_one_task": one_ratio,
            "txn_round_trip": {"median_ms": ms(rt50), "p99_ms": ms(rt99)},
            "ratio_to_recipe_64_tasks": wide_ratio,
            "handoff": {
                "etcd": plain,
                "etcd_fair": fair,
                "redis": {"median_ms": ms(r50), "p99_ms": ms(r99), "waits_ended_by_a_nap": redis_naps},
            },
        })
    );
}
