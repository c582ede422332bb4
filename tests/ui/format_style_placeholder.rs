use lock_runtime::{distributed_lock, LockError};

// `format!` habit: this would be the literal text `order:{id}` on every call.
#[distributed_lock(key = "order:{id}")]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

struct Shop {
    id: u32,
}

impl Shop {
    #[distributed_lock(key = "shop:{self.id}:item:<item>")]
    async fn reserve(&self, item: u32) -> Result<u32, LockError> {
        Ok(self.id + item)
    }
}

#[distributed_lock(key = "debug:{n:?}")]
async fn debug(n: u8) -> Result<u8, LockError> {
    Ok(n)
}

// Braces that name no parameter stay literal text: this one compiles.
#[distributed_lock(key = "{\"tenant\":\"eu\"}:{region}:<n>")]
async fn literal(n: u8) -> Result<u8, LockError> {
    Ok(n)
}

fn main() {}
