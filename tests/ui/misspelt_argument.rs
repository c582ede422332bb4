use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", ttl_msec = 5000)]
async fn ttl() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", wachdog)]
async fn watchdog() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", reads)]
async fn reads() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
