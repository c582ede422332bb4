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
//! - `L:fence`: written with every fenced exclusive acquire; its mod revision is that token.
//! - `L:q/<token>`: a fair waiter's place in line, ordered by its create revision.
//! - `L:w/<token>`: a waiting writer's claim, which holds new readers back.
//!
//! (`:` stands for the byte 0xff there, which UTF-8 never has: no other lock's key falls among
//! a lock's helpers.) A waiter's place and claim are attached to a short lease of the waiter's
//! own, which each of its attempts keeps alive: they go [`PLACE_TTL`] after its last attempt.
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

use super::{
    Ask, Attempt, Capabilities, DynStore, Flight, ForceReleased, Kind, Lock, LockView, Notices, Release,
    Released, Renewal, Renewing, Settings, Store, StoreConfig,
};
use crate::redact::hide_credentials;
use crate::{LockClientBuilder, LockError};

mod admin;
mod names;
mod pool;
mod watcher;

use names::Names;
use pool::Pool;

/// What a lock kept for its minimum hold after its release has after its token (as on Redis).
const RELEASED: &str = ":released";

/// A waiter's place and claim lease's ttl (seconds): etcd's minimum with its default election
/// timeout. A waiter asks again well within it (every 300 ms at most, when fair).
const PLACE_TTL: i64 = 2;

/// The most operations etcd takes in one transaction (its default `--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;

/// The lease a token's lock (or share) is attached to.
#[derive(Debug, Clone)]
struct Lease {
    id: i64,
    /// Its ttl in whole seconds, as granted.
    ttl_s: i64,
    /// A lease the key may have moved to (a longer `extend`, or a minimum hold, whose answer
    /// has not come): renewals accept it, a release revokes it too.
    moving: Option<i64>,
    /// The key it holds (`L`, or a reader's `L:r/<token>`).
    key: Vec<u8>,
    /// Until when its holder counts it valid, at the latest: the lock's ttl from when the
    /// request that took or renewed it was made. A lease longer than that (rounded up to whole
    /// seconds, or etcd's minimum) is revoked then, so the lock ends when its ttl says, as on
    /// Redis, unless the holder's process is gone (then its lease ends it).
    valid_until: Instant,
    /// A task revokes it at `valid_until` (see [`EtcdStore::expire_when_invalid`]).
    expiring: bool,
}

impl Lease {
    fn holds(&self, kv: &KeyValue) -> bool {
        kv.lease() == self.id || Some(kv.lease()) == self.moving
    }
}

/// A waiting call's place in the fair line and its claim as a waiting writer: the short lease
/// they are attached to, and the place's create revision once it has one.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    lease: i64,
    revision: Option<i64>,
}

type Leases = Arc<Mutex<HashMap<String, Lease>>>;

fn held(leases: &Leases) -> MutexGuard<'_, HashMap<String, Lease>> {
    // Every update is one step, so a poisoned map is still consistent.
    leases.lock().unwrap_or_else(|e| e.into_inner())
}

/// An etcd cluster's endpoints, as the builder was told.
#[derive(Clone)]
pub(crate) struct EtcdConfig(Vec<String>);

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let endpoints: Vec<String> = self.0.iter().map(|e| hide_credentials(e)).collect();
        f.debug_tuple("Etcd").field(&endpoints).finish()
    }
}

impl StoreConfig for EtcdConfig {
    fn open(&self, settings: Settings) -> Result<Arc<dyn DynStore>, LockError> {
        settings
            .no_replicas("etcd: every write is committed by a majority of its members before it answers")?;
        settings
            .no_tls_material("TLS to etcd is not offered yet: the builder's TLS material is for Redis")?;
        Ok(Arc::new(EtcdStore::new(self.0.clone(), settings)?))
    }
}

/// `etcd://host:port`, or a cluster's members `etcd://host:port,host:port` (`LockClient::connect`).
pub(crate) fn from_url(url: &str) -> Result<Arc<dyn StoreConfig>, LockError> {
    let members = url.split_once("://").map_or(url, |(_, rest)| rest);
    let endpoints: Vec<String> = members
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(|m| format!("http://{m}"))
        .collect();
    Ok(Arc::new(EtcdConfig(endpoints)))
}

