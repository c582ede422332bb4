//! One request to ZooKeeper: bounded by the response timeout (the client queues a request made
//! while it is disconnected until it reconnects, and has no timeout of its own), its errors as
//! the library's, naming the ensemble.

use std::future::Future;

use zookeeper_client::{Acls, Client, Connector, Error};

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
    /// How sessions reach the servers and who they are to them.
    pub(super) access: Access,
}

/// A ZooKeeper `digest` user and password: what a session adds (`addauth digest user:password`,
/// as Curator's `.authorization("digest", …)` does) and what the nodes it creates are then
/// owned by (`digest:user:<hash of the password>`).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Digest {
    user: String,
    password: String,
}

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Digest")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl Digest {
    /// `user` and `password`, if ZooKeeper can tell them apart: the server splits
    /// `user:password` at its first `:`, so a user may not hold one (a password may).
    pub(crate) fn new(user: String, password: String) -> Result<Digest, LockError> {
        if user.is_empty() || user.contains(':') {
            return Err(LockError::invalid_options(format!(
                "ZooKeeper digest user {user:?}: a user is not empty and has no `:`"
            )));
        }
        Ok(Digest { user, password })
    }

    /// What `addauth digest` sends.
    fn credentials(&self) -> Vec<u8> {
        format!("{}:{}", self.user, self.password).into_bytes()
    }
}

/// How sessions reach the servers (TLS or not) and who they are to them (a digest user or
/// nobody).
#[derive(Clone, Default)]
pub(super) struct Access {
    pub(super) digest: Option<Digest>,
    /// TLS to every server, trusting this CA (and presenting a client certificate, if given).
    #[cfg(feature = "tls")]
    pub(super) tls: Option<zookeeper_client::TlsOptions>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("digest", &self.digest)
            .field("tls", &self.is_tls())
            .finish()
    }
}

impl Access {
    /// Whether every server is reached over TLS.
    pub(super) fn is_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// The ACL of every node a session creates: with a digest user, only sessions that added
    /// the same user and password may do anything with it (`creator_all`: Curator's with the
    /// same credentials too); without, anyone may (Curator's default).
    pub(super) fn acls(&self) -> Acls<'static> {
        match self.digest {
            Some(_) => Acls::creator_all(),
            None => Acls::anyone_all(),
        }
    }

    /// A session on `hosts` (a connect string) made by `connector`, with this access.
    pub(super) async fn connect(&self, connector: Connector, hosts: &str) -> Result<Client, Error> {
        let connector = match &self.digest {
            Some(digest) => connector.with_auth("digest", &digest.credentials()),
            None => connector,
        };
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            crate::store::install_crypto_provider();
            return connector.with_tls(tls.clone()).secure_connect(hosts).await;
        }
        connector.connect(hosts).await
    }
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

    /// The ensemble as messages name it (`… over TLS` when it is reached so).
    pub(super) fn shown(&self) -> String {
        match self.access.is_tls() {
            true => format!("{} over TLS", self.connect_string()),
            false => self.connect_string(),
        }
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

impl ZooKeeperError {
    /// `what` went wrong with `ensemble`.
    pub(super) fn new(ensemble: &Ensemble, what: impl Into<String>) -> ZooKeeperError {
        ZooKeeperError {
            ensemble: ensemble.shown(),
            what: what.into(),
        }
    }
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

/// Why no session could be opened, when a server said why (a server that did not is named with
/// what it did instead: see `diagnose`).
pub(super) fn connect_error(ensemble: &Ensemble, error: &Error) -> LockError {
    store_error(ensemble, error, "/")
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
