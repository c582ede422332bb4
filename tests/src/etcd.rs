//! etcd for the tests: a 3-member cluster the kit starts itself (`etcd` from Debian's
//! `etcd-server`, or `$ETCD`), on free loopback ports, each member in a temp dir (on `/dev/shm`
//! when there is one: etcd syncs every write), killed on drop; a member can be killed, frozen
//! (SIGSTOP) and started again. One cluster serves every behaviour test of a test binary
//! ([`EtcdCluster::shared`], tests isolated by key prefix); fault tests start their own.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

/// One member of a cluster.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A 3-member etcd cluster.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: tempfile::TempDir,
    bin: PathBuf,
    token: String,
}

impl EtcdCluster {
    /// Starts three members and waits until the cluster has a leader and every member answers.
    /// A member that cannot bind its ports (another process took a free port the kit picked)
    /// makes the kit start the cluster again on other ports.
    pub fn spawn() -> EtcdCluster {
        let mut tries = 0;
        loop {
            match EtcdCluster::try_spawn() {
                Ok(cluster) => return cluster,
                Err(why) if tries < 5 && why.contains("address already in use") => tries += 1,
                Err(why) => panic!("{why}"),
            }
        }
    }

    fn try_spawn() -> Result<EtcdCluster, String> {
        let bin = etcd_binary();
        let mut builder = tempfile::Builder::new();
        builder.prefix("lock-tests-etcd");
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            builder.tempdir_in("/dev/shm")
        } else {
            builder.tempdir()
        }
        .unwrap_or_else(|e| panic!("cannot make a temp dir: {e}"));
        let members = (0..3)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
            })
            .collect();
        let mut cluster = EtcdCluster {
            members,
            dir,
            bin,
            token: format!("lock-tests-{}-{}", std::process::id(), free_port()),
        };
        for i in 0..3 {
            cluster.start(i);
        }
        cluster.ready(&[0, 1, 2])?;
        Ok(cluster)
    }

    /// The cluster shared by the test binary's tests (started at the first call; killed when the
    /// test process exits). Tests that kill or freeze members start their own.
    pub fn shared() -> &'static EtcdCluster {
        static SHARED: std::sync::OnceLock<(EtcdCluster, Child)> = std::sync::OnceLock::new();
        let (cluster, _reaper) = SHARED.get_or_init(|| {
            let cluster = EtcdCluster::spawn();
            let pids: Vec<u32> = cluster
                .members
                .iter()
                .filter_map(|m| m.child.as_ref().map(Child::id))
                .collect();
            let reaper = super::reap_pids_at_exit(&pids, &[cluster.dir.path()]);
            (cluster, reaper)
        });
        cluster
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn start(&mut self, i: usize) {
        let initial = self.initial_cluster();
        let member = &self.members[i];
        let data = self.dir.path().join(&member.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", member.name)))
            .unwrap_or_else(|e| panic!("cannot open the member's log: {e}"));
        let client_url = format!("http://127.0.0.1:{}", member.client_port);
        let peer_url = format!("http://127.0.0.1:{}", member.peer_port);
        let child = Command::new(&self.bin)
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(&data)
            .args([
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args([
                "--initial-cluster",
                &initial,
                "--initial-cluster-token",
                &self.token,
            ])
            .args([
                "--initial-cluster-state",
                "new",
                "--log-level",
                "warn",
                "--logger",
                "zap",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        self.members[i].child = Some(child);
    }

    /// Waits until each of `members` reports itself healthy (it has a leader and serves).
    pub fn wait_ready(&mut self, members: &[usize]) {
        if let Err(why) = self.ready(members) {
            panic!("{why}");
        }
    }

    fn ready(&mut self, members: &[usize]) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        for &i in members {
            while !healthy(self.members[i].client_port) {
                let exited = self.members[i]
                    .child
                    .as_mut()
                    .is_some_and(|child| matches!(child.try_wait(), Ok(Some(_))));
                if exited || Instant::now() >= deadline {
                    return Err(format!("etcd member {i} did not become healthy: {}", self.log(i)));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Member `i`'s client URL.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Member `i`'s client port.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// Kills member `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        super::process::kill(&mut self.members[i].child);
    }

    /// Starts member `i` again on its data (after [`kill`](Self::kill)).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.start(i);
    }

    /// Freezes member `i` (SIGSTOP).
    pub fn pause(&self, i: usize) {
        self.signal(i, "-STOP");
    }

    /// Thaws member `i` (SIGCONT).
    pub fn resume(&self, i: usize) {
        self.signal(i, "-CONT");
    }

    fn signal(&self, i: usize, signal: &str) {
        if let Some(child) = &self.members[i].child {
            super::process::signal_child(Some(child), "etcd member", signal);
        }
    }

    /// Which member leads now, as the members that answer say (`None` without a leader).
    pub fn leader(&self) -> Option<usize> {
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                continue;
            }
            let Some(metrics) = http_get(self.members[i].client_port, "/metrics") else {
                continue;
            };
            if metrics
                .lines()
                .any(|line| line.trim() == "etcd_server_is_leader 1")
            {
                return Some(i);
            }
        }
        None
    }

    /// Waits until one of the running members leads, and answers which.
    pub fn wait_for_leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(leader) = self.leader() {
                return leader;
            }
            assert!(Instant::now() < deadline, "no etcd leader within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// How many raft proposals the cluster has committed (`etcd_server_proposals_committed_total`,
    /// the highest any running member reports: the leader's): every write, and every
    /// transaction that is not read-only, is one.
    pub fn proposals_committed(&self) -> f64 {
        self.members
            .iter()
            .filter(|m| m.child.is_some())
            .filter_map(|m| http_get(m.client_port, "/metrics"))
            .filter_map(|metrics| {
                metrics.lines().find_map(|line| {
                    line.strip_prefix("etcd_server_proposals_committed_total ")
                        .and_then(|v| v.trim().parse::<f64>().ok())
                })
            })
            .fold(0.0, f64::max)
    }

    /// What the running members have served so far, summed over them, by gRPC method: unary
    /// requests handled (`Txn`, `LeaseGrant`, …), messages received on streams
    /// (`LeaseKeepAlive`, `Watch`: each keep-alive, each watch created or cancelled), and watch
    /// responses sent (`Watch sent`: each carries one change or more). From `/metrics`.
    pub fn served(&self) -> std::collections::BTreeMap<String, f64> {
        let mut served = std::collections::BTreeMap::new();
        for member in self.members.iter().filter(|m| m.child.is_some()) {
            let Some(metrics) = http_get(member.client_port, "/metrics") else {
                continue;
            };
            for line in metrics.lines() {
                let (name, rest) = match line.split_once('{') {
                    Some(split) => split,
                    None => continue,
                };
                let Some((labels, value)) = rest.rsplit_once("} ") else {
                    continue;
                };
                let label = |key: &str| {
                    labels.split(',').find_map(|pair| {
                        pair.strip_prefix(key)
                            .and_then(|v| v.strip_prefix("=\""))
                            .and_then(|v| v.strip_suffix('"'))
                    })
                };
                let (Some(method), Ok(value)) = (label("grpc_method"), value.trim().parse::<f64>()) else {
                    continue;
                };
                let counted = match (name, label("grpc_type")) {
                    ("grpc_server_handled_total", Some("unary")) => method.to_owned(),
                    ("grpc_server_msg_received_total", Some("bidi_stream")) => method.to_owned(),
                    ("grpc_server_msg_sent_total", Some("bidi_stream")) if method == "Watch" => {
                        "Watch sent".to_owned()
                    }
                    _ => continue,
                };
                *served.entry(counted).or_insert(0.0) += value;
            }
        }
        served
    }

    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{}.log", self.members[i].name)))
            .unwrap_or_default()
    }
}

impl Drop for EtcdCluster {
    /// Thaws and kills every member still running. A member that exited already (one that
    /// could not bind its port, in a start `spawn` tries again) is only reaped: asserting its
    /// thaw panicked here, in the drop of the failed start, so the retry never came.
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            if let Some(child) = &mut self.members[i].child {
                if matches!(child.try_wait(), Ok(None)) {
                    super::process::signal(child.id(), "-CONT");
                }
            }
            self.kill(i);
        }
    }
}

/// Whether the member on `port` says it is healthy (`GET /health`).
fn healthy(port: u16) -> bool {
    http_get(port, "/health").is_some_and(|body| body.contains("\"health\":\"true\""))
}

/// The body of a plain HTTP/1.0 GET on loopback, if it answered within a second.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.set_write_timeout(Some(Duration::from_secs(1))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.split_once("\r\n\r\n").map(|(_, body)| body.to_owned())
}

fn etcd_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("ETCD") {
        return PathBuf::from(path);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("etcd"))
            .find(|candidate| candidate.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "etcd not found: install it (Debian/Ubuntu: `apt-get install etcd-server`) or point \
             $ETCD at the binary"
        )
    })
}
