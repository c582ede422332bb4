use std::future::Future;
use std::pin::Pin;

use lock_runtime::{distributed_lock, LockError};

// A boxed future is guarded only in the shape `#[async_trait]` writes: `Box::pin(async move {…})`.
#[distributed_lock(key = "job")]
fn job() -> Pin<Box<dyn Future<Output = Result<(), LockError>> + Send>> {
    let ready = std::future::ready(Ok(()));
    Box::pin(ready)
}

fn main() {}
