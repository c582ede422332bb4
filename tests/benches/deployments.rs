//! Deployments benchmark: what an uncontended acquire + release costs on a Redis Cluster and with
//! replica acknowledgement, and with RedLock over 5 masters, all on loopback, in one run.
//!
//! ```text
//! cargo bench -p lock-tests --bench deployments                  # about 45 s once built
//! BENCH_SCALE=0.1 cargo bench -p lock-tests --bench deployments  # smoke run
//! ```
//!
//! `BENCH_SCALE` (default 1) scales the samples per round, the throughput windows, the counted
//! pairs and the proxied samples; the number of rounds stays 5.
//!
//! 1. **Redis Cluster, 3 primaries, no replicas** (`RedisCluster::spawn(3, 0)`). Ours
//!    (`LockClient::builder().cluster(urls)`, `acquire` with a 10 s ttl, then `release`)
//!    against the hand-written minimum on redis-rs's own async cluster connection
//!    (`ClusterClient::new(urls)`): `SET key token NX PX 10000`, then a compare-and-delete Lua
//!    script by `redis::Script::invoke_async` (`EVALSHA`). Both use the same 16 keys,
//!    `lock:{bench-0}` … `lock:{bench-15}` (ours is given `bench-N`, and its default prefix
//!    makes that `lock:{bench-N}`), spread over the primaries by their hash tags, taken round
//!    robin. Measured in 5 interleaved rounds (each cut into 4 slices that the contenders take
//!    in turn, the order rotating each round, so that machine noise hits every contender alike):
//!    one task doing sequential pairs (latency median and p99 over
//!    the samples of all rounds, pairs/s as the median of the rounds, and the median of the
//!    per-round throughput ratios ours / hand-written), then 16 concurrent tasks, each on its
//!    own key, all sharing the contender's one client (pairs/s, ratio). A `PING` to one node,
//!    on a plain connection, gives the scale. Then, untimed, the commands the primaries executed
//!    per pair (`INFO commandstats`, commands run inside scripts included).
//! 2. **`wait_for_replicas(1, 1 s)` on one primary with one replica** (`--replicaof`, online
//!    before anything is measured). Two clients of the primary, one plain and one that sends
//!    `WAIT 1 1000` behind every acquire: latency median/p99 of a pair and pairs/s in 5
//!    interleaved rounds, with the `PING` round trip; the commands the primary executed per
//!    pair (the `WAIT` included, and the replica's `REPLCONF ACK` that each `WAIT` asks for,
//!    which the primary counts too); and the round trips per pair, seen through a proxy (in
//!    this file) delaying every chunk by 5 ms each way: a pair's latency divided by a `PING`'s
//!    is the number of round trips it took, so a `WAIT` pipelined behind the acquire shows as
//!    no extra one. (Not the test kit's `FaultProxy`: it writes without TCP_NODELAY, and when
//!    the `WAIT`'s answer reaches it as a second segment, that segment waits for the client's
//!    delayed ACK, some 40 ms, in up to half of the pairs here; Redis itself sets TCP_NODELAY.)
//! 3. **The same on a Redis Cluster of 3 primaries with a replica each**
//!    (`RedisCluster::spawn(3, 1)`): ours plain against ours with `wait_for_replicas(1, 1 s)`,
//!    latency and commands executed per pair on the primaries.
//! 4. **RedLock over 5 independent masters** (five `RedisServer::spawn()`, quorum 3;
//!    `LockClient::builder().redlock(urls)`) against one master alone (master 0,
//!    `LockClient::builder().url(url)`), both on the same 16 keys: a `PING` to master 0 for the
//!    scale, then, as in part 1, latency median/p99 and pairs/s of one task and pairs/s of 16
//!    tasks, in 5 interleaved rounds; the ratio RedLock / one master (the project's goal: a
//!    median latency at most 1.2 times one master's); and, untimed, per master, the requests
//!    sent (`SET`, `EVALSHA`, `EVAL`) and the commands executed (those inside the release
//!    script included) per pair.
//!
//! Every client uses redis-rs's default socket settings (no TCP_NODELAY; ours adds only TCP
//! keepalive). Output: the tables, then one JSON line with the same numbers. Progress goes to
//! stderr.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};
use lock_tests::{RedisCluster, RedisServer};
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The ttl of every lock.
const TTL: Duration = Duration::from_secs(10);
/// How many keys the pairs go round, and how many tasks run at once in the concurrent window.
const KEYS: usize = 16;
/// Rounds of every interleaved measurement.
const ROUNDS: usize = 5;
/// Each round's measurements are cut into this many slices, the contenders taking turns, as on
/// a shared machine the speed swings within a second.
const SLICES: usize = 4;
/// How long the primary waits for the replica's acknowledgement (`wait_for_replicas`).
const REPLICA_TIMEOUT: Duration = Duration::from_secs(1);
/// What the delaying proxy adds to each direction when counting round trips.
const PROXY_DELAY: Duration = Duration::from_millis(5);
/// How many independent masters the RedLock client holds its locks on.
const MASTERS: usize = 5;
/// The project's goal for RedLock: its median pair latency at most this many times one master's.
const GOAL_LATENCY_RATIO: f64 = 1.2;
/// The commands counted one by one (lower case, as `INFO commandstats` names them).
/// `replconf` is the replica's `REPLCONF ACK`, which a `WAIT` asks for (`REPLCONF GETACK`).
const NAMED: [&str; 9] = [
    "set", "evalsha", "eval", "get", "del", "publish", "spublish", "wait", "replconf",
];

