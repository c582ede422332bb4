use lock_runtime::distributed_lock;

#[derive(Debug)]
struct MyError;

#[distributed_lock(key = "job")]
async fn job() -> Result<(), MyError> {
    Ok(())
}

fn main() {}
