//! The ZooKeeper store against Apache Curator itself (its `InterProcessMutex` and
//! `InterProcessReadWriteLock` in a Java process of the kit's) and under faults: a holder cut off
//! by fault proxies, a release during a connection loss (CURATOR-678), a waiter whose session
//! expires (CURATOR-604), a killed holder process, the leader killed and a minority down, an
//! ensemble that does not answer. Tests that kill servers start an ensemble of their own; the
//! others share the binary's and keep to parent paths of their own. The behaviour suite runs on
//! ZooKeeper too (`behaviour.rs`, `coordination.rs`, `read_write.rs`, `admin.rs`: the
//! `zookeeper::` tests).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockMode};
use lock_tests::{eventually, ttl, Curator, CuratorLock, FaultProxy, Logs, ZkEnsemble, SECOND};
use tokio::time::Instant;

fn builder(hosts: &[String], parent: &str) -> lock_runtime::LockClientBuilder {
    LockClient::builder()
        .zookeeper(hosts)
        .prefix(parent)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(1))
}

async fn client(hosts: &[String], parent: &str) -> LockClient {
    builder(hosts, parent)
        .build()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {hosts:?}: {e}"))
}

/// Runs a blocking step of the kit (a Java process, the ensemble) off the runtime's workers.
async fn blocking<T: Send + 'static>(step: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(step)
        .await
        .expect("the kit's step panicked")
}

/// A plain ZooKeeper client of the shared ensemble, to look at the nodes.
async fn raw(hosts: &[String]) -> zookeeper_client::Client {
    zookeeper_client::Client::connect(&hosts.join(","))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {hosts:?}: {e}"))
}

/// The children of `path` (none when it does not exist).
async fn children(zk: &zookeeper_client::Client, path: &str) -> Vec<String> {
    match zk.list_children(path).await {
        Ok(mut children) => {
            children.sort();
            children
        }
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(e) => panic!("children of {path}: {e}"),
    }
}

/// Whether `name` is a node of Curator's mutex: `_c_<uuid>-lock-<10 digits>`.
fn is_curator_mutex_node(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("_c_") else {
        return false;
    };
    let Some((uuid, seq)) = rest.split_once("-lock-") else {
        return false;
    };
    uuid.len() == 36 && seq.len() == 10 && seq.bytes().all(|b| b.is_ascii_digit())
}

/// Curator's mutex and ours, on the same path, exclude each other both ways; our node is named as
/// Curator names its own, and our fencing token is its `czxid`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curators_mutex_and_ours_exclude_each_other_on_one_path() {
    let ensemble = ZkEnsemble::shared();
    let hosts = ensemble.hosts();
    let c = client(&hosts, "/interop-mutex").await;
    let zk = raw(&hosts).await;
    let joined = hosts.join(",");
    let mut curator = blocking(move || Curator::start(&joined)).await;

    // Curator first: ours is refused, and waits.
    let (mut curator, got) = blocking(move || {
        let got = curator.acquire("/interop-mutex/order:42", CuratorLock::Mutex, Duration::ZERO);
        (curator, got)
    })
    .await;
    assert!(got);
    let refused = c.acquire("order:42", &ttl(10_000)).await;
    assert!(matches!(refused, Err(LockError::Busy { .. })), "{refused:?}");
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            c.acquire("order:42", &ttl(10_000).fencing(true).wait(20 * SECOND))
                .await
        })
    };
    eventually(
        5 * SECOND,
        "our waiter queues behind Curator's holder",
        || async { children(&zk, "/interop-mutex/order:42").await.len() == 2 },
    )
    .await;
    assert!(!waiter.is_finished(), "ours took the lock Curator holds");
    let mut curator = blocking(move || {
        curator.release("/interop-mutex/order:42", CuratorLock::Mutex);
        curator
    })
    .await;
    let ours = waiter.await.unwrap().unwrap();

    // Ours holds: its node is what Curator writes, and its token the node's creation zxid.
    let nodes = children(&zk, "/interop-mutex/order:42").await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert!(is_curator_mutex_node(&nodes[0]), "{nodes:?}");
    let path = format!("/interop-mutex/order:42/{}", nodes[0]);
    let stat = zk.check_stat(&path).await.unwrap().unwrap();
    assert_eq!(ours.fencing_token(), Some(u64::try_from(stat.czxid).unwrap()));
    let (data, _) = zk.get_data(&path).await.unwrap();
    let data = String::from_utf8(data).unwrap();
    assert!(data.ends_with(&format!(":{}", std::process::id())), "{data}");

    // Curator is refused while ours holds, and gets it once ours is released.
    let (mut curator, got) = blocking(move || {
        let got = curator.acquire(
            "/interop-mutex/order:42",
            CuratorLock::Mutex,
            Duration::from_millis(300),
        );
        (curator, got)
    })
    .await;
    assert!(!got, "Curator took the lock ours holds");
    curator.acquire_later(
        "/interop-mutex/order:42",
        CuratorLock::Mutex,
        Duration::from_secs(10),
    );
    assert!(ours.release().await.unwrap());
    let (mut curator, got) = blocking(move || {
        let got = curator.acquired();
        (curator, got)
    })
    .await;
    assert!(got, "Curator never got the lock ours released");
    blocking(move || curator.release("/interop-mutex/order:42", CuratorLock::Mutex)).await;
}

