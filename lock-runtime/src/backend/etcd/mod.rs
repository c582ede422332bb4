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
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};
use futures_util::future::join_all;

use super::connection::Timeouts;
use super::{Answer, Ask, Attempt, Capabilities, Kind, LockKeys, Pinned, Renewal, Store, Stored};
use crate::background::Background;
use crate::wakeups::{Registration, Wakeups};
use crate::LockError;

mod names;
mod pool;
mod watcher;

use names::Names;
use pool::Pool;

/// What a lock kept for its minimum hold after its release has after its token (as on Redis).
const RELEASED: &str = ":released";

/// The session lease's ttl (seconds): etcd's minimum with its default election timeout. A dead
/// client's places in line and claims go with it, this long after its last keep-alive.
const SESSION_TTL: i64 = 2;
/// How often the session lease is kept alive.
const SESSION_EVERY: Duration = Duration::from_millis(500);

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
    pool: Arc<Pool>,
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
        f.debug_struct("EtcdBackend")
            .field("pool", &self.pool)
            .finish_non_exhaustive()
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
    /// A store for `endpoints` (`http://host:2379`); connects on first use.
    pub(crate) fn new(endpoints: Vec<String>, timeouts: Timeouts) -> Result<Self, LockError> {
        if endpoints.is_empty() {
            return Err(LockError::invalid_options("no etcd endpoint given"));
        }
        for endpoint in &endpoints {
            let scheme = endpoint.split_once("://").map(|(scheme, _)| scheme);
            if scheme != Some("http") {
                return Err(LockError::invalid_options(format!(
                    "{}: an etcd endpoint is http://host:port (TLS to etcd is not offered yet)",
                    crate::redact::hide_credentials(endpoint)
                )));
            }
        }
        let (idle_tx, idle_rx) = tokio::sync::mpsc::unbounded_channel();
        Ok(EtcdBackend {
            pool: Arc::new(Pool::new(endpoints, timeouts)),
            leases: Arc::new(Mutex::new(HashMap::new())),
            places: Mutex::new(HashMap::new()),
            session: Arc::new(Mutex::new(None)),
            session_keeper: Background::default(),
            wakeups: Wakeups::new(vec![idle_tx]),
            watcher: watcher::Watcher::new(idle_rx),
        })
    }

    fn leases(&self) -> MutexGuard<'_, HashMap<String, Lease>> {
        held(&self.leases)
    }

    /// Revokes `token`'s lease once its holder no longer counts it valid, if the lease outlives
    /// that (see [`Lease::valid_until`]); ends with the lock's release or a move to another lease.
    fn expire_when_invalid(&self, token: &str, ttl_ms: u64) {
        let Some(lease) = self.leases().get(token).cloned() else {
            return;
        };
        if u64::try_from(lease.ttl_s).unwrap_or(0).saturating_mul(1000) <= ttl_ms {
            return;
        }
        let leases = Arc::clone(&self.leases);
        let pool = Arc::clone(&self.pool);
        let token = token.to_owned();
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
                let _ = pool.revoke(lease.id).await;
                return;
            }
        });
    }

    fn places(&self) -> MutexGuard<'_, HashMap<String, i64>> {
        self.places.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Revokes a lease in the background (one that holds nothing any more).
    fn revoke_later(&self, lease: i64) {
        let pool = Arc::clone(&self.pool);
        tokio::spawn(async move {
            let _ = pool.revoke(lease).await;
        });
    }

    /// The session lease (granted at the first need, kept alive in the background).
    async fn session(&self) -> Result<i64, LockError> {
        let alive = *self.session.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(lease), true) = (alive, self.session_keeper.is_running()) {
            return Ok(lease);
        }
        let (lease, _) = self.pool.grant(SESSION_TTL).await?;
        *self.session.lock().unwrap_or_else(|e| e.into_inner()) = Some(lease);
        let session = Arc::clone(&self.session);
        let pool = Arc::clone(&self.pool);
        self.session_keeper.replace(move || async move {
            let mut every = tokio::time::interval(SESSION_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                if let Ok(false) = pool.keep_alive(lease).await {
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
        let names = Names::new(keys);
        let session = if ask.join && !ask.shared {
            Some(self.session().await?)
        } else {
            None
        };
        let sent = Instant::now();
        let (lease, ttl_s) = self.pool.grant(seconds(ask.ttl_ms)).await?;
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
            self.pool.txn(txn).await
        } else {
            self.pool
                .txn(self.exclusive(&names, token, ask, lease, session))
                .await
        };
        // On an error the lease stays recorded, for the release that follows.
        let answer = answer?;
        if answer.succeeded() {
            if ask.fair {
                self.places().remove(token);
            }
            self.expire_when_invalid(token, ask.ttl_ms);
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
        self.revoke_later(lease);
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
                self.expire_when_invalid(token, ask.ttl_ms);
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

    async fn renew(&self, locks: &[(&LockKeys, &str, u64)]) -> Result<Vec<Renewal>, LockError> {
        let sent = Instant::now();
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
                found[at] = self.lengthen((token, *ttl_ms), lease, sent).await?;
            } else {
                kept.push((at, lease.clone()));
            }
        }
        if kept.is_empty() {
            return Ok(found);
        }
        let keep_alives = join_all(kept.iter().map(|(_, lease)| self.pool.keep_alive(lease.id)));
        // One read for the batch: each key still holds its token on its lease.
        let read = Txn::new().and_then(
            kept.iter()
                .map(|(_, lease)| TxnOp::get(lease.key.as_str(), None))
                .collect::<Vec<_>>(),
        );
        let (alive, read) = tokio::join!(keep_alives, self.pool.txn(read));
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
        (token, ttl_ms): (&str, u64),
        lease: &Lease,
        sent: Instant,
    ) -> Result<Renewal, LockError> {
        let (longer, granted) = self.pool.grant(seconds(ttl_ms)).await?;
        let moved = Txn::new()
            .when([
                Compare::value(lease.key.as_str(), CompareOp::Equal, token),
                Compare::lease(lease.key.as_str(), CompareOp::Equal, lease.id),
            ])
            .and_then([TxnOp::put(lease.key.as_str(), token, put_on(longer))]);
        let moved = self.pool.txn(moved).await?.succeeded();
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
            self.revoke_later(lease.id);
            self.expire_when_invalid(token, ttl_ms);
        } else {
            self.revoke_later(longer);
        }
        Ok(Renewal::from_ours(moved))
    }

    async fn release(&self, token: &str, hold_ms: u64) -> Result<bool, LockError> {
        self.places().remove(token);
        let Some(lease) = self.leases().remove(token) else {
            return Ok(false);
        };
        if hold_ms > 0 {
            // Kept for the minimum hold: on a lease of that long, once the key still holds the
            // token (its own lease then goes).
            let sent = Instant::now();
            let (shorter, granted) = self.pool.grant(seconds(hold_ms)).await?;
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
            let kept = self.pool.txn(kept).await?.succeeded();
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
                self.expire_when_invalid(token, hold_ms);
            } else {
                self.revoke_later(shorter);
            }
            self.revoke_later(lease.id);
            return Ok(kept);
        }
        match self.pool.revoke(lease.id).await {
            // `false`: its lease ended, and the lock had gone.
            Ok(revoked) => Ok(revoked),
            Err(e) => {
                // Not known to be gone: its lease ends it, unless a later release does.
                self.leases().insert(token.to_owned(), lease);
                Err(e)
            }
        }
    }

    async fn leave(&self, keys: &LockKeys, token: &str) -> Result<(), LockError> {
        let names = Names::new(keys);
        self.places().remove(token);
        let gone = Txn::new().and_then([
            TxnOp::delete(names.place(token), None),
            TxnOp::delete(names.claim(token), None),
        ]);
        self.pool.txn(gone).await?;
        Ok(())
    }

    /// The holder's key and the readers' shares.
    async fn read_holders(&self, keys: &LockKeys) -> Result<(Option<KeyValue>, Vec<KeyValue>), LockError> {
        let names = Names::new(keys);
        let read = Txn::new().and_then([
            TxnOp::get(names.lock.as_str(), None),
            TxnOp::get(
                names.shares_start(),
                Some(GetOptions::new().with_range(names.shares_end())),
            ),
        ]);
        let read = self.pool.txn(read).await?.op_responses();
        Ok((read_at(&read, 0).first().cloned(), read_at(&read, 1).to_vec()))
    }

    /// What is left of `kv`'s lock: its lease's remaining whole seconds, or less when this
    /// client holds it and ends it sooner (see [`Lease::valid_until`]).
    async fn remaining(&self, kv: &KeyValue) -> Option<Duration> {
        if kv.lease() == 0 {
            return None;
        }
        let left = self.pool.time_to_live(kv.lease()).await.ok()??;
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
        let (writer, readers) = self.read_holders(keys).await?;
        if let Some(writer) = writer {
            let left = self.remaining(&writer).await;
            return Ok(Some((Stored::One(writer.value().to_vec()), left)));
        }
        if readers.is_empty() {
            return Ok(None);
        }
        let lefts = join_all(readers.iter().map(|r| self.remaining(r))).await;
        let mut values: Vec<Vec<u8>> = readers.iter().map(|r| r.value().to_vec()).collect();
        values.sort();
        Ok(Some((Stored::Shares(values), lefts.into_iter().flatten().max())))
    }

    async fn force_release(&self, keys: &LockKeys) -> Result<bool, LockError> {
        let (writer, readers) = self.read_holders(keys).await?;
        let found: Vec<KeyValue> = writer.into_iter().chain(readers).collect();
        for kv in &found {
            if kv.lease() != 0 {
                // Its holder's renewals find the lease gone.
                self.pool.revoke(kv.lease()).await?;
            } else {
                let key = kv.key().to_vec();
                self.pool
                    .ask(|client| {
                        let key = key.clone();
                        async move { client.kv_client().delete(key, None).await }
                    })
                    .await?;
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
        self.pool.timeouts.response
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
            let watching = self
                .watcher
                .watch(&self.pool, &self.wakeups, registration.channel());
            let _ = tokio::time::timeout(self.pool.timeouts.response, watching).await;
        })
    }
}
