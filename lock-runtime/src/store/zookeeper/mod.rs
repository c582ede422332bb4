//! Locks in a ZooKeeper ensemble (the `zookeeper` feature), on ZooKeeper's own recipe as Apache
//! Curator writes it: a line of ephemeral sequential nodes under the lock's node, each waiter
//! watching only the node just ahead of its own (see [`names`] for the layout).
//!
//! The session is the lease: a node lives as long as the session that created it, one session
//! per ttl class (see [`sessions`]), so a holder that dies or is cut off loses its lock when
//! the server expires its session. A holder's validity is the ttl from its request's send, and
//! never longer than its session is kept (the timeout the servers granted, less a margin for
//! what the leader may not have heard yet: see [`sessions`]), counted only from a send the
//! leader must have heard of (after a stall of this client, a later one: see [`pulse`]); every
//! renewal reads the node again behind a
//! `sync`, through the server's leader, and fails (so validity runs out) while the ensemble
//! cannot be reached. A lock taken for a ttl and not renewed is deleted by this client when its
//! ttl ends (the reaper), as Redis expires a key; a minimum hold keeps the node until it ends.
//!
//! An acquire creates its node and reads the line behind it on the same session; a try that will
//! not wait and is not first deletes its node (three requests, two writes). A caller that will
//! wait watches the node just ahead of its own; that node's deletion wakes it to look again (a
//! `sync` and a read). The fencing token of an exclusive
//! holder is its node's `czxid`, the zxid of its creation, totally ordered across the ensemble and
//! rising across leader changes; a reader's is the last fenced writer's, which a fenced writer's
//! release leaves as the lock node's data.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use zookeeper_client::{Client, CreateMode, Error as ZkError, MultiReadResult, SessionState};

use super::line::{Book, Line, Placed};
use super::{
    granted_until, Ask, Asked, Attempt, Capabilities, DynStore, Flight, Lock, Notices, Release, Released,
    Renewal, Renewing, Settings, Store, StoreConfig, Waking,
};
use crate::background::Background;
use crate::builder::addresses;
use crate::view::RELEASED;
use crate::{LockClientBuilder, LockError};

mod admin;
mod diagnose;
mod names;
mod permits;
mod pulse;
mod requests;
mod sessions;

use super::decode::userinfo;
use pulse::Pulse;
use requests::{ask, ends_session, store_error, Access, Digest, Ensemble};
use sessions::{Session, Sessions};

/// The ttl class of the session `build()` opens to check the ensemble and this client's rights.
const PROBE_TTL_MS: u64 = 10_000;

/// A ZooKeeper ensemble's servers, as given, and how to reach them.
#[derive(Clone)]
pub(crate) struct ZkConfig {
    hosts: Vec<String>,
    /// The digest user and password (from a `zk://user:password@…` URL, or
    /// [`zookeeper_auth`](LockClientBuilder::zookeeper_auth)); checked at `build()`.
    digest: Option<(String, String)>,
    /// `zks://`: TLS to every server (as is any TLS material given to the builder).
    tls: bool,
}

impl std::fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("ZkConfig")
            .field("hosts", &self.hosts)
            .field("user", &self.digest.as_ref().map(|(user, _)| user))
            .field("tls", &self.tls)
            .finish()
    }
}

impl ZkConfig {
    fn new(hosts: Vec<String>) -> ZkConfig {
        ZkConfig {
            hosts,
            digest: None,
            tls: false,
        }
    }

    /// The servers checked (`host:port` each), and a chroot after the last, if any.
    fn checked(&self) -> Result<(Vec<String>, Option<String>), LockError> {
        if self.hosts.is_empty() {
            return Err(LockError::invalid_options("no ZooKeeper server given"));
        }
        let mut hosts = Vec::with_capacity(self.hosts.len());
        let mut chroot = None;
        for host in &self.hosts {
            let host = host.trim();
            if host.contains("://") {
                return Err(LockError::invalid_options(format!(
                    "{host}: .zookeeper([…]) takes each server as host:port (zk://host:port,host:port \
                     is the URL LockClient::connect and .store(…) take)"
                )));
            }
            let (server, root) = match host.find('/') {
                Some(at) => (&host[..at], Some(&host[at..])),
                None => (host, None),
            };
            if server.contains('@') {
                return Err(LockError::invalid_options(
                    "a ZooKeeper server is host:port: give a digest user with \
                     .zookeeper_auth(user, password) (or in a zk://user:password@host:port URL)",
                ));
            }
            if server.is_empty() || server.contains(char::is_whitespace) {
                return Err(LockError::invalid_options(format!(
                    "{host:?}: a ZooKeeper server is host:port"
                )));
            }
            if let Some(root) = root.filter(|r| *r != "/") {
                if chroot.as_deref().is_some_and(|c| c != root.trim_end_matches('/')) {
                    return Err(LockError::invalid_options(
                        "the ZooKeeper servers give different chroots",
                    ));
                }
                chroot = Some(root.trim_end_matches('/').to_owned());
            }
            hosts.push(with_port(server));
        }
        Ok((hosts, chroot))
    }
}

/// `server` with ZooKeeper's port, 2181, when it names none (as zookeeper-client reads it), so
/// that messages name the port tried.
fn with_port(server: &str) -> String {
    let has_port = match server.strip_prefix('[') {
        Some(v6) => v6.contains("]:"),
        None => server.contains(':'),
    };
    match has_port {
        true => server.to_owned(),
        false => format!("{server}:2181"),
    }
}

impl StoreConfig for ZkConfig {
    fn open(&self, settings: Settings) -> Result<Arc<dyn DynStore>, LockError> {
        settings.no_replicas(
            "ZooKeeper: every write is committed by a majority of its servers before it answers",
        )?;
        let (hosts, chroot) = self.checked()?;
        let parent = names::parent_path(&settings.prefix).map_err(LockError::invalid_options)?;
        let digest = match &self.digest {
            Some((user, password)) => Some(Digest::new(user.clone(), password.clone())?),
            None => None,
        };
        // The struct update fills `tls`, a field only with the `tls` feature.
        #[allow(clippy::needless_update)]
        let mut access = Access {
            digest,
            ..Access::default()
        };
        if self.tls || !settings.tls.is_empty() {
            access = with_tls(access, &settings.tls)?;
        }
        let ensemble = Ensemble {
            hosts,
            chroot,
            timeouts: settings.timeouts,
            access,
        };
        Ok(Arc::new(ZkStore::new(ensemble, parent, settings.notices)))
    }
}

