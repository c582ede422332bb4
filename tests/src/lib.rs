//! The test kit: real `redis-server` processes on free loopback ports, and the two lock backends
//! behind one [`Target`], so a behaviour test runs unchanged on Redis and in memory.
//!
//! Never a mock: every Redis test talks to a `redis-server` started here, in its own temp dir,
//! killed on drop. The binary comes from `$REDIS_SERVER` or `PATH`; when it is missing the kit
//! panics with how to install it, so a run without Redis fails loudly instead of skipping.

use std::ffi::OsString;
use std::future::Future;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockClientBuilder, LockOptions};

mod abandoned;
pub mod affinity;
pub mod bench;
mod cluster;
mod etcd;
pub mod hand_written;
mod logs;
pub mod mariadb;
pub mod postgres;
pub mod process;
mod proxy;
mod sentinel;
mod tls;
mod zookeeper;

pub use abandoned::a_late_attempt_is_given_back;
pub use cluster::{RedisCluster, SlotMigration};
pub use etcd::EtcdCluster;
pub use logs::Logs;
pub use mariadb::{shared_mysql_url, MariadbServer};
pub use postgres::{shared_postgres_url, PostgresServer};
pub use proxy::FaultProxy;
pub use sentinel::SentinelSetup;
pub use tls::TestCerts;
pub use zookeeper::{Curator, CuratorLock, ZkEnsemble, SECURE_PASSWORD, SECURE_USER};

/// One second, the unit most test deadlines are written in.
pub const SECOND: Duration = Duration::from_secs(1);

/// Options with a ttl of `ms` milliseconds and nothing else.
pub fn ttl(ms: u64) -> LockOptions {
    LockOptions::new(Duration::from_millis(ms))
}

/// One `redis-server` process on a free loopback port (and, made by
/// [`RedisServer::spawn_tls`], a second one for TLS).
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    tls_port: Option<u16>,
    /// Arguments before the common ones (a config file must come first), the same at every
    /// (re)start.
    leading_args: Vec<OsString>,
    /// Arguments after the common ones, the same at every (re)start.
    extra_args: Vec<OsString>,
    dir: tempfile::TempDir,
    binary: PathBuf,
}

impl RedisServer {
    /// Starts a server on a free port (no persistence) and waits until it answers PING.
    pub fn spawn() -> RedisServer {
        RedisServer::spawn_with(|_, _| (None, Vec::new()))
    }