/// The lock names given to ours: `bench-N`, which its prefix makes `lock:{bench-N}`.
static OURS_KEYS: LazyLock<Vec<String>> = LazyLock::new(|| (0..KEYS).map(|i| format!("bench-{i}")).collect());
/// The Redis keys: the keys ours writes, and the hand-written lock's keys.
static REDIS_KEYS: LazyLock<Vec<String>> =
    LazyLock::new(|| (0..KEYS).map(|i| format!("lock:{{bench-{i}}}")).collect());
static OPTIONS: LazyLock<LockOptions> = LazyLock::new(|| LockOptions::new(TTL));

// ---------------------------------------------------------------------------------------------
// Configuration.

#[derive(Debug, Clone, Copy)]
struct Config {
    scale: f64,
    /// Sequential pairs per contender per round.
    per_round: usize,
    /// The concurrent window per contender per round.
    window: Duration,
    /// Pairs run while counting commands.
    counted_pairs: usize,
    /// Samples per contender through the delaying proxy.
    proxied: usize,
}

impl Config {
    fn from_env() -> Config {
        let scale = match std::env::var("BENCH_SCALE") {
            Ok(s) => s
                .parse::<f64>()
                .ok()
                .filter(|s| *s > 0.0 && s.is_finite())
                .unwrap_or_else(|| panic!("BENCH_SCALE must be a positive number, not {s:?}")),
            Err(_) => 1.0,
        };
        let count = |n: f64, min: f64| (n * scale).max(min).round() as usize;
        Config {
            scale,
            per_round: count(1000.0, 20.0),
            window: Duration::from_secs_f64((1.0 * scale).max(0.1)),
            counted_pairs: count(1000.0, 50.0),
            proxied: count(20.0, 5.0),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What is measured.

/// One thing timed: a `PING`, or an acquire + release pair of one of the locks.
#[derive(Clone)]
enum Contender {
    Ping(MultiplexedConnection),
    /// The hand-written minimum on redis-rs's cluster connection.
    Hand(ClusterConnection),
    /// Ours, with a label for messages.
    Ours(&'static str, LockClient),
}

impl Contender {
    /// One `PING`, or one acquire + release on key `i % KEYS`; panics on any failure.
    async fn pair(&self, i: usize) {
        let i = i % KEYS;
        match self {
            Contender::Ping(conn) => {
                let _: String = redis::cmd("PING")
                    .query_async(&mut conn.clone())
                    .await
                    .unwrap_or_else(|e| panic!("PING failed: {e}"));
            }
            Contender::Hand(conn) => {
                let mut conn = conn.clone();
                let key = &REDIS_KEYS[i];
                let token = lock_tests::hand_written::token();
                let set: Option<String> = redis::cmd("SET")
                    .arg(key)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL.as_millis() as u64)
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("hand-written: SET {key} NX PX failed: {e}"));
                if set.is_none() {
                    panic!("hand-written: {key} was held by someone else");
                }
                let deleted: i64 = lock_tests::hand_written::release_script()
                    .key(key)
                    .arg(&token)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("hand-written: the release script on {key} failed: {e}"));
                if deleted != 1 {
                    panic!("hand-written: the release of {key} found the lock gone");
                }
            }
            Contender::Ours(name, client) => {
                let key = &OURS_KEYS[i];
                let guard = client
                    .acquire(key, &OPTIONS)
                    .await
                    .unwrap_or_else(|e| panic!("{name}: acquire {key} failed: {e}"));
                let released = guard
                    .release()
                    .await
                    .unwrap_or_else(|e| panic!("{name}: release {key} failed: {e}"));
                if !released {
                    panic!("{name}: the release of {key} found the lock gone");
                }
            }
        }
    }

    /// `n` sequential pairs on keys `first..first + n` (round robin): their latencies go to
    /// `samples`; returns the time they took.
    async fn sequential(&self, first: usize, n: usize, samples: &mut Vec<Duration>) -> Duration {
        let start = Instant::now();
        for i in first..first + n {
            let t = Instant::now();
            self.pair(i).await;
            samples.push(t.elapsed());
        }
        start.elapsed()
    }

    /// `KEYS` tasks, task `i` on key `i`, looping pairs for `window`: returns how many pairs
    /// they made and the time until the last task finished its last pair.
    async fn concurrent(&self, window: Duration) -> (u64, Duration) {
        let start = Instant::now();
        let deadline = start + window;
        let tasks: Vec<_> = (0..KEYS)
            .map(|i| {
                let contender = self.clone();
                tokio::spawn(async move {
                    let mut pairs = 0u64;
                    while Instant::now() < deadline {
                        contender.pair(i).await;
                        pairs += 1;
                    }
                    pairs
                })
            })
            .collect();
        let mut total = 0;
        for task in tasks {
            total += task
                .await
                .unwrap_or_else(|e| panic!("a concurrent task failed: {e}"));
        }
        (total, start.elapsed())
    }
}

/// One contender's numbers over the rounds.
#[derive(Default)]
struct Series {
    /// Every sequential pair's latency, all rounds.
    samples: Vec<Duration>,
    /// Sequential pairs/s, one per round.
    sequential: Vec<f64>,
    /// Concurrent pairs/s, one per round (if measured).
    concurrent: Vec<f64>,
}

impl Series {
    fn at(&self, q: f64) -> Duration {
        let mut sorted = self.samples.clone();
        sorted.sort_unstable();
        sorted
            .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_else(|| panic!("no samples"))
    }