impl LockClientBuilder {
    /// An etcd v3 cluster (`http://host:2379` for each member; the `etcd` feature; TLS to etcd
    /// is not offered yet): each lock is a key attached to a lease of its own, its
    /// fencing token the revision that took it (strictly increasing across leader changes),
    /// and waiters are woken by a watch, in revision order when fair. etcd's leases have whole
    /// seconds and a minimum (2 s with etcd's default election timeout): the server's lease is
    /// the ttl rounded up to it, while the holder's validity is the ttl as asked. The prefix
    /// starts each key, as on Redis.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .etcd(["http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://10.0.0.3:2379"])
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    pub fn etcd<I, S>(self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.place(EtcdConfig(
            endpoints.into_iter().map(|u| u.as_ref().to_owned()).collect(),
        ))
    }
}

/// Locks in one etcd cluster.
pub(crate) struct EtcdStore {
    pool: Arc<Pool>,
    /// Each held (or being taken) lock's lease, by token.
    leases: Leases,
    /// Each waiting call's place lease, by token.
    places: Mutex<HashMap<String, Waiting>>,
    /// Every lock's key starts with it.
    prefix: String,
    notices: Notices,
    watcher: watcher::Watcher,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
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

impl EtcdStore {
    /// A store for `endpoints` (`http://host:2379`); connects on first use.
    pub(crate) fn new(endpoints: Vec<String>, settings: Settings) -> Result<Self, LockError> {
        let Settings {
            prefix,
            timeouts,
            notices,
            ..
        } = settings;
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
        Ok(EtcdStore {
            pool: Arc::new(Pool::new(endpoints, timeouts)),
            leases: Arc::new(Mutex::new(HashMap::new())),
            places: Mutex::new(HashMap::new()),
            prefix,
            notices,
            watcher: watcher::Watcher::new(),
        })
    }

    fn leases(&self) -> MutexGuard<'_, HashMap<String, Lease>> {
        held(&self.leases)
    }

    fn places(&self) -> MutexGuard<'_, HashMap<String, Waiting>> {
        self.places.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Revokes `token`'s lease once its holder no longer counts it valid (see
    /// [`Lease::valid_until`]): when the lease outlives the validity `ttl_ms` gives, or
    /// (`always`) when nothing else would end the entry (a release that got no answer). Ends
    /// early with the lock's release or a move to another lease.
    fn expire_when_invalid(&self, token: &str, ttl_ms: u64, always: bool) {
        let lease = {
            let mut leases = self.leases();
            let Some(lease) = leases.get_mut(token) else {
                return;
            };
            let outlives = u64::try_from(lease.ttl_s).unwrap_or(0).saturating_mul(1000) > ttl_ms;
            if lease.expiring || !(outlives || always) {
                return;
            }
            lease.expiring = true;
            lease.clone()
        };
        let leases = Arc::clone(&self.leases);
        let pool = Arc::clone(&self.pool);
        let token = token.to_owned();
        tokio::spawn(async move {
            let mut until = lease.valid_until;
            loop {
                tokio::time::sleep_until(until).await;
                let due = {
                    let mut held = held(&leases);
                    match held.get(&token) {
                        Some(now) if now.id == lease.id && now.valid_until <= Instant::now() => {
                            held.remove(&token)
                        }
                        Some(now) if now.id == lease.id => {
                            until = now.valid_until; // renewed meanwhile
                            continue;
                        }
                        _ => return, // released, or moved to another lease (which has its own)
                    }
                };
                if let Some(due) = due {
                    for id in std::iter::once(due.id).chain(due.moving) {
                        let _ = pool.revoke(id).await;
                    }
                }
                return;
            }
        });
    }

    /// Revokes a lease in the background (one that holds nothing any more).
    fn revoke_later(&self, lease: i64) {
        let pool = Arc::clone(&self.pool);
        tokio::spawn(async move {
            let _ = pool.revoke(lease).await;
        });
    }

