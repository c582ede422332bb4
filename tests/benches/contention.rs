//! Contention benchmark: `lock-runtime` against the hand-written minimum, `rslock` and
//! `async-redis-lock`, all on one `redis-server` spawned by the test kit, in one process (but
//! scenario 7, whose waiters are spread over 4 child processes).
//!
//! ```text
//! cargo bench -p lock-tests --bench contention                    # about 3 minutes
//! BENCH_SCALE=3 cargo bench -p lock-tests --bench contention      # 3x the rounds, + 10,000 locks for 30 s
//! BENCH_SCALE=0.2 cargo bench -p lock-tests --bench contention    # smoke run: 1 round, short windows
//! BENCH_NODELAY=1 cargo bench -p lock-tests --bench contention    # TCP_NODELAY for all four
//! BENCH_PIN=0 cargo bench -p lock-tests --bench contention        # scenarios 1 and 2 not pinned
//! ```
//!
//! The contenders, each with one client (one connection, plus ours' subscriber connection)
//! shared by every task of a scenario, as within one service; every lock has a 10 s ttl. All
//! four connect with redis-rs's default socket settings (no TCP_NODELAY), as `Client::open(url)`,
//! `LockManager::new`, `Locker::from_redis_url` and `LockClient::builder().url(url)` do (ours
//! adds only TCP keepalive). `BENCH_NODELAY=1` turns TCP_NODELAY on for all four: for ours
//! through `LockClient::builder().redis_client(client)`, with a `redis::Client` made like the
//! others' (so without that keepalive, which does nothing within these windows), in scenario 7's
//! child processes too. Under many concurrent requests, leaving Nagle on batches writes, which
//! matters in scenario 2.
//! - **hand-written**: `SET key token NX PX ttl`, released by an `EVALSHA` compare-and-delete
//!   script; a waiter sends the `SET` again every 1 ms until it succeeds (10 s at most).
//! - **rslock** (`LockManager::acquire`): loops over `lock`, which tries 3 times with a random
//!   0–200 ms pause between tries (its defaults, kept), then starts over at once; a refused try
//!   also sends its unlock script. There is no bound on the wait.
//! - **async-redis-lock** (`Locker::acquire_with_options`): tries every 100 ms (its default);
//!   its acquire timeout is raised from the default 1 s to 10 s, the wait everyone else gets.
//!   Every lock it hands out has its extension task (extend every ttl/3 here).
//! - **ours** (`LockClient::acquire`, `wait(10 s)`): a refused waiter is woken by the release
//!   (pub/sub) or at the holder's expiry.
//!
//! Scenarios 1–4 are timed in interleaved rounds (round r runs scenario 1 for every library, then
//! scenario 2 for every library, …, the library order rotating by one each round; scenarios 1
//! and 2 are further cut into 4 slices of 250 ms per library, taking turns, as on a shared machine
//! their speed swings within seconds), and every number is the median over rounds unless it says
//! otherwise:
//! 1. one task, acquire + release in a loop on one key: pairs/s, the median of the per-round
//!    ratios to the hand-written minimum, and this process's CPU time and context switches per
//!    pair (all threads, from `/proc/self/task/*/{schedstat,status}`). For this scenario and the
//!    next only, this process is pinned to one CPU and the server to another (`taskset`, when there are two
//!    CPUs; `BENCH_PIN=0` to not): left to the scheduler of a 2-vCPU VM, whether the two share a
//!    vCPU or wake each other across two changes pairs/s several-fold from slice to slice (see
//!    `Pinning`);
//! 2. 64 tasks, each on its own key: the same, in total;
//! 3. 8 tasks on ONE key, each looping acquire (wait), hold 1 ms, release: hand-offs/s (lock
//!    acquisitions per second); each acquisition's wait (from calling acquire to holding) as
//!    p50/p99/max, where a wait still going on at the end of the window counts with its length so
//!    far (so no max exceeds the window); Jain's fairness index over the tasks' acquisition counts
//!    (1 = even); how many tasks never got the lock in the window; the share of acquisitions that
//!    went back to the task that had just released; requests sent and commands Redis executed per
//!    hand-off (see below);
//! 4. the same with 64 tasks on one key;
//! 5. requests sent and commands executed per uncontended acquire + release pair;
//! 6. watchdog (ours, and async-redis-lock, whose extension task is its auto-renewal; rslock only
//!    renews inside `using`, not measured): 1,000 locks with a 3 s ttl held for 10 s (renewed
//!    every 1 s by both): locks renewed per renewal command (Δ `PEXPIRE` calls ÷ Δ `EVALSHA` calls
//!    in the window), client CPU per lock renewal (utime + stime of this process from
//!    `/proc/self/stat` over the window, in clock ticks, so a few ticks at 1,000 locks; and the
//!    same from per-thread schedstat, in ns), client memory per held lock (VmRSS delta from
//!    `/proc/self/status` around acquiring them, guards kept in a `Vec` of the library's own
//!    guard type; measured in a separate pass at the start: async-redis-lock's locks, then
//!    ours, then the same for the next size, all held until the pass ends, so no measurement
//!    reuses memory another freed), and locks lost (`is_lost()`) at the end of the window. With
//!    `BENCH_SCALE` > 1, also 10,000 locks for 30 s. The windows run after the memory pass, one
//!    library at a time.
//! 7. fair mode across processes (ours only: the others have no fair mode): the bench re-runs
//!    its own executable as 4 child processes (worker mode, chosen by an environment variable
//!    that `main` checks before anything else), each with its own `LockClient` on the same
//!    server and 8 tasks looping `acquire` with `LockOptions::new(10 s).fair(true).wait(10 s)`,
//!    hold 1 ms, release, for one window (1.5 s, times `BENCH_SCALE`) started and stopped by the
//!    parent through the children's stdin. Processes share no monotonic clock, so each child
//!    stamps when a wait began, when it got the lock and when it let go in wall-clock
//!    microseconds (`SystemTime`), and prints one line per acquisition at the end. The parent
//!    reports hand-offs/s, waits p50/p99/max, Jain's index over the 32 tasks, tasks that never
//!    got the lock, re-taken by the releaser, and whether the order of acquisition is the order
//!    of arrival: the share of acquisitions that no waiter beginning to wait more than 2 ms
//!    later (a margin for the stamps' skew between processes) got ahead of, the number that one
//!    did, the waits cut off by the end of the window that one did, and the largest such gap
//!    between arrivals. Overlaps are checked from the stamps (a hold that begins before the
//!    previous one let go). Requests and commands per hand-off come from a second, untimed
//!    window whose children connect through the counting proxy (below; it is a TCP port, so
//!    child processes can use it). A fair release hands the lock to the head of the line, which
//!    holds it without asking; a fair waiter asks once when first refused with others ahead of
//!    it (twice, once more right after subscribing, when first in line) and again at least every
//!    300 ms to keep its place, so a hand-off costs about 2 requests (the release, and the
//!    releaser's refused ask as it queues again), plus a re-ask for each 300 ms someone waits.
//!
//! Counting: Redis' `INFO commandstats` counts every command, those run inside scripts too (and
//! `total_commands_processed` counts them as well: the run checks and prints it), so "commands
//! executed" is the sum of `cmdstat_*` calls (less this program's own `INFO`s). "Requests sent"
//! counts only top-level commands (a script call is one); they are counted by a loopback proxy
//! that parses the RESP requests passing through it. Counting happens in one dedicated,
//! untimed round per library (for scenario 7, one untimed window), on clients connected through
//! that proxy (so their hand-offs are a little slower than in the timed rounds).
//!
//! Output: a table (rows = metrics, columns = the libraries), per-command breakdowns of the
//! counts, then one JSON object with the same numbers. Progress goes to stderr.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{LockClient, LockOptions};
use lock_tests::process::{clock_tick, cpu_time};
use lock_tests::{affinity, RedisServer};
use redis::aio::MultiplexedConnection;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

const NAMES: [&str; 4] = ["hand-written", "rslock", "async-redis-lock", "ours"];
const JSON_NAMES: [&str; 4] = ["hand_written", "rslock", "async_redis_lock", "ours"];
const KEY_PREFIXES: [&str; 4] = ["hand", "rslock", "arl", "ours"];
const HAND: usize = 0;
const RSLOCK: usize = 1;
const ARL: usize = 2;
const OURS: usize = 3;

/// The ttl of every lock in scenarios 1–5.
const TTL: Duration = Duration::from_secs(10);
/// How long a waiter may wait (rslock's `acquire` has no bound).
const WAIT: Duration = Duration::from_secs(10);
/// How long a task holds the lock in the contention scenarios.
const HOLD: Duration = Duration::from_millis(1);
/// The hand-written waiter's poll interval.
const POLL: Duration = Duration::from_millis(1);
/// The watchdog scenario's ttl (both libraries renew every ttl/3).
const WATCHDOG_TTL: Duration = Duration::from_secs(3);
/// A pause between runs, for background releases and unsubscriptions of the last one to land.
const SETTLE: Duration = Duration::from_millis(50);

// ---------------------------------------------------------------------------------------------
// The four contenders behind one interface.

/// A `redis::Client` for the hand-written lock, rslock and async-redis-lock: redis-rs's defaults
/// (what `Client::open(url)`, `LockManager::new` and `Locker::from_redis_url` make), or with
/// TCP_NODELAY (`BENCH_NODELAY=1`; then ours gets one too, see [`ours_client`]).
fn redis_client(url: &str, nodelay: bool) -> redis::Client {
    let mut info = redis::IntoConnectionInfo::into_connection_info(url)
        .unwrap_or_else(|e| panic!("bad Redis URL {url}: {e}"));
    if nodelay {
        info = info.set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    }
    redis::Client::open(info).unwrap_or_else(|e| panic!("bad Redis URL {url}: {e}"))
}

