//! What replica acknowledgement costs the watchdog (issue 29): 1,000 locks held with the
//! watchdog for a window, on one primary with one replica, by a plain client and by one with
//! `wait_for_replicas(1, 1 s)`, whose every renewal batch is followed by `WAIT`.
//!
//! ```text
//! cargo bench -p lock-tests --bench acked_renewals    # about 40 s
//! ```
//!
//! For each client: locks renewed per renewal script, `WAIT`s per renewal script, this process's
//! CPU time per lock renewal (`/proc/self/stat`), and locks lost, from the primary's `INFO
//! commandstats` over the window. Both clients take turns, 3 rounds each; the figures are the
//! median round. Progress goes to stderr.

use std::time::Duration;

use lock_runtime::{LockClient, LockGuard, LockOptions};
use lock_tests::process::{clock_tick, cpu_time};
use lock_tests::RedisServer;

const LOCKS: usize = 1000;
const TTL: Duration = Duration::from_secs(3);
const WINDOW: Duration = Duration::from_secs(6);
const ROUNDS: usize = 3;

/// One window: (locks renewed per script, WAITs per script, CPU µs per lock renewal, lost).
async fn window(client: &LockClient, primary: &RedisServer, name: &str, tick: f64) -> (f64, f64, f64, usize) {
    const COUNTED: [&str; 4] = ["evalsha", "eval", "pexpire", "wait"];
    let counts = || async {
        let mut counts = [0; 4];
        for (count, command) in counts.iter_mut().zip(COUNTED) {
            *count = primary.command_calls(command).await;
        }
        counts
    };
    let options = LockOptions::new(TTL).watchdog(true);
    let mut guards: Vec<LockGuard> = Vec::with_capacity(LOCKS);
    for i in 0..LOCKS {
        guards.push(
            client
                .acquire(&format!("{name}:{i}"), &options)
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}")),
        );
    }
    let before = counts().await;
    let cpu_before = cpu_time(tick);
    tokio::time::sleep(WINDOW).await;
    let cpu = cpu_time(tick).saturating_sub(cpu_before);
    let after = counts().await;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    for guard in guards {
        let _ = guard.release().await;
    }
    let delta = |i: usize| after[i] - before[i];
    let scripts = delta(0) + delta(1);
    let renewed = delta(2);
    let per = |n: u64, d: u64| if d == 0 { 0.0 } else { n as f64 / d as f64 };
    (
        per(renewed, scripts),
        per(delta(3), scripts),
        cpu.as_secs_f64() * 1e6 / renewed.max(1) as f64,
        lost,
    )
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let primary = RedisServer::spawn();
    let replica = RedisServer::spawn_with_args(["--replicaof", "127.0.0.1", &primary.port().to_string()]);
    let mut raw = primary.raw().await;
    for _ in 0..300 {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut raw)
            .await
            .unwrap_or_default();
        if info.contains("connected_slaves:1") && info.contains("state=online") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let plain = LockClient::builder()
        .url(&primary.url())
        .build()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let acked = LockClient::builder()
        .url(&primary.url())
        .wait_for_replicas(1, Duration::from_secs(1))
        .build()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let tick = clock_tick();
    let mut results: [Vec<(f64, f64, f64, usize)>; 2] = [Vec::new(), Vec::new()];
    for round in 0..ROUNDS {
        for (i, (client, name)) in [(&plain, "plain"), (&acked, "acked")].into_iter().enumerate() {
            eprintln!(
                "round {}/{ROUNDS}: {name}, {LOCKS} locks for {WINDOW:?}",
                round + 1
            );
            results[i].push(window(client, &primary, &format!("{name}{round}"), tick).await);
        }
    }
    println!("{LOCKS} watchdog locks, ttl {TTL:?}, {WINDOW:?} windows, one primary + one replica; median of {ROUNDS} rounds");
    println!("{:<28}{:>12}{:>20}", "", "plain", "wait_for_replicas");
    let column =
        |f: fn(&(f64, f64, f64, usize)) -> f64| results.each_ref().map(|r| median(r.iter().map(f).collect()));
    for (label, values) in [
        ("locks renewed per script", column(|r| r.0)),
        ("WAITs per renewal script", column(|r| r.1)),
        ("client CPU per renewal µs", column(|r| r.2)),
        (
            "locks lost (worst round)",
            results
                .each_ref()
                .map(|r| r.iter().map(|x| x.3 as f64).fold(0.0, f64::max)),
        ),
    ] {
        println!("{label:<28}{:>12.2}{:>20.2}", values[0], values[1]);
    }
    drop(replica);
}
