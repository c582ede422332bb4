//! The one error type of the crate.

use std::time::Duration;

/// A boxed error from a backend (the `redis` crate, a timeout, the OS random source).
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
    /// The backend could not be reached, timed out, or answered with an error.
    #[error("lock backend unavailable: {source}")]
    Unavailable {
        /// What went wrong underneath.
        #[source]
        source: BoxError,
    },
    /// No `client = …` was given to the attribute and no default client is set
    /// (see [`set_default_client`](crate::set_default_client)).
    #[error("no lock client configured: call lock_runtime::set_default_client or pass `client = …`")]
    NotConfigured,
    /// The key is empty or longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes.
    #[error("invalid lock key `{key}`: {reason}")]
    InvalidKey {
        /// The offending key (cut to 64 bytes when long).
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
}

impl From<redis::RedisError> for LockError {
    fn from(e: redis::RedisError) -> Self {
        LockError::unavailable(e)
    }
}

/// The source of [`LockError::Unavailable`] when Redis did not answer in time.
#[derive(Debug, thiserror::Error)]
#[error("no answer from the lock backend within {after:?}")]
pub struct TimedOut {
    /// How long we waited.
    pub after: Duration,
}
