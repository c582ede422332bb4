use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "export", permits = 4, read)]
async fn permits_then_read() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "export", write, permits = 4)]
async fn write_then_permits() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "export", permits = 0)]
async fn no_permits() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "export", permits = 5000)]
async fn too_many() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "export", permits = "4")]
async fn not_a_number() -> Result<(), LockError> {
    Ok(())
}

// An expression is checked by the compiler, and by the runtime.
const EXPORTS: u32 = 4;
#[distributed_lock(key = "export", permits = EXPORTS)]
async fn from_a_const() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
