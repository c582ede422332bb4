//! What can go wrong, as one line for the operator and an exit code for scripts.

use lock_runtime::LockError;

/// A command that did not succeed.
#[derive(Debug)]
pub(crate) enum Error {
    /// The command line asks for something that needs another flag or value (exit code 2, as
    /// clap's own usage errors).
    Usage(String),
    /// The command ran and failed, or was not confirmed (exit code 1).
    Failed(String),
    /// The lock library refused or failed (exit code 1): the store could not be reached, or
    /// answered with an error.
    Lock(LockError),
    /// Standard output was closed (`lockctl watch | head -3`): stop quietly, successfully.
    Closed,
}

impl Error {
    /// The process's exit code.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            // A bad URL, key or option, found before anything was sent.
            Error::Usage(_)
            | Error::Lock(LockError::InvalidKey { .. } | LockError::InvalidOptions { .. }) => 2,
            Error::Closed => 0,
            Error::Failed(_) | Error::Lock(_) => 1,
        }
    }

    /// One line for stderr; `store` names the store ("Redis"), `at` where it is, without
    /// credentials.
    pub(crate) fn describe(self, store: &str, at: &str) -> String {
        let text = match self {
            Error::Usage(message) | Error::Failed(message) => message,
            Error::Lock(e) => describe_lock_error(&e, store, at),
            Error::Closed => "standard output closed".to_owned(),
        };
        one_line(&text)
    }
}

impl From<LockError> for Error {
    fn from(e: LockError) -> Self {
        Error::Lock(e)
    }
}

/// The library's classification of a store's error (a refusal that only configuration can
/// fix, or a store that cannot be reached), said with where it happened.
fn describe_lock_error(e: &LockError, store: &str, at: &str) -> String {
    match e {
        LockError::Unavailable { source } => format!("cannot reach {store} at {at}: {source}"),
        LockError::Refused { reason, source } => {
            // The library's advice names its builder's methods; say which options do the same.
            let reason = reason
                .replace(".tls_root_ca(…)", "--tls-ca FILE")
                .replace(".tls_client_auth(…)", "--tls-cert FILE --tls-key FILE");
            format!("{store} at {at} refuses lockctl: {reason} ({source})")
        }
        LockError::InvalidOptions { reason } => reason.clone(),
        other => other.to_string(),
    }
}

/// Folds a message onto one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
