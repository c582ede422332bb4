//! [`RedisCluster`]: a Redis Cluster of real `redis-server` processes on loopback, built by hand
//! (`CLUSTER ADDSLOTSRANGE`, `CLUSTER MEET`, `CLUSTER REPLICATE`, no `redis-cli`), with the
//! faults a cluster test wants: slot migration and failover by killing a primary.
//!
//! Everything here is blocking (sync): call it from a sync test, or from an async test as it is
//! (it never needs the runtime, it only holds up the thread it runs on for the wait).

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::TcpListener;
use std::process::Child;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::FromRedisValue;

use crate::{Dice, Launch, RedisServer};

/// How many hash slots a cluster has.
const SLOTS: usize = 16384;

/// The cluster bus port is the client port plus this.
const BUS_OFFSET: u16 = 10000;

/// How long a fixture is given to settle after anything the test kit does to it.
pub(crate) const SETTLE: Duration = Duration::from_secs(30);

/// How often a wait asks again.
const POLL: Duration = Duration::from_millis(20);

/// A Redis Cluster of `redis-server` processes on loopback, each a [`RedisServer`] (so killed
/// on drop), with `--cluster-node-timeout 1000` and `--cluster-replica-validity-factor 0` (a
/// replica may always fail over) and no replica migration.
///
/// Nodes keep the index they were started with: `0..primaries` are the first primaries, and
/// the replicas of primary `p` follow, at `primaries + p * replicas_per_primary + j`. Roles
/// change with failovers: ask [`primaries`](Self::primaries) and
/// [`replica_of`](Self::replica_of) rather than assuming the layout.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// The node ids (`CLUSTER MYID`), by node index.
    ids: Vec<String>,
    /// For [`shared`](Self::shared) only: the process that kills the nodes when the test process
    /// exits.
    reaper: Option<Child>,
}

/// A slot migration begun by [`RedisCluster::begin_migration`]: the source answers `ASK` for
/// the keys already moved, until [`RedisCluster::finish_migration`].
#[derive(Debug)]
#[must_use = "a begun migration leaves the slot open until finish_migration"]
pub struct SlotMigration {
    slot: u16,
    from: usize,
    to: usize,
}

impl SlotMigration {
    /// The slot being moved.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The index of the node the slot moves from (`MIGRATING`).
    pub fn from(&self) -> usize {
        self.from
    }

    /// The index of the node the slot moves to (`IMPORTING`).
    pub fn to(&self) -> usize {
        self.to
    }
}

impl RedisCluster {
    /// Starts `primaries * (1 + replicas_per_primary)` nodes, gives the primaries equal ranges
    /// of the slots, joins them, makes the replicas replicate, and waits (30 s at most, then
    /// panics with what was missing) until every node reports `cluster_state:ok` with all slots
    /// served, all nodes know each other and agree on the slot map and the roles, and every
    /// replica's link to its primary is up.
    pub fn spawn(primaries: usize, replicas_per_primary: usize) -> RedisCluster {
        assert!(
            (1..=SLOTS).contains(&primaries),
            "a cluster needs 1 to {SLOTS} primaries, not {primaries}"
        );
        let total = primaries * (1 + replicas_per_primary);
        let nodes: Vec<RedisServer> = (0..total).map(|_| spawn_node()).collect();
        let mut probe = Probe::default();
        let ids = nodes
            .iter()
            .map(|node| probe.must::<String>(node.port(), redis::cmd("CLUSTER").arg("MYID")))
            .collect();
        let cluster = RedisCluster {
            nodes,
            ids,
            reaper: None,
        };

        // Distinct config epochs before the nodes meet, as `redis-cli --cluster create` does, so
        // that no epoch collision has to be resolved.
        for (i, node) in cluster.nodes.iter().enumerate() {
            probe.must::<()>(
                node.port(),
                redis::cmd("CLUSTER").arg("SET-CONFIG-EPOCH").arg(i + 1),
            );
        }
        for p in 0..primaries {
            let (first, last) = (p * SLOTS / primaries, (p + 1) * SLOTS / primaries - 1);
            probe.must::<()>(
                cluster.nodes[p].port(),
                redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(first).arg(last),
            );
        }
        let first = cluster.nodes[0].port();
        for node in &cluster.nodes[1..] {
            probe.must::<()>(
                first,
                redis::cmd("CLUSTER")
                    .arg("MEET")
                    .arg("127.0.0.1")
                    .arg(node.port()),
            );
        }
        cluster.wait_for("every node to know every other node", |c, probe| {
            c.check_all_known(probe)
        });

        for p in 0..primaries {
            for j in 0..replicas_per_primary {
                let replica = primaries + p * replicas_per_primary + j;
                probe.must::<()>(
                    cluster.nodes[replica].port(),
                    redis::cmd("CLUSTER").arg("REPLICATE").arg(&cluster.ids[p]),
                );
            }
        }
        cluster.wait_for("the new cluster to settle", |c, probe| {
            let view = c.check_settled(probe)?;
            for entry in &view {
                let i = c.index_of_id(&entry.id)?;
                let expected =
                    (i >= primaries).then(|| c.ids[(i - primaries) / replicas_per_primary.max(1)].clone());
                if entry.master_id != expected {
                    return Err(format!(
                        "node {i} replicates {:?}, not {expected:?} yet",
                        entry.master_id
                    ));
                }
            }
            Ok(())
        });
        cluster
    }

