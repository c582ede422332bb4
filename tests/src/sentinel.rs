//! [`SentinelSetup`]: a primary, its replicas and the Redis Sentinels watching them, all real
//! `redis-server` processes on loopback, with failover on request or by killing the primary.
//!
//! Everything here is blocking (sync): call it from a sync test, or from an async test as it is
//! (it never needs the runtime, it only holds up the thread it runs on for the wait).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::cluster::{info_field, settle, Probe, SETTLE};
use crate::{free_port, Launch, RedisServer};

/// The name the sentinels monitor the primary under.
const MASTER_NAME: &str = "mymaster";

/// The key [`SentinelSetup::failover`] writes (and deletes) to see that a new primary is
/// writable.
const PROBE_KEY: &str = "__lock_tests_sentinel_probe__";

/// A primary, its replicas and the sentinels monitoring it as [`master_name`](Self::master_name)
/// (`down-after-milliseconds` 2000, `failover-timeout` 5000, `parallel-syncs` 1, quorum a
/// majority of the sentinels): every process a [`RedisServer`] in its own temp dir, killed on
/// drop. With 1000, a new primary that answered no ping for a second on a loaded two-core
/// machine was failed over again, and a short run could end before the second failover did.
///
/// Data nodes keep the index they were started with: node 0 is the first primary, nodes
/// `1..=replicas` its replicas. Which one is primary changes with failovers: ask
/// [`primary`](Self::primary) and [`replica`](Self::replica), which go by what the sentinels say.
///
/// Sentinel does not start another failover of the same primary within twice the failover
/// timeout (10 s) of the last one, so a test that wants two failovers in a row waits that long.
/// After a failover the old primary, if alive, is made a replica of the new one only some
/// seconds later (Sentinel waits to see it report itself a primary for a while).
#[derive(Debug)]
pub struct SentinelSetup {
    nodes: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
    /// For [`shared`](Self::shared) only: the process that kills the servers when the test
    /// process exits.
    reaper: Option<std::process::Child>,
}

