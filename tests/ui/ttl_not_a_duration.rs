use lock_runtime::{distributed_lock, LockError};

const TTL_MS: u64 = 30_000;

#[distributed_lock(key = "job", ttl = TTL_MS)]
async fn job() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