    /// One cluster of 3 primaries with a replica each, started at the first call and shared by
    /// every test of the test binary: for tests isolated by key (a hash tag of their own), which
    /// must not kill, pause or restart its nodes. Its processes are killed when the test process
    /// exits (by a small `sh` reaper process, as statics are never dropped).
    pub fn shared() -> &'static RedisCluster {
        static SHARED: OnceLock<RedisCluster> = OnceLock::new();
        SHARED.get_or_init(|| {
            let mut cluster = RedisCluster::spawn(3, 1);
            cluster.reap_at_exit();
            cluster
        })
    }

    /// Has the nodes killed when the test process exits (see [`crate::reap_at_exit`]).
    fn reap_at_exit(&mut self) {
        self.reaper = Some(crate::reap_at_exit(&self.nodes));
    }

    /// `redis://127.0.0.1:<port>` of every running node, in node order: initial nodes for a
    /// cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .map(RedisServer::url)
            .collect()
    }

    /// All nodes, by index, running or killed.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// Node `i`, to kill, pause or restart it (a restarted node keeps its `nodes.conf`, so it
    /// rejoins with the same id, empty). The waits of this type only ask nodes that are
    /// running; a paused node makes them wait for it.
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// Node `i`'s cluster id (`CLUSTER MYID`).
    pub fn node_id(&self, i: usize) -> &str {
        &self.ids[i]
    }

    /// The indices of the current primaries, in index order, as a running node sees them:
    /// nodes whose process runs, flagged `master` and not failing.
    pub fn primaries(&self) -> Vec<usize> {
        let view = self.view();
        let mut primaries: Vec<usize> = view
            .iter()
            .filter(|e| e.master && e.fail.is_none())
            .map(|e| self.index_of_id(&e.id).unwrap_or_else(|e| panic!("{e}")))
            .filter(|&i| self.nodes[i].is_running())
            .collect();
        primaries.sort_unstable();
        primaries
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        let mut probe = Probe::default();
        let port = self.first_answering(&mut probe);
        probe.must(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
    }

    /// The index of the node that serves the slot of `key`, as a running node sees the slot
    /// map.
    pub fn primary_of_key(&self, key: &str) -> usize {
        self.owner_of_slot(self.slot_of(key))
    }

    /// The index of the node that serves `slot`, as a running node sees the slot map.
    pub fn owner_of_slot(&self, slot: u16) -> usize {
        let view = self.view();
        let owner = view
            .iter()
            .find(|e| e.serves(slot))
            .unwrap_or_else(|| panic!("no node serves slot {slot}"));
        self.index_of_id(&owner.id).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The index of a running, healthy replica of the node at `primary` (the first in index
    /// order); panics if it has none.
    pub fn replica_of(&self, primary: usize) -> usize {
        let view = self.view();
        let mut replicas: Vec<usize> = view
            .iter()
            .filter(|e| e.master_id.as_deref() == Some(self.ids[primary].as_str()) && e.fail.is_none())
            .map(|e| self.index_of_id(&e.id).unwrap_or_else(|e| panic!("{e}")))
            .filter(|&i| self.nodes[i].is_running())
            .collect();
        replicas.sort_unstable();
        *replicas
            .first()
            .unwrap_or_else(|| panic!("node {primary} has no running replica"))
    }

    /// Moves the slot of `key`, with all its keys, to the primary at index `to` (blocking), the
    /// standard way: [`begin_migration`](Self::begin_migration), then
    /// [`finish_migration`](Self::finish_migration). Does nothing if `to` serves it already.
    pub fn migrate_slot_of(&self, key: &str, to: usize) {
        if self.primary_of_key(key) != to {
            let migration = self.begin_migration(key, to);
            self.finish_migration(migration);
        }
    }

    /// Opens the migration of the slot of `key` to the primary at index `to` (blocking):
    /// `CLUSTER SETSLOT <slot> IMPORTING` on `to`, then `MIGRATING` on the node serving it. No
    /// key moves yet: [`migrate_key`](Self::migrate_key) moves one, so that the source answers
    /// `ASK` for it. Panics if `to` is not a primary or already serves the slot.
    pub fn begin_migration(&self, key: &str, to: usize) -> SlotMigration {
        let slot = self.slot_of(key);
        let from = self.owner_of_slot(slot);
        assert_ne!(from, to, "node {to} already serves slot {slot} (of {key:?})");
        assert!(
            self.primaries().contains(&to),
            "node {to} is not a running primary: it cannot take slot {slot}"
        );
        let mut probe = Probe::default();
        probe.must::<()>(
            self.nodes[to].port(),
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("IMPORTING")
                .arg(&self.ids[from]),
        );
        probe.must::<()>(
            self.nodes[from].port(),
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("MIGRATING")
                .arg(&self.ids[to]),
        );
        SlotMigration { slot, from, to }
    }

    /// Moves `key` alone (`MIGRATE`) from the source to the target of `migration` (blocking);
    /// nothing if the source does not hold it.
    pub fn migrate_key(&self, migration: &SlotMigration, key: &str) {
        let mut probe = Probe::default();
        let _: String = probe.must(
            self.nodes[migration.from].port(),
            redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(self.nodes[migration.to].port())
                .arg(key)
                .arg(0)
                .arg(5000),
        );
    }

    /// Ends `migration` (blocking): moves the keys left in the slot (`CLUSTER GETKEYSINSLOT`,
    /// `MIGRATE ... KEYS`) until there are none, then `CLUSTER SETSLOT <slot> NODE <target>` on
    /// the target, the source and every other primary, and waits (30 s at most) until every
    /// running node sees the target serve the slot and the cluster has settled.
    pub fn finish_migration(&self, migration: SlotMigration) {
        let SlotMigration { slot, from, to } = migration;
        let mut probe = Probe::default();
        let (source, target) = (self.nodes[from].port(), self.nodes[to].port());
        let deadline = Instant::now() + SETTLE;
        loop {
            let keys: Vec<Vec<u8>> = probe.must(
                source,
                redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(100),
            );
            if keys.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "slot {slot} still has keys on node {from} after 30 s of MIGRATE"
            );
            let _: String = probe.must(
                source,
                redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(target)
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("KEYS")
                    .arg(keys),
            );
        }
        let set_node = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("NODE")
            .arg(&self.ids[to])
            .clone();
        probe.must::<()>(target, &set_node);
        probe.must::<()>(source, &set_node);
        for p in self.primaries() {
            if p != from && p != to {
                probe.must::<()>(self.nodes[p].port(), &set_node);
            }
        }
        self.wait_for(
            &format!("every node to see slot {slot} on node {to}"),
            |c, probe| {
                let view = c.check_settled(probe)?;
                let owner = view.iter().find(|e| e.serves(slot));
                match owner {
                    Some(e) if e.id == c.ids[to] => Ok(()),
                    _ => Err(format!("slot {slot} is not on node {to} yet")),
                }
            },
        );
    }

    /// Kills (SIGKILL) the primary at index `primary`, waits (30 s at most) until one of its
    /// replicas is promoted and every running node reports `cluster_state:ok` and agrees on the
    /// slot map, and returns the new primary's index. Panics if `primary` is not a running
    /// primary with a running replica.
    pub fn fail_over_by_killing(&mut self, primary: usize) -> usize {
        self.fail_over_lagging(primary, Duration::ZERO, &mut || {})
    }

    /// As [`fail_over_by_killing`](Self::fail_over_by_killing), with the replica behind: it is
    /// frozen (SIGSTOP) for `lag` before the primary is killed and thawed right after, so the
    /// writes of that time never reach it (asynchronous replication losing them). With `lag`
    /// zero nothing is frozen. `killing` is called just before the kill.
    pub fn fail_over_lagging(&mut self, primary: usize, lag: Duration, killing: &mut dyn FnMut()) -> usize {
        assert!(
            self.primaries().contains(&primary),
            "node {primary} is not a running primary"
        );
        let replica = self.replica_of(primary);
        if !lag.is_zero() {
            self.nodes[replica].pause();
            std::thread::sleep(lag);
        }
        killing();
        self.nodes[primary].kill();
        if !lag.is_zero() {
            self.nodes[replica].resume();
        }
        self.wait_for(
            &format!("replica {replica} to take over from killed primary {primary}"),
            |c, probe| {
                let view = c.check_settled(probe)?;
                let promoted = view
                    .iter()
                    .any(|e| e.id == c.ids[replica] && e.master && !e.slots.is_empty());
                if promoted {
                    Ok(())
                } else {
                    Err(format!("node {replica} is not a primary with slots yet"))
                }
            },
        );
        replica
    }

    /// Calls `check` every few milliseconds until it is `Ok` (see [`settle`]).
    fn wait_for<T>(&self, what: &str, mut check: impl FnMut(&Self, &mut Probe) -> Result<T, String>) -> T {
        settle("cluster", what, |probe| check(self, probe))
    }

    /// The node with `id`.
    fn index_of_id(&self, id: &str) -> Result<usize, String> {
        self.ids
            .iter()
            .position(|known| known == id)
            .ok_or_else(|| format!("unknown node id {id}"))
    }

    /// The port of the first running node that answers PING.
    fn first_answering(&self, probe: &mut Probe) -> u16 {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .map(RedisServer::port)
            .find(|&port| probe.query::<String>(port, &redis::cmd("PING")).is_ok())
            .unwrap_or_else(|| panic!("no node of the cluster answers"))
    }

    /// `CLUSTER NODES` as the first running node that answers sees it.
    fn view(&self) -> Vec<Entry> {
        let mut probe = Probe::default();
        let port = self.first_answering(&mut probe);
        let text: String = probe.must(port, redis::cmd("CLUSTER").arg("NODES"));
        parse_nodes(&text).unwrap_or_else(|e| panic!("node on port {port}: {e}"))
    }

    /// That every node knows all the others, past the handshake and connected.
    fn check_all_known(&self, probe: &mut Probe) -> Result<(), String> {
        for (i, node) in self.nodes.iter().enumerate() {
            let text: String = probe.ask(node.port(), redis::cmd("CLUSTER").arg("NODES"))?;
            let view = parse_nodes(&text)?;
            if view.len() != self.nodes.len() {
                return Err(format!(
                    "node {i} knows {} nodes of {}",
                    view.len(),
                    self.nodes.len()
                ));
            }
            for entry in &view {
                if entry.handshake {
                    return Err(format!("node {i} is still in handshake with {}", entry.id));
                }
                let j = self.index_of_id(&entry.id)?;
                if !entry.connected {
                    return Err(format!("node {i} is not connected to node {j} yet"));
                }
            }
        }
        Ok(())
    }

    /// That the running nodes have settled: each reports `cluster_state:ok`, all slots served and
    /// every node known; they see the same nodes, roles, failures and slot map, with every
    /// running node healthy and every killed one failed, no slot half-migrated, and each
    /// running replica following a running primary with its link up. Returns the common view.
    fn check_settled(&self, probe: &mut Probe) -> Result<Vec<Entry>, String> {
        let mut agreed: Option<(usize, Vec<Entry>)> = None;
        for (i, node) in self.nodes.iter().enumerate().filter(|(_, n)| n.is_running()) {
            let port = node.port();
            let info: String = probe.ask(port, redis::cmd("CLUSTER").arg("INFO"))?;
            let wanted = [
                ("cluster_state", "ok".to_string()),
                ("cluster_slots_ok", SLOTS.to_string()),
                ("cluster_known_nodes", self.nodes.len().to_string()),
            ];
            for (field, value) in wanted {
                let actual = info_field(&info, field);
                if actual != Some(value.as_str()) {
                    return Err(format!("node {i} has {field}:{}", actual.unwrap_or("(none)")));
                }
            }
            let text: String = probe.ask(port, redis::cmd("CLUSTER").arg("NODES"))?;
            let mut view = parse_nodes(&text)?;
            for entry in &view {
                if entry.handshake {
                    return Err(format!("node {i} is still in handshake with {}", entry.id));
                }
                let j = self.index_of_id(&entry.id)?;
                if entry.open_slots {
                    return Err(format!("node {i} has a slot migrating or importing"));
                }
                if self.nodes[j].is_running() {
                    if entry.fail.is_some() || !entry.connected {
                        return Err(format!("node {i} sees running node {j} as failing or unlinked"));
                    }
                    if let Some(master) = &entry.master_id {
                        let m = self.index_of_id(master)?;
                        if !self.nodes[m].is_running() {
                            return Err(format!("node {i} sees node {j} replicate killed node {m}"));
                        }
                    }
                } else if entry.fail != Some(Fail::Fail) {
                    return Err(format!("node {i} does not see killed node {j} as failed yet"));
                }
                if entry.myself && !entry.master {
                    let replication: String = probe.ask(port, redis::cmd("INFO").arg("replication"))?;
                    let link = info_field(&replication, "master_link_status");
                    if link != Some("up") {
                        return Err(format!("replica {i} has master_link_status:{link:?}"));
                    }
                }
            }
            view.sort_by(|a, b| a.id.cmp(&b.id));
            match &agreed {
                None => agreed = Some((i, view)),
                Some((first, seen)) => {
                    if !same_view(seen, &view) {
                        return Err(format!("nodes {first} and {i} see different clusters"));
                    }
                }
            }
        }
        agreed
            .map(|(_, view)| view)
            .ok_or_else(|| "no node of the cluster is running".to_string())
    }
}

/// Starts one cluster node on a port whose bus port (+10000) is free too.
fn spawn_node() -> RedisServer {
    let args = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "1000",
        "--cluster-replica-validity-factor",
        "0",
        "--cluster-allow-replica-migration",
        "no",
        "--cluster-announce-ip",
        "127.0.0.1",
        // Full syncs at once, not after the default 5 s wait for more replicas.
        "--repl-diskless-sync-delay",
        "0",
    ];
    RedisServer::spawn_on(cluster_port, |_, _| Launch {
        extra_args: args.iter().map(OsString::from).collect(),
        ..Launch::default()
    })
}

