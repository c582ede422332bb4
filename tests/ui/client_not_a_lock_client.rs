use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", client = 5)]
async fn job() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
