//! Locks in an etcd v3 cluster (the `etcd` feature): one key per lock, attached to a lease of its
//! own, fencing tokens from etcd's revisions, and waiters woken by one watch stream per client.
//!
//! The keys of a lock `L` (`<prefix>{<key>}`, as on Redis):
//!
//! - `L`: the exclusive holder's token, attached to the holder's lease (the ttl rounded up to
//!   whole seconds; etcd raises it to its minimum). Taking it is one transaction (`L` absent, no
//!   share, and for a fair waiter no older place in line): its revision is the fencing token,
//!   strictly increasing across leader changes, as every etcd revision is.
//! - `L:r/<token>`: a reader's share, attached to its own lease.
//! - `L:q/<token>`: a fair waiter's place in line, ordered by its create revision, attached to
//!   the client's session lease (kept alive while the client runs, so a dead client's places go).
//! - `L:w/<token>`: a waiting writer's claim, which holds new readers back (on the session lease
//!   too).
//!
//! A lock's key goes only with its lease: a release revokes the lease (one request), and so does
//! a forced release. So a lease that is alive holds its key, and a renewal is a keep-alive of the
//! lease (checked against the key in one read per batch).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse,
};
use futures_util::future::join_all;

use super::connection::Timeouts;
use super::{Answer, Ask, Attempt, Capabilities, Kind, LockKeys, Pinned, Renewal, Store, Stored};
use crate::background::Background;
use crate::error::TimedOut;
use crate::wakeups::{Registration, Wakeups};
use crate::LockError;

mod names;
mod watcher;

use names::Names;

/// What a lock kept for its minimum hold after its release has after its token (as on Redis).
const RELEASED: &str = ":released";

/// The session lease's ttl (seconds): etcd's minimum with its default election timeout. A dead
/// client's places in line and claims go with it, this long after its last keep-alive.
const SESSION_TTL: i64 = 2;
/// How often the session lease is kept alive.
const SESSION_EVERY: Duration = Duration::from_millis(500);

/// gRPC status codes this store tells apart (`tonic::Code` as `i32`).
const NOT_FOUND: i32 = 5;
const PERMISSION_DENIED: i32 = 7;
const UNAUTHENTICATED: i32 = 16;

/// The lease a token's lock (or share) is attached to.
#[derive(Debug, Clone)]
struct Lease {
    id: i64,
    /// Its ttl in whole seconds, as granted.
    ttl_s: i64,
    /// The key it holds (`L`, or a reader's `L:r/<token>`).
    key: String,
    /// Until when its holder counts it valid, at the latest: the lock's ttl from when the
    /// request that took or renewed it was made. A lease longer than that (rounded up to whole
    /// seconds, or etcd's minimum) is revoked then, so the lock ends when its ttl says, as on
    /// Redis, unless the holder's process is gone (then its lease ends it).
    valid_until: Instant,
}

type Leases = Arc<Mutex<HashMap<String, Lease>>>;

fn held(leases: &Leases) -> MutexGuard<'_, HashMap<String, Lease>> {
    // Every update is one step, so a poisoned map is still consistent.
    leases.lock().unwrap_or_else(|e| e.into_inner())
}

