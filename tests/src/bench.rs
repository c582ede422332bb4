//! What the store benchmarks (`benches/postgres.rs`, `benches/etcd.rs`) share: the hand-off run
//! and the statistics of its samples.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};
use tokio::time::Instant;

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
