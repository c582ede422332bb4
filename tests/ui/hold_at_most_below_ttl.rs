use std::time::Duration;

use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl_ms = 30000, watchdog, hold_at_most_ms = 10000)]
async fn below() -> Result<(), LockError> {
    Ok(())
}

const MOST: Duration = Duration::from_secs(600);

#[distributed_lock(key = "job", hold_at_most_ms = 600000, hold_at_most = MOST)]
async fn both() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
