use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl_ms = 1000, ttl_ms = 2000)]
async fn twice() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
