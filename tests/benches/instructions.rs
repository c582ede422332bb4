//! Instructions per uncontended acquire + release pair, counted by callgrind: this library
//! against the hand-written minimum on the same connection stack (redis-rs's multiplexed
//! connection; `SET key token NX PX ttl`, then a compare-and-delete script by `EVALSHA`).
//! Instructions do not move with the machine's load, so a few percent are seen run after run
//! where pairs per second swing by more.
//!
//! ```text
//! cargo bench -p lock-tests --bench instructions    # about a minute; needs valgrind
//! ```
//!
//! Each cell is one run of this binary under `valgrind --tool=callgrind`, counting only what runs
//! inside [`measured`] (`--collect-atstart=no --toggle-collect`): the client's own work on one
//! current-thread tokio runtime (the library, redis-rs, tokio's driver; system calls count as the
//! instructions that make them), never the server's, which runs outside valgrind. Before it,
//! the same cell runs unmeasured once (connections open, scripts loaded, allocator warm).
//! - **sequential**: one task, `PAIRS` pairs in a row on one key;
//! - **64 tasks**: 64 tasks at once, `PAIRS / 64` pairs each, each on its own key;
//! - **64 tasks, 2 threads**: the same on a multi-thread runtime with 2 workers, as a service runs
//!   them (and the contention bench); [`measured`] is not on the workers' stacks, so this cell
//!   counts every thread's whole run with the pairs done twice, less the same run with them done
//!   once.
//!
//! The report: instructions per pair for both contenders, and ours ÷ the minimum.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};
use lock_tests::RedisServer;
use redis::aio::MultiplexedConnection;

/// Pairs per measured cell.
const PAIRS: u64 = 3_200;
const TASKS: u64 = 64;
const TTL_MS: u64 = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contender {
    Minimum,
    Ours,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Sequential,
    Tasks,
    /// 64 tasks on a multi-thread runtime with 2 workers, as a service runs them.
    Workers,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--cell") {
        let (contender, shape, url) = (&args[at + 1], &args[at + 2], &args[at + 3]);
        let times: u64 = args[at + 4].parse().unwrap_or(1);
        cell(contender, shape, url, times);
        return;
    }
    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!(
            "instructions: valgrind is not installed (Debian: apt-get install valgrind); nothing measured"
        );
        return;
    }
    let server = RedisServer::spawn();
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("no current exe: {e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("no temp dir: {e}"));
    println!("instructions per acquire + release pair (callgrind; client side only)");
    println!("{:<12} {:>12} {:>12} {:>8}", "shape", "minimum", "ours", "ratio");
    for shape in ["sequential", "tasks", "workers"] {
        let minimum = count(&exe, dir.path(), "minimum", shape, &server.url());
        let ours = count(&exe, dir.path(), "ours", shape, &server.url());
        let (minimum, ours) = (minimum as f64 / PAIRS as f64, ours as f64 / PAIRS as f64);
        let label = match shape {
            "tasks" => "64 tasks",
            "workers" => "64 tasks, 2 threads",
            _ => shape,
        };
        println!(
            "{label:<12} {minimum:>12.0} {ours:>12.0} {:>7.3}x",
            ours / minimum
        );
    }
}

/// Runs one cell under callgrind and answers the instructions its `PAIRS` pairs took: those
/// counted inside [`measured`] on one thread; with worker threads (which [`measured`] is not on),
/// every thread's whole run with the pairs done twice less the same run with them done once.
fn count(exe: &Path, dir: &Path, contender: &str, shape: &str, url: &str) -> u64 {
    if shape != "workers" {
        let only_measured = ["--collect-atstart=no", "--toggle-collect=*instructions*measured*"];
        return callgrind(exe, dir, &only_measured, [contender, shape, url, "1"]);
    }
    let all = ["--collect-atstart=yes"];
    let twice = callgrind(exe, dir, &all, [contender, shape, url, "2"]);
    let once = callgrind(exe, dir, &all, [contender, shape, url, "1"]);
    twice.saturating_sub(once)
}

