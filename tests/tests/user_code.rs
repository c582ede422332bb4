//! Ordinary user code compiles with the compiler's default limits (issue 23).
//!
//! This file is its own crate, as a user's is, and raises no compiler limit: it keeps the
//! default recursion limit. Each pattern below once failed to build with "queries overflow the
//! depth limit!" (the store's futures nested into every caller's, and proving a spawned task
//! `Send` walked them all). The store's futures are now erased at the store seam, so a caller's
//! future holds a pointer to them, not their whole state machines. Building this file is the
//! test; running it checks that each pattern also does what it says, on the in-memory client.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_runtime::{distributed_lock, LockClient, LockError, LockGuard, LockOptions};

fn options() -> LockOptions {
    LockOptions::new(Duration::from_secs(5))
}

/// The first program a user writes: a helper that acquires and releases, spawned.
async fn job(locks: &LockClient, key: &str) -> bool {
    match locks.acquire(key, &options()).await {
        Ok(g) => g.release().await.unwrap_or(false),
        Err(_) => false,
    }
}

#[tokio::test]
async fn a_spawned_fn_that_acquires_and_releases() {
    let locks = LockClient::in_memory();
    let released = tokio::spawn(async move { job(&locks, "user:spawned").await }).await;
    assert_eq!(released.ok(), Some(true));
}

/// A tonic-style service: an `#[async_trait]` method that acquires and releases by hand.
#[async_trait]
trait Jobs: Send + Sync {
    async fn work(&self, key: &str) -> Result<bool, LockError>;
}

struct Service {
    locks: LockClient,
}

#[async_trait]
impl Jobs for Service {
    async fn work(&self, key: &str) -> Result<bool, LockError> {
        let guard = self.locks.acquire(key, &options()).await?;
        guard.extend(Duration::from_secs(10)).await?;
        guard.release().await
    }
}

#[tokio::test]
async fn an_async_trait_method_that_acquires_and_releases() {
    let service: Arc<dyn Jobs> = Arc::new(Service {
        locks: LockClient::in_memory(),
    });
    let released = tokio::spawn(async move { service.work("user:trait").await }).await;
    assert!(matches!(released, Ok(Ok(true))));
}

#[tokio::test]
async fn a_spawned_run_whose_body_acquires_another_key() {
    let locks = LockClient::in_memory();
    let inner = locks.clone();
    let outcome = tokio::spawn(async move {
        locks
            .run("user:outer", &options(), async {
                let guard = inner.acquire("user:inner", &options()).await?;
                guard.release().await
            })
            .await
    })
    .await;
    assert!(matches!(outcome, Ok(Ok(Ok(true)))));
}

#[distributed_lock(key = "user:guarded:<id>", ttl_ms = 5000, watchdog, client = locks)]
async fn guarded(locks: &LockClient, id: u64) -> Result<bool, LockError> {
    let inner = locks
        .acquire(&format!("user:guarded-inner:{id}"), &options())
        .await?;
    let holder = locks.holder(&format!("user:guarded-inner:{id}")).await?;
    assert!(holder.is_some());
    inner.release().await
}

#[tokio::test]
async fn a_spawned_guarded_fn_that_calls_acquire_inside() {
    let locks = LockClient::in_memory();
    let outcome = tokio::spawn(async move { guarded(&locks, 7).await }).await;
    assert!(matches!(outcome, Ok(Ok(true))));
}

#[tokio::test]
async fn a_guard_held_across_other_awaits() {
    let locks = LockClient::in_memory();
    let checker = locks.clone();
    let outcome = tokio::spawn(async move {
        let guard = locks.acquire("user:across", &options()).await?;
        tokio::task::yield_now().await;
        let held = locks.is_locked("user:across").await?;
        tokio::time::sleep(Duration::from_millis(1)).await;
        let other = locks.acquire("user:across", &options()).await;
        let busy = matches!(other, Err(LockError::Busy { .. }));
        Ok::<_, LockError>((held, busy, guard.release().await?))
    })
    .await;
    assert!(matches!(outcome, Ok(Ok((true, true, true)))));
    assert!(!checker.is_locked("user:across").await.unwrap_or(true));
}

#[tokio::test]
async fn many_guards_in_a_vec_released_in_a_loop() {
    let locks = LockClient::in_memory();
    let outcome = tokio::spawn(async move {
        let mut guards: Vec<LockGuard> = Vec::new();
        for i in 0..16 {
            guards.push(locks.acquire(&format!("user:many:{i}"), &options()).await?);
        }
        let mut released = 0;
        for guard in guards {
            if guard.release().await? {
                released += 1;
            }
        }
        Ok::<_, LockError>(released)
    })
    .await;
    assert!(matches!(outcome, Ok(Ok(16))));
}

mod axum_handler {
    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    use axum::routing::post;
    use axum::Router;
    use lock_runtime::LockClient;

    async fn pay(State(locks): State<LockClient>, Path(id): Path<u64>) -> StatusCode {
        match locks
            .acquire(&format!("user:order:{id}"), &super::options())
            .await
        {
            Ok(guard) => match guard.release().await {
                Ok(_) => StatusCode::OK,
                Err(_) => StatusCode::SERVICE_UNAVAILABLE,
            },
            Err(_) => StatusCode::CONFLICT,
        }
    }

    pub(super) fn app(locks: LockClient) -> Router {
        Router::new()
            .route("/orders/{id}/pay", post(pay))
            .with_state(locks)
    }
}

#[tokio::test]
async fn an_axum_handler_that_acquires_and_releases() {
    use tower::ServiceExt as _;
    let app = axum_handler::app(LockClient::in_memory());
    let request = axum::http::Request::post("/orders/42/pay")
        .body(axum::body::Body::empty())
        .map_err(|e| e.to_string());
    let response = match request {
        Ok(request) => tokio::spawn(app.oneshot(request)).await,
        Err(e) => panic!("request: {e}"),
    };
    assert!(matches!(response, Ok(Ok(r)) if r.status() == axum::http::StatusCode::OK));
}
