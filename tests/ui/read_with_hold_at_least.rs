use std::time::Duration;

use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "report", read, hold_at_least_ms = 60000)]
async fn ms() -> Result<(), LockError> {
    Ok(())
}

const HOLD: Duration = Duration::from_secs(60);

#[distributed_lock(key = "report", hold_at_least = HOLD, read)]
async fn expr() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