/// Ours: by URL, as a service would (redis-rs's default socket settings, which the library
/// keeps, plus its TCP keepalive); with `nodelay`, through the builder's `redis_client` with a
/// [`redis_client`] that has TCP_NODELAY on (and no keepalive: its first probe would come after
/// 15 s idle, never within these windows).
async fn ours_client(url: &str, nodelay: bool) -> Result<LockClient, lock_runtime::LockError> {
    let builder = if nodelay {
        LockClient::builder().redis_client(redis_client(url, true))
    } else {
        LockClient::builder().url(url)
    };
    builder.build().await
}

/// `BENCH_NODELAY` set, and neither empty nor `0`.
fn nodelay_from_env() -> bool {
    std::env::var("BENCH_NODELAY").is_ok_and(|v| !v.is_empty() && v != "0")
}

// Boxing the large variants would add an allocation per acquisition to some contenders only.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Lib {
    Hand(MultiplexedConnection),
    Rslock(rslock::LockManager),
    Arl(async_redis_lock::Locker, async_redis_lock::Options),
    Ours(LockClient, LockOptions),
}

#[allow(clippy::large_enum_variant)]
enum Held {
    Hand {
        conn: MultiplexedConnection,
        key: String,
        token: String,
    },
    Rslock(rslock::LockGuard),
    Arl(async_redis_lock::Lock),
    Ours(lock_runtime::LockGuard),
}

impl Lib {
    async fn connect(which: usize, url: &str, nodelay: bool) -> Lib {
        let failed =
            |e: &dyn std::fmt::Display| -> ! { panic!("{}: cannot connect to {url}: {e}", NAMES[which]) };
        match which {
            HAND => Lib::Hand(
                redis_client(url, nodelay)
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap_or_else(|e| failed(&e)),
            ),
            RSLOCK => Lib::Rslock(rslock::LockManager::from_clients(vec![redis_client(
                url, nodelay,
            )])),
            ARL => Lib::Arl(
                async_redis_lock::Locker::from_client(redis_client(url, nodelay))
                    .await
                    .unwrap_or_else(|e| failed(&e)),
                async_redis_lock::Options::new()
                    .ttl(TTL)
                    .extend(TTL / 3)
                    .timeout(Some(WAIT)),
            ),
            _ => Lib::Ours(
                ours_client(url, nodelay).await.unwrap_or_else(|e| failed(&e)),
                LockOptions::new(TTL).wait(WAIT),
            ),
        }
    }

    /// The library's waiting acquire.
    async fn acquire(&self, key: &str) -> Result<Held, String> {
        match self {
            Lib::Hand(conn) => {
                let mut conn = conn.clone();
                let token = lock_tests::hand_written::token();
                let deadline = Instant::now() + WAIT;
                loop {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(TTL.as_millis() as u64)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    if set.is_some() {
                        return Ok(Held::Hand {
                            conn,
                            key: key.to_owned(),
                            token,
                        });
                    }
                    if Instant::now() >= deadline {
                        return Err("timed out".to_owned());
                    }
                    tokio::time::sleep(POLL).await;
                }
            }
            Lib::Rslock(manager) => manager
                .acquire(key, TTL)
                .await
                .map(Held::Rslock)
                .map_err(|e| e.to_string()),
            Lib::Arl(locker, options) => locker
                .acquire_with_options(options, key)
                .await
                .map(Held::Arl)
                .map_err(|e| e.to_string()),
            Lib::Ours(client, options) => client
                .acquire(key, options)
                .await
                .map(Held::Ours)
                .map_err(|e| e.to_string()),
        }
    }
}

impl Held {
    /// `Ok(true)` when it was still ours (rslock does not say: always `true`).
    async fn release(self) -> Result<bool, String> {
        match self {
            Held::Hand { mut conn, key, token } => {
                let deleted: i64 = lock_tests::hand_written::release_script()
                    .key(&key)
                    .arg(&token)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(deleted == 1)
            }
            Held::Rslock(guard) => {
                guard.release().await;
                Ok(true)
            }
            Held::Arl(lock) => match lock.release().await {
                Ok(()) => Ok(true),
                Err(async_redis_lock::Error::IdNotFound) => Ok(false),
                Err(e) => Err(e.to_string()),
            },
            Held::Ours(guard) => guard.release().await.map_err(|e| e.to_string()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Counting: a RESP-parsing proxy for requests, `INFO commandstats` for commands executed.

type Counts = BTreeMap<String, u64>;

#[derive(Default)]
struct RequestCounts(Mutex<Counts>);

impl RequestCounts {
    fn add(&self, command: String) {
        *self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(command)
            .or_default() += 1;
    }

    fn snapshot(&self) -> Counts {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// Where the request that starts `buf` ends, and its command name (lowercase); `None` while it
/// is incomplete. Redis clients send arrays of bulk strings; an inline command is one line.
fn parse_request(buf: &[u8]) -> Option<(usize, String)> {
    let line_end = |from: usize| -> Option<usize> {
        buf.get(from..)?
            .windows(2)
            .position(|w| w == b"\r\n")
            .map(|at| from + at)
    };
    let number = |from: usize, to: usize| -> usize {
        std::str::from_utf8(&buf[from..to])
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "counting proxy: not a RESP request: {:?}",
                    String::from_utf8_lossy(&buf[..to])
                )
            })
    };
    if *buf.first()? != b'*' {
        let end = line_end(0)?;
        let line = String::from_utf8_lossy(&buf[..end]);
        let name = line.split_whitespace().next().unwrap_or("").to_ascii_lowercase();
        return Some((end + 2, name));
    }
    let end = line_end(1)?;
    let parts = number(1, end);
    let mut at = end + 2;
    let mut name = String::new();
    for i in 0..parts {
        if *buf.get(at)? != b'$' {
            panic!(
                "counting proxy: expected a bulk string in {:?}",
                String::from_utf8_lossy(buf)
            );
        }
        let end = line_end(at + 1)?;
        let len = number(at + 1, end);
        let data = end + 2;
        if buf.len() < data + len + 2 {
            return None;
        }
        if i == 0 {
            name = String::from_utf8_lossy(&buf[data..data + len]).to_ascii_lowercase();
        }
        at = data + len + 2;
    }
    Some((at, name))
}

/// Starts the counting proxy on its own thread (its own runtime, so it takes no turns from the
/// benchmark's workers) and returns its `redis://` URL.
fn start_proxy(upstream_port: u16, counts: Arc<RequestCounts>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("counting proxy: cannot bind 127.0.0.1:0: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("counting proxy: no local address: {e}"));
    listener
        .set_nonblocking(true)
        .unwrap_or_else(|e| panic!("counting proxy: cannot make the listener non-blocking: {e}"));
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("counting proxy: no runtime: {e}"));
        runtime.block_on(async move {
            let listener = TcpListener::from_std(listener)
                .unwrap_or_else(|e| panic!("counting proxy: cannot register the listener: {e}"));
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, upstream_port, Arc::clone(&counts)));
            }
        });
    });
    format!("redis://{addr}")
}

async fn relay(client: TcpStream, upstream_port: u16, counts: Arc<RequestCounts>) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending = Vec::new();
    loop {
        let n = match client_rx.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if server_tx.write_all(&buf[..n]).await.is_err() {
            return;
        }
        pending.extend_from_slice(&buf[..n]);
        let mut used = 0;
        while let Some((len, name)) = parse_request(&pending[used..]) {
            used += len;
            counts.add(name);
        }
        pending.drain(..used);
    }
}

async fn commandstats(raw: &mut MultiplexedConnection) -> Counts {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .unwrap_or_else(|e| panic!("INFO commandstats failed: {e}"));
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = fields.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

async fn info_field(raw: &mut MultiplexedConnection, section: &str, field: &str) -> String {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(raw)
        .await
        .unwrap_or_else(|e| panic!("INFO {section} failed: {e}"));
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("INFO {section} has no {field}"))
        .trim()
        .to_owned()
}

