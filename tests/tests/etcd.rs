//! The etcd store under faults: the leader killed while a lock is held, a minority and a
//! majority of members down, a holder's process frozen past its lease (SIGSTOP), a holder
//! partitioned from every member (at each point its validity could outlive the server's keep:
//! after an acquire, an extend, a minimum hold, a maximum hold), an extend whose answer is
//! lost, extends racing renewals, raft writes counted from etcd's own metrics, etcd's auth, and
//! watches below the compacted revision. Tests that kill, freeze or reconfigure members start
//! a cluster of their own; the others share the binary's and keep to keys of their own. The
//! behaviour suite runs on etcd too (`behaviour.rs`, `coordination.rs`, `read_write.rs`: the
//! `etcd::` tests).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use lock_runtime::{LockClient, LockError, LockOptions};
use lock_tests::{eventually, ttl, waiting, EtcdCluster, FaultProxy, SECOND};

fn builder(endpoints: &[String]) -> lock_runtime::LockClientBuilder {
    LockClient::builder()
        .etcd(endpoints)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(1))
}

async fn client(endpoints: &[String]) -> LockClient {
    builder(endpoints)
        .build()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {endpoints:?}: {e}"))
}

/// Runs a blocking step of the kit (it waits for the cluster) off the runtime's workers.
async fn blocking<T: Send + 'static>(step: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(step)
        .await
        .expect("the kit's step panicked")
}

