//! The ZooKeeper store against the hand-written minimum and zookeeper-client's own lock recipe,
//! in one run, on a 3-server ensemble the kit starts (loopback, the kit's settings: 100 ms
//! ticks, no fsync).
//!
//! ```text
//! cargo bench -p lock-tests --bench zookeeper                  # about a minute once built
//! BENCH_SCALE=0.1 cargo bench -p lock-tests --bench zookeeper  # smoke run
//! ```
//!
//! Contenders, each with one session (one connection):
//!
//! - **ours, ZooKeeper**: `LockClient::builder().zookeeper(hosts)`, `acquire` (ttl 10 s) then
//!   `release`: a create, a read of the line, a delete.
//! - **minimum, ZooKeeper**: the recipe by hand through zookeeper-client: create an ephemeral
//!   sequential `_c_<uuid>-lock-` node under the lock's (existing) node, list the children (it is
//!   the first: nobody else takes these keys), delete it. Three requests, as ours.
//! - **zookeeper-client's recipe**: `Client::lock` with Curator's layout
//!   (`LockPrefix::new_curator`), released by dropping its guard, which deletes the node in the
//!   background (the next acquire on the key waits for that deletion).
//!
//! Measured: (1) one task doing sequential pairs on one key: latency median and p99, pairs/s;
//! (2) 64 tasks on 64 keys, one client: pairs/s; both in 5 interleaved rounds, with the median
//! of the per-round ratios ours / minimum. (3) The hand-off on one key between 8 clients (one
//! task each; each acquires with a wait, holds 1 ms, releases): from a release's start to the
//! next holder's lock, median and p99 — the next in line is woken by a watch on the node ahead
//! of its own — and how many of those waits ended by a nap rather than by that watch (the
//! library's `lock_wait_naps_total{store="zookeeper"}`, read through a debugging recorder; the
//! goal is 0); then the same with `fair` asked (the same line of nodes: a ZooKeeper lock is
//! served in order either way). Output: the tables, then one JSON line with the same numbers.

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};
use lock_tests::bench::{handoffs, many_task_rounds, median, ms, one_task_rounds, pair_rows, quantile, Naps};
use lock_tests::ZkEnsemble;
use serde_json::json;
use zookeeper_client::{Acls, Client, CreateMode, LockPrefix};

const ROUNDS: usize = 5;
const TASKS: usize = 64;
const WAITERS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contender {
    Ours,
    Minimum,
    Recipe,
}

const CONTENDERS: [Contender; 3] = [Contender::Ours, Contender::Minimum, Contender::Recipe];

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Ours => "ours, ZooKeeper",
            Contender::Minimum => "minimum, ZooKeeper",
            Contender::Recipe => "zookeeper-client's recipe",
        }
    }
}

struct Bench {
    ours: LockClient,
    zk: Client,
    options: LockOptions,
}