    /// The lease of `token`'s place and claim: its earlier one kept alive, or a new one (its
    /// earlier place, if any, lapsed with the old lease).
    async fn place_lease(&self, token: &str) -> Result<i64, LockError> {
        let known = self.places().get(token).copied();
        if let Some(place) = known {
            if self.pool.keep_alive(place.lease).await? {
                return Ok(place.lease);
            }
        }
        let (lease, _) = self.pool.grant(PLACE_TTL).await?;
        self.places().insert(
            token.to_owned(),
            Waiting {
                lease,
                revision: None,
            },
        );
        Ok(lease)
    }

    /// `token` no longer waits: its place and claim go with their lease.
    fn drop_place(&self, token: &str) {
        if let Some(place) = self.places().remove(token) {
            self.revoke_later(place.lease);
        }
    }

    async fn acquire(&self, lock: &Lock, token: &str, ask: &Ask) -> Result<Attempt, LockError> {
        let names = Names::for_lock(lock.name());
        let sent = Instant::now();
        // A fair waiter's place (and a claim) lease, granted or kept alive alongside the lock's
        // own; a writer that claimed keeps its claim's alive. (A plain waiter claims only once
        // readers refused it: see `claim`.)
        let waits = ask.join && !ask.shared;
        let keeps_place = waits && (ask.fair || self.places().contains_key(token));
        let (granted, place) = if keeps_place {
            let (granted, place) =
                tokio::join!(self.pool.grant(seconds(ask.ttl_ms)), self.place_lease(token));
            (granted?, Some(place?))
        } else {
            (self.pool.grant(seconds(ask.ttl_ms)).await?, None)
        };
        let (lease, ttl_s) = granted;
        let valid_until = sent + Duration::from_millis(ask.ttl_ms);
        let key = if ask.shared {
            names.share(token)
        } else {
            names.lock.clone().into_bytes()
        };
        // Recorded before the transaction: the release of an attempt whose answer never came
        // revokes it, and with it whatever the transaction took.
        self.leases().insert(
            token.to_owned(),
            Lease {
                id: lease,
                ttl_s,
                moving: None,
                key: key.clone(),
                valid_until,
                expiring: false,
            },
        );
        let txn = if ask.shared {
            Txn::new()
                .when([
                    Compare::create_revision(names.lock.as_str(), CompareOp::Equal, 0),
                    names.no_claims(),
                ])
                .and_then([
                    TxnOp::put(key.clone(), token, put_on(lease)),
                    // A fenced reader reads the last fenced writer's token.
                    TxnOp::get(names.fence(), Some(GetOptions::new().with_keys_only())),
                ])
        } else {
            self.exclusive(&names, token, ask, lease, place)
        };
        // On an error the lease stays recorded, for the release that follows.
        let answer = self.pool.txn(txn).await?;
        if answer.succeeded() {
            if waits {
                self.drop_place(token);
            }
            self.expire_when_invalid(token, ask.ttl_ms, false);
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
        let responses = answer.op_responses();
        // The first read is the holder: this token's already (an earlier send of this attempt
        // took it, on this lease or an earlier one of the same call), or someone else's.
        if let Some(held) = read_at(&responses, 0).first().filter(|_| !ask.shared) {
            if held.value() == token.as_bytes() {
                if held.lease() != lease {
                    self.revoke_later(lease);
                }
                if waits {
                    self.drop_place(token);
                }
                self.leases().insert(
                    token.to_owned(),
                    Lease {
                        id: held.lease(),
                        ttl_s,
                        moving: None,
                        key,
                        valid_until,
                        expiring: false,
                    },
                );
                self.expire_when_invalid(token, ask.ttl_ms, false);
                return Ok(Attempt::Acquired {
                    fence: ask.fencing.then(|| fence(held.create_revision())),
                });
            }
        }
        self.leases().remove(token);
        self.revoke_later(lease);
        if ask.shared {
            return Ok(Attempt::Held {
                pttl_ms: None,
                behind: false,
                claimed: false,
                kept: None,
            });
        }
        let mut behind = false;
        let mut claimed = false;
        let mut at = 1;
        if ask.fair && place.is_some() {
            // The place, put unless the lock holds this token (then nothing was taken).
            if let Some(TxnOpResponse::Txn(put)) = responses.get(at) {
                if let Some(TxnOpResponse::Put(put)) = put.op_responses().first() {
                    let revision = put
                        .prev_key()
                        .map(KeyValue::create_revision)
                        .or_else(|| put.header().map(|h| h.revision()));
                    if let Some(mine) = self.places().get_mut(token) {
                        mine.revision = revision.or(mine.revision);
                    }
                }
            }
            let mine = names.place(token);
            behind = read_at(&responses, at + 1)
                .first()
                .is_some_and(|head| head.key() != mine.as_slice());
            at += 2;
        }
        if place.is_some() {
            // Readers refused it: it claimed the writers' turn.
            if let Some(TxnOpResponse::Txn(claim)) = responses.get(at) {
                claimed = claim.succeeded();
            }
        } else if waits {
            // Readers refused it (the read of their shares found one): it claims now.
            let refused_by_readers =
                matches!(responses.get(at), Some(TxnOpResponse::Get(shares)) if shares.count() > 0);
            if refused_by_readers {
                claimed = self.claim(&names, token).await?;
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
    /// older waiter is in line; else a waiter (with its `place` lease) takes its place in line
    /// and, if readers refused it, claims the writers' turn.
    fn exclusive(&self, names: &Names, token: &str, ask: &Ask, lease: i64, place: Option<i64>) -> Txn {
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
            let revision = self.places().get(token).and_then(|p| p.revision);
            when.push(names.first_in_line(revision));
            then.push(TxnOp::delete(names.place(token), None));
            if let Some(place) = place {
                // Not when the lock holds this token (an earlier send of the attempt took it).
                otherwise.push(TxnOp::txn(
                    Txn::new()
                        .when([Compare::value(names.lock.as_str(), CompareOp::Equal, token)])
                        .or_else([TxnOp::put(
                            names.place(token),
                            "",
                            Some(PutOptions::new().with_lease(place).with_prev_key()),
                        )]),
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
        match place {
            Some(place) => otherwise.push(TxnOp::txn(
                Txn::new().when([names.some_shares()]).and_then([TxnOp::put(
                    names.claim(token),
                    "",
                    put_on(place),
                )]),
            )),
            // A plain waiter: whether readers hold it, to claim the writers' turn if they do.
            None if ask.join => otherwise.push(TxnOp::get(
                names.shares_start(),
                Some(GetOptions::new().with_range(names.shares_end()).with_count_only()),
            )),
            None => {}
        }
        Txn::new().when(when).and_then(then).or_else(otherwise)
    }

    /// A waiting writer refused by readers claims the writers' turn (on a place lease of its
    /// own, kept alive by its later attempts), if readers still hold the lock.
    async fn claim(&self, names: &Names, token: &str) -> Result<bool, LockError> {
        let place = self.place_lease(token).await?;
        let claim = Txn::new().when([names.some_shares()]).and_then([TxnOp::put(
            names.claim(token),
            "",
            put_on(place),
        )]);
        Ok(self.pool.txn(claim).await?.succeeded())
    }

    async fn renew_locks(&self, locks: &[Renewing<'_>]) -> Result<Vec<Renewal>, LockError> {
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
        // One read per batch (as many as a transaction takes): each key still holds its token
        // on its lease.
        let reads = join_all(kept.chunks(MAX_TXN_OPS).map(|chunk| {
            let read = Txn::new().and_then(
                chunk
                    .iter()
                    .map(|(_, lease)| TxnOp::get(lease.key.clone(), None))
                    .collect::<Vec<_>>(),
            );
            self.pool.txn(read)
        }));
        let (alive, reads) = tokio::join!(keep_alives, reads);
        let mut read = Vec::with_capacity(kept.len());
        for chunk in reads {
            read.extend(chunk?.op_responses());
        }
        for (n, ((at, lease), alive)) in kept.iter().zip(alive).enumerate() {
            let (_, token, ttl_ms) = locks[*at];
            let ours = read_at(&read, n)
                .first()
                .is_some_and(|kv| kv.value() == token.as_bytes() && lease.holds(kv));
            let renewed = alive? && ours;
            if renewed {
                let valid_until = sent + Duration::from_millis(ttl_ms);
                if let Some(now) = self.leases().get_mut(token).filter(|now| now.id == lease.id) {
                    now.valid_until = now.valid_until.max(valid_until);
                }
                // Asked for less than the lease lasts (a maximum hold's last renewal, a
                // shorter `extend`): ended at the validity, by this client.
                self.expire_when_invalid(token, ttl_ms, false);
            }
            found[*at] = Renewal::from_ours(renewed);
        }
        Ok(found)
    }

    /// Moves `token`'s key to a new lease for `ttl_ms` if it still holds the token.
    async fn lengthen(
        &self,
        (token, ttl_ms): (&str, u64),
        lease: &Lease,
        sent: Instant,
    ) -> Result<Renewal, LockError> {
        let (longer, granted) = self.pool.grant(seconds(ttl_ms)).await?;
        if let Some(now) = self.leases().get_mut(token).filter(|now| now.id == lease.id) {
            now.moving = Some(longer);
        }
        let moved = Txn::new()
            .when([
                Compare::value(lease.key.clone(), CompareOp::Equal, token),
                Compare::lease(lease.key.clone(), CompareOp::Equal, lease.id),
            ])
            .and_then([TxnOp::put(lease.key.clone(), token, put_on(longer))]);
        // On an error the new lease stays recorded as `moving`: renewals accept it, a release
        // revokes it.
        let moved = self.pool.txn(moved).await?.succeeded();
        let mut leases = self.leases();
        match leases.get_mut(token).filter(|now| now.id == lease.id) {
            Some(now) if moved => {
                now.id = longer;
                now.ttl_s = granted;
                now.moving = None;
                now.expiring = false;
                now.valid_until = sent + Duration::from_millis(ttl_ms);
                drop(leases);
                self.revoke_later(lease.id);
                self.expire_when_invalid(token, ttl_ms, false);
            }
            Some(now) => {
                now.moving = None;
                drop(leases);
                self.revoke_later(longer);
            }
            // Released meanwhile: the release revoked both.
            None => {}
        }
        Ok(Renewal::from_ours(moved))
    }

    async fn release_token(&self, token: &str, hold_ms: u64) -> Result<bool, LockError> {
        self.drop_place(token);
        let Some(lease) = self.leases().remove(token) else {
            return Ok(false);
        };
        if hold_ms > 0 {
            return self.keep_for(token, lease, hold_ms).await;
        }
        let mut revoked = self.pool.revoke(lease.id).await;
        if let (Ok(_), Some(moving)) = (&revoked, lease.moving) {
            revoked = self
                .pool
                .revoke(moving)
                .await
                .map(|moved| moved || revoked.unwrap_or(false));
        }
        match revoked {
            // `false`: its lease had ended, and the lock with it.
            Ok(revoked) => Ok(revoked),
            Err(e) => {
                // Not known to be gone: a later release may end it, else this client does at
                // the validity's end (or its lease does).
                let ttl_ms = u64::try_from(lease.ttl_s).unwrap_or(0).saturating_mul(1000);
                self.leases().insert(
                    token.to_owned(),
                    Lease {
                        expiring: false,
                        ..lease
                    },
                );
                self.expire_when_invalid(token, ttl_ms, true);
                Err(e)
            }
        }
    }

    /// A release before the minimum hold's end: the key is kept, marked released, on a lease of
    /// that long, and ended by this client when the hold does.
    async fn keep_for(&self, token: &str, lease: Lease, hold_ms: u64) -> Result<bool, LockError> {
        let sent = Instant::now();
        let put_back = |moving: Option<i64>| {
            // No answer: the lock stays this token's, for a later release (or its expiry).
            let ttl_ms = u64::try_from(lease.ttl_s).unwrap_or(0).saturating_mul(1000);
            self.leases().insert(
                token.to_owned(),
                Lease {
                    moving,
                    expiring: false,
                    ..lease.clone()
                },
            );
            self.expire_when_invalid(token, ttl_ms, true);
        };
        let (shorter, granted) = match self.pool.grant(seconds(hold_ms)).await {
            Ok(granted) => granted,
            Err(e) => {
                put_back(None);
                return Err(e);
            }
        };
        let kept = Txn::new()
            .when([
                Compare::value(lease.key.clone(), CompareOp::Equal, token),
                Compare::lease(lease.key.clone(), CompareOp::Equal, lease.id),
            ])
            .and_then([TxnOp::put(
                lease.key.clone(),
                format!("{token}{RELEASED}"),
                put_on(shorter),
            )]);
        let kept = match self.pool.txn(kept).await {
            Ok(answer) => answer.succeeded(),
            Err(e) => {
                put_back(Some(shorter));
                return Err(e);
            }
        };
        self.revoke_later(lease.id);
        if kept {
            self.leases().insert(
                token.to_owned(),
                Lease {
                    id: shorter,
                    ttl_s: granted,
                    moving: None,
                    key: lease.key,
                    valid_until: sent + Duration::from_millis(hold_ms),
                    expiring: false,
                },
            );
            self.expire_when_invalid(token, hold_ms, false);
        } else {
            self.revoke_later(shorter);
        }
        Ok(kept)
    }

    async fn leave_line(&self, lock: &Lock, token: &str) -> Result<(), LockError> {
        let names = Names::for_lock(lock.name());
        self.drop_place(token);
        let gone = Txn::new().and_then([
            TxnOp::delete(names.place(token), None),
            TxnOp::delete(names.claim(token), None),
        ]);
        self.pool.txn(gone).await?;
        Ok(())
    }
}

impl Drop for EtcdStore {
    /// The watch stream goes with the client.
    fn drop(&mut self) {
        self.watcher.stop();
    }
}

impl Store for EtcdStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            name: "etcd",
            // A fair release wakes the next in line, who asks (its lease is its own).
            hand_over: false,
            ..Capabilities::ALL
        }
    }

    /// `<prefix>{<key>}`, the holder's key; its helpers follow it past a 0xff byte.
    fn name(&self, key: &str) -> String {
        format!("{}{{{key}}}", self.prefix)
    }

    async fn connect(&self) -> Result<(), LockError> {
        // The rights locking needs, on a probe key: take it, let it go.
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
        let probe = Lock::new("rights-check", Store::name(self, "rights-check"));
        self.acquire(&probe, &token, &ask).await?;
        self.release_token(&token, 0).await?;
        Ok(())
    }

    async fn attempt(&self, lock: &Lock, token: &str, ask: &Ask, _: &Flight) -> Result<Attempt, LockError> {
        self.acquire(lock, token, ask).await
    }

    async fn renew(&self, locks: &[Renewing<'_>]) -> Result<Vec<Renewal>, LockError> {
        self.renew_locks(locks).await
    }

    async fn release(&self, _: &Lock, token: &str, release: Release<'_>) -> Result<Released, LockError> {
        Ok(match self.release_token(token, release.hold_ms).await? {
            false => Released::NotOurs,
            // The watch names the head of the line.
            true if release.kind == Kind::Fair => Released::Quiet,
            true => Released::Freed,
        })
    }

    async fn leave(&self, lock: &Lock, token: &str, _: bool) -> Result<(), LockError> {
        self.leave_line(lock, token).await
    }

    async fn inspect(&self, lock: &Lock) -> Result<LockView, LockError> {
        self.read_one(lock).await
    }

    async fn list(&self, pattern: &str) -> Result<Vec<LockView>, LockError> {
        self.held(pattern).await
    }

    async fn force_release(&self, lock: &Lock, seen: &LockView) -> Result<ForceReleased, LockError> {
        self.force(lock, seen).await
    }

    async fn listen(&self, lock: &Lock) {
        if self.notices.is_confirmed(lock.name()) {
            return;
        }
        let watching = self.watcher.watch(&self.pool, &self.notices, lock.name());
        let _ = tokio::time::timeout(self.pool.timeouts.response, watching).await;
    }

    fn unlisten(&self, name: &str) {
        self.watcher.unlisten(name);
    }
}