/// Our read lock is a `__READ__` node of Curator's read-write lock: it shares with Curator's
/// readers, waits for Curator's writer and holds Curator's writer off. Our exclusive lock waits
/// for Curator's writer too; Curator's reader looks only for `__WRIT__` nodes, so it does not
/// wait for our exclusive lock (a `-lock-` node): the guide says so, and this keeps it true.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_read_lock_meets_curators_read_write_lock() {
    let ensemble = ZkEnsemble::shared();
    let hosts = ensemble.hosts();
    let c = client(&hosts, "/interop-rw").await;
    let path = "/interop-rw/ledger";
    let joined = hosts.join(",");
    let curator = blocking(move || Curator::start(&joined)).await;
    let read = ttl(10_000).mode(LockMode::Shared);

    // Curator's reader and ours share; Curator's writer waits for both.
    let (mut curator, got) = blocking(move || {
        let mut curator = curator;
        let got = curator.acquire(path, CuratorLock::Read, Duration::ZERO);
        (curator, got)
    })
    .await;
    assert!(got);
    let ours = c.acquire("ledger", &read).await.unwrap();
    let (mut curator, writer) = blocking(move || {
        let got = curator.acquire(path, CuratorLock::Write, Duration::from_millis(300));
        (curator, got)
    })
    .await;
    assert!(!writer, "Curator's writer got in beside two readers");
    assert!(ours.release().await.unwrap());
    curator = blocking(move || {
        curator.release(path, CuratorLock::Read);
        curator
    })
    .await;

    // Curator's writer holds: ours is refused, reader or not.
    let (mut curator, got) = blocking(move || {
        let got = curator.acquire(path, CuratorLock::Write, Duration::ZERO);
        (curator, got)
    })
    .await;
    assert!(got);
    for options in [read.clone(), ttl(10_000)] {
        let refused = c.acquire("ledger", &options).await;
        assert!(matches!(refused, Err(LockError::Busy { .. })), "{refused:?}");
    }
    curator = blocking(move || {
        curator.release(path, CuratorLock::Write);
        curator
    })
    .await;

    // Ours exclusive: Curator's reader does not wait for it (it looks only for `__WRIT__`).
    let ours = c.acquire("ledger", &ttl(10_000)).await.unwrap();
    let (mut curator, reader) = blocking(move || {
        let got = curator.acquire(path, CuratorLock::Read, Duration::ZERO);
        (curator, got)
    })
    .await;
    assert!(
        reader,
        "Curator's reader waited for a -lock- node: the guide says it does not"
    );
    blocking(move || curator.release(path, CuratorLock::Read)).await;
    assert!(ours.release().await.unwrap());
}

/// A key that is a node name is used as written (where Curator on `/parent/order:42` meets it);
/// any other key is escaped, and keys that differ never meet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_node_names_or_escaped_and_never_meet() {
    let hosts = ZkEnsemble::shared().hosts();
    let c = client(&hosts, "/keys").await;
    let zk = raw(&hosts).await;
    let keys = [
        "order:42",
        "order 42",
        "a/b",
        "..",
        "ordér",
        "Order:42",
        "%order%2042",
    ];
    let mut held = Vec::new();
    for key in keys {
        held.push(
            c.acquire(key, &ttl(10_000))
                .await
                .unwrap_or_else(|e| panic!("{key}: {e}")),
        );
    }
    let nodes = children(&zk, "/keys").await;
    for node in [
        "order:42",
        "%order%2042",
        "%a%2Fb",
        "%..",
        "%ord%C3%A9r",
        "Order:42",
        "%%25order%252042",
    ] {
        assert!(nodes.iter().any(|n| n == node), "no node {node} in {nodes:?}");
    }
    for key in keys {
        assert!(c.is_locked(key).await.unwrap(), "{key}");
    }
    for guard in held {
        assert!(guard.release().await.unwrap());
    }
    for key in keys {
        assert!(!c.is_locked(key).await.unwrap(), "{key}");
    }
}

/// Clients through fault proxies, one per server of the shared ensemble (cut off together).
struct CutOff {
    proxies: Vec<FaultProxy>,
    client: LockClient,
}

impl CutOff {
    /// A client of the shared ensemble.
    async fn new(parent: &str) -> CutOff {
        CutOff::on(ZkEnsemble::shared(), parent).await
    }

    /// A client of `ensemble`.
    async fn on(ensemble: &ZkEnsemble, parent: &str) -> CutOff {
        let proxies: Vec<FaultProxy> = (0..3)
            .map(|i| FaultProxy::start(ensemble.client_port(i)))
            .collect();
        let through: Vec<String> = proxies
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port()))
            .collect();
        let client = builder(&through, parent)
            .response_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap();
        CutOff { proxies, client }
    }

    fn each(&self, what: impl Fn(&FaultProxy)) {
        self.proxies.iter().for_each(what);
    }
}

/// A holder cut off from every server (its connections silent) cannot renew: it counts its lock
/// lost no later than another client gets it (when the servers expire its session), with and
/// without the watchdog; its late release returns without hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holder_is_lost_before_anyone_else_holds() {
    let hosts = ZkEnsemble::shared().hosts();
    let other = client(&hosts, "/cut").await;
    for (key, options) in [("plain", ttl(1500)), ("renewed", ttl(1500).watchdog(true))] {
        let cut = CutOff::new("/cut").await;
        let held = cut.client.acquire(key, &options).await.unwrap();
        cut.each(FaultProxy::blackhole);
        let started = Instant::now();
        let next = other
            .acquire(key, &ttl(5000).wait(20 * SECOND))
            .await
            .unwrap_or_else(|e| panic!("{key}: never freed: {e}"));
        assert!(
            held.is_lost(),
            "{key}: another client got in {:?} after the cut while the holder counted its lock valid",
            started.elapsed()
        );
        assert!(next.release().await.unwrap());
        let late = tokio::time::timeout(5 * SECOND, held.release())
            .await
            .expect("a release cut off from ZooKeeper hangs");
        assert!(matches!(late, Err(_) | Ok(false)), "{key}: {late:?}");
    }
}

