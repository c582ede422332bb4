//! Semaphores under contention: 16 tasks on one key with 4 permits, each holding its permit for
//! 1 ms, then giving it back and asking again at once. Per contender: permits handed over per
//! second and the p99 of the wait for a permit, in interleaved rounds on a spawned
//! redis-server, the machine's PostgreSQL, a spawned `mariadbd`, a 3-member etcd cluster and a
//! 3-server ZooKeeper ensemble:
//! - ours on Redis (`permit.lua`: one script per attempt, a waiter woken by a release);
//! - the hand-written minimum on Redis: a sorted set of holders scored by when their lease ends,
//!   taken with one script (drop the expired, count, add) and polled every 1 ms when full;
//! - ours on PostgreSQL (`lock_runtime_v1_permit`: one statement, `NOTIFY` wake-ups);
//! - ours on MySQL (a permit's row in one statement), etcd (one transaction per attempt, waiters
//!   in a queue in the store, the oldest watching the permits) and ZooKeeper (an ephemeral
//!   sequential claim node, waiters queued the same way).
//!
//! Each contender first runs a short round that is not counted (the servers warm up).
//!
//! Per contender of ours, also the waits that ended by a nap rather than by a wake-up (the
//! library's `lock_wait_naps_total`, read through a debugging recorder, over its rounds).
//!
//! Ours on each store twice, not fair and fair (not MySQL, whose waiters poll: `--bench mysql`), in the
//! same rounds, and the ratios fair / not fair of each store's rate and p99.
//!
//! `cargo bench -p lock-tests --bench semaphores` (`BENCH_SCALE=0.1` for a smoke run).

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};
use lock_tests::bench::{ms, quantile, scale, Naps};
use lock_tests::{EtcdCluster, MariadbServer, RedisServer, ZkEnsemble};
use serde_json::json;
use tokio::time::Instant;

const TASKS: usize = 16;
const PERMITS: u32 = 4;
const HOLD: Duration = Duration::from_millis(1);
const ROUNDS: usize = 3;

/// Drops the expired holders, and adds this one if fewer than n remain.
const MINIMUM_TAKE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0";

#[derive(Clone)]
enum Contender {
    /// Ours, fair or not.
    Ours(LockClient, bool),
    Minimum(redis::aio::MultiplexedConnection, Arc<redis::Script>),
}

