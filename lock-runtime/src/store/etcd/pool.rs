//! The connections of an etcd client: one etcd-client `Client` per member, requests pinned to one
//! member at a time (as etcd's own Go client pins its balancer). A request that never reached
//! its member (the connection was refused, or the member has no leader) is sent to the next one
//! at once; one that timed out moves the pin for the next request but is not sent again (it may
//! have been applied). etcd-client's balanced channel would instead keep sending a share of the
//! requests to a member that is down.
//!
//! Credentials (etcd's user and password) and TLS (`https://` members, a private CA, a client
//! certificate) are set here; what etcd answers or why it could not is said in one line naming
//! the member ([`EtcdError`]), not as a gRPC dump.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, Txn, TxnResponse};
use tokio::time::Instant;

use crate::background::Background;
use crate::store::{Timeouts, TlsMaterial};
use crate::LockError;

/// gRPC status codes this store tells apart (`tonic::Code` as `i32`).
const INVALID_ARGUMENT: i32 = 3;
const NOT_FOUND: i32 = 5;
const PERMISSION_DENIED: i32 = 7;
const UNAVAILABLE: i32 = 14;
const UNAUTHENTICATED: i32 = 16;

/// etcd's own answers (its `rpctypes`) that this client acts on.
const NO_LEADER: &str = "etcdserver: no leader";
const USER_EMPTY: &str = "etcdserver: user name is empty";
const AUTH_FAILED: &str = "etcdserver: authentication failed";
const LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";

/// Who this client is to etcd, and how it reaches the members.
#[derive(Clone, Default)]
pub(super) struct Access {
    /// etcd's user and password (its auth), if any.
    pub(super) user: Option<(String, String)>,
    /// The private CA and client certificate for `https://` members.
    pub(super) tls: TlsMaterial,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a password.
        f.debug_struct("Access")
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .field("tls", &self.tls)
            .finish()
    }
}

/// What went wrong with one etcd member, in one line: the source of
/// [`LockError::Unavailable`] and [`LockError::Refused`] on etcd.
#[derive(Debug, thiserror::Error)]
#[error("etcd at {endpoint}: {what}")]
pub struct EtcdError {
    endpoint: String,
    what: String,
}

/// How an etcd request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// It never reached a member that could apply it: the connection could not be made, or the
    /// member has no leader. Safe to send elsewhere.
    NotSent,
    /// etcd refused this client: credentials or rights.
    Refused(&'static str),
    /// The lease named does not exist (it ended, or was revoked).
    LeaseNotFound,
    /// Anything else: the request may or may not have been applied.
    Failed,
}

/// The gRPC status of an etcd error, if it is one.
fn status(e: &etcd_client::Error) -> Option<&tonic::Status> {
    match e {
        etcd_client::Error::GRpcStatus(status) => Some(status),
        _ => None,
    }
}

/// The kind of the innermost I/O error under `e`, if any (a refused connection, a reset).
fn io_kind(e: &etcd_client::Error) -> Option<std::io::ErrorKind> {
    let mut at: Option<&(dyn std::error::Error + 'static)> = match e {
        // etcd-client's error gives no source: its status does.
        etcd_client::Error::GRpcStatus(status) => Some(status),
        etcd_client::Error::TransportError(e) => Some(e),
        other => Some(other),
    };
    let mut kind = None;
    while let Some(e) = at {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            kind = Some(io.kind());
        }
        at = e.source();
    }
    kind
}

/// What the request's failure was.
fn failure(e: &etcd_client::Error) -> Failure {
    use std::io::ErrorKind;
    if let etcd_client::Error::LeaseKeepAliveError(_) = e {
        return Failure::LeaseNotFound;
    }
    let connect_failed = matches!(
        io_kind(e),
        Some(ErrorKind::ConnectionRefused | ErrorKind::AddrNotAvailable | ErrorKind::NotFound)
    );
    let Some(status) = status(e) else {
        return if connect_failed {
            Failure::NotSent
        } else {
            Failure::Failed
        };
    };
    let said = status.message();
    match i32::from(status.code()) {
        UNAVAILABLE if said == NO_LEADER || connect_failed => Failure::NotSent,
        UNAUTHENTICATED => Failure::Refused(CREDENTIALS),
        INVALID_ARGUMENT if said == USER_EMPTY || said.starts_with(AUTH_FAILED) => {
            Failure::Refused(CREDENTIALS)
        }
        PERMISSION_DENIED => Failure::Refused(
            "the etcd user lacks a right locking needs: read and write on the keys under the lock prefix",
        ),
        NOT_FOUND if said == LEASE_NOT_FOUND => Failure::LeaseNotFound,
        _ => Failure::Failed,
    }
}

