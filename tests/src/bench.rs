//! What the store benchmarks (`benches/postgres.rs`, `benches/etcd.rs`, `benches/mysql.rs`,
//! `benches/zookeeper.rs`) share: the interleaved rounds of pairs, the hand-off run and the
//! statistics of their samples.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use tokio::time::Instant;

/// Waits that ended by a nap rather than by a wake-up, on every store (the library's
/// `lock_wait_naps_total`), read through a debugging recorder the bench installs once: the
/// column every hand-off table shows (0 is the goal: each release wakes the waiter it admits).
pub struct Naps(Snapshotter);

impl Naps {
    /// Installs the recorder; once per bench process (it is the process's only one).
    pub fn install() -> Naps {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .unwrap_or_else(|e| panic!("the bench's recorder: {e}"));
        Naps(snapshotter)
    }

    /// The waits a nap ended since the last call (a snapshot resets the recorder's counters).
    pub fn take(&self) -> u64 {
        self.0
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| {
                key.kind() == MetricKind::Counter && key.key().name() == "lock_wait_naps_total"
            })
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => n,
                _ => 0,
            })
            .sum()
    }
}

/// `$BENCH_SCALE` (default 1): how much of a full run to do (`0.1` for a smoke run).
pub fn scale() -> f64 {
    std::env::var("BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0)
}

/// Prints the table of [`one_task_rounds`] and [`many_task_rounds`] (a row per contender, in
/// `names`' order: latency median and p99, pairs/s with one task and with many) and returns the
/// same rows as JSON.
pub fn pair_rows(names: &[&str], one: &mut OneTask, many: &mut ManyTasks) -> Vec<serde_json::Value> {
    println!(
        "\n{:<28} {:>10} {:>10} {:>10} {:>12}",
        "one task", "median", "p99", "pairs/s", "64 tasks/s"
    );
    let mut rows = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let (p50, p99) = (
            quantile(&mut one.latency[i], 0.5),
            quantile(&mut one.latency[i], 0.99),
        );
        let (alone, wide) = (median(&mut one.rate[i]), median(&mut many.rate[i]));
        println!(
            "{name:<28} {:>8.3}ms {:>8.3}ms {alone:>10.0} {wide:>12.0}",
            ms(p50),
            ms(p99),
        );
        rows.push(
            serde_json::json!({"contender": name, "median_ms": ms(p50), "p99_ms": ms(p99),
            "pairs_per_s": alone, "pairs_per_s_64_tasks": wide}),
        );
    }
    rows
}

/// The `q` quantile of `samples` (sorted in place).
pub fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    samples[((samples.len() as f64 - 1.0) * q).round() as usize]
}

/// The median of `values` (sorted in place).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// What [`one_task_rounds`] measured, per contender (by index).
#[derive(Debug, Default)]
pub struct OneTask {
    /// Every pair's latency.
    pub latency: Vec<Vec<Duration>>,
    /// Pairs per second, one figure per round.
    pub rate: Vec<Vec<f64>>,
    /// Contender 0's rate over contender 1's, one figure per round.
    pub ratio: Vec<f64>,
}

/// `rounds` rounds in which each of `contenders` in turn (a different one first each round)
/// does `per_round` sequential pairs on key 0: `pair(contender, key)`.
pub async fn one_task_rounds<F, Fut>(contenders: usize, rounds: usize, per_round: usize, pair: F) -> OneTask
where
    F: Fn(usize, usize) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut out = OneTask {
        latency: vec![Vec::new(); contenders],
        rate: vec![Vec::new(); contenders],
        ratio: Vec::new(),
    };
    for round in 0..rounds {
        let mut round_rate = vec![0.0; contenders];
        for turn in 0..contenders {
            let i = (turn + round) % contenders;
            let started = Instant::now();
            for _ in 0..per_round {
                let t = Instant::now();
                pair(i, 0).await;
                out.latency[i].push(t.elapsed());
            }
            round_rate[i] = per_round as f64 / started.elapsed().as_secs_f64();
            out.rate[i].push(round_rate[i]);
        }
        out.ratio.push(round_rate[0] / round_rate[1]);
    }
    out
}

/// What [`many_task_rounds`] measured: pairs per second per contender (one figure per round),
/// and contender 0's over contender 1's per round.
#[derive(Debug, Default)]
pub struct ManyTasks {
    pub rate: Vec<Vec<f64>>,
    pub ratio: Vec<f64>,
}

/// `rounds` rounds in which each of `contenders` in turn runs `tasks` tasks for `window`, task
/// `k` doing pairs on key `k`: `pair(contender, key)`.
pub async fn many_task_rounds<F, Fut>(
    contenders: usize,
    rounds: usize,
    tasks: usize,
    window: Duration,
    pair: Arc<F>,
) -> ManyTasks
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let mut out = ManyTasks {
        rate: vec![Vec::new(); contenders],
        ratio: Vec::new(),
    };
    for round in 0..rounds {
        let mut round_rate = vec![0.0; contenders];
        for turn in 0..contenders {
            let i = (turn + round) % contenders;
            let done = Arc::new(AtomicU64::new(0));
            let until = Instant::now() + window;
            let running: Vec<_> = (0..tasks)
                .map(|k| {
                    let (pair, done) = (Arc::clone(&pair), Arc::clone(&done));
                    tokio::spawn(async move {
                        while Instant::now() < until {
                            pair(i, k).await;
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                })
                .collect();
            let started = Instant::now();
            for task in running {
                task.await
                    .unwrap_or_else(|e| panic!("a benchmark task failed: {e}"));
            }
            round_rate[i] = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
            out.rate[i].push(round_rate[i]);
        }
        out.ratio.push(round_rate[0] / round_rate[1]);
    }
    out
}

/// `count` hand-offs of `key` among `clients` (one task each): each acquires with a wait (ttl
/// 10 s, `fair` as asked), holds it 1 ms and releases. Each sample runs from a release's start
/// to the next holder's lock.
pub async fn handoffs(clients: &[LockClient], key: &str, count: usize, fair: bool) -> Vec<Duration> {
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let seen: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let left = Arc::new(AtomicU64::new(count as u64));
    let options = LockOptions::new(Duration::from_secs(10))
        .wait(Duration::from_secs(30))
        .fair(fair);
    let tasks: Vec<_> = clients
        .iter()
        .cloned()
        .map(|client| {
            let (released_at, seen, left, options, key) = (
                Arc::clone(&released_at),
                Arc::clone(&seen),
                Arc::clone(&left),
                options.clone(),
                key.to_owned(),
            );
            tokio::spawn(async move {
                while left.load(Ordering::SeqCst) > 0 {
                    let guard = client
                        .acquire(&key, &options)
                        .await
                        .unwrap_or_else(|e| panic!("a hand-off's acquire failed: {e}"));
                    let now = Instant::now();
                    let released = released_at.lock().unwrap_or_else(|e| e.into_inner()).take();
                    if let Some(at) = released {
                        // Counted while hand-offs are left (waiters that got in after the last
                        // one just give the lock back).
                        if left
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                            .is_ok()
                        {
                            seen.lock().unwrap_or_else(|e| e.into_inner()).push(now - at);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    *released_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                    let released = guard
                        .release()
                        .await
                        .unwrap_or_else(|e| panic!("a hand-off's release failed: {e}"));
                    assert!(released, "a hand-off's lock was lost");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await
            .unwrap_or_else(|e| panic!("a hand-off task failed: {e}"));
    }
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    seen
}
