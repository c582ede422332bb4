//! Locks in an etcd v3 cluster (the `etcd` feature), on etcd's own recipe (its `concurrency`
//! and `recipes` packages): a line of keys in revision order, each attached to its client's
//! session lease.
//!
//! The keys of a lock named `L` (`<prefix>{<key>}`), past a byte 0xff (which UTF-8 never has:
//! no other lock's key falls among them):
//!
//! - `L␣lw/<id>`: a writer's place in line (an exclusive lock is a writer), its value the
//!   holder's token (`<id> <owner>`), attached to the session lease of its client for its ttl.
//!   A writer holds the lock when no place in line was created before its own.
//! - `L␣lr/<id>`: a reader's place; a reader holds a share when no writer's place was created
//!   before its own.
//! - `L␣fence`: the last fenced writer's token (20 digits), written with its release on a
//!   short lease, for a fenced reader after it.
//!
//! A try that will not wait is one transaction that puts the caller's place only if the line
//! is empty (for a reader: has no writer): at most one raft write, also when refused. A caller
//! that will wait puts its place at once (one write) and, when someone is ahead, watches only
//! the place just ahead of its own; that one's deletion wakes it to look again (a read). A
//! release is one deletion, and the hand-off to the next in line that deletion plus one watch
//! event. The fencing token of a writer is its place's create revision, which etcd raises with
//! every write, across leader changes; a reader's is the last writer's before it.
//!
//! A client's places live as long as its session lease (see [`sessions`]): a client that dies or
//! is cut off loses them within the ttl. A lock taken for a ttl and not renewed is deleted by
//! this client when its ttl ends (the reaper), and a minimum hold moves the key to a lease of
//! its own. Nothing is written without a lease or a deletion that follows.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};
use futures_util::future::join_all;
use tokio::time::Instant;

use super::decode::userinfo;
use super::line::{Book, Line, Placed};
use super::{
    granted_until, Ask, Asked, Attempt, Capabilities, DynStore, Flight, Kind, Lock, Notices, Release,
    Released, Renewal, Renewing, SetAsk, SetAttempt, Settings, Store, StoreConfig, Waking,
};
use crate::background::Background;
use crate::builder::addresses;
use crate::redact::hide_credentials;
use crate::view::RELEASED;
use crate::{LockClientBuilder, LockError};

mod admin;
mod names;
mod permits;
mod pool;
mod sessions;
mod watcher;

use names::{fence_value, Names, Part};
use pool::{Access, Pool};
use sessions::{seconds, Session, Sessions};

/// The most operations etcd takes in one transaction (its default `--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;

/// How long the last fenced writer's token is kept after its release, for the readers after
/// it (a reader after that gets the revision of its own place, which is above every earlier
/// writer's token and below every later one).
const FENCE_KEPT: Duration = Duration::from_secs(60);

/// The first etcd releases with both fixes for leases that end early on a leader change (etcd
/// #13932 in 3.5.3 and 3.4.20; #15247 by #16822 in 3.5.13 and 3.4.31), by minor version.
const FIXED_IN: [(u64, u64, u64); 2] = [(3, 4, 31), (3, 5, 13)];

/// An etcd user's name and password.
type User = (String, String);

/// An etcd cluster's endpoints, and who this client is to it.
#[derive(Clone)]
pub(crate) struct EtcdConfig {
    endpoints: Vec<String>,
    user: Option<User>,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let endpoints: Vec<String> = self.endpoints.iter().map(|e| hide_credentials(e)).collect();
        f.debug_struct("Etcd")
            .field("endpoints", &endpoints)
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .finish()
    }
}

