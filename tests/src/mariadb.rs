//! MariaDB for the tests: the machine's own server for behaviour tests, and servers the kit
//! starts itself (`mariadb-install-db` + `mariadbd` from Debian's packages, on a free port, in a
//! temp dir, killed on drop) for fault tests that stop, freeze or restart them.
//!
//! The machine's server is `$LOCK_TEST_MYSQL_URL`, else `mysql://root@127.0.0.1:3306/test` when
//! root logs in there; when neither does, one kit-started server serves the whole test binary.
//! A kit server reads no option file (`--no-defaults`: the machine's `/etc/mysql` plays no
//! part), listens on 127.0.0.1 only, keeps its socket in its temp dir, and lets `root` log in
//! over TCP with an empty password, as `mysql://root@127.0.0.1:<port>/test`.
//!
//! The kit looks at and sets up its servers with the `mariadb` client binary, so that it needs
//! no MySQL driver of its own.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

/// The machine's server, as the README's test command expects it.
const MACHINE_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// How long a (re)start may take, InnoDB's crash recovery after a kill included.
const START_WITHIN: Duration = Duration::from_secs(60);

/// How long a stop (a normal shutdown) may take before the kit kills the server.
const STOP_WITHIN: Duration = Duration::from_secs(30);

/// One `mariadbd` process the kit started, on a free loopback port, with its data in a temp
/// dir of its own.
#[derive(Debug)]
pub struct MariadbServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    bins: Binaries,
    /// Server options beyond the kit's (`--name=value`), the same at every (re)start.
    options: Vec<String>,
}

impl MariadbServer {
    /// Makes a data directory (`mariadb-install-db`, root without a password) and starts a
    /// server on it; waits until root logs in over TCP, then creates the database `test`.
    pub fn spawn() -> MariadbServer {
        MariadbServer::spawn_with(&[])
    }

