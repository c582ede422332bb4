//! The hand-written minimum the benchmarks measure the library against: `SET key token NX PX
//! ttl` to take a lock, and this compare-and-delete script to give it back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Deletes `KEYS[1]` if it holds `ARGV[1]`; answers 1 when it did.
pub fn release_script() -> &'static redis::Script {
    static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
        redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
        )
    });
    &RELEASE
}

/// A unique token per acquisition: 32 hex digits (a per-process seed and a counter), as cheap
/// as a hand-written lock would make it.
pub fn token() -> String {
    static SEED: LazyLock<u64> = LazyLock::new(|| {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| {
            u64::try_from(d.as_nanos() & u128::from(u64::MAX)).unwrap_or(0)
        })
    });
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{:016x}{:016x}", *SEED, NEXT.fetch_add(1, Ordering::Relaxed))
}
