//! One request to ZooKeeper: bounded by the response timeout (the client queues a request made
//! while it is disconnected until it reconnects, and has no timeout of its own), its errors as
//! the library's, naming the ensemble.

use std::future::Future;

use zookeeper_client::Error;

use crate::store::Timeouts;
use crate::LockError;

/// The ensemble a client talks to, as given, and its timeouts.
#[derive(Debug, Clone)]
pub(super) struct Ensemble {
    /// `host:port` of each server.
    pub(super) hosts: Vec<String>,
    /// A chroot after the hosts (`/app`), if one was given.
    pub(super) chroot: Option<String>,
    pub(super) timeouts: Timeouts,
}

impl Ensemble {
    /// The connect string: `host:port,host:port[/chroot]`.
    pub(super) fn connect_string(&self) -> String {
        let mut hosts = self.hosts.join(",");
        if let Some(chroot) = &self.chroot {
            hosts.push_str(chroot);
        }
        hosts
    }

    /// The ensemble as messages name it.
    pub(super) fn shown(&self) -> String {
        self.connect_string()
    }
}

/// What went wrong with the ensemble, in one line naming it: the source of
/// [`LockError::Unavailable`] and [`LockError::Refused`] on ZooKeeper.
#[derive(Debug, thiserror::Error)]
#[error("ZooKeeper at {ensemble}: {what}")]
pub(crate) struct ZooKeeperError {
    ensemble: String,
    what: String,
}

/// A failure of `ensemble`, said in one line.
pub(super) fn unavailable(ensemble: &Ensemble, what: impl Into<String>) -> LockError {
    LockError::unavailable(ZooKeeperError {
        ensemble: ensemble.shown(),
        what: what.into(),
    })
}

/// What a failed request means.
pub(super) fn store_error(ensemble: &Ensemble, error: &Error, path: &str) -> LockError {
    let reason = match error {
        Error::NoAuth => Some(
            "an ACL does not let this client do what locking needs under the prefix (CREATE, \
             READ and DELETE; WRITE on a lock's node for fencing tokens)",
        ),
        Error::Unimplemented => Some("locking needs ZooKeeper 3.5 or later (container nodes)"),
        Error::NoChildrenForEphemerals => Some("the prefix is under an ephemeral node"),
        Error::BadArguments(_) => Some("a path ZooKeeper does not take: check the prefix"),
        Error::AuthFailed => Some("authentication failed"),
        Error::InvalidAcl => Some("an invalid ACL"),
        _ => None,
    };
    let source = ZooKeeperError {
        ensemble: ensemble.shown(),
        what: format!("{error} ({path})"),
    };
    match reason {
        Some(reason) => LockError::Refused {
            reason,
            source: source.into(),
        },
        None => LockError::unavailable(source),
    }
}

/// Why no session could be opened.
pub(super) fn connect_error(ensemble: &Ensemble, error: &Error) -> LockError {
    match error {
        Error::NoHosts => unavailable(ensemble, "no server answered"),
        other => store_error(ensemble, other, "/"),
    }
}

/// Whether the session is gone for good (expired, closed, refused): the next use opens another.
pub(super) fn ends_session(error: &Error) -> bool {
    matches!(
        error,
        Error::SessionExpired | Error::ClientClosed | Error::AuthFailed
    )
}

/// `request`'s answer within the response timeout (ZooKeeper's answer, `NoNode` and all, for
/// the caller to read); a request with no answer in time is `Unavailable` (it may still be
/// applied: the caller's release after it deletes what it made).
pub(super) async fn ask<O>(ensemble: &Ensemble, request: impl Future<Output = O>) -> Result<O, LockError> {
    let within = ensemble.timeouts.response;
    tokio::time::timeout(within, request)
        .await
        .map_err(|_| unavailable(ensemble, format!("no answer within {within:?}")))
}