/// A release while the connection is lost (CURATOR-678: Curator leaves the node, and every
/// later acquire of that process fails): the release answers `Unavailable`, and once the
/// connection is back the node is deleted, long before its ttl; the same client locks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_during_a_connection_loss_is_carried_out_once_it_is_back() {
    let hosts = ZkEnsemble::shared().hosts();
    let other = client(&hosts, "/lost-release").await;
    // A session that outlives the cut (30 s), and a lock that would outlive the test.
    let cut = CutOff::new("/lost-release").await;
    let held = cut.client.acquire("job", &ttl(30_000)).await.unwrap();
    cut.each(FaultProxy::blackhole);
    let released = held.release().await;
    assert!(
        matches!(released, Err(LockError::Unavailable { .. })),
        "{released:?}"
    );
    assert!(other.is_locked("job").await.unwrap(), "nothing deleted it yet");
    // Relaying first: a connection opened after the reset must not lose its handshake.
    cut.each(FaultProxy::relay);
    cut.each(FaultProxy::reset_all);
    let healed = Instant::now();
    eventually(
        10 * SECOND,
        "the lock is freed once the connection is back",
        || async { !other.is_locked("job").await.unwrap() },
    )
    .await;
    assert!(healed.elapsed() < 10 * SECOND);
    let again = cut.client.acquire("job", &ttl(5000)).await.unwrap();
    assert!(again.release().await.unwrap());
}

/// A waiter whose session expires while it waits (its node deleted by the servers) never takes
/// the lock on the strength of its old node (CURATOR-604): it queues again on a new session, or
/// fails; it gets the lock only after the holder gives it back, with a larger fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_session_expired_never_trusts_its_old_node() {
    let hosts = ZkEnsemble::shared().hosts();
    let holder_client = client(&hosts, "/expired-waiter").await;
    let holder = holder_client
        .acquire("turn", &ttl(30_000).fencing(true))
        .await
        .unwrap();
    let cut = CutOff::new("/expired-waiter").await;
    let waiting_client = cut.client.clone();
    // A 1 s session: it expires during the 3 s cut.
    let waiter = tokio::spawn(async move {
        let result = waiting_client
            .acquire("turn", &ttl(1000).fencing(true).wait(30 * SECOND))
            .await;
        (result, Instant::now())
    });
    let zk = raw(&hosts).await;
    eventually(5 * SECOND, "the waiter queues", || async {
        children(&zk, "/expired-waiter/turn").await.len() == 2
    })
    .await;
    cut.each(FaultProxy::blackhole);
    eventually(10 * SECOND, "the servers expire the waiter's session", || async {
        children(&zk, "/expired-waiter/turn").await.len() == 1
    })
    .await;
    // Relaying first: a connection opened after the reset must not lose its handshake.
    cut.each(FaultProxy::relay);
    cut.each(FaultProxy::reset_all);
    // Back: it queues again on a new session (two nodes again), or its wait failed.
    eventually(10 * SECOND, "the waiter queues again or gives up", || async {
        waiter.is_finished() || children(&zk, "/expired-waiter/turn").await.len() == 2
    })
    .await;
    let before = holder.fencing_token().unwrap();
    let released_at = Instant::now();
    assert!(holder.release().await.unwrap());
    let (result, at) = waiter.await.unwrap();
    match result {
        Ok(guard) => {
            assert!(at >= released_at, "the waiter held the lock while its holder did");
            assert!(guard.fencing_token().unwrap() > before);
            assert!(guard.release().await.unwrap());
        }
        Err(LockError::Unavailable { .. }) => {}
        Err(e) => panic!("{e}"),
    }
}

/// A holder process killed (SIGKILL: no release, no session close) holds its lock until the
/// servers expire its session (its 2 s ttl and the 2 s margin: 4 s), no longer: a waiter of
/// another client gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_process_loses_its_lock_when_its_session_expires() {
    let ensemble = ZkEnsemble::shared();
    let url = ensemble.url();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lock-holder"))
        .args([url.as_str(), "/killed", "account:7", "2000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let stale: u64 = blocking(move || {
        let first = lines.next().unwrap().unwrap();
        first
            .strip_prefix("held ")
            .unwrap_or_else(|| panic!("lock-holder said {first:?}"))
            .parse()
            .unwrap()
    })
    .await;
    let other = client(&ensemble.hosts(), "/killed").await;
    let refused = other.acquire("account:7", &ttl(5000)).await;
    assert!(matches!(refused, Err(LockError::Busy { .. })), "{refused:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    let next = other
        .acquire("account:7", &ttl(5000).fencing(true).wait(20 * SECOND))
        .await
        .unwrap();
    let took = killed.elapsed();
    assert!(
        took > Duration::from_millis(2000) && took < 7 * SECOND,
        "freed {took:?} after the kill: its session's timeout is 4 s"
    );
    assert!(next.fencing_token().unwrap() > stale);
    assert!(next.release().await.unwrap());
}

