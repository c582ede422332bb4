//! Why fencing tokens: a lock holder can be paused (a GC pause, a swapped-out VM, a slow disk)
//! past its ttl without knowing. Meanwhile its lock expires and another holder takes it and
//! writes. When the first one wakes up, it carries on and writes too: no lock can prevent that
//! late write, but storage that remembers the highest fencing token it accepted can refuse it.
//! This prints that story as a timeline.
//!
//! ```text
//! cargo run --example fenced_storage
//! ```

use std::sync::Mutex;
use std::time::Duration;

use lock_examples::{redis_url, try_redis, Flags};
use lock_runtime::{distributed_lock, LockClient, LockError};
use tokio::time::Instant;

const USAGE: &str = "fenced_storage: a paused lock holder's late write, refused by its fencing token

usage: cargo run --example fenced_storage

Redis: REDIS_URL (default redis://127.0.0.1:6379), else the in-memory backend.";

/// Storage that accepts a write only with a token at least as high as any it has seen.
#[derive(Default)]
struct FencedStore {
    state: Mutex<(u64, String)>,
}

impl FencedStore {
    fn write(&self, token: u64, value: &str) -> Result<(), String> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if token < state.0 {
            return Err(format!("token {token} < {} already seen", state.0));
        }
        *state = (token, value.to_owned());
        Ok(())
    }
}

/// Prints what happens, with the time since the start.
struct Timeline {
    start: Instant,
}

impl Timeline {
    fn say(&self, who: &str, what: impl AsRef<str>) {
        println!(
            "{:>6} ms  {who}  {}",
            self.start.elapsed().as_millis(),
            what.as_ref()
        );
    }
}

fn token() -> u64 {
    lock_runtime::current()
        .and_then(|lock| lock.fencing_token())
        .unwrap_or(0)
}

/// Holder A: takes the lock for 300 ms, then is paused for 700 ms before it writes. It does not
/// watch its lock (`on_lost = "continue"`), as code in such a pause cannot.
#[distributed_lock(key = "account:7", ttl_ms = 300, fencing, on_lost = "continue", client = locks)]
async fn holder_a(locks: &LockClient, store: &FencedStore, log: &Timeline) -> Result<bool, LockError> {
    let token = token();
    log.say("A", format!("takes the lock (ttl 300 ms), fencing token {token}"));
    log.say("A", "is paused (a long GC pause) ...");
    tokio::time::sleep(Duration::from_millis(700)).await;
    log.say("A", format!("wakes up and writes balance=50 with token {token}"));
    Ok(match store.write(token, "balance=50") {
        Ok(()) => {
            log.say("A", "write ACCEPTED: the stale holder overwrote B's data");
            true
        }
        Err(why) => {
            log.say("A", format!("write REJECTED by the store: {why}"));
            false
        }
    })
}

/// Holder B: waits for the lock, which it gets once A's lease runs out.
#[distributed_lock(key = "account:7", ttl_ms = 5000, fencing, wait_ms = 5000, client = locks)]
async fn holder_b(locks: &LockClient, store: &FencedStore, log: &Timeline) -> Result<(), LockError> {
    let token = token();
    log.say(
        "B",
        format!("takes the lock after A's lease expired, fencing token {token}"),
    );
    match store.write(token, "balance=90") {
        Ok(()) => log.say("B", format!("writes balance=90 with token {token}: accepted")),
        Err(why) => log.say("B", format!("write rejected: {why}")),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Flags::from_env(USAGE);
    let prefix = "fenced-storage-example:";
    let url = redis_url();
    let (a, b) = match try_redis(&url, prefix).await {
        Some(a) => (
            a,
            try_redis(&url, prefix)
                .await
                .unwrap_or_else(LockClient::in_memory),
        ),
        None => {
            let shared = LockClient::in_memory();
            (shared.clone(), shared)
        }
    };
    let store = FencedStore::default();
    let log = Timeline {
        start: Instant::now(),
    };
    let (a_accepted, b_done) = tokio::join!(holder_a(&a, &store, &log), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        log.say("B", "asks for the lock (waits up to 5 s)");
        holder_b(&b, &store, &log).await
    });
    b_done?;
    let a_accepted = a_accepted?;
    let state = store.state.lock().unwrap_or_else(|e| e.into_inner()).clone();
    println!("\nthe store holds {} (token {})", state.1, state.0);
    if a_accepted {
        println!("FAIL: the paused holder's stale write got through");
        std::process::exit(1);
    }
    println!("ok: the stale write was refused; fencing kept B's write");
    Ok(())
}
