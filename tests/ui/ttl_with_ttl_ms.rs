use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl_ms = 1000, ttl = std::time::Duration::from_secs(1))]
async fn both() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
