//! PostgreSQL for the tests: the machine's own server for behaviour tests (each target with a
//! key prefix of its own, its rows deleted when it is dropped), and servers the kit starts
//! itself (`initdb` + `postgres` from Debian's packages, on a free port, in a temp dir, killed on
//! drop) for fault tests that stop, freeze or restart them.
//!
//! The machine's server is `$LOCK_TEST_POSTGRES_URL`, else `postgres://postgres@127.0.0.1:5432/test`
//! when that answers; when neither does, one kit-started server serves the whole test binary.
//! PostgreSQL refuses to run as root: as root, the kit runs its servers as the `postgres` user
//! (made by Debian's packages), or `$LOCK_TEST_POSTGRES_USER`.

use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

/// The machine's server, as the README's test command expects it.
const MACHINE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// One `postgres` server process the kit started, on a free loopback port.
#[derive(Debug)]
pub struct PostgresServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// Whom the server runs as, when the tests run as root.
    user: Option<(u32, u32)>,
    /// Settings beyond the kit's (`name=value`, each given as `-c`).
    settings: Vec<String>,
}

impl PostgresServer {
    /// Makes a database cluster (trust auth, no fsync: tests need no durability against power
    /// loss, only against a restart) and starts a server on it; waits until it accepts.
    pub fn spawn() -> PostgresServer {
        PostgresServer::spawn_with(&[])
    }

    /// [`spawn`](Self::spawn) with more server settings (`name=value`), e.g.
    /// `shared_preload_libraries=pg_stat_statements`.
    pub fn spawn_with(settings: &[&str]) -> PostgresServer {
        let (bin, user, dir) = server_dir();
        let mut initdb = Command::new(bin.join("initdb"));
        initdb.arg("-D").arg(dir.path().join("data")).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
        run(initdb, user, dir.path());
        PostgresServer::started((bin, user, dir), settings)
    }

    /// A streaming standby (hot, asynchronous) copied from the server at `upstream_port` by
    /// `pg_basebackup -R`, which follows it on that port from then on: give it a
    /// [`FaultProxy`](crate::FaultProxy)'s port to cut the standby off later. Promote it with
    /// `SELECT pg_promote()`.
    pub fn standby_of(upstream_port: u16) -> PostgresServer {
        let (bin, user, dir) = server_dir();
        let mut backup = Command::new(bin.join("pg_basebackup"));
        backup
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &upstream_port.to_string(),
                "-U",
                "postgres",
            ])
            .arg("-D")
            .arg(dir.path().join("data"))
            .args(["-R", "-X", "stream", "--no-sync"]);
        run(backup, user, dir.path());
        PostgresServer::started((bin, user, dir), &[])
    }

    /// A server on the data in `dir`, started on a free port.
    fn started(
        (bin, user, dir): (PathBuf, Option<(u32, u32)>, tempfile::TempDir),
        settings: &[&str],
    ) -> PostgresServer {
        let mut server = PostgresServer {
            child: None,
            port: free_port(),
            dir,
            bin,
            user,
            settings: settings.iter().map(|s| (*s).to_owned()).collect(),
        };
        server.start();
        server
    }

    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .unwrap_or_else(|e| panic!("cannot open the server log: {e}"));
        if let Some((uid, gid)) = self.user {
            let _ = std::os::unix::fs::chown(self.dir.path().join("server.log"), Some(uid), Some(gid));
        }
        let mut command = Command::new(self.bin.join("postgres"));
        command
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.dir.path())
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=200",
                "-c",
                "shared_buffers=16MB",
            ])
            .args(self.settings.iter().flat_map(|s| ["-c", s.as_str()]))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .current_dir(self.dir.path());
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start postgres: {e}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.accepts() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("postgres exited at start ({status}): {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the server accepts connections and is out of recovery (`pg_isready`).
    fn accepts(&self) -> bool {
        if TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            return false;
        }
        Command::new(self.bin.join("pg_isready"))
            .args([
                "-q",
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .status()
            .is_ok_and(|s| s.success())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the server and every backend at once (SIGKILL to the postmaster: it takes its
    /// children with it), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            // Backends notice their postmaster is gone and exit; wait until the port is free.
            let deadline = Instant::now() + Duration::from_secs(10);
            while TcpStream::connect(("127.0.0.1", self.port)).is_ok() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Stops the server as an operator would (fast shutdown: backends end, committed data is
    /// kept), and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), "-INT");
            let _ = child.wait();
        }
    }

    /// Stops the server (fast shutdown) and starts it again on the same port and data.
    pub fn restart(&mut self) {
        self.stop();
        self.start();
    }

    /// Starts a stopped or killed server again on its data (after a kill: crash recovery).
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the server still runs");
        self.start();
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Immediate shutdown: nothing to keep.
            signal(child.id(), "-QUIT");
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The server binaries, whom a server runs as, and a fresh directory it may write.
fn server_dir() -> (PathBuf, Option<(u32, u32)>, tempfile::TempDir) {
    let bin = postgres_bin_dir();
    let user = server_user();
    let dir = tempfile::Builder::new()
        .prefix("lock-tests-pg")
        .tempdir()
        .unwrap_or_else(|e| panic!("cannot make a temp dir: {e}"));
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
            .unwrap_or_else(|e| panic!("cannot hand {} to the server's user: {e}", dir.path().display()));
    }
    (bin, user, dir)
}

/// Runs a server tool (`initdb`, `pg_basebackup`) as the server's user, in `dir`; panics with
/// what it said if it fails.
fn run(mut tool: Command, user: Option<(u32, u32)>, dir: &Path) {
    tool.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .current_dir(dir);
    if let Some((uid, gid)) = user {
        tool.uid(uid).gid(gid);
    }
    let out = tool
        .output()
        .unwrap_or_else(|e| panic!("cannot run {tool:?}: {e}"));
    assert!(
        out.status.success(),
        "{tool:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A signal to a server that may be gone already (delivered or not).
fn signal(pid: u32, signal: &str) {
    let _ = super::process::signal(pid, signal);
}

/// Where Debian's (or `$PG_BIN`'s) `initdb` and `postgres` are: the newest installed version.
fn postgres_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return bin;
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .find(|dir| dir.join("initdb").is_file() && dir.join("postgres").is_file())
    });
    on_path.unwrap_or_else(|| {
        panic!(
            "PostgreSQL's server binaries (initdb, postgres) not found: install them (Debian/Ubuntu: \
             `apt-get install postgresql`) or point $PG_BIN at their directory"
        )
    })
}

/// As root, the user the server runs as (uid, gid): `$LOCK_TEST_POSTGRES_USER`, else
/// `postgres`. `None` when the tests do not run as root.
fn server_user() -> Option<(u32, u32)> {
    let me = std::fs::metadata("/proc/self")
        .ok()
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    if me != Some(0) {
        return None;
    }
    let name = std::env::var("LOCK_TEST_POSTGRES_USER").unwrap_or_else(|_| "postgres".to_owned());
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let found = passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.first() == Some(&name.as_str()) && fields.len() > 3)
            .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
            .flatten()
    });
    Some(found.unwrap_or_else(|| {
        panic!(
            "the tests run as root, and PostgreSQL will not: no user `{name}` to run it as \
             (`apt-get install postgresql` makes `postgres`; or set $LOCK_TEST_POSTGRES_USER)"
        )
    }))
}

