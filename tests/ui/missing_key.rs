use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(ttl_ms = 1000)]
async fn no_key() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