    /// Starts a server on a free port with `args` after the common ones (`--port`, `--bind
    /// 127.0.0.1`, no persistence, its own temp dir and log file), e.g.
    /// `["--replicaof", "127.0.0.1", "6379"]`, and waits until it answers PING. The arguments
    /// stay the same at every [`restart`](Self::restart).
    pub fn spawn_with_args<I, S>(args: I) -> RedisServer
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        RedisServer::spawn_with(|_, _| (None, args.clone()))
    }

    /// Starts a server with the extra arguments and TLS port that `configure` returns, given
    /// the server's (new, empty) temp dir and plaintext port; on "Address already in use",
    /// tries again with a new temp dir and new ports.
    fn spawn_with(mut configure: impl FnMut(&Path, u16) -> (Option<u16>, Vec<OsString>)) -> RedisServer {
        RedisServer::spawn_on(free_port, |dir, port| {
            let (tls_port, extra_args) = configure(dir, port);
            Launch {
                tls_port,
                extra_args,
                ..Launch::default()
            }
        })
    }

    /// Starts a server on the port `pick_port` returns, launched as `configure` says given the
    /// server's (new, empty) temp dir and that port; on "Address already in use", tries again
    /// with a new temp dir and a new port.
    fn spawn_on(
        mut pick_port: impl FnMut() -> u16,
        mut configure: impl FnMut(&Path, u16) -> Launch,
    ) -> RedisServer {
        let binary = redis_binary();
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("cannot create a temp dir: {e}"));
            let port = pick_port();
            let Launch {
                tls_port,
                leading_args,
                extra_args,
            } = configure(dir.path(), port);
            let mut server = RedisServer {
                child: None,
                port,
                tls_port,
                leading_args,
                extra_args,
                dir,
                binary: binary.clone(),
            };
            match server.start() {
                Ok(()) => return server,
                Err(log) if log.contains("Address already in use") => continue,
                Err(log) => panic!("redis-server did not start on port {}:\n{log}", server.port),
            }
        }
        panic!("no free port for redis-server after 20 tries");
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Starts the process on `self.port`; on failure returns its log.
    fn start(&mut self) -> Result<(), String> {
        let child = Command::new(&self.binary)
            .args(&self.leading_args)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.binary.display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if ping(self.port) {
                return Ok(());
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
                .is_some();
            if exited || Instant::now() > deadline {
                self.stop();
                let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
                return Err(if exited {
                    log
                } else {
                    format!("no PING answer within 10 s\n{log}")
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id, while the process runs (not after [`kill`](Self::kill)).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process was started and not killed since (a paused process is running).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The server's own temp dir: its working dir (`--dir`) and where its log and any config
    /// file live.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the process (SIGKILL): clients see connections drop and refused.
    pub fn kill(&mut self) {
        self.stop();
    }

    /// Freezes the process (SIGSTOP): connections stay open and nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Unfreezes a paused process (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Kills the process and starts a new, empty one on the same port, with the same arguments
    /// (TLS included).
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.start() {
                Ok(()) => return,
                Err(log) if log.contains("Address already in use") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(log) => panic!("redis-server did not restart on port {}:\n{log}", self.port),
            }
        }
    }

    fn signal(&self, signal: &str) {
        process::signal_child(self.child.as_ref(), "redis-server", signal);
    }

    /// A plain `redis` connection, to look at and tamper with keys from outside the library.
    pub async fn raw(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap_or_else(|e| panic!("bad url: {e}"))
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the test redis-server: {e}"))
    }
}

impl RedisServer {
    /// How many commands the server ran successfully, counting those inside scripts and leaving
    /// out `INFO` (what this asks with).
    pub async fn commands_executed(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.raw().await)
            .await
            .unwrap_or_else(|e| panic!("INFO commandstats failed: {e}"));
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter(|l| !l.starts_with("info:"))
            .map(|stats| {
                let field = |name: &str| -> u64 {
                    stats
                        .split([',', ':'])
                        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0)
                };
                field("calls") - field("failed_calls")
            })
            .sum()
    }

    /// How many times the server ran `command` (lower case) successfully, counting calls made
    /// inside scripts: `calls` less `failed_calls` of `cmdstat_<command>` in
    /// `INFO commandstats` (an `EVALSHA` answered `NOSCRIPT` is a failed call).
    pub async fn command_calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.raw().await)
            .await
            .unwrap_or_else(|e| panic!("INFO commandstats failed: {e}"));
        let prefix = format!("cmdstat_{command}:");
        let Some(stats) = info.lines().find_map(|l| l.strip_prefix(prefix.as_str())) else {
            return 0;
        };
        let field = |name: &str| -> u64 {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        field("calls") - field("failed_calls")
    }

    /// Returns once a waiter for `key` (under the default prefix `lock:`) left the lock's
    /// waiting mark. For a plain exclusive waiter (neither fencing nor fair: its first attempt is
    /// a bare `SET`, which leaves none) that is its second attempt, made after it began
    /// listening: it then sleeps until a release wakes it (or its nap ends). A fencing waiter
    /// or a reader marks the lock at its first attempt already, before it listens.
    pub async fn waiter_refused(&self, key: &str) {
        let mark = lock_runtime::redis::keys::LockKeys::new(lock_runtime::DEFAULT_PREFIX, key).waiting();
        let raw = self.raw().await;
        eventually(5 * SECOND, "a refused waiter marked the lock", || {
            let (mut raw, mark) = (raw.clone(), mark.as_str());
            async move {
                redis::cmd("EXISTS")
                    .arg(mark)
                    .query_async::<bool>(&mut raw)
                    .await
                    .unwrap_or_else(|e| panic!("EXISTS {mark}: {e}"))
            }
        })
        .await;
    }

    /// The channels some client is subscribed to (`PUBSUB CHANNELS`).
    pub async fn subscribed_channels(&self) -> Vec<String> {
        redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .query_async(&mut self.raw().await)
            .await
            .unwrap_or_else(|e| panic!("PUBSUB CHANNELS failed: {e}"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A paused process must be woken to die cleanly.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
        }
        self.stop();
    }
}

