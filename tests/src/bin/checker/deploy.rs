//! The deployments the checker runs against, spawned with the test kit, and the faults of the
//! store it injects into them (the faults of a worker are in `main.rs`).

use std::time::Duration;

use lock_tests::{
    EtcdCluster, FaultProxy, MariadbServer, PostgresServer, RedisCluster, RedisServer, SentinelSetup,
    ZkEnsemble,
};

use crate::worker;
use crate::Fallible;

/// How long a replica is frozen before its primary is killed in a failover: the writes of that
/// time reach the primary only, as when replication lags.
pub const REPLICA_LAG: Duration = Duration::from_millis(1000);

/// A lock store, as `--store` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Memory,
    Redis,
    Sentinel,
    Cluster,
    Redlock,
    Etcd,
    Postgres,
    /// MySQL's protocol, on a MariaDB server the kit starts (`mariadbd`).
    Mysql,
    /// A 3-server ensemble.
    Zookeeper,
}

impl Kind {
    pub const ALL: [Kind; 9] = [
        Kind::Memory,
        Kind::Redis,
        Kind::Sentinel,
        Kind::Cluster,
        Kind::Redlock,
        Kind::Etcd,
        Kind::Postgres,
        Kind::Mysql,
        Kind::Zookeeper,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Memory => "memory",
            Kind::Redis => "redis",
            Kind::Sentinel => "sentinel",
            Kind::Cluster => "cluster",
            Kind::Redlock => "redlock",
            Kind::Etcd => "etcd",
            Kind::Postgres => "postgres",
            Kind::Mysql => "mysql",
            Kind::Zookeeper => "zookeeper",
        }
    }

    pub fn parse(name: &str) -> Fallible<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name).ok_or_else(|| {
            format!("--store {name}: one of memory, redis, sentinel, cluster, redlock, etcd, postgres, mysql, zookeeper")
                .into()
        })
    }

    /// Whether locks of this store come with a fencing token: every one but RedLock (five
    /// independent counters make no one increasing sequence).
    pub fn fences(self) -> bool {
        self != Kind::Redlock
    }

    /// Whether a worker's connections go through a fault proxy (so that `partition` applies):
    /// not where the client learns addresses from the store (Sentinel, Cluster) or reaches five
    /// of them (RedLock).
    pub fn proxied(self) -> bool {
        matches!(
            self,
            Kind::Redis | Kind::Etcd | Kind::Postgres | Kind::Mysql | Kind::Zookeeper
        )
    }
}

/// A fault, as `--fault` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    /// A worker frozen (SIGSTOP) for longer than the lease, then thawed.
    Sigstop,
    /// A worker killed (SIGKILL), and started again.
    Sigkill,
    /// The store restarted: Redis empty (no persistence), PostgreSQL and MariaDB on their data.
    Restart,
    /// The primary (Sentinel, Cluster) killed after its replicas fell behind, or the etcd or
    /// ZooKeeper leader killed; the killed node started again afterwards.
    Failover,
    /// A worker cut off from the store (its connections silent) for longer than the lease.
    Partition,
    /// A RedLock master restarted empty, at once or after a delay.
    RestartEmpty,
}

impl Fault {
    pub const ALL: [Fault; 7] = [
        Fault::None,
        Fault::Sigstop,
        Fault::Sigkill,
        Fault::Restart,
        Fault::Failover,
        Fault::Partition,
        Fault::RestartEmpty,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Sigstop => "sigstop",
            Fault::Sigkill => "sigkill",
            Fault::Restart => "restart",
            Fault::Failover => "failover",
            Fault::Partition => "partition",
            Fault::RestartEmpty => "restart-empty",
        }
    }

    pub fn parse(name: &str) -> Fallible<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name).ok_or_else(|| {
            format!(
                "--fault {name}: one of none, sigstop, sigkill, restart, failover, partition, restart-empty"
            )
            .into()
        })
    }

    /// Whether the fault means something on `store`.
    pub fn applies_to(self, store: Kind) -> bool {
        match self {
            Fault::None => true,
            Fault::Sigstop | Fault::Sigkill => store != Kind::Memory,
            Fault::Partition => store.proxied(),
            Fault::Restart => matches!(store, Kind::Redis | Kind::Postgres | Kind::Mysql),
            Fault::Failover => matches!(
                store,
                Kind::Sentinel | Kind::Cluster | Kind::Etcd | Kind::Zookeeper
            ),
            Fault::RestartEmpty => store == Kind::Redlock,
        }
    }
}