/// Locks in one etcd cluster.
pub(crate) struct EtcdBackend {
    endpoints: Vec<String>,
    timeouts: Timeouts,
    /// The client of the runtime that first needed it (made again if that runtime has gone:
    /// its connections went with it).
    client: Mutex<Option<Client>>,
    client_runtime: Background,
    /// Each held (or being taken) lock's lease, by token.
    leases: Leases,
    /// Each fair waiter's place in line (its create revision), by token.
    places: Mutex<HashMap<String, i64>>,
    /// The session lease, while it is alive.
    session: Arc<Mutex<Option<i64>>>,
    session_keeper: Background,
    wakeups: Arc<Wakeups>,
    watcher: watcher::Watcher,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let endpoints: Vec<String> = self
            .endpoints
            .iter()
            .map(|e| crate::redact::hide_credentials(e))
            .collect();
        f.debug_struct("EtcdBackend")
            .field("endpoints", &endpoints)
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

/// Runs one request within the response timeout.
async fn bounded<T>(
    after: Duration,
    request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, LockError> {
    match tokio::time::timeout(after, request).await {
        Ok(answer) => answer.map_err(store_error),
        Err(_) => Err(LockError::unavailable(TimedOut { after })),
    }
}

/// The gRPC status code of an etcd error, if it is one.
fn status_code(e: &etcd_client::Error) -> Option<i32> {
    match e {
        etcd_client::Error::GRpcStatus(status) => Some(i32::from(status.code())),
        _ => None,
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

/// A ttl in etcd's whole seconds, rounded up.
fn seconds(ms: u64) -> i64 {
    i64::try_from(ms.div_ceil(1000).max(1)).unwrap_or(i64::MAX)
}

fn put_on(lease: i64) -> Option<PutOptions> {
    Some(PutOptions::new().with_lease(lease))
}

/// The key-values of a transaction's `position`th answer, if it was a read.
fn read_at(answer: &[TxnOpResponse], position: usize) -> &[KeyValue] {
    match answer.get(position) {
        Some(TxnOpResponse::Get(got)) => got.kvs(),
        _ => &[],
    }
}

fn revision(answer: &TxnResponse) -> i64 {
    answer.header().map_or(0, |header| header.revision())
}

fn fence(revision: i64) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

impl EtcdBackend {
    /// A store for `endpoints` (`http://host:2379`, or `https://` with the `tls` feature);
    /// connects on first use.
    pub(crate) fn new(endpoints: Vec<String>, timeouts: Timeouts) -> Result<Self, LockError> {
        if endpoints.is_empty() {
            return Err(LockError::invalid_options("no etcd endpoint given"));
        }
        for endpoint in &endpoints {
            let scheme = endpoint.split_once("://").map(|(scheme, _)| scheme);
            match scheme {
                Some("http") => {}
                Some("https") if cfg!(feature = "tls") => {}
                Some("https") => {
                    return Err(LockError::invalid_options(format!(
                        "{}: https:// etcd endpoints need lock-runtime's `tls` feature",
                        crate::redact::hide_credentials(endpoint)
                    )))
                }
                _ => {
                    return Err(LockError::invalid_options(format!(
                        "{}: an etcd endpoint is http://host:port or https://host:port",
                        crate::redact::hide_credentials(endpoint)
                    )))
                }
            }
        }
        let (idle_tx, idle_rx) = tokio::sync::mpsc::unbounded_channel();
        Ok(EtcdBackend {
            endpoints,
            timeouts,
            client: Mutex::new(None),
            client_runtime: Background::default(),
            leases: Arc::new(Mutex::new(HashMap::new())),
            places: Mutex::new(HashMap::new()),
            session: Arc::new(Mutex::new(None)),
            session_keeper: Background::default(),
            wakeups: Wakeups::new(vec![idle_tx]),
            watcher: watcher::Watcher::new(idle_rx),
        })
    }

    fn slot(&self) -> MutexGuard<'_, Option<Client>> {
        // Every update is one step, so a poisoned slot is still consistent.
        self.client.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn leases(&self) -> MutexGuard<'_, HashMap<String, Lease>> {
        held(&self.leases)
    }

    /// Revokes `token`'s lease once its holder no longer counts it valid, if the lease outlives
    /// that (see [`Lease::valid_until`]); ends with the lock's release or a move to another lease.
    fn expire_when_invalid(&self, client: &Client, token: &str, ttl_ms: u64) {
        let Some(lease) = self.leases().get(token).cloned() else {
            return;
        };
        if u64::try_from(lease.ttl_s).unwrap_or(0).saturating_mul(1000) <= ttl_ms {
            return;
        }
        let leases = Arc::clone(&self.leases);
        let mut revoker = client.lease_client();
        let token = token.to_owned();
        let after = self.timeouts.response;
        tokio::spawn(async move {
            let mut until = lease.valid_until;
            loop {
                tokio::time::sleep_until(until).await;
                let renewed = {
                    let mut held = held(&leases);
                    match held.get(&token) {
                        Some(now) if now.id == lease.id && now.valid_until <= Instant::now() => {
                            held.remove(&token);
                            None
                        }
                        Some(now) if now.id == lease.id => Some(now.valid_until),
                        _ => return, // released, or moved to another lease
                    }
                };
                if let Some(later) = renewed {
                    until = later;
                    continue;
                }
                let _ = tokio::time::timeout(after, revoker.revoke(lease.id)).await;
                return;
            }
        });
    }

    fn places(&self) -> MutexGuard<'_, HashMap<String, i64>> {
        self.places.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The client of this runtime (made lazily: etcd-client connects on the first request).
    async fn client(&self) -> Result<Client, LockError> {
        if let Some(client) = self.slot().as_ref().filter(|_| self.client_runtime.is_running()) {
            return Ok(client.clone());
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(self.timeouts.connect)
            .with_timeout(self.timeouts.response)
            .with_keep_alive(
                Duration::from_secs(10),
                self.timeouts.response.max(Duration::from_secs(1)),
            )
            // A member that lost its leader refuses at once, so the balancer tries another.
            .with_require_leader(true);
        let client = bounded(
            self.timeouts.connect,
            Client::connect(&self.endpoints, Some(options)),
        )
        .await?;
        let mut slot = self.slot();
        if let Some(made) = slot.as_ref().filter(|_| self.client_runtime.is_running()) {
            return Ok(made.clone()); // another request made one meanwhile
        }
        *slot = Some(client.clone());
        self.client_runtime.replace(std::future::pending);
        Ok(client)
    }

    async fn grant(&self, client: &Client, ttl_s: i64) -> Result<(i64, i64), LockError> {
        let granted = bounded(self.timeouts.response, client.lease_client().grant(ttl_s, None)).await?;
        Ok((granted.id(), granted.ttl()))
    }

    /// Revokes a lease in the background (one that holds nothing any more).
    fn revoke_later(&self, client: &Client, lease: i64) {
        let mut leases = client.lease_client();
        let after = self.timeouts.response;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(after, leases.revoke(lease)).await;
        });
    }

    /// The session lease (granted at the first need, kept alive in the background).
    async fn session(&self, client: &Client) -> Result<i64, LockError> {
        let alive = *self.session.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(lease), true) = (alive, self.session_keeper.is_running()) {
            return Ok(lease);
        }
        let (lease, _) = self.grant(client, SESSION_TTL).await?;
        *self.session.lock().unwrap_or_else(|e| e.into_inner()) = Some(lease);
        let session = Arc::clone(&self.session);
        let mut leases = client.lease_client();
        self.session_keeper.replace(move || async move {
            let mut every = tokio::time::interval(SESSION_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let kept = tokio::time::timeout(SESSION_EVERY, leases.keep_alive(lease)).await;
                if let Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) = kept {
                    // Gone (the client was cut off longer than its ttl): the next need grants
                    // another; the places on this one went with it.
                    let mut slot = session.lock().unwrap_or_else(|e| e.into_inner());
                    if *slot == Some(lease) {
                        *slot = None;
                    }
                    return;
                }
            }
        });
        Ok(lease)
    }