/// TLS to every server, trusting the builder's CA and presenting its client certificate, if
/// any: refused without the CA (ZooKeeper's servers are signed by a private one, and the client
/// has no system trust store to fall back on), and without the `tls` feature.
#[cfg(feature = "tls")]
fn with_tls(access: Access, material: &crate::store::TlsMaterial) -> Result<Access, LockError> {
    let pem = |bytes: &[u8]| {
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| LockError::invalid_options("invalid TLS material: PEM is text"))
    };
    let invalid = |e: ZkError| LockError::invalid_options(format!("invalid TLS material: {e}"));
    let Some(ca) = &material.root_ca else {
        return Err(LockError::invalid_options(
            "ZooKeeper over TLS needs the CA that signed the servers' certificates: give it \
             with .tls_root_ca(…)",
        ));
    };
    let mut options = zookeeper_client::TlsOptions::new()
        .with_pem_ca(&pem(ca)?)
        .map_err(invalid)?;
    if let Some((cert, key)) = &material.client_auth {
        options = options
            .with_pem_identity(&pem(cert)?, &pem(key)?)
            .map_err(invalid)?;
    }
    Ok(Access {
        tls: Some(options),
        ..access
    })
}

#[cfg(not(feature = "tls"))]
fn with_tls(_: Access, _: &crate::store::TlsMaterial) -> Result<Access, LockError> {
    Err(LockError::invalid_options(
        "ZooKeeper over TLS (a zks:// URL, or TLS material given to the builder) needs \
         lock-runtime's `tls` feature",
    ))
}

/// `zk://[user:password@]host:port,host:port[/chroot]` (`zookeeper://` too; `zks://` over
/// TLS), for `LockClient::connect`; the user and password are percent-decoded.
pub(crate) fn from_url(url: &str) -> Result<Arc<dyn StoreConfig>, LockError> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("zk", url));
    let (authority, chroot) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    let (digest, servers) = userinfo(authority);
    let mut hosts: Vec<String> = servers
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    if let Some(last) = hosts.last_mut() {
        last.push_str(chroot.trim_end_matches('/'));
    }
    Ok(Arc::new(ZkConfig {
        digest,
        tls: scheme.eq_ignore_ascii_case("zks"),
        ..ZkConfig::new(hosts)
    }))
}

impl LockClientBuilder {
    /// A ZooKeeper ensemble (the `zookeeper` feature): each server as `host:port` (a chroot may
    /// follow the last: `host:port/app`).
    ///
    /// Locks are laid out as Apache Curator's `InterProcessMutex` lays them: an ephemeral
    /// sequential node `<prefix>/<key>/_c_<uuid>-lock-<seq>` (a read lock's node is
    /// `…-__READ__<seq>`, as Curator's `InterProcessReadWriteLock`), so a Java service locking
    /// the same path with Curator's matching recipe and this client exclude each other (the
    /// guide's deployments page has the table: Curator's mutex does not see read nodes, nor its
    /// read-write lock mutex nodes). The prefix is the parent
    /// path of every lock (the default prefix `lock:` is `/locks` here); a key made of letters,
    /// digits, `-`, `_`, `:` and `.` is the node's name as written, any other is escaped. The
    /// holder is the oldest node (or the readers before the first node that excludes); a waiter watches only the node just ahead of its own, so
    /// waiters are served in order, one wake-up per release. The fencing token is the lock
    /// node's `czxid`. A client's session is its lease (one per ttl rounded up to whole
    /// seconds, asking that timeout and a margin for what the leader may not have heard yet,
    /// within what the servers allow; the guide's deployments page gives the formula): a
    /// client that dies loses its locks when its session expires, and a lock is never valid
    /// longer than its session is kept, nor counted from a request sent just after a stall of
    /// the client.
    ///
    /// Digest credentials: [`zookeeper_auth`](Self::zookeeper_auth) (the nodes are then
    /// created `creator_all`). TLS (the `tls` feature): the servers' TLS ports with
    /// [`tls_root_ca`](Self::tls_root_ca) (required) and, for servers that ask for one,
    /// [`tls_client_auth`](Self::tls_client_auth); `zks://host:port,…` is the URL form.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .zookeeper(["10.0.0.1:2181", "10.0.0.2:2181", "10.0.0.3:2181"])
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    pub fn zookeeper(self, hosts: impl IntoIterator<Item = impl AsRef<str>>) -> Self {
        self.place(ZkConfig::new(addresses(hosts)))
    }

    /// Adds ZooKeeper `digest` credentials to every session of the ensemble given to
    /// [`zookeeper`](Self::zookeeper) before this call (what `addauth digest user:password`
    /// does, and Apache Curator's `.authorization("digest", "user:password".getBytes())`), and
    /// creates every node (lock nodes and their parents) with the ACL `creator_all`: only
    /// sessions with the same user and password may read, change or delete them, so a client
    /// without them cannot release a lock it does not hold, while a Curator service with them
    /// shares the locks. The same as `zk://user:password@host:port,…`. A user has no `:`
    /// (checked at `build()`). Parents that already exist keep their ACL; without credentials,
    /// nodes are open to anyone (Curator's default).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .zookeeper(["10.0.0.1:2181", "10.0.0.2:2181", "10.0.0.3:2181"])
    ///     .zookeeper_auth("billing", "s3cret")
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    pub fn zookeeper_auth(self, user: &str, password: &str) -> Self {
        let digest = (user.to_owned(), password.to_owned());
        self.refine(
            ".zookeeper_auth",
            ".zookeeper([…])",
            move |config: &mut ZkConfig| config.digest = Some(digest),
        )
    }
}

/// What this client knows of one of its nodes, by its caller's token.
#[derive(Debug, Clone)]
struct Place {
    /// The lock's node (what its waiters' wake-ups name).
    name: String,
    /// The node's path.
    path: String,
    /// A reader's node.
    shared: bool,
    /// Its creation's zxid (an exclusive holder's fencing token).
    czxid: i64,
    /// The session it lives on.
    session: i64,
    /// A fenced exclusive caller whose token is not on the lock's node yet: taking the lock
    /// leaves it there (see [`ZkStore::leave_fence`]), else its release does.
    leaves_fence: bool,
    /// The permit a semaphore's holder claims (its node is that claim).
    permit: Option<u32>,
}

