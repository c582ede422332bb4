use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job")]
fn not_async() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
