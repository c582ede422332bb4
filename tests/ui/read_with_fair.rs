use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "prices", read, fair, wait_ms = 1000)]
async fn read_then_fair() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "prices", fair, wait_ms = 1000, read)]
async fn fair_then_read() -> Result<(), LockError> {
    Ok(())
}

// `fair = false` is no conflict.
#[distributed_lock(key = "prices", read, fair = false)]
async fn unfair_read() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