/// How [`RedisServer::spawn_on`] launches a server, besides the common arguments.
#[derive(Debug, Default)]
struct Launch {
    /// The TLS port, if it also listens with TLS.
    tls_port: Option<u16>,
    /// Arguments before the common ones: a config file must be the first argument.
    leading_args: Vec<OsString>,
    /// Arguments after the common ones.
    extra_args: Vec<OsString>,
}

/// Starts a detached `sh` that waits for this test process to exit, then kills `servers` and
/// removes their temp dirs: for fixtures shared by a whole test binary, kept in statics, which
/// are never dropped.
pub(crate) fn reap_at_exit(servers: &[RedisServer]) -> Child {
    reap_at_exit_all(&[servers])
}

/// [`reap_at_exit`] for servers kept in several lists.
pub(crate) fn reap_at_exit_all(lists: &[&[RedisServer]]) -> Child {
    let servers: Vec<&RedisServer> = lists.iter().flat_map(|l| l.iter()).collect();
    let pids: Vec<u32> = servers.iter().filter_map(|s| s.pid()).collect();
    let dirs: Vec<&Path> = servers.iter().map(|n| n.dir()).collect();
    reap_pids_at_exit(&pids, &dirs)
}

/// Starts a detached `sh` that waits for this test process to exit, then kills `pids` and
/// removes `dirs`.
pub(crate) fn reap_pids_at_exit(pids: &[u32], dirs: &[&Path]) -> Child {
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let dirs: Vec<String> = dirs.iter().map(|d| quote(&d.to_string_lossy())).collect();
    let script = format!(
        "trap '' INT HUP TERM; while kill -0 {me} 2>/dev/null; do sleep 0.2; done; \
         kill -9 {pids} 2>/dev/null; rm -rf {dirs}",
        me = std::process::id(),
        pids = pids.join(" "),
        dirs = dirs.join(" "),
    );
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start the sh that kills shared servers at exit: {e}"))
}

fn redis_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("REDIS_SERVER") {
        return PathBuf::from(path);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("redis-server"))
            .find(|candidate| candidate.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "redis-server not found: install it (Debian/Ubuntu: `apt-get install redis-server`, \
             macOS: `brew install redis`) or point $REDIS_SERVER at the binary"
        )
    })
}

/// A free loopback port other than `taken`.
fn other_free_port(taken: u16) -> u16 {
    loop {
        let port = free_port();
        if port != taken {
            return port;
        }
    }
}

/// `n` free ports, no two alike: each held open until all are picked (picked one at a time,
/// the kernel may hand out a port it has just handed out).
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("cannot find a free port: {e}")))
        .collect();
    held.iter()
        .map(|l| {
            l.local_addr()
                .map(|a| a.port())
                .unwrap_or_else(|e| panic!("cannot read a port: {e}"))
        })
        .collect()
}

/// Asserts that an error's message, `said`, is word for word a line of docs/troubleshooting.md:
/// the test's server listens on `port` where the page writes `documented`.
pub fn as_troubleshooting_says(said: &str, port: u16, documented: u16) {
    let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/troubleshooting.md");
    let page = std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
    let line = said.replace(&format!(":{port}"), &format!(":{documented}"));
    assert!(
        page.lines().any(|l| l == line),
        "docs/troubleshooting.md has no line\n{line}\n(the error said, with the port written {documented})"
    );
}

/// A loopback port nothing listens on (at the time of the call).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("cannot find a free port: {e}"))
}

fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}

/// Starts a task that waits up to `wait` for the lock on `key` (ttl 10 s) through `client`, and
/// answers when the wait ended and how.
pub fn spawn_waiter(
    client: LockClient,
    key: &'static str,
    wait: Duration,
) -> tokio::task::JoinHandle<(Instant, Result<lock_runtime::LockGuard, lock_runtime::LockError>)> {
    tokio::spawn(async move {
        let got = client.acquire(key, &ttl(10_000).wait(wait)).await;
        (Instant::now(), got)
    })
}