/// What the client's tasks share with the store.
#[derive(Debug)]
struct Shared {
    ensemble: Ensemble,
    sessions: Sessions,
    /// Each of this client's nodes, by token, and when each held one is due to be deleted.
    book: Book<Place>,
    /// Each waiter's watch of the node ahead of its own, by token.
    watches: Mutex<HashMap<String, AbortHandle>>,
    /// The permit a semaphore's oldest waiter saw freed (the claim whose deletion woke it), by
    /// its token: it claims that permit at once, without a look first.
    freed: Mutex<HashMap<String, u32>>,
    /// Each session's watch of its state, by session id: its end is told to every holder on
    /// it at once ([`Shared::session_ended`]).
    endings: Mutex<HashMap<i64, AbortHandle>>,
    /// Whether this client ran without a stall lately (see [`pulse`]).
    pulse: Pulse,
    notices: Notices,
}

/// Locks in one ZooKeeper ensemble.
#[derive(Debug)]
pub(crate) struct ZkStore {
    shared: Arc<Shared>,
    /// The parent path of every lock.
    parent: String,
    /// Deletes nodes whose time is up, and closes idle sessions.
    keeper: Background,
    /// Beats the pulse.
    beating: Background,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is one step, so a poisoned map is still consistent.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether an error means the request may not have been applied, nor refused: the answer was
/// lost with the connection (the client re-sends nothing; the request may still land).
fn answer_lost(error: &ZkError) -> bool {
    matches!(
        error,
        ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_) | ZkError::SessionMoved
    )
}

/// What one look at a line found.
#[derive(Default)]
struct Looked {
    children: Vec<String>,
    /// The last fenced writer's token, left on the lock's node.
    left_fence: Option<i64>,
}

/// What a multi-read of a lock's children and data found.
fn looked_in(read: Vec<MultiReadResult>) -> Result<Looked, ZkError> {
    let mut looked = Looked::default();
    for result in read {
        match result {
            MultiReadResult::Children { children } => looked.children = children,
            MultiReadResult::Data { data, .. } => {
                looked.left_fence = std::str::from_utf8(&data).ok().and_then(|d| d.parse().ok());
            }
            MultiReadResult::Error { err: ZkError::NoNode } => {}
            MultiReadResult::Error { err } => return Err(err),
            _ => {}
        }
    }
    Ok(looked)
}

impl Line for Shared {
    type Place = Place;
    const STORE: &'static str = "ZooKeeper";

    fn book(&self) -> &Book<Place> {
        &self.book
    }

    /// Deletes `place`'s node if it is still there (and, for a fenced writer, leaves its token
    /// on the lock's node for the readers after it): whether it was there.
    async fn delete(&self, place: &Place) -> Result<bool, LockError> {
        let Some(session) = self.session(place.session) else {
            // Its session ended: its node went with it.
            return Ok(false);
        };
        let client = &session.client;
        let deleted = if place.leaves_fence {
            let mut writer = client.new_multi_writer();
            let token = place.czxid.to_string();
            let added = writer
                .add_delete(&place.path, None)
                .and_then(|()| writer.add_set_data(&place.name, token.as_bytes(), None));
            if let Err(e) = added {
                return Err(store_error(&self.ensemble, &e, &place.path));
            }
            match ask(&self.ensemble, writer.commit()).await? {
                Ok(_) => Ok(()),
                // The token could not be left on the lock's node (no WRITE right on it, say):
                // the node is deleted all the same, and a reader after it takes its own token.
                Err(zookeeper_client::MultiWriteError::OperationFailed { index: 1, source }) => {
                    tracing::warn!(lock = %place.name, error = %source, "could not leave a fenced writer's token on the ZooKeeper lock node (it needs WRITE there); deleting its node without it");
                    ask(&self.ensemble, client.delete(&place.path, None)).await?
                }
                Err(e) => Err(ZkError::from(e)),
            }
        } else {
            ask(&self.ensemble, client.delete(&place.path, None)).await?
        };
        match deleted {
            Ok(()) => Ok(true),
            Err(ZkError::NoNode) => Ok(false),
            Err(e) => {
                self.failed(&session, &e);
                Err(store_error(&self.ensemble, &e, &place.path))
            }
        }
    }

    /// Not known to be gone (the ensemble did not answer): deleted by the reaper, tried again
    /// every 100 ms until it is or its session ends, so a release during a connection loss
    /// still frees the lock once the connection is back (where Curator leaves the node for
    /// good: CURATOR-678). A refusal is not retried.
    fn not_released(&self, token: &str, place: Placed<Place>, error: &LockError) {
        if !matches!(error, LockError::Refused { .. }) {
            self.book.delete_soon(token, place.of);
        }
    }

    /// A release before the minimum hold's end: the node's data is marked released (it stays
    /// with its session if this client dies).
    async fn mark_released(&self, token: &str, place: &Place, _: u64) -> Result<Option<Place>, LockError> {
        let Some(session) = self.session(place.session) else {
            return Ok(None);
        };
        let marked = format!("{token}{RELEASED}");
        let set = ask(
            &self.ensemble,
            session.client.set_data(&place.path, marked.as_bytes(), None),
        )
        .await?;
        match set {
            Ok(_) => Ok(Some(place.clone())),
            Err(ZkError::NoNode) => Ok(None),
            Err(e) => Err(store_error(&self.ensemble, &e, &place.path)),
        }
    }

    /// Stops `token`'s watch, if it has one (and forgets what it saw).
    fn unwatch(&self, token: &str) {
        if let Some(watch) = locked(&self.watches).remove(token) {
            watch.abort();
        }
        locked(&self.freed).remove(token);
    }

    fn upkeep_due(&self) -> Option<Instant> {
        self.sessions.next_idle()
    }

    /// Deletes nodes whose time is up, then closes the sessions no place is on any more.
    async fn upkeep(&self) {
        self.reap().await;
        let in_use: Vec<i64> = self.book.places().values().map(|p| p.session).collect();
        self.sessions.close_idle(|id| in_use.contains(&id));
    }
}

impl Shared {
    /// The session `id`, if it is alive.
    fn session(&self, id: i64) -> Option<Session> {
        self.sessions.by_id(id)
    }

    /// Notes what a failed request says of its session.
    fn failed(&self, session: &Session, error: &ZkError) {
        if ends_session(error) {
            self.sessions.forget(session.id);
        }
    }