/// The leader is killed while a lock is held: the holder keeps it (its renewals go to the new
/// leader), others are refused meanwhile, and the fencing token after it is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_across_a_leader_kill_stays_its_holders() {
    let mut cluster = blocking(EtcdCluster::spawn).await;
    let endpoints = cluster.endpoints();
    let (c, other) = (client(&endpoints).await, client(&endpoints).await);
    let held = c
        .acquire("ledger", &ttl(4000).watchdog(true).fencing(true))
        .await
        .unwrap();
    let before = held.fencing_token().unwrap();
    let (cluster_back, leader) = blocking(move || {
        let leader = cluster.wait_for_leader();
        cluster.kill(leader);
        let next = cluster.wait_for_leader();
        assert_ne!(next, leader);
        (cluster, leader)
    })
    .await;
    cluster = cluster_back;
    // Renewed across the election (a second or two: the ttl outlasts it) and for more than a
    // ttl after it, on the new leader; nobody else gets in.
    let until = tokio::time::Instant::now() + Duration::from_secs(6);
    while tokio::time::Instant::now() < until {
        assert!(!held.is_lost(), "the holder lost its lock to a leader change");
        let refused = other.acquire("ledger", &ttl(1000)).await;
        assert!(matches!(refused, Err(LockError::Busy { .. })), "{refused:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(held.release().await.unwrap());
    let after = other.acquire("ledger", &ttl(1000).fencing(true)).await.unwrap();
    assert!(
        after.fencing_token().unwrap() > before,
        "the fencing token went back across the leader change"
    );
    assert!(after.release().await.unwrap());
    // The killed member comes back and the cluster serves with all three.
    blocking(move || {
        cluster.restart(leader);
        cluster.wait_ready(&[0, 1, 2]);
    })
    .await;
}

/// With one member of three down, locking goes on: acquire, wait, release, wake-up. With two
/// down there is no majority: every call fails with `Unavailable` within its timeouts, and none
/// hangs; once the members are back it works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_down_locks_and_a_majority_down_is_unavailable() {
    let mut cluster = blocking(EtcdCluster::spawn).await;
    let endpoints = cluster.endpoints();
    // The two left elect a leader first if the one killed led (a second or two, longer than
    // the response timeout: requests wait for the election).
    let mut cluster = blocking(move || {
        cluster.kill(2);
        cluster.wait_for_leader();
        cluster
    })
    .await;
    let (c, other) = (client(&endpoints).await, client(&endpoints).await);
    // A client whose pinned member is the one down (each starts at a random one) moves on at
    // once: the request was not sent.
    for _ in 0..6 {
        let down_first = [endpoints[2].clone(), endpoints[0].clone()];
        let skipping = client(&down_first).await;
        let guard = skipping.acquire("skip", &ttl(1000)).await.unwrap();
        assert!(guard.release().await.unwrap());
    }
    let held = c.acquire("shelf", &ttl(10_000)).await.unwrap();
    let waiter = tokio::spawn({
        let other = other.clone();
        async move { other.acquire("shelf", &ttl(10_000).wait(10 * SECOND)).await }
    });
    eventually(5 * SECOND, "the waiter waits", || async {
        waiting(&other, "shelf") == 1
    })
    .await;
    assert!(held.release().await.unwrap());
    let guard = waiter.await.unwrap().unwrap();
    assert!(guard.release().await.unwrap());

    cluster.kill(1);
    for call in 0..3 {
        let out = tokio::time::timeout(10 * SECOND, async {
            match call {
                0 => c.acquire("shelf", &ttl(1000)).await.map(drop),
                1 => c.is_locked("shelf").await.map(drop),
                _ => other.acquire("shelf", &ttl(1000).wait(SECOND)).await.map(drop),
            }
        })
        .await
        .unwrap_or_else(|_| panic!("call {call} hung without a majority"));
        assert!(
            matches!(out, Err(LockError::Unavailable { .. })),
            "call {call}: {out:?}"
        );
    }
    let _cluster = blocking(move || {
        cluster.restart(1);
        cluster.restart(2);
        cluster.wait_ready(&[0, 1, 2]);
        cluster
    })
    .await;
    let mut back = Err(None);
    for _ in 0..50 {
        match c.acquire("shelf", &ttl(1000)).await {
            Ok(guard) => {
                back = Ok(guard);
                break;
            }
            Err(e) => {
                back = Err(Some(e));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let back = back.unwrap_or_else(|e| panic!("locking works again once the majority is back: {e:?}"));
    assert!(back.release().await.unwrap());
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// A fenced write to data in etcd, as the guide (docs/deployments.md) describes it: the data's fence key keeps the largest
/// token that wrote; a write with a smaller one is refused, in the same transaction.
async fn fenced_write(etcd: &mut etcd_client::Client, fence: u64, value: &str) -> bool {
    let token = format!("{fence:020}");
    let write = Txn::new()
        .when([Compare::value(
            "account:7:fence",
            CompareOp::Greater,
            token.as_str(),
        )])
        .or_else([
            TxnOp::put("account:7:fence", token.as_str(), None),
            TxnOp::put("account:7", value, None),
        ]);
    !etcd.txn(write).await.unwrap().succeeded()
}

/// A holder's process frozen past its lease (SIGSTOP): its lease ends, the next holder enters
/// with a larger token and writes; when the frozen process resumes its guarded body is not
/// polled again (the lock is lost), and a write with its token is refused by the fence check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_process_is_stopped_and_its_late_write_refused() {
    let cluster = blocking(EtcdCluster::spawn).await;
    let endpoints = cluster.endpoints();
    let members: Vec<&str> = endpoints
        .iter()
        .map(|e| e.trim_start_matches("http://"))
        .collect();
    let url = format!("etcd://{}", members.join(","));
    let mut child = Command::new(env!("CARGO_BIN_EXE_lock-holder"))
        .args([url, "lock:".to_owned(), "account:7".to_owned()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (stale, mut lines) = blocking(move || {
        let first = lines.next().unwrap().unwrap();
        let fence: u64 = first
            .strip_prefix("held ")
            .unwrap_or_else(|| panic!("lock-holder said {first:?}"))
            .parse()
            .unwrap();
        // A few ticks: the body runs.
        for _ in 0..3 {
            assert!(lines.next().unwrap().unwrap().starts_with("tick "));
        }
        (fence, lines)
    })
    .await;
    let mut etcd = etcd_client::Client::connect(&endpoints, None).await.unwrap();
    assert!(fenced_write(&mut etcd, stale, "100").await);
    let pid = child.id().to_string();
    let signal = |signal: &str| {
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success());
    };
    signal("-STOP");
    let other = client(&endpoints).await;
    let next = other
        .acquire("account:7", &ttl(10_000).fencing(true).wait(10 * SECOND))
        .await
        .unwrap();
    let newer = next.fencing_token().unwrap();
    assert!(newer > stale, "{newer} <= {stale}");
    assert!(fenced_write(&mut etcd, newer, "90").await);
    let resumed_at = unix_ms();
    signal("-CONT");
    let (polled_after, said) = blocking(move || {
        let mut polled_after = Vec::new();
        let mut said = Vec::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(at) = line.strip_prefix("tick ") {
                if at.parse::<u128>().unwrap() >= resumed_at {
                    polled_after.push(line.clone());
                }
            } else {
                said.push(line);
            }
        }
        (polled_after, said)
    })
    .await;
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(3), "said {said:?}");
    assert_eq!(said, ["lost"]);
    assert!(
        polled_after.is_empty(),
        "the frozen body was polled after it resumed: {polled_after:?}"
    );
    // Its late write, with its token, is refused; the newer holder's stands.
    assert!(
        !fenced_write(&mut etcd, stale, "0").await,
        "the stale write was accepted"
    );
    let kept = etcd.get("account:7", None).await.unwrap();
    assert_eq!(kept.kvs()[0].value(), b"90");
    assert!(next.release().await.unwrap());
}

/// A holder cut off from every member (its connections blackholed) cannot renew: it counts its
/// lock lost once its validity ends, and its lease ends on the cluster, so another client gets
/// in; nothing hangs meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_partitioned_from_etcd_stops_at_its_validity() {
    let cluster = blocking(EtcdCluster::spawn).await;
    let proxies: Vec<FaultProxy> = (0..3)
        .map(|i| FaultProxy::start(cluster.client_port(i)))
        .collect();
    let through: Vec<String> = proxies
        .iter()
        .map(|p| format!("http://127.0.0.1:{}", p.port()))
        .collect();
    let cut_off = builder(&through)
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let other = client(&cluster.endpoints()).await;
    let held = cut_off
        .acquire("job", &ttl(2000).watchdog(true).fencing(true))
        .await
        .unwrap();
    let stale = held.fencing_token().unwrap();
    for proxy in &proxies {
        proxy.blackhole();
    }
    eventually(5 * SECOND, "the cut-off holder counts its lock lost", || async {
        held.is_lost()
    })
    .await;
    let next = other
        .acquire("job", &ttl(10_000).fencing(true).wait(10 * SECOND))
        .await
        .unwrap();
    assert!(next.fencing_token().unwrap() > stale);
    let late = tokio::time::timeout(5 * SECOND, held.release())
        .await
        .expect("a release cut off from etcd hangs");
    assert!(matches!(late, Err(_) | Ok(false)), "{late:?}");
    for proxy in &proxies {
        proxy.reset_all();
        proxy.relay();
    }
    assert!(
        other.is_locked("job").await.unwrap(),
        "the new holder's lock survives"
    );
    assert!(next.release().await.unwrap());
}

/// What the etcd store does not take is refused at build time, saying why; `etcd://host:port`
/// connects to one member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misconfigured_etcd_clients_are_refused_and_etcd_urls_connect() {
    let refused = |built: Result<LockClient, LockError>| match built {
        Err(LockError::InvalidOptions { reason }) => reason,
        other => panic!("not refused: {other:?}"),
    };
    let scheme = refused(LockClient::builder().etcd(["etcd://127.0.0.1:2379"]).build_lazy());
    assert!(
        scheme.contains("http://host:2379") && scheme.contains("LockClient::connect"),
        "{scheme}"
    );
    let http = refused(LockClient::builder().store("http://127.0.0.1:2379").build_lazy());
    assert!(http.contains("etcd://host:2379"), "{http}");
    let none = refused(LockClient::builder().etcd(Vec::<String>::new()).build_lazy());
    assert!(none.contains("no etcd endpoint"), "{none}");
    let replicas = refused(
        LockClient::builder()
            .etcd(["http://127.0.0.1:2379"])
            .wait_for_replicas(1, SECOND)
            .build_lazy(),
    );
    assert!(replicas.contains("majority"), "{replicas}");
    let certs = lock_tests::TestCerts::generate();
    let material = refused(
        LockClient::builder()
            .etcd(["http://127.0.0.1:2379"])
            .tls_root_ca(certs.ca_pem())
            .build_lazy(),
    );
    assert!(material.contains("https://"), "{material}");
    let user_first = refused(LockClient::builder().etcd_user("app", "secret").build_lazy());
    assert!(
        user_first.contains(".etcd_user(…) needs .etcd([…]) before it"),
        "{user_first}"
    );
    let two_users = refused(
        LockClient::builder()
            .etcd(["http://a:x@127.0.0.1:2379", "http://b:y@127.0.0.1:2380"])
            .build_lazy(),
    );
    assert!(two_users.contains("different users"), "{two_users}");
    assert!(
        !two_users.contains('x') || !two_users.contains(":x@"),
        "{two_users}"
    );
    // https:// is taken (the `tls` feature), and a member that is down is said in one line.
    let tls = LockClient::builder()
        .etcd(["https://127.0.0.1:1"])
        .tls_root_ca(certs.ca_pem())
        .connect_timeout(SECOND)
        .response_timeout(SECOND)
        .build()
        .await
        .unwrap_err();
    let said = tls.to_string();
    assert!(matches!(tls, LockError::Unavailable { .. }), "{tls:?}");
    assert!(
        said.contains("etcd at https://127.0.0.1:1: cannot be reached"),
        "{said}"
    );
    assert!(!said.contains("tonic") && !said.contains('\n'), "{said}");

    let cluster = EtcdCluster::shared();
    let url = format!("etcd://127.0.0.1:{}", cluster.client_port(0));
    let c = LockClient::connect(&url).await.unwrap();
    let guard = c.acquire("etcd-url", &ttl(5000)).await.unwrap();
    assert!(c.is_locked("etcd-url").await.unwrap());
    assert!(guard.release().await.unwrap());
}