/// Starts a task that waits for `key` through `client` with `options`, and returns once it is
/// in line ([`joined_line`]).
pub async fn in_line(
    client: &LockClient,
    key: &'static str,
    options: LockOptions,
) -> tokio::task::JoinHandle<Result<lock_runtime::LockGuard, lock_runtime::LockError>> {
    let before = waiting(client, key);
    let waiter = tokio::spawn({
        let client = client.clone();
        async move { client.acquire(key, &options).await }
    });
    joined_line(client, key, before).await;
    waiter
}

/// Returns once `client` has one more waiter for `key` than `before` (its
/// [`waiting`](LockClient::waiting) count then): the newest one was refused once, so it waits
/// (and, fair, has its place in the store's line).
pub async fn joined_line(client: &LockClient, key: &str, before: usize) {
    eventually(5 * SECOND, "the waiter is in line", || async {
        waiting(client, key) == before + 1
    })
    .await;
}

/// How many of `client`'s callers wait for `key`.
pub fn waiting(client: &LockClient, key: &str) -> usize {
    client
        .waiting(key)
        .unwrap_or_else(|e| panic!("bad key {key}: {e}"))
}

/// Asserts that a waiter got the lock `handoff` after the holder's release because of that
/// release: without the wake-up it sleeps until its nap ends, at least 85% of `MAX_WAIT_NAP`
/// when the holder's key had long to live.
pub fn assert_woken_by_the_release(handoff: Duration) {
    assert!(
        handoff < lock_runtime::MAX_WAIT_NAP / 2,
        "woken by a timer, not the release: {handoff:?}"
    );
}

/// A small seeded generator (xorshift64*), so that a failing random test can be replayed from
/// the seed it prints.
#[derive(Debug, Clone)]
pub struct Dice(u64);

impl Dice {
    /// A generator from `seed` (any value; zero is made non-zero).
    pub fn new(seed: u64) -> Dice {
        Dice(seed | 1)
    }

    /// A number below `n` (which must not be zero).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Waits for `condition` to hold, checking every 5 ms, and panics with `what` after `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    assert!(
        holds_within(within, condition).await,
        "not within {within:?}: {what}"
    );
}