    async fn acquire(&self, keys: &LockKeys, token: &str, ask: &Ask) -> Result<Attempt, LockError> {
        let client = self.client().await?;
        let names = Names::new(keys);
        let session = if ask.join && !ask.shared {
            Some(self.session(&client).await?)
        } else {
            None
        };
        let sent = Instant::now();
        let (lease, ttl_s) = self.grant(&client, seconds(ask.ttl_ms)).await?;
        let valid_until = sent + Duration::from_millis(ask.ttl_ms);
        let key = if ask.shared {
            names.share(token)
        } else {
            names.lock.clone()
        };
        // Recorded before the transaction: the release of an attempt whose answer never came
        // revokes it, and with it whatever the transaction took.
        self.leases().insert(
            token.to_owned(),
            Lease {
                id: lease,
                ttl_s,
                key: key.clone(),
                valid_until,
            },
        );
        let answer = if ask.shared {
            let txn = Txn::new()
                .when([
                    Compare::create_revision(names.lock.as_str(), CompareOp::Equal, 0),
                    names.no_claims(),
                ])
                .and_then([
                    TxnOp::put(key.as_str(), token, put_on(lease)),
                    // A fenced reader reads the last fenced writer's token.
                    TxnOp::get(names.fence(), Some(GetOptions::new().with_keys_only())),
                ]);
            self.txn(&client, txn).await
        } else {
            self.txn(&client, self.exclusive(&names, token, ask, lease, session))
                .await
        };
        // On an error the lease stays recorded, for the release that follows.
        let answer = answer?;
        if answer.succeeded() {
            if ask.fair {
                self.places().remove(token);
            }
            self.expire_when_invalid(&client, token, ask.ttl_ms);
            let taken = if ask.shared {
                let written = answer.op_responses();
                read_at(&written, 1).first().map_or(0, KeyValue::mod_revision)
            } else {
                revision(&answer)
            };
            return Ok(Attempt::Acquired {
                fence: ask.fencing.then(|| fence(taken)),
            });
        }
        self.leases().remove(token);
        self.revoke_later(&client, lease);
        let responses = answer.op_responses();
        if ask.shared {
            return Ok(Attempt::Held {
                pttl_ms: None,
                behind: false,
                claimed: false,
                kept: None,
            });
        }
        // The first read is the holder: this token's already (an earlier attempt whose answer
        // was lost took it), or someone else's.
        if let Some(held) = read_at(&responses, 0).first() {
            if held.value() == token.as_bytes() {
                self.leases().insert(
                    token.to_owned(),
                    Lease {
                        id: held.lease(),
                        ttl_s,
                        key,
                        valid_until,
                    },
                );
                self.expire_when_invalid(&client, token, ask.ttl_ms);
                return Ok(Attempt::Acquired {
                    fence: ask.fencing.then(|| fence(held.create_revision())),
                });
            }
        }
        let mut behind = false;
        let mut claimed = false;
        for response in responses.iter().skip(1) {
            match response {
                // A fair waiter's place: where it is, and whether it heads the line.
                TxnOpResponse::Put(put) => {
                    let place = put
                        .prev_key()
                        .map(KeyValue::create_revision)
                        .or_else(|| put.header().map(|h| h.revision()));
                    if let Some(place) = place {
                        self.places().insert(token.to_owned(), place);
                    }
                }
                TxnOpResponse::Get(head) => {
                    let mine = names.place(token);
                    behind = head
                        .kvs()
                        .first()
                        .is_some_and(|head| head.key() != mine.as_bytes());
                }
                // Readers refused it: it claimed the writers' turn.
                TxnOpResponse::Txn(claim) => claimed = claim.succeeded(),
                TxnOpResponse::Delete(_) => {}
            }
        }
        Ok(Attempt::Held {
            pttl_ms: None,
            behind,
            claimed,
            kept: None,
        })
    }

