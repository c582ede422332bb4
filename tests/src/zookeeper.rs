//! ZooKeeper for the tests: a 3-server ensemble the kit starts itself (Debian's `zookeeper`
//! package, run with the machine's `java`; or the jars named by `$ZOOKEEPER_CLASSPATH`), on free
//! loopback ports, each server in a temp dir, killed on drop. Short ticks (100 ms) make
//! elections and session expiry quick; sessions may still last up to a minute (unless a test
//! asks for less), so that a lock's session can follow a long ttl. A server can be killed, frozen (SIGSTOP) and started again,
//! and the leader found. One ensemble serves every behaviour test of a test binary
//! ([`ZkEnsemble::shared`], tests isolated by parent path); fault tests start their own.
//! [`ZkEnsemble::shared_secure`] is a second one, started at its first use, whose servers also
//! listen with TLS (certificates the kit generates at spawn) and serve only sessions that added
//! digest credentials ([`SECURE_USER`], [`SECURE_PASSWORD`]).
//!
//! [`Curator`] runs Apache Curator's own recipes (Debian's `libcurator-recipes-java`) in a small
//! Java program the kit compiles once, for the tests that check our layout against the real
//! thing.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, free_ports, TestCerts};

/// The jars a ZooKeeper server (and Curator) runs with, from Debian's packages.
const DEBIAN_JARS: &str = "/usr/share/java";

/// How [`ZkEnsemble::ready`] says a server exited before it served.
const EXITED: &str = "exited before it served";

/// The digest user the servers of [`ZkEnsemble::shared_secure`] require of every session.
pub const SECURE_USER: &str = "locker";

/// [`SECURE_USER`]'s password.
pub const SECURE_PASSWORD: &str = "s3cret:with/odd@chars";

/// One server of an ensemble.
#[derive(Debug)]
struct Server {
    id: usize,
    client_port: u16,
    /// Its TLS port (`secureClientPort`), on an ensemble made with TLS.
    secure_port: Option<u16>,
    peer_port: u16,
    election_port: u16,
    child: Option<Child>,
}

/// What an ensemble's servers are started with beyond the defaults.
#[derive(Debug, Clone, Default)]
struct Setup {
    /// The longest session timeout the servers grant, in ms.
    max_session_ms: u64,
    /// Each server also listens with TLS (Netty's connection factory), with these certificates
    /// (the server's as its key store, the CA as its trust store), and requires a client
    /// certificate signed by the CA (`ssl.clientAuth=need`).
    tls: Option<TestCerts>,
    /// Only sessions that added `digest` credentials are served (`enforce.auth.enabled`).
    digest_only: bool,
}

/// A 3-server ZooKeeper ensemble.
#[derive(Debug)]
pub struct ZkEnsemble {
    servers: Vec<Server>,
    dir: tempfile::TempDir,
    setup: Setup,
}

impl ZkEnsemble {
    /// Starts three servers and waits until each serves (the ensemble has a leader).
    pub fn spawn() -> ZkEnsemble {
        ZkEnsemble::spawn_with_max_session(Duration::from_secs(60))
    }

    /// [`spawn`](Self::spawn), with servers that grant sessions of at most `max` (ZooKeeper's
    /// `maxSessionTimeout`): a lock's ttl above it outlasts its session.
    pub fn spawn_with_max_session(max: Duration) -> ZkEnsemble {
        ZkEnsemble::spawn_setup(Setup {
            max_session_ms: u64::try_from(max.as_millis()).unwrap_or(u64::MAX),
            ..Setup::default()
        })
    }

    /// [`spawn`](Self::spawn), with servers that also listen with TLS ([`tls_hosts`](Self::tls_hosts),
    /// certificates signed by [`certs`](Self::certs)' CA, generated now; a client presents
    /// `certs`' client certificate) and, with
    /// `digest_only`, serve only sessions that added digest credentials (any user: ZooKeeper's
    /// `digest` scheme checks none; the ACLs of the nodes do).
    pub fn spawn_secure(digest_only: bool) -> ZkEnsemble {
        ZkEnsemble::spawn_setup(Setup {
            max_session_ms: 60_000,
            tls: Some(TestCerts::generate()),
            digest_only,
        })
    }