    /// Watches `session`'s state (once per session): when the servers end it (expired,
    /// closed, or its credentials refused), [`session_ended`](Self::session_ended) is told.
    fn watch_end(self: &Arc<Self>, session: &Session) {
        let mut endings = locked(&self.endings);
        if endings.contains_key(&session.id) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (id, mut states) = (session.id, session.client.state_watcher());
        let shared = Arc::downgrade(self);
        let task = runtime.spawn(async move {
            let mut state = states.state();
            while !matches!(
                state,
                SessionState::Expired | SessionState::Closed | SessionState::AuthFailed
            ) {
                state = states.changed().await;
            }
            if let Some(shared) = shared.upgrade() {
                locked(&shared.endings).remove(&id);
                shared.session_ended(id, state);
            }
        });
        endings.insert(id, task.abort_handle());
    }

    /// Session `id` ended: every lock held on it is gone with its nodes, and each holder is
    /// told at once (its guard lost, an aborting body stopped) instead of at its next renewal
    /// or the end of its validity; every waiter on it looks again (its node went too).
    fn session_ended(&self, id: i64, state: SessionState) {
        let (mut held, mut waiting) = (Vec::new(), Vec::new());
        for (token, place) in self.book.places().iter().filter(|(_, p)| p.session == id) {
            match place.until {
                Some(_) if !place.kept => held.push(token.clone()),
                Some(_) => {}
                None => waiting.push((place.name.clone(), token.clone())),
            }
        }
        if held.is_empty() && waiting.is_empty() {
            return;
        }
        tracing::warn!(
            session = format_args!("{id:#x}"),
            ?state,
            locks = held.len(),
            "a ZooKeeper session ended: every lock held on it is lost"
        );
        self.sessions.forget(id);
        self.notices.held_lost(&held);
        for (name, waiter) in waiting {
            self.notices.turn(&name, waiter.as_bytes(), None);
        }
    }
}

impl ZkStore {
    fn new(ensemble: Ensemble, parent: String, notices: Notices) -> Self {
        ZkStore {
            shared: Arc::new(Shared {
                ensemble,
                sessions: Sessions::default(),
                book: Book::default(),
                watches: Mutex::new(HashMap::new()),
                freed: Mutex::new(HashMap::new()),
                endings: Mutex::new(HashMap::new()),
                pulse: Pulse::default(),
                notices,
            }),
            parent,
            keeper: Background::default(),
            beating: Background::default(),
        }
    }

    fn ensemble(&self) -> &Ensemble {
        &self.shared.ensemble
    }

    fn error(&self, error: &ZkError, path: &str) -> LockError {
        store_error(self.ensemble(), error, path)
    }

    /// The keeper and the pulse running (on this runtime, if theirs went).
    fn run_tasks(&self) {
        let shared = Arc::clone(&self.shared);
        self.keeper.ensure(move || shared.keep());
        let shared = Arc::clone(&self.shared);
        self.beating
            .ensure(move || async move { shared.pulse.run().await });
    }

    /// `sent` if a request sent then may count `session` fresh at the leader; else, after a
    /// stall of this client, the time of a later send that may, once it has come (see
    /// [`pulse`]).
    async fn confirmed(&self, sent: Instant, session: &Session) -> Instant {
        let mut sent = sent;
        while let Err(at) = self.shared.pulse.fresh(sent, session.opened, session.confirm) {
            tracing::debug!(
                session = format_args!("{:#x}", session.id),
                "this client stalled: its ZooKeeper session counts as fresh only after the leader heard of it"
            );
            tokio::time::sleep_until(at).await;
            sent = Instant::now();
        }
        sent
    }

    /// The session for `ttl_ms`, with the keeper and the pulse running and the session's end
    /// watched.
    async fn session(&self, ttl_ms: u64) -> Result<Session, LockError> {
        self.run_tasks();
        let session = self.shared.sessions.for_ttl(self.ensemble(), ttl_ms).await?;
        self.shared.watch_end(&session);
        Ok(session)
    }

    /// The children of the lock's node, with `sync` behind a `sync` (so the server this session
    /// talks to has caught up with the leader, which heard from the session after it was
    /// sent), and with `fence`, the token the last fenced writer left on it. A lock's node
    /// that does not exist has no children. One round trip (the `sync` and the read are sent
    /// together; the server answers them in order).
    async fn look(
        &self,
        session: &Session,
        lock: &str,
        fence: bool,
        sync: bool,
    ) -> Result<Looked, LockError> {
        let client = &session.client;
        // Sent first (the client sends a request when it is made, not when it is polled).
        let sync = sync.then(|| client.sync(lock));
        let synced = async {
            match sync {
                Some(sync) => sync.await,
                None => Ok(()),
            }
        };
        // The children alone (a plain read), or with the lock's data in one multi-read.
        let children = (!fence).then(|| client.list_children(lock));
        let with_fence = match fence {
            true => {
                let mut reader = client.new_multi_reader();
                if let Err(e) = reader
                    .add_get_children(lock)
                    .and_then(|()| reader.add_get_data(lock))
                {
                    return Err(self.error(&e, lock));
                }
                Some(reader.commit())
            }
            false => None,
        };
        let read = async {
            match (children, with_fence) {
                (Some(children), _) => match children.await {
                    Ok(children) => Ok(Looked {
                        children,
                        left_fence: None,
                    }),
                    Err(ZkError::NoNode) => Ok(Looked::default()),
                    Err(e) => Err(e),
                },
                (None, Some(multi)) => multi.await.and_then(looked_in),
                (None, None) => Ok(Looked::default()),
            }
        };
        let (synced, read) = ask(self.ensemble(), async { tokio::join!(synced, read) }).await?;
        let synced = match synced {
            Ok(()) | Err(ZkError::NoNode) => Ok(()),
            Err(e) => Err(e),
        };
        match synced.and(read) {
            Ok(looked) => Ok(looked),
            Err(e) => {
                self.shared.failed(session, &e);
                Err(self.error(&e, lock))
            }
        }
    }

    /// Creates `token`'s node in the lock's line (the lock's node made first when it is
    /// missing, as a container, as Curator makes it): its path and czxid. When the answer was
    /// lost, the node is looked for by its uuid.
    async fn create(
        &self,
        session: &Session,
        lock: &Lock,
        token: &str,
        shared: bool,
    ) -> Result<(String, i64), LockError> {
        let uuid = names::uuid_of(token);
        let prefix = names::node_prefix(lock.name(), &uuid, shared);
        self.create_at(session, lock, &prefix, token).await
    }