/// The keys of a lock as the library names them: `<prefix>{<key>}`, 0xff, then `rest`.
fn lock_key(prefix: &str, key: &str, rest: &[u8]) -> Vec<u8> {
    let mut name = format!("{prefix}{{{key}}}").into_bytes();
    name.push(0xff);
    name.extend_from_slice(rest);
    name
}

/// A client whose process died leaves its place in line on its session lease, which nobody
/// keeps alive: it holds the line back until that lease ends, no longer, and the next in line
/// then takes the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_clients_place_lapses_and_the_next_in_line_takes_the_lock() {
    let cluster = EtcdCluster::shared();
    let c = builder(&cluster.endpoints())
        .prefix("ghost:")
        .build()
        .await
        .unwrap();
    let mut etcd = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    // The place of a client that will never renew its session: a lease of etcd's minimum.
    let lease = etcd.lease_grant(2, None).await.unwrap().id();
    let ghost = lock_key("ghost:", "line", b"lw/ghost");
    let options = etcd_client::PutOptions::new().with_lease(lease);
    etcd.put(ghost.clone(), "ghost owner", Some(options))
        .await
        .unwrap();
    let refused = c.acquire("line", &ttl(5000)).await;
    assert!(
        matches!(refused, Err(LockError::Busy { .. })),
        "an older place in line is passed: {refused:?}"
    );
    let guard = c.acquire("line", &ttl(5000).wait(10 * SECOND)).await.unwrap();
    let left = etcd.get(ghost, None).await.unwrap();
    assert!(
        left.kvs().is_empty(),
        "taken while the dead client's place was there"
    );
    assert!(guard.release().await.unwrap());
}

