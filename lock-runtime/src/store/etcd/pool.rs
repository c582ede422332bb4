//! The connections of an etcd client: one etcd-client `Client` per member, requests pinned to one
//! member at a time (as etcd's own Go client pins its balancer). A request that never reached
//! its member (the connection was refused, or the member has no leader) is sent to the next one
//! at once; one that timed out moves the pin for the next request but is not sent again (it may
//! have been applied). etcd-client's balanced channel would instead keep sending a share of the
//! requests to a member that is down.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, Txn, TxnResponse};
use tokio::time::Instant;

use crate::background::Background;
use crate::error::TimedOut;
use crate::store::Timeouts;
use crate::LockError;

/// gRPC status codes this store tells apart (`tonic::Code` as `i32`).
const NOT_FOUND: i32 = 5;
const PERMISSION_DENIED: i32 = 7;
const UNAVAILABLE: i32 = 14;
const UNAUTHENTICATED: i32 = 16;

/// One client per member, and which member requests go to.
pub(super) struct Pool {
    endpoints: Vec<String>,
    pub(super) timeouts: Timeouts,
    /// Each member's client, made on the runtime that first needed it (made again if that
    /// runtime has gone: its connections went with it).
    clients: Mutex<Vec<Option<Client>>>,
    runtime: Background,
    pinned: AtomicUsize,
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
            .field("pinned", &self.pinned)
            .finish_non_exhaustive()
    }
}

/// The gRPC status code of an etcd error, if it is one.
fn status_code(e: &etcd_client::Error) -> Option<i32> {
    match e {
        etcd_client::Error::GRpcStatus(status) => Some(i32::from(status.code())),
        _ => None,
    }
}

/// Whether the request never reached a member that could apply it: the connection to the member
/// could not be made, or the member has no leader. (Not any transport error: a connection that
/// broke, or a keep-alive ping that went unanswered, may have delivered the request.)
fn not_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            i32::from(status.code()) == UNAVAILABLE
                && (status.message() == "tcp connect error" || status.message().contains("no leader"))
        }
        _ => false,
    }
}

/// Whether etcd said the lease does not exist (it ended, or was revoked).
pub(super) fn lease_not_found(e: &LockError) -> bool {
    match e {
        LockError::Unavailable { source } => match source.downcast_ref::<etcd_client::Error>() {
            Some(etcd_client::Error::LeaseKeepAliveError(_)) => true,
            Some(e) => status_code(e) == Some(NOT_FOUND),
            None => false,
        },
        _ => false,
    }
}

/// `Refused` when etcd refused this client (authentication, permissions), `Unavailable` for
/// everything else.
pub(crate) fn store_error(e: etcd_client::Error) -> LockError {
    let reason = match status_code(&e) {
        Some(UNAUTHENTICATED) => Some("etcd refused the credentials: fix the user or password"),
        Some(PERMISSION_DENIED) => Some(
            "the etcd user lacks a right locking needs: read and write on the lock prefix's \
             keys, and leases",
        ),
        _ => None,
    };
    match reason {
        Some(reason) => LockError::Refused {
            reason,
            source: e.into(),
        },
        None => LockError::unavailable(e),
    }
}

impl Pool {
    pub(super) fn new(endpoints: Vec<String>, timeouts: Timeouts) -> Self {
        let clients = endpoints.iter().map(|_| None).collect();
        Pool {
            endpoints,
            timeouts,
            clients: Mutex::new(clients),
            runtime: Background::default(),
            pinned: AtomicUsize::new(rand::random_range(0..usize::MAX / 2)),
        }
    }

    fn slots(&self) -> MutexGuard<'_, Vec<Option<Client>>> {
        // Every update is one step, so a poisoned slot is still consistent.
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
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
        // A plain channel, connected lazily: a member that is down fails the request at once
        // (as not sent), where a balanced channel would hold it until the member is back.
        let channel = tonic::transport::Endpoint::from_shared(self.endpoints[member].clone())
            .map_err(|e| LockError::unavailable(format!("etcd endpoint {}: {e}", member)))?
            .connect_timeout(self.timeouts.connect)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(self.timeouts.response.max(Duration::from_secs(1)))
            .connect_lazy();
        // A member cut off from its leader refuses at once, and the next one is asked.
        let options = ConnectOptions::new().with_require_leader(true);
        let made = Client::from_channel(etcd_client::Channel::Tonic(channel), Some(options))
            .await
            .map_err(store_error)?;
        let mut slots = self.slots();
        let client = slots[member].get_or_insert(made).clone();
        Ok((at, client))
    }

    /// Requests go to the next member from now on (unless another request moved them already).
    pub(super) fn unpin(&self, at: usize) {
        let _ = self
            .pinned
            .compare_exchange(at, at.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Runs one request within the response timeout, on the next member while the pinned one
    /// could not take it.
    pub(super) async fn ask<T, F, Fut>(&self, mut request: F) -> Result<T, LockError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let after = self.timeouts.response;
        let deadline = Instant::now() + after;
        let mut tries = 0;
        loop {
            let (at, client) = tokio::time::timeout_at(deadline, self.pinned())
                .await
                .map_err(|_| LockError::unavailable(TimedOut { after }))??;
            match tokio::time::timeout_at(deadline, request(client)).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) if not_sent(&e) && tries + 1 < self.endpoints.len() => {
                    tracing::debug!(error = %e, "an etcd member could not take a request: trying the next");
                    self.unpin(at);
                    tries += 1;
                }
                Ok(Err(e)) => {
                    if not_sent(&e) {
                        self.unpin(at);
                    }
                    return Err(store_error(e));
                }
                Err(_) => {
                    self.unpin(at);
                    return Err(LockError::unavailable(TimedOut { after }));
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
        match self
            .ask(|client| async move { client.lease_client().revoke(lease).await })
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if lease_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Keeps a lease alive for its ttl: `false` if it had ended.
    pub(super) async fn keep_alive(&self, lease: i64) -> Result<bool, LockError> {
        match self
            .ask(|client| async move { client.lease_client().keep_alive(lease).await })
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if lease_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// A lease's remaining whole seconds, if it is alive.
    pub(super) async fn time_to_live(&self, lease: i64) -> Result<Option<Duration>, LockError> {
        let left = self
            .ask(|client| async move { client.lease_client().time_to_live(lease, None).await })
            .await?;
        Ok(u64::try_from(left.ttl()).ok().map(Duration::from_secs))
    }
}
