use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "order:<order_id>")]
async fn pay(id: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