/// A value this library did not write at a holder's place is shown as foreign, and a forced
/// release frees it only as it was seen (as on ZooKeeper and Redis): changed since, it is spared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_holder_is_forced_free_only_as_it_was_seen() {
    use lock_runtime::admin::{Admin, ForceReleased, Holding};

    let cluster = EtcdCluster::shared();
    let c = builder(&cluster.endpoints())
        .prefix("foreign:")
        .build()
        .await
        .unwrap();
    let admin = Admin::new(c.clone());
    let mut etcd = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    let place = lock_key("foreign:", "job", b"lw/not-ours");
    etcd.put(place.clone(), "hello", None).await.unwrap();
    let seen = admin.show("job").await.unwrap();
    assert!(
        matches!(&seen.holding, Holding::Foreign { value: Some(v), .. } if v == "hello"),
        "{seen:?}"
    );
    etcd.put(place.clone(), "changed", None).await.unwrap();
    assert_eq!(admin.force_release(&seen).await.unwrap(), ForceReleased::Changed);
    assert_eq!(etcd.get(place.clone(), None).await.unwrap().kvs().len(), 1);
    let seen = admin.show("job").await.unwrap();
    assert_eq!(admin.force_release(&seen).await.unwrap(), ForceReleased::Freed);
    assert!(etcd.get(place, None).await.unwrap().kvs().is_empty());
    assert!(!admin.show("job").await.unwrap().is_held());
    let guard = c.acquire("job", &ttl(5000)).await.unwrap();
    assert!(guard.release().await.unwrap());
}

/// Clients through fault proxies, one per member of the shared cluster (cut off together).
struct CutOff {
    proxies: Vec<FaultProxy>,
    client: LockClient,
}

