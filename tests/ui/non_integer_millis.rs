use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "a", ttl_ms = "30000")]
async fn string_ttl() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", wait_ms = 1.5)]
async fn float_wait() -> Result<(), LockError> {
    Ok(())
}

const HOLD: u64 = 100;

#[distributed_lock(key = "c", hold_at_least_ms = HOLD)]
async fn const_hold() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
