//! Transfers between accounts, each touching two: several instances move money between 4
//! accounts in random directions, each transfer reading both balances, awaiting (the network
//! hop of a real ledger), and writing both back with the accounts' fencing tokens. With a
//! multi-key lock (`keys = ["account:<from>", "account:<to>"]`) each transfer holds both
//! accounts or neither, two opposite transfers never deadlock, and the total is kept. The same
//! transfers with two single locks taken in request order deadlock whenever two opposite ones
//! meet: each holds one account and waits for the other until its wait runs out (counted).
//!
//! ```text
//! cargo run --example transfer -- --instances 3 --transfers 60
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_examples::{delete_keys_under, one_client_each, redis_url, run_prefix, Flags};
use lock_runtime::{distributed_lock, LockClient, LockError, LockOptions};

const USAGE: &str = "transfer: transfers between two accounts hold both or neither, and never deadlock

usage: cargo run --example transfer -- [--instances N] [--transfers N]

  --instances N   instances, each with its own client (default 3)
  --transfers N   transfers per way of locking (default 60)

Redis: REDIS_URL (default redis://127.0.0.1:6379), else the in-memory backend.";

const ACCOUNTS: u64 = 4;
const OPENING: i64 = 1_000;

/// The ledger's storage: each account's balance and the highest fencing token a write to it
/// carried (a write with a lower one is refused, as a fenced store does).
#[derive(Clone, Default)]
struct Ledger(Arc<Mutex<HashMap<u64, (i64, u64)>>>);

impl Ledger {
    fn open() -> Ledger {
        Ledger(Arc::new(Mutex::new(
            (0..ACCOUNTS).map(|a| (a, (OPENING, 0))).collect(),
        )))
    }

    fn read(&self, account: u64) -> i64 {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&account)
            .map_or(0, |e| e.0)
    }

    /// Writes a balance with a fencing token; whether the ledger accepted it.
    fn write(&self, account: u64, balance: i64, token: u64) -> bool {
        let mut accounts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let entry = accounts.entry(account).or_insert((0, 0));
        if token < entry.1 {
            return false;
        }
        *entry = (balance, token);
        true
    }

    fn total(&self) -> i64 {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|e| e.0)
            .sum()
    }
}

/// Reads both balances, awaits, writes both back with each account's token.
async fn move_money(ledger: &Ledger, (from, to): (u64, u64), amount: i64, tokens: (u64, u64)) {
    let (a, b) = (ledger.read(from), ledger.read(to));
    tokio::time::sleep(Duration::from_millis(2)).await; // the ledger's network hop
    let written = ledger.write(from, a - amount, tokens.0) && ledger.write(to, b + amount, tokens.1);
    if !written {
        println!("a stale write was refused by fencing");
    }
}

/// One transfer holding both accounts: all or none, in one canonical order.
#[distributed_lock(
    keys = ["account:<from>", "account:<to>"],
    ttl_ms = 10000,
    watchdog,
    wait_ms = 10000,
    fencing,
    client = locks
)]
async fn transfer(
    locks: &LockClient,
    ledger: &Ledger,
    from: u64,
    to: u64,
    amount: i64,
) -> Result<(), LockError> {
    let held = lock_runtime::current().ok_or(LockError::NotConfigured)?;
    let from_key = format!("account:{from}");
    let to_key = format!("account:{to}");
    let tokens = (
        held.fencing_token_for(&from_key).unwrap_or(0),
        held.fencing_token_for(&to_key).unwrap_or(0),
    );
    move_money(ledger, (from, to), amount, tokens).await;
    Ok(())
}

/// The same transfer as often written first: two single locks in the order the request names
/// the accounts, each waiting up to 300 ms.
async fn transfer_in_request_order(
    locks: &LockClient,
    ledger: &Ledger,
    (from, to): (u64, u64),
    amount: i64,
) -> Result<(), LockError> {
    let options = LockOptions::new(Duration::from_secs(10))
        .wait(Duration::from_millis(300))
        .fencing(true);
    let first = locks.acquire(&format!("account:{from}"), &options).await?;
    tokio::time::sleep(Duration::from_millis(1)).await; // whatever comes between the two
    let second = match locks.acquire(&format!("account:{to}"), &options).await {
        Ok(second) => second,
        Err(e) => {
            first.release().await?;
            return Err(e);
        }
    };
    let tokens = (
        first.fencing_token().unwrap_or(0),
        second.fencing_token().unwrap_or(0),
    );
    move_money(ledger, (from, to), amount, tokens).await;
    second.release().await?;
    first.release().await?;
    Ok(())
}

/// The transfers' accounts: a fixed pseudo-random sequence, each from one account to another.
fn pairs(n: u64) -> Vec<(u64, u64)> {
    (0..n)
        .map(|i| {
            let x = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let from = (x >> 33) % ACCOUNTS;
            (from, (from + 1 + (x >> 40) % (ACCOUNTS - 1)) % ACCOUNTS)
        })
        .collect()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::from_env(USAGE);
    let instances = flags.number("instances", 3).max(1);
    let transfers = flags.number("transfers", 60).max(2);
    let prefix = run_prefix("transfer-example");
    let url = redis_url();
    let (clients, on_redis) = one_client_each(instances, &url, &prefix).await;
    println!(
        "{instances} instances, {ACCOUNTS} accounts of {OPENING}, {transfers} transfers of 10 each way\n"
    );

    // With a multi-key lock.
    let ledger = Ledger::open();
    let mut tasks = Vec::new();
    for (i, (from, to)) in pairs(transfers).into_iter().enumerate() {
        let (locks, ledger) = (clients[i % clients.len()].clone(), ledger.clone());
        tasks.push(tokio::spawn(async move {
            transfer(&locks, &ledger, from, to, 10).await
        }));
    }
    let mut failed = 0;
    for task in tasks {
        if task.await.map_err(anyhow::Error::from)?.is_err() {
            failed += 1;
        }
    }
    let locked_total = ledger.total();
    println!("keys = [from, to]:        {failed} transfers failed, total {locked_total}");

    // Two single locks in request order.
    let ledger = Ledger::open();
    let mut tasks = Vec::new();
    for (i, pair) in pairs(transfers).into_iter().enumerate() {
        let (locks, ledger) = (clients[i % clients.len()].clone(), ledger.clone());
        tasks.push(tokio::spawn(async move {
            transfer_in_request_order(&locks, &ledger, pair, 10).await
        }));
    }
    let mut timed_out = 0;
    for task in tasks {
        match task.await.map_err(anyhow::Error::from)? {
            Ok(()) => {}
            Err(LockError::Busy { .. }) => timed_out += 1,
            Err(e) => return Err(e.into()),
        }
    }
    println!(
        "two locks, request order: {timed_out} transfers timed out (deadlocked, or queued behind a deadlock), total {}",
        ledger.total()
    );
    if on_redis {
        delete_keys_under(&url, &prefix).await?;
    }
    if failed > 0 || locked_total != OPENING * ACCOUNTS as i64 {
        println!("FAIL: with a multi-key lock every transfer must go through and keep the total");
        std::process::exit(1);
    }
    println!("\nok: with keys = [from, to] every transfer went through and the total was kept");
    Ok(())
}
