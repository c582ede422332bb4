use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", on_lost = "retry")]
async fn retry() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
