use std::time::Duration;

use lock_runtime::{distributed_lock, LockError, LockOptions};

fn options() -> LockOptions {
    LockOptions::new(Duration::from_secs(1))
}

#[distributed_lock(key = "job", options = options(), watchdog)]
async fn both() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