/// An endpoint without its credentials, and the credentials (`user:password@`) it had.
fn split_credentials(endpoint: &str) -> (String, Option<User>) {
    let Some((scheme, rest)) = endpoint.split_once("://") else {
        return (endpoint.to_owned(), None);
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match userinfo(&rest[..authority_end]) {
        (Some(user), host) => (format!("{scheme}://{host}{}", &rest[authority_end..]), Some(user)),
        (None, _) => (endpoint.to_owned(), None),
    }
}

impl EtcdConfig {
    fn new(endpoints: impl IntoIterator<Item = String>) -> Self {
        EtcdConfig {
            endpoints: endpoints.into_iter().collect(),
            user: None,
        }
    }

    /// The endpoints checked, without credentials, and who logs in (given to the builder, or
    /// in the endpoints, the same in each).
    fn checked(&self) -> Result<(Vec<String>, Option<User>), LockError> {
        if self.endpoints.is_empty() {
            return Err(LockError::invalid_options("no etcd endpoint given"));
        }
        let mut user = self.user.clone();
        let mut plain = Vec::with_capacity(self.endpoints.len());
        for endpoint in &self.endpoints {
            let shown = hide_credentials(endpoint);
            let scheme = endpoint
                .split_once("://")
                .map(|(scheme, _)| scheme.to_ascii_lowercase());
            match scheme.as_deref() {
                Some("http" | "https") => {}
                Some("etcd" | "etcds") => {
                    return Err(LockError::invalid_options(format!(
                        "{shown}: .etcd([…]) takes each member as http://host:2379 (https:// with TLS); \
                         etcd://host:2379 is the URL LockClient::connect and .store(…) take"
                    )))
                }
                _ => {
                    return Err(LockError::invalid_options(format!(
                        "{shown}: an etcd endpoint is http://host:2379 (https:// with TLS)"
                    )))
                }
            }
            let (endpoint, given) = split_credentials(endpoint);
            match (&user, given) {
                (_, None) => {}
                (None, Some(given)) => user = Some(given),
                (Some(known), Some(given)) if *known == given => {}
                (Some(_), Some(_)) => {
                    return Err(LockError::invalid_options(
                        "the etcd endpoints give different users or passwords: give one (in each \
                         endpoint, or with .etcd_user)",
                    ))
                }
            }
            plain.push(endpoint);
        }
        Ok((plain, user))
    }
}

impl StoreConfig for EtcdConfig {
    fn open(&self, settings: Settings) -> Result<Arc<dyn DynStore>, LockError> {
        settings
            .no_replicas("etcd: every write is committed by a majority of its members before it answers")?;
        let (endpoints, user) = self.checked()?;
        let https = endpoints.iter().any(|e| e.starts_with("https://"));
        if !https {
            settings.no_tls_material(
                "TLS material was given, but no etcd endpoint is https://: write https://host:2379",
            )?;
        }
        if https && !cfg!(feature = "tls") {
            return Err(LockError::invalid_options(
                "https:// etcd endpoints need lock-runtime's `tls` feature",
            ));
        }
        let access = Access {
            user,
            tls: settings.tls.clone(),
        };
        Ok(Arc::new(EtcdStore::new(endpoints, access, settings)))
    }
}

/// `etcd://host:port` (`etcds://` with TLS), or a cluster's members `etcd://host:port,host:port`,
/// credentials before the first (`etcd://user:password@host:port,…`), for
/// `LockClient::connect`.
pub(crate) fn from_url(url: &str) -> Result<Arc<dyn StoreConfig>, LockError> {
    let (scheme, members) = url.split_once("://").unwrap_or(("etcd", url));
    let http = if scheme.eq_ignore_ascii_case("etcds") {
        "https"
    } else {
        "http"
    };
    let (user, members) = userinfo(members);
    let endpoints = members
        .trim_end_matches('/')
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(|m| format!("{http}://{m}"));
    Ok(Arc::new(EtcdConfig {
        user,
        ..EtcdConfig::new(endpoints)
    }))
}

impl LockClientBuilder {
    /// An etcd v3 cluster (the `etcd` feature): `http://host:2379` for each member
    /// (`https://` with the `tls` feature; a private CA and a client certificate with
    /// [`tls_root_ca`](Self::tls_root_ca) and [`tls_client_auth`](Self::tls_client_auth)),
    /// credentials in an endpoint (`http://user:password@host:2379`) or with
    /// [`etcd_user`](Self::etcd_user).
    ///
    /// Locks follow etcd's own recipe: each caller's place in a line in revision order, on its
    /// client's session lease (one per ttl, renewed in the background); the holder is the
    /// oldest place, its fencing token the place's create revision (strictly increasing
    /// across leader changes); a waiter watches only the place ahead of its own, so waiters
    /// are served in order, one wake-up per release. etcd's leases have whole seconds and a
    /// minimum (2 s with its default election timeout): a client that dies loses its locks
    /// within the ttl rounded up to that, while a holder's validity is the ttl as asked. The
    /// prefix starts each key, as on Redis. Run etcd with `--auto-compaction-retention` (the
    /// guide's etcd page says why).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .etcd(["http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://10.0.0.3:2379"])
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    pub fn etcd(self, endpoints: impl IntoIterator<Item = impl AsRef<str>>) -> Self {
        self.place(EtcdConfig::new(addresses(endpoints)))
    }

    /// Logs in to etcd (its auth) as `user` with `password`, for the cluster given to
    /// [`etcd`](Self::etcd) before this call. A refusal (a wrong password, a user without the
    /// rights locking needs: read and write under the prefix) fails `build()` with
    /// [`LockError::Refused`], saying etcd's reason.
    pub fn etcd_user(self, user: &str, password: &str) -> Self {
        let (user, password) = (user.to_owned(), password.to_owned());
        self.refine(".etcd_user", ".etcd([…])", move |config: &mut EtcdConfig| {
            config.user = Some((user, password));
        })
    }
}

/// What a renewal read of one place found.
#[derive(Debug, Clone, Copy)]
enum Found {
    Renewal(Renewal),
    /// Still this token's, on this lease (not the one this client knew).
    On(i64),
}

/// What this client knows of one of its places in line, by its caller's token.
#[derive(Debug, Clone)]
struct Place {
    /// The lock's name (what its waiters' wake-ups name).
    name: String,
    /// The place's key.
    key: Vec<u8>,
    /// A reader's place.
    shared: bool,
    /// Its create revision (its fencing token, for a writer).
    created: i64,
    /// The lease it is attached to, as last known.
    lease: i64,
    /// A fenced writer: its release leaves its token for the readers after it.
    fenced: bool,
    /// A reader's fencing token: the last writer's token known before its place.
    after_writer: i64,
    /// The permit a semaphore's holder holds (its key is the permit's, not named by its
    /// token).
    permit: Option<u32>,
}

/// What the client's tasks share with the store.
#[derive(Debug)]
struct Shared {
    pool: Arc<Pool>,
    sessions: Sessions,
    /// Each of this client's places in line, by token, and when each held one is due to be deleted.
    book: Book<Place>,
    notices: Notices,
    watcher: watcher::Watcher,
    /// The lease fenced writers' tokens are left on, and when it was granted (a new one each
    /// half of [`FENCE_KEPT`]).
    fence_lease: tokio::sync::Mutex<Option<(i64, Instant)>>,
}

/// Locks in one etcd cluster.
pub(crate) struct EtcdStore {
    shared: Arc<Shared>,
    prefix: String,
    /// Renews the sessions and deletes places whose time is up.
    keeper: Background,
    /// Warned once about an old etcd.
    checked_version: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("pool", &self.shared.pool)
            .finish_non_exhaustive()
    }
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

fn token_of(revision: i64) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

/// A fence key's token (its value, or its mod revision for one an earlier version wrote).
fn fence_of(kv: &KeyValue) -> i64 {
    std::str::from_utf8(kv.value())
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(kv.mod_revision())
}

/// etcd refused a transaction for its number of operations (its `--max-txn-ops`).
fn too_many_operations(e: &LockError) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if cause.to_string().contains("too many operations in txn request") {
            return true;
        }
        source = cause.source();
    }
    false
}