    /// An exclusive attempt: taken if nobody holds the lock, no reader shares it, and (fair) no
    /// older waiter is in line; else (a waiter) it takes its place in line and, if readers
    /// refused it, claims the writers' turn.
    fn exclusive(&self, names: &Names, token: &str, ask: &Ask, lease: i64, session: Option<i64>) -> Txn {
        let mut when = vec![
            Compare::create_revision(names.lock.as_str(), CompareOp::Equal, 0),
            names.no_shares(),
        ];
        let mut then = vec![TxnOp::put(names.lock.as_str(), token, put_on(lease))];
        if ask.fencing {
            then.push(TxnOp::put(names.fence(), "", None));
        }
        let mut otherwise = vec![TxnOp::get(names.lock.as_str(), None)];
        if ask.fair {
            let place = self.places().get(token).copied();
            when.push(names.first_in_line(place));
            then.push(TxnOp::delete(names.place(token), None));
            if let Some(session) = session {
                otherwise.push(TxnOp::put(
                    names.place(token),
                    "",
                    Some(PutOptions::new().with_lease(session).with_prev_key()),
                ));
                otherwise.push(TxnOp::get(
                    names.line_start(),
                    Some(
                        GetOptions::new()
                            .with_range(names.line_end())
                            .with_sort(SortTarget::Create, SortOrder::Ascend)
                            .with_limit(1)
                            .with_keys_only(),
                    ),
                ));
            }
        }
        if ask.claimed {
            then.push(TxnOp::delete(names.claim(token), None));
        }
        if let Some(session) = session {
            otherwise.push(TxnOp::txn(
                Txn::new().when([names.some_shares()]).and_then([TxnOp::put(
                    names.claim(token),
                    "",
                    put_on(session),
                )]),
            ));
        }
        Txn::new().when(when).and_then(then).or_else(otherwise)
    }