/// The leader killed while a lock is held: the holder keeps it (its renewals reach the new
/// leader), others are refused meanwhile, and the next fencing token is larger. Then one server
/// down of three (a minority): locks are taken and given back as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_and_a_minority_down_holders_keep_their_locks() {
    let mut ensemble = blocking(ZkEnsemble::spawn).await;
    let hosts = ensemble.hosts();
    let c = client(&hosts, "/failover").await;
    let other = client(&hosts, "/failover").await;
    let held = c
        .acquire("ledger", &ttl(3000).watchdog(true).fencing(true))
        .await
        .unwrap();
    let before = held.fencing_token().unwrap();
    let (leader, mut ensemble) = blocking(move || {
        let leader = ensemble.wait_for_leader();
        ensemble.kill(leader);
        ensemble.wait_for_leader();
        (leader, ensemble)
    })
    .await;
    // Past a whole ttl after the election: still held, by the same holder.
    let until = Instant::now() + Duration::from_millis(4000);
    while Instant::now() < until {
        assert!(!held.is_lost(), "lost across the leader's kill");
        match other.acquire("ledger", &ttl(3000)).await {
            Err(LockError::Busy { .. } | LockError::Unavailable { .. }) => {}
            got => panic!("another client got in: {got:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(held.release().await.unwrap());
    let next = other.acquire("ledger", &ttl(3000).fencing(true)).await.unwrap();
    assert!(next.fencing_token().unwrap() > before);
    assert!(next.release().await.unwrap());

    // The old leader back; then a follower down: a minority.
    let ensemble = blocking(move || {
        ensemble.restart(leader);
        ensemble.wait_ready(&[0, 1, 2]);
        let leader = ensemble.wait_for_leader();
        let follower = (0..3).find(|&i| i != leader).unwrap_or(0);
        ensemble.kill(follower);
        ensemble
    })
    .await;
    // A request on the killed server's connection fails (`Unavailable`, the connection reset)
    // until the client's session has moved to another server: asked again, within a deadline.
    let deadline = Instant::now() + 20 * SECOND;
    for round in 0..5 {
        let guard = loop {
            match c.acquire("ledger", &ttl(3000).wait(10 * SECOND)).await {
                Ok(guard) => break guard,
                Err(LockError::Unavailable { .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("round {round} with a minority down: {e}"),
            }
        };
        assert!(guard.release().await.unwrap());
    }
    drop(ensemble);
}

/// Misconfigured clients are told what is wrong before any request; an ensemble where nothing
/// listens is `Unavailable` within the connect timeout, naming its servers; `zk://` URLs
/// connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misconfigured_clients_are_refused_and_zk_urls_connect() {
    let ensemble = ZkEnsemble::shared();
    let wrong = [
        LockClient::builder().zookeeper(["zk://127.0.0.1:2181"]),
        LockClient::builder().zookeeper(Vec::<String>::new()),
        LockClient::builder()
            .zookeeper(ensemble.hosts())
            .prefix("billing:"),
    ];
    for builder in wrong {
        let refused = builder.build().await;
        assert!(
            matches!(refused, Err(LockError::InvalidOptions { .. })),
            "{refused:?}"
        );
    }
    let nowhere = [
        format!("127.0.0.1:{}", lock_tests::free_port()),
        format!("127.0.0.1:{}", lock_tests::free_port()),
    ];
    let started = Instant::now();
    let down = LockClient::builder()
        .zookeeper(&nowhere)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await;
    let Err(LockError::Unavailable { source }) = down else {
        panic!("{down:?}");
    };
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let said = source.to_string();
    assert!(said.contains(&nowhere[0]), "{said}");

    // A prefix whose ACL lets anyone read but not create: `Refused` at `build()`, saying what
    // locking needs.
    let zk = raw(&ensemble.hosts()).await;
    let read_only = [zookeeper_client::Acl::new(
        zookeeper_client::Permission::READ,
        zookeeper_client::AuthId::anyone(),
    )];
    let mode =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::from(&read_only[..]));
    match zk.create("/read-only", b"", &mode).await {
        Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
        Err(e) => panic!("{e}"),
    }
    let refused = builder(&ensemble.hosts(), "/read-only").build().await;
    let Err(LockError::Refused { reason, .. }) = refused else {
        panic!("{refused:?}");
    };
    assert!(reason.contains("CREATE"), "{reason}");

    let c = LockClient::connect(&ensemble.url()).await.unwrap();
    let guard = c.acquire("via-url", &ttl(5000)).await.unwrap();
    let holder = c.holder("via-url").await.unwrap().unwrap();
    assert!(holder.owner().is_some());
    assert!(guard.release().await.unwrap());
}

/// Servers that grant sessions shorter than the ttl (here at most 2 s, for a 10 s ttl): the
/// holder's validity follows the session's timeout, not the ttl, so a holder cut off counts its
/// lock lost before the servers expire its session and another client gets in; under the
/// watchdog (renewing a third of the way through the session's timeout) it holds the lock for
/// longer than that timeout without losing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_shorter_than_the_ttl_bound_the_holders_validity() {
    let ensemble = blocking(|| ZkEnsemble::spawn_with_max_session(Duration::from_secs(2))).await;
    let hosts = ensemble.hosts();
    let other = client(&hosts, "/short").await;

    let c = client(&hosts, "/short").await;
    let kept = c.acquire("kept", &ttl(10_000).watchdog(true)).await.unwrap();
    let until = Instant::now() + Duration::from_millis(4500);
    while Instant::now() < until {
        assert!(!kept.is_lost(), "a renewed lock was lost on a 2 s session");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(kept.release().await.unwrap());

    let cut = CutOff::on(&ensemble, "/short").await;
    let held = cut.client.acquire("cut", &ttl(10_000)).await.unwrap();
    cut.each(FaultProxy::blackhole);
    let started = Instant::now();
    let next = other.acquire("cut", &ttl(5000).wait(20 * SECOND)).await.unwrap();
    assert!(
        held.is_lost(),
        "another client got in {:?} after the cut while the holder counted its 10 s lock valid",
        started.elapsed()
    );
    assert!(
        started.elapsed() < 8 * SECOND,
        "its 2 s session outlived {:?}",
        started.elapsed()
    );
    assert!(next.release().await.unwrap());
    drop(cut);
}

/// Servers that grant a session shorter than the ttl (10 s for a 30 s lock): without the
/// watchdog, a body longer than the grant is stopped (`Lost`) before the servers could expire
/// the session (it was renewed once past the grant: stopped at about 11.5 s), and the short
/// grant is said once per ttl class, with both numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_without_the_watchdog_ends_within_a_shorter_session() {
    let ensemble = blocking(|| ZkEnsemble::spawn_with_max_session(10 * SECOND)).await;
    let c = client(&ensemble.hosts(), "/granted").await;
    // The acquire runs on this thread, under the capturing subscriber.
    let (logs, capturing) = Logs::capture(tracing::Level::WARN);
    let started = Instant::now();
    let body = c.run("long", &ttl(30_000), tokio::time::sleep(20 * SECOND)).await;
    let stopped = started.elapsed();
    assert!(matches!(body, Err(LockError::Lost { .. })), "{body:?}");
    assert!(
        stopped < 10 * SECOND,
        "stopped {stopped:?} after the acquire was sent, on a 10 s session"
    );
    let again = c.run("long", &ttl(30_000), async {}).await;
    assert!(again.is_ok(), "{again:?}");
    drop(capturing);
    let warned = logs.text();
    let said = "ZooKeeper granted a session of 10s to locks of a ttl up to 30s";
    assert_eq!(warned.matches(said).count(), 1, "{warned}");
}

/// Acquires made while the client is disconnected (their creates queued by the client, sent
/// once it reconnects, after the acquires gave up): each leaves no node behind, since its
/// clean-up follows the create on the same session; once the holder lets go, the keys are free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_sent_after_their_acquires_gave_up_leave_no_node() {
    let hosts = ZkEnsemble::shared().hosts();
    let holder = client(&hosts, "/late-create").await;
    let zk = raw(&hosts).await;
    let keys = ["k0", "k1", "k2", "k3"];
    let mut held = Vec::new();
    for key in keys {
        held.push(holder.acquire(key, &ttl(30_000)).await.unwrap());
    }
    let cut = CutOff::new("/late-create").await;
    // Its session (a 30 s ttl) outlives the cut.
    let warm = cut.client.acquire("warm", &ttl(30_000)).await.unwrap();
    assert!(warm.release().await.unwrap());
    cut.each(FaultProxy::blackhole);
    let accepted = || cut.proxies.iter().map(FaultProxy::accepted).sum::<usize>();
    let before = accepted();
    cut.each(FaultProxy::reset_all);
    // Its connection reset, the client reconnects into the blackhole: what it is asked now it
    // queues until a connection gets through.
    eventually(5 * SECOND, "the client reconnects into the blackhole", || async {
        accepted() > before
    })
    .await;
    for key in keys {
        let gave_up = cut.client.acquire(key, &ttl(30_000).wait(5 * SECOND)).await;
        assert!(
            matches!(gave_up, Err(LockError::Unavailable { .. })),
            "{key}: {gave_up:?}"
        );
    }
    // Disconnected a while longer (a fault's length, not a wait for anything): the clean-ups
    // keep trying until their session answers.
    tokio::time::sleep(3 * SECOND).await;
    // Relayed again: the client's connection attempt in the blackhole times out, the next one
    // gets through, and the requests it queued meanwhile (the creates first) are sent.
    cut.each(FaultProxy::relay);
    // Through again: an acquire on the same session is answered after the queued creates landed
    // (a session's requests are answered in order), while the holders still hold.
    eventually(15 * SECOND, "the client's session answers again", || async {
        match cut.client.acquire("through", &ttl(30_000)).await {
            Ok(through) => through.release().await.unwrap(),
            Err(LockError::Unavailable { .. }) => false,
            Err(e) => panic!("{e}"),
        }
    })
    .await;
    for guard in held {
        assert!(guard.release().await.unwrap());
    }
    // Free once the clean-up that follows each late create has run: no node holds a key for
    // nobody (before, it stayed as long as the client's session).
    for key in keys {
        eventually(
            15 * SECOND,
            "the key is free for the client that gave up",
            || async {
                match cut.client.acquire(key, &ttl(5000)).await {
                    Ok(next) => next.release().await.unwrap(),
                    Err(LockError::Busy { .. }) => false,
                    Err(e) => panic!("{key}: {e}"),
                }
            },
        )
        .await;
        // Read through another session (another server, perhaps a step behind): no node left.
        let path = format!("/late-create/{key}");
        eventually(5 * SECOND, "no node is left", || async {
            children(&zk, &path).await.is_empty()
        })
        .await;
    }
}