/// [`eventually`] for a test that says more than `what` when it fails: whether `condition`
/// held within `within`, checked every 5 ms.
pub async fn holds_within<F, Fut>(within: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if condition().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A lock store for behaviour tests: a client of one deployment (made from a builder, which
/// makes more of them), with what the target owns (a server of its own, rows to delete) kept
/// until it goes. A new store is one constructor here and one line in [`on_every_deployment!`].
#[derive(Debug)]
pub struct Target {
    client: LockClient,
    /// How to make another client of the same store (none in memory: the same client serves).
    builder: Option<LockClientBuilder>,
    /// What the target owns, dropped with it: a server spawned for it, rows to delete.
    owned: Vec<Box<dyn Owned>>,
    /// The servers a refused waiter leaves the lock's waiting mark on (plain `redis://` URLs);
    /// none where there are no marks (every store but one Redis, Sentinel and RedLock).
    marks_on: Vec<String>,
}

/// Something a target keeps until it goes.
pub trait Owned: std::fmt::Debug + Send + Sync + std::any::Any {
    /// As `Any`, to find a server of a given kind.
    fn as_any(&self) -> &dyn std::any::Any;
}

impl<T: std::fmt::Debug + Send + Sync + 'static> Owned for T {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Target {
    /// A fresh `redis-server` and a client connected to it.
    pub async fn redis() -> Target {
        let server = RedisServer::spawn();
        Target::on(server.url().as_str(), server, |b| b).await
    }

    /// A fresh `redis-server` that only trusts clients with a certificate, and a client that
    /// connects to it over TLS (`rediss://`), trusting its private CA and presenting one.
    pub async fn redis_tls() -> Target {
        let certs = TestCerts::generate();
        let server = RedisServer::spawn_tls(&certs, true);
        Target::on(server.tls_url().as_str(), server, |b| {
            b.tls_root_ca(certs.ca_pem())
                .tls_client_auth(certs.client_cert_pem(), certs.client_key_pem())
        })
        .await
    }

    async fn on(
        url: &str,
        server: RedisServer,
        configure: impl FnOnce(LockClientBuilder) -> LockClientBuilder,
    ) -> Target {
        let builder = configure(test_builder(url));
        let marks_on = vec![server.url()];
        let client = builder
            .clone()
            .build()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
        Target {
            client,
            builder: Some(builder),
            owned: vec![Box::new(server)],
            marks_on,
        }
    }

    /// A client of the test binary's shared 3-primary Redis Cluster
    /// ([`RedisCluster::shared`]), with a key prefix of its own so that tests sharing the
    /// cluster never meet.
    pub async fn cluster() -> Target {
        let cluster = RedisCluster::shared();
        let builder = LockClient::builder()
            .cluster(cluster.urls())
            .prefix(&unique_prefix())
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_millis(500));
        Target::shared(builder, Vec::new()).await
    }

    /// A client of the test binary's shared Sentinel setup ([`SentinelSetup::shared`]), with a
    /// key prefix of its own.
    pub async fn sentinel() -> Target {
        let setup = SentinelSetup::shared();
        let builder = LockClient::builder()
            .sentinel(setup.sentinel_urls(), setup.master_name())
            .prefix(&unique_prefix())
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_millis(500));
        Target::shared(builder, vec![setup.primary().url()]).await
    }

    /// A RedLock client over the test binary's five shared independent masters
    /// ([`shared_masters`]), with a key prefix of its own.
    pub async fn redlock() -> Target {
        let builder = LockClient::builder()
            .redlock(shared_masters().iter().map(RedisServer::url))
            .prefix(&unique_prefix())
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_millis(500));
        Target::shared(builder, shared_masters().iter().map(RedisServer::url).collect()).await
    }

    async fn shared(builder: LockClientBuilder, marks_on: Vec<String>) -> Target {
        let client = builder
            .clone()
            .build()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the shared deployment: {e}"));
        Target {
            client,
            builder: Some(builder),
            owned: Vec::new(),
            marks_on,
        }
    }

    /// A client of the machine's PostgreSQL ([`shared_postgres_url`]), with a key prefix no
    /// other target of any test run uses; its rows are deleted when the target is dropped.
    pub async fn postgres() -> Target {
        let url = shared_postgres_url();
        let prefix = format!("p{}.{}", std::process::id(), unique_prefix());
        let builder = LockClient::builder()
            .postgres(&url)
            .prefix(&prefix)
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(1));
        let mut target = Target::shared(builder, Vec::new()).await;
        target.owned.push(Box::new(postgres::Rows { url, prefix }));
        target
    }

    /// A client of the machine's MySQL or MariaDB ([`shared_mysql_url`]: `127.0.0.1:3306`,
    /// database `test`, or a kit-started `mariadbd` when none answers there), with a prefix of
    /// its own; its rows are deleted when the target is dropped.
    pub async fn mysql() -> Target {
        let url = shared_mysql_url();
        let prefix = format!("m{}.{}", std::process::id(), unique_prefix());
        let builder = LockClient::builder()
            .mysql(&url)
            .prefix(&prefix)
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(1));
        let mut target = Target::shared(builder, Vec::new()).await;
        target.owned.push(Box::new(MysqlRows { url, prefix }));
        target
    }

    /// A client of the test binary's shared 3-member etcd cluster ([`EtcdCluster::shared`]),
    /// with a key prefix of its own.
    pub async fn etcd() -> Target {
        let builder = LockClient::builder()
            .etcd(EtcdCluster::shared().endpoints())
            .prefix(&unique_prefix())
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(1));
        Target::shared(builder, Vec::new()).await
    }

    /// A client of the test binary's shared 3-server ZooKeeper ensemble
    /// ([`ZkEnsemble::shared`]), under a parent path of its own.
    pub async fn zookeeper() -> Target {
        let parent = format!(
            "/p{}/{}",
            std::process::id(),
            unique_prefix().trim_end_matches(':')
        );
        let builder = LockClient::builder()
            .zookeeper(ZkEnsemble::shared().hosts())
            .prefix(&parent)
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(1));
        let mut target = Target::shared(builder, Vec::new()).await;
        target.owned.push(Box::new(SessionIsTheLease));
        target
    }

    /// Whether `holder(…).remaining()` shows what another client's lock has left: not on
    /// ZooKeeper, where a lock lasts as long as its holder's session, which only the holder's
    /// client knows.
    pub fn shows_others_remaining(&self) -> bool {
        !self
            .owned
            .iter()
            .any(|o| (**o).as_any().downcast_ref::<SessionIsTheLease>().is_some())
    }

    /// A fresh in-memory backend.
    pub fn memory() -> Target {
        Target {
            client: LockClient::in_memory(),
            builder: None,
            owned: Vec::new(),
            marks_on: Vec::new(),
        }
    }

    /// The client every test starts with.
    pub fn client(&self) -> LockClient {
        self.client.clone()
    }

    /// Another client on the same store: its own connections on Redis (another process, in
    /// effect); in memory, another handle on the same store.
    pub async fn other_client(&self) -> LockClient {
        match &self.builder {
            Some(builder) => builder
                .clone()
                .build()
                .await
                .unwrap_or_else(|e| panic!("cannot connect another client: {e}")),
            None => self.client.clone(),
        }
    }

    /// Whether a refused waiter has left `key`'s waiting mark (on a majority of RedLock's
    /// masters), so that its release will announce itself. A plain exclusive waiter (see
    /// [`RedisServer::waiter_refused`]) that marked the lock was refused after it began
    /// listening. `None` where there is no mark to see ([`has_marks`](Self::has_marks)).
    /// Sentinel's primary is the one of when the target was made.
    pub async fn marked(&self, key: &str) -> Option<bool> {
        if !self.has_marks() {
            return None;
        }
        let mark = lock_runtime::redis::keys::LockKeys::new(self.client.prefix(), key).waiting();
        let mut found = 0;
        for url in &self.marks_on {
            let mut conn = redis::Client::open(url.as_str())
                .unwrap_or_else(|e| panic!("bad url {url}: {e}"))
                .get_multiplexed_async_connection()
                .await
                .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
            let exists: bool = redis::cmd("EXISTS")
                .arg(&mark)
                .query_async(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("EXISTS {mark} on {url}: {e}"));
            found += usize::from(exists);
        }
        Some(2 * found > self.marks_on.len())
    }

    /// Returns once a waiter for `key` was refused by its present holder after it began
    /// listening (it sleeps until a release wakes it): where the store keeps a waiting mark, once
    /// the mark is there (each release deletes it, so it is the present holder's; a semaphore's
    /// refused permit attempt sets the same mark). Elsewhere (in memory, on a Cluster, on the SQL
    /// and queue stores) after a pause in which it will have been: were the pause too short, the
    /// waiter would find the lock free and the test would pass without proving the wake-up,
    /// never fail wrongly.
    pub async fn refused_waiter(&self, key: &str) {
        if self.has_marks() {
            eventually(5 * SECOND, "a refused waiter marked the lock", || async {
                self.marked(key).await == Some(true)
            })
            .await;
        } else {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// Whether this deployment keeps waiting marks: not in memory, and not on a Cluster, where
    /// every release announces itself.
    pub fn has_marks(&self) -> bool {
        !self.marks_on.is_empty()
    }

    /// The Redis server spawned for this target, for Redis-only checks.
    pub fn server(&self) -> Option<&RedisServer> {
        self.owned.iter().find_map(|o| (**o).as_any().downcast_ref())
    }
}

/// Five independent `redis-server`s (RedLock masters), started at the first call and shared by
/// every test of the test binary, for tests isolated by key that do not kill, pause or restart
/// them; killed when the test process exits.
pub fn shared_masters() -> &'static [RedisServer] {
    static SHARED: std::sync::OnceLock<(Vec<RedisServer>, Child)> = std::sync::OnceLock::new();
    let (masters, _reaper) = SHARED.get_or_init(|| {
        let masters: Vec<RedisServer> = (0..5).map(|_| RedisServer::spawn()).collect();
        let reaper = reap_at_exit(&masters);
        (masters, reaper)
    });
    masters
}