    async fn txn(&self, client: &Client, txn: Txn) -> Result<TxnResponse, LockError> {
        bounded(self.timeouts.response, client.kv_client().txn(txn)).await
    }

    async fn renew(&self, locks: &[(&LockKeys, &str, u64)]) -> Result<Vec<Renewal>, LockError> {
        let sent = Instant::now();
        let client = self.client().await?;
        let held: Vec<Option<Lease>> = {
            let leases = self.leases();
            locks
                .iter()
                .map(|(_, token, _)| leases.get(*token).cloned())
                .collect()
        };
        // A renewal that asks for a longer ttl than the lease has moves the lock to a new lease.
        let mut found = vec![Renewal::Gone; locks.len()];
        let mut kept = Vec::new();
        for (at, ((_, token, ttl_ms), lease)) in locks.iter().zip(&held).enumerate() {
            let Some(lease) = lease else { continue };
            if seconds(*ttl_ms) > lease.ttl_s {
                found[at] = self.lengthen(&client, (token, *ttl_ms), lease, sent).await?;
            } else {
                kept.push((at, lease.clone()));
            }
        }
        if kept.is_empty() {
            return Ok(found);
        }
        let keep_alives = join_all(kept.iter().map(|(_, lease)| {
            let mut leases = client.lease_client();
            let id = lease.id;
            async move {
                match bounded(self.timeouts.response, leases.keep_alive(id)).await {
                    Ok(_) => Ok(true),
                    Err(LockError::Unavailable { source })
                        if matches!(
                            source.downcast_ref::<etcd_client::Error>(),
                            Some(etcd_client::Error::LeaseKeepAliveError(_))
                        ) =>
                    {
                        Ok(false)
                    }
                    Err(e) => Err(e),
                }
            }
        }));
        // One read for the batch: each key still holds its token on its lease.
        let read = Txn::new().and_then(
            kept.iter()
                .map(|(_, lease)| TxnOp::get(lease.key.as_str(), None))
                .collect::<Vec<_>>(),
        );
        let (alive, read) = tokio::join!(keep_alives, self.txn(&client, read));
        let read = read?.op_responses();
        for (n, ((at, lease), alive)) in kept.iter().zip(alive).enumerate() {
            let token = locks[*at].1;
            let ours = read_at(&read, n)
                .first()
                .is_some_and(|kv| kv.value() == token.as_bytes() && kv.lease() == lease.id);
            let renewed = alive? && ours;
            if renewed {
                let valid_until = sent + Duration::from_millis(locks[*at].2);
                if let Some(now) = self.leases().get_mut(token).filter(|now| now.id == lease.id) {
                    now.valid_until = now.valid_until.max(valid_until);
                }
            }
            found[*at] = Renewal::from_ours(renewed);
        }
        Ok(found)
    }

    /// Moves `token`'s key to a new lease of `ttl_s` seconds if it still holds the token.
    async fn lengthen(
        &self,
        client: &Client,
        (token, ttl_ms): (&str, u64),
        lease: &Lease,
        sent: Instant,
    ) -> Result<Renewal, LockError> {
        let (longer, granted) = self.grant(client, seconds(ttl_ms)).await?;
        let moved = Txn::new()
            .when([
                Compare::value(lease.key.as_str(), CompareOp::Equal, token),
                Compare::lease(lease.key.as_str(), CompareOp::Equal, lease.id),
            ])
            .and_then([TxnOp::put(lease.key.as_str(), token, put_on(longer))]);
        let moved = self.txn(client, moved).await?.succeeded();
        if moved {
            self.leases().insert(
                token.to_owned(),
                Lease {
                    id: longer,
                    ttl_s: granted,
                    key: lease.key.clone(),
                    valid_until: sent + Duration::from_millis(ttl_ms),
                },
            );
            self.revoke_later(client, lease.id);
            self.expire_when_invalid(client, token, ttl_ms);
        } else {
            self.revoke_later(client, longer);
        }
        Ok(Renewal::from_ours(moved))
    }

