use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "order:<id>")]
async fn pay(id: u64) -> Result<String, LockError> {
    Ok(__lock_key)
}

fn main() {}