impl CutOff {
    async fn new(prefix: &str) -> CutOff {
        let cluster = EtcdCluster::shared();
        let proxies: Vec<FaultProxy> = (0..3)
            .map(|i| FaultProxy::start(cluster.client_port(i)))
            .collect();
        let through: Vec<String> = proxies
            .iter()
            .map(|p| format!("http://127.0.0.1:{}", p.port()))
            .collect();
        let client = builder(&through)
            .prefix(prefix)
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

/// Tries to take `key` through `other` until it gets it, checking at each success that the
/// holder `held` no longer counts its lock valid: the server never kept it for less than the
/// holder's validity. Returns how long that took.
async fn taken_only_after_its_validity(
    other: &LockClient,
    key: &str,
    held: Option<&lock_runtime::LockGuard>,
) -> Duration {
    let started = tokio::time::Instant::now();
    loop {
        let still_valid = held.is_some_and(|held| !held.is_lost());
        match other.acquire(key, &ttl(5000)).await {
            Ok(next) => {
                assert!(
                    !still_valid || held.is_some_and(lock_runtime::LockGuard::is_lost),
                    "{key}: another client got in while the holder counted its lock valid"
                );
                assert!(next.release().await.unwrap());
                return started.elapsed();
            }
            Err(LockError::Busy { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("{key}: {e}"),
        }
        assert!(started.elapsed() < 20 * SECOND, "{key}: never freed");
    }
}

/// A holder cut off from every member (its connections silent) never counts its lock valid
/// longer than the cluster keeps it: right after an acquire (its session was last renewed a
/// while before), after an `extend` (the lock moved to a longer session), with a maximum hold
/// under the watchdog; and a lock given back before its minimum hold stays held on the cluster
/// until the hold ends, also when its holder is cut off right after. Nothing hangs meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holders_validity_never_outlives_the_clusters_keep() {
    let cluster = EtcdCluster::shared();
    let other = builder(&cluster.endpoints())
        .prefix("cut:")
        .build()
        .await
        .unwrap();
    let cases: [(&str, LockOptions); 4] = [
        ("acquired", ttl(2000)),
        ("extended", ttl(2000)),
        (
            "at-most",
            ttl(2000).watchdog(true).hold_at_most(Duration::from_millis(3000)),
        ),
        ("at-least", ttl(2000).hold_at_least(Duration::from_millis(3000))),
    ];
    for (key, options) in cases {
        let cut = CutOff::new("cut:").await;
        let held = cut.client.acquire(key, &options).await.unwrap();
        if key == "extended" {
            held.extend(Duration::from_secs(4)).await.unwrap();
        }
        if key == "at-least" {
            // Given back at once: kept on the cluster for the rest of its 3 s minimum hold.
            let acquired = tokio::time::Instant::now();
            assert!(held.release().await.unwrap());
            cut.each(FaultProxy::blackhole);
            let took = taken_only_after_its_validity(&other, key, None).await;
            assert!(
                acquired.elapsed() >= Duration::from_millis(2900),
                "freed {took:?} in, before its minimum hold"
            );
            continue;
        }
        cut.each(FaultProxy::blackhole);
        let took = taken_only_after_its_validity(&other, key, Some(&held)).await;
        assert!(held.is_lost(), "{key}");
        let late = tokio::time::timeout(5 * SECOND, held.release())
            .await
            .expect("a release cut off from etcd hangs");
        assert!(
            matches!(late, Err(_) | Ok(false)),
            "{key}: {late:?} after {took:?}"
        );
    }
}

/// The answer of an `extend` is lost (etcd applied it: the lock moved to a longer session): the
/// holder's renewals go on keeping the lock's real lease alive, so nobody else gets in, and the
/// holder never counts it lost. Before, renewals kept only the old lease alive, the lock
/// lapsed, and a second client held it while the first still did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_whose_answer_is_lost_lets_nobody_else_in() {
    let cut = CutOff::new("lost-extend:").await;
    let other = builder(&EtcdCluster::shared().endpoints())
        .prefix("lost-extend:")
        .build()
        .await
        .unwrap();
    let held = cut
        .client
        .acquire("ledger", &ttl(2000).watchdog(true))
        .await
        .unwrap();
    cut.each(FaultProxy::drop_answers);
    let extended = held.extend(Duration::from_secs(6)).await;
    assert!(extended.is_err(), "the extend's answer was dropped: {extended:?}");
    cut.each(FaultProxy::reset_all);
    cut.each(FaultProxy::relay);
    // Three times the old ttl and more: renewals keep the lock, whichever session it is on.
    let until = tokio::time::Instant::now() + 8 * SECOND;
    while tokio::time::Instant::now() < until {
        let refused = other.acquire("ledger", &ttl(1000)).await;
        assert!(
            matches!(refused, Err(LockError::Busy { .. })),
            "a second holder got in: {refused:?}"
        );
        assert!(!held.is_lost(), "the holder lost a lock that was still its own");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(held.release().await.unwrap());
}

/// Extends of every length racing the watchdog's renewals for ten seconds (each extend to a
/// longer ttl moves the lock to another session): never `Lost`, and nobody else gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extends_racing_renewals_for_ten_seconds_never_lose_the_lock() {
    let cluster = EtcdCluster::shared();
    let c = builder(&cluster.endpoints())
        .prefix("race:")
        .build()
        .await
        .unwrap();
    let other = builder(&cluster.endpoints())
        .prefix("race:")
        .build()
        .await
        .unwrap();
    let held = std::sync::Arc::new(c.acquire("k", &ttl(300).watchdog(true)).await.unwrap());
    let until = tokio::time::Instant::now() + 10 * SECOND;
    let extenders: Vec<_> = (0..2u64)
        .map(|n| {
            let held = std::sync::Arc::clone(&held);
            tokio::spawn(async move {
                let mut i = n;
                let mut extends = 0;
                while tokio::time::Instant::now() < until {
                    let to = [300, 1500, 2500, 4000, 700][usize::try_from(i % 5).unwrap()];
                    held.extend(Duration::from_millis(to))
                        .await
                        .unwrap_or_else(|e| panic!("extend {i}: {e}"));
                    extends += 1;
                    i += 3;
                }
                extends
            })
        })
        .collect();
    while tokio::time::Instant::now() < until {
        assert!(!held.is_lost(), "lost while extends raced renewals");
        let refused = other.acquire("k", &ttl(1000)).await;
        assert!(matches!(refused, Err(LockError::Busy { .. })), "{refused:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for extender in extenders {
        assert!(extender.await.unwrap() > 20);
    }
    let held = std::sync::Arc::into_inner(held).unwrap();
    assert!(held.release().await.unwrap());
}

/// 1,000 fenced acquire/release pairs on distinct keys leave nothing without a lease: the
/// places in line go with their releases, the last writers' tokens are kept on a short lease;
/// once the leases end (ended here by revoking them), nothing is left under the prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_fenced_pairs_leave_nothing_once_their_leases_end() {
    let cluster = EtcdCluster::shared();
    let c = builder(&cluster.endpoints())
        .prefix("pairs:")
        .build()
        .await
        .unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let c = c.clone();
            tokio::spawn(async move {
                for k in (t..1000).step_by(8) {
                    let guard = c
                        .acquire(&format!("order:{k}"), &ttl(5000).fencing(true))
                        .await
                        .unwrap();
                    assert!(guard.fencing_token().is_some());
                    assert!(guard.release().await.unwrap());
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    drop(c);
    let mut etcd = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    let prefix = Some(etcd_client::GetOptions::new().with_prefix());
    let left = etcd.get("pairs:", prefix.clone()).await.unwrap();
    let mut leases: Vec<i64> = left.kvs().iter().map(|kv| kv.lease()).collect();
    assert!(left.kvs().len() <= 1000, "{} keys left", left.kvs().len());
    assert!(
        left.kvs()
            .iter()
            .all(|kv| !kv.key().windows(2).any(|w| w == [0xff, b'l'])),
        "a place in line outlived its release"
    );
    assert!(
        leases.iter().all(|&lease| lease != 0),
        "a key without a lease: it would stay forever"
    );
    leases.sort_unstable();
    leases.dedup();
    assert!(
        leases.len() <= 3,
        "the kept tokens share a lease or two: {}",
        leases.len()
    );
    for lease in leases {
        let ttl = etcd.lease_time_to_live(lease, None).await.unwrap().ttl();
        assert!(ttl <= 60, "kept for at most a minute: {ttl} s");
        etcd.lease_revoke(lease).await.unwrap();
    }
    assert_eq!(etcd.get("pairs:", prefix).await.unwrap().count(), 0);
}

/// The cluster's committed raft proposals once the count stops moving (what was answered is
/// counted; a metric read races nothing then).
async fn settled(cluster: &EtcdCluster) -> f64 {
    let mut last = cluster.proposals_committed();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = cluster.proposals_committed();
        if now == last {
            return now;
        }
        last = now;
    }
}

/// Raft writes, from etcd's own metrics: a try-once refused costs at most one, a hand-off
/// between clients (a release, and the next waiter's place put when it joined) at most two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_try_costs_at_most_one_raft_write_and_a_hand_off_two() {
    let cluster = blocking(EtcdCluster::spawn).await;
    let endpoints = cluster.endpoints();
    let (a, b) = (client(&endpoints).await, client(&endpoints).await);
    // Sessions granted, the fence lease too: what is counted below is the steady state.
    for c in [&a, &b] {
        let warm = c.acquire("warm", &ttl(5000).fencing(true)).await.unwrap();
        assert!(warm.release().await.unwrap());
    }
    let held = a.acquire("held", &ttl(5000)).await.unwrap();
    let before = settled(&cluster).await;
    const TRIES: u32 = 50;
    for _ in 0..TRIES {
        let refused = b.acquire("held", &ttl(5000)).await;
        assert!(matches!(refused, Err(LockError::Busy { .. })), "{refused:?}");
    }
    let per_try = (settled(&cluster).await - before) / f64::from(TRIES);
    assert!(per_try <= 1.0, "{per_try} raft writes per refused try");
    assert!(held.release().await.unwrap());

    const HANDOFFS: u32 = 40;
    let before = settled(&cluster).await;
    // (The clients outlive the count: a client that goes revokes its sessions, two writes.)
    let turns: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|c| {
            tokio::spawn(async move {
                for _ in 0..HANDOFFS / 2 {
                    let guard = c
                        .acquire("handoff", &ttl(5000).fencing(true).wait(10 * SECOND))
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    assert!(guard.release().await.unwrap());
                }
            })
        })
        .collect();
    for turn in turns {
        turn.await.unwrap();
    }
    let per_handoff = (settled(&cluster).await - before) / f64::from(HANDOFFS);
    assert!(per_handoff <= 2.0, "{per_handoff} raft writes per hand-off");
    drop((a, b));
}

/// With etcd's auth on: a client without credentials, or with a wrong password, is refused at
/// `build()` saying what to give; a user without rights on the prefix is refused saying which;
/// credentials in the endpoint or given to the builder lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_credentials_are_asked_for_and_used() {
    let cluster = blocking(EtcdCluster::spawn).await;
    let endpoints = cluster.endpoints();
    let mut etcd = etcd_client::Client::connect(&endpoints, None).await.unwrap();
    etcd.user_add("root", "rootpw", None).await.unwrap();
    etcd.user_grant_role("root", "root").await.unwrap();
    etcd.user_add("app", "apppw", None).await.unwrap();
    etcd.role_add("locks").await.unwrap();
    let rights = etcd_client::Permission::read_write("lock:").with_prefix();
    etcd.role_grant_permission("locks", rights).await.unwrap();
    etcd.user_grant_role("app", "locks").await.unwrap();
    etcd.user_add("reader", "readerpw", None).await.unwrap();
    etcd.auth_enable().await.unwrap();

    let refusal = |built: Result<LockClient, LockError>| match built {
        Err(LockError::Refused { reason, source }) => format!("{reason} ({source})"),
        other => panic!("not refused: {other:?}"),
    };
    let anonymous = refusal(builder(&endpoints).build().await);
    assert!(
        anonymous.contains("etcd_user") && anonymous.contains("user name is empty"),
        "{anonymous}"
    );
    let wrong = refusal(builder(&endpoints).etcd_user("app", "nope").build().await);
    assert!(wrong.contains("authentication failed"), "{wrong}");
    let no_rights = refusal(builder(&endpoints).etcd_user("reader", "readerpw").build().await);
    assert!(no_rights.contains("lacks a right"), "{no_rights}");

    let in_url: Vec<String> = endpoints
        .iter()
        .map(|e| e.replace("http://", "http://app:apppw@"))
        .collect();
    for c in [
        client(&in_url).await,
        builder(&endpoints)
            .etcd_user("app", "apppw")
            .build()
            .await
            .unwrap(),
    ] {
        let guard = c
            .acquire("authed", &ttl(2000).watchdog(true).fencing(true))
            .await
            .unwrap();
        assert!(c.is_locked("authed").await.unwrap());
        assert!(guard.release().await.unwrap());
        assert!(!format!("{c:?}").contains("apppw"));
    }
}

/// Waiters whose watches start below a revision already compacted away (compaction to the
/// newest revision every few milliseconds, racing the hand-offs) are told to look again and
/// watch from a newer one: every waiter gets the lock, in line order, each woken by the release
/// ahead of it rather than by its nap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_survive_watches_started_below_the_compacted_revision() {
    let cluster = EtcdCluster::shared();
    let endpoints = cluster.endpoints();
    let clients = [client(&endpoints).await, client(&endpoints).await];
    let compacting = tokio::spawn({
        let endpoints = endpoints.clone();
        async move {
            let mut etcd = etcd_client::Client::connect(&endpoints, None).await.unwrap();
            loop {
                let put = etcd.put("compact:noise", "x", None).await.unwrap();
                let revision = put.header().unwrap().revision();
                let _ = etcd.compact(revision, None).await;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        }
    });
    let started = tokio::time::Instant::now();
    const ROUNDS: usize = 60;
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let c = clients[i % 2].clone();
            tokio::spawn(async move {
                for _ in 0..ROUNDS / 4 {
                    let guard = c
                        .acquire("compacted", &ttl(5000).wait(20 * SECOND))
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    assert!(guard.release().await.unwrap());
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    compacting.abort();
    // Woken by releases: sixty hand-offs take far less than one nap each.
    assert!(
        started.elapsed() < lock_runtime::MAX_WAIT_NAP * 10,
        "waiters slept through their wake-ups: {:?}",
        started.elapsed()
    );
}

/// A multi-key set is one transaction (each lock's place put only if every line is empty), taken
/// with or without fencing or refused, as etcd counts what it served; a refused set takes
/// nothing, and each key's token rises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_is_one_transaction_taken_or_refused() {
    let cluster = blocking(EtcdCluster::spawn).await;
    let endpoints = cluster.endpoints();
    let (c, other) = (client(&endpoints).await, client(&endpoints).await);
    // Sessions granted: what is counted below is the steady state.
    for client in [&c, &other] {
        let warm = client.acquire("warm", &ttl(10_000)).await.unwrap();
        assert!(warm.release().await.unwrap());
    }
    let txns = || cluster.served().get("Txn").copied().unwrap_or(0.0);
    let keys = ["set:a", "set:b", "set:c"];
    let mut last = None;
    for fencing in [false, true] {
        let before = txns();
        let all = c.acquire_all(keys, &ttl(10_000).fencing(fencing)).await.unwrap();
        assert_eq!(txns() - before, 1.0, "one transaction (fencing: {fencing})");
        if fencing {
            last = all.fencing_token_for("set:b");
        }
        assert!(all.release().await.unwrap());
    }
    let held = other.acquire("set:b", &ttl(10_000)).await.unwrap();
    let before = txns();
    let refused = c.acquire_all(keys, &ttl(10_000)).await;
    assert_eq!(txns() - before, 1.0, "refused in the same one transaction");
    assert!(
        matches!(refused, Err(LockError::Busy { ref key }) if key == "set:b"),
        "{refused:?}"
    );
    for key in ["set:a", "set:c"] {
        assert!(!c.is_locked(key).await.unwrap(), "{key} left taken");
    }
    assert!(held.release().await.unwrap());
    let again = c.acquire_all(keys, &ttl(10_000).fencing(true)).await.unwrap();
    assert!(again.fencing_token_for("set:b") > last, "{last:?}");
    assert!(again.release().await.unwrap());
}

/// A free permit of a semaphore is one transaction, and so is a try refused because every
/// permit is taken; a waiter is served in the order it came (a newcomer never takes a permit
/// while others queue), woken by the permit given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_is_one_transaction_and_waiters_are_served_in_order() {
    let cluster = blocking(EtcdCluster::spawn).await;
    let endpoints = cluster.endpoints();
    let (c, other) = (client(&endpoints).await, client(&endpoints).await);
    let two = ttl(10_000).permits(2);
    for client in [&c, &other] {
        let warm = client.acquire("warm", &two).await.unwrap();
        assert!(warm.release().await.unwrap());
    }
    let txns = || cluster.served().get("Txn").copied().unwrap_or(0.0);
    let before = txns();
    let first = c.acquire("sem", &two.clone().fencing(true)).await.unwrap();
    assert_eq!(txns() - before, 1.0, "a free permit: one transaction");
    let second = other.acquire("sem", &two).await.unwrap();
    assert_ne!(first.permit(), second.permit());
    let before = txns();
    let refused = c.acquire("sem", &two).await;
    assert!(matches!(refused, Err(LockError::Busy { .. })), "{refused:?}");
    assert_eq!(txns() - before, 1.0, "refused in the same one transaction");
    // Three waiters, in order; each permit given back lets the oldest in.
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for n in 0..3 {
        let client = if n % 2 == 0 { c.clone() } else { other.clone() };
        let before = waiting(&client, "sem");
        let (order, options) = (std::sync::Arc::clone(&order), two.clone().wait(30 * SECOND));
        waiters.push(tokio::spawn({
            let client = client.clone();
            async move {
                let guard = client.acquire("sem", &options).await.unwrap();
                order.lock().unwrap().push(n);
                guard
            }
        }));
        eventually(5 * SECOND, "the waiter queues", || async {
            waiting(&client, "sem") == before + 1
        })
        .await;
    }
    assert!(first.release().await.unwrap());
    let got = tokio::time::timeout(10 * SECOND, waiters.remove(0))
        .await
        .unwrap()
        .unwrap();
    assert!(second.release().await.unwrap());
    let next = tokio::time::timeout(10 * SECOND, waiters.remove(0))
        .await
        .unwrap()
        .unwrap();
    assert!(got.release().await.unwrap());
    let last = tokio::time::timeout(10 * SECOND, waiters.remove(0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(*order.lock().unwrap(), [0, 1, 2], "in the order they came");
    for guard in [next, last] {
        assert!(guard.release().await.unwrap());
    }
    assert!(!c.is_locked("sem").await.unwrap());
}