/// Two ttl classes on one client are two sessions; with one session's server silent, its locks'
/// renewals fail, and the other session's locks, renewed in the same batches, are not lost:
/// a renewal fails per session, not for the whole batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sessions_trouble_loses_no_lock_of_another_session() {
    // The two sessions on two different servers (each picks one at random): tried again until
    // they are.
    let mut tries = 0;
    let (cut, healthy, troubled, troubled_at) = loop {
        tries += 1;
        assert!(tries <= 20, "the two sessions never landed on two servers");
        let cut = CutOff::new("/two-sessions").await;
        let accepted = |cut: &CutOff| cut.proxies.iter().map(FaultProxy::accepted).collect::<Vec<_>>();
        let before = accepted(&cut);
        // 3 s and 3.001 s: classes 3 and 4, renewed every second, so in the same batches.
        let healthy = cut
            .client
            .acquire(&format!("healthy{tries}"), &ttl(3000).watchdog(true))
            .await
            .unwrap();
        let first = accepted(&cut);
        let troubled = cut
            .client
            .acquire(&format!("troubled{tries}"), &ttl(3001).watchdog(true))
            .await
            .unwrap();
        let second = accepted(&cut);
        let newly = |from: &[usize], to: &[usize]| (0..3).filter(|&i| to[i] > from[i]).collect::<Vec<_>>();
        let (a, b) = (newly(&before, &first), newly(&first, &second));
        match (a.as_slice(), b.as_slice()) {
            ([a], [b]) if a != b => break (cut, healthy, troubled, *b),
            _ => {
                drop((healthy, troubled));
            }
        }
    };
    // The troubled session's connection goes silent, and so does every new one (its
    // reconnects): the healthy session's connection goes on.
    cut.each(|p| p.silence_new(true));
    cut.proxies[troubled_at].blackhole_existing();
    // Three renewal cycles of the healthy lock while the other session cannot be reached.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        assert!(
            !healthy.is_lost(),
            "a lock on a healthy session was lost with the other session's renewals"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        troubled.is_lost(),
        "the unreachable session's lock outlived its validity"
    );
    assert!(healthy.release().await.unwrap());
    drop(troubled);
}

