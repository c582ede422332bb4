use lock_runtime::{distributed_lock, LockError};

struct Order {
    id: u64,
}

// rustc must not suggest `id` in place of the key literal (that would break the attribute).
#[distributed_lock(key = "order:<order.idd>")]
async fn pay(order: &Order) -> Result<u64, LockError> {
    Ok(order.id)
}

fn main() {}