/// A key prefix no other target of this test process uses (`t<n>:lock:`).
fn unique_prefix() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("t{n}:lock:")
}

/// A builder for `url` with short timeouts, as the tests want failures fast.
pub fn test_builder(url: &str) -> LockClientBuilder {
    LockClient::builder()
        .url(url)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_millis(500))
}

/// Connects a client to `url` with short timeouts, as the tests want failures fast.
pub async fn connect(url: &str) -> LockClient {
    test_builder(url)
        .build()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// Defines each named test once per target, as `target::name`, calling `async fn name(t: Target)`
/// from the invoking module:
/// `on_targets!(redis => Target::redis().await, memory => Target::memory(); [a, b])`.
#[macro_export]
macro_rules! on_targets {
    ($($module:ident => $target:expr),+ ; $names:tt) => {
        $( $crate::on_targets!(@module $module, $target, $names); )+
    };
    (@module $module:ident, $target:expr, [$($name:ident),* $(,)?]) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($target).await;
                }
            )*
        }
    };
}

/// Defines each named test twice: `redis::name` on a fresh redis-server and `memory::name` in
/// memory.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        $crate::on_targets!(
            redis => $crate::Target::redis().await,
            memory => $crate::Target::memory();
            [$($name),*]
        );
    };
}

/// [`on_every_deployment!`] but RedLock: for fair mode and read-write locks, which need one
/// counter and one line.
#[macro_export]
macro_rules! on_every_deployment_with_one_counter {
    ($($name:ident),* $(,)?) => {
        $crate::on_every_deployment_with_one_counter_and_notices!($($name),*);
        $crate::on_targets!(mysql => $crate::Target::mysql().await; [$($name),*]);
    };
}

