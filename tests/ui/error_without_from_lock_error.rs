use lock_runtime::distributed_lock;

#[derive(Debug)]
struct PayError;

#[distributed_lock(key = "job")]
async fn job() -> Result<(), PayError> {
    Ok(())
}

/// Through an alias, the error type is not spelt out: the whole return type is pointed at.
type PayResult<T> = Result<T, PayError>;

#[distributed_lock(key = "aliased")]
async fn aliased() -> PayResult<u8> {
    Ok(1)
}

fn main() {}
