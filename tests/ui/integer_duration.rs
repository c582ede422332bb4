use lock_runtime::{distributed_lock, LockError};

// `ttl` takes a `Duration`; the milliseconds go to `ttl_ms`.
#[distributed_lock(key = "a", ttl = 5000)]
async fn ttl_in_millis() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", ttl_ms = 5000, wait = 250)]
async fn wait_in_millis() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
