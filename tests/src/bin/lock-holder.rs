//! A separate OS process that holds a lock, for the tests that freeze or kill a holder's
//! process: `lock-holder <store-url> <prefix> <key> [ttl-ms]` (`etcd://host:port,host:port`,
//! `zk://host:port,host:port`, or any URL `LockClient::connect` takes).
//!
//! It takes `key` (ttl 1.5 s unless given, watchdog, fencing) through `LockClient::run`, prints
//! `held <fencing token>`, then, in the guarded body, prints `tick <unix ms>` every 20 ms. When
//! its lock is lost the body is dropped: it prints `lost` and exits 3 (0 would mean the body
//! ended, which it never does; 1 an error before the lock was taken).

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{LockClient, LockError, LockOptions};

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (url, prefix, key, ttl_ms) = match args.as_slice() {
        [_, url, prefix, key] => (url, prefix, key, 1500),
        [_, url, prefix, key, ttl] => (url, prefix, key, ttl.parse().unwrap_or(1500)),
        _ => {
            eprintln!("usage: lock-holder <store-url> <prefix> <key> [ttl-ms]");
            std::process::exit(2);
        }
    };
    let client = LockClient::builder()
        .store(url)
        .prefix(prefix)
        .response_timeout(Duration::from_millis(500))
        .build()
        .await;
    let client = match client {
        Ok(client) => client,
        Err(e) => {
            eprintln!("lock-holder: {e}");
            std::process::exit(1);
        }
    };
    let options = LockOptions::new(Duration::from_millis(ttl_ms))
        .watchdog(true)
        .fencing(true);
    let body = async {
        let fence = lock_runtime::current().and_then(|held| held.fencing_token());
        say(&format!("held {}", fence.unwrap_or(0)));
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            say(&format!("tick {}", unix_ms()));
        }
    };
    match client.run(key, &options, body).await {
        Ok(()) => {}
        Err(LockError::Lost { .. }) => {
            say("lost");
            std::process::exit(3);
        }
        Err(e) => {
            eprintln!("lock-holder: {e}");
            std::process::exit(1);
        }
    }
}
