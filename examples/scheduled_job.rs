//! ShedLock-style scheduled jobs: several instances tick the same job every second, their clocks
//! a little apart. The job itself is fast (30 ms), so without a minimum hold the lock is free
//! again by the time a later instance ticks, and the job runs several times in one tick. With
//! `hold_at_least_ms` the lock outlives the job, and each tick runs it once.
//!
//! ```text
//! cargo run --example scheduled_job -- --instances 3 --ticks 4
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_examples::{delete_keys_under, join_all, one_client_each, redis_url, run_prefix, Flags};
use lock_runtime::{distributed_lock, LockClient, LockError};
use tokio::time::Instant;

const USAGE: &str = "scheduled_job: instances tick one job each second; a minimum hold runs it once per tick

usage: cargo run --example scheduled_job -- [--instances N] [--ticks N]

  --instances N   instances ticking the job (default 3)
  --ticks N       seconds to run (default 4)

Redis: REDIS_URL (default redis://127.0.0.1:6379), else the in-memory backend.";

const PERIOD: Duration = Duration::from_secs(1);

/// Which instances ran the job in each tick; shared by the instances.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<BTreeMap<u64, Vec<u64>>>>);

impl Runs {
    fn ticks(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Vec<u64>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, tick: u64, instance: u64) {
        self.ticks().entry(tick).or_default().push(instance);
    }

    fn in_tick(&self, tick: u64) -> Vec<u64> {
        self.ticks().get(&tick).cloned().unwrap_or_default()
    }

    fn total(&self) -> usize {
        self.ticks().values().map(Vec::len).sum()
    }
}

/// The job as often written first: a lock, but none left once the job is done.
#[distributed_lock(key = "job:report:plain", ttl_ms = 5000, client = locks)]
async fn report_plain(locks: &LockClient, runs: &Runs, tick: u64, instance: u64) -> Result<(), LockError> {
    runs.record(tick, instance);
    tokio::time::sleep(Duration::from_millis(30)).await; // the job's work
    Ok(())
}

/// The job with a minimum hold: the lock stays 800 ms after it was taken, however fast the job.
#[distributed_lock(key = "job:report:held", ttl_ms = 5000, hold_at_least_ms = 800, client = locks)]
async fn report_held(locks: &LockClient, runs: &Runs, tick: u64, instance: u64) -> Result<(), LockError> {
    runs.record(tick, instance);
    tokio::time::sleep(Duration::from_millis(30)).await;
    Ok(())
}

/// How far behind the tick this instance's clock fires (0-250 ms), varying by tick.
fn skew(instance: u64, tick: u64) -> Duration {
    let x =
        (instance + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (tick + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    Duration::from_millis((x ^ (x >> 29)) % 250)
}

fn names(instances: &[u64]) -> String {
    if instances.is_empty() {
        return "nobody".to_owned();
    }
    let list: Vec<String> = instances.iter().map(|i| format!("#{i}")).collect();
    list.join(", ")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::from_env(USAGE);
    let instances = flags.number("instances", 3).max(1);
    let ticks = flags.number("ticks", 4).max(1);
    // This run's own lock keys: deleted at the end, with the lock the last tick still holds.
    let prefix = run_prefix("scheduled-job-example");
    let url = redis_url();
    // One client per instance, as separate services would have (in memory: one shared store).
    let (clients, on_redis) = one_client_each(instances, &url, &prefix).await;
    println!(
        "{instances} instances tick the job every {PERIOD:?}, each 0-250 ms late; the job takes 30 ms\n"
    );

    let (plain, held) = (Runs::default(), Runs::default());
    let start = Instant::now() + Duration::from_millis(100);
    let mut tasks = Vec::new();
    for (instance, locks) in clients.into_iter().enumerate() {
        let (plain, held) = (plain.clone(), held.clone());
        tasks.push(tokio::spawn(async move {
            let instance = instance as u64;
            for tick in 1..=ticks {
                tokio::time::sleep_until(start + PERIOD * (tick - 1) as u32 + skew(instance, tick)).await;
                let (a, b) = tokio::join!(
                    report_plain(&locks, &plain, tick, instance),
                    report_held(&locks, &held, tick, instance),
                );
                for outcome in [a, b] {
                    match outcome {
                        Ok(()) | Err(LockError::Busy { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            Ok(())
        }));
    }
    let mut printed = 0;
    while printed < ticks {
        tokio::time::sleep_until(start + PERIOD * printed as u32 + Duration::from_millis(600)).await;
        printed += 1;
        println!(
            "tick {printed}: without a minimum hold ran on {:<14} with hold_at_least_ms = 800 ran on {}",
            names(&plain.in_tick(printed)),
            names(&held.in_tick(printed))
        );
    }
    // Every instance is waited for before the clean-up, also after one failed.
    let outcome = join_all(tasks).await;
    if on_redis {
        delete_keys_under(&url, &prefix).await?;
    }
    outcome?;

    let once_per_tick =
        (1..=ticks).all(|tick| held.in_tick(tick).len() == 1) && held.total() == ticks as usize;
    println!(
        "\nruns in {ticks} ticks: without a minimum hold {}, with hold_at_least_ms {}",
        plain.total(),
        held.total()
    );
    if !once_per_tick {
        println!("FAIL: with a minimum hold the job must run exactly once per tick");
        std::process::exit(1);
    }
    println!("ok: with hold_at_least_ms the job ran exactly once per tick");
    Ok(())
}