    async fn release(&self, token: &str, hold_ms: u64) -> Result<bool, LockError> {
        let client = self.client().await?;
        self.places().remove(token);
        let Some(lease) = self.leases().remove(token) else {
            return Ok(false);
        };
        if hold_ms > 0 {
            // Kept for the minimum hold: on a lease of that long, once the key still holds the
            // token (its own lease then goes).
            let sent = Instant::now();
            let (shorter, granted) = self.grant(&client, seconds(hold_ms)).await?;
            let kept = Txn::new()
                .when([
                    Compare::value(lease.key.as_str(), CompareOp::Equal, token),
                    Compare::lease(lease.key.as_str(), CompareOp::Equal, lease.id),
                ])
                .and_then([TxnOp::put(
                    lease.key.as_str(),
                    format!("{token}{RELEASED}"),
                    put_on(shorter),
                )]);
            let kept = self.txn(&client, kept).await?.succeeded();
            if kept {
                // Ended when the hold does (the lease may be longer), by this client.
                self.leases().insert(
                    token.to_owned(),
                    Lease {
                        id: shorter,
                        ttl_s: granted,
                        key: lease.key.clone(),
                        valid_until: sent + Duration::from_millis(hold_ms),
                    },
                );
                self.expire_when_invalid(&client, token, hold_ms);
            } else {
                self.revoke_later(&client, shorter);
            }
            self.revoke_later(&client, lease.id);
            return Ok(kept);
        }
        let revoked = bounded(self.timeouts.response, client.lease_client().revoke(lease.id)).await;
        match revoked {
            Ok(_) => Ok(true),
            Err(LockError::Unavailable { source })
                if source.downcast_ref::<etcd_client::Error>().and_then(status_code) == Some(NOT_FOUND) =>
            {
                Ok(false) // its lease ended: the lock had gone
            }
            Err(e) => {
                // Not known to be gone: its lease ends it, unless a later release does.
                self.leases().insert(token.to_owned(), lease);
                Err(e)
            }
        }
    }

    async fn leave(&self, keys: &LockKeys, token: &str) -> Result<(), LockError> {
        let client = self.client().await?;
        let names = Names::new(keys);
        self.places().remove(token);
        let gone = Txn::new().and_then([
            TxnOp::delete(names.place(token), None),
            TxnOp::delete(names.claim(token), None),
        ]);
        self.txn(&client, gone).await?;
        Ok(())
    }

    /// The holder's key and the readers' shares.
    async fn read_holders(
        &self,
        client: &Client,
        keys: &LockKeys,
    ) -> Result<(Option<KeyValue>, Vec<KeyValue>), LockError> {
        let names = Names::new(keys);
        let read = Txn::new().and_then([
            TxnOp::get(names.lock.as_str(), None),
            TxnOp::get(
                names.shares_start(),
                Some(GetOptions::new().with_range(names.shares_end())),
            ),
        ]);
        let read = self.txn(client, read).await?.op_responses();
        Ok((read_at(&read, 0).first().cloned(), read_at(&read, 1).to_vec()))
    }

    /// What is left of `kv`'s lock: its lease's remaining whole seconds, or less when this
    /// client holds it and ends it sooner (see [`Lease::valid_until`]).
    async fn remaining(&self, client: &Client, kv: &KeyValue) -> Option<Duration> {
        if kv.lease() == 0 {
            return None;
        }
        let ttl = bounded(
            self.timeouts.response,
            client.lease_client().time_to_live(kv.lease(), None),
        )
        .await
        .ok()?;
        let left = Duration::from_secs(u64::try_from(ttl.ttl()).ok()?);
        let value = kv.value_str().ok()?;
        let token = value.strip_suffix(RELEASED).unwrap_or(value);
        let ours = self
            .leases()
            .get(token)
            .filter(|ours| ours.id == kv.lease())
            .map(|ours| ours.valid_until.saturating_duration_since(Instant::now()));
        Some(ours.map_or(left, |ours| ours.min(left)))
    }