impl SentinelSetup {
    /// Starts a primary and `replicas` replicas of it, waits until each replica's link is up,
    /// then starts `sentinels` sentinels (at least one) and waits until each knows the primary,
    /// sees every replica as a healthy replica and, if more than one, sees the other sentinels.
    /// Gives up after 30 s with what was missing.
    pub fn spawn(replicas: usize, sentinels: usize) -> SentinelSetup {
        assert!(sentinels >= 1, "a sentinel setup needs at least one sentinel");
        // Full syncs at once, not after the default 5 s wait for more replicas; on every node, as
        // any may be promoted.
        let no_delay = ["--repl-diskless-sync-delay", "0"];
        let primary = RedisServer::spawn_with_args(no_delay);
        let primary_port = primary.port().to_string();
        let mut nodes = vec![primary];
        for _ in 0..replicas {
            let replica_of = ["--replicaof", "127.0.0.1", primary_port.as_str()];
            nodes.push(RedisServer::spawn_with_args(
                no_delay.into_iter().chain(replica_of),
            ));
        }
        let mut setup = SentinelSetup {
            nodes,
            sentinels: Vec::new(),
            reaper: None,
        };
        setup.wait_for("the replicas to sync with the primary", |s, probe| {
            for (i, node) in s.nodes.iter().enumerate().skip(1) {
                let info: String = probe.ask(node.port(), redis::cmd("INFO").arg("replication"))?;
                let link = info_field(&info, "master_link_status");
                if link != Some("up") {
                    return Err(format!("replica {i} has master_link_status:{link:?}"));
                }
            }
            Ok(())
        });

        let quorum = (sentinels / 2 + 1).max(1);
        let primary_port = setup.nodes[0].port();
        setup.sentinels = (0..sentinels)
            .map(|_| spawn_sentinel(primary_port, quorum))
            .collect();
        setup.wait_for(
            "the sentinels to see the primary, the replicas and each other",
            |s, probe| {
                for (i, sentinel) in s.sentinels.iter().enumerate() {
                    let port = sentinel.port();
                    let seen = primary_port_of(probe, port)?;
                    if seen != primary_port {
                        return Err(format!("sentinel {i} says the primary is on port {seen}"));
                    }
                    let known: Vec<HashMap<String, String>> =
                        probe.ask(port, redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER_NAME))?;
                    for (j, node) in s.nodes.iter().enumerate().skip(1) {
                        let healthy = known.iter().any(|r| {
                            r.get("port").map(String::as_str) == Some(node.port().to_string().as_str())
                                && r.get("flags").map(String::as_str) == Some("slave")
                                && r.get("master-link-status").map(String::as_str) == Some("ok")
                        });
                        if !healthy {
                            return Err(format!("sentinel {i} does not see replica {j} as healthy yet"));
                        }
                    }
                    let others: Vec<HashMap<String, String>> =
                        probe.ask(port, redis::cmd("SENTINEL").arg("SENTINELS").arg(MASTER_NAME))?;
                    if others.len() + 1 < s.sentinels.len() {
                        return Err(format!(
                            "sentinel {i} knows {} other sentinels of {}",
                            others.len(),
                            s.sentinels.len() - 1
                        ));
                    }
                }
                Ok(())
            },
        );
        setup
    }

    /// One setup (a primary, a replica, one sentinel), started at the first call and shared by
    /// every test of the test binary: for tests isolated by key, which must not fail it over,
    /// kill or pause its servers. They are killed when the test process exits.
    pub fn shared() -> &'static SentinelSetup {
        static SHARED: std::sync::OnceLock<SentinelSetup> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| {
            let mut setup = SentinelSetup::spawn(1, 1);
            setup.reaper = Some(crate::reap_at_exit_all(&[&setup.nodes, &setup.sentinels]));
            setup
        })
    }

    /// The name the sentinels monitor the primary under (`mymaster`).
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// `redis://127.0.0.1:<port>` of every running sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .filter(|s| s.is_running())
            .map(RedisServer::url)
            .collect()
    }

    /// The sentinels, running or killed.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// Sentinel `i`, to kill, pause or restart it.
    pub fn sentinel_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.sentinels[i]
    }

    /// The data nodes by index (0: the first primary), running or killed.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Data node `i`, to kill, pause or restart it (a restarted node gets its original
    /// arguments: a first replica again replicates the first primary until a sentinel
    /// reconfigures it).
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// The port of the primary, as the first running sentinel that answers says
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    pub fn current_primary_port(&self) -> u16 {
        let mut probe = Probe::default();
        self.sentinels
            .iter()
            .filter(|s| s.is_running())
            .find_map(|s| primary_port_of(&mut probe, s.port()).ok())
            .unwrap_or_else(|| panic!("no sentinel answers GET-MASTER-ADDR-BY-NAME {MASTER_NAME}"))
    }

    /// The index of the data node the sentinels say is the primary.
    pub fn primary_index(&self) -> usize {
        let port = self.current_primary_port();
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .unwrap_or_else(|| panic!("the sentinels name port {port} the primary, no node of this setup"))
    }

    /// The data node the sentinels say is the primary.
    pub fn primary(&self) -> &RedisServer {
        &self.nodes[self.primary_index()]
    }

    /// The data node the sentinels say is the primary, to kill, pause or restart it.
    pub fn primary_mut(&mut self) -> &mut RedisServer {
        let i = self.primary_index();
        &mut self.nodes[i]
    }

    /// The indices of the running data nodes other than the primary, in index order.
    pub fn replica_indices(&self) -> Vec<usize> {
        let primary = self.primary_index();
        (0..self.nodes.len())
            .filter(|&i| i != primary && self.nodes[i].is_running())
            .collect()
    }

    /// Replica `i` of [`replica_indices`](Self::replica_indices): before any failover, data
    /// node `i + 1`.
    pub fn replica(&self, i: usize) -> &RedisServer {
        let indices = self.replica_indices();
        let Some(&index) = indices.get(i) else {
            panic!("there is no replica {i}: the running replicas are nodes {indices:?}");
        };
        &self.nodes[index]
    }

    /// Asks a sentinel for a failover (`SENTINEL FAILOVER`, again while it answers with an error
    /// other than `INPROG`), then waits (30 s at most) until every running sentinel names
    /// another primary, which answers `ROLE` as master and takes a write. Returns its port.
    pub fn failover(&mut self) -> u16 {
        let old = self.current_primary_port();
        let mut probe = Probe::default();
        let deadline = Instant::now() + SETTLE;
        loop {
            let mut last = String::from("no sentinel is running");
            let asked = self.sentinels.iter().filter(|s| s.is_running()).any(|s| {
                match probe.ask::<()>(s.port(), redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER_NAME)) {
                    Ok(()) => true,
                    Err(e) if e.contains("INPROG") => true,
                    Err(e) => {
                        last = e;
                        false
                    }
                }
            });
            if asked {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no sentinel would start a failover within {SETTLE:?}; last: {last}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.wait_for_new_primary(old)
    }

    /// Kills (SIGKILL) the primary, then waits (30 s at most) until every running sentinel names
    /// another primary, which answers `ROLE` as master and takes a write. Returns its port.
    pub fn kill_primary_and_wait_failover(&mut self) -> u16 {
        let old = self.current_primary_port();
        self.primary_mut().kill();
        self.wait_for_new_primary(old)
    }

    /// Waits until every running sentinel names a primary other than the one on port `old`,
    /// which is a running node of this setup, answers `ROLE` as master and takes a write.
    pub fn wait_for_new_primary(&self, old: u16) -> u16 {
        self.wait_for(
            &format!("failover away from the primary on port {old}"),
            |s, probe| {
                let mut named = None;
                for (i, sentinel) in s.sentinels.iter().enumerate().filter(|(_, s)| s.is_running()) {
                    let port = primary_port_of(probe, sentinel.port())?;
                    if port == old {
                        return Err(format!("sentinel {i} still names port {old}"));
                    }
                    match named {
                        Some(other) if other != port => {
                            return Err(format!("sentinels name ports {other} and {port}"));
                        }
                        _ => named = Some(port),
                    }
                }
                let port = named.ok_or("no sentinel is running")?;
                if !s.nodes.iter().any(|n| n.port() == port && n.is_running()) {
                    return Err(format!(
                        "the sentinels name port {port}, no running node of this setup"
                    ));
                }
                let role: Vec<redis::Value> = probe.ask(port, &redis::cmd("ROLE"))?;
                let role = role
                    .first()
                    .and_then(|r| redis::from_redis_value_ref::<String>(r).ok());
                if role.as_deref() != Some("master") {
                    return Err(format!("the node on port {port} answers ROLE {role:?}"));
                }
                probe.ask::<()>(port, redis::cmd("SET").arg(PROBE_KEY).arg(1))?;
                probe.ask::<()>(port, redis::cmd("DEL").arg(PROBE_KEY))?;
                Ok(port)
            },
        )
    }

    /// Calls `check` every few milliseconds until it is `Ok` (see [`settle`]).
    fn wait_for<T>(&self, what: &str, mut check: impl FnMut(&Self, &mut Probe) -> Result<T, String>) -> T {
        settle("sentinel setup", what, |probe| check(self, probe))
    }
}