impl Bench {
    /// One acquire and release of `key` (index `k`) by `who`.
    async fn pair(&self, who: Contender, k: usize) {
        match who {
            Contender::Ours => {
                let guard = self
                    .ours
                    .acquire(&format!("bench-{k}"), &self.options)
                    .await
                    .unwrap();
                assert!(guard.release().await.unwrap());
            }
            Contender::Minimum => {
                let lock = format!("/bench-min/bench-{k}");
                let prefix = format!("{lock}/_c_{}-lock-", uuid::Uuid::new_v4());
                let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
                let (_, sequence) = self.zk.create(&prefix, b"", &options).await.unwrap();
                let mine = format!("{prefix}{sequence}");
                let children = self.zk.list_children(&lock).await.unwrap();
                assert_eq!(children.len(), 1, "the only one in line");
                self.zk.delete(&mine, None).await.unwrap();
            }
            Contender::Recipe => {
                let lock = format!("/bench-recipe/bench-{k}");
                let prefix = LockPrefix::new_curator(&lock, "lock-").unwrap();
                let options = zookeeper_client::LockOptions::new(Acls::anyone_all())
                    .with_ancestor_options(CreateMode::Persistent.with_acls(Acls::anyone_all()))
                    .unwrap();
                let guard = self.zk.lock(prefix, b"", options).await.unwrap();
                drop(guard);
            }
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let naps = Naps::install();
    let scale = lock_tests::bench::scale();
    let ensemble = tokio::task::spawn_blocking(ZkEnsemble::spawn).await.unwrap();
    let hosts = ensemble.hosts();
    let zk = Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&hosts.join(","))
        .await
        .unwrap();
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    for k in 0..TASKS {
        zk.mkdir(&format!("/bench-min/bench-{k}"), &persistent)
            .await
            .unwrap();
    }
    let bench = Arc::new(Bench {
        ours: LockClient::builder()
            .zookeeper(&hosts)
            .prefix("/bench-ours")
            .build()
            .await
            .unwrap(),
        zk,
        options: LockOptions::new(Duration::from_secs(10)),
    });
    // Warm up: sessions, the locks' nodes.
    for who in CONTENDERS {
        for k in 0..TASKS {
            bench.pair(who, k).await;
            bench.pair(who, k).await;
        }
    }
    let n = CONTENDERS.len();
    let pair = {
        let bench = Arc::clone(&bench);
        Arc::new(move |i: usize, k: usize| {
            let bench = Arc::clone(&bench);
            async move { bench.pair(CONTENDERS[i], k).await }
        })
    };

    eprintln!("one task, sequential pairs");
    let per_round = ((400.0 * scale) as usize).max(20);
    let mut one = one_task_rounds(n, ROUNDS, per_round, &*pair).await;

    eprintln!("{TASKS} tasks on {TASKS} keys");
    let window = Duration::from_secs_f64((2.0 * scale).max(0.2));
    let mut many = many_task_rounds(n, ROUNDS, TASKS, window, pair).await;

    eprintln!("hand-off, {WAITERS} clients on one key");
    let count = ((300.0 * scale) as usize).max(40);
    let mut clients = Vec::new();
    for _ in 0..WAITERS {
        clients.push(
            LockClient::builder()
                .zookeeper(&hosts)
                .prefix("/bench-ours")
                .build()
                .await
                .unwrap(),
        );
    }
    handoffs(&clients, "warm", WAITERS * 4, false).await;
    naps.take();
    // Not fair, then fair: the row's name, its JSON field, the samples and the naps.
    let mut measured = Vec::new();
    for (fair, name, field) in [
        (false, "ZooKeeper, 8 clients", "handoff"),
        (true, "ZooKeeper, 8 clients, fair", "fair_handoff"),
    ] {
        let samples = handoffs(&clients, field, count, fair).await;
        measured.push((name, field, samples, naps.take()));
    }

    println!(
        "ZooKeeper 3-server ensemble on loopback, {per_round} pairs per contender in each of {ROUNDS} rounds"
    );
    let names: Vec<&str> = CONTENDERS.iter().map(|c| c.name()).collect();
    let rows = pair_rows(&names, &mut one, &mut many);
    let (one_ratio, wide_ratio) = (median(&mut one.ratio), median(&mut many.ratio));
    println!("ours / minimum on ZooKeeper: {one_ratio:.2} (one task), {wide_ratio:.2} (64 tasks)");
    println!("\nhand-off, {WAITERS} clients on one key, {count} hand-offs");
    println!(
        "{:<28} {:>10} {:>10} {:>22}",
        "", "median", "p99", "waits ended by a nap"
    );
    let mut figures = json!({
        "bench": "zookeeper",
        "pairs": rows,
        "ratio_one_task": one_ratio,
        "ratio_64_tasks": wide_ratio,
    });
    for (name, field, mut samples, napped) in measured {
        let (p50, p99) = (quantile(&mut samples, 0.5), quantile(&mut samples, 0.99));
        println!("{name:<28} {:>8.3}ms {:>8.3}ms {napped:>22}", ms(p50), ms(p99));
        figures[field] = json!({"median_ms": ms(p50), "p99_ms": ms(p99), "waits_ended_by_a_nap": napped});
    }
    println!("{figures}");
    drop(ensemble);
}