    /// [`spawn`](Self::spawn) with more server options (`--name=value`), e.g.
    /// `--innodb-lock-wait-timeout=1`; they stay the same at every (re)start.
    pub fn spawn_with(options: &[&str]) -> MariadbServer {
        let bins = Binaries::find();
        let dir = tempfile::Builder::new()
            .prefix("lock-tests-mariadb")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot make a temp dir: {e}"));
        install(&bins, dir.path());
        let mut server = MariadbServer {
            child: None,
            port: 0,
            dir,
            bins,
            options: options.iter().map(|o| (*o).to_owned()).collect(),
        };
        // The port free_port found may be taken before mariadbd binds it: then another one.
        for _ in 0..20 {
            server.port = free_port();
            match server.start() {
                Ok(()) => {
                    server.sql_in(None, "CREATE DATABASE IF NOT EXISTS test");
                    return server;
                }
                Err(log) if log.contains("Address already in use") => continue,
                Err(log) => panic!("mariadbd did not start on port {}:\n{log}", server.port),
            }
        }
        panic!("no free port for mariadbd after 20 tries");
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// Starts the process on `self.port` and waits until it is the one answering there; on
    /// failure, kills it and returns what it logged at this start.
    fn start(&mut self) -> Result<(), String> {
        let log_path = self.log_path();
        let logged_before = std::fs::metadata(&log_path).map_or(0, |m| m.len());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap_or_else(|e| panic!("cannot open the server log: {e}"));
        let mut command = Command::new(&self.bins.server);
        // `--no-defaults` must come first.
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.data().display()))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", self.socket().display()))
            .arg(format!("--tmpdir={}", tmpdir(self.dir.path()).display()))
            .arg(format!(
                "--pid-file={}",
                self.dir.path().join("mariadbd.pid").display()
            ))
            .args([
                // Clients are matched by address: root@127.0.0.1, and no DNS lookups.
                "--skip-name-resolve",
                "--max-connections=200",
                "--innodb-buffer-pool-size=16M",
                "--innodb-log-file-size=8M",
                // Each commit reaches the OS, not the disk: it survives a kill of the server
                // (what the tests do), not a power loss (which they do not).
                "--innodb-flush-log-at-trx-commit=2",
                "--innodb-buffer-pool-dump-at-shutdown=0",
                "--innodb-buffer-pool-load-at-startup=0",
            ])
            .args(user_option())
            .args(&self.options)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // With no --log-error, mariadbd logs to stderr.
            .stderr(log)
            .current_dir(self.dir.path());
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.bins.server.display()));
        self.child = Some(child);
        let logged = || {
            let log = std::fs::read(&log_path).unwrap_or_default();
            let from = usize::try_from(logged_before).unwrap_or(0).min(log.len());
            String::from_utf8_lossy(&log[from..]).into_owned()
        };
        let deadline = Instant::now() + START_WITHIN;
        loop {
            if self.answers() {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(format!("mariadbd exited at start ({status}):\n{}", logged()));
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "root could not log in within {START_WITHIN:?}:\n{}",
                    logged()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether root logs in over TCP on `self.port`, to this server (its socket is ours: not
    /// another server that took the port).
    fn answers(&self) -> bool {
        if TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            return false;
        }
        let socket = self.socket().display().to_string();
        client_sql(&self.bins.client, self.port, None, "SELECT @@socket")
            .is_ok_and(|out| out.trim_end() == socket)
    }

    /// Runs `statements` as root over TCP in `database` (none: no default database); panics
    /// with what the client said if they fail.
    fn sql_in(&self, database: Option<&str>, statements: &str) -> String {
        client_sql(&self.bins.client, self.port, database, statements).unwrap_or_else(|e| {
            panic!(
                "`{statements}` failed on the MariaDB server at port {}: {e}",
                self.port
            )
        })
    }

    /// Runs `statements` (one or more, `;`-separated) as root in the database `test` with the
    /// `mariadb` client, and returns what they printed: rows one a line, columns separated by
    /// tabs, no header. Panics with the client's error if they fail.
    pub fn sql(&self, statements: &str) -> String {
        self.sql_in(Some("test"), statements)
    }

    /// `mysql://root@127.0.0.1:<port>/test`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.port)
    }

    /// The port it listens on, the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id, while the process runs (not after [`kill`](Self::kill) or
    /// [`stop`](Self::stop)).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server's temp dir: its data (`data/`), socket, pid file and log (`server.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the server (SIGKILL), as a crash would: clients see their connections drop and
    /// new ones refused. Returns once the process is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server as an operator would (SIGTERM: a normal shutdown, committed data kept),
    /// and waits for it to exit; kills it if it has not within 30 s.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), "-TERM");
            // A paused server would keep the SIGTERM pending until resumed.
            signal(child.id(), "-CONT");
            let deadline = Instant::now() + STOP_WITHIN;
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

    /// Stops the server (normal shutdown) and starts it again on the same port and data: what
    /// was committed before, locks included, is there after.
    pub fn restart(&mut self) {
        self.stop();
        self.start_on_the_same_port();
    }

    /// Starts a stopped or killed server again on its port and data (after a kill: InnoDB's
    /// crash recovery, committed data kept).
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the server still runs");
        self.start_on_the_same_port();
    }

    fn start_on_the_same_port(&mut self) {
        let deadline = Instant::now() + START_WITHIN;
        loop {
            match self.start() {
                Ok(()) => return,
                Err(log) if log.contains("Address already in use") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(log) => panic!("mariadbd did not start again on port {}:\n{log}", self.port),
            }
        }
    }

    /// Freezes the process (SIGSTOP): connections stay open and nothing answers, not even a new
    /// connection's greeting.
    pub fn pause(&self) {
        self.signal("-STOP");
        // `kill` returns once the signal is sent: wait until every thread has stopped, so that
        // no request sent after this returns is answered.
        let Some(child) = &self.child else { return };
        let tasks = PathBuf::from(format!("/proc/{}/task", child.id()));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stopped = std::fs::read_dir(&tasks).is_ok_and(|threads| {
                threads.flatten().all(|thread| {
                    std::fs::read_to_string(thread.path().join("stat")).is_ok_and(|stat| {
                        // The state follows the command's closing parenthesis.
                        stat.rsplit_once(") ")
                            .is_some_and(|(_, rest)| rest.starts_with('T'))
                    })
                })
            });
            if stopped {
                return;
            }
            assert!(Instant::now() < deadline, "mariadbd did not stop within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Unfreezes a paused process (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        super::process::signal_child(self.child.as_ref(), "mariadbd", signal);
    }
}

impl Drop for MariadbServer {
    /// Kills the server (nothing in it is kept); the temp dir goes after it.
    fn drop(&mut self) {
        self.kill();
    }
}

/// Where the kit's MariaDB binaries are.
#[derive(Debug, Clone)]
struct Binaries {
    server: PathBuf,
    install_db: PathBuf,
    client: PathBuf,
}

impl Binaries {
    /// `mariadbd` and `mariadb-install-db` from `$MARIADB_BIN` when it is set, else from `PATH`
    /// or `/usr/sbin` (Debian puts the server there, outside a normal user's `PATH`), and the
    /// `mariadb` client; panics with how to install what is missing.
    fn find() -> Binaries {
        let dirs: Vec<PathBuf> = match std::env::var_os("MARIADB_BIN") {
            Some(dir) => vec![PathBuf::from(dir)],
            None => search_path(),
        };
        let found = |name: &str| dirs.iter().map(|d| d.join(name)).find(|p| p.is_file());
        let (Some(server), Some(install_db)) = (found("mariadbd"), found("mariadb-install-db")) else {
            panic!(
                "MariaDB's server binaries (mariadbd, mariadb-install-db) not found: install them \
                 (Debian/Ubuntu: `apt-get install mariadb-server`) or point $MARIADB_BIN at their \
                 directory"
            );
        };
        let client = client_binary().unwrap_or_else(|| {
            panic!(
                "MariaDB's client (mariadb) not found: install it (Debian/Ubuntu: `apt-get \
                 install mariadb-client`) or put it on PATH or in $MARIADB_BIN"
            )
        });
        Binaries {
            server,
            install_db,
            client,
        }
    }
}