/// A session the servers ended (here the ensemble lost its state: restarted without its data,
/// so every session is unknown to it, and written to until it is past what the client saw, so
/// that the client may reconnect and be told) is told to every holder on it as soon as the
/// client hears of it: a lock without the watchdog, with most of its 30 s ttl left, and one
/// renewed every 10 s, are both lost within seconds, not at the end of the ttl or at the next
/// renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_are_told_at_once_when_their_session_ends() {
    let ensemble = blocking(ZkEnsemble::spawn).await;
    let hosts = ensemble.hosts();
    let c = client(&hosts, "/ended").await;
    let plain = c.acquire("plain", &ttl(30_000)).await.unwrap();
    let renewed = c.acquire("renewed", &ttl(30_000).watchdog(true)).await.unwrap();
    let seen = ensemble.last_zxid();
    let ensemble = blocking(move || {
        let mut ensemble = ensemble;
        ensemble.restart_empty();
        ensemble
    })
    .await;
    let zk = raw(&hosts).await;
    let mut n = 0;
    while ensemble.last_zxid() <= seen {
        n += 1;
        zk.create(
            &format!("/pad{n}"),
            b"",
            &zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .unwrap_or_else(|e| panic!("padding the new state: {e}"));
    }
    let past = Instant::now();
    for (key, guard) in [("plain", &plain), ("renewed", &renewed)] {
        tokio::time::timeout(6 * SECOND, guard.lost())
            .await
            .unwrap_or_else(|_| panic!("{key}: not told within 6 s of the servers taking the client back"));
    }
    println!(
        "both told {:?} after the servers could take the client back",
        past.elapsed()
    );
    // The client takes the keys again on a new session.
    let again = c.acquire("plain", &ttl(30_000)).await.unwrap();
    assert!(again.release().await.unwrap());
    drop(ensemble);
}

/// A client's runtime that a test can block, as a stopped process or a long pause would block
/// it: a thread of its own driving a current-thread runtime.
struct Stallable {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Stallable {
    fn start() -> Stallable {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            handle_tx
                .send(runtime.handle().clone())
                .expect("the test waits for it");
            runtime.block_on(async {
                let _ = stopped.await;
            });
        });
        let handle = handle_rx.recv().expect("the runtime's thread started");
        Stallable {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Blocks the runtime for `freeze`, from the moment answered.
    async fn stall(&self, freeze: Duration) -> Instant {
        let (began, at) = tokio::sync::oneshot::channel();
        self.handle.spawn(async move {
            let _ = began.send(Instant::now());
            std::thread::sleep(freeze);
        });
        at.await.expect("the stall began")
    }
}

impl Drop for Stallable {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A waiter connected to a follower only has its runtime blocked for about its session's
/// timeout while the holder lets go, with another waiter queued behind it. The leader hears of
/// the thawed waiter's session from the follower only at its next ping, and may expire it just
/// after the follower told the waiter that it is first: the thawed waiter must not count the
/// lock held past its node, and the next waiter never holds while it does. Swept over freezes
/// from the session's timeout less 300 ms to 150 ms more (the leader expires sessions on its
/// tick, after their timeout): 7 of them here; `ZK_STALL_SWEEP=<runs>` sweeps every 10 ms, that
/// many times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_thawed_as_its_session_expires_never_holds_beside_the_next() {
    let ensemble = blocking(ZkEnsemble::spawn).await;
    let leader = ensemble.wait_for_leader();
    let follower = (0..3).find(|&i| i != leader).expect("three servers");
    let at_leader = vec![ensemble.host(leader)];
    let holder = client(&at_leader, "/stall").await;
    let next = client(&at_leader, "/stall").await;
    let zk = raw(&at_leader).await;
    let stallable = Stallable::start();
    let at_follower = vec![ensemble.host(follower)];
    let thawed = stallable
        .handle
        .spawn(async move { client(&at_follower, "/stall").await })
        .await
        .expect("the client connects");