    async fn holder(&self, keys: &LockKeys) -> Result<Option<(Stored, Option<Duration>)>, LockError> {
        let client = self.client().await?;
        let (writer, readers) = self.read_holders(&client, keys).await?;
        if let Some(writer) = writer {
            let left = self.remaining(&client, &writer).await;
            return Ok(Some((Stored::One(writer.value().to_vec()), left)));
        }
        if readers.is_empty() {
            return Ok(None);
        }
        let lefts = join_all(readers.iter().map(|r| self.remaining(&client, r))).await;
        let mut values: Vec<Vec<u8>> = readers.iter().map(|r| r.value().to_vec()).collect();
        values.sort();
        Ok(Some((Stored::Shares(values), lefts.into_iter().flatten().max())))
    }

    async fn force_release(&self, keys: &LockKeys) -> Result<bool, LockError> {
        let client = self.client().await?;
        let (writer, readers) = self.read_holders(&client, keys).await?;
        let found: Vec<KeyValue> = writer.into_iter().chain(readers).collect();
        for kv in &found {
            if kv.lease() != 0 {
                // Its holder's renewals find the lease gone.
                let revoked = bounded(self.timeouts.response, client.lease_client().revoke(kv.lease())).await;
                if let Err(e) = revoked {
                    let gone = matches!(&e, LockError::Unavailable { source }
                        if source.downcast_ref::<etcd_client::Error>().and_then(status_code) == Some(NOT_FOUND));
                    if !gone {
                        return Err(e);
                    }
                }
            } else {
                bounded(self.timeouts.response, client.kv_client().delete(kv.key(), None)).await?;
            }
        }
        Ok(!found.is_empty())
    }
}

impl Drop for EtcdBackend {
    /// The watch stream and the session keeper go with the client.
    fn drop(&mut self) {
        self.watcher.stop();
        self.session_keeper.stop();
        self.client_runtime.stop();
    }
}

impl Store for EtcdBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            name: "etcd",
            // A fair release wakes the next in line, who asks (its lease is its own).
            hand_over: false,
            ..Capabilities::ALL
        }
    }

    fn connect<'a>(&'a self, probe: &'a LockKeys) -> Answer<'a, ()> {
        Box::pin(async move {
            // The rights locking needs, on the probe's key: take it, let it go.
            let token = format!("rights-check:{:016x}", rand::random::<u64>());
            let ask = Ask {
                ttl_ms: 1000,
                fencing: false,
                waiting: false,
                fair: false,
                join: false,
                shared: false,
                claimed: false,
            };
            self.acquire(probe, &token, &ask).await?;
            self.release(&token, 0).await?;
            Ok(())
        })
    }

    fn attempt<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ask: &'a Ask,
        _: &'a Pinned,
    ) -> Answer<'a, Attempt> {
        Box::pin(self.acquire(keys, token, ask))
    }

    fn renew_many<'a>(&'a self, locks: &'a [(&'a LockKeys, &'a str, u64)]) -> Answer<'a, Vec<Renewal>> {
        Box::pin(self.renew(locks))
    }

    fn release<'a>(
        &'a self,
        _: &'a LockKeys,
        token: &'a str,
        hold_ms: u64,
        _: Kind,
        _: Option<&'a Pinned>,
    ) -> Answer<'a, bool> {
        Box::pin(EtcdBackend::release(self, token, hold_ms))
    }

    fn leave_queue<'a>(&'a self, keys: &'a LockKeys, token: &'a str, _: bool) -> Answer<'a, ()> {
        Box::pin(self.leave(keys, token))
    }

    fn holder<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, Option<(Stored, Option<Duration>)>> {
        Box::pin(EtcdBackend::holder(self, keys))
    }

    fn force_release<'a>(&'a self, keys: &'a LockKeys) -> Answer<'a, bool> {
        Box::pin(EtcdBackend::force_release(self, keys))
    }

    fn response_timeout(&self) -> Duration {
        self.timeouts.response
    }

    fn wakeups(&self) -> &Arc<Wakeups> {
        &self.wakeups
    }

    fn listen<'a>(
        &'a self,
        registration: &'a Registration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            if self.wakeups.is_subscribed(registration.channel(), 0) {
                return;
            }
            let Ok(client) = self.client().await else {
                return; // the waiter naps, and asks again
            };
            let watching = self.watcher.watch(client, &self.wakeups, registration.channel());
            let _ = tokio::time::timeout(self.timeouts.response, watching).await;
        })
    }
}
