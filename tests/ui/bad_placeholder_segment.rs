use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "t:<t.99999999999>")]
async fn huge_index(t: (u8,)) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "t:<t.Ⓐ>")]
async fn not_a_field(t: (u8,)) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
