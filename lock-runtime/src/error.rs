//! The one error type of the crate.

use std::time::Duration;

/// A boxed error from a store (its client crate's error, a timeout).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a lock could not be taken, kept, or released.
///
/// Every variant is cheap to match on; `Unavailable` carries the underlying error as its
/// [`source`](std::error::Error::source). The type is `Send + Sync + 'static`, so `anyhow::Error`
/// and `Box<dyn Error + Send + Sync>` take it with `?`.
///
/// ```
/// use lock_runtime::LockError;
///
/// fn status(e: &LockError) -> u16 {
///     match e {
///         LockError::Busy { .. } => 409,
///         LockError::Lost { .. } => 503,
///         _ => 500,
///     }
/// }
/// assert_eq!(status(&LockError::Busy { key: "order:1".into() }), 409);
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Someone else holds the lock and the wait (if any) ran out.
    #[error("lock `{key}` is held by someone else")]
    Busy {
        /// The user's key, without the prefix.
        key: String,
    },
    /// The lock was lost while the guarded code ran: its key expired, was deleted, or now
    /// holds another token, or its validity ran out without a renewal.
    #[error("lock `{key}` was lost while held")]
    Lost {
        /// The user's key, without the prefix.
        key: String,
    },
    /// The backend could not be reached, timed out, or the connection broke: worth retrying
    /// once Redis is back.
    #[error("lock backend unavailable: {source}")]
    Unavailable {
        /// What went wrong underneath.
        #[source]
        source: BoxError,
    },
    /// The store answered, but refuses this client: a wrong user or password, an ACL (on
    /// PostgreSQL, a role) without a right that locking needs, a database (index) the server
    /// does not have, or a server that forbids scripts. Retrying will not help; the configuration must
    /// change, and `reason` says what to fix.
    #[error("the lock store refuses this client: {reason} ({source})")]
    Refused {
        /// What to fix.
        reason: &'static str,
        /// Redis's own answer.
        #[source]
        source: BoxError,
    },
    /// Fewer replicas than [`wait_for_replicas`](crate::LockClientBuilder::wait_for_replicas)
    /// asked for acknowledged a write within its timeout, so a failover could lose it. From an
    /// acquire: the lock was given back. From [`LockGuard::extend`](crate::LockGuard::extend):
    /// the lock is still held, with the validity it had before (the extend does not count).
    /// Worth retrying once the replicas catch up.
    #[error("lock `{key}`: {acked} of {wanted} replicas acknowledged the write in time")]
    NotReplicated {
        /// The user's key, without the prefix.
        key: String,
        /// How many replicas acknowledged it.
        acked: usize,
        /// How many were asked for.
        wanted: usize,
    },
    /// No `client = …` was given to the attribute and no default client is set
    /// (see [`set_default_client`](crate::set_default_client)).
    #[error("no lock client configured: call lock_runtime::set_default_client or pass `client = …`")]
    NotConfigured,
    /// The key is empty, longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes, or holds a NUL byte
    /// (no store can hold one everywhere; every other character, a newline or only spaces
    /// included, is a key as written, byte for byte).
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// The offending key (cut to 64 bytes when long). The message shows it escaped, as `Debug`
        /// does (`"a\0b"`), so that the character it is about can be seen in a log.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The options cannot work (a zero ttl, a ttl too short for the watchdog, fencing on a client
    /// that cannot offer it, …).
    #[error("invalid lock options: {reason}")]
    InvalidOptions {
        /// What is wrong with them.
        reason: String,
    },
}

impl LockError {
    pub(crate) fn unavailable(source: impl Into<BoxError>) -> Self {
        LockError::Unavailable {
            source: source.into(),
        }
    }

    pub(crate) fn invalid_options(reason: impl Into<String>) -> Self {
        LockError::InvalidOptions {
            reason: reason.into(),
        }
    }

