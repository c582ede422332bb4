use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl_ms = 30, watchdog)]
async fn job() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