/// `PATH`'s directories, then `/usr/sbin` and `/usr/bin`.
fn search_path() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/bin"].map(PathBuf::from));
    dirs
}

/// The `mariadb` client: in `$MARIADB_BIN`, on `PATH`, or in `/usr/bin`.
fn client_binary() -> Option<PathBuf> {
    std::env::var_os("MARIADB_BIN")
        .map(PathBuf::from)
        .into_iter()
        .chain(search_path())
        .map(|dir| dir.join("mariadb"))
        .find(|p| p.is_file())
}

/// `--user=root` when the tests run as root, else nothing. mariadbd refuses to run as root
/// unless told to; the kit runs it as root rather than as Debian's `mysql` user because its
/// data is in a temp dir only root may enter (0700), and so that a machine without that user
/// (MariaDB from `$MARIADB_BIN`) works the same. (`--user` is only allowed to root.)
fn user_option() -> Option<&'static str> {
    let me = std::fs::metadata("/proc/self")
        .ok()
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    (me == Some(0)).then_some("--user=root")
}

/// `dir/tmp`, made if missing: the server's temporary files, apart from every other server's.
fn tmpdir(dir: &Path) -> PathBuf {
    let tmp = dir.join("tmp");
    if let Err(e) = std::fs::create_dir_all(&tmp) {
        panic!("cannot make {}: {e}", tmp.display());
    }
    tmp
}

/// Makes the system tables in `dir/data`, with root allowed in without a password from
/// localhost, 127.0.0.1 and ::1 (`--auth-root-authentication-method=normal`); panics with what
/// `mariadb-install-db` said if it fails.
fn install(bins: &Binaries, dir: &Path) {
    let mut tool = Command::new(&bins.install_db);
    // `--no-defaults` must come first.
    tool.arg("--no-defaults")
        .arg(format!("--datadir={}", dir.join("data").display()))
        // A temp dir of its own: installs running at once in the shared /tmp remove each
        // other's temporary tables, and fail ("Unknown table 'mysql.tmp_user_sys'").
        .arg(format!("--tmpdir={}", tmpdir(dir).display()))
        .args([
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--skip-name-resolve",
            // Passed on to mariadbd: the server's redo log is made this size (not 96 MB) at once.
            "--innodb-log-file-size=8M",
        ])
        .args(user_option())
        .stdin(Stdio::null())
        .current_dir(dir);
    let out = tool
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bins.install_db.display()));
    assert!(
        out.status.success(),
        "{tool:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `statements` as root (empty password) over TCP at 127.0.0.1:`port` with the `mariadb`
/// client at `client`, in `database` if given; returns what they printed (batch mode, no
/// header), or what the client said when it failed.
fn client_sql(client: &Path, port: u16, database: Option<&str>, statements: &str) -> Result<String, String> {
    let mut command = Command::new(client);
    command
        .arg("--no-defaults")
        .args(["--protocol=TCP", "-h127.0.0.1", "-uroot", "--connect-timeout=2"])
        .arg(format!("-P{port}"))
        .args(["--batch", "--skip-column-names"])
        .arg("-e")
        .arg(statements)
        .args(database)
        .stdin(Stdio::null());
    let out = command
        .output()
        .map_err(|e| format!("cannot run {}: {e}", client.display()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim_end().to_owned())
    }
}

/// A signal to a server that may be gone already (delivered or not).
fn signal(pid: u32, signal: &str) {
    let _ = super::process::signal(pid, signal);
}

/// The MySQL-protocol server behaviour tests use: `$LOCK_TEST_MYSQL_URL` when set; else the
/// machine's MariaDB, `mysql://root@127.0.0.1:3306/test`, when root logs in there with an empty
/// password and the database `test` exists; else one the kit started for this test binary
/// (killed, its temp dir removed, when the process exits).
pub fn shared_mysql_url() -> String {
    /// The url, and the kit's server with the `sh` that reaps it at exit, if one was started.
    type Shared = (String, Option<(MariadbServer, Child)>);
    static SHARED: std::sync::OnceLock<Shared> = std::sync::OnceLock::new();
    let (url, _) = SHARED.get_or_init(|| {
        if let Ok(url) = std::env::var("LOCK_TEST_MYSQL_URL") {
            return (url, None);
        }
        let listens =
            TcpStream::connect_timeout(&([127, 0, 0, 1], 3306).into(), Duration::from_secs(1)).is_ok();
        let logs_in = || {
            client_binary().is_some_and(|client| client_sql(&client, 3306, Some("test"), "SELECT 1").is_ok())
        };
        if listens && logs_in() {
            return (MACHINE_URL.to_owned(), None);
        }
        // A static is never dropped: the `sh` kills the server and removes its dir at exit.
        let server = MariadbServer::spawn();
        let pids: Vec<u32> = server.pid().into_iter().collect();
        let reaper = super::reap_pids_at_exit(&pids, &[server.dir()]);
        (server.url(), Some((server, reaper)))
    });
    url.clone()
}
