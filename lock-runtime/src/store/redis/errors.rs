//! What a Redis error means for a lock: a refusal only a configuration change can fix
//! ([`LockError::Refused`], saying what to fix), or a failure worth retrying
//! ([`LockError::Unavailable`]).

use crate::LockError;

impl From<redis::RedisError> for LockError {
    /// `Refused` when Redis answered with a refusal that only a configuration change can fix,
    /// `Unavailable` for everything else.
    fn from(e: redis::RedisError) -> Self {
        match refusal(&e) {
            Some(reason) => LockError::Refused {
                reason,
                source: e.into(),
            },
            None => LockError::unavailable(e),
        }
    }
}

/// A connection to Redis that could not be opened, in one line naming where it tried: the
/// source of the `Unavailable` or `Refused` it gives.
#[derive(Debug, thiserror::Error)]
#[error("Redis at {address}: cannot connect: {what}")]
pub(crate) struct CannotConnect {
    address: String,
    what: String,
}

/// `e`, met opening a connection to `address`: `Refused` or `Unavailable` as for any Redis
/// error, naming the address.
pub(crate) fn at(e: redis::RedisError, address: &str) -> LockError {
    let source = CannotConnect {
        address: address.to_owned(),
        what: e.to_string(),
    };
    match refusal(&e) {
        Some(reason) => LockError::Refused {
            reason,
            source: source.into(),
        },
        None => LockError::unavailable(source),
    }
}

/// No connection to `address` within `after` (nothing answered: a server down behind a
/// firewall that drops, a wrong host).
pub(crate) fn timed_out(after: std::time::Duration, address: &str) -> LockError {
    LockError::unavailable(CannotConnect {
        address: address.to_owned(),
        what: format!("no connection within {after:?} (is the server up, and the address right?)"),
    })
}

impl From<redis::ParsingError> for LockError {
    /// An answer that did not read as expected: the store is not what it should be.
    fn from(e: redis::ParsingError) -> Self {
        LockError::unavailable(e)
    }
}

/// What to fix, when `e` is Redis refusing this client rather than failing.
fn refusal(e: &redis::RedisError) -> Option<&'static str> {
    use redis::{ErrorKind, ServerErrorKind};
    const CREDENTIALS: &str = "wrong user or password: fix the credentials in the Redis URL";
    const ACL: &str = "the Redis user's ACL lacks a command, key or channel right that locking \
                       needs (see the guide, docs/operating.md, \"Connecting in production\")";
    match e.kind() {
        ErrorKind::AuthenticationFailed => return Some(CREDENTIALS),
        ErrorKind::Server(ServerErrorKind::NoPerm) => return Some(ACL),
        _ => {}
    }
    let code = e.code().unwrap_or_default();
    let text = e.to_string().to_ascii_lowercase();
    if matches!(code, "WRONGPASS" | "NOAUTH") || text.contains("wrongpass") || text.contains("noauth") {
        Some(CREDENTIALS)
    } else if code == "NOPERM"
        || (code != "WRONGTYPE" && (text.contains("noperm") || text.contains("can't run this command")))
    {
        // (The last: a command a script runs that the user may not, as Redis 7 words it.)
        Some(ACL)
    } else if text.contains("db index is out of range") || text.contains("invalid db index") {
        Some("the database index in the Redis URL does not exist on this server")
    } else if text.contains("invalid peer certificate") || text.contains("certificate verify failed") {
        Some("the server's TLS certificate is not trusted here: give the CA that signed it with .tls_root_ca(…)")
    } else if text.contains("certificaterequired") || text.contains("certificate required") {
        Some("the server requires a TLS client certificate: give one with .tls_client_auth(…)")
    } else if text.contains("unknown command") || text.contains("scripts are disabled") {
        Some("this Redis server does not offer the script commands locking needs (EVALSHA, SCRIPT LOAD)")
    } else {
        None
    }
}

/// A `WRONGTYPE` answer: the key holds another type (not a lock of ours).
pub(crate) fn is_wrong_type(e: &crate::BoxError) -> bool {
    e.downcast_ref::<redis::RedisError>()
        .is_some_and(|e| e.code() == Some("WRONGTYPE"))
}