/// `after - before` per command, without this program's `INFO`s and without zeros.
fn delta(before: &Counts, after: &Counts) -> Counts {
    after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .map(|(name, n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn total(counts: &Counts) -> u64 {
    counts.values().sum()
}

/// What the server and the proxy have counted so far.
struct Probe {
    requests: Arc<RequestCounts>,
    raw: MultiplexedConnection,
}

struct Snapshot {
    requests: Counts,
    executed: Counts,
}

impl Probe {
    async fn snapshot(&self) -> Snapshot {
        let requests = self.requests.snapshot();
        let executed = commandstats(&mut self.raw.clone()).await;
        Snapshot { requests, executed }
    }
}

/// Requests and commands counted over a run, and what they are divided by.
#[derive(Clone, Default)]
struct Counted {
    units: u64,
    requests: Counts,
    executed: Counts,
}

impl Counted {
    fn between(before: &Snapshot, after: &Snapshot, units: u64) -> Counted {
        Counted {
            units,
            requests: delta(&before.requests, &after.requests),
            executed: delta(&before.executed, &after.executed),
        }
    }

    fn requests_per_unit(&self) -> f64 {
        total(&self.requests) as f64 / self.units.max(1) as f64
    }

    fn executed_per_unit(&self) -> f64 {
        total(&self.executed) as f64 / self.units.max(1) as f64
    }

    fn breakdown(counts: &Counts, units: u64) -> String {
        let mut parts: Vec<(&String, &u64)> = counts.iter().collect();
        parts.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        parts
            .iter()
            .map(|(name, n)| format!("{name} {:.2}", **n as f64 / units.max(1) as f64))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn breakdown_json(counts: &Counts, units: u64) -> Value {
        counts
            .iter()
            .map(|(name, n)| (name.clone(), json!(*n as f64 / units.max(1) as f64)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios 1, 2 and 5: uncontended pairs.

/// Pairs done in some time, and what they cost this process (all threads).
#[derive(Clone, Copy, Default)]
struct Pairs {
    done: u64,
    time: Duration,
    cpu: Duration,
    switches: u64,
    errors: u64,
}

impl Pairs {
    fn add(&mut self, other: Pairs) {
        self.done += other.done;
        self.time += other.time;
        self.cpu += other.cpu;
        self.switches += other.switches;
        self.errors += other.errors;
    }

    fn per_sec(&self) -> f64 {
        self.done as f64 / self.time.as_secs_f64()
    }

    fn cpu_per_pair_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.done.max(1) as f64
    }

    fn switches_per_pair(&self) -> f64 {
        self.switches as f64 / self.done.max(1) as f64
    }
}

/// Scenarios 1 and 2 in one round: `SLICES` slices of `window / SLICES` per library, the
/// libraries taking turns within each slice (so noise that comes and goes within a round hits
/// them alike); each library's slices are added up.
async fn pairs_round(
    libs: &[Lib],
    order: &[usize],
    keys: impl Fn(usize) -> Vec<String>,
    window: Duration,
) -> [Pairs; 4] {
    let mut totals = [Pairs::default(); 4];
    for slice in 0..SLICES {
        for i in 0..order.len() {
            let which = order[(i + slice) % order.len()];
            totals[which].add(pairs(&libs[which], keys(which), window / SLICES as u32).await);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    totals
}

/// One task per key, each acquiring and releasing in a loop for `window`; counts the pairs
/// finished within it.
async fn pairs(lib: &Lib, keys: Vec<String>, window: Duration) -> Pairs {
    let cpu_before = ThreadCpu::now();
    let start = Instant::now();
    let end = start + window;
    let tasks: Vec<_> = keys
        .into_iter()
        .map(|key| {
            let lib = lib.clone();
            tokio::spawn(async move {
                let (mut done, mut errors) = (0u64, 0u64);
                while Instant::now() < end {
                    match lib.acquire(&key).await {
                        Ok(held) => {
                            if held.release().await != Ok(true) {
                                errors += 1;
                            }
                            if Instant::now() <= end {
                                done += 1;
                            }
                        }
                        Err(_) => errors += 1,
                    }
                }
                (done, errors)
            })
        })
        .collect();
    tokio::time::sleep_until(end).await;
    let (cpu, switches) = ThreadCpu::now().since(&cpu_before);
    let (mut done, mut errors) = (0, 0);
    for task in tasks {
        let (d, e) = task.await.unwrap_or_else(|e| panic!("a pairs task failed: {e}"));
        done += d;
        errors += e;
    }
    Pairs {
        done,
        time: window,
        cpu,
        switches,
        errors,
    }
}

/// Scenario 5: `n` sequential uncontended pairs, counted.
async fn counted_pairs(lib: &Lib, key: &str, n: u64, probe: &Probe) -> Counted {
    let before = probe.snapshot().await;
    for _ in 0..n {
        let held = lib
            .acquire(key)
            .await
            .unwrap_or_else(|e| panic!("uncontended acquire failed: {e}"));
        if let Err(e) = held.release().await {
            panic!("uncontended release failed: {e}");
        }
    }
    let after = probe.snapshot().await;
    Counted::between(&before, &after, n)
}

// ---------------------------------------------------------------------------------------------
// Scenarios 3 and 4: many tasks on one key.

#[derive(Default)]
struct TaskLog {
    /// When each acquisition completed.
    acquired: Vec<Instant>,
    /// Each acquisition's wait, in the same order.
    waits: Vec<Duration>,
    /// A wait cut short by the end of the window, with its length so far.
    censored: Option<Duration>,
    errors: u64,
}

struct Contention {
    handoffs_per_sec: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    jain: f64,
    /// Tasks that never held the lock in the window.
    starved: usize,
    retaken: f64,
    errors: u64,
    overlaps: u64,
    counted: Option<Counted>,
}

/// `tasks` tasks on `key`, each looping acquire (waiting), hold [`HOLD`], release, for
/// `window`. At the end of the window, waiters are cancelled; a holder finishes its hold and
/// release. With a probe, the counts are read at the start and at the end of the window.
async fn contention(
    lib: &Lib,
    key: String,
    tasks: usize,
    window: Duration,
    probe: Option<&Probe>,
) -> Contention {
    let (stop_tx, stop_rx) = watch::channel(false);
    let held = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let before = match probe {
        Some(probe) => Some(probe.snapshot().await),
        None => None,
    };
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (lib, key, held, overlaps) =
                (lib.clone(), key.clone(), Arc::clone(&held), Arc::clone(&overlaps));
            let mut stop = stop_rx.clone();
            tokio::spawn(async move {
                let mut log = TaskLog::default();
                while !*stop.borrow() {
                    let asked = Instant::now();
                    let attempt = tokio::select! {
                        attempt = lib.acquire(&key) => attempt,
                        _ = stop.changed() => {
                            log.censored = Some(asked.elapsed());
                            break;
                        }
                    };
                    match attempt {
                        Ok(lock) => {
                            let now = Instant::now();
                            log.acquired.push(now);
                            log.waits.push(now - asked);
                            if held.swap(true, Ordering::SeqCst) {
                                overlaps.fetch_add(1, Ordering::Relaxed);
                            }
                            tokio::time::sleep(HOLD).await;
                            held.store(false, Ordering::SeqCst);
                            if lock.release().await != Ok(true) {
                                log.errors += 1;
                            }
                        }
                        Err(_) => log.errors += 1,
                    }
                }
                log
            })
        })
        .collect();
    tokio::time::sleep_until(start + window).await;
    let after = match probe {
        Some(probe) => Some(probe.snapshot().await),
        None => None,
    };
    let stopped = Instant::now();
    let _ = stop_tx.send(true);
    let mut logs = Vec::with_capacity(tasks);
    for handle in handles {
        logs.push(
            handle
                .await
                .unwrap_or_else(|e| panic!("a contention task failed: {e}")),
        );
    }

    let mut waits = Vec::new();
    let mut order = Vec::new();
    let mut per_task = Vec::with_capacity(tasks);
    let (mut errors, mut count) = (0, 0u64);
    for (task, log) in logs.iter().enumerate() {
        let mut mine = 0u64;
        for (at, wait) in log.acquired.iter().zip(&log.waits) {
            if *at <= stopped {
                waits.push(*wait);
                order.push((*at, task));
                mine += 1;
            }
        }
        waits.extend(log.censored);
        per_task.push(mine as f64);
        count += mine;
        errors += log.errors;
    }
    waits.sort();
    order.sort();
    let retaken = order.windows(2).filter(|w| w[0].1 == w[1].1).count();
    let sum: f64 = per_task.iter().sum();
    let squares: f64 = per_task.iter().map(|x| x * x).sum();
    Contention {
        handoffs_per_sec: count as f64 / (stopped - start).as_secs_f64(),
        p50: quantile(&waits, 0.5),
        p99: quantile(&waits, 0.99),
        max: quantile(&waits, 1.0),
        starved: per_task.iter().filter(|n| **n == 0.0).count(),
        jain: if squares > 0.0 {
            sum * sum / (tasks as f64 * squares)
        } else {
            0.0
        },
        retaken: retaken as f64 / (order.len().max(2) - 1) as f64,
        errors,
        overlaps: overlaps.load(Ordering::Relaxed),
        counted: before
            .zip(after)
            .map(|(before, after)| Counted::between(&before, &after, count)),
    }
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut values: Vec<f64> = values.into_iter().collect();
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    })
}

// ---------------------------------------------------------------------------------------------
// Scenario 6: the watchdog.

#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Renewing {
    Arl(async_redis_lock::Locker),
    Ours(LockClient),
}

/// The locks one library holds, in a `Vec` of its own guard type (so each held lock costs
/// the size of that library's guard, not of the largest one).
enum Renewed {
    Arl(Vec<async_redis_lock::Lock>),
    Ours(Vec<lock_runtime::LockGuard>),
}

impl Renewing {
    fn index(&self) -> usize {
        match self {
            Renewing::Arl(_) => ARL,
            Renewing::Ours(_) => OURS,
        }
    }

    /// Takes `n` locks one after the other, each renewed in the background.
    async fn hold(&self, prefix: &str, n: usize) -> Renewed {
        match self {
            Renewing::Arl(locker) => {
                let options = async_redis_lock::Options::new()
                    .ttl(WATCHDOG_TTL)
                    .extend(WATCHDOG_TTL / 3);
                let mut held = Vec::with_capacity(n);
                for i in 0..n {
                    let key = format!("{prefix}:{i}");
                    held.push(
                        locker
                            .acquire_with_options(&options, key.as_str())
                            .await
                            .unwrap_or_else(|e| panic!("async-redis-lock: cannot take {key}: {e}")),
                    );
                }
                Renewed::Arl(held)
            }
            Renewing::Ours(client) => {
                let options = LockOptions::new(WATCHDOG_TTL).watchdog(true);
                let mut held = Vec::with_capacity(n);
                for i in 0..n {
                    let key = format!("{prefix}:{i}");
                    held.push(
                        client
                            .acquire(&key, &options)
                            .await
                            .unwrap_or_else(|e| panic!("ours: cannot take {key}: {e}")),
                    );
                }
                Renewed::Ours(held)
            }
        }
    }
}

impl Renewed {
    fn lost(&self) -> usize {
        match self {
            Renewed::Arl(locks) => locks.iter().filter(|l| l.is_lost()).count(),
            Renewed::Ours(guards) => guards.iter().filter(|g| g.is_lost()).count(),
        }
    }
}

/// Releases them one by one. A lock lost in the window fails its release; `lost` has counted it
/// already.
async fn release_all(held: Renewed) {
    match held {
        Renewed::Arl(locks) => {
            for lock in locks {
                let _ = lock.release().await;
            }
        }
        Renewed::Ours(guards) => {
            for guard in guards {
                let _ = guard.release().await;
            }
        }
    }
}

#[derive(Clone, Default)]
struct Watchdog {
    /// Every command Redis executed in the window.
    executed: Counts,
    locks: usize,
    window: Duration,
    renewed: u64,
    commands: u64,
    cpu: Duration,
    /// The same from per-thread schedstat (ns resolution).
    thread_cpu: Duration,
    rss_per_lock: f64,
    lost: usize,
}

/// CPU time per thread of this process, in ns (the first field of
/// `/proc/self/task/<tid>/schedstat`: finer than `/proc/self/stat`'s clock ticks), and its
/// context switches (voluntary and not, from `/proc/self/task/<tid>/status`).
struct ThreadCpu(BTreeMap<String, (u64, u64)>);

impl ThreadCpu {
    fn now() -> ThreadCpu {
        let tasks = std::fs::read_dir("/proc/self/task")
            .unwrap_or_else(|e| panic!("cannot list /proc/self/task: {e}"));
        ThreadCpu(
            tasks
                .flatten()
                .filter_map(|task| {
                    let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
                    let ns = stat.split_whitespace().next()?.parse().ok()?;
                    let status = std::fs::read_to_string(task.path().join("status")).ok()?;
                    let switches = status
                        .lines()
                        .filter_map(|line| {
                            let (name, n) = line.split_once(':')?;
                            name.ends_with("ctxt_switches")
                                .then(|| n.trim().parse::<u64>().ok())?
                        })
                        .sum();
                    Some((task.file_name().to_string_lossy().into_owned(), (ns, switches)))
                })
                .collect(),
        )
    }

    /// CPU used and context switches made since `earlier` by the threads alive at both
    /// instants.
    fn since(&self, earlier: &ThreadCpu) -> (Duration, u64) {
        let (mut ns, mut switches) = (0, 0);
        for (tid, (now_ns, now_switches)) in &self.0 {
            if let Some((then_ns, then_switches)) = earlier.0.get(tid) {
                ns += now_ns.saturating_sub(*then_ns);
                switches += now_switches.saturating_sub(*then_switches);
            }
        }
        (Duration::from_nanos(ns), switches)
    }
}

/// VmRSS of this process, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_else(|e| panic!("cannot read /proc/self/status: {e}"));
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or_else(|| panic!("no VmRSS in /proc/self/status"))
}

/// Scenario 6 for every `(locks, window)` size: first the memory pass (for each size,
/// async-redis-lock's locks, then ours, every lock of every size held until the pass ends, so
/// no measurement reuses memory another one freed), then one renewal window per library and
/// size.
async fn watchdog(
    contenders: &[Renewing; 2],
    raw: &mut MultiplexedConnection,
    sizes: &[(usize, Duration)],
    tick: f64,
) -> Vec<[Option<Watchdog>; 4]> {
    let mut results: Vec<[Option<Watchdog>; 4]> = vec![Default::default(); sizes.len()];
    let mut held = Vec::new();
    for (&(n, window), results) in sizes.iter().zip(&mut results) {
        eprintln!("watchdog: memory pass, {n} locks each");
        for lib in contenders {
            let before = rss();
            let locks = lib
                .hold(&format!("{}:mem:{n}", KEY_PREFIXES[lib.index()]), n)
                .await;
            let after = rss();
            held.push(locks);
            results[lib.index()] = Some(Watchdog {
                locks: n,
                window,
                rss_per_lock: (after as f64 - before as f64) / n as f64,
                ..Watchdog::default()
            });
        }
    }
    for locks in held {
        release_all(locks).await;
    }
    for (&(n, window), results) in sizes.iter().zip(&mut results) {
        for lib in contenders.iter().rev() {
            eprintln!("watchdog: {} holds {n} locks for {window:?}", NAMES[lib.index()]);
            let locks = lib
                .hold(&format!("{}:wd:{n}", KEY_PREFIXES[lib.index()]), n)
                .await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let cpu_before = cpu_time(tick);
            let thread_cpu_before = ThreadCpu::now();
            let before = commandstats(raw).await;
            tokio::time::sleep(window).await;
            let after = commandstats(raw).await;
            let cpu_after = cpu_time(tick);
            let (thread_cpu, _) = ThreadCpu::now().since(&thread_cpu_before);
            let lost = locks.lost();
            release_all(locks).await;
            let executed = delta(&before, &after);
            let sum = |names: &[&str]| -> u64 { names.iter().filter_map(|n| executed.get(*n)).sum() };
            if let Some(result) = &mut results[lib.index()] {
                result.renewed = sum(&["pexpire", "pexpireat", "expire", "expireat"]);
                result.commands = sum(&["evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"]);
                result.cpu = cpu_after.saturating_sub(cpu_before);
                result.thread_cpu = thread_cpu;
                result.lost = lost;
                result.executed = executed;
            }
            tokio::time::sleep(SETTLE).await;
        }
    }
    results
}

// ---------------------------------------------------------------------------------------------
// Scenario 7: fair mode, 4 processes × 8 waiters on one key (ours only).

/// In a child process of scenario 7: its index (0–3). `main` checks it before anything else.
const WORKER_ENV: &str = "CONTENTION_BENCH_FAIR_WORKER";
/// The worker's Redis URL (the server's, or the counting proxy's).
const WORKER_URL_ENV: &str = "CONTENTION_BENCH_FAIR_URL";
/// The key the workers contend for.
const WORKER_KEY_ENV: &str = "CONTENTION_BENCH_FAIR_KEY";
const FAIR_PROCESSES: usize = 4;
const FAIR_TASKS: usize = 8;
/// A waiter that began waiting at most this much later than another is not counted as having
/// arrived after it: the stamps of different processes are a little apart (scheduling between
/// taking the stamp and sending the request).
const ARRIVAL_SLACK: Duration = Duration::from_millis(2);
/// How long the parent waits for its workers to be ready, and then to report.
const WORKER_TIMEOUT: Duration = Duration::from_secs(60);

/// Wall-clock microseconds since the UNIX epoch: the one clock the processes share.
fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn fair_options() -> LockOptions {
    LockOptions::new(TTL).fair(true).wait(WAIT)
}

/// One waiter task's record, in wall-clock microseconds.
#[derive(Default)]
struct FairLog {
    /// (began waiting, got the lock, let go: called release) per acquisition.
    acquisitions: Vec<(u64, u64, u64)>,
    /// When the wait that the end of the window cut short began.
    waiting: Option<u64>,
    errors: u64,
}

/// `FAIR_TASKS` tasks looping acquire (fair, waiting), hold [`HOLD`], release, until `stop`.
/// A waiter is cancelled at the stop; a holder finishes its hold and release.
async fn fair_waiters(client: &LockClient, key: &str, stop: watch::Receiver<bool>) -> Vec<FairLog> {
    let handles: Vec<_> = (0..FAIR_TASKS)
        .map(|_| {
            let (client, key, mut stop) = (client.clone(), key.to_owned(), stop.clone());
            tokio::spawn(async move {
                let options = fair_options();
                let mut log = FairLog::default();
                while !*stop.borrow() {
                    let began = wall_us();
                    let attempt = tokio::select! {
                        attempt = client.acquire(&key, &options) => attempt,
                        _ = stop.changed() => {
                            log.waiting = Some(began);
                            break;
                        }
                    };
                    match attempt {
                        Ok(guard) => {
                            let got = wall_us();
                            tokio::time::sleep(HOLD).await;
                            let let_go = wall_us();
                            if !matches!(guard.release().await, Ok(true)) {
                                log.errors += 1;
                            }
                            log.acquisitions.push((began, got, let_go));
                        }
                        Err(_) => log.errors += 1,
                    }
                }
                log
            })
        })
        .collect();
    let mut logs = Vec::with_capacity(FAIR_TASKS);
    for handle in handles {
        logs.push(
            handle
                .await
                .unwrap_or_else(|e| panic!("a fair waiter task failed: {e}")),
        );
    }
    logs
}

/// A child process of scenario 7. It connects, warms up (scripts, connections, subscriber) on
/// a key of its own, prints `ready`, starts its waiters at `go` on stdin and stops them at
/// `stop` (or end of input), then prints one line per acquisition,
/// `<began waiting µs> <got it µs> <let go µs> <task>`, one `waiting <began µs> <task>` per
/// wait cut short, and `errors <n>`.
fn fair_worker(index: &str) {
    let index: usize = index
        .parse()
        .unwrap_or_else(|e| panic!("{WORKER_ENV}={index:?}: {e}"));
    let var = |name: &str| std::env::var(name).unwrap_or_else(|e| panic!("worker {index}: {name}: {e}"));
    let (url, key) = (var(WORKER_URL_ENV), var(WORKER_KEY_ENV));
    // Read on a thread of its own: a blocked read there does not hold up the runtime's end.
    let (control_tx, mut control_rx) = watch::channel(0u8);
    std::thread::spawn(move || {
        let mut lines = std::io::stdin().lines();
        while let Some(Ok(line)) = lines.next() {
            match line.trim() {
                "go" => {
                    let _ = control_tx.send(1);
                }
                "stop" => break,
                other => panic!("worker {index}: unexpected input {other:?}"),
            }
        }
        let _ = control_tx.send(2);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("worker {index}: no runtime: {e}"));
    let logs = runtime.block_on(async move {
        let client = ours_client(&url, nodelay_from_env())
            .await
            .unwrap_or_else(|e| panic!("worker {index}: cannot connect to {url}: {e}"));
        let (warm_tx, warm_rx) = watch::channel(false);
        let warm_key = format!("{key}:warm:{index}");
        let warm = fair_waiters(&client, &warm_key, warm_rx);
        let timer = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = warm_tx.send(true);
        };
        let (_, warm_logs) = tokio::join!(timer, warm);
        if warm_logs.iter().all(|log| log.acquisitions.is_empty()) {
            panic!("worker {index}: no acquisition in the warm-up");
        }
        tokio::time::sleep(SETTLE).await;
        println!("ready");
        let _ = control_rx.wait_for(|c| *c >= 1).await;
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopper = async {
            let _ = control_rx.wait_for(|c| *c >= 2).await;
            let _ = stop_tx.send(true);
        };
        let (_, logs) = tokio::join!(stopper, fair_waiters(&client, &key, stop_rx));
        // Cancelled waiters leave the queue in the background.
        tokio::time::sleep(SETTLE).await;
        logs
    });
    let mut out = String::new();
    let mut errors = 0;
    for (task, log) in logs.iter().enumerate() {
        let task = index * FAIR_TASKS + task;
        for (began, got, let_go) in &log.acquisitions {
            out.push_str(&format!("{began} {got} {let_go} {task}\n"));
        }
        if let Some(began) = log.waiting {
            out.push_str(&format!("waiting {began} {task}\n"));
        }
        errors += log.errors;
    }
    out.push_str(&format!("errors {errors}\n"));
    let mut stdout = std::io::stdout().lock();
    std::io::Write::write_all(&mut stdout, out.as_bytes())
        .and_then(|()| std::io::Write::flush(&mut stdout))
        .unwrap_or_else(|e| panic!("worker {index}: cannot write its records: {e}"));
}

#[derive(Clone)]
struct Fair {
    window: Duration,
    handoffs_per_sec: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    jain: f64,
    starved: usize,
    retaken: f64,
    /// Acquisitions that no waiter arriving more than [`ARRIVAL_SLACK`] later got ahead of, as
    /// a share of all.
    in_order: f64,
    /// Acquisitions that one did.
    overtaken: u64,
    /// Waits cut off by the end of the window that one did.
    overtaken_waiting: u64,
    /// The largest gap between the arrival of a waiter and that of a later one that got ahead.
    worst_overtake: Duration,
    errors: u64,
    overlaps: u64,
    counted: Option<Counted>,
}

/// One window of scenario 7: [`FAIR_PROCESSES`] workers on `key` through `url`; with a probe,
/// the counts are read at its start and end.
async fn fair_processes(url: &str, key: &str, window: Duration, probe: Option<&Probe>) -> Fair {
    use tokio::io::AsyncBufReadExt;
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("no path to this executable: {e}"));
    let mut workers = Vec::with_capacity(FAIR_PROCESSES);
    for index in 0..FAIR_PROCESSES {
        let mut child = tokio::process::Command::new(&exe)
            .env(WORKER_ENV, index.to_string())
            .env(WORKER_URL_ENV, url)
            .env(WORKER_KEY_ENV, key)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start worker {index} ({}): {e}", exe.display()));
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .map(|out| tokio::io::BufReader::new(out).lines())
            .unwrap_or_else(|| panic!("worker {index}: no stdout"));
        workers.push((child, stdin, stdout));
    }
    let ready = async {
        for (index, (_, _, lines)) in workers.iter_mut().enumerate() {
            match lines.next_line().await {
                Ok(Some(line)) if line == "ready" => {}
                other => panic!("worker {index} is not ready: {other:?}"),
            }
        }
    };
    tokio::time::timeout(WORKER_TIMEOUT, ready)
        .await
        .unwrap_or_else(|_| panic!("the workers were not ready within {WORKER_TIMEOUT:?}"));

    let before = match probe {
        Some(probe) => Some(probe.snapshot().await),
        None => None,
    };
    let started = Instant::now();
    let start_us = wall_us();
    for (_, stdin, _) in &mut workers {
        if let Some(stdin) = stdin {
            let _ = stdin.write_all(b"go\n").await;
        }
    }
    tokio::time::sleep_until(started + window).await;
    let after = match probe {
        Some(probe) => Some(probe.snapshot().await),
        None => None,
    };
    let stop_us = wall_us();
    for (_, stdin, _) in &mut workers {
        if let Some(mut stdin) = stdin.take() {
            let _ = stdin.write_all(b"stop\n").await;
        }
    }

    // (began, got, let go, task) per acquisition, and the waits that were going on at the stop.
    let mut acquisitions = Vec::new();
    let mut waiting = Vec::new();
    let mut errors = 0;
    let collect = async {
        for (index, (child, _, lines)) in workers.iter_mut().enumerate() {
            while let Some(line) = lines
                .next_line()
                .await
                .unwrap_or_else(|e| panic!("worker {index}: cannot read its output: {e}"))
            {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let number = |i: usize| -> u64 {
                    fields
                        .get(i)
                        .and_then(|f| f.parse().ok())
                        .unwrap_or_else(|| panic!("worker {index}: unexpected line {line:?}"))
                };
                match fields.first() {
                    Some(&"waiting") => waiting.push((number(1), number(2) as usize)),
                    Some(&"errors") => errors += number(1),
                    _ => acquisitions.push((number(0), number(1), number(2), number(3) as usize)),
                }
            }
            let status = child
                .wait()
                .await
                .unwrap_or_else(|e| panic!("worker {index}: {e}"));
            if !status.success() {
                panic!("worker {index} failed: {status}");
            }
        }
    };
    tokio::time::timeout(WORKER_TIMEOUT, collect)
        .await
        .unwrap_or_else(|_| panic!("the workers did not report within {WORKER_TIMEOUT:?}"));

    // An acquisition after the stop was a wait still going on at the end.
    let (mut done, late): (Vec<_>, Vec<_>) = acquisitions.into_iter().partition(|a| a.1 <= stop_us);
    waiting.extend(late.iter().map(|&(began, _, _, task)| (began, task)));
    done.sort_by_key(|a| a.1);
    let us = Duration::from_micros;
    let mut waits: Vec<Duration> = done.iter().map(|a| us(a.1.saturating_sub(a.0))).collect();
    waits.extend(waiting.iter().map(|w| us(stop_us.saturating_sub(w.0))));
    waits.sort();
    let mut per_task = vec![0f64; FAIR_PROCESSES * FAIR_TASKS];
    for a in &done {
        per_task[a.3] += 1.0;
    }
    let sum: f64 = per_task.iter().sum();
    let squares: f64 = per_task.iter().map(|x| x * x).sum();
    // In order of acquisition: the latest arrival among those that got the lock before.
    let slack = ARRIVAL_SLACK.as_micros() as u64;
    let (mut overtaken, mut worst, mut latest) = (0u64, 0u64, None::<u64>);
    for a in &done {
        if let Some(latest) = latest.filter(|&l| l > a.0 + slack) {
            overtaken += 1;
            worst = worst.max(latest - a.0);
        }
        latest = latest.max(Some(a.0));
    }
    let mut overtaken_waiting = 0;
    for w in &waiting {
        if let Some(latest) = latest.filter(|&l| l > w.0 + slack) {
            overtaken_waiting += 1;
            worst = worst.max(latest - w.0);
        }
    }
    let count = done.len() as u64;
    Fair {
        window,
        handoffs_per_sec: count as f64 / us(stop_us.saturating_sub(start_us)).as_secs_f64(),
        p50: quantile(&waits, 0.5),
        p99: quantile(&waits, 0.99),
        max: quantile(&waits, 1.0),
        jain: if squares > 0.0 {
            sum * sum / (per_task.len() as f64 * squares)
        } else {
            0.0
        },
        starved: per_task.iter().filter(|n| **n == 0.0).count(),
        retaken: done.windows(2).filter(|w| w[0].3 == w[1].3).count() as f64 / (done.len().max(2) - 1) as f64,
        in_order: 1.0 - overtaken as f64 / count.max(1) as f64,
        overtaken,
        overtaken_waiting,
        worst_overtake: us(worst),
        errors,
        // A hold that began before the previous one let go.
        overlaps: done.windows(2).filter(|w| w[1].1 < w[0].2).count() as u64,
        counted: before
            .zip(after)
            .map(|(before, after)| Counted::between(&before, &after, count)),
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios 1 and 2's CPU pinning.

/// This process on one CPU and the server on another, for scenarios 1 and 2 only. Left to the
/// scheduler, one request at a time is a lottery on this kind of machine: whether the server
/// and the client's worker thread share a vCPU, or wake each other across two (an interrupt to
/// a halted vCPU per request), changes a library's pairs/s by a factor of 1.5 to 5 from one 250 ms
/// slice to the next, far more than the libraries differ. Pinned apart, every request crosses CPUs,
/// as it crosses hosts in production.
struct Pinning {
    client_pid: u32,
    server_pid: u32,
    /// The affinity lists to restore, as `taskset` printed them.
    client_cpus: String,
    server_cpus: String,
    client_cpu: usize,
    server_cpu: usize,
}

/// Restores both affinities when dropped.
struct Pinned<'a>(&'a Pinning);

impl Pinning {
    /// `None` without `taskset`, without the server's pid, or with fewer than 2 CPUs allowed.
    fn new(server_pid: Option<u32>) -> Option<Pinning> {
        let (client_pid, server_pid) = (std::process::id(), server_pid?);
        let client_cpus = affinity::of(client_pid)?;
        let server_cpus = affinity::of(server_pid)?;
        let cpus = affinity::cpus(&client_cpus);
        let (&client_cpu, &server_cpu) = (cpus.first()?, cpus.get(1)?);
        Some(Pinning {
            client_pid,
            server_pid,
            client_cpus,
            server_cpus,
            client_cpu,
            server_cpu,
        })
    }

    fn pin(&self) -> Pinned<'_> {
        pin(self.client_pid, &self.client_cpu.to_string());
        pin(self.server_pid, &self.server_cpu.to_string());
        Pinned(self)
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        pin(self.0.client_pid, &self.0.client_cpus);
        pin(self.0.server_pid, &self.0.server_cpus);
    }
}

/// Every thread of `pid` onto `cpus`: a run half pinned would measure nothing.
fn pin(pid: u32, cpus: &str) {
    affinity::set(pid, cpus).unwrap_or_else(|e| panic!("{e}"));
}

// ---------------------------------------------------------------------------------------------
// Configuration, the run, and the report.

struct Config {
    scale: f64,
    /// TCP_NODELAY for all four (otherwise off, redis-rs's default, for all four).
    nodelay: bool,
    /// Scenarios 1 and 2 with this process and the server on separate CPUs (`BENCH_PIN=0`: not).
    pin: bool,
    rounds: usize,
    sequential_window: Duration,
    many_keys_window: Duration,
    contention_window: Duration,
    counting_window: Duration,
    counted_pairs: u64,
    watchdog: Vec<(usize, Duration)>,
    /// Scenario 7's timed window (1.5 s times `BENCH_SCALE`, at least 0.3 s) and its counting
    /// window.
    fair_window: Duration,
    fair_counting_window: Duration,
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
        // Below 1 the windows shrink too (a smoke run); above 1 only the rounds grow.
        let shrink = scale.min(1.0);
        let ms = |ms: f64| Duration::from_millis((ms * shrink).max(50.0) as u64);
        let mut watchdog = vec![(1_000, Duration::from_secs_f64((10.0 * shrink).max(4.0)))];
        if scale > 1.0 {
            watchdog.push((10_000, Duration::from_secs(30)));
        }
        Config {
            scale,
            nodelay: nodelay_from_env(),
            pin: std::env::var("BENCH_PIN").map_or(true, |v| v != "0"),
            rounds: ((5.0 * scale).round() as usize).max(1),
            sequential_window: ms(1000.0),
            many_keys_window: ms(1000.0),
            contention_window: ms(1500.0),
            counting_window: ms(1000.0),
            counted_pairs: 500,
            watchdog,
            fair_window: Duration::from_secs_f64((1.5 * scale).max(0.3)),
            fair_counting_window: ms(1000.0),
        }
    }
}

#[derive(Default)]
struct Results {
    sequential: [Vec<Pairs>; 4],
    many_keys: [Vec<Pairs>; 4],
    /// [8 tasks, 64 tasks][library]: one per round.
    contention: [[Vec<Contention>; 4]; 2],
    /// [8 tasks, 64 tasks, uncontended pairs][library].
    counted: [[Option<Counted>; 4]; 3],
    watchdog: Vec<[Option<Watchdog>; 4]>,
    /// Scenario 7 (ours only): the timed window, and the counting window (for its counts).
    fair: Option<Fair>,
    /// The CPUs this process and the server were pinned to for scenarios 1 and 2, if they were.
    pinned: Option<(usize, usize)>,
    fair_counting: Option<Fair>,
}

const CONTENTION_TASKS: [usize; 2] = [8, 64];
/// Scenarios 1 and 2 run each library's window in this many slices, taking turns.
const SLICES: usize = 4;

fn main() {
    // Before anything else: a child process of scenario 7 is a worker and nothing more.
    if let Ok(index) = std::env::var(WORKER_ENV) {
        fair_worker(&index);
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"))
        .block_on(bench());
}

async fn bench() {
    let config = Config::from_env();
    let tick = clock_tick();
    let server = RedisServer::spawn();
    let url = server.url();
    let mut raw = server.raw().await;
    let redis_version = info_field(&mut raw, "server", "redis_version").await;
    let inner_counted = check_counters(&mut raw).await;

    let requests = Arc::new(RequestCounts::default());
    let proxy_url = start_proxy(server.port(), Arc::clone(&requests));
    let probe = Probe {
        requests,
        raw: raw.clone(),
    };
    let mut libs = Vec::new();
    let mut counting_libs = Vec::new();
    for which in 0..4 {
        libs.push(Lib::connect(which, &url, config.nodelay).await);
        counting_libs.push(Lib::connect(which, &proxy_url, config.nodelay).await);
    }
    let mut results = Results::default();
    let pinning = if config.pin {
        Pinning::new(server.pid())
    } else {
        None
    };
    results.pinned = pinning.as_ref().map(|p| (p.client_cpu, p.server_cpu));

    eprintln!(
        "redis {redis_version} on 127.0.0.1:{}; BENCH_SCALE={}: {} rounds",
        server.port(),
        config.scale,
        config.rounds
    );
    eprintln!("warming up");
    for (which, lib) in libs.iter().enumerate() {
        warm_up(lib, &format!("{}:warm", KEY_PREFIXES[which])).await;
    }

    let renewing = [
        Renewing::Arl(
            async_redis_lock::Locker::from_client(redis_client(&url, config.nodelay))
                .await
                .unwrap_or_else(|e| panic!("async-redis-lock: cannot connect: {e}")),
        ),
        Renewing::Ours(
            ours_client(&url, config.nodelay)
                .await
                .unwrap_or_else(|e| panic!("ours: cannot connect: {e}")),
        ),
    ];
    // Held past one renewal, so the renew scripts are loaded before anything is counted.
    let mut warm = Vec::new();
    for lib in &renewing {
        warm.push(
            lib.hold(&format!("{}:wd:warm", KEY_PREFIXES[lib.index()]), 10)
                .await,
        );
    }
    tokio::time::sleep(WATCHDOG_TTL / 3 + Duration::from_millis(300)).await;
    for locks in warm {
        release_all(locks).await;
    }
    results.watchdog = watchdog(&renewing, &mut raw, &config.watchdog, tick).await;

    for round in 0..config.rounds {
        eprintln!("timed round {}/{}", round + 1, config.rounds);
        let order: Vec<usize> = (0..4).map(|i| (i + round) % 4).collect();
        let one_key = |which: usize| vec![format!("{}:r{round}:s1", KEY_PREFIXES[which])];
        let pinned = pinning.as_ref().map(Pinning::pin);
        let runs = pairs_round(&libs, &order, one_key, config.sequential_window).await;
        drop(pinned);
        for (which, run) in runs.into_iter().enumerate() {
            eprintln!("  1. {:<17} {:>8.0} pairs/s", NAMES[which], run.per_sec());
            results.sequential[which].push(run);
        }
        let many_keys = |which: usize| {
            (0..64)
                .map(|k| format!("{}:r{round}:s2:{k}", KEY_PREFIXES[which]))
                .collect()
        };
        let pinned = pinning.as_ref().map(Pinning::pin);
        let runs = pairs_round(&libs, &order, many_keys, config.many_keys_window).await;
        drop(pinned);
        for (which, run) in runs.into_iter().enumerate() {
            eprintln!("  2. {:<17} {:>8.0} pairs/s", NAMES[which], run.per_sec());
            results.many_keys[which].push(run);
        }
        for (scenario, &tasks) in CONTENTION_TASKS.iter().enumerate() {
            for &which in &order {
                let key = format!("{}:r{round}:s{}", KEY_PREFIXES[which], scenario + 3);
                let run = contention(&libs[which], key, tasks, config.contention_window, None).await;
                eprintln!(
                    "  {}. {:<17} {:>8.0} hand-offs/s, wait p50 {:.2?} p99 {:.2?} max {:.2?}, Jain {:.3}",
                    scenario + 3,
                    NAMES[which],
                    run.handoffs_per_sec,
                    run.p50,
                    run.p99,
                    run.max,
                    run.jain
                );
                results.contention[scenario][which].push(run);
                tokio::time::sleep(SETTLE).await;
            }
        }
    }

    for (which, lib) in counting_libs.iter().enumerate() {
        eprintln!("counting round: {}", NAMES[which]);
        let prefix = format!("{}:count", KEY_PREFIXES[which]);
        warm_up(lib, &format!("{prefix}:warm")).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        results.counted[2][which] =
            Some(counted_pairs(lib, &format!("{prefix}:s5"), config.counted_pairs, &probe).await);
        tokio::time::sleep(SETTLE).await;
        for (scenario, &tasks) in CONTENTION_TASKS.iter().enumerate() {
            let key = format!("{prefix}:s{}", scenario + 3);
            let run = contention(lib, key, tasks, config.counting_window, Some(&probe)).await;
            results.counted[scenario][which] = run.counted;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    eprintln!(
        "7. ours, fair, {FAIR_PROCESSES} processes × {FAIR_TASKS} waiters: {:?} timed, then {:?} counted",
        config.fair_window, config.fair_counting_window
    );
    let run = fair_processes(&url, "ours:s7", config.fair_window, None).await;
    eprintln!(
        "  7. ours {:>8.0} hand-offs/s, wait p50 {:.2?} p99 {:.2?} max {:.2?}, Jain {:.3}, in arrival \
         order {:.1}% ({} overtaken, {} cut-off waits overtaken)",
        run.handoffs_per_sec,
        run.p50,
        run.p99,
        run.max,
        run.jain,
        run.in_order * 100.0,
        run.overtaken,
        run.overtaken_waiting
    );
    results.fair = Some(run);
    tokio::time::sleep(Duration::from_millis(200)).await;
    results.fair_counting = Some(
        fair_processes(
            &proxy_url,
            "ours:count:s7",
            config.fair_counting_window,
            Some(&probe),
        )
        .await,
    );

    report(&config, &redis_version, inner_counted, tick, &results);
}

/// Connections, script caches and (for ours) the subscriber connection, before anything counts.
async fn warm_up(lib: &Lib, prefix: &str) {
    for _ in 0..20 {
        let held = lib
            .acquire(&format!("{prefix}:pairs"))
            .await
            .unwrap_or_else(|e| panic!("warm-up acquire failed: {e}"));
        if let Err(e) = held.release().await {
            panic!("warm-up release failed: {e}");
        }
    }
    contention(
        lib,
        format!("{prefix}:contention"),
        8,
        Duration::from_millis(300),
        None,
    )
    .await;
    tokio::time::sleep(SETTLE).await;
}

/// Whether `total_commands_processed` counts the commands a script runs (checked, not assumed),
/// with the delta seen for one `EVAL` running 3 commands.
async fn check_counters(raw: &mut MultiplexedConnection) -> (bool, u64) {
    let parse = |s: String| -> u64 {
        s.parse()
            .unwrap_or_else(|e| panic!("total_commands_processed {s:?}: {e}"))
    };
    let before = parse(info_field(raw, "stats", "total_commands_processed").await);
    let _: i64 = redis::cmd("EVAL")
        .arg("redis.call('SET', KEYS[1], 'x') redis.call('GET', KEYS[1]) redis.call('DEL', KEYS[1]) return 1")
        .arg(1)
        .arg("calibrate:counters")
        .query_async(raw)
        .await
        .unwrap_or_else(|e| panic!("calibration EVAL failed: {e}"));
    let after = parse(info_field(raw, "stats", "total_commands_processed").await);
    // The first INFO counts once it has run; then EVAL, and maybe its 3 commands.
    let seen = after - before;
    (seen == 5, seen)
}

// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Unit {
    PerSec,
    Ratio,
    Millis,
    Index,
    Percent,
    /// A share, to 0.1%.
    FinePercent,
    Count,
    Each,
    Micros,
    Bytes,
}

struct Row {
    scenario: String,
    metric: &'static str,
    unit: Unit,
    values: [Option<f64>; 4],
}

fn format_value(value: Option<f64>, unit: Unit) -> String {
    let Some(v) = value else {
        return "n/a".to_owned();
    };
    match unit {
        Unit::PerSec | Unit::Count | Unit::Bytes => {
            let digits = format!("{:.0}", v.abs());
            let mut grouped = String::new();
            for (i, c) in digits.chars().enumerate() {
                if i > 0 && (digits.len() - i) % 3 == 0 {
                    grouped.push(',');
                }
                grouped.push(c);
            }
            let sign = if v < -0.5 { "-" } else { "" };
            let unit = if matches!(unit, Unit::Bytes) { " B" } else { "" };
            format!("{sign}{grouped}{unit}")
        }
        Unit::Ratio => format!("{v:.2}x"),
        Unit::Millis if v >= 100.0 => format!("{v:.0} ms"),
        Unit::Millis if v >= 10.0 => format!("{v:.1} ms"),
        Unit::Millis => format!("{v:.2} ms"),
        Unit::Index => format!("{v:.3}"),
        Unit::Percent => format!("{:.0}%", v * 100.0),
        Unit::FinePercent => format!("{:.1}%", v * 100.0),
        Unit::Each => format!("{v:.2}"),
        Unit::Micros => format!("{v:.1} µs"),
    }
}

fn unit_name(unit: Unit) -> &'static str {
    match unit {
        Unit::PerSec => "per_second",
        Unit::Ratio => "ratio",
        Unit::Millis => "ms",
        Unit::Index => "index",
        Unit::Percent | Unit::FinePercent => "fraction",
        Unit::Count => "count",
        Unit::Each => "per_unit",
        Unit::Micros => "us",
        Unit::Bytes => "bytes",
    }
}

fn report(config: &Config, redis_version: &str, inner_counted: (bool, u64), tick: f64, results: &Results) {
    let mut rows = Vec::new();
    let mut row = |scenario: &str, metric: &'static str, unit: Unit, values: [Option<f64>; 4]| {
        rows.push(Row {
            scenario: scenario.to_owned(),
            metric,
            unit,
            values,
        });
    };
    let per = |f: &dyn Fn(usize) -> Option<f64>| -> [Option<f64>; 4] { [f(0), f(1), f(2), f(3)] };

    for (name, runs) in [
        ("1. 1 task, 1 key, sequential", &results.sequential),
        ("2. 64 tasks, 64 keys", &results.many_keys),
    ] {
        row(
            name,
            "pairs/s",
            Unit::PerSec,
            per(&|w| median(runs[w].iter().map(Pairs::per_sec))),
        );
        row(
            name,
            "ratio to hand-written",
            Unit::Ratio,
            per(&|w| {
                median(
                    runs[w]
                        .iter()
                        .zip(&runs[HAND])
                        .map(|(r, hand)| r.per_sec() / hand.per_sec()),
                )
            }),
        );
        row(
            name,
            "client CPU per pair",
            Unit::Micros,
            per(&|w| median(runs[w].iter().map(Pairs::cpu_per_pair_us))),
        );
        row(
            name,
            "client context switches per pair",
            Unit::Each,
            per(&|w| median(runs[w].iter().map(Pairs::switches_per_pair))),
        );
        row(
            name,
            "errors (all rounds)",
            Unit::Count,
            per(&|w| Some(runs[w].iter().map(|r| r.errors).sum::<u64>() as f64)),
        );
    }

    for (scenario, &tasks) in CONTENTION_TASKS.iter().enumerate() {
        let name = format!("{}. {tasks} tasks, 1 key, hold 1 ms", scenario + 3);
        let runs = &results.contention[scenario];
        let med = |f: fn(&Contention) -> f64| per(&|w| median(runs[w].iter().map(f)));
        row(&name, "hand-offs/s", Unit::PerSec, med(|r| r.handoffs_per_sec));
        row(&name, "wait p50", Unit::Millis, med(|r| millis(r.p50)));
        row(&name, "wait p99", Unit::Millis, med(|r| millis(r.p99)));
        row(
            &name,
            "wait max (median round)",
            Unit::Millis,
            med(|r| millis(r.max)),
        );
        row(
            &name,
            "wait max (worst round)",
            Unit::Millis,
            per(&|w| runs[w].iter().map(|r| millis(r.max)).reduce(f64::max)),
        );
        row(&name, "Jain's fairness index", Unit::Index, med(|r| r.jain));
        row(
            &name,
            "tasks that never got the lock",
            Unit::Each,
            med(|r| r.starved as f64),
        );
        row(
            &name,
            "re-taken by the releaser",
            Unit::Percent,
            med(|r| r.retaken),
        );
        let counted = &results.counted[scenario];
        row(
            &name,
            "requests sent per hand-off",
            Unit::Each,
            per(&|w| counted[w].as_ref().map(Counted::requests_per_unit)),
        );
        row(
            &name,
            "commands executed per hand-off",
            Unit::Each,
            per(&|w| counted[w].as_ref().map(Counted::executed_per_unit)),
        );
        row(
            &name,
            "errors + overlaps (all rounds)",
            Unit::Count,
            per(&|w| Some(runs[w].iter().map(|r| r.errors + r.overlaps).sum::<u64>() as f64)),
        );
    }

    let name = "5. uncontended pair";
    let counted = &results.counted[2];
    row(
        name,
        "requests sent per pair",
        Unit::Each,
        per(&|w| counted[w].as_ref().map(Counted::requests_per_unit)),
    );
    row(
        name,
        "commands executed per pair",
        Unit::Each,
        per(&|w| counted[w].as_ref().map(Counted::executed_per_unit)),
    );

    for watchdog in &results.watchdog {
        let Some(first) = watchdog.iter().flatten().next() else {
            continue;
        };
        let name = format!(
            "6. watchdog: {} locks, ttl 3 s, {:.0} s",
            first.locks,
            first.window.as_secs_f64()
        );
        let w = |f: fn(&Watchdog) -> f64| per(&|i| watchdog[i].as_ref().map(f));
        row(
            &name,
            "locks renewed in the window",
            Unit::Count,
            w(|r| r.renewed as f64),
        );
        row(
            &name,
            "renewal commands in the window",
            Unit::Count,
            w(|r| r.commands as f64),
        );
        row(
            &name,
            "locks renewed per renewal command",
            Unit::Each,
            w(|r| r.renewed as f64 / r.commands.max(1) as f64),
        );
        row(
            &name,
            "client CPU per lock renewal (/proc/self/stat)",
            Unit::Micros,
            w(|r| r.cpu.as_secs_f64() * 1e6 / r.renewed.max(1) as f64),
        );
        row(
            &name,
            "  the same from per-thread schedstat",
            Unit::Micros,
            w(|r| r.thread_cpu.as_secs_f64() * 1e6 / r.renewed.max(1) as f64),
        );
        row(
            &name,
            "client memory per held lock (VmRSS)",
            Unit::Bytes,
            w(|r| r.rss_per_lock),
        );
        row(&name, "locks lost", Unit::Count, w(|r| r.lost as f64));
    }

    if let Some(fair) = &results.fair {
        let name = format!(
            "7. fair: {FAIR_PROCESSES} processes × {FAIR_TASKS} waiters, 1 key, hold 1 ms, {:.1} s",
            fair.window.as_secs_f64()
        );
        let ours = |v: f64| per(&|w| (w == OURS).then_some(v));
        row(&name, "hand-offs/s", Unit::PerSec, ours(fair.handoffs_per_sec));
        row(&name, "wait p50", Unit::Millis, ours(millis(fair.p50)));
        row(&name, "wait p99", Unit::Millis, ours(millis(fair.p99)));
        row(&name, "wait max", Unit::Millis, ours(millis(fair.max)));
        row(&name, "Jain's fairness index", Unit::Index, ours(fair.jain));
        row(
            &name,
            "tasks that never got the lock",
            Unit::Each,
            ours(fair.starved as f64),
        );
        row(
            &name,
            "re-taken by the releaser",
            Unit::Percent,
            ours(fair.retaken),
        );
        row(
            &name,
            "acquired in arrival order (2 ms slack)",
            Unit::FinePercent,
            ours(fair.in_order),
        );
        row(
            &name,
            "acquisitions a later arrival got ahead of",
            Unit::Count,
            ours(fair.overtaken as f64),
        );
        row(
            &name,
            "cut-off waits a later arrival got ahead of",
            Unit::Count,
            ours(fair.overtaken_waiting as f64),
        );
        row(
            &name,
            "largest arrival gap of those",
            Unit::Millis,
            ours(millis(fair.worst_overtake)),
        );
        let counted = results.fair_counting.as_ref().and_then(|f| f.counted.as_ref());
        row(
            &name,
            "requests sent per hand-off",
            Unit::Each,
            per(&|w| counted.filter(|_| w == OURS).map(Counted::requests_per_unit)),
        );
        row(
            &name,
            "commands executed per hand-off",
            Unit::Each,
            per(&|w| counted.filter(|_| w == OURS).map(Counted::executed_per_unit)),
        );
        let counting = results.fair_counting.as_ref();
        row(
            &name,
            "errors + overlaps (both windows)",
            Unit::Count,
            ours((fair.errors + fair.overlaps + counting.map_or(0, |c| c.errors + c.overlaps)) as f64),
        );
    }

    // The table.
    let metric_width = rows.iter().map(|r| r.metric.chars().count()).max().unwrap_or(0) + 2;
    let column = 18;
    println!();
    println!(
        "redis {redis_version}, 1 process, {} interleaved rounds (medians); counts from one \
         counting round per library; BENCH_SCALE={}; TCP_NODELAY: {}",
        config.rounds,
        config.scale,
        if config.nodelay {
            "on for all four (BENCH_NODELAY)"
        } else {
            "off for all four (redis-rs default)"
        }
    );
    match results.pinned {
        Some((client, server)) => println!(
            "scenarios 1 and 2: this process pinned to CPU {client}, redis-server to CPU {server} (taskset; \
             BENCH_PIN=0 to leave them to the scheduler)"
        ),
        None => println!("scenarios 1 and 2: not pinned (BENCH_PIN=0, or taskset or a second CPU missing)"),
    }
    println!(
        "total_commands_processed counts commands run inside scripts: {} (delta {} for INFO + \
         EVAL running 3 commands); commands executed = sum of INFO commandstats calls",
        if inner_counted.0 { "yes" } else { "no" },
        inner_counted.1
    );
    print!("{:metric_width$}", "");
    for name in NAMES {
        print!("{name:>column$}");
    }
    println!();
    let mut scenario = "";
    for r in &rows {
        if r.scenario != scenario {
            scenario = &r.scenario;
            println!("{scenario}");
        }
        print!("  {:w$}", r.metric, w = metric_width - 2);
        for v in r.values {
            print!("{:>column$}", format_value(v, r.unit));
        }
        println!();
    }

    // Breakdowns of the counts.
    println!();
    let labels = [
        "3. 8 tasks, per hand-off",
        "4. 64 tasks, per hand-off",
        "5. per uncontended pair",
    ];
    for (label, counted) in labels.iter().zip(&results.counted) {
        println!("{label}:");
        for (which, c) in counted.iter().enumerate() {
            if let Some(c) = c {
                println!(
                    "  {:<17} requests: {}",
                    NAMES[which],
                    Counted::breakdown(&c.requests, c.units)
                );
                println!(
                    "  {:<17} executed: {}",
                    "",
                    Counted::breakdown(&c.executed, c.units)
                );
            }
        }
    }
    if let Some(c) = results.fair_counting.as_ref().and_then(|f| f.counted.as_ref()) {
        println!("7. fair, {FAIR_PROCESSES} processes × {FAIR_TASKS} waiters, per hand-off:");
        println!(
            "  {:<17} requests: {}",
            NAMES[OURS],
            Counted::breakdown(&c.requests, c.units)
        );
        println!(
            "  {:<17} executed: {}",
            "",
            Counted::breakdown(&c.executed, c.units)
        );
    }
    for watchdog in &results.watchdog {
        for (which, w) in watchdog.iter().enumerate() {
            if let Some(w) = w {
                println!(
                    "6. watchdog, {} locks, executed per lock renewal, {}: {}",
                    w.locks,
                    NAMES[which],
                    Counted::breakdown(&w.executed, w.renewed)
                );
            }
        }
    }

    // The JSON.
    let json_rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            let mut o = serde_json::Map::new();
            o.insert("scenario".into(), json!(r.scenario));
            o.insert("metric".into(), json!(r.metric));
            o.insert("unit".into(), json!(unit_name(r.unit)));
            for (name, v) in JSON_NAMES.iter().zip(r.values) {
                o.insert((*name).into(), json!(v));
            }
            Value::Object(o)
        })
        .collect();
    let mut breakdowns: serde_json::Map<String, Value> = [
        "8_tasks_per_handoff",
        "64_tasks_per_handoff",
        "uncontended_per_pair",
    ]
    .iter()
    .zip(&results.counted)
    .map(|(label, counted)| {
        let per_lib: serde_json::Map<String, Value> = JSON_NAMES
            .iter()
            .zip(counted)
            .filter_map(|(name, c)| {
                let c = c.as_ref()?;
                Some((
                    (*name).to_owned(),
                    json!({
                        "units": c.units,
                        "requests": Counted::breakdown_json(&c.requests, c.units),
                        "executed": Counted::breakdown_json(&c.executed, c.units),
                    }),
                ))
            })
            .collect();
        ((*label).to_owned(), Value::Object(per_lib))
    })
    .collect();
    if let Some(c) = results.fair_counting.as_ref().and_then(|f| f.counted.as_ref()) {
        breakdowns.insert(
            "fair_4_processes_x_8_per_handoff".to_owned(),
            json!({
                JSON_NAMES[OURS]: {
                    "units": c.units,
                    "requests": Counted::breakdown_json(&c.requests, c.units),
                    "executed": Counted::breakdown_json(&c.executed, c.units),
                }
            }),
        );
    }
    let watchdog_breakdowns: Vec<Value> = results
        .watchdog
        .iter()
        .flat_map(|watchdog| watchdog.iter().enumerate())
        .filter_map(|(which, w)| {
            let w = w.as_ref()?;
            Some(json!({
                "library": JSON_NAMES[which],
                "locks": w.locks,
                "window_s": w.window.as_secs_f64(),
                "executed_per_lock_renewal": Counted::breakdown_json(&w.executed, w.renewed),
            }))
        })
        .collect();
    let output = json!({
        "redis_version": redis_version,
        "bench_scale": config.scale,
        "tcp_nodelay_for_all": config.nodelay,
        "scenario_1_pinned_cpus": results.pinned.map(|(client, server)| json!({"client": client, "server": server})),
        "rounds": config.rounds,
        "windows_ms": {
            "sequential": config.sequential_window.as_millis() as u64,
            "many_keys": config.many_keys_window.as_millis() as u64,
            "contention": config.contention_window.as_millis() as u64,
            "counting": config.counting_window.as_millis() as u64,
            "fair": config.fair_window.as_millis() as u64,
            "fair_counting": config.fair_counting_window.as_millis() as u64,
        },
        "fair_arrival_slack_ms": ARRIVAL_SLACK.as_millis() as u64,
        "counted_pairs": config.counted_pairs,
        "clock_ticks_per_second": tick,
        "total_commands_processed_counts_script_commands": inner_counted.0,
        "rows": json_rows,
        "count_breakdowns": breakdowns,
        "watchdog_breakdowns": watchdog_breakdowns,
    });
    println!();
    println!(
        "{}",
        serde_json::to_string_pretty(&output).unwrap_or_else(|e| panic!("cannot write JSON: {e}"))
    );
}
