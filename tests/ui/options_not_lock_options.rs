use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", options = "watchdog")]
async fn job() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