/// [`on_every_deployment_with_one_counter!`] but MySQL: for a fair or read-write release that
/// wakes another client's waiter at once (MySQL has no notifications).
#[macro_export]
macro_rules! on_every_deployment_with_one_counter_and_notices {
    ($($name:ident),* $(,)?) => {
        $crate::on_targets!(
            redis => $crate::Target::redis().await,
            redis_tls => $crate::Target::redis_tls().await,
            cluster => $crate::Target::cluster().await,
            sentinel => $crate::Target::sentinel().await,
            postgres => $crate::Target::postgres().await,
            etcd => $crate::Target::etcd().await,
            zookeeper => $crate::Target::zookeeper().await,
            memory => $crate::Target::memory();
            [$($name),*]
        );
    };
}

/// Every deployment that offers semaphores ([`LockOptions::permits`]): all but RedLock, which
/// refuses them (tests/tests/semaphores.rs checks the refusal).
#[macro_export]
macro_rules! on_every_deployment_with_permits {
    ($($name:ident),* $(,)?) => {
        $crate::on_every_deployment_with_permits_and_notices!($($name),*);
        $crate::on_targets!(mysql => $crate::Target::mysql().await; [$($name),*]);
    };
}

/// [`on_every_deployment_with_permits!`] but MySQL: for a release that wakes another client's
/// waiters at once, one per permit given back (MySQL has no notifications).
#[macro_export]
macro_rules! on_every_deployment_with_permits_and_notices {
    ($($name:ident),* $(,)?) => {
        $crate::on_targets!(
            redis => $crate::Target::redis().await,
            redis_tls => $crate::Target::redis_tls().await,
            cluster => $crate::Target::cluster().await,
            sentinel => $crate::Target::sentinel().await,
            postgres => $crate::Target::postgres().await,
            etcd => $crate::Target::etcd().await,
            zookeeper => $crate::Target::zookeeper().await,
            memory => $crate::Target::memory();
            [$($name),*]
        );
    };
}