/// The id part of a token (`<id> <owner>`): what its place's key is named by.
fn id_of(token: &str) -> &str {
    token.split_once(' ').map_or(token, |(id, _)| id)
}

/// A version `3.4.23` as numbers.
fn version_of(text: &str) -> Option<(u64, u64, u64)> {
    let mut parts = text.split(['.', '-', '+']).map(|p| p.parse::<u64>());
    Some((parts.next()?.ok()?, parts.next()?.ok()?, parts.next()?.ok()?))
}

/// Whether etcd `version` has both lease fixes (see [`FIXED_IN`]).
fn has_lease_fixes(version: (u64, u64, u64)) -> bool {
    match FIXED_IN
        .iter()
        .find(|(major, minor, _)| (*major, *minor) == (version.0, version.1))
    {
        Some(fixed) => version >= *fixed,
        None => version > FIXED_IN[FIXED_IN.len() - 1],
    }
}

/// Pins the leader (see `Pool::status_and_leader`) and, with `warn`, warns when the cluster's
/// etcd may end leases early on a leader change (once per client).
async fn check_cluster(pool: Arc<Pool>, warn: bool) {
    match pool.status_and_leader().await {
        Ok(text) => match version_of(&text) {
            Some(version) if warn && !has_lease_fixes(version) => tracing::warn!(
                etcd = %text,
                "this etcd can end a lease early on a leader change (etcd #13932, #15247), which \
                 ends locks early: run etcd 3.5.13, 3.4.31 or later"
            ),
            _ => {}
        },
        Err(e) => tracing::debug!(error = %e, "could not read etcd's status"),
    }
}

/// The newest places first (created before `end_before`, if given), at most `limit`.
fn newest_first(end_before: Option<i64>, limit: i64) -> GetOptions {
    let options = GetOptions::new()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(limit);
    match end_before {
        Some(created) => options.with_max_create_revision(created - 1),
        None => options,
    }
}

impl Line for Shared {
    type Place = Place;
    const STORE: &'static str = "etcd";

    fn book(&self) -> &Book<Place> {
        &self.book
    }

    fn upkeep_due(&self) -> Option<Instant> {
        self.sessions.next_due()
    }

    /// Renews the sessions in use (a lapsed one's places are lost), then deletes places whose
    /// time is up.
    async fn upkeep(&self) {
        let in_use = |lease: i64| self.book.places().values().any(|p| p.lease == lease);
        let kept = self.sessions.keep(&self.pool, in_use).await;
        for lease in kept.lapsed {
            self.lapsed(lease);
        }
        self.reap().await;
    }

    /// Deletes `place` if it is still the one this client put (and, for a fenced writer,
    /// leaves its token for the readers after it): whether it was there.
    async fn delete(&self, place: &Place) -> Result<bool, LockError> {
        if place.permit.is_some() {
            // A permit's key is any holder's in turn: deleted only while it is still this one.
            let still_ours = Compare::create_revision(place.key.clone(), CompareOp::Equal, place.created);
            let delete = TxnOp::delete(place.key.clone(), None);
            return Ok(self
                .pool
                .txn(Txn::new().when([still_ours]).and_then([delete]))
                .await?
                .succeeded());
        }
        if !place.fenced || place.shared || place.created == 0 {
            // Only this token's caller writes a key named by its id: a bare deletion is its own.
            let key = place.key.clone();
            let deleted = self
                .pool
                .ask(|client| {
                    let key = key.clone();
                    async move { client.kv_client().delete(key, None).await }
                })
                .await?;
            return Ok(deleted.deleted() > 0);
        }
        // A fenced writer's place (the early return above took every other).
        let lease = self.fence_lease().await?;
        let then = [
            TxnOp::delete(place.key.clone(), None),
            TxnOp::put(
                Names::for_lock(&place.name).fence(),
                fence_value(place.created),
                Some(PutOptions::new().with_lease(lease)),
            ),
        ];
        // The token is left only by the writer that holds it (not by a place deleted already).
        let still_ours = Compare::create_revision(place.key.clone(), CompareOp::Equal, place.created);
        Ok(self
            .pool
            .txn(Txn::new().when([still_ours]).and_then(then))
            .await?
            .succeeded())
    }

    /// Not known to be gone: deleted at its validity's end, or its session ends it.
    fn not_released(&self, token: &str, place: Placed<Place>, _: &LockError) {
        let until = place.until.unwrap_or_else(Instant::now);
        self.book.record(token, Placed::held(place.of, until));
    }

