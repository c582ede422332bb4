//! A separate OS process that takes locks, for tests across processes:
//! `lock-worker <redis-url> <key> <name> <log-list> <hold-ms> [fair] [until-sigterm]`.
//!
//! It waits (up to 30 s) for `key`, appends `name` to the Redis list `log-list` while holding
//! it, holds it `hold-ms` more, releases it and exits 0; it exits 1 if it could not take it.
//! With `until-sigterm` it also takes `<key>:renewed` (watchdog) and `<key>:dropped` (its guard
//! dropped at once), prints `held`, and on SIGTERM calls `LockClient::shutdown` and exits 0
//! without releasing anything itself.

use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};
use redis::AsyncCommands;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, key, name, log, hold_ms, rest @ ..] = args.as_slice() else {
        eprintln!("usage: lock-worker <redis-url> <key> <name> <log-list> <hold-ms> [fair]");
        std::process::exit(2);
    };
    let hold = Duration::from_millis(hold_ms.parse().unwrap_or(0));
    let fair = rest.iter().any(|a| a == "fair");
    let until_sigterm = rest.iter().any(|a| a == "until-sigterm");
    let client = match LockClient::connect(url).await {
        Ok(client) => client,
        Err(e) => {
            eprintln!("lock-worker {name}: {e}");
            std::process::exit(1);
        }
    };
    let options = LockOptions::new(Duration::from_secs(10))
        .wait(Duration::from_secs(30))
        .fair(fair);
    let guard = match client.acquire(key, &options).await {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("lock-worker {name}: {e}");
            std::process::exit(1);
        }
    };
    let logged: redis::RedisResult<()> = async {
        let mut raw = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        raw.rpush(log, name).await
    }
    .await;
    if let Err(e) = logged {
        eprintln!("lock-worker {name}: cannot log: {e}");
        std::process::exit(1);
    }
    if until_sigterm {
        hold_until_sigterm(&client, key, guard).await;
        return;
    }
    tokio::time::sleep(hold).await;
    if let Err(e) = guard.release().await {
        eprintln!("lock-worker {name}: {e}");
        std::process::exit(1);
    }
}

/// Holds `first` and two more locks until SIGTERM, then shuts the client down, as a service's
/// signal handler would.
async fn hold_until_sigterm(client: &LockClient, key: &str, first: lock_runtime::LockGuard) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut terminate) = signal(SignalKind::terminate()) else {
        eprintln!("lock-worker: cannot listen for SIGTERM");
        std::process::exit(1);
    };
    let renewed = LockOptions::new(Duration::from_secs(30)).watchdog(true);
    let taken = async {
        let renewed = client.acquire(&format!("{key}:renewed"), &renewed).await?;
        drop(
            client
                .acquire(
                    &format!("{key}:dropped"),
                    &LockOptions::new(Duration::from_secs(60)),
                )
                .await?,
        );
        Ok::<_, lock_runtime::LockError>(renewed)
    };
    let renewed = match taken.await {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("lock-worker: {e}");
            std::process::exit(1);
        }
    };
    println!("held");
    terminate.recv().await;
    client.shutdown().await;
    // The guards are still alive here: shutdown, not their release, gave the locks back.
    drop((first, renewed));
}