const CREDENTIALS: &str = "etcd asks for an etcd user's name and password: give them in the endpoint \
     (`etcd://user:password@host:2379`) or with `LockClientBuilder::etcd_user`";

/// What to say about `e` from `endpoint`, in one line.
fn describe(endpoint: &str, e: &etcd_client::Error) -> EtcdError {
    let what = match (failure(e), status(e)) {
        (Failure::NotSent, Some(status)) if status.message() == NO_LEADER => {
            "the member has no leader (a majority of the cluster is down or cut off from it)".to_owned()
        }
        (Failure::NotSent, _) => {
            let why = io_kind(e).map_or_else(|| "no connection".to_owned(), |kind| kind.to_string());
            format!("cannot be reached ({why}): check that etcd runs there, or list more members")
        }
        (_, Some(status)) => format!("{} ({:?})", status.message(), status.code()),
        (_, None) => {
            let why = io_kind(e).map_or_else(|| e.to_string(), |kind| kind.to_string());
            format!("the connection failed ({why})")
        }
    };
    EtcdError {
        endpoint: crate::redact::hide_credentials(endpoint),
        what,
    }
}

/// One client per member, and which member requests go to.
pub(super) struct Pool {
    endpoints: Vec<String>,
    pub(super) timeouts: Timeouts,
    access: Access,
    /// Each member's client, made on the runtime that first needed it (made again if that
    /// runtime has gone: its connections went with it).
    clients: Mutex<Vec<Option<Client>>>,
    runtime: Background,
    pinned: AtomicUsize,
    /// The pin moved since the leader was last looked for (or never was).
    look_for_leader: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let endpoints: Vec<String> = self
            .endpoints
            .iter()
            .map(|e| crate::redact::hide_credentials(e))
            .collect();
        f.debug_struct("Pool")
            .field("endpoints", &endpoints)
            .field("timeouts", &self.timeouts)
            .field("access", &self.access)
            .field("pinned", &self.pinned)
            .finish_non_exhaustive()
    }
}

/// A request's error as this client reports it: `Refused` when etcd refused this client,
/// `Unavailable` for everything else, naming the member.
pub(super) fn store_error(endpoint: &str, e: &etcd_client::Error) -> LockError {
    let said = describe(endpoint, e);
    match failure(e) {
        Failure::Refused(reason) => LockError::Refused {
            reason,
            source: said.into(),
        },
        _ => LockError::unavailable(said),
    }
}

/// Whether etcd said the lease does not exist (it ended, or was revoked).
pub(super) fn lease_not_found(e: &LockError) -> bool {
    matches!(e, LockError::Unavailable { source } if source.downcast_ref::<NoLease>().is_some())
}

