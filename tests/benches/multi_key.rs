//! Multi-key locks, in interleaved rounds, on a spawned redis-server, PostgreSQL server,
//! `mariadbd`, 3-member etcd cluster and 3-server ZooKeeper ensemble, and in memory (each takes
//! a set of exclusive locks in one request; the in-memory store's two clients are clones of one,
//! as two tasks of a process share it):
//! 1. one task, sequential: a 2-key set (`acquire_all` + `release`) against two single-key
//!    acquires and releases in a fixed order (what a careful hand-written transfer does):
//!    pairs per second;
//! 2. two tasks taking the same two keys in opposite orders with a wait (`run_all`), as two
//!    opposite transfers do: sets per second, the wait's p50/p99, and the waits that ended by a
//!    nap rather than a wake-up.
//!
//! `cargo bench -p lock-tests --bench multi_key` (`BENCH_SCALE=0.1` for a smoke run).

use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};
use lock_tests::bench::{ms, quantile, scale, Naps};
use lock_tests::{EtcdCluster, MariadbServer, PostgresServer, RedisServer, ZkEnsemble};
use serde_json::json;
use tokio::time::Instant;

const ROUNDS: usize = 5;

async fn set_pairs(locks: &LockClient, n: usize) -> f64 {
    let options = LockOptions::new(Duration::from_secs(10));
    let started = Instant::now();
    for _ in 0..n {
        let both = locks
            .acquire_all(["acct:1", "acct:2"], &options)
            .await
            .expect("free");
        both.release().await.expect("released");
    }
    n as f64 / started.elapsed().as_secs_f64()
}

async fn single_pairs(locks: &LockClient, n: usize) -> f64 {
    let options = LockOptions::new(Duration::from_secs(10));
    let started = Instant::now();
    for _ in 0..n {
        let a = locks.acquire("acct:3", &options).await.expect("free");
        let b = locks.acquire("acct:4", &options).await.expect("free");
        b.release().await.expect("released");
        a.release().await.expect("released");
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// Two clients, opposite orders, `n` sets each: sets per second and every wait.
async fn opposite(clients: &[LockClient; 2], n: usize) -> (f64, Vec<Duration>) {
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, locks)| {
            let locks = locks.clone();
            tokio::spawn(async move {
                let keys = if i == 0 {
                    ["acct:5", "acct:6"]
                } else {
                    ["acct:6", "acct:5"]
                };
                let options = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(30));
                let mut waits = Vec::with_capacity(n);
                for _ in 0..n {
                    let asked = Instant::now();
                    locks
                        .run_all(keys, &options, async {
                            waits.push(asked.elapsed());
                            tokio::task::yield_now().await;
                        })
                        .await
                        .expect("within the wait");
                }
                waits
            })
        })
        .collect();
    let mut waits = Vec::new();
    for task in tasks {
        waits.extend(task.await.expect("a bench task"));
    }
    (waits.len() as f64 / started.elapsed().as_secs_f64(), waits)
}

/// The rounds on one store (`n` pairs per round), printed and as JSON.
async fn measure(store: &str, clients: &[LockClient; 2], naps: &Naps, n: usize) -> serde_json::Value {
    set_pairs(&clients[0], n / 10).await; // warm connections, sessions and script caches
    single_pairs(&clients[0], n / 10).await;
    let (mut sets, mut singles, mut opposed, mut waits) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut napped = 0;
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            sets.push(set_pairs(&clients[0], n).await);
            singles.push(single_pairs(&clients[0], n).await);
        } else {
            singles.push(single_pairs(&clients[0], n).await);
            sets.push(set_pairs(&clients[0], n).await);
        }
        naps.take();
        let (rate, w) = opposite(clients, n / 4).await;
        napped += naps.take();
        opposed.push(rate);
        waits.extend(w);
    }
    for v in [&mut sets, &mut singles, &mut opposed] {
        v.sort_by(f64::total_cmp);
    }
    let median = |v: &Vec<f64>| v[v.len() / 2];
    let (p50, p99) = (quantile(&mut waits, 0.5), quantile(&mut waits, 0.99));
    println!("\n{store}: 1 task, {n} sequential pairs per round, {ROUNDS} rounds (median pairs/s):");
    println!("  2-key set (acquire_all)            {:>8.0}", median(&sets));
    println!("  two single locks, fixed order      {:>8.0}", median(&singles));
    println!(
        "  ratio                              {:>8.2}",
        median(&sets) / median(&singles)
    );
    println!(
        "{store}: 2 clients, opposite orders, with a wait ({} sets each per round):",
        n / 4
    );
    println!(
        "  sets/s {:>8.0}   wait p50 {:.2} ms   p99 {:.2} ms   {napped} waits ended by a nap",
        median(&opposed),
        ms(p50),
        ms(p99)
    );
    json!({"store": store, "set_pairs_per_s": median(&sets), "single_pairs_per_s": median(&singles),
           "opposite_sets_per_s": median(&opposed), "opposite_wait_p50_ms": ms(p50), "opposite_wait_p99_ms": ms(p99),
           "opposite_waits_ended_by_a_nap": napped})
}

/// Two clients of one store, made by `connect`.
async fn two<F, Fut>(connect: F) -> [LockClient; 2]
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<LockClient, lock_runtime::LockError>>,
{
    [
        connect().await.expect("a client"),
        connect().await.expect("a client"),
    ]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let naps = Naps::install();
    let n = ((2000.0 * scale()) as usize).max(50);
    let mut figures = Vec::new();
    {
        let server = RedisServer::spawn();
        let url = server.url();
        let clients = two(|| LockClient::connect(&url)).await;
        figures.push(measure("redis", &clients, &naps, n).await);
    }
    {
        let server = PostgresServer::spawn();
        let url = server.url();
        let clients = two(|| LockClient::builder().postgres(&url).build()).await;
        figures.push(measure("postgres", &clients, &naps, n / 2).await);
    }
    {
        let server = MariadbServer::spawn();
        let url = server.url();
        let clients = two(|| LockClient::builder().mysql(&url).build()).await;
        figures.push(measure("mysql", &clients, &naps, n / 2).await);
    }
    {
        let cluster = EtcdCluster::spawn();
        let endpoints = cluster.endpoints();
        let clients = two(|| LockClient::builder().etcd(&endpoints).build()).await;
        figures.push(measure("etcd", &clients, &naps, n / 4).await);
    }
    {
        let ensemble = ZkEnsemble::spawn();
        let hosts = ensemble.hosts();
        let clients = two(|| LockClient::builder().zookeeper(&hosts).build()).await;
        figures.push(measure("zookeeper", &clients, &naps, n / 4).await);
    }
    {
        let memory = LockClient::in_memory();
        figures.push(measure("memory", &[memory.clone(), memory], &naps, n).await);
    }
    println!("{}", serde_json::Value::Array(figures));
}