    fn json(&self) -> Value {
        json!({
            "samples": self.samples.len(),
            "median_us": micros(self.at(0.5)),
            "p99_us": micros(self.at(0.99)),
            "max_us": micros(self.at(1.0)),
            "sequential_pairs_per_s": median(&self.sequential),
            "sequential_pairs_per_s_rounds": self.sequential,
            "concurrent_pairs_per_s": (!self.concurrent.is_empty()).then(|| median(&self.concurrent)),
            "concurrent_pairs_per_s_rounds": self.concurrent,
        })
    }
}

/// Runs `ROUNDS` rounds. In each, every contender's sequential pairs, cut into `SLICES` slices
/// that the contenders take in turn, then, with `window`, every contender's concurrent window,
/// cut the same way (the order rotating by one each round); a round's rate is its pairs over
/// the time its slices took.
async fn interleaved(contenders: &[Contender], config: &Config, window: Option<Duration>) -> Vec<Series> {
    let mut series: Vec<Series> = contenders.iter().map(|_| Series::default()).collect();
    let n = contenders.len();
    let slice = config.per_round.div_ceil(SLICES);
    for round in 0..ROUNDS {
        eprintln!("  round {}/{ROUNDS}", round + 1);
        let order: Vec<usize> = (0..n).map(|k| (round + k) % n).collect();
        let mut took = vec![Duration::ZERO; n];
        for s in 0..SLICES {
            for &which in &order {
                let series = &mut series[which];
                took[which] += contenders[which]
                    .sequential(s * slice, slice, &mut series.samples)
                    .await;
            }
        }
        for (which, took) in took.iter().enumerate() {
            series[which]
                .sequential
                .push((slice * SLICES) as f64 / took.as_secs_f64());
        }
        if let Some(window) = window {
            let mut pairs = vec![(0u64, Duration::ZERO); n];
            for _ in 0..SLICES {
                for &which in &order {
                    if matches!(contenders[which], Contender::Ping(_)) {
                        continue;
                    }
                    let (made, took) = contenders[which].concurrent(window / SLICES as u32).await;
                    pairs[which].0 += made;
                    pairs[which].1 += took;
                }
            }
            for (which, (made, took)) in pairs.into_iter().enumerate() {
                if !matches!(contenders[which], Contender::Ping(_)) {
                    series[which].concurrent.push(made as f64 / took.as_secs_f64());
                }
            }
        }
    }
    series
}

/// Warms up connections and script caches: 200 sequential pairs over all keys, and with a
/// window, a short concurrent one.
async fn warm_up(contenders: &[Contender], concurrent: bool) {
    for c in contenders {
        for i in 0..200 {
            c.pair(i).await;
        }
        if concurrent && !matches!(c, Contender::Ping(_)) {
            c.concurrent(Duration::from_millis(200)).await;
        }
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The median over rounds of `a[r] / b[r]`.
fn ratio(a: &[f64], b: &[f64]) -> f64 {
    let ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
    median(&ratios)
}

fn micros(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e7).round() / 10.0
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

// ---------------------------------------------------------------------------------------------
// Counting commands executed, with the test kit's `INFO commandstats` helpers.

/// Commands executed so far on some servers: all of them, and those in [`NAMED`].
#[derive(Debug, Clone, Default)]
struct Executed {
    total: u64,
    named: BTreeMap<&'static str, u64>,
}

impl Executed {
    async fn now(servers: &[&RedisServer]) -> Executed {
        let mut executed = Executed::default();
        for server in servers {
            executed.total += server.commands_executed().await;
            for name in NAMED {
                *executed.named.entry(name).or_default() += server.command_calls(name).await;
            }
        }
        executed
    }

    /// `self - earlier - overhead`, per `units`.
    fn per(&self, earlier: &Executed, overhead: &Executed, units: usize) -> PerPair {
        let minus = |a: u64, b: u64, c: u64| a as f64 - b as f64 - c as f64;
        let named = NAMED
            .iter()
            .map(|&name| {
                let get = |e: &Executed| e.named.get(name).copied().unwrap_or(0);
                (name, minus(get(self), get(earlier), get(overhead)) / units as f64)
            })
            .filter(|(_, n)| *n != 0.0)
            .collect();
        PerPair {
            total: minus(self.total, earlier.total, overhead.total) / units as f64,
            named,
        }
    }
}

/// Commands executed per pair.
#[derive(Debug, Clone)]
struct PerPair {
    total: f64,
    named: Vec<(&'static str, f64)>,
}

impl PerPair {
    fn named(&self, name: &str) -> f64 {
        self.named
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0.0, |(_, v)| *v)
    }

    fn breakdown(&self) -> String {
        let parts: Vec<String> = self
            .named
            .iter()
            .map(|(name, n)| format!("{} {n:.3}", name.to_uppercase()))
            .collect();
        format!("{:.3} ({})", self.total, parts.join(", "))
    }

    fn json(&self) -> Value {
        let named: serde_json::Map<String, Value> = self
            .named
            .iter()
            .map(|(name, n)| ((*name).to_owned(), json!(n)))
            .collect();
        json!({ "total": self.total, "by_command": named })
    }
}

/// What taking a snapshot itself adds between two snapshots (the helpers' own connections).
async fn snapshot_overhead(servers: &[&RedisServer]) -> Executed {
    let a = Executed::now(servers).await;
    let b = Executed::now(servers).await;
    let mut overhead = Executed {
        total: b.total - a.total,
        named: BTreeMap::new(),
    };
    for name in NAMED {
        let get = |e: &Executed| e.named.get(name).copied().unwrap_or(0);
        overhead.named.insert(name, get(&b) - get(&a));
    }
    overhead
}

/// Commands executed on `servers` per sequential pair of `contender`, over `n` pairs.
async fn count(contender: &Contender, servers: &[&RedisServer], overhead: &Executed, n: usize) -> PerPair {
    let before = Executed::now(servers).await;
    for i in 0..n {
        contender.pair(i).await;
    }
    Executed::now(servers).await.per(&before, overhead, n)
}

// ---------------------------------------------------------------------------------------------
// Output.

/// A table: a title, column headings, rows of a label and one cell per column.
struct Table {
    title: String,
    columns: Vec<String>,
    rows: Vec<(String, Vec<String>)>,
}

impl Table {
    fn new(title: String, columns: &[&str]) -> Table {
        Table {
            title,
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, label: &str, cells: Vec<String>) {
        self.rows.push((label.to_owned(), cells));
    }

    fn print(&self) {
        let label_width = self
            .rows
            .iter()
            .map(|(l, _)| l.chars().count())
            .max()
            .unwrap_or(0)
            + 2;
        let width = |c: usize| {
            self.rows
                .iter()
                .filter_map(|(_, cells)| cells.get(c))
                .chain(self.columns.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
                + 3
        };
        let widths: Vec<usize> = (0..self.columns.len()).map(width).collect();
        println!();
        println!("{}", self.title);
        print!("  {:label_width$}", "");
        for (c, w) in self.columns.iter().zip(&widths) {
            print!("{c:>w$}");
        }
        println!();
        for (label, cells) in &self.rows {
            print!("  {label:label_width$}");
            for (cell, w) in cells.iter().zip(&widths) {
                print!("{cell:>w$}");
            }
            println!();
        }
    }
}

/// The rows parts 2 and 3 share: latency and pairs/s of PING, ours and ours with
/// `wait_for_replicas`, and what the wait adds.
fn wait_table(title: String, [ping, plain, waiting]: [&Series; 3]) -> Table {
    let mut table = Table::new(title, &["PING", "ours", "ours + wait", "wait - plain"]);
    let lat = |q: f64| {
        vec![
            us(ping.at(q)),
            us(plain.at(q)),
            us(waiting.at(q)),
            format!(
                "{:+.1} µs",
                (waiting.at(q).as_secs_f64() - plain.at(q).as_secs_f64()) * 1e6
            ),
        ]
    };
    table.row("latency median", lat(0.5));
    table.row("latency p99", lat(0.99));
    table.row(
        "pairs/s (median of rounds)",
        vec![
            format!("{:.0}", median(&ping.sequential)),
            format!("{:.0}", median(&plain.sequential)),
            format!("{:.0}", median(&waiting.sequential)),
            format!("x{:.3}", ratio(&waiting.sequential, &plain.sequential)),
        ],
    );
    table
}

/// The rows of a plain-against-waiting table about counts: commands executed per pair, the
/// `WAIT`s and the replica's `REPLCONF ACK`s among them, and the requests the client sent (its
/// top-level commands: `SET`, `EVALSHA`, `EVAL` if a script was unknown, `WAIT`).
fn count_rows(table: &mut Table, on: &str, plain: &PerPair, waiting: &PerPair) {
    let requests = |c: &PerPair| {
        ["set", "evalsha", "eval", "wait"]
            .iter()
            .map(|n| c.named(n))
            .sum::<f64>()
    };
    let rows = [
        (
            format!("commands executed per pair{on}"),
            plain.total,
            waiting.total,
        ),
        (
            "  of which WAIT".to_owned(),
            plain.named("wait"),
            waiting.named("wait"),
        ),
        (
            "  of which REPLCONF ACK (the replica's)".to_owned(),
            plain.named("replconf"),
            waiting.named("replconf"),
        ),
        (
            "requests sent per pair".to_owned(),
            requests(plain),
            requests(waiting),
        ),
    ];
    for (label, plain, waiting) in rows {
        table.row(
            &label,
            vec![
                String::new(),
                format!("{plain:.2}"),
                format!("{waiting:.2}"),
                format!("{:+.2}", waiting - plain),
            ],
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The deployments.

async fn cluster_client(urls: &[String], replicas: bool) -> LockClient {
    let mut builder = LockClient::builder().cluster(urls);
    if replicas {
        builder = builder.wait_for_replicas(1, REPLICA_TIMEOUT);
    }
    builder
        .build()
        .await
        .unwrap_or_else(|e| panic!("ours: cannot connect to the cluster {urls:?}: {e}"))
}

/// The primaries of `cluster`, as servers.
fn primaries(cluster: &RedisCluster) -> Vec<&RedisServer> {
    cluster.primaries().into_iter().map(|i| cluster.node(i)).collect()
}

/// How many of the keys each primary serves, in primary order (e.g. `3/5/8`).
fn keys_per_primary(cluster: &RedisCluster) -> Vec<usize> {
    let primaries = cluster.primaries();
    let mut counts = vec![0; primaries.len()];
    for key in REDIS_KEYS.iter() {
        let owner = cluster.primary_of_key(key);
        let at = primaries
            .iter()
            .position(|&p| p == owner)
            .unwrap_or_else(|| panic!("{key} is served by node {owner}, not a primary"));
        counts[at] += 1;
    }
    counts
}

fn slash(counts: &[usize]) -> String {
    counts
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("/")
}

/// Part 1: ours against the hand-written minimum on a 3-primary cluster.
async fn cluster_vs_hand(config: &Config) -> Value {
    eprintln!("1. spawning a Redis Cluster of 3 primaries");
    let cluster = RedisCluster::spawn(3, 0);
    let urls = cluster.urls();
    let spread = keys_per_primary(&cluster);
    let hand = redis::cluster::ClusterClient::new(urls.clone())
        .unwrap_or_else(|e| panic!("hand-written: bad cluster URLs {urls:?}: {e}"))
        .get_async_connection()
        .await
        .unwrap_or_else(|e| panic!("hand-written: cannot connect to the cluster {urls:?}: {e}"));
    let contenders = [
        Contender::Ping(cluster.node(0).raw().await),
        Contender::Hand(hand),
        Contender::Ours("ours", cluster_client(&urls, false).await),
    ];
    eprintln!("1. warming up");
    warm_up(&contenders, true).await;
    eprintln!("1. timed rounds");
    let series = interleaved(&contenders, config, Some(config.window)).await;
    let (ping, hand, ours) = (&series[0], &series[1], &series[2]);

    eprintln!("1. counting commands");
    let servers = primaries(&cluster);
    let overhead = snapshot_overhead(&servers).await;
    let hand_count = count(&contenders[1], &servers, &overhead, config.counted_pairs).await;
    let ours_count = count(&contenders[2], &servers, &overhead, config.counted_pairs).await;

    let mut table = Table::new(
        format!(
            "1. Redis Cluster, 3 primaries, no replicas: {KEYS} keys round robin (keys per primary \
             {}); {ROUNDS} interleaved rounds of {} sequential pairs and a {:?} window of {KEYS} \
             tasks",
            slash(&spread),
            config.per_round,
            config.window
        ),
        &["hand-written", "ours", "ours / hand"],
    );
    let lat = |q: f64| {
        vec![
            us(hand.at(q)),
            us(ours.at(q)),
            format!("{:.2}", ours.at(q).as_secs_f64() / hand.at(q).as_secs_f64()),
        ]
    };
    table.row("1 task: latency median", lat(0.5));
    table.row("1 task: latency p99", lat(0.99));
    table.row(
        "1 task: pairs/s (median of rounds)",
        vec![
            format!("{:.0}", median(&hand.sequential)),
            format!("{:.0}", median(&ours.sequential)),
            format!("{:.3}", ratio(&ours.sequential, &hand.sequential)),
        ],
    );
    table.row(
        "16 tasks: pairs/s (median of rounds)",
        vec![
            format!("{:.0}", median(&hand.concurrent)),
            format!("{:.0}", median(&ours.concurrent)),
            format!("{:.3}", ratio(&ours.concurrent, &hand.concurrent)),
        ],
    );
    table.row(
        "commands executed per pair",
        vec![
            format!("{:.2}", hand_count.total),
            format!("{:.2}", ours_count.total),
            String::new(),
        ],
    );
    table.print();
    println!(
        "  PING to node 0: median {}, p99 {}; throughput ratios are medians of per-round ratios",
        us(ping.at(0.5)),
        us(ping.at(0.99))
    );
    println!("  executed per pair, hand-written: {}", hand_count.breakdown());
    println!("  executed per pair, ours:         {}", ours_count.breakdown());

    json!({
        "keys_per_primary": spread,
        "ping": ping.json(),
        "hand_written": hand.json(),
        "ours": ours.json(),
        "ratio_ours_to_hand_sequential_pairs_per_s": ratio(&ours.sequential, &hand.sequential),
        "ratio_ours_to_hand_concurrent_pairs_per_s": ratio(&ours.concurrent, &hand.concurrent),
        "executed_per_pair": { "hand_written": hand_count.json(), "ours": ours_count.json() },
    })
}

/// Waits (30 s at most) until the primary reports one replica, online.
async fn wait_for_replica(primary: &RedisServer) {
    let mut raw = primary.raw().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut raw)
            .await
            .unwrap_or_else(|e| panic!("INFO replication on the primary failed: {e}"));
        if info.contains("connected_slaves:1") && info.contains("state=online") {
            return;
        }
        if Instant::now() > deadline {
            panic!("the replica is not online after 30 s; INFO replication:\n{info}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a TCP proxy on loopback to `127.0.0.1:<upstream>` that forwards every chunk it reads,
/// either way, `delay` after it read it (in order), with TCP_NODELAY on both of its sockets so
/// that it adds no Nagle wait of its own (Redis sets TCP_NODELAY on its client sockets, so a
/// reply it sends in two segments, as a pipelined `WAIT`'s is, reaches a direct client at once;
/// through a proxy writing without it, the second segment would wait for the client's delayed
/// ACK). Returns its `redis://` URL. It runs until the process ends; a connection closes when
/// either side closes.
async fn delaying_proxy(upstream: u16, delay: Duration) -> String {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap_or_else(|e| panic!("proxy: cannot bind 127.0.0.1:0: {e}"));
    let port = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("proxy: no local address: {e}"))
        .port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let server = TcpStream::connect(("127.0.0.1", upstream))
                    .await
                    .unwrap_or_else(|e| panic!("proxy: cannot connect to 127.0.0.1:{upstream}: {e}"));
                for socket in [&client, &server] {
                    socket
                        .set_nodelay(true)
                        .unwrap_or_else(|e| panic!("proxy: cannot set TCP_NODELAY: {e}"));
                }
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::join!(
                    relay(client_read, server_write, delay),
                    relay(server_read, client_write, delay)
                );
            });
        }
    });
    format!("redis://127.0.0.1:{port}")
}

/// Forwards what `from` reads to `to`, each chunk `delay` after it was read, until `from` ends
/// or either side fails.
async fn relay(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buffer).await {
            if chunks
                .send((Instant::now() + delay, buffer[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
    };
    let write = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

/// Part 2: the cost of `wait_for_replicas(1, 1 s)` on a primary with one replica.
async fn replica_wait(config: &Config) -> Value {
    eprintln!("2. spawning a primary and its replica");
    let primary = RedisServer::spawn();
    let port = primary.port().to_string();
    let _replica = RedisServer::spawn_with_args([
        "--replicaof",
        "127.0.0.1",
        &port,
        "--repl-diskless-sync-delay",
        "0",
    ]);
    wait_for_replica(&primary).await;
    let connect = |url: String, replicas: bool| async move {
        let mut builder = LockClient::builder().url(&url);
        if replicas {
            builder = builder.wait_for_replicas(1, REPLICA_TIMEOUT);
        }
        builder
            .build()
            .await
            .unwrap_or_else(|e| panic!("ours: cannot connect to {url}: {e}"))
    };
    let contenders = [
        Contender::Ping(primary.raw().await),
        Contender::Ours("ours", connect(primary.url(), false).await),
        Contender::Ours("ours + wait_for_replicas", connect(primary.url(), true).await),
    ];
    eprintln!("2. warming up");
    warm_up(&contenders, false).await;
    eprintln!("2. timed rounds");
    let series = interleaved(&contenders, config, None).await;
    let (ping, plain, waiting) = (&series[0], &series[1], &series[2]);

    eprintln!("2. counting commands");
    let servers = [&primary];
    let overhead = snapshot_overhead(&servers).await;
    let plain_count = count(&contenders[1], &servers, &overhead, config.counted_pairs).await;
    let waiting_count = count(&contenders[2], &servers, &overhead, config.counted_pairs).await;

    eprintln!("2. round trips through the delaying proxy");
    let proxy = delaying_proxy(primary.port(), PROXY_DELAY).await;
    let proxied = [
        Contender::Ping(
            redis::Client::open(proxy.as_str())
                .unwrap_or_else(|e| panic!("bad proxy URL {proxy}: {e}"))
                .get_multiplexed_async_connection()
                .await
                .unwrap_or_else(|e| panic!("cannot connect through the proxy: {e}")),
        ),
        Contender::Ours("ours via proxy", connect(proxy.clone(), false).await),
        Contender::Ours(
            "ours + wait_for_replicas via proxy",
            connect(proxy.clone(), true).await,
        ),
    ];
    // Connections open, scripts known: the samples are pairs and nothing else.
    for c in &proxied {
        c.pair(0).await;
    }
    let mut delayed: Vec<Vec<Duration>> = vec![Vec::new(); proxied.len()];
    for i in 0..config.proxied {
        for (k, c) in proxied.iter().enumerate() {
            let t = Instant::now();
            c.pair(i).await;
            delayed[k].push(t.elapsed());
        }
    }
    let delayed_median = |k: usize| {
        let mut sorted = delayed[k].clone();
        sorted.sort_unstable();
        sorted[sorted.len() / 2]
    };
    let proxied_ping = delayed_median(0);
    let round_trips = |k: usize| delayed_median(k).as_secs_f64() / proxied_ping.as_secs_f64();

    let mut table = wait_table(
        format!(
            "2. One primary + 1 replica (online), wait_for_replicas(1, {REPLICA_TIMEOUT:?}); {ROUNDS} \
             interleaved rounds of {} sequential pairs",
            config.per_round
        ),
        [ping, plain, waiting],
    );
    count_rows(&mut table, "", &plain_count, &waiting_count);
    table.row(
        &format!("via proxy (+{PROXY_DELAY:?} each way): median"),
        vec![
            format!("{:.2?}", delayed_median(0)),
            format!("{:.2?}", delayed_median(1)),
            format!("{:.2?}", delayed_median(2)),
            String::new(),
        ],
    );
    table.row(
        "  round trips per pair (÷ PING)",
        vec![
            "1.00".to_owned(),
            format!("{:.2}", round_trips(1)),
            format!("{:.2}", round_trips(2)),
            format!("{:+.2}", round_trips(2) - round_trips(1)),
        ],
    );
    table.print();
    println!(
        "  requests = the top-level SET + EVALSHA + EVAL + WAIT executed; round trips = median \
         pair ÷ median PING through a proxy adding {PROXY_DELAY:?} each way ({} samples each)",
        config.proxied
    );
    println!("  executed per pair over {} pairs:", config.counted_pairs);
    println!("    ours:        {}", plain_count.breakdown());
    println!("    ours + wait: {}", waiting_count.breakdown());

    json!({
        "ping": ping.json(),
        "ours": plain.json(),
        "ours_wait_for_replicas": waiting.json(),
        "ratio_wait_to_plain_pairs_per_s": ratio(&waiting.sequential, &plain.sequential),
        "executed_per_pair": { "ours": plain_count.json(), "ours_wait_for_replicas": waiting_count.json() },
        "proxy": {
            "delay_each_way_ms": PROXY_DELAY.as_millis() as u64,
            "samples": config.proxied,
            "median_ms": {
                "ping": delayed_median(0).as_secs_f64() * 1e3,
                "ours": delayed_median(1).as_secs_f64() * 1e3,
                "ours_wait_for_replicas": delayed_median(2).as_secs_f64() * 1e3,
            },
            "round_trips_per_pair": { "ours": round_trips(1), "ours_wait_for_replicas": round_trips(2) },
        },
    })
}

/// Part 3: `wait_for_replicas(1, 1 s)` on a cluster of 3 primaries with a replica each.
async fn cluster_replica_wait(config: &Config) -> Value {
    eprintln!("3. spawning a Redis Cluster of 3 primaries with a replica each");
    let cluster = RedisCluster::spawn(3, 1);
    let urls = cluster.urls();
    let contenders = [
        Contender::Ping(cluster.node(0).raw().await),
        Contender::Ours("ours", cluster_client(&urls, false).await),
        Contender::Ours("ours + wait_for_replicas", cluster_client(&urls, true).await),
    ];
    eprintln!("3. warming up");
    warm_up(&contenders, false).await;
    eprintln!("3. timed rounds");
    let series = interleaved(&contenders, config, None).await;
    let (ping, plain, waiting) = (&series[0], &series[1], &series[2]);

    eprintln!("3. counting commands");
    let servers = primaries(&cluster);
    let overhead = snapshot_overhead(&servers).await;
    let plain_count = count(&contenders[1], &servers, &overhead, config.counted_pairs).await;
    let waiting_count = count(&contenders[2], &servers, &overhead, config.counted_pairs).await;

    let mut table = wait_table(
        format!(
            "3. Redis Cluster, 3 primaries + 1 replica each, wait_for_replicas(1, \
             {REPLICA_TIMEOUT:?}); {ROUNDS} interleaved rounds of {} sequential pairs",
            config.per_round
        ),
        [ping, plain, waiting],
    );
    count_rows(&mut table, " (primaries)", &plain_count, &waiting_count);
    table.print();
    println!("  executed per pair over {} pairs:", config.counted_pairs);
    println!("    ours:        {}", plain_count.breakdown());
    println!("    ours + wait: {}", waiting_count.breakdown());

    json!({
        "ping": ping.json(),
        "ours": plain.json(),
        "ours_wait_for_replicas": waiting.json(),
        "ratio_wait_to_plain_pairs_per_s": ratio(&waiting.sequential, &plain.sequential),
        "executed_per_pair": { "ours": plain_count.json(), "ours_wait_for_replicas": waiting_count.json() },
    })
}

/// Commands executed on each of `servers`, separately, per sequential pair of `contender`, over
/// `n` pairs (`overheads` one per server, from [`snapshot_overhead`] on that server alone).
async fn count_each(
    contender: &Contender,
    servers: &[&RedisServer],
    overheads: &[Executed],
    n: usize,
) -> Vec<PerPair> {
    let mut before = Vec::with_capacity(servers.len());
    for server in servers {
        before.push(Executed::now(&[server]).await);
    }
    for i in 0..n {
        contender.pair(i).await;
    }
    let mut per = Vec::with_capacity(servers.len());
    for ((server, before), overhead) in servers.iter().zip(&before).zip(overheads) {
        per.push(Executed::now(&[server]).await.per(before, overhead, n));
    }
    per
}

/// The requests a client sent per pair: its top-level `SET`, `EVALSHA` and `EVAL`.
fn requests(c: &PerPair) -> f64 {
    ["set", "evalsha", "eval"].iter().map(|n| c.named(n)).sum()
}

/// Part 4: RedLock over `MASTERS` independent masters against one master alone (master 0).
async fn redlock_vs_one(config: &Config) -> Value {
    eprintln!("4. spawning {MASTERS} independent masters");
    let masters: Vec<RedisServer> = (0..MASTERS).map(|_| RedisServer::spawn()).collect();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    // Keys of its own on master 0: a RedLock release answers once a majority released, and
    // master 0 may drop the RedLock key a moment later.
    let one = LockClient::builder()
        .url(&urls[0])
        .prefix("one:lock:")
        .build()
        .await
        .unwrap_or_else(|e| panic!("one master: cannot connect to {}: {e}", urls[0]));
    let redlock = LockClient::builder()
        .redlock(&urls)
        .build()
        .await
        .unwrap_or_else(|e| panic!("RedLock: cannot connect to {urls:?}: {e}"));
    let contenders = [
        Contender::Ping(masters[0].raw().await),
        Contender::Ours("one master", one),
        Contender::Ours("RedLock", redlock),
    ];
    eprintln!("4. warming up");
    warm_up(&contenders, true).await;
    eprintln!("4. timed rounds");
    let series = interleaved(&contenders, config, Some(config.window)).await;
    let (ping, one, red) = (&series[0], &series[1], &series[2]);

    eprintln!("4. counting commands");
    let servers: Vec<&RedisServer> = masters.iter().collect();
    let mut overheads = Vec::with_capacity(servers.len());
    for server in &servers {
        overheads.push(snapshot_overhead(&[server]).await);
    }
    let one_count = count_each(
        &contenders[1],
        &servers[..1],
        &overheads[..1],
        config.counted_pairs,
    )
    .await
    .remove(0);
    let red_counts = count_each(&contenders[2], &servers, &overheads, config.counted_pairs).await;
    let mean = |f: &dyn Fn(&PerPair) -> f64| red_counts.iter().map(f).sum::<f64>() / MASTERS as f64;
    let red_executed = mean(&|c| c.total);
    let red_requests = mean(&requests);
    let red_executed_all: f64 = red_counts.iter().map(|c| c.total).sum();
    let red_requests_all: f64 = red_counts.iter().map(requests).sum();
    let spread = |f: &dyn Fn(&PerPair) -> f64| {
        red_counts
            .iter()
            .map(|c| format!("{:.2}", f(c)))
            .collect::<Vec<_>>()
            .join("/")
    };

    let latency_ratio = |q: f64| red.at(q).as_secs_f64() / one.at(q).as_secs_f64();
    let median_ratio = latency_ratio(0.5);
    let goal_met = median_ratio <= GOAL_LATENCY_RATIO;
    let mut table = Table::new(
        format!(
            "4. RedLock over {MASTERS} independent masters (quorum {}) against one master alone \
             (master 0); {ROUNDS} interleaved rounds of {} sequential pairs and a {:?} window of \
             {KEYS} tasks",
            MASTERS / 2 + 1,
            config.per_round,
            config.window
        ),
        &["PING (m0)", "one master", "RedLock", "RedLock / one"],
    );
    let lat = |q: f64| {
        vec![
            us(ping.at(q)),
            us(one.at(q)),
            us(red.at(q)),
            format!("{:.2}", latency_ratio(q)),
        ]
    };
    table.row("1 task: latency median", lat(0.5));
    table.row("1 task: latency p99", lat(0.99));
    table.row(
        "1 task: pairs/s (median of rounds)",
        vec![
            format!("{:.0}", median(&ping.sequential)),
            format!("{:.0}", median(&one.sequential)),
            format!("{:.0}", median(&red.sequential)),
            format!("{:.3}", ratio(&red.sequential, &one.sequential)),
        ],
    );
    table.row(
        "16 tasks: pairs/s (median of rounds)",
        vec![
            String::new(),
            format!("{:.0}", median(&one.concurrent)),
            format!("{:.0}", median(&red.concurrent)),
            format!("{:.3}", ratio(&red.concurrent, &one.concurrent)),
        ],
    );
    table.row(
        "requests sent per pair, per master",
        vec![
            String::new(),
            format!("{:.2}", requests(&one_count)),
            format!("{red_requests:.2}"),
            String::new(),
        ],
    );
    table.row(
        "commands executed per pair, per master",
        vec![
            String::new(),
            format!("{:.2}", one_count.total),
            format!("{red_executed:.2}"),
            String::new(),
        ],
    );
    table.row(
        "commands executed per pair, all masters",
        vec![
            String::new(),
            format!("{:.2}", one_count.total),
            format!("{red_executed_all:.2}"),
            format!("{:.2}", red_executed_all / one_count.total),
        ],
    );
    table.print();
    println!(
        "  goal: RedLock median latency <= {GOAL_LATENCY_RATIO:.1}x one master's: {median_ratio:.2}x, {}",
        if goal_met { "met" } else { "NOT met" }
    );
    println!(
        "  per master: RedLock's mean over the {MASTERS} masters; requests = the top-level SET + \
         EVALSHA + EVAL executed; over {} pairs",
        config.counted_pairs
    );
    println!(
        "  RedLock per master m0/…/m{}: requests {}, executed {}",
        MASTERS - 1,
        spread(&requests),
        spread(&|c| c.total)
    );
    println!("  executed per pair, one master (m0): {}", one_count.breakdown());
    for (m, c) in red_counts.iter().enumerate() {
        println!("  executed per pair, RedLock on m{m}:    {}", c.breakdown());
    }

    json!({
        "masters": MASTERS,
        "quorum": MASTERS / 2 + 1,
        "ping": ping.json(),
        "one_master": one.json(),
        "redlock": red.json(),
        "ratio_redlock_to_one_median_latency": median_ratio,
        "ratio_redlock_to_one_p99_latency": latency_ratio(0.99),
        "ratio_redlock_to_one_sequential_pairs_per_s": ratio(&red.sequential, &one.sequential),
        "ratio_redlock_to_one_concurrent_pairs_per_s": ratio(&red.concurrent, &one.concurrent),
        "goal_median_latency_ratio_max": GOAL_LATENCY_RATIO,
        "goal_met": goal_met,
        "requests_per_pair_per_master": {
            "one_master": requests(&one_count),
            "redlock": red_counts.iter().map(requests).collect::<Vec<_>>(),
            "redlock_all_masters": red_requests_all,
        },
        "executed_per_pair": {
            "one_master": one_count.json(),
            "redlock_per_master": red_counts.iter().map(PerPair::json).collect::<Vec<_>>(),
            "redlock_all_masters": red_executed_all,
        },
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let config = Config::from_env();
    let started = Instant::now();
    eprintln!(
        "BENCH_SCALE={}: {ROUNDS} rounds of {} sequential pairs, {:?} windows, {} counted pairs",
        config.scale, config.per_round, config.window, config.counted_pairs
    );
    let version = {
        let server = RedisServer::spawn();
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut server.raw().await)
            .await
            .unwrap_or_else(|e| panic!("INFO server failed: {e}"));
        info.lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("no redis_version in INFO server"))
    };
    println!(
        "redis {version} on loopback, {} CPUs, BENCH_SCALE={}; latencies over the samples of all \
         rounds, rates medians of rounds",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        config.scale
    );
    let cluster = cluster_vs_hand(&config).await;
    let replica = replica_wait(&config).await;
    let cluster_replica = cluster_replica_wait(&config).await;
    let redlock = redlock_vs_one(&config).await;
    let output = json!({
        "redis_version": version,
        "bench_scale": config.scale,
        "rounds": ROUNDS,
        "sequential_pairs_per_round": config.per_round,
        "concurrent_tasks": KEYS,
        "concurrent_window_ms": config.window.as_millis() as u64,
        "counted_pairs": config.counted_pairs,
        "cluster_vs_hand_written": cluster,
        "replica_wait": replica,
        "cluster_replica_wait": cluster_replica,
        "redlock_vs_one_master": redlock,
        "elapsed_s": started.elapsed().as_secs_f64(),
    });
    println!();
    println!(
        "{}",
        serde_json::to_string(&output).unwrap_or_else(|e| panic!("cannot write JSON: {e}"))
    );
}