    let sweeps: u32 = std::env::var("ZK_STALL_SWEEP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // How much longer than the session's timeout each freeze is (in ms).
    let offsets: Vec<i64> = match sweeps {
        0 => vec![-300, -150, -50, 0, 50, 100, 150],
        runs => (0..runs).flat_map(|_| (-30..=15).map(|s| s * 10)).collect(),
    };
    let (mut first_held, mut requeued) = (0, 0);
    for (run, offset) in offsets.into_iter().enumerate() {
        let key = format!("k{run}");
        let path = format!("/stall/{key}");
        let held = holder.acquire(&key, &ttl(30_000)).await.unwrap();
        let (c1, k1) = (thawed.clone(), key.clone());
        let first = stallable.handle.spawn(async move {
            let guard = c1.acquire(&k1, &ttl(1000).wait(60 * SECOND)).await.ok()?;
            let got = Instant::now();
            // Until its validity ends (no watchdog) or its session's end is told.
            guard.lost().await;
            let lost = Instant::now();
            drop(guard);
            Some((got, lost))
        });
        eventually(10 * SECOND, "the thawed waiter queues", || async {
            children(&zk, &path).await.len() == 2
        })
        .await;
        let (c2, k2) = (next.clone(), key.clone());
        let second = tokio::spawn(async move {
            let guard = c2.acquire(&k2, &ttl(5000).wait(60 * SECOND)).await.unwrap();
            let got = Instant::now();
            assert!(guard.release().await.unwrap());
            (got, Instant::now())
        });
        eventually(10 * SECOND, "the next waiter queues", || async {
            children(&zk, &path).await.len() == 3
        })
        .await;
        // The shortest session on the follower is the waiter's (a 1 s ttl).
        let timeout = ensemble
            .session_timeouts(follower)
            .into_iter()
            .min()
            .expect("the waiter's session");
        let freeze = match u64::try_from(offset) {
            Ok(longer) => timeout + Duration::from_millis(longer),
            Err(_) => timeout.saturating_sub(Duration::from_millis(offset.unsigned_abs())),
        };
        stallable.stall(freeze).await;
        assert!(held.release().await.unwrap());
        let first = first.await.expect("the thawed waiter's task");
        let (got2, released2) = second.await.expect("the next waiter's task");
        match first {
            Some((got1, lost1)) => {
                if got1 < got2 {
                    first_held += 1;
                } else {
                    requeued += 1;
                }
                assert!(
                    !(got1 < released2 && got2 < lost1),
                    "freeze {freeze:?} (session {timeout:?}): the next waiter held from {:?} to {:?} \
                     while the thawed one counted the lock held from {:?} to {:?} (from its thaw)",
                    got2.saturating_duration_since(got1.min(got2)),
                    released2.saturating_duration_since(got1.min(got2)),
                    got1.saturating_duration_since(got1.min(got2)),
                    lost1.saturating_duration_since(got1.min(got2)),
                );
            }
            None => requeued += 1,
        }
    }
    eprintln!(
        "stall sweep: the thawed waiter held first {first_held} times, after the next {requeued} times"
    );
}

/// A fenced writer whose session ends before its release (so its release leaves nothing on the
/// lock's node) left its token there as it took the lock: the readers after it never get the
/// token of the writer before it, lower than one it may have used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_after_a_writer_whose_session_ended_get_no_lower_token() {
    let hosts = ZkEnsemble::shared().hosts();
    let other = client(&hosts, "/reader-token").await;
    let writer = ttl(1000).fencing(true);
    let reader = ttl(5000).fencing(true).mode(LockMode::Shared);
    // The writer before it leaves its token as it lets go.
    let before = other.acquire("k", &writer).await.unwrap();
    let older = before.fencing_token().unwrap();
    assert!(before.release().await.unwrap());

    let cut = CutOff::new("/reader-token").await;
    let ended = cut.client.acquire("k", &writer).await.unwrap();
    let used = ended.fencing_token().unwrap();
    assert!(used > older);
    // Cut off until its session ends: its node goes with it, without a release.
    cut.each(FaultProxy::blackhole);
    let read = other
        .acquire("k", &reader.clone().wait(20 * SECOND))
        .await
        .unwrap();
    let token = read.fencing_token().unwrap();
    assert!(
        token >= used,
        "a reader got token {token}, below {used}, which the writer before it may have used"
    );
    assert!(read.release().await.unwrap());
    drop(cut);
}

/// A create whose answer is lost on a long-lived session (applied by the server, its answer
/// dropped, the connection then reset), the session going on through another server: the
/// attempt fails, and the node it made is found (behind a `sync`, through the new server) and
/// deleted, so no node of the attempt is left holding the key back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_was_lost_leaves_no_node_after_a_reconnect() {
    let hosts = ZkEnsemble::shared().hosts();
    let zk = raw(&hosts).await;
    let cut = CutOff::new("/lost-create").await;
    // The session of the 30 s class opens now, through the proxy whose count goes up; the
    // lock's node is made (a container, left for a while after it empties).
    let before: Vec<usize> = cut.proxies.iter().map(FaultProxy::accepted).collect();
    let warm = cut.client.acquire("k", &ttl(30_000)).await.unwrap();
    assert!(warm.release().await.unwrap());
    let through = (0..3)
        .find(|&i| cut.proxies[i].accepted() > before[i])
        .expect("the session's connection");
    // Applied, answer dropped: the attempt cannot tell whether its node exists; nothing gets
    // through after it.
    cut.each(FaultProxy::drop_answers);
    let attempt = tokio::spawn({
        let client = cut.client.clone();
        async move { client.acquire("k", &ttl(30_000)).await }
    });
    eventually(5 * SECOND, "the create is applied", || async {
        !children(&zk, "/lost-create/k").await.is_empty()
    })
    .await;
    cut.each(FaultProxy::blackhole);
    let lost = attempt.await.unwrap();
    assert!(lost.is_err(), "{lost:?}");
    assert_eq!(children(&zk, "/lost-create/k").await.len(), 1);
    // The session goes on through another server.
    cut.proxies[through].silence_new(true);
    cut.each(|p| {
        p.relay();
        p.reset_all();
    });
    eventually(10 * SECOND, "the lost create's node is deleted", || async {
        children(&zk, "/lost-create/k").await.is_empty()
    })
    .await;
    let other = client(&hosts, "/lost-create").await;
    let next = other.acquire("k", &ttl(5000)).await.unwrap();
    assert!(next.release().await.unwrap());
    drop(cut);
}