/// The server behaviour tests use: the machine's (see the module doc), or one the kit started
/// for this test binary (kept until the process exits).
pub fn shared_postgres_url() -> String {
    static SHARED: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SHARED
        .get_or_init(|| {
            if let Ok(url) = std::env::var("LOCK_TEST_POSTGRES_URL") {
                return url;
            }
            if TcpStream::connect_timeout(&([127, 0, 0, 1], 5432).into(), Duration::from_secs(1)).is_ok() {
                return MACHINE_URL.to_owned();
            }
            let server = Box::leak(Box::new(PostgresServer::spawn()));
            reap_postgres_at_exit(server);
            server.url()
        })
        .clone()
}

/// Kills a kit-started server kept for the whole test binary when the process exits.
fn reap_postgres_at_exit(server: &PostgresServer) {
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let script = format!(
        "trap '' INT HUP TERM; while kill -0 {me} 2>/dev/null; do sleep 0.2; done; \
         kill -QUIT {pid} 2>/dev/null; sleep 1; kill -9 {pid} 2>/dev/null; rm -rf {dir}",
        me = std::process::id(),
        pid = server.pid().unwrap_or(0),
        dir = quote(&server.dir().to_string_lossy()),
    );
    let _ = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// Deletes every row a target's prefix made, when the target is dropped: a run leaves nothing
/// behind in the machine's database.
#[derive(Debug)]
pub(crate) struct Rows {
    pub(crate) url: String,
    pub(crate) prefix: String,
}

impl Drop for Rows {
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
                let mut conn = sqlx::PgConnection::connect(&url).await.ok()?;
                for table in ["lock_runtime_locks", "lock_runtime_line"] {
                    let sql = format!("DELETE FROM {table} WHERE starts_with(key, $1)");
                    sqlx::query(&sql).bind(&prefix).execute(&mut conn).await.ok()?;
                }
                Some(())
            })
        });
        let _ = cleaned.join();
    }
}
