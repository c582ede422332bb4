use lock_runtime::distributed_lock;

#[distributed_lock(key = "count")]
async fn count() -> u32 {
    1
}

fn main() {}
