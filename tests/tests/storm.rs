//! A cancellation storm: thousands of guarded calls cancelled at random points (timeouts around
//! them, aborted tasks) leave no lock, no queue place, no subscription and no task behind.

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockClient, LockMode};
use lock_tests::{eventually, ttl, Dice, Target, SECOND};

lock_tests::on_both_backends!(a_cancellation_storm_leaves_nothing_behind);

const KEYS: [&str; 8] = ["s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"];
const CALLS: u64 = 10_000;

async fn a_cancellation_storm_leaves_nothing_behind(t: Target) {
    let seed = 0x5eed_u64 ^ u64::from(std::process::id());
    println!("storm seed {seed:#x}");
    let mut dice = Dice::new(seed);
    let clients = Arc::new([t.client(), t.other_client().await]);
    // Warm up: the watchdog and subscriber tasks of both clients exist before the baseline.
    for c in clients.iter() {
        let held = c.acquire("warm", &ttl(60_000).watchdog(true)).await.unwrap();
        let waited = c
            .acquire("warm", &ttl(1000).wait(Duration::from_millis(50)))
            .await;
        assert!(waited.is_err());
        held.release().await.unwrap();
    }
    let metrics = tokio::runtime::Handle::current().metrics();
    let baseline = metrics.num_alive_tasks();

    let mut tasks = Vec::new();
    for call in 0..CALLS {
        let client: LockClient = clients[dice.below(2) as usize].clone();
        let key = KEYS[dice.below(KEYS.len() as u64) as usize];
        // Long leases: a lock left behind would outlive the checks below, not expire first.
        let options = ttl(20_000 + dice.below(10_000))
            .watchdog(dice.below(2) == 0)
            .fencing(dice.below(3) == 0)
            .wait(Duration::from_millis(dice.below(30)));
        // A quarter fair, a quarter shared (a read lock, which cannot be fair), half plain.
        let options = match dice.below(4) {
            0 => options.fair(true),
            1 => options.mode(LockMode::Shared),
            _ => options,
        };
        let cancel_after = Duration::from_micros(dice.below(3000));
        let hold = Duration::from_micros(dice.below(2000));
        let body = async move { tokio::time::sleep(hold).await };
        if call % 2 == 0 {
            // Cancelled by a timeout around it.
            tasks.push(tokio::spawn(async move {
                let _ = tokio::time::timeout(cancel_after, client.run(key, &options, body)).await;
            }));
        } else {
            // Cancelled by aborting its task.
            let task = tokio::spawn(async move {
                let _ = client.run(key, &options, body).await;
            });
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(cancel_after).await;
                task.abort();
            }));
        }
        if tasks.len() >= 200 {
            for task in tasks.drain(..) {
                task.await.unwrap();
            }
        }
    }
    for task in tasks {
        task.await.unwrap();
    }

    eventually(SECOND, "no lock is left held", || async {
        let c = &clients[0];
        let mut free = true;
        for key in KEYS {
            free &= !c.is_locked(key).await.unwrap();
        }
        free
    })
    .await;
    for c in clients.iter() {
        eventually(SECOND, "no waiter, renewal or task is left", || async {
            c.waiting_channels() == 0 && c.watched_locks() == 0 && metrics.num_alive_tasks() <= baseline
        })
        .await;
    }
    if let Some(server) = t.server() {
        // Polled by hand rather than with `eventually`, so that a failure names what was left.
        let deadline = tokio::time::Instant::now() + SECOND;
        loop {
            let keys: Vec<String> = ::redis::cmd("KEYS")
                .arg("lock:*")
                .query_async(&mut server.raw().await)
                .await
                .unwrap();
            let left: Vec<&String> = keys.iter().filter(|k| !k.ends_with(":fence")).collect();
            if left.is_empty() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not within {SECOND:?}: keys other than fencing counters are left in Redis: {left:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        eventually(SECOND, "no channel is left subscribed", || async {
            server.subscribed_channels().await.is_empty()
        })
        .await;
    }
}
