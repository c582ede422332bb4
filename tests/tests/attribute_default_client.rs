//! The process-wide default client, and `crate = "…"` through a re-export. Its own test binary:
//! the default client is global, so no other test may set it meanwhile.

use std::time::Duration;

use lock_runtime::{distributed_lock, LockClient, LockError, LockOptions};

mod reexport {
    pub use lock_runtime as locks;
}

#[distributed_lock(key = "report:<day>")]
async fn daily_report(day: u32) -> Result<bool, LockError> {
    let client = lock_runtime::default_client().expect("set by the test");
    client.is_locked(&format!("report:{day}")).await
}

#[distributed_lock(key = "renamed", crate = "crate::reexport::locks")]
async fn through_reexport() -> Result<bool, LockError> {
    let client = lock_runtime::default_client().expect("set by the test");
    client.is_locked("renamed").await
}

#[tokio::test]
async fn default_client_is_used_and_its_absence_is_not_configured() {
    assert!(matches!(daily_report(1).await, Err(LockError::NotConfigured)));

    let server = lock_tests::RedisServer::spawn();
    let redis = lock_tests::connect(&server.url()).await;
    lock_runtime::set_default_client(redis.clone());
    assert!(
        daily_report(1).await.unwrap(),
        "held on the default client while running"
    );
    assert!(!redis.is_locked("report:1").await.unwrap());
    assert!(through_reexport().await.unwrap());

    // Replacing the default client takes effect for the next call.
    let memory = LockClient::in_memory();
    lock_runtime::set_default_client(memory.clone());
    let held = memory
        .acquire("report:2", &LockOptions::new(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(matches!(daily_report(2).await, Err(LockError::Busy { .. })));
    held.release().await.unwrap();
    assert!(daily_report(2).await.unwrap());
}
