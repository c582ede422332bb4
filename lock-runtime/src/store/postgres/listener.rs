//! The one listening connection of a PostgreSQL client: started by the first waiter, it runs
//! `LISTEN lock_runtime`, hands each release it hears to this client's waiters of that lock
//! (the head of their queue, or the fair waiter it names), and is opened again when it breaks
//! (a restart, `pg_terminate_backend`), after waking every waiter to re-check its lock: a release
//! may have gone unheard meanwhile.

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::watch;

use crate::background::Background;
use crate::store::announcement::Said;
use crate::store::Notices;

/// The channel every release is announced on (the payload names the lock).
pub(super) const CHANNEL: &str = "lock_runtime";

/// The first wait before opening the connection again after it failed; doubled up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The listener task and whether it listens now.
#[derive(Debug)]
pub(super) struct Listener {
    task: Background,
    listening: watch::Sender<bool>,
}

impl Default for Listener {
    fn default() -> Self {
        Listener {
            task: Background::default(),
            listening: watch::Sender::new(false),
        }
    }
}

impl Listener {
    /// Starts the task unless it runs (on this runtime), and completes once it listens.
    pub(super) async fn ensure(&self, pool: impl FnOnce() -> PgPool, notices: &Notices, announcement: &str) {
        let mut listening = self.listening.subscribe();
        if !*listening.borrow_and_update() || !self.task.is_running() {
            let notices = notices.clone();
            let announcement = announcement.to_owned();
            let told = self.listening.clone();
            self.task
                .ensure(move || listen(pool(), notices, announcement, told));
        }
        // Ends when the task says it listens (it never drops its sender while it runs).
        let _ = listening.wait_for(|listening| *listening).await;
    }

    /// Ends the task, and with it the listening connection.
    pub(super) fn stop(&self) {
        self.task.stop();
        self.listening.send_replace(false);
    }
}

/// Listens until the task is aborted (with its client) or its runtime ends.
async fn listen(pool: PgPool, notices: Notices, announcement: String, told: watch::Sender<bool>) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        match open(&pool).await {
            Ok(mut listener) => {
                told.send_replace(true);
                backoff = FIRST_BACKOFF;
                loop {
                    match listener.try_recv().await {
                        Ok(Some(notification)) => {
                            hand_on(notification.payload(), &notices, &announcement);
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(error = %e, "the lock release listener broke");
                            break;
                        }
                    }
                }
                told.send_replace(false);
                // Releases may have gone unheard: every waiter re-checks its lock.
                notices.lost_all();
            }
            Err(e) => tracing::debug!(error = %e, "cannot listen for lock releases"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn open(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // A broken connection ends `try_recv` with `None`; this task opens the next one itself.
    listener.eager_reconnect(false);
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Wakes the waiters a release (`<length>:<message><lock name>`) concerns.
fn hand_on(payload: &str, notices: &Notices, announcement: &str) {
    let Some((said, name)) = split(payload) else {
        tracing::debug!(payload, "a lock release announcement this version does not read");
        return;
    };
    match Said::parse(said.as_bytes()) {
        // A fair release names the next waiter; it may be another client's.
        Said::Turn(waiter) => notices.turn(name, waiter, None),
        // ... or hands it the lock.
        Said::HandedOver(handed, waiter) => notices.turn(name, waiter, Some(handed)),
        // This client's own releases wake its waiters without it.
        Said::Released if said == announcement => {}
        Said::Released => notices.released(name),
    }
}

/// The message and the lock name of a payload.
fn split(payload: &str) -> Option<(&str, &str)> {
    let (length, rest) = payload.split_once(':')?;
    let length: usize = length.parse().ok()?;
    if !rest.is_char_boundary(length) {
        return None;
    }
    Some(rest.split_at(length))
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn a_payload_is_the_message_then_the_channel() {
        assert_eq!(
            split("18:c:00000000000000ablock:{a:b}:released"),
            Some(("c:00000000000000ab", "lock:{a:b}:released"))
        );
        assert_eq!(split("2:w:lock:{k}"), Some(("w:", "lock:{k}")));
        assert_eq!(split("0:x"), Some(("", "x")));
        assert_eq!(split("9:short"), None);
        assert_eq!(split("nonsense"), None);
    }
}