/// A running deployment.
pub struct Deployment {
    kind: Kind,
    replicas: usize,
    parts: Parts,
    /// Which fault of the store comes next (each picks another node).
    round: usize,
}

enum Parts {
    Memory,
    Redis(RedisServer, Vec<FaultProxy>),
    Sentinel(SentinelSetup),
    Cluster(RedisCluster),
    Redlock(Vec<RedisServer>),
    /// Per worker, one proxy per member.
    Etcd(EtcdCluster, Vec<Vec<FaultProxy>>),
    Postgres(PostgresServer, Vec<FaultProxy>),
    /// Per worker, one proxy in front of the server.
    Mysql(MariadbServer, Vec<FaultProxy>),
    /// Per worker, one proxy per server.
    Zookeeper(ZkEnsemble, Vec<Vec<FaultProxy>>),
}

impl Deployment {
    /// Spawns `kind` for `workers` worker processes; `replicas` is what each acquire and renewal
    /// waits for (Sentinel and Cluster).
    pub fn spawn(kind: Kind, replicas: usize, workers: usize) -> Deployment {
        let parts = match kind {
            Kind::Memory => Parts::Memory,
            Kind::Redis => {
                let server = RedisServer::spawn();
                let proxies = (0..workers).map(|_| FaultProxy::start(server.port())).collect();
                Parts::Redis(server, proxies)
            }
            // Two replicas: one is left to acknowledge once the other is promoted.
            Kind::Sentinel => Parts::Sentinel(SentinelSetup::spawn(2, 1)),
            Kind::Cluster => Parts::Cluster(RedisCluster::spawn(3, 1)),
            Kind::Redlock => Parts::Redlock((0..5).map(|_| RedisServer::spawn()).collect()),
            Kind::Etcd => {
                let cluster = EtcdCluster::spawn();
                let proxies = (0..workers)
                    .map(|_| {
                        (0..3)
                            .map(|m| FaultProxy::start(cluster.client_port(m)))
                            .collect()
                    })
                    .collect();
                Parts::Etcd(cluster, proxies)
            }
            Kind::Postgres => {
                let server = PostgresServer::spawn();
                let proxies = (0..workers).map(|_| FaultProxy::start(server.port())).collect();
                Parts::Postgres(server, proxies)
            }
            Kind::Mysql => {
                let server = MariadbServer::spawn();
                let proxies = (0..workers).map(|_| FaultProxy::start(server.port())).collect();
                Parts::Mysql(server, proxies)
            }
            Kind::Zookeeper => {
                let ensemble = ZkEnsemble::spawn();
                let proxies = (0..workers)
                    .map(|_| {
                        (0..3)
                            .map(|s| FaultProxy::start(ensemble.client_port(s)))
                            .collect()
                    })
                    .collect();
                Parts::Zookeeper(ensemble, proxies)
            }
        };
        Deployment {
            kind,
            replicas,
            parts,
            round: 0,
        }
    }

    /// The lock spec worker `w` connects with ([`worker::spec`]).
    pub fn spec(&self, w: usize) -> String {
        let (urls, master): (Vec<String>, &str) = match &self.parts {
            Parts::Memory => (Vec::new(), ""),
            Parts::Redis(_, proxies) => (vec![proxies[w].url()], ""),
            Parts::Sentinel(setup) => (setup.sentinel_urls(), setup.master_name()),
            Parts::Cluster(cluster) => (cluster.urls(), ""),
            Parts::Redlock(masters) => (masters.iter().map(RedisServer::url).collect(), ""),
            Parts::Etcd(_, proxies) => (
                proxies[w]
                    .iter()
                    .map(|p| format!("http://127.0.0.1:{}", p.port()))
                    .collect(),
                "",
            ),
            Parts::Zookeeper(_, proxies) => (
                proxies[w]
                    .iter()
                    .map(|p| format!("127.0.0.1:{}", p.port()))
                    .collect(),
                "",
            ),
            Parts::Postgres(_, proxies) => (
                vec![format!(
                    "postgres://postgres@127.0.0.1:{}/postgres",
                    proxies[w].port()
                )],
                "",
            ),
            // The kit's server lets root in over TCP without a password, into `test`.
            Parts::Mysql(_, proxies) => (
                vec![format!("mysql://root@127.0.0.1:{}/test", proxies[w].port())],
                "",
            ),
        };
        worker::spec(self.kind.name(), &urls, master, self.replicas)
    }

