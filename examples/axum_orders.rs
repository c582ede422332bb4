//! An axum service whose `POST /orders/{id}/pay` handler is guarded by `#[distributed_lock]`;
//! see `lock_examples::axum_orders`. `cargo run --example axum_orders -- --port 3000`, then
//! `curl -i -X POST localhost:3000/orders/42/pay` from two terminals at once: one 200, one 409.

use lock_examples::{redis_url, try_redis, Flags};
use lock_runtime::LockClient;

const USAGE: &str = "axum_orders: POST /orders/{id}/pay, guarded by a lock on order:<id>

usage: cargo run --example axum_orders -- [--port N]   (default 3000)

Redis: REDIS_URL (default redis://127.0.0.1:6379), else the in-memory backend.";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::from_env(USAGE);
    let port = flags.number("port", 3000);
    let locks = match try_redis(&redis_url(), "lock:").await {
        Some(client) => client,
        None => LockClient::in_memory(),
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port as u16)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, lock_examples::axum_orders::app(locks.clone()))
        .with_graceful_shutdown(stop_requested())
        .await?;
    // Give back whatever is still held, so the other instances need not wait out the ttls.
    locks.shutdown().await;
    Ok(())
}

/// Ctrl-C, or SIGTERM (what a process manager or Kubernetes sends).
async fn stop_requested() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
