//! A separate OS process that takes one lock, for tests across processes:
//! `lock-worker <redis-url> <key> <name> <log-list> <hold-ms> [fair]`.
//!
//! It waits (up to 30 s) for `key`, appends `name` to the Redis list `log-list` while holding
//! it, holds it `hold-ms` more, releases it and exits 0; it exits 1 if it could not take it.

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
    tokio::time::sleep(hold).await;
    if let Err(e) = guard.release().await {
        eprintln!("lock-worker {name}: {e}");
        std::process::exit(1);
    }
}