    fn spawn_setup(setup: Setup) -> ZkEnsemble {
        let mut tries = 0;
        loop {
            match ZkEnsemble::try_spawn(setup.clone()) {
                Ok(ensemble) => return ensemble,
                // A port picked free was taken before the server bound it (by another test
                // process's server): the server exits at once. Fresh ports, a few times.
                Err(why) if tries < 3 && (why.contains("Address already in use") || why.contains(EXITED)) => {
                    tries += 1
                }
                Err(why) => panic!("{why}"),
            }
        }
    }

    fn try_spawn(setup: Setup) -> Result<ZkEnsemble, String> {
        let mut builder = tempfile::Builder::new();
        builder.prefix("lock-tests-zk");
        let dir = if Path::new("/dev/shm").is_dir() {
            builder.tempdir_in("/dev/shm")
        } else {
            builder.tempdir()
        }
        .unwrap_or_else(|e| panic!("cannot make a temp dir: {e}"));
        // Twelve ports no two alike (a server whose client port is also its election port is
        // an invalid config to ZooKeeper; ports picked one at a time may repeat).
        let mut ports = free_ports(12).into_iter();
        let mut port = || ports.next().unwrap_or_else(free_port);
        let servers = (1..=3)
            .map(|id| Server {
                id,
                client_port: port(),
                secure_port: setup.tls.as_ref().map(|_| port()),
                peer_port: port(),
                election_port: port(),
                child: None,
            })
            .collect();
        let mut ensemble = ZkEnsemble { servers, dir, setup };
        for i in 0..3 {
            ensemble.configure(i);
        }
        for i in 0..3 {
            ensemble.start(i);
        }
        ensemble.ready(&[0, 1, 2])?;
        Ok(ensemble)
    }

