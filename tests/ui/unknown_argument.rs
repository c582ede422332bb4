use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", timeout_ms = 1000)]
async fn unknown() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
