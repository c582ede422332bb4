//! The app of the `axum_orders` example: `POST /orders/{id}/pay`, where the handler is guarded by
//! a lock on `order:<id>` taken from the `Path` extractor, with the client from `State`. A second
//! request for an order being paid gets `409 Conflict`; a repeat after it is paid, `200` with
//! "already paid".

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use lock_runtime::{distributed_lock, LockClient, LockError};

/// The service's state: the lock client and (standing in for a database) the paid orders.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Shared by every request.
    pub locks: LockClient,
    paid: Arc<Mutex<HashSet<u64>>>,
}

/// A handler's failure, as an HTTP response.
#[derive(Debug)]
pub enum ApiError {
    /// The lock said no: its own response (the `axum` feature of lock-runtime): `409 Conflict`
    /// while another request holds the order's lock, `503` when Redis is down or the lock was
    /// lost.
    Lock(LockError),
}

impl From<LockError> for ApiError {
    fn from(e: LockError) -> Self {
        ApiError::Lock(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Lock(e) => e.into_response(),
        }
    }
}

/// Charges an order once, however many requests arrive for it at the same time.
#[distributed_lock(key = "order:<order_id>", ttl_ms = 10000, watchdog, client = state.locks)]
async fn pay(State(state): State<AppState>, Path(order_id): Path<u64>) -> Result<String, ApiError> {
    if state
        .paid
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&order_id)
    {
        return Ok(format!("order {order_id} already paid\n"));
    }
    tokio::time::sleep(Duration::from_millis(200)).await; // the payment gateway
    state
        .paid
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(order_id);
    Ok(format!("order {order_id} paid\n"))
}

/// The router, ready to serve.
pub fn app(locks: LockClient) -> Router {
    Router::new()
        .route("/orders/{order_id}/pay", post(pay))
        .with_state(AppState {
            locks,
            paid: Arc::default(),
        })
}
