//! Where an uncontended acquire + release pair's cost goes: this library against the
//! hand-written minimum, with the client, its runtime and `redis-server` all pinned to one CPU,
//! so that a pair is CPU work and nothing else (no wake-up of another CPU, whose cost swings from
//! one slice to the next on a VM and hides differences of a few percent).
//!
//! ```text
//! cargo bench -p lock-tests --bench pair_cost    # about 40 s
//! ```
//!
//! Four contenders take turns in 300 ms slices, 30 rounds, one task each, on its own key; each
//! row is the median slice, as µs per pair:
//! - **hand-written**: `SET key token NX PX`, then the compare-and-delete script;
//! - **hand-written, our traffic**: the same client sending what this library sends: `SET key
//!   token NX PX GET`, then this library's common release script (`unlock.lua`) with the lock's
//!   waiting mark and its two arguments (nobody waits, so it publishes nothing). Its difference
//!   to the row above is what our requests cost Redis (and the wire);
//! - **the same, announced**: the release script without the waiting mark, so it publishes, as
//!   when someone waits (and always on a Cluster): what the `PUBLISH` that wakes waiters costs;
//! - **ours**: `LockClient::acquire` + `LockGuard::release`. Its difference to "our traffic" is
//!   what the library's own bookkeeping costs on the client.
//!
//! Without `taskset` (or the server's pid) nothing is pinned, and the report says so.

use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};
use lock_tests::{affinity, RedisServer};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

const TTL_MS: u64 = 10_000;
const ROUNDS: usize = 30;
const SLICE: Duration = Duration::from_millis(300);
/// The common release script, as the library sends it.
const UNLOCK_LUA: &str = include_str!("../../lock-runtime/src/store/redis/scripts/unlock.lua");
const NAMES: [&str; 4] = [
    "hand-written",
    "hand-written, our traffic",
    "the same, announced",
    "ours",
];

#[derive(Clone)]
enum Contender {
    Hand(MultiplexedConnection),
    /// Our requests from the hand-written client: the release script and its arguments; `true`:
    /// with the waiting mark (announced only if someone waits), `false`: without (announced).
    Traffic(MultiplexedConnection, redis::Script, bool),
    Ours(LockClient, LockOptions),
}

impl Contender {
    /// Pairs on `key` until `until`.
    async fn pairs(&self, key: &str, until: Instant) -> u64 {
        // What the library names the lock and its waiting mark for `key` (default prefix).
        let names = lock_runtime::redis::keys::LockKeys::new(lock_runtime::DEFAULT_PREFIX, key);
        let (lock, mark) = (names.lock().to_owned(), names.waiting());
        let mut done = 0;
        while Instant::now() < until {
            let token = lock_tests::hand_written::token();
            let released = match self {
                Contender::Hand(conn) => {
                    let mut conn = conn.clone();
                    assert!(
                        set(&mut conn, &lock, &token, false).await.is_some(),
                        "{lock} was held"
                    );
                    let deleted: i64 = lock_tests::hand_written::release_script()
                        .key(&lock)
                        .arg(&token)
                        .invoke_async(&mut conn)
                        .await
                        .unwrap_or_else(|e| panic!("release failed: {e}"));
                    deleted == 1
                }
                Contender::Traffic(conn, release, marked) => {
                    let mut conn = conn.clone();
                    // `SET … GET` answers nil when it took the key.
                    assert!(
                        set(&mut conn, &lock, &token, true).await.is_none(),
                        "{lock} was held"
                    );
                    let mut release = release.key(&lock);
                    if *marked {
                        release.key(&mark);
                    }
                    let released: i64 = release
                        .arg(&token)
                        .arg("c:0123456789abcdef")
                        .invoke_async(&mut conn)
                        .await
                        .unwrap_or_else(|e| panic!("release failed: {e}"));
                    released == 1
                }
                Contender::Ours(client, options) => {
                    let guard = client
                        .acquire(key, options)
                        .await
                        .unwrap_or_else(|e| panic!("acquire failed: {e}"));
                    guard
                        .release()
                        .await
                        .unwrap_or_else(|e| panic!("release failed: {e}"))
                }
            };
            assert!(released, "{lock} was not ours at its release");
            done += 1;
        }
        done
    }
}

/// `SET lock token NX PX ttl`, with `GET` as this library sends it.
async fn set(conn: &mut MultiplexedConnection, lock: &str, token: &str, get: bool) -> Option<String> {
    let mut set = redis::cmd("SET");
    set.arg(lock).arg(token).arg("NX").arg("PX").arg(TTL_MS);
    if get {
        set.arg("GET");
    }
    set.query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("SET failed: {e}"))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("no runtime: {e}"))
        .block_on(bench());
}

async fn bench() {
    let server = RedisServer::spawn();
    let url = server.url();
    // The first CPU this process may run on, for both.
    let cpu =
        affinity::of(std::process::id()).and_then(|list| affinity::cpus(&list).first().map(usize::to_string));
    let pinned = match (&cpu, server.pid()) {
        (Some(cpu), Some(server_pid)) => {
            affinity::set(std::process::id(), cpu).is_ok() && affinity::set(server_pid, cpu).is_ok()
        }
        _ => false,
    };
    let client = redis::Client::open(url.as_str()).unwrap_or_else(|e| panic!("bad URL {url}: {e}"));
    let connect = || async {
        client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
    };
    let ours = LockClient::builder()
        .url(&url)
        .build()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    let contenders = [
        Contender::Hand(connect().await),
        Contender::Traffic(connect().await, redis::Script::new(UNLOCK_LUA), true),
        Contender::Traffic(connect().await, redis::Script::new(UNLOCK_LUA), false),
        Contender::Ours(ours, LockOptions::new(Duration::from_millis(TTL_MS))),
    ];
    eprintln!(
        "redis-server and this process {}; {ROUNDS} rounds of {SLICE:?} per contender",
        match (&cpu, pinned) {
            (Some(cpu), true) => format!("pinned to CPU {cpu}"),
            _ => "not pinned (no taskset)".to_owned(),
        }
    );
    // Warm: connections open, scripts cached.
    for (i, contender) in contenders.iter().enumerate() {
        contender
            .pairs(&format!("warm:{i}"), Instant::now() + Duration::from_millis(200))
            .await;
    }
    let mut rates = vec![Vec::new(); contenders.len()];
    for round in 0..ROUNDS {
        for turn in 0..contenders.len() {
            let which = (turn + round) % contenders.len();
            let contender = contenders[which].clone();
            let until = Instant::now() + SLICE;
            // On a worker thread, as a service's task would be.
            let done = tokio::spawn(async move { contender.pairs(&format!("k:{which}"), until).await })
                .await
                .unwrap_or_else(|e| panic!("a contender failed: {e}"));
            rates[which].push(done as f64 / SLICE.as_secs_f64());
        }
    }
    let us: Vec<f64> = rates.into_iter().map(|r| 1e6 / median(r)).collect();
    println!();
    println!("µs per uncontended pair (median of {ROUNDS} slices), pinned: {pinned}");
    for (name, each) in NAMES.iter().zip(&us) {
        println!(
            "  {name:<28} {each:>7.2} µs   {:.3} of hand-written's pairs/s",
            us[0] / each
        );
    }
    println!();
    println!(
        "  our requests' cost to Redis and the wire   {:+.2} µs",
        us[1] - us[0]
    );
    println!(
        "  a PUBLISH, when someone waits              {:+.2} µs",
        us[2] - us[1]
    );
    println!(
        "  the library's own work on the client       {:+.2} µs",
        us[3] - us[1]
    );
}
