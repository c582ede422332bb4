//! The test kit: real `redis-server` processes on free loopback ports, and the two lock backends
//! behind one [`Target`], so a behaviour test runs unchanged on Redis and in memory.
//!
//! Never a mock: every Redis test talks to a `redis-server` started here, in its own temp dir,
//! killed on drop. The binary comes from `$REDIS_SERVER` or `PATH`; when it is missing the kit
//! panics with how to install it, so a run without Redis fails loudly instead of skipping.

use std::future::Future;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockOptions};

/// One second, the unit most test deadlines are written in.
pub const SECOND: Duration = Duration::from_secs(1);

/// Options with a ttl of `ms` milliseconds and nothing else.
pub fn ttl(ms: u64) -> LockOptions {
    LockOptions::new(Duration::from_millis(ms))
}

/// One `redis-server` process on a free loopback port.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    binary: PathBuf,
}

impl RedisServer {
    /// Starts a server on a free port (no persistence) and waits until it answers PING.
    pub fn spawn() -> RedisServer {
        let binary = redis_binary();
        for _ in 0..20 {
            let mut server = RedisServer {
                child: None,
                port: free_port(),
                dir: tempfile::tempdir().unwrap_or_else(|e| panic!("cannot create a temp dir: {e}")),
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
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
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

    /// Kills the process and starts a new, empty one on the same port.
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
        let Some(child) = &self.child else {
            panic!("redis-server is not running");
        };
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap_or_else(|e| panic!("cannot run kill: {e}"));
        assert!(status.success(), "kill {signal} failed");
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

fn free_port() -> u16 {
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

/// Waits for `condition` to hold, checking every 5 ms, and panics with `what` after `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if condition().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A lock store for behaviour tests: a spawned Redis server, or the in-memory backend.
#[derive(Debug)]
pub struct Target {
    client: LockClient,
    server: Option<RedisServer>,
}

impl Target {
    /// A fresh `redis-server` and a client connected to it.
    pub async fn redis() -> Target {
        let server = RedisServer::spawn();
        let client = connect(&server.url()).await;
        Target {
            client,
            server: Some(server),
        }
    }

    /// A fresh in-memory backend.
    pub fn memory() -> Target {
        Target {
            client: LockClient::in_memory(),
            server: None,
        }
    }

    /// The client every test starts with.
    pub fn client(&self) -> LockClient {
        self.client.clone()
    }

    /// Another client on the same store: its own connections on Redis (another process, in
    /// effect); in memory, another handle on the same store.
    pub async fn other_client(&self) -> LockClient {
        match &self.server {
            Some(server) => connect(&server.url()).await,
            None => self.client.clone(),
        }
    }

    /// The Redis server, for Redis-only checks.
    pub fn server(&self) -> Option<&RedisServer> {
        self.server.as_ref()
    }
}

/// Connects a client to `url` with short timeouts, as the tests want failures fast.
pub async fn connect(url: &str) -> LockClient {
    LockClient::builder()
        .url(url)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// Defines each named test twice: `redis::name` on a fresh redis-server and `memory::name` in
/// memory, calling `async fn name(t: Target)` from the invoking module.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::Target::redis().await).await;
                }
            )*
        }
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::Target::memory()).await;
                }
            )*
        }
    };
}