/// Curator 5.5's downgrade of a write lock (CURATOR-621), laid out by hand (the kit's Curator
/// is Debian's 5.4): the writer's node, and beside it a plain ephemeral read node named with
/// the writer's sequence. While the write node stands, neither a writer nor a reader of ours
/// gets in; once it goes, the downgraded read lock holds on: our readers hold beside it, our
/// writer waits for it, and holds once it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curators_downgraded_read_lock_holds_where_its_writer_stood() {
    use zookeeper_client::{Acls, CreateMode};
    let hosts = ZkEnsemble::shared().hosts();
    let c = client(&hosts, "/downgrade").await;
    let zk = raw(&hosts).await;
    let open = |mode: CreateMode| mode.with_acls(Acls::anyone_all());
    zk.mkdir("/downgrade/k", &open(CreateMode::Persistent))
        .await
        .unwrap();
    let uuid = "8d3f0c3e-2d6f-4c4e-9a43-0123456789ab";
    let (_, seq) = zk
        .create(
            &format!("/downgrade/k/_c_{uuid}-__WRIT__"),
            b"",
            &open(CreateMode::EphemeralSequential),
        )
        .await
        .unwrap();
    let write = format!("/downgrade/k/_c_{uuid}-__WRIT__{seq}");
    let read = format!("/downgrade/k/_c_{uuid}-__READ__{seq}");
    zk.create(&read, b"", &open(CreateMode::Ephemeral)).await.unwrap();
    let shared = ttl(5000).mode(LockMode::Shared);
    assert!(matches!(
        c.acquire("k", &ttl(5000)).await,
        Err(LockError::Busy { .. })
    ));
    assert!(matches!(
        c.acquire("k", &shared).await,
        Err(LockError::Busy { .. })
    ));
    // Downgraded: the write node goes; the read lock holds on.
    zk.delete(&write, None).await.unwrap();
    let reader = c.acquire("k", &shared).await.unwrap();
    assert!(reader.release().await.unwrap());
    assert!(matches!(
        c.acquire("k", &ttl(5000)).await,
        Err(LockError::Busy { .. })
    ));
    let writer = tokio::spawn({
        let c = c.clone();
        async move { c.acquire("k", &ttl(5000).wait(20 * SECOND)).await }
    });
    eventually(10 * SECOND, "our writer queues", || async {
        children(&zk, "/downgrade/k").await.len() == 2
    })
    .await;
    assert!(
        !writer.is_finished(),
        "our writer got in beside the downgraded reader"
    );
    zk.delete(&read, None).await.unwrap();
    let writer = writer.await.unwrap().unwrap();
    assert!(writer.release().await.unwrap());
}

/// Every wrong address says, server by server, what it found there, with the port tried: a
/// refused port, a host that does not resolve, a server that is not ZooKeeper, a listener that
/// never answers. The first case is the line docs/troubleshooting.md shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_unreachable_server_is_named_with_its_cause() {
    let port = lock_tests::free_port();
    let refused = builder(&[format!("127.0.0.1:{port}")], "/unreachable")
        .build()
        .await;
    let Err(LockError::Unavailable { source }) = &refused else {
        panic!("{refused:?}")
    };
    lock_tests::as_troubleshooting_says(&format!("lock backend unavailable: {source}"), port, 2182);

    let greeter = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let greets = greeter.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = greeter.accept().await {
            let _ = tokio::io::AsyncWriteExt::write_all(&mut s, b"\x4a\x00\x00\x00\x0a5.5.5-10.11.6-MariaDB")
                .await;
        }
    });
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let quiet = silent.local_addr().unwrap().to_string();
    let hosts = ["no-such-host.invalid".to_owned(), greets.clone(), quiet.clone()];
    let started = Instant::now();
    let failed = builder(&hosts, "/unreachable").build().await;
    let Err(LockError::Unavailable { source }) = &failed else {
        panic!("{failed:?}")
    };
    let said = source.to_string();
    for (server, cause) in [
        ("no-such-host.invalid:2181", "cannot be resolved"),
        (greets.as_str(), "is not ZooKeeper: it speaks first"),
        (quiet.as_str(), "accepts connections but answered nothing"),
    ] {
        assert!(said.contains(&format!("{server} {cause}")), "{server}: {said}");
    }
    // The connect timeout (2 s) and the look at each server (at most 1.4 s, all at once).
    assert!(started.elapsed() < 4 * SECOND, "{:?}", started.elapsed());
    drop(silent);
}

/// A chroot that does not exist is a configuration error (`Refused`) naming it, not a store to
/// retry; docs/troubleshooting.md shows the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_chroot_is_refused_naming_it() {
    let hosts = ZkEnsemble::shared().hosts();
    let first = &hosts[0];
    let port: u16 = first.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap();
    let missing = builder(&[format!("{first}/no-such-chroot")], "/locks")
        .build()
        .await;
    let Err(LockError::Refused { reason, source }) = &missing else {
        panic!("{missing:?}")
    };
    assert!(reason.contains("chroot"), "{reason}");
    assert!(
        source.to_string().contains("/no-such-chroot does not exist"),
        "{source}"
    );
    let said = missing.err().map(|e| e.to_string()).unwrap_or_default();
    lock_tests::as_troubleshooting_says(&said, port, 2181);
}
