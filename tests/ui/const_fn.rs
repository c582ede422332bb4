use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job")]
const async fn constant() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
