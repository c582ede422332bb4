//! Renews a held lock every ttl/3 until it is released or lost.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::guard::LockState;
use crate::options::ceil_millis;
use crate::LockClient;

/// Renews `state`'s lock every ttl/3 (counted from the start of the last successful renewal).
/// Transient errors are retried every ttl/20 while the lock is still valid; the lock is declared
/// lost when its key is gone or holds another token, or when validity runs out first. It never
/// re-creates a missing key (the renew script checks the token). The guard aborts this task
/// before it sends its release.
pub(crate) async fn renew_until_lost(client: LockClient, state: Arc<LockState>, acquired: Instant) {
    let ttl_ms = ceil_millis(state.ttl);
    let interval = state.ttl / 3;
    let retry = (state.ttl / 20).clamp(Duration::from_millis(5), Duration::from_millis(500));
    let mut next = acquired + interval;
    loop {
        tokio::time::sleep_until(next).await;
        loop {
            let sent = Instant::now();
            let valid_until = state.valid_until();
            if sent >= valid_until || state.is_lost() {
                if state.mark_lost() {
                    tracing::warn!(key = %state.key, "lock lost: validity ran out before a renewal succeeded");
                }
                return;
            }
            let renewal = client.backend().renew(&state.keys, &state.token, ttl_ms);
            match tokio::time::timeout_at(valid_until, renewal).await {
                Ok(Ok(true)) => {
                    state.renewed(sent, state.ttl);
                    tracing::trace!(key = %state.key, "lock renewed");
                    next = sent + interval;
                    break;
                }
                Ok(Ok(false)) => {
                    if state.mark_lost() {
                        tracing::warn!(key = %state.key, "lock lost: its key is gone or holds another token");
                    }
                    return;
                }
                Ok(Err(e)) => {
                    tracing::warn!(key = %state.key, error = %e, "lock renewal failed; retrying while the lock is valid");
                    tokio::time::sleep(retry.min(valid_until.saturating_duration_since(Instant::now())))
                        .await;
                }
                Err(_) => {} // validity ran out mid-request: the check above ends the loop
            }
        }
    }
}
