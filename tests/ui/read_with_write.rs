use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "prices", read, write)]
async fn both() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "prices", write, read = false)]
async fn both_spelt_out() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "prices", write = false)]
async fn not_write() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