    /// The ensemble shared by the test binary's tests (started at the first call; killed when
    /// the test process exits). Tests that kill or freeze servers start their own.
    pub fn shared() -> &'static ZkEnsemble {
        static SHARED: std::sync::OnceLock<(ZkEnsemble, Child)> = std::sync::OnceLock::new();
        let (ensemble, _reaper) = SHARED.get_or_init(|| ZkEnsemble::spawn().reaped_at_exit());
        ensemble
    }

    /// An ensemble shared by the test binary's tests, started at the first call, whose servers
    /// also listen with TLS ([`tls_hosts`](Self::tls_hosts), [`tls_url`](Self::tls_url); the
    /// CA is [`certs`](Self::certs)' `ca_pem`, and a client presents its client certificate)
    /// and serve only sessions that added digest
    /// credentials (the tests use [`SECURE_USER`] and [`SECURE_PASSWORD`]). Killed when the
    /// test process exits.
    pub fn shared_secure() -> &'static ZkEnsemble {
        static SHARED: std::sync::OnceLock<(ZkEnsemble, Child)> = std::sync::OnceLock::new();
        let (ensemble, _reaper) = SHARED.get_or_init(|| ZkEnsemble::spawn_secure(true).reaped_at_exit());
        ensemble
    }

    /// The ensemble, and a process that kills its servers when the test process exits (a
    /// `static` is never dropped).
    fn reaped_at_exit(self) -> (ZkEnsemble, Child) {
        let pids: Vec<u32> = self
            .servers
            .iter()
            .filter_map(|s| s.child.as_ref().map(Child::id))
            .collect();
        let reaper = super::reap_pids_at_exit(&pids, &[self.dir.path()]);
        (self, reaper)
    }

    fn server_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("s{}", self.servers[i].id))
    }

    fn configure(&self, i: usize) {
        let data = self.server_dir(i);
        std::fs::create_dir_all(&data).unwrap_or_else(|e| panic!("cannot make {}: {e}", data.display()));
        std::fs::write(data.join("myid"), format!("{}\n", self.servers[i].id))
            .unwrap_or_else(|e| panic!("cannot write myid: {e}"));
        let members: String = self
            .servers
            .iter()
            .map(|s| format!("server.{}=127.0.0.1:{}:{}\n", s.id, s.peer_port, s.election_port))
            .collect();
        let mut config = format!(
            "tickTime=100\ninitLimit=100\nsyncLimit=20\nminSessionTimeout=200\n\
             maxSessionTimeout={max}\ndataDir={data}\nclientPort={port}\n\
             clientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
             4lw.commands.whitelist=*\nforceSync=no\nstandaloneEnabled=false\n{members}",
            data = data.display(),
            port = self.servers[i].client_port,
            max = self.setup.max_session_ms,
        );
        if let (Some(certs), Some(secure_port)) = (&self.setup.tls, self.servers[i].secure_port) {
            // ZooKeeper (3.5.7 and later) reads PEM stores: the key store is the server's key
            // and certificate in one file, the trust store the CA.
            let write = |name: &str, parts: &[&[u8]]| {
                let path = data.join(name);
                std::fs::write(&path, parts.concat())
                    .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
                path
            };
            let key_store = write("server.pem", &[certs.server_key_pem(), certs.server_cert_pem()]);
            let trust_store = write("ca.pem", &[certs.ca_pem()]);
            config.push_str(&format!(
                "secureClientPort={secure_port}\nsecureClientPortAddress=127.0.0.1\n\
                 serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
                 ssl.keyStore.location={key_store}\nssl.keyStore.type=PEM\n\
                 ssl.trustStore.location={trust_store}\nssl.trustStore.type=PEM\n\
                 ssl.clientAuth=need\n",
                key_store = key_store.display(),
                trust_store = trust_store.display(),
            ));
        }
        if self.setup.digest_only {
            config.push_str("enforce.auth.enabled=true\nenforce.auth.schemes=digest\n");
        }
        std::fs::write(data.join("zoo.cfg"), config).unwrap_or_else(|e| panic!("cannot write zoo.cfg: {e}"));
        std::fs::write(
            data.join("log4j.properties"),
            "log4j.rootLogger=WARN, F\nlog4j.appender.F=org.apache.log4j.FileAppender\n\
             log4j.appender.F.File=server.log\nlog4j.appender.F.layout=org.apache.log4j.PatternLayout\n\
             log4j.appender.F.layout.ConversionPattern=%d %p %c{1}: %m%n\n",
        )
        .unwrap_or_else(|e| panic!("cannot write log4j.properties: {e}"));
    }

    fn start(&mut self, i: usize) {
        let data = self.server_dir(i);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data.join("stderr.log"))
            .unwrap_or_else(|e| panic!("cannot open the server's log: {e}"));
        let child = Command::new(java())
            .current_dir(&data)
            .args([
                "-Xms32m",
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
            ])
            .arg(format!(
                "-Dlog4j.configuration=file:{}",
                data.join("log4j.properties").display()
            ))
            .arg("-Dzookeeper.jmx.log4j.disable=true")
            // With `slf4j-simple` first on the class path (see `server_classpath`): warnings and
            // errors to the server's stderr, read by `log`.
            .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
            .arg("-cp")
            .arg(server_classpath())
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(data.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start a ZooKeeper server (java): {e}"));
        self.servers[i].child = Some(child);
    }

    /// Waits until each of `servers` serves clients (it has joined a quorum).
    pub fn wait_ready(&mut self, servers: &[usize]) {
        if let Err(why) = self.ready(servers) {
            panic!("{why}");
        }
    }

    fn ready(&mut self, servers: &[usize]) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        for &i in servers {
            while self.mode(i).is_none() {
                let exited = self.servers[i]
                    .child
                    .as_mut()
                    .is_some_and(|child| matches!(child.try_wait(), Ok(Some(_))));
                if exited {
                    return Err(format!("ZooKeeper server {i} {EXITED}: {}", self.log(i)));
                }
                if Instant::now() >= deadline {
                    return Err(format!("ZooKeeper server {i} did not serve: {}", self.log(i)));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Server `i`'s mode (`leader`, `follower`) while it serves clients.
    fn mode(&self, i: usize) -> Option<String> {
        let answer = four_letters(self.servers[i].client_port, "srvr")?;
        answer
            .lines()
            .find_map(|line| line.strip_prefix("Mode: "))
            .map(|mode| mode.trim().to_owned())
            .filter(|mode| mode == "leader" || mode == "follower")
    }

    /// Every server's TLS `host:port`, for `.zookeeper([…])` with `.tls_root_ca(…)`. Panics if
    /// the ensemble was not made with TLS.
    pub fn tls_hosts(&self) -> Vec<String> {
        self.servers
            .iter()
            .map(|s| match s.secure_port {
                Some(port) => format!("127.0.0.1:{port}"),
                None => panic!("this ensemble does not listen with TLS: use ZkEnsemble::shared_secure"),
            })
            .collect()
    }

    /// `zks://host:port,…` on the TLS ports, for `LockClient::builder().store(…)`.
    pub fn tls_url(&self) -> String {
        format!("zks://{}", self.tls_hosts().join(","))
    }

    /// The certificates of an ensemble made with TLS (its servers' signed by `ca_pem`).
    /// Panics if the ensemble was not made with TLS.
    pub fn certs(&self) -> &TestCerts {
        self.setup.tls.as_ref().unwrap_or_else(|| {
            panic!("this ensemble does not listen with TLS: use ZkEnsemble::shared_secure")
        })
    }

    /// Every server's `host:port`, for `.zookeeper([…])`.
    pub fn hosts(&self) -> Vec<String> {
        (0..self.servers.len()).map(|i| self.host(i)).collect()
    }

    /// Server `i`'s `host:port`.
    pub fn host(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.servers[i].client_port)
    }

    /// Server `i`'s client port.
    pub fn client_port(&self, i: usize) -> u16 {
        self.servers[i].client_port
    }

    /// `zk://host:port,host:port,host:port`, for `LockClient::connect`.
    pub fn url(&self) -> String {
        format!("zk://{}", self.hosts().join(","))
    }

    /// Kills server `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        super::process::kill(&mut self.servers[i].child);
    }

    /// Starts server `i` again on its data (after [`kill`](Self::kill)).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.start(i);
    }

    /// The highest zxid any running server has applied (`srvr`'s `Zxid`): a client that saw a
    /// zxid is refused by a server behind it, so after [`restart_empty`](Self::restart_empty)
    /// a client of the old state reconnects (and is told its session expired) only once the
    /// new state is past what it saw.
    pub fn last_zxid(&self) -> u64 {
        (0..self.servers.len())
            .filter_map(|i| four_letters(self.servers[i].client_port, "srvr"))
            .filter_map(|answer| {
                answer
                    .lines()
                    .find_map(|line| line.strip_prefix("Zxid: 0x"))
                    .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            })
            .max()
            .unwrap_or(0)
    }

    /// Kills every server, deletes what they stored (every node and session), and starts them
    /// again, waiting until each serves: an ensemble that lost its state, to which every
    /// client's session is unknown (expired) when it reconnects.
    pub fn restart_empty(&mut self) {
        for i in 0..self.servers.len() {
            self.kill(i);
        }
        for i in 0..self.servers.len() {
            let data = self.server_dir(i).join("version-2");
            if data.exists() {
                std::fs::remove_dir_all(&data)
                    .unwrap_or_else(|e| panic!("cannot delete {}: {e}", data.display()));
            }
        }
        for i in 0..self.servers.len() {
            self.start(i);
        }
        let all: Vec<usize> = (0..self.servers.len()).collect();
        self.wait_ready(&all);
    }

    /// Freezes server `i` (SIGSTOP).
    pub fn pause(&self, i: usize) {
        self.signal(i, "-STOP");
    }

    /// Thaws server `i` (SIGCONT).
    pub fn resume(&self, i: usize) {
        self.signal(i, "-CONT");
    }

    fn signal(&self, i: usize, signal: &str) {
        if let Some(child) = &self.servers[i].child {
            super::process::signal_child(Some(child), "ZooKeeper server", signal);
        }
    }

    /// Which server leads now, as the servers that answer say (`None` without a leader).
    pub fn leader(&self) -> Option<usize> {
        (0..self.servers.len())
            .filter(|&i| self.servers[i].child.is_some())
            .find(|&i| self.mode(i).as_deref() == Some("leader"))
    }

    /// Waits until one of the running servers leads, and answers which.
    pub fn wait_for_leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(leader) = self.leader() {
                return leader;
            }
            assert!(Instant::now() < deadline, "no ZooKeeper leader within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// How many sessions server `i` has open now (`mntr`'s `zk_num_alive_connections` counts
    /// connections; this is the sessions the leader tracks: `zk_global_sessions`, else `cons`).
    pub fn connections(&self, i: usize) -> usize {
        four_letters(self.servers[i].client_port, "cons")
            .map_or(0, |cons| cons.lines().filter(|l| l.contains("sid=")).count())
    }

    /// The timeout of each session server `i` serves now (`cons`'s `to=`).
    pub fn session_timeouts(&self, i: usize) -> Vec<Duration> {
        four_letters(self.servers[i].client_port, "cons").map_or_else(Vec::new, |cons| {
            cons.lines()
                .filter(|l| l.contains("sid="))
                .filter_map(|l| l.split("to=").nth(1))
                .filter_map(|to| to.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
                .map(Duration::from_millis)
                .collect()
        })
    }

    fn log(&self, i: usize) -> String {
        let dir = self.server_dir(i);
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        let mut log = read("stderr.log");
        log.push_str(&read("server.log"));
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for ZkEnsemble {
    /// Every server thawed (a frozen one cannot die of SIGKILL before it runs again) and
    /// killed; a server that already exited (one that failed to start, whose error the spawn
    /// reports) is only reaped: a drop never panics over it.
    fn drop(&mut self) {
        for server in &mut self.servers {
            if let Some(child) = &mut server.child {
                if matches!(child.try_wait(), Ok(None)) {
                    super::process::signal(child.id(), "-CONT");
                }
            }
            super::process::kill(&mut server.child);
        }
    }
}

/// A ZooKeeper "four letter word" (`srvr`, `cons`, `mntr`) and its answer, within a second.
fn four_letters(port: u16, word: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.set_write_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.write_all(word.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

fn java() -> PathBuf {
    if let Some(home) = std::env::var_os("JAVA_HOME") {
        let java = PathBuf::from(home).join("bin/java");
        if java.is_file() {
            return java;
        }
    }
    PathBuf::from("java")
}

/// `$ZOOKEEPER_CLASSPATH`, else the jars of Debian's `zookeeper` package and what it depends
/// on (every jar the package's own scripts put on the class path).
fn server_classpath() -> String {
    if let Some(path) = std::env::var_os("ZOOKEEPER_CLASSPATH") {
        return path.to_string_lossy().into_owned();
    }
    let jar = Path::new(DEBIAN_JARS).join("zookeeper.jar");
    assert!(
        jar.is_file(),
        "ZooKeeper not found: install it (Debian/Ubuntu: `apt-get install zookeeper`) or point \
         $ZOOKEEPER_CLASSPATH at its jars"
    );
    // Debian's `/usr/share/java` holds several SLF4J bindings (`slf4j-nop` among them) once
    // Curator's dependencies are installed, and the first found wins: the one named first
    // writes the server's errors where `ZkEnsemble::log` reads them (with `slf4j-nop`, a server
    // that could not bind its port exited without a word).
    let simple = Path::new(DEBIAN_JARS).join("slf4j-simple.jar");
    if simple.is_file() {
        return format!("{}:{DEBIAN_JARS}/*", simple.display());
    }
    format!("{DEBIAN_JARS}/*")
}

/// Apache Curator in a Java process of its own: its `InterProcessMutex` and
/// `InterProcessReadWriteLock` on the ensemble, driven line by line (`acquire <path> <mode>`,
/// `release <path> <mode>`, `children <path>`), answering `ok …` or `error …`. Killed on drop.
#[derive(Debug)]
pub struct Curator {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

/// A Curator lock kind: its mutex, or one side of its read-write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CuratorLock {
    /// `InterProcessMutex`.
    Mutex,
    /// `InterProcessReadWriteLock.readLock()`.
    Read,
    /// `InterProcessReadWriteLock.writeLock()`.
    Write,
}

impl CuratorLock {
    fn word(self) -> &'static str {
        match self {
            CuratorLock::Mutex => "mutex",
            CuratorLock::Read => "read",
            CuratorLock::Write => "write",
        }
    }
}

const CURATOR_PROGRAM: &str = include_str!("zookeeper/CuratorLocks.java");

impl Curator {
    /// Starts Curator connected to `hosts` (`host:port,…`), compiling the program at the first
    /// call of the test process.
    pub fn start(hosts: &str) -> Curator {
        Curator::start_as(hosts, None)
    }

    /// [`start`](Self::start), with digest credentials (`user:password`) added to Curator's
    /// session (`CuratorFrameworkFactory.builder().authorization("digest", …)`).
    pub fn start_with_auth(hosts: &str, credentials: &str) -> Curator {
        Curator::start_as(hosts, Some(credentials))
    }

    fn start_as(hosts: &str, credentials: Option<&str>) -> Curator {
        let classes = curator_classes();
        let classpath = format!("{}:{DEBIAN_JARS}/*", classes.display());
        let mut child = Command::new(java())
            .args([
                "-Xms32m",
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
            ])
            .arg("-cp")
            .arg(classpath)
            .arg("CuratorLocks")
            .arg(hosts)
            .args(credentials)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start Curator (java): {e}"));
        let input = child.stdin.take().unwrap_or_else(|| panic!("no stdin"));
        let output = BufReader::new(child.stdout.take().unwrap_or_else(|| panic!("no stdout")));
        let mut curator = Curator { child, input, output };
        let ready = curator.answer();
        assert_eq!(ready, "ok ready", "Curator did not start");
        curator
    }

    fn answer(&mut self) -> String {
        let mut line = String::new();
        match self.output.read_line(&mut line) {
            Ok(0) | Err(_) => panic!("Curator's process ended"),
            Ok(_) => line.trim_end().to_owned(),
        }
    }

    fn ask(&mut self, line: &str) -> String {
        writeln!(self.input, "{line}").unwrap_or_else(|e| panic!("cannot talk to Curator: {e}"));
        self.input
            .flush()
            .unwrap_or_else(|e| panic!("cannot talk to Curator: {e}"));
        self.answer()
    }

    /// Acquires `kind` on `path` (an absolute ZooKeeper path), waiting at most `wait`: whether
    /// it got it.
    pub fn acquire(&mut self, path: &str, kind: CuratorLock, wait: Duration) -> bool {
        let answer = self.ask(&format!("acquire {path} {} {}", kind.word(), wait.as_millis()));
        match answer.as_str() {
            "ok acquired" => true,
            "ok busy" => false,
            other => panic!("Curator acquire {path}: {other}"),
        }
    }

    /// Begins acquiring `kind` on `path` without waiting for the answer (read it with
    /// [`acquired`](Self::acquired)).
    pub fn acquire_later(&mut self, path: &str, kind: CuratorLock, wait: Duration) {
        writeln!(self.input, "acquire {path} {} {}", kind.word(), wait.as_millis())
            .unwrap_or_else(|e| panic!("cannot talk to Curator: {e}"));
        self.input
            .flush()
            .unwrap_or_else(|e| panic!("cannot talk to Curator: {e}"));
    }

    /// The answer to [`acquire_later`](Self::acquire_later): whether it got the lock.
    pub fn acquired(&mut self) -> bool {
        match self.answer().as_str() {
            "ok acquired" => true,
            "ok busy" => false,
            other => panic!("Curator acquire: {other}"),
        }
    }

    /// Releases `kind` on `path`.
    pub fn release(&mut self, path: &str, kind: CuratorLock) {
        let answer = self.ask(&format!("release {path} {}", kind.word()));
        assert_eq!(answer, "ok released", "Curator release {path}");
    }

    /// Deletes the node at `path`: `Err` with Curator's error (a `NoAuthException`, say) when
    /// it cannot.
    pub fn delete(&mut self, path: &str) -> Result<(), String> {
        match self.ask(&format!("delete {path}")).as_str() {
            "ok deleted" => Ok(()),
            other => Err(other.to_owned()),
        }
    }

    /// The children of `path`, sorted by name (empty when it does not exist).
    pub fn children(&mut self, path: &str) -> Vec<String> {
        let answer = self.ask(&format!("children {path}"));
        let names = answer
            .strip_prefix("ok")
            .unwrap_or_else(|| panic!("Curator children {path}: {answer}"));
        let mut names: Vec<String> = names.split_whitespace().map(str::to_owned).collect();
        names.sort();
        names
    }
}

impl Drop for Curator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The compiled Curator program (`javac`, once per test process, into a temp dir).
fn curator_classes() -> &'static Path {
    static CLASSES: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    CLASSES
        .get_or_init(|| {
            assert!(
                Path::new(DEBIAN_JARS).join("curator-recipes.jar").is_file(),
                "Curator not found: install it (Debian/Ubuntu: `apt-get install \
                 libcurator-recipes-java`)"
            );
            let dir = tempfile::Builder::new()
                .prefix("lock-tests-curator")
                .tempdir()
                .unwrap_or_else(|e| panic!("cannot make a temp dir: {e}"));
            let source = dir.path().join("CuratorLocks.java");
            std::fs::write(&source, CURATOR_PROGRAM).unwrap_or_else(|e| panic!("cannot write: {e}"));
            let javac = java().with_file_name("javac");
            let javac = if javac.is_file() {
                javac
            } else {
                PathBuf::from("javac")
            };
            let output = Command::new(javac)
                .arg("-cp")
                .arg(format!("{DEBIAN_JARS}/*"))
                .arg("-d")
                .arg(dir.path())
                .arg(&source)
                .output()
                .unwrap_or_else(|e| panic!("cannot run javac: {e}"));
            assert!(
                output.status.success(),
                "javac CuratorLocks.java failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            dir
        })
        .path()
}