impl Contender {
    /// One permit taken (waiting as long as it takes), held for [`HOLD`], given back: how long
    /// the wait was.
    async fn turn(&self, key: &str, task: usize, n: u64) -> Duration {
        let asked = Instant::now();
        match self {
            Contender::Ours(client, fair) => {
                let options = LockOptions::new(Duration::from_secs(10))
                    .permits(PERMITS)
                    .wait(Duration::from_secs(60))
                    .fair(*fair);
                let guard = client
                    .acquire(key, &options)
                    .await
                    .expect("a permit within a minute");
                let waited = asked.elapsed();
                tokio::time::sleep(HOLD).await;
                guard.release().await.expect("given back");
                waited
            }
            Contender::Minimum(conn, take) => {
                let mut conn = conn.clone();
                let token = format!("{task}:{n}");
                loop {
                    let taken: i64 = take
                        .key(key)
                        .arg(&token)
                        .arg(10_000)
                        .arg(PERMITS)
                        .invoke_async(&mut conn)
                        .await
                        .expect("the minimum's script");
                    if taken == 1 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let waited = asked.elapsed();
                tokio::time::sleep(HOLD).await;
                let _: i64 = redis::cmd("ZREM")
                    .arg(key)
                    .arg(&token)
                    .query_async(&mut conn)
                    .await
                    .expect("ZREM");
                waited
            }
        }
    }
}

/// [`TASKS`] tasks taking turns on `key` for `length`: permits handed over per second, and
/// every wait.
async fn round(contender: &Contender, key: &str, length: Duration) -> (f64, Vec<Duration>) {
    let end = Instant::now() + length;
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (contender, key) = (contender.clone(), key.to_owned());
            tokio::spawn(async move {
                let mut waits = Vec::new();
                while Instant::now() < end {
                    waits.push(contender.turn(&key, task, waits.len() as u64).await);
                }
                waits
            })
        })
        .collect();
    let started = Instant::now();
    let mut waits = Vec::new();
    for task in tasks {
        waits.extend(task.await.expect("a bench task"));
    }
    (waits.len() as f64 / started.elapsed().as_secs_f64(), waits)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let naps = Naps::install();
    let length = Duration::from_secs_f64((3.0 * scale()).max(0.3));
    let server = RedisServer::spawn();
    let redis_client = LockClient::connect(&server.url()).await.expect("redis");
    let conn = redis::Client::open(server.url().as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let minimum = Contender::Minimum(conn, Arc::new(redis::Script::new(MINIMUM_TAKE)));
    // Ours on each store twice, not fair and fair (not MySQL, whose waiters poll), each pair
    // measured in the same rounds.
    let mut contenders: Vec<(String, Contender)> = Vec::new();
    let mut ours = |name: &str, client: LockClient, fair: bool| {
        contenders.push((format!("ours, {name}"), Contender::Ours(client.clone(), false)));
        if fair {
            contenders.push((format!("ours, {name}, fair"), Contender::Ours(client, true)));
        }
    };
    ours("Redis (one script, woken)", redis_client, true);
    ours("in memory", LockClient::in_memory(), true);
    match LockClient::connect("postgres://postgres@127.0.0.1:5432/test").await {
        Ok(pg) => ours("PostgreSQL (one statement)", pg, true),
        Err(e) => println!("PostgreSQL left out: {e}"),
    }
    // Servers of the kit, kept until the rounds are done.
    let mariadb = MariadbServer::spawn();
    let mysql = LockClient::builder()
        .mysql(&mariadb.url())
        .build()
        .await
        .expect("mariadbd");
    ours("MySQL (MariaDB)", mysql, false);
    let etcd_cluster = EtcdCluster::spawn();
    let etcd = LockClient::builder()
        .etcd(etcd_cluster.endpoints())
        .build()
        .await
        .expect("etcd");
    ours("etcd (queued in the store)", etcd, true);
    let ensemble = ZkEnsemble::spawn();
    let zookeeper = LockClient::builder()
        .zookeeper(ensemble.hosts())
        .build()
        .await
        .expect("zookeeper");
    ours("ZooKeeper (queued in the store)", zookeeper, true);
    contenders.insert(1, ("minimum, Redis (zset, 1 ms poll)".to_owned(), minimum));
    let mut rates = vec![Vec::new(); contenders.len()];
    let mut waits = vec![Vec::new(); contenders.len()];
    let mut napped = vec![0; contenders.len()];
    // A short round per contender first, not counted: the servers' runtimes (ZooKeeper's JVM
    // above all, started for this run) warm up before any contender is measured, not during
    // the first one's first round.
    for (i, (_, contender)) in contenders.iter().enumerate() {
        let key = format!("bench:sem:warm:{i}:{}", std::process::id());
        round(contender, &key, length / 3).await;
    }
    for r in 0..ROUNDS {
        for i in 0..contenders.len() {
            let i = (i + r) % contenders.len();
            let key = format!("bench:sem:{r}:{i}:{}", std::process::id());
            naps.take();
            let (rate, w) = round(&contenders[i].1, &key, length).await;
            napped[i] += naps.take();
            rates[i].push(rate);
            waits[i].extend(w);
        }
    }
    println!("\n{TASKS} tasks, one key, {PERMITS} permits, hold {HOLD:?}, {ROUNDS} rounds of {length:?}");
    println!(
        "{:<36} {:>14} {:>12} {:>12} {:>22}",
        "contender", "handed over/s", "wait p50", "wait p99", "waits ended by a nap"
    );
    let mut rows = Vec::new();
    let mut figures = Vec::new();
    for (i, (name, contender)) in contenders.iter().enumerate() {
        rates[i].sort_by(f64::total_cmp);
        let rate = rates[i][rates[i].len() / 2];
        let (p50, p99) = (quantile(&mut waits[i], 0.5), quantile(&mut waits[i], 0.99));
        figures.push((name.clone(), rate, p99));
        // The minimum is not the library: it polls, and records nothing.
        let naps = matches!(contender, Contender::Ours(..)).then_some(napped[i]);
        let shown = naps.map_or_else(|| "—".to_owned(), |n| n.to_string());
        println!(
            "{name:<36} {rate:>14.0} {:>10.2}ms {:>10.2}ms {shown:>22}",
            ms(p50),
            ms(p99)
        );
        rows.push(json!({"contender": name, "handed_over_per_s": rate, "wait_p50_ms": ms(p50), "wait_p99_ms": ms(p99), "waits_ended_by_a_nap": naps}));
    }
    // Fair against not fair, store by store, from the same rounds.
    println!(
        "\n{:<36} {:>22} {:>22}",
        "fair / not fair", "handed over/s", "wait p99"
    );
    let mut ratios = Vec::new();
    for (name, rate, p99) in &figures {
        let Some(plain) = name.strip_suffix(", fair") else {
            continue;
        };
        if let Some((_, plain_rate, plain_p99)) = figures.iter().find(|(n, ..)| n == plain) {
            let (by_rate, by_p99) = (rate / plain_rate, ms(*p99) / ms(*plain_p99));
            println!("{plain:<36} {by_rate:>22.2} {by_p99:>22.2}");
            ratios.push(json!({"contender": plain, "fair_rate_ratio": by_rate, "fair_p99_ratio": by_p99}));
        }
    }
    println!("{}", json!({ "semaphores": rows, "fair_over_not_fair": ratios }));
    drop((mariadb, etcd_cluster, ensemble));
}