    /// Creates the ephemeral sequential node `<prefix><seq>` holding `token` (the lock's node
    /// made first when it is missing): its path and czxid. When the answer was lost, the node is
    /// looked for by its prefix.
    async fn create_at(
        &self,
        session: &Session,
        lock: &Lock,
        prefix: &str,
        token: &str,
    ) -> Result<(String, i64), LockError> {
        let client = &session.client;
        let options = CreateMode::EphemeralSequential.with_acls(self.ensemble().access.acls());
        for _ in 0..5 {
            let created = ask(self.ensemble(), client.create(prefix, token.as_bytes(), &options)).await?;
            match created {
                Ok((stat, sequence)) => {
                    let path = format!("{prefix}{sequence}");
                    let czxid = if stat.czxid > 0 {
                        stat.czxid
                    } else {
                        self.czxid_of(session, &path).await?
                    };
                    return Ok((path, czxid));
                }
                Err(ZkError::NoNode) => {
                    let parents = CreateMode::Container.with_acls(self.ensemble().access.acls());
                    match ask(self.ensemble(), client.mkdir(lock.name(), &parents)).await? {
                        Ok(()) | Err(ZkError::NodeExists) => continue,
                        // An ancestor went meanwhile (an empty container), or the chroot is not there.
                        Err(ZkError::NoNode) => {
                            self.chroot_exists(session).await?;
                            continue;
                        }
                        Err(e) => return Err(self.error(&e, lock.name())),
                    }
                }
                Err(e) if answer_lost(&e) => {
                    let mine = prefix.rsplit('/').next().unwrap_or_default();
                    if let Some(found) = self.find(session, lock.name(), mine).await? {
                        let czxid = self.czxid_of(session, &found).await?;
                        return Ok((found, czxid));
                    }
                    return Err(self.error(&e, lock.name()));
                }
                Err(e) => {
                    self.shared.failed(session, &e);
                    return Err(self.error(&e, lock.name()));
                }
            }
        }
        Err(requests::unavailable(
            self.ensemble(),
            format!("{} kept disappearing while a node was created in it", lock.name()),
        ))
    }

    /// `Refused` when the address names a chroot that does not exist: ZooKeeper makes no node
    /// under it, and only the operator can create it.
    async fn chroot_exists(&self, session: &Session) -> Result<(), LockError> {
        let Some(chroot) = &self.ensemble().chroot else {
            return Ok(());
        };
        // The client's `/` is the chroot.
        match ask(self.ensemble(), session.client.check_stat("/")).await? {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(LockError::Refused {
                reason: "the chroot in the ZooKeeper address does not exist: create it, or leave \
                         it out of the address",
                source: requests::ZooKeeperError::new(
                    self.ensemble(),
                    format!("the chroot {chroot} does not exist (zkCli.sh create {chroot} makes it)"),
                )
                .into(),
            }),
            Err(e) => Err(self.error(&e, "/")),
        }
    }

    /// The node under `lock` that a create named `mine` (before the sequence) made, if there is
    /// one: read behind a `sync` (after a reconnect the server may not have applied a create
    /// sent through another yet), named `mine` and ten digits exactly, and not a node of this
    /// client's that is known already (a leftover of an earlier attempt of the token, waiting to
    /// be deleted): the newest such.
    async fn find(&self, session: &Session, lock: &str, mine: &str) -> Result<Option<String>, LockError> {
        let children = synced_children(&self.shared.ensemble, session, lock).await?;
        let known: Vec<String> = self
            .shared
            .book
            .places()
            .values()
            .map(|p| p.path.clone())
            .collect();
        Ok(children
            .into_iter()
            .filter(|c| names::made_by(c, mine))
            .map(|c| format!("{lock}/{c}"))
            .filter(|path| !known.contains(path))
            .max())
    }

    async fn czxid_of(&self, session: &Session, path: &str) -> Result<i64, LockError> {
        match ask(self.ensemble(), session.client.check_stat(path)).await? {
            Ok(Some(stat)) => Ok(stat.czxid),
            Ok(None) => Err(requests::unavailable(
                self.ensemble(),
                format!("{path} went as soon as it was made (its session ended)"),
            )),
            Err(e) => Err(self.error(&e, path)),
        }
    }