/// Starts a sentinel monitoring the primary on `primary` with `quorum`, from a config file of
/// its own (Sentinel rewrites it with what it learns).
fn spawn_sentinel(primary: u16, quorum: usize) -> RedisServer {
    RedisServer::spawn_on(free_port, |dir, port| {
        let config = dir.join("sentinel.conf");
        let text = format!(
            "port {port}\n\
             bind 127.0.0.1\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} {quorum}\n\
             sentinel down-after-milliseconds {MASTER_NAME} 2000\n\
             sentinel failover-timeout {MASTER_NAME} 5000\n\
             sentinel parallel-syncs {MASTER_NAME} 1\n"
        );
        std::fs::write(&config, text)
            .unwrap_or_else(|e| panic!("cannot write the sentinel config {}: {e}", config.display()));
        Launch {
            leading_args: vec![config.into_os_string()],
            extra_args: vec!["--sentinel".into()],
            ..Launch::default()
        }
    })
}

/// The primary's port as the sentinel on `port` says (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
fn primary_port_of(probe: &mut Probe, port: u16) -> Result<u16, String> {
    let address: Option<(String, u16)> = probe.ask(
        port,
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER_NAME),
    )?;
    address
        .map(|(_, primary)| primary)
        .ok_or_else(|| format!("sentinel on port {port} does not know {MASTER_NAME}"))
}
