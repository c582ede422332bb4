//! A rate-limited export worker: several instances of a service pull export jobs for a few
//! tenants, and a tenant may run at most 2 exports at once, across every instance (its
//! warehouse allows 2 connections). Each export holds one of the tenant's permits
//! (`permits = 2`): a third export of the same tenant waits, woken when one finishes, while
//! other tenants' exports run. The run checks that no tenant ever had more than 2 exports at
//! once, and that each one's limit was reached.
//!
//! ```text
//! cargo run --example export_worker -- --instances 3 --jobs 24
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_examples::{delete_keys_under, join_all, one_client_each, redis_url, run_prefix, Flags};
use lock_runtime::{distributed_lock, LockClient, LockError};

const USAGE: &str = "export_worker: exports of each tenant run at most 2 at a time, across instances

usage: cargo run --example export_worker -- [--instances N] [--jobs N]

  --instances N   worker instances, each with its own client (default 3)
  --jobs N        export jobs, spread over 3 tenants (default 24)

Redis: REDIS_URL (default redis://127.0.0.1:6379), else the in-memory backend.";

const TENANTS: u64 = 3;
/// Exports one tenant's warehouse takes at once.
const PER_TENANT: u32 = 2;

/// How many exports of each tenant run now, and the most there ever were.
#[derive(Clone, Default)]
struct Running(Arc<Mutex<BTreeMap<u64, (u32, u32)>>>);

impl Running {
    fn change(&self, tenant: u64, by: i32) {
        let mut tenants = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (now, most) = tenants.entry(tenant).or_default();
        *now = now.saturating_add_signed(by);
        *most = (*most).max(*now);
    }

    fn most(&self) -> BTreeMap<u64, u32> {
        let tenants = self.0.lock().unwrap_or_else(|e| e.into_inner());
        tenants
            .iter()
            .map(|(tenant, (_, most))| (*tenant, *most))
            .collect()
    }
}

/// One export: at most `PER_TENANT` of one tenant at once, renewed while it runs, waiting up to
/// a minute for a permit.
#[distributed_lock(
    key = "export:<tenant>",
    permits = PER_TENANT,
    ttl_ms = 10000,
    watchdog,
    wait_ms = 60000,
    client = locks
)]
async fn export(
    locks: &LockClient,
    running: &Running,
    tenant: u64,
    job: u64,
    instance: u64,
) -> Result<(), LockError> {
    let permit = lock_runtime::current()
        .and_then(|l| l.permit())
        .unwrap_or_default();
    running.change(tenant, 1);
    println!("instance #{instance}: export {job:>2} of tenant {tenant} runs on permit {permit}");
    tokio::time::sleep(Duration::from_millis(40 + 10 * (job % 4))).await; // the export's work
    running.change(tenant, -1);
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::from_env(USAGE);
    let instances = flags.number("instances", 3).max(1);
    let jobs = flags.number("jobs", 24).max(TENANTS * u64::from(PER_TENANT));
    let prefix = run_prefix("export-worker-example");
    let url = redis_url();
    let (clients, on_redis) = one_client_each(instances, &url, &prefix).await;
    println!("{instances} instances run {jobs} exports of {TENANTS} tenants, at most {PER_TENANT} per tenant at once\n");

    let running = Running::default();
    let mut tasks = Vec::new();
    for job in 0..jobs {
        let instance = job % instances;
        let (locks, running) = (clients[instance as usize].clone(), running.clone());
        tasks.push(tokio::spawn(async move {
            export(&locks, &running, job % TENANTS, job, instance).await
        }));
    }
    let outcome = join_all(tasks).await;
    if on_redis {
        delete_keys_under(&url, &prefix).await?;
    }
    outcome?;

    let most = running.most();
    println!("\nmost exports at once, per tenant: {most:?}");
    if most.values().any(|&n| n > PER_TENANT) {
        println!("FAIL: a tenant ran more than {PER_TENANT} exports at once");
        std::process::exit(1);
    }
    if most.values().any(|&n| n < PER_TENANT) {
        println!("FAIL: a tenant never reached its {PER_TENANT} exports at once");
        std::process::exit(1);
    }
    println!("ok: every tenant ran at most {PER_TENANT} exports at once, and reached {PER_TENANT}");
    Ok(())
}