    /// Looks at the line `place` is in, and takes the lock, waits behind the node ahead, or
    /// (a try that will not wait) gives the place up.
    async fn decide(
        &self,
        (asked, flight): (Asked<'_>, &Flight),
        place: Place,
        (sent, session): (Instant, &Session),
        sync: bool,
    ) -> Result<Attempt, LockError> {
        let Asked {
            lock,
            token,
            ask: ask_,
        } = asked;
        let fence = ask_.fencing && place.shared;
        let looked = match self.look(session, lock.name(), fence, sync).await {
            Ok(looked) => looked,
            Err(e) => {
                if !ask_.join {
                    // Not known to hold: given back (by the reaper, if not now).
                    self.shared.book.forget(token);
                    if self.shared.delete(&place).await.is_err() {
                        self.shared.book.delete_soon(token, place);
                    }
                }
                return Err(e);
            }
        };
        // A semaphore's permits claimed at the key before this node: not a lock's key. Refused,
        // naming both counts, its node given back first. (A claim made after this node is given
        // up by its maker, which sees this node.)
        let mine_seq = names::line(&looked.children)
            .iter()
            .find(|c| place.path.ends_with(&c.name))
            .map(|c| c.seq);
        let claimed_before = names::Permits::of(&looked.children)
            .holding
            .into_iter()
            .find(|claim| mine_seq.is_none_or(|mine| claim.seq < mine));
        if let Some(claim) = claimed_before {
            self.shared.book.forget(token);
            self.shared.unwatch(token);
            if self.shared.delete(&place).await.is_err() {
                self.shared.book.delete_soon(token, place);
            }
            return Err(crate::store::permits_differ(lock.key(), claim.count, 1));
        }
        let line = names::line(&looked.children);
        let mine = place.path.rsplit('/').next().unwrap_or_default();
        match names::standing(&line, mine) {
            Some(None) => {
                let left = place.leaves_fence && self.leave_fence(session, &place).await;
                let place = Place {
                    leaves_fence: place.leaves_fence && !left,
                    ..place
                };
                Ok(self.taken(token, place, ask_, (sent, session), looked.left_fence))
            }
            Some(Some(ahead)) if ask_.join => {
                let ahead = format!("{}/{}", lock.name(), ahead.name);
                self.watch(lock, token, session, ahead);
                Ok(Attempt::behind())
            }
            Some(Some(_)) => {
                self.shared.book.forget(token);
                if let Err(e) = self.shared.delete(&place).await {
                    self.shared.book.delete_soon(token, place);
                    return Err(e);
                }
                Ok(Attempt::HELD)
            }
            None => {
                // Gone already: its session ended (or an operator deleted it). In line again.
                self.shared.book.forget(token);
                if ask_.join {
                    return DynStore::attempt(self, asked, flight).await;
                }
                Ok(Attempt::HELD)
            }
        }
    }

    /// A fenced writer that takes the lock leaves its token on the lock's node at once: the
    /// readers after it take that token, and one whose session ends before its release must not
    /// leave them an older writer's, lower than a token it may have used. Whether it was left;
    /// a write that fails is warned of, and the release leaves the token instead (as it did
    /// before the take wrote it).
    async fn leave_fence(&self, session: &Session, place: &Place) -> bool {
        let token = place.czxid.to_string();
        let set = ask(
            self.ensemble(),
            session.client.set_data(&place.name, token.as_bytes(), None),
        )
        .await;
        let error = match set {
            Ok(Ok(_)) => return true,
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        tracing::warn!(lock = %place.name, %error, "could not leave a fenced writer's token on the ZooKeeper lock node as it took the lock; its release leaves it");
        false
    }

    /// The node is the lock's now: recorded as held until its ttl from `sent`; valid no longer
    /// than the session's timeout from then.
    fn taken(
        &self,
        token: &str,
        place: Place,
        ask_: &Ask,
        (sent, session): (Instant, &Session),
        left_fence: Option<i64>,
    ) -> Attempt {
        self.shared.unwatch(token);
        let fence = if place.shared {
            left_fence
                .filter(|&f| f > 0 && f < place.czxid)
                .unwrap_or(place.czxid)
        } else {
            place.czxid
        };
        let until = sent + Duration::from_millis(ask_.ttl_ms);
        let permit = place.permit;
        self.shared.book.forget(token);
        self.shared.book.record(token, Placed::held(place, until));
        Attempt::Acquired {
            permit,
            fence: ask_.fencing.then(|| u64::try_from(fence).unwrap_or(0)),
            granted_until: granted_until(sent + session.keeps, until),
        }
    }

    /// Has `token` woken when `ahead` (the node just ahead of its own) changes or goes.
    fn watch(&self, lock: &Lock, token: &str, session: &Session, ahead: String) {
        let client: Client = session.client.clone();
        let notices = self.shared.notices.clone();
        let (name, waiter) = (lock.name().to_owned(), token.to_owned());
        let within = self.ensemble().timeouts.response;
        let task = tokio::spawn(async move {
            match tokio::time::timeout(within, client.check_and_watch_stat(&ahead)).await {
                Ok(Ok((Some(_), watcher))) => {
                    // Deleted, changed, or the session ended: it looks again.
                    let _ = watcher.changed().await;
                }
                Ok(Ok((None, _))) => {} // gone already
                Ok(Err(e)) => tracing::debug!(error = %e, "cannot watch the node ahead of a waiter"),
                Err(_) => tracing::debug!("no answer to the watch of the node ahead of a waiter"),
            }
            notices.turn(&name, waiter.as_bytes(), None);
        });
        if let Some(old) = locked(&self.shared.watches).insert(token.to_owned(), task.abort_handle()) {
            old.abort();
        }
    }

    /// A waiter looks again (woken: the node ahead of it went, or a nap ended). A node gone
    /// (its session ended) is made again, at the end of the line.
    async fn look_again(
        &self,
        asked: Asked<'_>,
        flight: &Flight,
        place: Place,
    ) -> Result<Attempt, LockError> {
        let token = asked.token;
        let sent = Instant::now();
        let Some(session) = self.shared.session(place.session) else {
            self.shared.book.forget(token);
            self.shared.unwatch(token);
            return DynStore::attempt(self, asked, flight).await;
        };
        let sent = self.confirmed(sent, &session).await;
        // Behind a `sync`: a server cut off from the leader still answers reads for a while,
        // from a state that may still show this client's node after its session ended.
        self.decide((asked, flight), place, (sent, &session), true).await
    }

    /// The node of `token`, which this client never heard of (an attempt whose answer never
    /// came, sent on the session `flight` names): looked for and deleted through that same
    /// session. The client sends a session's requests in order, and the servers answer them in
    /// order (a request it queued while disconnected is sent before any made later), so a read
    /// on that session that is answered comes after the create, whether it landed or not: once
    /// one is, nothing is left. Until then (the session is disconnected) it is tried again in
    /// the background, until it is or the session ends (its nodes end with it).
    async fn delete_unknown(&self, lock: &Lock, token: &str, flight: &Flight) -> Result<Released, LockError> {
        let Some(id) = flight.get().map(|route| route as i64) else {
            return Ok(Released::NotOurs); // no create was sent
        };
        let uuid = names::uuid_of(token);
        match delete_by_uuid(&self.shared, id, lock.name(), &uuid).await {
            Ok(deleted) => Ok(if deleted {
                Released::Quiet
            } else {
                Released::NotOurs
            }),
            Err(e) => {
                let (shared, name) = (Arc::clone(&self.shared), lock.name().to_owned());
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        match delete_by_uuid(&shared, id, &name, &uuid).await {
                            Ok(_) => return,
                            Err(e) => {
                                tracing::debug!(error = %e, "could not delete the node of an abandoned ZooKeeper attempt; trying again")
                            }
                        }
                    }
                });
                Err(e)
            }
        }
    }
}

/// The children of `lock` (none if it does not exist), read behind a `sync` in one round trip:
/// after a reconnect the server may not have applied yet a create sent through another.
async fn synced_children(
    ensemble: &Ensemble,
    session: &Session,
    lock: &str,
) -> Result<Vec<String>, LockError> {
    let client = &session.client;
    let (synced, children) = ask(ensemble, async {
        tokio::join!(client.sync(lock), client.list_children(lock))
    })
    .await?;
    match synced.and(children) {
        Ok(children) => Ok(children),
        Err(ZkError::NoNode) => Ok(Vec::new()),
        Err(e) => Err(store_error(ensemble, &e, lock)),
    }
}

