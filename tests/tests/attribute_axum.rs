//! A guarded fn is an axum handler: key from the `Path` extractor, client from `State`.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use lock_runtime::{distributed_lock, LockClient, LockError, LockOptions};
use tower::ServiceExt;

#[derive(Clone)]
struct App {
    locks: LockClient,
}

struct ApiError(LockError);

impl From<LockError> for ApiError {
    fn from(e: LockError) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self.0 {
            LockError::Busy { .. } => StatusCode::CONFLICT.into_response(),
            other => (StatusCode::SERVICE_UNAVAILABLE, other.to_string()).into_response(),
        }
    }
}

#[distributed_lock(key = "order:<order_id>", client = state.locks, ttl_ms = 5000)]
async fn pay(State(state): State<App>, Path(order_id): Path<u64>) -> Result<String, ApiError> {
    Ok(format!("paid {order_id}"))
}

#[tokio::test]
async fn guarded_handler_serves_and_maps_busy_to_409() {
    let server = lock_tests::RedisServer::spawn();
    let locks = lock_tests::connect(&server.url()).await;
    let app = Router::new()
        .route("/orders/{order_id}/pay", post(pay))
        .with_state(App { locks: locks.clone() });
    let request = || {
        Request::post("/orders/42/pay")
            .body(axum::body::Body::empty())
            .unwrap()
    };

    let ok = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);

    let held = locks
        .acquire("order:42", &LockOptions::new(Duration::from_secs(5)))
        .await
        .unwrap();
    let busy = app.oneshot(request()).await.unwrap();
    assert_eq!(busy.status(), StatusCode::CONFLICT);
    held.release().await.unwrap();
}