/// The instructions callgrind counted (every thread) for one run of a cell.
fn callgrind(exe: &Path, dir: &Path, options: &[&str], cell: [&str; 4]) -> u64 {
    let name = format!("callgrind.{}.{}.{}", cell[0], cell[1], cell[3]);
    let out = dir.join(&name);
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .args(options)
        .arg("--quiet")
        .arg(exe)
        .arg("--cell")
        .args(cell)
        .status()
        .unwrap_or_else(|e| panic!("cannot run valgrind: {e}"));
    assert!(status.success(), "the cell {cell:?} failed under valgrind");
    let report = std::fs::read_to_string(&out).unwrap_or_else(|e| panic!("no callgrind output: {e}"));
    let _ = std::fs::remove_file(&out);
    report
        .lines()
        .find_map(|l| l.strip_prefix("summary:").or_else(|| l.strip_prefix("totals:")))
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no instruction total in {name}"))
}

/// One cell, in this process: the same work once unmeasured, then [`measured`] `times` times.
fn cell(contender: &str, shape: &str, url: &str, times: u64) {
    let contender = match contender {
        "minimum" => Contender::Minimum,
        _ => Contender::Ours,
    };
    let shape = match shape {
        "sequential" => Shape::Sequential,
        "workers" => Shape::Workers,
        _ => Shape::Tasks,
    };
    let runtime = match shape {
        Shape::Workers => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_current_thread().enable_all().build(),
    }
    .unwrap_or_else(|e| panic!("no runtime: {e}"));
    let ready = runtime.block_on(Ready::connect(contender, url));
    runtime.block_on(ready.pairs(shape, "warm"));
    for _ in 0..times {
        measured(&runtime, &ready, shape);
    }
}

/// What is counted: the pairs of one cell, and nothing else.
#[inline(never)]
fn measured(runtime: &tokio::runtime::Runtime, ready: &Ready, shape: Shape) {
    runtime.block_on(ready.pairs(shape, "counted"));
}

/// A connected contender.
#[derive(Clone)]
enum Ready {
    Minimum(MultiplexedConnection),
    Ours(LockClient, LockOptions),
}

impl Ready {
    async fn connect(contender: Contender, url: &str) -> Ready {
        match contender {
            Contender::Minimum => {
                let client = redis::Client::open(url).unwrap_or_else(|e| panic!("bad url: {e}"));
                let conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap_or_else(|e| panic!("cannot connect: {e}"));
                Ready::Minimum(conn)
            }
            Contender::Ours => {
                let client = LockClient::connect(url)
                    .await
                    .unwrap_or_else(|e| panic!("cannot connect: {e}"));
                Ready::Ours(client, LockOptions::new(Duration::from_millis(TTL_MS)))
            }
        }
    }

    async fn pairs(&self, shape: Shape, round: &str) {
        match shape {
            Shape::Sequential => self.on_key(&format!("{round}:seq"), PAIRS).await,
            Shape::Tasks | Shape::Workers => {
                let tasks: Vec<_> = (0..TASKS)
                    .map(|t| {
                        let (ready, key) = (self.clone(), format!("{round}:task:{t}"));
                        tokio::spawn(async move { ready.on_key(&key, PAIRS / TASKS).await })
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap_or_else(|e| panic!("a task failed: {e}"));
                }
            }
        }
    }

    async fn on_key(&self, key: &str, pairs: u64) {
        for _ in 0..pairs {
            match self {
                Ready::Minimum(conn) => {
                    let mut conn = conn.clone();
                    let lock = format!("lock:{{{key}}}");
                    let token = lock_tests::hand_written::token();
                    let set: Option<String> = redis::cmd("SET")
                        .arg(&lock)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(TTL_MS)
                        .query_async(&mut conn)
                        .await
                        .unwrap_or_else(|e| panic!("SET failed: {e}"));
                    assert!(set.is_some(), "{lock} was held");
                    let deleted: i64 = lock_tests::hand_written::release_script()
                        .key(&lock)
                        .arg(&token)
                        .invoke_async(&mut conn)
                        .await
                        .unwrap_or_else(|e| panic!("release failed: {e}"));
                    assert_eq!(deleted, 1);
                }
                Ready::Ours(client, options) => {
                    let guard = client
                        .acquire(key, options)
                        .await
                        .unwrap_or_else(|e| panic!("acquire failed: {e}"));
                    assert!(guard
                        .release()
                        .await
                        .unwrap_or_else(|e| panic!("release failed: {e}")));
                }
            }
        }
    }
}