/// Deletes the nodes of `uuid` under `lock` through the session `id` (see
/// [`ZkStore::delete_unknown`]): whether one was there. A session that ended took them with it.
async fn delete_by_uuid(shared: &Shared, id: i64, lock: &str, uuid: &str) -> Result<bool, LockError> {
    let Some(session) = shared.sessions.by_id(id) else {
        return Ok(false);
    };
    let client = &session.client;
    let mine = names::protection(uuid);
    // "Not there" is taken as final: read behind a `sync`.
    let children = synced_children(&shared.ensemble, &session, lock).await?;
    let mut deleted = false;
    for child in children.iter().filter(|c| c.starts_with(&mine)) {
        let path = format!("{lock}/{child}");
        match ask(&shared.ensemble, client.delete(&path, None)).await? {
            Ok(()) => deleted = true,
            Err(ZkError::NoNode) => {}
            Err(e) => return Err(store_error(&shared.ensemble, &e, &path)),
        }
    }
    Ok(deleted)
}

impl Drop for ZkStore {
    /// The client's tasks go with it, and its sessions are closed (their nodes with them).
    fn drop(&mut self) {
        self.keeper.stop();
        self.beating.stop();
        for (_, watch) in locked(&self.shared.watches).drain() {
            watch.abort();
        }
        for (_, ending) in locked(&self.shared.endings).drain() {
            ending.abort();
        }
        drop(self.shared.sessions.take_all());
    }
}