    /// Cuts worker `w` off from the store (every connection it has or opens goes silent), or,
    /// with `on` false, lets its new connections through again.
    pub fn partition(&self, w: usize, on: bool) {
        let proxies: &[FaultProxy] = match &self.parts {
            Parts::Redis(_, proxies) | Parts::Postgres(_, proxies) | Parts::Mysql(_, proxies) => {
                std::slice::from_ref(&proxies[w])
            }
            Parts::Etcd(_, proxies) | Parts::Zookeeper(_, proxies) => &proxies[w],
            _ => &[],
        };
        for proxy in proxies {
            proxy.silence_new(on);
            if on {
                proxy.blackhole_existing();
            }
        }
    }

    /// Injects `fault`, a fault of the store, and returns once the store serves again; calls
    /// `struck` at the moment the store is disrupted (a node killed or stopped). A RedLock
    /// master restarted empty stays down `restart_delay` first.
    pub fn store_fault(
        &mut self,
        fault: Fault,
        restart_delay: Duration,
        struck: &mut dyn FnMut(),
    ) -> Fallible<()> {
        let round = self.round;
        self.round += 1;
        match (fault, &mut self.parts) {
            (Fault::Restart, Parts::Redis(server, _)) => {
                struck();
                server.restart();
            }
            (Fault::Restart, Parts::Postgres(server, _)) => {
                struck();
                server.restart();
            }
            // A normal shutdown and a start on the same data and port: the lease rows are
            // committed, so the locks are there again, and the holders' watchdogs renew them.
            (Fault::Restart, Parts::Mysql(server, _)) => {
                struck();
                server.restart();
            }
            (Fault::Failover, Parts::Sentinel(setup)) => {
                let old = setup.current_primary_port();
                let replicas = setup.replica_indices();
                for &r in &replicas {
                    setup.nodes()[r].pause();
                }
                std::thread::sleep(REPLICA_LAG);
                struck();
                setup.primary_mut().kill();
                for &r in &replicas {
                    setup.nodes()[r].resume();
                }
                setup.wait_for_new_primary(old);
                // The old primary comes back empty; Sentinel makes it a replica of the new one.
                if let Some(i) = setup.nodes().iter().position(|n| n.port() == old) {
                    setup.node_mut(i).restart();
                }
            }
            (Fault::Failover, Parts::Cluster(cluster)) => {
                let primaries = cluster.primaries();
                let primary = *primaries
                    .get(round % primaries.len().max(1))
                    .ok_or("the cluster has no primary")?;
                cluster.fail_over_lagging(primary, REPLICA_LAG, struck);
                // Back empty, it rejoins as a replica of the node that took over.
                cluster.node_mut(primary).restart();
            }
            (Fault::Failover, Parts::Etcd(cluster, _)) => {
                let leader = cluster.wait_for_leader();
                struck();
                cluster.kill(leader);
                cluster.wait_for_leader();
                cluster.restart(leader);
                cluster.wait_ready(&[0, 1, 2]);
            }
            (Fault::Failover, Parts::Zookeeper(ensemble, _)) => {
                let leader = ensemble.wait_for_leader();
                struck();
                ensemble.kill(leader);
                ensemble.wait_for_leader();
                ensemble.restart(leader);
                ensemble.wait_ready(&[0, 1, 2]);
            }
            (Fault::RestartEmpty, Parts::Redlock(masters)) => {
                let n = masters.len();
                let master = &mut masters[round % n];
                struck();
                if restart_delay.is_zero() {
                    master.restart();
                } else {
                    master.kill();
                    std::thread::sleep(restart_delay);
                    master.restart();
                }
            }
            (fault, _) => {
                return Err(format!(
                    "--fault {} does not apply to --store {}",
                    fault.name(),
                    self.kind.name()
                )
                .into())
            }
        }
        Ok(())
    }
}
