use std::time::Duration;

use lock_runtime::{distributed_lock, LockError, LockOptions};

fn options() -> LockOptions {
    LockOptions::new(Duration::from_secs(1))
}

#[distributed_lock(key = "prices", options = options(), read)]
async fn read() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "prices", write, options = options())]
async fn write() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