/// [`on_every_deployment!`] but MySQL: for a release that wakes another client's waiter at once
/// (MySQL has no notifications: another client's waiter tries again at the holder's expiry or
/// its next poll, 8 to 256 ms apart).
#[macro_export]
macro_rules! on_every_deployment_with_notices {
    ($($name:ident),* $(,)?) => {
        $crate::on_every_deployment_with_one_counter_and_notices!($($name),*);
        $crate::on_targets!(redlock => $crate::Target::redlock().await; [$($name),*]);
    };
}

/// [`on_every_deployment!`] but RedLock: for fencing tokens, which need one counter per key
/// (MySQL too, `mysql::name`, on the machine's MariaDB).
#[macro_export]
macro_rules! on_every_deployment_with_fencing {
    ($($name:ident),* $(,)?) => {
        $crate::on_every_deployment_with_one_counter!($($name),*);
    };
}

/// Defines each named test on every deployment the suite covers: `redis::name` (plaintext),
/// `redis_tls::name` (TLS with a private CA and a client certificate), `cluster::name` (a
/// 3-primary Redis Cluster shared by the test binary), `sentinel::name` (a Sentinel-managed
/// primary with a replica, shared too), `postgres::name` (the machine's PostgreSQL, with keys of
/// the test's own), `mysql::name` (the machine's MariaDB, likewise), `etcd::name` (a 3-member
/// etcd cluster shared by the test binary), `zookeeper::name` (a 3-server ZooKeeper ensemble
/// shared by the test binary), `redlock::name` (a quorum of five shared masters)
/// and `memory::name`.
#[macro_export]
macro_rules! on_every_deployment {
    ($($name:ident),* $(,)?) => {
        $crate::on_every_deployment_with_fencing!($($name),*);
        $crate::on_targets!(redlock => $crate::Target::redlock().await; [$($name),*]);
    };
}

/// Marks a ZooKeeper target (see [`Target::shows_others_remaining`]).
#[derive(Debug)]
struct SessionIsTheLease;

/// Deletes every MySQL row a target's prefix made, when the target is dropped.
#[derive(Debug)]
struct MysqlRows {
    url: String,
    prefix: String,
}

impl Drop for MysqlRows {
    fn drop(&mut self) {
        let (url, prefix) = (self.url.clone(), self.prefix.clone());
        // On a thread of its own: the target is dropped inside a test's runtime.
        let cleaned = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                use sqlx::Connection;
                let mut conn = sqlx::MySqlConnection::connect(&url).await.ok()?;
                let mut done = None;
                for table in ["lock_runtime_locks", "lock_runtime_line", "lock_runtime_shares"] {
                    done = sqlx::query(&format!("DELETE FROM {table} WHERE LEFT(name, ?) = ?"))
                        .bind(prefix.len() as u64)
                        .bind(prefix.as_bytes())
                        .execute(&mut conn)
                        .await
                        .ok();
                }
                done
            })
        })
        .join();
        if !matches!(cleaned, Ok(Some(_))) {
            eprintln!("could not delete the MySQL rows of prefix {}", self.prefix);
        }
    }
}

/// The workspace README's examples, compiled as doc tests so they stay true. They live here, not
/// in lock-runtime, because a published crate can only include files inside its own package.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

/// The guide's examples (docs/), each page compiled as doc tests for the same reason;
/// `tests/tests/docs.rs` checks that every page with Rust blocks is here.
#[cfg(doctest)]
mod guide_doctests {
    #[doc = include_str!("../../docs/getting-started.md")]
    struct GettingStarted;
    #[doc = include_str!("../../docs/choosing-a-store.md")]
    struct ChoosingAStore;
    #[doc = include_str!("../../docs/attribute.md")]
    struct Attribute;
    #[doc = include_str!("../../docs/safety.md")]
    struct Safety;
    #[doc = include_str!("../../docs/waiting.md")]
    struct Waiting;
    #[doc = include_str!("../../docs/holding.md")]
    struct Holding;
    #[doc = include_str!("../../docs/deployments.md")]
    struct Deployments;
    #[doc = include_str!("../../docs/operating.md")]
    struct Operating;
    #[doc = include_str!("../../docs/data-model.md")]
    struct DataModel;
    #[doc = include_str!("../../docs/troubleshooting.md")]
    struct Troubleshooting;
}