/// A port that is free on loopback, as is the port 10000 above it (the cluster bus). Both are
/// picked below the kernel's ephemeral range when it leaves room, so that no outgoing connection
/// takes them between this check and the server's bind, or before a restart.
fn cluster_port() -> u16 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let (first, end) = if low >= 2 * BUS_OFFSET + 1000 {
        (BUS_OFFSET, low - BUS_OFFSET)
    } else {
        (1024, u16::MAX - BUS_OFFSET)
    };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut dice = Dice::new(
        nanos
            ^ (u64::from(std::process::id()) << 32)
            ^ CALLS
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15),
    );
    let free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
    for _ in 0..1000 {
        let port = first + dice.below(u64::from(end - first)) as u16;
        if free(port) && free(port + BUS_OFFSET) {
            return port;
        }
    }
    panic!("no free port p in {first}..{end} with p + {BUS_OFFSET} free too, after 1000 tries");
}

/// Calls `check` every [`POLL`] until it is `Ok`, and after [`SETTLE`] panics with what
/// `fixture` waited for and the last reason: the wait of every fixture of the test kit.
pub(crate) fn settle<T>(
    fixture: &str,
    what: &str,
    mut check: impl FnMut(&mut Probe) -> Result<T, String>,
) -> T {
    let mut probe = Probe::default();
    let deadline = Instant::now() + SETTLE;
    loop {
        match check(&mut probe) {
            Ok(value) => return value,
            Err(reason) if Instant::now() > deadline => {
                panic!("{fixture}: no {what} within {SETTLE:?}; last: {reason}")
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// Connections kept open across the polls of a wait, one per port.
#[derive(Default)]
pub(crate) struct Probe {
    connections: HashMap<u16, redis::Connection>,
}

impl Probe {
    /// Runs `cmd` on the server at `port`, connecting first if need be; drops the connection
    /// after any error, so that the next query connects anew.
    pub(crate) fn query<T: FromRedisValue>(&mut self, port: u16, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let connection = match self.connections.entry(port) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => entry.insert(connect(port)?),
        };
        let result = cmd.query(connection);
        if result.is_err() {
            self.connections.remove(&port);
        }
        result
    }

    /// [`query`](Self::query), with the error as a message that says what failed.
    pub(crate) fn ask<T: FromRedisValue>(&mut self, port: u16, cmd: &redis::Cmd) -> Result<T, String> {
        self.query(port, cmd)
            .map_err(|e| format!("{} on port {port} failed: {e}", describe(cmd)))
    }

    /// [`query`](Self::query), panicking with what failed.
    pub(crate) fn must<T: FromRedisValue>(&mut self, port: u16, cmd: &redis::Cmd) -> T {
        self.ask(port, cmd).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// A connection to `127.0.0.1:<port>` that gives up after a few seconds on anything.
fn connect(port: u16) -> redis::RedisResult<redis::Connection> {
    let connection = redis::Client::open(format!("redis://127.0.0.1:{port}"))?
        .get_connection_with_timeout(Duration::from_secs(2))?;
    connection.set_read_timeout(Some(Duration::from_secs(3)))?;
    connection.set_write_timeout(Some(Duration::from_secs(3)))?;
    Ok(connection)
}

/// The command's name and arguments, for messages.
fn describe(cmd: &redis::Cmd) -> String {
    cmd.args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            _ => "<cursor>".to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The value of `field` in an `INFO`-style text (`field:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// How a node sees another fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fail {
    /// `fail?`: this node alone thinks it is down.
    Suspected,
    /// `fail`: the cluster agreed it is down.
    Fail,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct Entry {
    id: String,
    port: u16,
    master: bool,
    /// The id of the primary it replicates, for a replica.
    master_id: Option<String>,
    fail: Option<Fail>,
    /// Slot ranges it serves, both ends included.
    slots: Vec<(u16, u16)>,
    myself: bool,
    handshake: bool,
    connected: bool,
    /// A slot migrating from or importing to it (shown on the `myself` line only).
    open_slots: bool,
}

impl Entry {
    fn serves(&self, slot: u16) -> bool {
        self.slots
            .iter()
            .any(|&(first, last)| (first..=last).contains(&slot))
    }
}

/// Whether two views agree on nodes, roles, failures and slots (not on what only the asking
/// node knows: `myself`, its links, its open slots).
fn same_view(a: &[Entry], b: &[Entry]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.id == y.id
                && x.port == y.port
                && x.master == y.master
                && x.master_id == y.master_id
                && x.fail == y.fail
                && x.slots == y.slots
        })
}

/// Parses `CLUSTER NODES`: `<id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent>
/// <pong-recv> <config-epoch> <link-state> <slot> ...`.
fn parse_nodes(text: &str) -> Result<Vec<Entry>, String> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let bad = || format!("unexpected CLUSTER NODES line {line:?}");
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return Err(bad());
            }
            let port = fields[1]
                .split('@')
                .next()
                .and_then(|address| address.rsplit(':').next())
                .and_then(|port| port.parse().ok())
                .ok_or_else(bad)?;
            let flags: Vec<&str> = fields[2].split(',').collect();
            let fail = if flags.contains(&"fail") {
                Some(Fail::Fail)
            } else if flags.contains(&"fail?") {
                Some(Fail::Suspected)
            } else {
                None
            };
            let mut slots = Vec::new();
            let mut open_slots = false;
            for slot in &fields[8..] {
                if slot.starts_with('[') {
                    open_slots = true;
                    continue;
                }
                let (first, last) = slot.split_once('-').unwrap_or((slot, slot));
                match (first.parse(), last.parse()) {
                    (Ok(first), Ok(last)) => slots.push((first, last)),
                    _ => return Err(bad()),
                }
            }
            Ok(Entry {
                id: fields[0].to_string(),
                port,
                master: flags.contains(&"master"),
                master_id: (fields[3] != "-").then(|| fields[3].to_string()),
                fail,
                slots,
                myself: flags.contains(&"myself"),
                handshake: flags.contains(&"handshake") || flags.contains(&"noaddr"),
                connected: flags.contains(&"myself") || fields[7] == "connected",
                open_slots,
            })
        })
        .collect()
}
