//! Self-tests of the test kit's Redis Cluster and Sentinel fixtures.

use std::time::Instant;

use lock_tests::{RedisCluster, SentinelSetup};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

/// `GET key` on one node, without following redirections.
async fn get(conn: &mut MultiplexedConnection, key: &str) -> redis::RedisResult<Option<String>> {
    redis::cmd("GET").arg(key).query_async(conn).await
}

/// That `GET key` on `conn` is redirected with `code` (`MOVED` or `ASK`) to `port`.
async fn assert_redirected(conn: &mut MultiplexedConnection, key: &str, code: &str, port: u16) {
    let err = get(conn, key)
        .await
        .expect_err(&format!("GET {key} was answered, not redirected"));
    assert_eq!(err.code(), Some(code), "GET {key}: {err}");
    let address = format!("127.0.0.1:{port}");
    assert_eq!(
        err.redirect_node().map(|(to, _slot)| to),
        Some(address.as_str()),
        "GET {key}: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_serves_migrates_and_fails_over() {
    let started = Instant::now();
    let mut cluster = RedisCluster::spawn(3, 1);
    eprintln!("3x1 cluster up in {:?}", started.elapsed());
    assert_eq!(cluster.nodes().len(), 6);
    assert_eq!(cluster.urls().len(), 6);
    assert_eq!(cluster.primaries(), vec![0, 1, 2]);
    for p in 0..3 {
        assert_eq!(cluster.replica_of(p), 3 + p);
    }

    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let _: () = conn.set("{k}x", "1").await.unwrap();
    let value: String = conn.get("{k}x").await.unwrap();
    assert_eq!(value, "1");

    // Move a slot holding two keys to another primary.
    let (a, b) = ("{fixtures-migrate}a", "{fixtures-migrate}b");
    let _: () = conn.set(a, "va").await.unwrap();
    let _: () = conn.set(b, "vb").await.unwrap();
    let from = cluster.primary_of_key(a);
    let to = (from + 1) % 3;
    let started = Instant::now();
    cluster.migrate_slot_of(a, to);
    eprintln!("slot migrated in {:?}", started.elapsed());
    assert_eq!(cluster.primary_of_key(a), to);
    let mut at_target = cluster.node(to).raw().await;
    assert_eq!(get(&mut at_target, a).await.unwrap().as_deref(), Some("va"));
    assert_eq!(get(&mut at_target, b).await.unwrap().as_deref(), Some("vb"));
    let mut at_source = cluster.node(from).raw().await;
    assert_redirected(&mut at_source, a, "MOVED", cluster.node(to).port()).await;
    let value: String = conn.get(b).await.unwrap();
    assert_eq!(value, "vb", "the cluster client follows MOVED");

    // Kill the new owner: its replica takes over, with the keys.
    let started = Instant::now();
    let promoted = cluster.fail_over_by_killing(to);
    eprintln!("failed over in {:?}", started.elapsed());
    assert_eq!(promoted, 3 + to);
    assert!(!cluster.node(to).is_running());
    assert_eq!(cluster.urls().len(), 5);
    let mut primaries = vec![promoted, (to + 1) % 3, (to + 2) % 3];
    primaries.sort_unstable();
    assert_eq!(cluster.primaries(), primaries);
    assert_eq!(cluster.primary_of_key(a), promoted);
    let mut at_promoted = cluster.node(promoted).raw().await;
    assert_eq!(get(&mut at_promoted, a).await.unwrap().as_deref(), Some("va"));
    let _: () = redis::cmd("SET")
        .arg(a)
        .arg("after")
        .query_async(&mut at_promoted)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_cluster_is_one_and_migrates_in_two_phases() {
    let started = Instant::now();
    let cluster = RedisCluster::shared();
    eprintln!("shared cluster up in {:?}", started.elapsed());
    assert!(std::ptr::eq(cluster, RedisCluster::shared()));
    assert_eq!(cluster.primaries().len(), 3);

    let (a, b) = ("{fixtures-shared}a", "{fixtures-shared}b");
    let from = cluster.primary_of_key(a);
    let to = cluster.primaries().into_iter().find(|&p| p != from).unwrap();
    let mut at_source = cluster.node(from).raw().await;
    let mut at_target = cluster.node(to).raw().await;
    for key in [a, b] {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(key)
            .query_async(&mut at_source)
            .await
            .unwrap();
    }

    let migration = cluster.begin_migration(a, to);
    assert_eq!((migration.from(), migration.to()), (from, to));
    assert_eq!(migration.slot(), cluster.slot_of(b));
    cluster.migrate_key(&migration, a);
    // Mid-migration: the moved key is asked for at the target, the other is still served.
    assert_redirected(&mut at_source, a, "ASK", cluster.node(to).port()).await;
    assert_eq!(get(&mut at_source, b).await.unwrap().as_deref(), Some(b));
    assert_redirected(&mut at_target, a, "MOVED", cluster.node(from).port()).await;
    let (value,): (Option<String>,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("GET")
        .arg(a)
        .query_async(&mut at_target)
        .await
        .unwrap();
    assert_eq!(value.as_deref(), Some(a));
    assert_eq!(cluster.primary_of_key(a), from);

    cluster.finish_migration(migration);
    assert_eq!(cluster.primary_of_key(a), to);
    assert_eq!(get(&mut at_target, a).await.unwrap().as_deref(), Some(a));
    assert_eq!(get(&mut at_target, b).await.unwrap().as_deref(), Some(b));
    assert_redirected(&mut at_source, b, "MOVED", cluster.node(to).port()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_on_request() {
    let started = Instant::now();
    let mut setup = SentinelSetup::spawn(1, 3);
    eprintln!(
        "sentinel setup (1 replica, 3 sentinels) up in {:?}",
        started.elapsed()
    );
    assert_eq!(setup.master_name(), "mymaster");
    assert_eq!(setup.sentinel_urls().len(), 3);
    let old = setup.current_primary_port();
    assert_eq!(old, setup.nodes()[0].port());
    assert_eq!(setup.replica(0).port(), setup.nodes()[1].port());

    let started = Instant::now();
    let new = setup.failover();
    eprintln!("SENTINEL FAILOVER done in {:?}", started.elapsed());
    assert_ne!(new, old);
    assert_eq!(new, setup.nodes()[1].port());
    assert_eq!(setup.primary().port(), new);
    assert_eq!(setup.primary_index(), 1);
    let mut primary = setup.primary().raw().await;
    let _: () = primary.set("k", "v").await.unwrap();
    let value: String = primary.get("k").await.unwrap();
    assert_eq!(value, "v");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_when_the_primary_dies() {
    let started = Instant::now();
    let mut setup = SentinelSetup::spawn(2, 3);
    eprintln!(
        "sentinel setup (2 replicas, 3 sentinels) up in {:?}",
        started.elapsed()
    );
    let old = setup.current_primary_port();
    assert_eq!(setup.replica_indices(), vec![1, 2]);

    let started = Instant::now();
    let new = setup.kill_primary_and_wait_failover();
    eprintln!("failover after SIGKILL done in {:?}", started.elapsed());
    assert_ne!(new, old);
    assert!(!setup.nodes()[0].is_running());
    let index = setup.primary_index();
    assert!(index == 1 || index == 2, "node {index} was promoted");
    assert_eq!(setup.replica_indices(), vec![3 - index]);
    let _: () = setup.primary().raw().await.set("k", "v").await.unwrap();
}
