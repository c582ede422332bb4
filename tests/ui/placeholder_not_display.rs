use lock_runtime::{distributed_lock, LockError};

struct Order {
    id: u64,
}

#[distributed_lock(key = "order:<order>")]
async fn pay(order: &Order) -> Result<u64, LockError> {
    Ok(order.id)
}

fn main() {}
