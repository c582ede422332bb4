//! The etcd store under faults, each test on a 3-member cluster of its own: the leader killed
//! while a lock is held, a minority and a majority of members down, a holder's process frozen
//! past its lease (SIGSTOP), and a holder partitioned from every member. The behaviour suite runs
//! on etcd too (`behaviour.rs`, `coordination.rs`, `read_write.rs`: the `etcd::` tests).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use lock_runtime::{LockClient, LockError};
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_etcd-holder"))
        .args([endpoints.join(","), "lock:".to_owned(), "account:7".to_owned()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (stale, mut lines) = blocking(move || {
        let first = lines.next().unwrap().unwrap();
        let fence: u64 = first
            .strip_prefix("held ")
            .unwrap_or_else(|| panic!("etcd-holder said {first:?}"))
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
    let tls = refused(
        LockClient::builder()
            .etcd(["https://127.0.0.1:2379"])
            .build_lazy(),
    );
    assert!(tls.contains("TLS to etcd is not offered yet"), "{tls}");
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
    assert!(material.contains("TLS to etcd"), "{material}");

    let cluster = EtcdCluster::shared();
    let url = format!("etcd://127.0.0.1:{}", cluster.client_port(0));
    let c = LockClient::connect(&url).await.unwrap();
    let guard = c.acquire("etcd-url", &ttl(5000)).await.unwrap();
    assert!(c.is_locked("etcd-url").await.unwrap());
    assert!(guard.release().await.unwrap());
}

/// A fair waiter that stops asking (its process died) leaves a place in line on a short lease
/// of its own: it holds the line back until that lease ends, no longer, and the next waiter in
/// line then takes the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiters_place_lapses_and_the_next_in_line_takes_the_lock() {
    let cluster = EtcdCluster::shared();
    let c = builder(&cluster.endpoints())
        .prefix("ghost:")
        .build()
        .await
        .unwrap();
    let mut etcd = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    // The place of a waiter that will never ask again: on a lease of etcd's minimum, not kept
    // alive (the library's own name for it: the lock's key, 0xff, `q/<token>`).
    let lease = etcd.lease_grant(2, None).await.unwrap().id();
    let mut ghost = b"ghost:{line}".to_vec();
    ghost.push(0xff);
    ghost.extend_from_slice(b"q/ghost");
    etcd.put(
        ghost.clone(),
        "",
        Some(etcd_client::PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    let fair = ttl(5000).fair(true);
    let refused = c.acquire("line", &fair).await;
    assert!(
        matches!(refused, Err(LockError::Busy { .. })),
        "an older place in line is passed: {refused:?}"
    );
    let guard = c.acquire("line", &fair.wait(10 * SECOND)).await.unwrap();
    let left = etcd.get(ghost, None).await.unwrap();
    assert!(
        left.kvs().is_empty(),
        "taken while the dead waiter's place was there"
    );
    assert!(guard.release().await.unwrap());
}