/// A lease operation's answer: `true` done, `false` if the lease had ended already.
fn lease_found<T>(answer: Result<T, LockError>) -> Result<bool, LockError> {
    match answer {
        Ok(_) => Ok(true),
        Err(e) if lease_not_found(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The source of [`LockError::Unavailable`] for a lease etcd does not have.
#[derive(Debug, thiserror::Error)]
#[error("etcd at {0}: the lease has ended")]
pub(super) struct NoLease(String);

impl Pool {
    pub(super) fn new(endpoints: Vec<String>, timeouts: Timeouts, access: Access) -> Self {
        let clients = endpoints.iter().map(|_| None).collect();
        Pool {
            endpoints,
            timeouts,
            access,
            clients: Mutex::new(clients),
            runtime: Background::default(),
            pinned: AtomicUsize::new(rand::random_range(0..usize::MAX / 2)),
            look_for_leader: std::sync::atomic::AtomicBool::new(true),
        }
    }

    fn slots(&self) -> MutexGuard<'_, Vec<Option<Client>>> {
        // Every update is one step, so a poisoned slot is still consistent.
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The endpoint of the member at pin `at`.
    pub(super) fn endpoint(&self, at: usize) -> &str {
        &self.endpoints[at % self.endpoints.len()]
    }

    /// The TLS settings of an `https://` member.
    #[cfg(feature = "tls")]
    fn tls(&self, endpoint: tonic::transport::Endpoint) -> Result<tonic::transport::Endpoint, String> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let mut tls = ClientTlsConfig::new().with_webpki_roots();
        if let Some(ca) = &self.access.tls.root_ca {
            tls = tls.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &self.access.tls.client_auth {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        endpoint.tls_config(tls).map_err(|e| e.to_string())
    }

    #[cfg(not(feature = "tls"))]
    fn tls(&self, _: tonic::transport::Endpoint) -> Result<tonic::transport::Endpoint, String> {
        Err("https:// needs the `tls` feature of lock-runtime".to_owned())
    }

    /// The pinned member and its client (made lazily: etcd-client connects on the first request).
    pub(super) async fn pinned(&self) -> Result<(usize, Client), LockError> {
        let at = self.pinned.load(Ordering::Relaxed);
        let member = at % self.endpoints.len();
        {
            let mut slots = self.slots();
            if !self.runtime.is_running() {
                slots.iter_mut().for_each(|slot| *slot = None);
                self.runtime.replace(std::future::pending);
            }
            if let Some(client) = &slots[member] {
                return Ok((at, client.clone()));
            }
        }
        let url = &self.endpoints[member];
        let bad = |why: String| {
            LockError::invalid_options(format!("{}: {why}", crate::redact::hide_credentials(url)))
        };
        // A plain channel, connected lazily: a member that is down fails the request at once
        // (as not sent), where a balanced channel would hold it until the member is back.
        let mut endpoint = tonic::transport::Endpoint::from_shared(url.clone())
            .map_err(|e| bad(e.to_string()))?
            .connect_timeout(self.timeouts.connect)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(self.timeouts.response.max(Duration::from_secs(1)));
        if url.starts_with("https://") {
            endpoint = self.tls(endpoint).map_err(bad)?;
        }
        let channel = endpoint.connect_lazy();
        // A member cut off from its leader refuses at once, and the next one is asked.
        let mut options = ConnectOptions::new().with_require_leader(true);
        if let Some((user, password)) = &self.access.user {
            options = options
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        // With credentials, this authenticates (a request to the member, within the timeout).
        let made = tokio::time::timeout(
            self.timeouts.response,
            Client::from_channel(etcd_client::Channel::Tonic(channel), Some(options)),
        )
        .await
        .map_err(|_| self.timed_out(at))?
        .map_err(|e| {
            if failure(&e) == Failure::NotSent {
                self.unpin(at);
            }
            store_error(url, &e)
        })?;
        let mut slots = self.slots();
        let client = slots[member].get_or_insert(made).clone();
        Ok((at, client))
    }

    /// Requests go to the next member from now on (unless another request moved them already).
    pub(super) fn unpin(&self, at: usize) {
        let moved =
            self.pinned
                .compare_exchange(at, at.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed);
        if moved.is_ok() {
            self.look_for_leader.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the leader should be looked for (once after each move of the pin); asked once.
    pub(super) fn should_look_for_leader(&self) -> bool {
        self.look_for_leader.swap(false, Ordering::Relaxed)
    }

    /// The cluster's version and, when one of the endpoints is the leader's, a pin on it (a
    /// write sent to a follower is forwarded to the leader: one hop more, on every request).
    pub(super) async fn status_and_leader(&self) -> Result<String, LockError> {
        let status = self
            .ask(|client| async move { client.maintenance_client().status().await })
            .await?;
        let leader = status.leader();
        let members = self
            .ask(|client| async move { client.cluster_client().member_list().await })
            .await;
        let authority = |url: &str| {
            let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
            let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
            rest.trim_end_matches('/').to_ascii_lowercase()
        };
        if let Ok(members) = members {
            let urls: Vec<String> = members
                .members()
                .iter()
                .filter(|m| m.id() == leader)
                .flat_map(|m| m.client_urls().iter().map(|u| authority(u)))
                .collect();
            if let Some(at) = self.endpoints.iter().position(|e| urls.contains(&authority(e))) {
                let now = self.pinned.load(Ordering::Relaxed);
                let n = self.endpoints.len();
                // The same count modulo the members, moved to the leader's.
                let pinned = now - now % n + at;
                self.pinned.store(pinned, Ordering::Relaxed);
            }
        }
        Ok(status.version().to_owned())
    }

    fn timed_out(&self, at: usize) -> LockError {
        LockError::unavailable(EtcdError {
            endpoint: crate::redact::hide_credentials(self.endpoint(at)),
            what: format!("no answer within {:?}", self.timeouts.response),
        })
    }

    /// Runs one request within the response timeout, on the next member while the pinned one
    /// could not take it.
    pub(super) async fn ask<T, F, Fut>(&self, mut request: F) -> Result<T, LockError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.timeouts.response;
        let mut tries = 0;
        loop {
            let pinned = tokio::time::timeout_at(deadline, self.pinned()).await;
            let (at, client) = match pinned {
                Ok(Ok(pinned)) => pinned,
                Ok(Err(e)) if tries + 1 < self.endpoints.len() && !matches!(e, LockError::Refused { .. }) => {
                    tracing::debug!(error = %e, "an etcd member could not be reached: trying the next");
                    tries += 1;
                    continue;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(self.timed_out(self.pinned.load(Ordering::Relaxed))),
            };
            match tokio::time::timeout_at(deadline, request(client)).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) => match failure(&e) {
                    Failure::NotSent if tries + 1 < self.endpoints.len() => {
                        tracing::debug!(error = %describe(self.endpoint(at), &e), "an etcd member could not take a request: trying the next");
                        self.unpin(at);
                        tries += 1;
                    }
                    Failure::NotSent => {
                        self.unpin(at);
                        return Err(store_error(self.endpoint(at), &e));
                    }
                    Failure::LeaseNotFound => {
                        return Err(LockError::unavailable(NoLease(crate::redact::hide_credentials(
                            self.endpoint(at),
                        ))))
                    }
                    _ => return Err(store_error(self.endpoint(at), &e)),
                },
                Err(_) => {
                    self.unpin(at);
                    return Err(self.timed_out(at));
                }
            }
        }
    }

    pub(super) async fn txn(&self, txn: Txn) -> Result<TxnResponse, LockError> {
        self.ask(|client| {
            let txn = txn.clone();
            async move { client.kv_client().txn(txn).await }
        })
        .await
    }

    /// A new lease of `ttl_s` seconds: its id and the ttl etcd gave it.
    pub(super) async fn grant(&self, ttl_s: i64) -> Result<(i64, i64), LockError> {
        let granted = self
            .ask(|client| async move { client.lease_client().grant(ttl_s, None).await })
            .await?;
        Ok((granted.id(), granted.ttl()))
    }

    /// Revokes a lease, deleting its keys: `false` if it had ended already.
    pub(super) async fn revoke(&self, lease: i64) -> Result<bool, LockError> {
        lease_found(
            self.ask(|client| async move { client.lease_client().revoke(lease).await })
                .await,
        )
    }

    /// Keeps a lease alive for its ttl: `false` if it had ended.
    pub(super) async fn keep_alive(&self, lease: i64) -> Result<bool, LockError> {
        lease_found(
            self.ask(|client| async move { client.lease_client().keep_alive(lease).await })
                .await,
        )
    }

    /// A lease's remaining whole seconds, if it is alive.
    pub(super) async fn time_to_live(&self, lease: i64) -> Result<Option<Duration>, LockError> {
        let left = self
            .ask(|client| async move { client.lease_client().time_to_live(lease, None).await })
            .await?;
        Ok(u64::try_from(left.ttl()).ok().map(Duration::from_secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member that is down is recognised from the error's kind (a refused connection), not its
    /// text, and said in one line naming the member.
    #[tokio::test]
    async fn a_member_down_is_not_sent_and_said_in_one_line() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let pool = Pool::new(
            vec![format!("http://127.0.0.1:{port}")],
            Timeouts::default(),
            Access::default(),
        );
        let e = pool.status_and_leader().await.unwrap_err();
        let said = e.to_string();
        assert!(matches!(e, LockError::Unavailable { .. }), "{e:?}");
        assert!(
            said.contains(&format!("etcd at http://127.0.0.1:{port}: cannot be reached")),
            "{said}"
        );
        assert!(!said.contains('\n') && !said.contains("tonic"), "{said}");
    }

    #[test]
    fn etcds_refusals_are_told_apart_by_code() {
        let said =
            |code, message: &str| failure(&etcd_client::Error::GRpcStatus(tonic::Status::new(code, message)));
        assert_eq!(said(tonic::Code::Unavailable, NO_LEADER), Failure::NotSent);
        assert_eq!(said(tonic::Code::Unavailable, "something else"), Failure::Failed);
        assert_eq!(
            said(tonic::Code::InvalidArgument, USER_EMPTY),
            Failure::Refused(CREDENTIALS)
        );
        assert!(matches!(
            said(tonic::Code::PermissionDenied, "etcdserver: permission denied"),
            Failure::Refused(_)
        ));
        assert_eq!(
            said(tonic::Code::NotFound, LEASE_NOT_FOUND),
            Failure::LeaseNotFound
        );
    }
}
