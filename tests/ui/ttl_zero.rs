use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl_ms = 0)]
async fn zero() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