    /// Names `key` (escaped, as `Debug` writes it) in an `InvalidOptions` whose reason does not
    /// already: a refusal says where it happened.
    pub(crate) fn on_key(self, key: &str) -> Self {
        match self {
            LockError::InvalidOptions { reason } if !reason.contains(&format!("{key:?}")) => {
                LockError::InvalidOptions {
                    reason: format!("{reason} for key {key:?}"),
                }
            }
            other => other,
        }
    }

    /// Names the guarded fn (`call`, its path as the attribute wrote it) in an `InvalidOptions`
    /// or `InvalidKey`: the attribute's refusals say which call was refused.
    pub(crate) fn in_call(self, call: &'static str) -> Self {
        match self {
            LockError::InvalidOptions { reason } => LockError::InvalidOptions {
                reason: format!("{reason} in fn {call}"),
            },
            LockError::InvalidKey { key, reason } => LockError::InvalidKey {
                key,
                reason: called(reason, call),
            },
            other => other,
        }
    }
}

/// `reason` and ` in fn <call>`, made once per pair and kept for the program's life: an
/// `InvalidKey`'s reason is a `&'static str`, and there are only as many pairs as guarded fns
/// times the few reasons a key is refused for.
fn called(reason: &'static str, call: &'static str) -> &'static str {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static MADE: OnceLock<Mutex<HashMap<(&'static str, &'static str), &'static str>>> = OnceLock::new();
    let mut made = MADE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    made.entry((reason, call))
        .or_insert_with(|| Box::leak(format!("{reason} in fn {call}").into_boxed_str()))
}

/// The source of [`LockError::Unavailable`] when the store did not answer in time.
#[derive(Debug, thiserror::Error)]
#[error("no answer from the lock backend within {after:?}")]
pub struct TimedOut {
    /// How long we waited.
    pub after: Duration,
}

/// The source of [`LockError::Unavailable`] for an acquire on a client after
/// [`LockClient::shutdown`](crate::LockClient::shutdown).
#[derive(Debug, thiserror::Error)]
#[error("the lock client was shut down")]
pub struct ShutDown;

#[cfg(feature = "axum")]
impl LockError {
    /// The HTTP status a handler that failed with this error answers (the `axum` feature).
    pub fn status(&self) -> http::StatusCode {
        use http::StatusCode;
        match self {
            LockError::Busy { .. } => StatusCode::CONFLICT,
            LockError::Lost { .. } | LockError::Unavailable { .. } | LockError::NotReplicated { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            LockError::InvalidKey { .. } => StatusCode::BAD_REQUEST,
            LockError::Refused { .. } | LockError::NotConfigured | LockError::InvalidOptions { .. } => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }
}

/// With the `axum` feature, a handler can return `Result<T, LockError>` (or convert into it):
/// `409 Conflict` for `Busy`, `503 Service Unavailable` for what is worth retrying (`Lost`,
/// `Unavailable`, `NotReplicated`), `400 Bad Request` for a key made from bad input, and `500`
/// for a misconfiguration, whose details go to the log (as a `tracing` error), not to the caller.
#[cfg(feature = "axum")]
impl axum_core::response::IntoResponse for LockError {
    fn into_response(self) -> axum_core::response::Response {
        let status = self.status();
        let body = if status.is_server_error() && status != http::StatusCode::SERVICE_UNAVAILABLE {
            tracing::error!(error = %self, "lock misconfigured");
            "internal error\n".to_owned()
        } else {
            format!("{self}\n")
        };
        (status, body).into_response()
    }
}

#[cfg(all(test, feature = "axum"))]
mod tests {
    use super::*;
    use axum_core::response::IntoResponse;

    #[test]
    fn http_statuses_say_whose_problem_it_is() {
        let busy = LockError::Busy { key: "k".into() };
        assert_eq!(busy.into_response().status(), 409);
        let down = LockError::unavailable(TimedOut {
            after: std::time::Duration::from_secs(1),
        });
        assert_eq!(down.into_response().status(), 503);
        let bad = LockError::InvalidKey {
            key: String::new(),
            reason: "the key is empty",
        };
        assert_eq!(bad.into_response().status(), 400);
        assert_eq!(LockError::NotConfigured.into_response().status(), 500);
    }
}
