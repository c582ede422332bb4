//! Measures, on a spawned redis-server, in one run:
//! - the PING round trip (the scale everything else is measured against);
//! - an uncontended acquire + release through `LockClient`, against the hand-written minimum
//!   (one `SET NX PX` and one `EVALSHA` compare-and-delete on a plain connection);
//! - the hand-off: from the holder starting its release to the waiting client holding the lock,
//!   and how many of those waits ended by a nap rather than by the release's wake-up;
//! - the hand-off on one key among 8 clients (one task each: acquire with a wait, hold 1 ms,
//!   release), not fair and fair, on Redis and in memory (8 clones of one in-memory client, as 8
//!   tasks of a process share it): from a release's start to the next holder's lock, and the
//!   waits that ended by a nap.
//!
//! `cargo bench -p lock-tests --bench handoff` (add `-- N` for N samples, default 1000).

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockOptions};
use lock_tests::bench::{handoffs, Naps};
use lock_tests::RedisServer;

fn summary(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{name:<44} n={:<5} median {:>9.1?}  p99 {:>9.1?}  max {:>9.1?}",
        samples.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let naps = Naps::install();
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1000);
    let server = RedisServer::spawn();
    let url = server.url();
    let mut raw = server.raw().await;
    let holder = LockClient::connect(&url).await.unwrap();
    let waiter = LockClient::connect(&url).await.unwrap();
    let options = LockOptions::new(Duration::from_secs(10));

    // Warm up connections and script caches.
    for _ in 0..100 {
        holder
            .acquire("warm", &options)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }

    let mut ping = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut raw).await.unwrap();
        ping.push(t.elapsed());
    }

    let release = lock_tests::hand_written::release_script();
    let mut minimum = Vec::with_capacity(n);
    for i in 0..n {
        let token = format!("{i:032x}");
        let t = Instant::now();
        let set: Option<String> = redis::cmd("SET")
            .arg("raw:{k}")
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(10_000)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(set.is_some());
        let deleted: i64 = release
            .key("raw:{k}")
            .arg(&token)
            .invoke_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(deleted, 1);
        minimum.push(t.elapsed());
    }

    let mut ours = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let guard = holder.acquire("uncontended", &options).await.unwrap();
        assert!(guard.release().await.unwrap());
        ours.push(t.elapsed());
    }

    let mut handoff = Vec::with_capacity(n);
    let waiting = options.clone().wait(Duration::from_secs(10));
    naps.take();
    for _ in 0..n {
        let guard = holder.acquire("handoff", &options).await.unwrap();
        let next = tokio::spawn({
            let (waiter, waiting) = (waiter.clone(), waiting.clone());
            async move {
                let guard = waiter.acquire("handoff", &waiting).await.unwrap();
                (Instant::now(), guard)
            }
        });
        // The waiter was refused, listens for the release and has asked again, which left the
        // waiting mark: from here it sleeps (its nap is up to 2 s) until the release wakes it,
        // and the hand-off measures the wake-up alone, not the waiter's own setup.
        lock_tests::joined_line(&waiter, "handoff", 0).await;
        server.waiter_refused("handoff").await;
        let released = Instant::now();
        assert!(guard.release().await.unwrap());
        let (acquired, guard) = next.await.unwrap();
        handoff.push(acquired - released);
        guard.release().await.unwrap();
    }

    println!("redis-server on loopback, {n} samples each");
    summary("PING round trip", ping);
    summary("hand-written SET NX PX + EVALSHA release", minimum);
    summary("LockClient acquire + release (uncontended)", ours);
    summary("hand-off: release start -> waiter holds", handoff);
    println!("hand-off waits that ended by a nap: {}", naps.take());

    let mut redis = Vec::new();
    for _ in 0..8 {
        redis.push(LockClient::connect(&url).await.unwrap());
    }
    let memory = vec![LockClient::in_memory(); 8];
    println!("\nhand-off, 8 clients on one key, {n} hand-offs each (release start -> next holder)");
    for (store, clients) in [("Redis", &redis), ("memory", &memory)] {
        handoffs(clients, "warm", 32, false).await;
        for fair in [false, true] {
            naps.take();
            let samples = handoffs(clients, if fair { "fair" } else { "plain" }, n, fair).await;
            let napped = naps.take();
            let name = format!("{store}{}", if fair { ", fair" } else { "" });
            summary(&name, samples);
            println!("{:<44} {napped} waits ended by a nap", "");
        }
    }
}
