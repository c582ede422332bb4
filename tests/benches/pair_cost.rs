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
//!   token NX PX GET`, then this library's release script (`release.lua`) with its four
//!   arguments. Its difference to the row above is what our requests cost Redis (and the wire);
//! - **the same without PUBLISH**: the release script with its announcement taken out: what the
//!   `PUBLISH` that wakes waiters costs;
//! - **ours**: `LockClient::acquire` + `LockGuard::release`. Its difference to "our traffic" is
//!   what the library's own bookkeeping costs on the client.
//!
//! Without `taskset` (or the server's pid) nothing is pinned, and the report says so.

// The spawned task's future nests `LockClient::acquire`'s deeply enough for rustc's default
// query depth while it checks that the future is `Send`.
#![recursion_limit = "256"]

use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};
use lock_tests::{affinity, RedisServer};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

const TTL_MS: u64 = 10_000;
const ROUNDS: usize = 30;
const SLICE: Duration = Duration::from_millis(300);
/// The release script as the library sends it (fence.lua is its prefix).
const RELEASE_LUA: &str = concat!(
    include_str!("../../lock-runtime/src/scripts/fence.lua"),
    include_str!("../../lock-runtime/src/scripts/release.lua")
);
/// The announcement in `release.lua`, replaced for the variant without it.
const ANNOUNCE: &str = "redis.pcall(ARGV[6] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[4], message)";
const NAMES: [&str; 4] = [
    "hand-written",
    "hand-written, our traffic",
    "the same without PUBLISH",
    "ours",
];

#[derive(Clone)]
enum Contender {
    Hand(MultiplexedConnection),
    /// Our requests from the hand-written client: the release script and its arguments.
    Traffic(MultiplexedConnection, redis::Script),
    Ours(LockClient, LockOptions),
}

impl Contender {
    /// Pairs on `key` until `until`.
    async fn pairs(&self, key: &str, until: Instant) -> u64 {
        // What the library names the lock and its channel for `key` (default prefix).
        let (lock, channel) = (format!("lock:{{{key}}}"), format!("lock:{{{key}}}:released"));
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
                Contender::Traffic(conn, release) => {
                    let mut conn = conn.clone();
                    // `SET … GET` answers nil when it took the key.
                    assert!(
                        set(&mut conn, &lock, &token, true).await.is_none(),
                        "{lock} was held"
                    );
                    let released: i64 = release
                        .key(&lock)
                        .arg(&token)
                        .arg(0)
                        .arg("c:0123456789abcdef")
                        .arg(&channel)
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
    let without_publish = RELEASE_LUA.replace(ANNOUNCE, "1");
    assert_ne!(
        without_publish, RELEASE_LUA,
        "release.lua no longer announces as this bench expects: update ANNOUNCE"
    );
    let ours = LockClient::builder()
        .url(&url)
        .build()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    let contenders = [
        Contender::Hand(connect().await),
        Contender::Traffic(connect().await, redis::Script::new(RELEASE_LUA)),
        Contender::Traffic(connect().await, redis::Script::new(&without_publish)),
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
        "    of which the PUBLISH                     {:+.2} µs",
        us[1] - us[2]
    );
    println!(
        "  the library's own work on the client       {:+.2} µs",
        us[3] - us[1]
    );
}