impl Store for ZkStore {
    /// `<parent>/<key as a node name>`: the lock's nodes are its children.
    fn name(&self, key: &str) -> String {
        names::lock_path(&self.parent, key)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            name: "zookeeper",
            // The next in line holds once the node ahead is deleted; it looks (a read).
            waking: Waking::Queued { watched: true },
            ..Capabilities::ALL
        }
    }

    async fn connect(&self) -> Result<(), LockError> {
        // A session, and the rights locking needs: an ephemeral node made and deleted under the
        // parent path (made, as a container, if missing).
        let session = self.session(PROBE_TTL_MS).await?;
        // A lock node no key has (`node_name` never writes `%` followed by a plain name).
        let probe = format!("{}/%rights-check", self.parent);
        let lock = Lock::new("rights-check", probe);
        let token = crate::holder::new_value("rights-check");
        let (path, _) = self.create(&session, &lock, &token, false).await?;
        match ask(self.ensemble(), session.client.delete(&path, None)).await? {
            Ok(()) | Err(ZkError::NoNode) => Ok(()),
            Err(e) => Err(self.error(&e, &path)),
        }
    }

    async fn attempt(&self, asked: Asked<'_>, flight: &Flight) -> Result<Attempt, LockError> {
        let Asked {
            lock,
            token,
            ask: ask_,
        } = asked;
        if ask_.mode.semaphore() {
            return self.permit_attempt(lock, token, ask_, flight).await;
        }
        let known = self.shared.book.places().get(token).cloned();
        if let Some(place) = known.filter(|p| p.until.is_none()).map(|p| p.of) {
            return self.look_again(asked, flight, place).await;
        }
        let sent = Instant::now();
        let session = self.session(ask_.ttl_ms).await?;
        let sent = self.confirmed(sent, &session).await;
        // The release of an attempt whose answer never came follows it on this session.
        flight.set(session.id as u64);
        let (path, czxid) = self.create(&session, lock, token, ask_.mode.shared()).await?;
        let place = Place {
            name: lock.name().to_owned(),
            path,
            shared: ask_.mode.shared(),
            czxid,
            session: session.id,
            leaves_fence: ask_.fencing && !ask_.mode.shared(),
            permit: None,
        };
        // Recorded at once: a release after a lost answer finds it.
        self.shared.book.record(token, Placed::waiting(place.clone()));
        // Read behind its own create on the same session: the server has applied it, so every
        // node before it that still exists is seen (no `sync` needed).
        self.decide((asked, flight), place, (sent, &session), false).await
    }

    async fn renew(&self, locks: &[Renewing<'_>]) -> Result<Vec<Renewal>, LockError> {
        let sent = Instant::now();
        self.run_tasks();
        let mut found = vec![Renewal::Gone; locks.len()];
        // When each lock's renewal was sent: its session's (later after a stall).
        let mut sent_at = vec![sent; locks.len()];
        // By session: one `sync` each, then a read of each node, sent together.
        let mut by_session: HashMap<i64, Vec<(usize, Place)>> = HashMap::new();
        for (at, (_, token, _)) in locks.iter().enumerate() {
            let place = self
                .shared
                .book
                .places()
                .get(*token)
                .filter(|p| p.holds())
                .map(|p| p.of.clone());
            if let Some(place) = place {
                by_session.entry(place.session).or_default().push((at, place));
            }
        }
        let checks = by_session.into_iter().map(|(id, places)| async move {
            let Some(session) = self.shared.session(id) else {
                return (None, places, sent, Ok(Vec::new()));
            };
            let sent = self.confirmed(sent, &session).await;
            let client = &session.client;
            let sync = client.sync(&places[0].1.path);
            let stats = join_all(places.iter().map(|(_, p)| client.check_stat(&p.path)));
            let checked = match ask(self.ensemble(), async { tokio::join!(sync, stats) }).await {
                Ok((Ok(()) | Err(ZkError::NoNode), stats)) => Ok(stats),
                Ok((Err(e), _)) => {
                    self.shared.failed(&session, &e);
                    Err(self.error(&e, &places[0].1.path))
                }
                Err(e) => Err(e),
            };
            (Some(session), places, sent, checked)
        });
        // Each session on its own: one that cannot be reached leaves its locks undecided (the
        // watchdog retries them while they are valid), and the others' are renewed.
        let mut failed = None;
        for (session, places, sent, checked) in join_all(checks).await {
            let Some(session) = session else {
                continue; // its session ended: every lock on it is gone
            };
            for (at, _) in &places {
                sent_at[*at] = sent;
            }
            let stats = match checked {
                Ok(stats) => stats,
                Err(e) => {
                    for (at, _) in &places {
                        found[*at] = Renewal::Undecided;
                    }
                    failed.get_or_insert(e);
                    continue;
                }
            };
            for ((at, place), stat) in places.iter().zip(stats) {
                let ttl = Duration::from_millis(locks[*at].2);
                found[*at] = match stat {
                    Ok(Some(stat)) if stat.czxid == place.czxid && stat.ephemeral_owner == session.id => {
                        Renewal::Renewed {
                            granted_until: granted_until(sent + session.keeps, sent + ttl),
                        }
                    }
                    Ok(_) => Renewal::Gone,
                    Err(e) => {
                        self.shared.failed(&session, &e);
                        failed.get_or_insert(self.error(&e, &place.path));
                        Renewal::Undecided
                    }
                };
            }
        }
        // Nothing decided, because every session failed: the answer is that failure (an
        // `extend` reports it as it is).
        if let Some(e) = failed {
            if found.iter().all(|r| matches!(r, Renewal::Undecided)) {
                return Err(e);
            }
        }
        self.shared.book.renewed(locks, &found, |at| sent_at[at]);
        Ok(found)
    }

    /// An attempt whose answer never came may have made a node, or (a semaphore's, while its
    /// queue node is what this client knows of it) claimed a permit: every node of its uuid is
    /// deleted, on the session the attempt went on.
    async fn release(&self, lock: &Lock, token: &str, release: Release<'_>) -> Result<Released, LockError> {
        let unknown = |sent_on| self.delete_unknown(lock, token, sent_on);
        self.shared.release(token, &release, unknown).await
    }

    async fn leave(&self, _: &Lock, token: &str, _: bool) -> Result<(), LockError> {
        self.shared.leave(token).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_and_urls_are_checked() {
        let config = ZkConfig::new(vec!["a:2181".into(), "b:2181/app/".into()]);
        let (hosts, chroot) = config.checked().unwrap();
        assert_eq!(hosts, ["a:2181", "b:2181"]);
        assert_eq!(chroot.as_deref(), Some("/app"));
        let portless = ZkConfig::new(vec![
            "a".into(),
            "[::1]".into(),
            "[::1]:2182".into(),
            "b:2183/app".into(),
        ]);
        let (hosts, _) = portless.checked().unwrap();
        assert_eq!(hosts, ["a:2181", "[::1]:2181", "[::1]:2182", "b:2183"]);
        let bad = ZkConfig::new(vec!["zk://a:2181".into()]);
        assert!(bad.checked().is_err());
        assert!(ZkConfig::new(vec![]).checked().is_err());
        let with_user = ZkConfig::new(vec!["u:p@a:2181".into()]);
        let Err(LockError::InvalidOptions { reason }) = with_user.checked() else {
            panic!("a server with credentials taken");
        };
        assert!(
            reason.contains(".zookeeper_auth") && !reason.contains("u:p"),
            "{reason}"
        );
        let url = from_url("zk://a:2181,b:2182/app").unwrap();
        let shown = format!("{url:?}");
        assert!(
            shown.contains("a:2181") && shown.contains("b:2182/app"),
            "{shown}"
        );
    }

    /// The ZooKeeper description behind a URL.
    fn config_of(url: &str) -> ZkConfig {
        let config = from_url(url).unwrap();
        let any: &dyn std::any::Any = &*config;
        any.downcast_ref::<ZkConfig>().unwrap().clone()
    }

    #[test]
    fn urls_carry_a_digest_user_percent_decoded_and_never_show_its_password() {
        let config = config_of("zk://locker:pa%3Ass%2Fw%40rd@a:2181,b:2182/app");
        assert_eq!(
            config.digest,
            Some(("locker".to_owned(), "pa:ss/w@rd".to_owned()))
        );
        assert_eq!(config.hosts, ["a:2181", "b:2182/app"]);
        assert!(!config.tls);
        assert!(config_of("zks://a:2181").tls);
        assert_eq!(config_of("zk://a:2181").digest, None);
        let shown = format!("{config:?}");
        assert!(shown.contains("locker") && !shown.contains("pa:ss"), "{shown}");
        let builder = LockClientBuilder::default()
            .zookeeper(["a:2181"])
            .zookeeper_auth("locker", "hidden-password");
        let shown = format!("{builder:?}");
        assert!(
            shown.contains("locker") && !shown.contains("hidden-password"),
            "{shown}"
        );
        let digest = Digest::new("locker".into(), "hidden-password".into()).unwrap();
        // Without the `tls` feature the digest is `Access`'s only field.
        #[allow(clippy::needless_update)]
        let access = Access {
            digest: Some(digest),
            ..Access::default()
        };
        let shown = format!("{access:?}");
        assert!(
            shown.contains("locker") && !shown.contains("hidden-password"),
            "{shown}"
        );
    }

    #[test]
    fn digest_users_and_tls_requests_are_checked_at_build() {
        let invalid = |builder: LockClientBuilder| match builder.build_lazy() {
            Err(LockError::InvalidOptions { reason }) => reason,
            other => panic!("{other:?}"),
        };
        let reason = invalid(
            LockClientBuilder::default()
                .zookeeper(["a:2181"])
                .zookeeper_auth("a:b", "c"),
        );
        assert!(reason.contains("`:`"), "{reason}");
        let reason = invalid(LockClientBuilder::default().zookeeper_auth("a", "b"));
        assert!(reason.contains(".zookeeper([…])"), "{reason}");
        assert!(LockClientBuilder::default()
            .zookeeper(["a:2181"])
            .zookeeper_auth("a", "b:c")
            .build_lazy()
            .is_ok());
        let zks = LockClientBuilder::default().store("zks://a:2181");
        let with_material = LockClientBuilder::default()
            .zookeeper(["a:2181"])
            .tls_client_auth(b"cert", b"key");
        for builder in [zks, with_material] {
            let reason = invalid(builder);
            if cfg!(feature = "tls") {
                assert!(reason.contains(".tls_root_ca"), "{reason}");
            } else {
                assert!(reason.contains("`tls` feature"), "{reason}");
            }
        }
        let not_pem = LockClientBuilder::default()
            .zookeeper(["a:2181"])
            .tls_root_ca(b"not a certificate");
        let reason = invalid(not_pem);
        if cfg!(feature = "tls") {
            assert!(reason.contains("invalid TLS material"), "{reason}");
        } else {
            assert!(reason.contains("`tls` feature"), "{reason}");
        }
    }
}