    /// A release before the minimum hold's end: the place is marked released, on a lease of
    /// that long (so it stays if this client dies).
    async fn mark_released(
        &self,
        token: &str,
        place: &Place,
        hold_ms: u64,
    ) -> Result<Option<Place>, LockError> {
        let (lease, _) = self.pool.grant(seconds(hold_ms)).await?;
        let kept = Txn::new()
            .when([Compare::create_revision(
                place.key.clone(),
                CompareOp::Equal,
                place.created,
            )])
            .and_then([TxnOp::put(
                place.key.clone(),
                format!("{token}{RELEASED}"),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let marked = self.pool.txn(kept).await?.succeeded();
        Ok(marked.then(|| Place {
            lease,
            ..place.clone()
        }))
    }

    fn unwatch(&self, token: &str) {
        self.watcher.cancel(&self.pool, &self.notices, token);
    }
}

impl Shared {
    /// The lease fenced writers' tokens go on: granted again each half of [`FENCE_KEPT`], so
    /// that each token is kept between half of it and all of it after its release.
    async fn fence_lease(&self) -> Result<i64, LockError> {
        let mut lease = self.fence_lease.lock().await;
        match *lease {
            Some((id, granted)) if granted.elapsed() < FENCE_KEPT / 2 => Ok(id),
            _ => {
                let granted = Instant::now();
                let (id, _) = self
                    .pool
                    .grant(i64::try_from(FENCE_KEPT.as_secs()).unwrap_or(60))
                    .await?;
                *lease = Some((id, granted));
                Ok(id)
            }
        }
    }

    /// The waiters whose places were on `lease` look again (it lapsed: their places went).
    fn lapsed(&self, lease: i64) {
        let waiting: Vec<(String, String)> = self
            .book
            .places()
            .iter()
            .filter(|(_, p)| p.lease == lease && p.until.is_none())
            .map(|(token, p)| (p.name.clone(), token.clone()))
            .collect();
        for (name, token) in waiting {
            self.notices.turn(&name, token.as_bytes(), None);
        }
    }
}

impl EtcdStore {
    fn new(endpoints: Vec<String>, access: Access, settings: Settings) -> Self {
        let Settings {
            prefix,
            timeouts,
            notices,
            ..
        } = settings;
        EtcdStore {
            shared: Arc::new(Shared {
                pool: Arc::new(Pool::new(endpoints, timeouts, access)),
                sessions: Sessions::default(),
                book: Book::default(),
                notices,
                watcher: watcher::Watcher::default(),
                fence_lease: tokio::sync::Mutex::new(None),
            }),
            prefix,
            keeper: Background::default(),
            checked_version: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn pool(&self) -> &Arc<Pool> {
        &self.shared.pool
    }

    /// The session for `ttl_ms`, with the keeper running.
    async fn session(&self, ttl_ms: u64) -> Result<Session, LockError> {
        let shared = Arc::clone(&self.shared);
        self.keeper.ensure(move || shared.keep());
        let (session, granted) = self.shared.sessions.for_ttl(self.pool(), ttl_ms).await?;
        if granted {
            // The keeper renews it from now on.
            self.shared.book.wake_keeper();
        }
        if self.pool().should_look_for_leader() {
            let warn = !self
                .checked_version
                .swap(true, std::sync::atomic::Ordering::Relaxed);
            tokio::spawn(check_cluster(Arc::clone(self.pool()), warn));
        }
        Ok(session)
    }

    /// The place is the lock's now: recorded as held until its ttl from `sent`, no longer
    /// than its session is kept.
    fn taken(
        &self,
        token: &str,
        place: Place,
        ask: &Ask,
        (sent, session): (Instant, Session),
        last_fence: i64,
    ) -> Attempt {
        let fence = if place.shared {
            // The last writer's token (its place before this one, or the one it left); else
            // this place's revision, above every earlier writer's and below every later one.
            Some(place.after_writer.max(last_fence))
                .filter(|&f| f > 0)
                .unwrap_or(place.created)
        } else {
            place.created
        };
        self.shared.unwatch(token);
        let until = sent + Duration::from_millis(ask.ttl_ms);
        let permit = place.permit;
        self.shared.book.record(token, Placed::held(place, until));
        Attempt::Acquired {
            permit,
            fence: ask.fencing.then_some(token_of(fence)),
            granted_until: granted_until(session.kept_until, until),
        }
    }

    /// Has `token` watch the place `ahead` of its own, from the revision after `read`.
    fn wait_behind(&self, lock: &Lock, token: &str, ahead: Vec<u8>, read: i64) {
        self.shared.watcher.watch(
            self.pool(),
            &self.shared.notices,
            (lock.name(), token),
            ahead,
            read + 1,
        );
    }

    /// A waiter looks again (woken: the place ahead of it went, or a nap ended): one read of
    /// its own place and of the newest one ahead of it. A place gone (its session lapsed) is
    /// put again, at the end of the line.
    async fn look_again(
        &self,
        lock: &Lock,
        token: &str,
        ask: &Ask,
        place: Place,
    ) -> Result<Attempt, LockError> {
        let names = Names::for_lock(lock.name());
        let sent = Instant::now();
        let session = self.session(ask.ttl_ms).await?;
        let (line_start, line_end) = if place.shared {
            names.writers()
        } else {
            names.line()
        };
        // Served by the member without a round of the cluster: a place ahead that one member
        // no longer has is gone for good (no place is ever created ahead of an older one), and
        // an older state only shows more places ahead, which makes the waiter wait longer.
        let ahead = newest_first(Some(place.created), 1)
            .with_range(line_end)
            .with_keys_only()
            .with_serializable();
        let look = Txn::new().and_then([
            TxnOp::get(place.key.clone(), Some(GetOptions::new().with_serializable())),
            TxnOp::get(line_start, Some(ahead)),
            TxnOp::get(names.fence(), Some(GetOptions::new().with_serializable())),
        ]);
        let answer = self.pool().txn(look).await?;
        let read = revision(&answer);
        let responses = answer.op_responses();
        let mine = read_at(&responses, 0).first();
        if mine.is_none_or(|kv| kv.create_revision() != place.created) {
            // Gone with its session (or deleted by an operator): in line again, at the end.
            self.shared.book.places().remove(token);
            let ask = Ask { join: true, ..*ask };
            return DynStore::attempt(self, Asked::new(lock, token, &ask), &Flight::default()).await;
        }
        let last_fence = read_at(&responses, 2).first().map_or(0, fence_of);
        let lease = mine.map_or(place.lease, KeyValue::lease);
        match read_at(&responses, 1).first() {
            None => {
                let place = Place { lease, ..place };
                let session = match self.shared.sessions.by_id(lease) {
                    Some(on) => on,
                    None => session,
                };
                Ok(self.taken(token, place, ask, (sent, session), last_fence))
            }
            Some(kv) => {
                let ahead = kv.key().to_vec();
                if let Some(known) = self.shared.book.places().get_mut(token) {
                    if place.shared {
                        known.after_writer = known.after_writer.max(kv.create_revision()).max(last_fence);
                    }
                    known.lease = lease;
                }
                self.wait_behind(lock, token, ahead, read);
                Ok(Attempt::behind())
            }
        }
    }

    /// The ttl in seconds of the session with lease `id` (0: not a session of this client).
    fn class_of(&self, id: i64) -> i64 {
        self.shared.sessions.by_id(id).map_or(0, |s| s.ttl_s)
    }

    /// Renews the sessions `places` are on (one request each, sent now) and reads the places
    /// (one request per [`MAX_TXN_OPS`]): each is renewed when it is still this token's, on
    /// the session renewed.
    async fn renew_on_sessions(&self, places: &[(usize, Place)]) -> Result<Vec<Found>, LockError> {
        if places.is_empty() {
            return Ok(Vec::new());
        }
        let sent = Instant::now();
        let mut leases: Vec<i64> = places.iter().map(|(_, p)| p.lease).collect();
        leases.sort_unstable();
        leases.dedup();
        let renewals = join_all(leases.iter().map(|lease| self.pool().keep_alive(*lease)));
        let reads = join_all(places.chunks(MAX_TXN_OPS).map(|chunk| {
            let read = Txn::new().and_then(
                chunk
                    .iter()
                    .map(|(_, p)| TxnOp::get(p.key.clone(), None))
                    .collect::<Vec<_>>(),
            );
            self.pool().txn(read)
        }));
        let (renewals, reads) = tokio::join!(renewals, reads);
        let mut alive = HashMap::new();
        for (lease, renewed) in leases.iter().zip(renewals) {
            let renewed = renewed?;
            if renewed {
                self.shared.sessions.renewed(*lease, sent);
            }
            alive.insert(*lease, renewed);
        }
        let mut read = Vec::with_capacity(places.len());
        for chunk in reads {
            read.extend(chunk?.op_responses());
        }
        let found = places
            .iter()
            .enumerate()
            .map(|(n, (_, place))| match read_at(&read, n).first() {
                Some(kv) if kv.create_revision() == place.created && kv.lease() == place.lease => {
                    Found::Renewal(Renewal::from_ours(
                        alive.get(&place.lease).copied().unwrap_or(false),
                    ))
                }
                Some(kv) if kv.create_revision() == place.created => Found::On(kv.lease()),
                _ => Found::Renewal(Renewal::Gone),
            });
        Ok(found.collect())
    }

    /// Makes sure `place`, found on `lease`, is on a session at least as long as `ttl_ms` (moving
    /// it to a longer one if not, only from the lease it was found on: a move racing another
    /// never shortens it), and renews that session with a keep-alive sent after the caller's
    /// clock read: renewed when the place is still this token's. The place keeps its create
    /// revision, so its place in line and its fencing token.
    async fn settle(&self, place: &Place, mut lease: i64, ttl_ms: u64) -> Result<Renewal, LockError> {
        for _ in 0..3 {
            let sent = Instant::now();
            if self.class_of(lease) >= seconds(ttl_ms) {
                if !self.pool().keep_alive(lease).await? {
                    return Ok(Renewal::Gone);
                }
                self.shared.sessions.renewed(lease, sent);
                self.known_on(place, lease);
                return Ok(Renewal::RENEWED);
            }
            let session = self.session(ttl_ms).await?;
            let moved = Txn::new()
                .when([
                    Compare::create_revision(place.key.clone(), CompareOp::Equal, place.created),
                    Compare::lease(place.key.clone(), CompareOp::Equal, lease),
                ])
                .and_then([TxnOp::put(
                    place.key.clone(),
                    Vec::<u8>::new(),
                    Some(PutOptions::new().with_lease(session.id).with_ignore_value()),
                )])
                .or_else([TxnOp::get(place.key.clone(), None)]);
            let (moved, renewed) = tokio::join!(self.pool().txn(moved), self.pool().keep_alive(session.id));
            let (moved, renewed) = (moved?, renewed?);
            if renewed {
                self.shared.sessions.renewed(session.id, sent);
            }
            if moved.succeeded() {
                self.known_on(place, session.id);
                return Ok(if renewed {
                    Renewal::RENEWED
                } else {
                    Renewal::Undecided
                });
            }
            match read_at(moved.op_responses().as_slice(), 0).first() {
                Some(kv) if kv.create_revision() == place.created => lease = kv.lease(),
                _ => return Ok(Renewal::Gone),
            }
        }
        Ok(Renewal::Undecided)
    }

    /// This client's record of `place` says it is on `lease` now.
    fn known_on(&self, place: &Place, lease: i64) {
        if let Some(known) = self
            .shared
            .book
            .places()
            .values_mut()
            .find(|p| p.key == place.key)
        {
            known.lease = lease;
        }
    }

    /// The place of `token`, which this client never heard of (an attempt whose answer never
    /// came): deleted now, and once more after a request sent before could still have landed.
    /// With `permits`, a semaphore's: its place in the queue, and any permit it may have taken
    /// (a permit's key is not named by its token: found by its value).
    async fn delete_unknown(&self, lock: &Lock, token: &str, permits: bool) -> Result<Released, LockError> {
        let names = Names::for_lock(lock.name());
        let id = id_of(token);
        let keys = [names.place(id, false), names.place(id, true), names.queued(id)];
        let pool = Arc::clone(self.pool());
        let (token, range) = (token.to_owned(), names.permits());
        let delete = move || {
            let pool = Arc::clone(&pool);
            let (keys, token, (start, end)) = (keys.clone(), token.clone(), range.clone());
            async move {
                let mut ops: Vec<TxnOp> = keys.into_iter().map(|key| TxnOp::delete(key, None)).collect();
                if permits {
                    ops.push(TxnOp::get(start, Some(GetOptions::new().with_range(end))));
                }
                let answer = pool.txn(Txn::new().and_then(ops)).await?;
                let responses = answer.op_responses();
                let mut deleted = responses
                    .iter()
                    .any(|r| matches!(r, TxnOpResponse::Delete(d) if d.deleted() > 0));
                let taken = read_at(&responses, 3).iter().filter(|kv| {
                    let value = kv.value();
                    value == token.as_bytes()
                        || value.strip_prefix(token.as_bytes()) == Some(RELEASED.as_bytes())
                });
                for kv in taken {
                    let still =
                        Compare::create_revision(kv.key().to_vec(), CompareOp::Equal, kv.create_revision());
                    let delete = TxnOp::delete(kv.key().to_vec(), None);
                    deleted |= pool
                        .txn(Txn::new().when([still]).and_then([delete]))
                        .await?
                        .succeeded();
                }
                Ok::<bool, LockError>(deleted)
            }
        };
        // A request is abandoned after the response timeout; one that reached etcd is applied
        // (or not) well within as long again. (A place left would hold the line back as long as
        // this client lives.)
        let after = self.pool().timeouts.response * 2 + Duration::from_secs(1);
        let late = delete.clone();
        let started = Instant::now();
        tokio::spawn(async move {
            // Until a deletion succeeded once `after` has passed: tried every 200 ms while etcd
            // fails (between leaders, say), for a minute at most.
            for _ in 0..300 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                match late().await {
                    Ok(_) if started.elapsed() >= after => return,
                    Ok(_) => tokio::time::sleep(after.saturating_sub(started.elapsed())).await,
                    Err(e) => {
                        tracing::debug!(error = %e, "could not delete the place of an abandoned etcd attempt; trying again");
                    }
                }
            }
        });
        let deleted = delete().await?;
        Ok(if deleted {
            Released::Quiet
        } else {
            Released::NotOurs
        })
    }
}

impl Drop for EtcdStore {
    /// The client's tasks go with it, and its sessions are revoked (its places with them).
    fn drop(&mut self) {
        self.keeper.stop();
        self.shared.watcher.stop();
        let sessions = self.shared.sessions.take_all();
        if let (Ok(runtime), false) = (tokio::runtime::Handle::try_current(), sessions.is_empty()) {
            let pool = Arc::clone(self.pool());
            runtime.spawn(async move {
                for lease in sessions {
                    let _ = pool.revoke(lease).await;
                }
            });
        }
    }
}

impl Store for EtcdStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            name: "etcd",
            // The next in line holds once the place ahead is deleted; it looks (a read).
            waking: Waking::Queued { watched: false },
            ..Capabilities::ALL
        }
    }

    /// `<prefix>{<key>}`: its places in line follow it past a 0xff byte.
    fn name(&self, key: &str) -> String {
        super::name(&self.prefix, key)
    }

    async fn connect(&self) -> Result<(), LockError> {
        // The rights locking needs, on a probe key under the prefix: etcd checks the rights of
        // every operation of a transaction, also those of the branch it does not take (here
        // the write: its condition never holds, so nothing is written).
        let names = Names::for_lock(&Store::name(self, "rights-check"));
        let probe = names.fence();
        let txn = Txn::new()
            .when([Compare::version(probe.clone(), CompareOp::Less, 0)])
            .and_then([TxnOp::put(probe.clone(), "", None)])
            .or_else([TxnOp::get(probe, None)]);
        self.pool().txn(txn).await?;
        if self.pool().should_look_for_leader() {
            let warn = !self
                .checked_version
                .swap(true, std::sync::atomic::Ordering::Relaxed);
            check_cluster(Arc::clone(self.pool()), warn).await;
        }
        Ok(())
    }

    async fn attempt(&self, asked: Asked<'_>, _: &Flight) -> Result<Attempt, LockError> {
        let Asked { lock, token, ask } = asked;
        if ask.mode.semaphore() {
            return self.permit_attempt(lock, token, ask).await;
        }
        let known = self.shared.book.places().get(token).map(|p| p.of.clone());
        if let Some(place) = known.filter(|p| p.created > 0) {
            return self.look_again(lock, token, ask, place).await;
        }
        let names = Names::for_lock(lock.name());
        let sent = Instant::now();
        let session = self.session(ask.ttl_ms).await?;
        let key = names.place(id_of(token), ask.mode.shared());
        let put = TxnOp::put(key.clone(), token, Some(PutOptions::new().with_lease(session.id)));
        let answer = self.pool().txn(acquire_txn(&names, (&key, put), ask)).await?;
        let responses = answer.op_responses();
        // Refused, it read one permit held (if any), after its own place (if it will wait).
        let permit_at = usize::from(ask.join);
        let held = (!answer.succeeded())
            .then(|| read_at(&responses, permit_at).first())
            .flatten()
            .and_then(|kv| match names.classify(kv.key()) {
                Some(Part::Permit { count, .. }) => Some(count),
                _ => None,
            });
        if let Some(held) = held {
            return Err(crate::store::permits_differ(lock.key(), held, 1));
        }
        if !answer.succeeded() {
            if ask.join {
                // An earlier send of this attempt put the place: look at it as a waiter does.
                let Some(kv) = read_at(answer.op_responses().as_slice(), 0).first().cloned() else {
                    return Ok(Attempt::HELD);
                };
                let place = Place {
                    name: lock.name().to_owned(),
                    key,
                    shared: ask.mode.shared(),
                    created: kv.create_revision(),
                    lease: kv.lease(),
                    fenced: ask.fencing,
                    after_writer: 0,
                    permit: None,
                };
                self.shared.book.record(token, Placed::waiting(place.clone()));
                return self.look_again(lock, token, ask, place).await;
            }
            return Ok(Attempt::HELD);
        }
        let created = revision(&answer);
        let (ahead, fence_at) = if ask.join { (1, 2) } else { (usize::MAX, 1) };
        let last_fence = read_at(&responses, fence_at).first().map_or(0, fence_of);
        let before: Vec<&KeyValue> = read_at(&responses, ahead)
            .iter()
            .filter(|kv| kv.create_revision() < created)
            .collect();
        let mut place = Place {
            name: lock.name().to_owned(),
            key,
            shared: ask.mode.shared(),
            created,
            lease: session.id,
            fenced: ask.fencing,
            after_writer: if ask.mode.shared() {
                before.first().map_or(0, |kv| kv.create_revision())
            } else {
                0
            },
            permit: None,
        };
        match before.first() {
            None => Ok(self.taken(token, place, ask, (sent, session), last_fence)),
            Some(kv) => {
                let (ahead_key, read) = (kv.key().to_vec(), revision(&answer));
                place.after_writer = place.after_writer.max(last_fence);
                self.shared.book.record(token, Placed::waiting(place));
                self.wait_behind(lock, token, ahead_key, read);
                Ok(Attempt::behind())
            }
        }
    }

    /// Every lock of a set, or none, in one transaction: each lock's place put (each for its
    /// own token, on one session) only if every lock's line is empty, as a try of one lock that
    /// will not wait does for one. Every place has the transaction's revision, so each lock's
    /// fencing token rises as a single lock's does. Refused, it reads how many are in each line,
    /// to name the first lock held (not for a caller that will wait, which goes on key by key).
    async fn attempt_set(&self, set: SetAsk<'_>, _: &Flight) -> Result<Option<SetAttempt>, LockError> {
        let SetAsk { locks, tokens, ask } = set;
        // Two compares a lock.
        if locks.len() * 2 > MAX_TXN_OPS {
            return Ok(None);
        }
        let sent = Instant::now();
        let session = self.session(ask.ttl_ms).await?;
        let (mut empty, mut puts, mut counts) = (Vec::new(), Vec::new(), Vec::new());
        let mut places = Vec::with_capacity(locks.len());
        for (lock, token) in locks.iter().zip(tokens) {
            let names = Names::for_lock(lock.name());
            let (start, end) = names.line();
            let key = names.place(id_of(token), false);
            let (permits, permits_end) = names.permits();
            empty.push(Compare::create_revision(start.clone(), CompareOp::Equal, 0).with_range(end.clone()));
            empty.push(
                Compare::create_revision(permits.clone(), CompareOp::Equal, 0)
                    .with_range(permits_end.clone()),
            );
            let on_session = PutOptions::new().with_lease(session.id);
            puts.push(TxnOp::put(key.clone(), token.as_str(), Some(on_session)));
            if !ask.join {
                counts.push(TxnOp::get(
                    start,
                    Some(GetOptions::new().with_range(end).with_count_only()),
                ));
            }
            // A semaphore's permits held at the key: refused as a single lock is.
            let one = GetOptions::new()
                .with_range(permits_end)
                .with_limit(1)
                .with_keys_only();
            counts.push(TxnOp::get(permits, Some(one)));
            places.push((lock.name().to_owned(), key));
        }
        let answer = match self
            .pool()
            .txn(Txn::new().when(empty).and_then(puts).or_else(counts))
            .await
        {
            // A cluster that takes fewer operations in a transaction than the set needs
            // (`--max-txn-ops` below its default): key by key.
            Err(e) if too_many_operations(&e) => return Ok(None),
            answer => answer?,
        };
        let responses = answer.op_responses();
        if !answer.succeeded() {
            // Per lock: its line's count (only for a caller that will not wait), then one
            // permit held.
            let per_lock = if ask.join { 1 } else { 2 };
            for (at, lock) in locks.iter().enumerate() {
                let names = Names::for_lock(lock.name());
                let permit = read_at(&responses, at * per_lock + per_lock - 1).first();
                if let Some(Part::Permit { count, .. }) = permit.and_then(|kv| names.classify(kv.key())) {
                    return Err(crate::store::permits_differ(lock.key(), count, 1));
                }
            }
            let held = |at: &usize| match responses.get(at * per_lock) {
                Some(TxnOpResponse::Get(got)) => got.count() > 0,
                _ => false,
            };
            let at = (0..locks.len()).find(held).filter(|_| !ask.join).unwrap_or(0);
            return Ok(Some(SetAttempt::Refused { at, pttl_ms: None }));
        }
        let created = revision(&answer);
        let mut fences = Vec::with_capacity(locks.len());
        let mut granted = None;
        for ((name, key), token) in places.into_iter().zip(tokens) {
            let place = Place {
                name,
                key,
                shared: false,
                created,
                lease: session.id,
                fenced: ask.fencing,
                after_writer: 0,
                permit: None,
            };
            if let Attempt::Acquired {
                fence, granted_until, ..
            } = self.taken(token, place, ask, (sent, session), 0)
            {
                fences.push(fence);
                granted = granted.or(granted_until);
            }
        }
        Ok(Some(SetAttempt::Taken {
            fences,
            granted_until: granted,
        }))
    }

    async fn renew(&self, locks: &[Renewing<'_>]) -> Result<Vec<Renewal>, LockError> {
        let mut found = vec![Renewal::Gone; locks.len()];
        // Each lock still held: on a session long enough for the ttl asked (renewed with one
        // keep-alive per session and one read per batch), or to move to a longer one (an
        // `extend`).
        let mut kept = Vec::new();
        let mut moving = Vec::new();
        for (at, (_, token, ttl_ms)) in locks.iter().enumerate() {
            let Some(place) = self
                .shared
                .book
                .places()
                .get(*token)
                .filter(|p| p.holds())
                .map(|p| p.of.clone())
            else {
                continue;
            };
            if self.class_of(place.lease) >= seconds(*ttl_ms) {
                kept.push((at, place));
            } else {
                moving.push((at, place.lease, place));
            }
        }
        for ((at, place), found_now) in kept.iter().zip(self.renew_on_sessions(&kept).await?) {
            match found_now {
                // On another lease than this client last knew (an `extend` whose answer was
                // lost, or one racing this renewal, moved it): settled below.
                Found::On(lease) => moving.push((*at, lease, place.clone())),
                Found::Renewal(renewal) => found[*at] = renewal,
            }
        }
        let settled = join_all(
            moving
                .iter()
                .map(|(at, lease, place)| self.settle(place, *lease, locks[*at].2)),
        );
        for ((at, _, _), renewal) in moving.iter().zip(settled.await) {
            found[*at] = renewal?;
        }
        // Deleted by this client no sooner than the holder's validity ends (which counts from
        // before the requests).
        let sent = Instant::now();
        self.shared.book.renewed(locks, &found, |_| sent);
        Ok(found)
    }

    /// An attempt whose answer never came may have put a place, or (a semaphore's, while its
    /// place in the queue is what this client knows of it) taken a permit: looked for by its
    /// token, now and once more when a late request could no longer land.
    async fn release(&self, lock: &Lock, token: &str, release: Release<'_>) -> Result<Released, LockError> {
        let permits = release.kind == Kind::Permit;
        let unknown = |_: &Flight| self.delete_unknown(lock, token, permits);
        self.shared.release(token, &release, unknown).await
    }

    async fn leave(&self, _: &Lock, token: &str, _: bool) -> Result<(), LockError> {
        self.shared.leave(token).await
    }
}

/// The transaction of one attempt at a lock (not a semaphore's): with `ask.join`, its place
/// `key` put at once (`put`) and the newest place before it read (a reader's: the newest
/// writer's); else the place put only if nobody is in line (no writer, for a reader). Either way
/// refused where a semaphore's permit is held at the key (one read, to name its count), and a
/// reader reads the fencing token the last writer left.
fn acquire_txn(names: &Names, (key, put): (&[u8], TxnOp), ask: &Ask) -> Txn {
    let (line_start, line_end) = if ask.mode.shared() {
        names.writers()
    } else {
        names.line()
    };
    // A reader's fencing token may be the one the last writer left.
    let fence = ask.mode.shared().then(|| TxnOp::get(names.fence(), None));
    // A semaphore's permits held at the key (read with the attempt): the key is not a
    // lock's, and the acquire is refused naming both counts.
    let (permits, permits_end) = names.permits();
    let any_permit = || {
        let one = GetOptions::new()
            .with_range(permits_end.clone())
            .with_limit(1)
            .with_keys_only();
        TxnOp::get(permits.clone(), Some(one))
    };
    if ask.join {
        // A place in line, at once; then who is ahead of it (the newest place before it:
        // its own is the newest of all).
        let ahead = GetOptions::new()
            .with_range(line_end.clone())
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(if ask.mode.shared() { 1 } else { 2 })
            .with_keys_only();
        let no_permits =
            Compare::create_revision(permits.clone(), CompareOp::Equal, 0).with_range(permits_end.clone());
        Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0), no_permits])
            .and_then(
                [put, TxnOp::get(line_start.clone(), Some(ahead))]
                    .into_iter()
                    .chain(fence)
                    .collect::<Vec<_>>(),
            )
            .or_else([TxnOp::get(key, None), any_permit()])
    } else {
        // Only if nobody is in line (no writer, for a reader) and no permit is held: one
        // write, or none taken.
        let empty =
            Compare::create_revision(line_start.clone(), CompareOp::Equal, 0).with_range(line_end.clone());
        let no_permits =
            Compare::create_revision(permits.clone(), CompareOp::Equal, 0).with_range(permits_end.clone());
        let then: Vec<TxnOp> = std::iter::once(put).chain(fence).collect();
        Txn::new()
            .when([empty, no_permits])
            .and_then(then)
            .or_else([any_permit()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_with_both_lease_fixes() {
        for (text, fixed) in [
            ("3.4.23", false),
            ("3.4.31", true),
            ("3.5.12", false),
            ("3.5.13", true),
            ("3.5.21", true),
            ("3.6.0", true),
            ("3.3.27", false),
        ] {
            assert_eq!(has_lease_fixes(version_of(text).unwrap()), fixed, "{text}");
        }
        assert_eq!(version_of("3.6.0-rc.1"), Some((3, 6, 0)));
    }

    #[test]
    fn credentials_come_out_of_endpoints_and_urls() {
        let (plain, user) = split_credentials("http://app:p%40ss@10.0.0.1:2379");
        assert_eq!(plain, "http://10.0.0.1:2379");
        assert_eq!(user, Some(("app".to_owned(), "p@ss".to_owned())));
        assert_eq!(split_credentials("http://10.0.0.1:2379").1, None);
        let shown = format!("{:?}", EtcdConfig::new(["http://app:secret@h:2379".to_owned()]));
        assert!(!shown.contains("secret"), "{shown}");
    }
}
