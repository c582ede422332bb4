//! The ZooKeeper store's production connections: digest credentials (`.zookeeper_auth`,
//! `zk://user:password@…`) and the ACL they put on every node (only sessions with the same
//! credentials, Apache Curator's among them, may touch it), and TLS (`zks://`, the builder's
//! TLS material) against the kit's ensemble that listens with TLS and serves only sessions with
//! digest credentials ([`ZkEnsemble::shared_secure`]).
//!
//! ```text
//! cargo test -p lock-tests --test zookeeper_auth
//! ```

use std::time::Duration;

use lock_runtime::{LockClient, LockClientBuilder, LockError};
use lock_tests::{eventually, ttl, Curator, CuratorLock, ZkEnsemble, SECOND, SECURE_PASSWORD, SECURE_USER};
use tokio::time::Instant;
use zookeeper_client::{Client, Error as ZkError, Permission};

/// [`SECURE_PASSWORD`] as a URL carries it.
const ENCODED_PASSWORD: &str = "s3cret%3Awith%2Fodd%40chars";

fn credentials() -> String {
    format!("{SECURE_USER}:{SECURE_PASSWORD}")
}

fn builder(hosts: &[String], parent: &str) -> LockClientBuilder {
    LockClient::builder()
        .zookeeper(hosts)
        .prefix(parent)
        .connect_timeout(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(2))
}

/// Runs a blocking step of the kit (a Java process, the ensemble) off the runtime's workers.
async fn blocking<T: Send + 'static>(step: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(step)
        .await
        .expect("the kit's step panicked")
}

/// A plain ZooKeeper client, with the test's digest credentials or none.
async fn raw(hosts: &[String], authed: bool) -> Client {
    let connector = Client::connector();
    let connector = match authed {
        true => connector.with_auth("digest", credentials().as_bytes()),
        false => connector,
    };
    connector
        .connect(&hosts.join(","))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {hosts:?}: {e}"))
}

/// The only child of `path`'s, as a full path.
async fn only_child(zk: &Client, path: &str) -> String {
    let children = zk
        .list_children(path)
        .await
        .unwrap_or_else(|e| panic!("children of {path}: {e}"));
    assert_eq!(children.len(), 1, "{children:?}");
    format!("{path}/{}", children[0])
}

/// Asserts that `path`'s ACL is `creator_all` for the test's digest user: every right, to
/// `digest:locker:<hash>` only.
async fn assert_owned_by_the_digest_user(zk: &Client, path: &str) {
    let (acls, _) = zk
        .get_acl(path)
        .await
        .unwrap_or_else(|e| panic!("ACL of {path}: {e}"));
    assert_eq!(acls.len(), 1, "{path}: {acls:?}");
    let acl = &acls[0];
    assert_eq!(acl.scheme(), "digest", "{path}: {acls:?}");
    assert!(
        acl.id().starts_with(&format!("{SECURE_USER}:")),
        "{path}: {acls:?}"
    );
    assert_eq!(acl.permission(), Permission::ALL, "{path}: {acls:?}");
}

/// With digest credentials, the lock's node, its parent and the prefix are created `creator_all`:
/// a client without the credentials can neither delete a held lock's node nor take the lock (nor
/// start on the prefix), while Curator with the same credentials waits for our lock and gets it
/// at our release, holds its own that we wait for, and may delete our node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_credentials_own_every_node_and_curator_with_them_shares_the_locks() {
    let ensemble = ZkEnsemble::shared();
    let hosts = ensemble.hosts();
    let c = builder(&hosts, "/auth-acl")
        .zookeeper_auth(SECURE_USER, SECURE_PASSWORD)
        .build()
        .await
        .unwrap();
    let authed = raw(&hosts, true).await;
    let anonymous = raw(&hosts, false).await;

    let guard = c.acquire("order:1", &ttl(30_000)).await.unwrap();
    let node = only_child(&authed, "/auth-acl/order:1").await;
    for path in [node.as_str(), "/auth-acl/order:1", "/auth-acl"] {
        assert_owned_by_the_digest_user(&authed, path).await;
    }
    assert_eq!(
        anonymous.delete(&node, None).await,
        Err(ZkError::NoAuth),
        "a client without the credentials deleted a held lock's node"
    );
    let outsider = builder(&hosts, "/auth-acl").build().await;
    assert!(matches!(outsider, Err(LockError::Refused { .. })), "{outsider:?}");
    let outsider = builder(&hosts, "/auth-acl").build_lazy().unwrap();
    let taken = outsider.acquire("order:1", &ttl(5000)).await;
    assert!(matches!(taken, Err(LockError::Refused { .. })), "{taken:?}");
    assert!(!guard.is_lost());

    // Curator, with the same credentials, waits behind our lock and gets it when we release.
    let joined = hosts.join(",");
    let mut curator = blocking(move || Curator::start_with_auth(&joined, &credentials())).await;
    let path = "/auth-acl/order:1";
    curator.acquire_later(path, CuratorLock::Mutex, Duration::from_secs(20));
    eventually(10 * SECOND, "Curator queues behind our lock", || async {
        authed.list_children(path).await.map(|c| c.len()) == Ok(2)
    })
    .await;
    assert!(guard.release().await.unwrap());
    let (got, mut curator) = blocking(move || (curator.acquired(), curator)).await;
    assert!(got, "Curator did not get the lock we released");

    // And we wait behind Curator's, and get it when it releases.
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move { c.acquire("order:1", &ttl(30_000).wait(20 * SECOND)).await })
    };
    eventually(10 * SECOND, "we queue behind Curator's lock", || async {
        authed.list_children(path).await.map(|c| c.len()) == Ok(2)
    })
    .await;
    let mut curator = blocking(move || {
        curator.release(path, CuratorLock::Mutex);
        curator
    })
    .await;
    let guard = waiter.await.unwrap().unwrap();

    // Curator may delete our node (it has our rights): the lock is free again.
    let ours = only_child(&authed, path).await;
    assert_owned_by_the_digest_user(&authed, &ours).await;
    let deleted = blocking(move || curator.delete(&ours)).await;
    assert_eq!(deleted, Ok(()));
    eventually(10 * SECOND, "the lock Curator deleted is free", || async {
        !c.is_locked("order:1").await.unwrap()
    })
    .await;
    drop(guard);
}

/// Without credentials, nodes stay open to anyone (Curator's default), as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_credentials_nodes_are_open_to_anyone() {
    let ensemble = ZkEnsemble::shared();
    let hosts = ensemble.hosts();
    let c = builder(&hosts, "/auth-open").build().await.unwrap();
    let anonymous = raw(&hosts, false).await;
    let guard = c.acquire("k", &ttl(30_000)).await.unwrap();
    let node = only_child(&anonymous, "/auth-open/k").await;
    let (acls, _) = anonymous.get_acl(&node).await.unwrap();
    assert_eq!(acls.len(), 1, "{acls:?}");
    assert_eq!((acls[0].scheme(), acls[0].id()), ("world", "anyone"), "{acls:?}");
    assert!(guard.release().await.unwrap());
}

/// `zk://user:password@…` carries the credentials, percent-decoded: a session that added the
/// decoded password may touch the nodes (the ACL's hash is of that password).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_urls_carry_digest_credentials_percent_decoded() {
    let ensemble = ZkEnsemble::shared();
    let hosts = ensemble.hosts();
    let url = format!("zk://{SECURE_USER}:{ENCODED_PASSWORD}@{}", hosts.join(","));
    let shown = format!("{:?}", LockClient::builder().store(&url));
    assert!(!shown.contains("s3cret"), "{shown}");
    let c = LockClient::builder()
        .store(&url)
        .prefix("/auth-url")
        .build()
        .await
        .unwrap();
    let guard = c.acquire("k", &ttl(30_000)).await.unwrap();
    let authed = raw(&hosts, true).await;
    let node = only_child(&authed, "/auth-url/k").await;
    assert_owned_by_the_digest_user(&authed, &node).await;
    authed.delete(&node, None).await.unwrap();
    drop(guard);
}

/// Over TLS (the kit's ensemble that also requires a client certificate and digest
/// credentials), by the builder and by `zks://`: locks are taken, seen and released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_are_taken_and_released_over_tls() {
    let ensemble = blocking(ZkEnsemble::shared_secure).await;
    let certs = ensemble.certs();
    let c = builder(&ensemble.tls_hosts(), "/tls")
        .tls_root_ca(certs.ca_pem())
        .tls_client_auth(certs.client_cert_pem(), certs.client_key_pem())
        .zookeeper_auth(SECURE_USER, SECURE_PASSWORD)
        .build()
        .await
        .unwrap();
    let guard = c.acquire("k", &ttl(10_000).fencing(true)).await.unwrap();
    assert!(guard.fencing_token().is_some());
    assert!(c.holder("k").await.unwrap().is_some());

    let url = format!(
        "zks://{SECURE_USER}:{ENCODED_PASSWORD}@{}",
        ensemble.tls_hosts().join(",")
    );
    let other = LockClient::builder()
        .store(&url)
        .prefix("/tls")
        .tls_root_ca(certs.ca_pem())
        .tls_client_auth(certs.client_cert_pem(), certs.client_key_pem())
        .build()
        .await
        .unwrap();
    assert!(matches!(
        other.acquire("k", &ttl(10_000)).await,
        Err(LockError::Busy { .. })
    ));
    let waiter = {
        let other = other.clone();
        tokio::spawn(async move { other.acquire("k", &ttl(10_000).wait(10 * SECOND)).await })
    };
    assert!(guard.release().await.unwrap());
    let taken = waiter.await.unwrap().unwrap();
    assert!(taken.release().await.unwrap());
    assert!(!c.is_locked("k").await.unwrap());
}

/// `builder`'s `build()`, which must fail, within `connect_timeout` (and a second of slack):
/// what it failed with.
async fn fails_within(builder: LockClientBuilder, connect_timeout: Duration) -> LockError {
    let started = Instant::now();
    let built = builder.connect_timeout(connect_timeout).build().await;
    assert!(
        started.elapsed() < connect_timeout + SECOND,
        "{:?}",
        started.elapsed()
    );
    match built {
        Err(e) => e,
        Ok(_) => panic!("built"),
    }
}

/// A CA that did not sign the servers' certificates fails `build()` within the connect timeout,
/// saying TLS; so do a client without the client certificate the servers require and one that
/// speaks plain TCP to the TLS ports; one without the credentials the servers require is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_plain_tcp_or_no_credentials_fail_at_once() {
    let ensemble = blocking(ZkEnsemble::shared_secure).await;
    let hosts = ensemble.tls_hosts();
    let certs = ensemble.certs();
    let connect_timeout = Duration::from_secs(3);
    let wrong = builder(&hosts, "/tls-wrong")
        .tls_root_ca(certs.wrong_ca_pem())
        .tls_client_auth(certs.client_cert_pem(), certs.client_key_pem())
        .zookeeper_auth(SECURE_USER, SECURE_PASSWORD);
    let LockError::Unavailable { source } = fails_within(wrong, connect_timeout).await else {
        panic!("not Unavailable");
    };
    let said = source.to_string();
    assert!(said.contains("TLS") && said.contains(&hosts[0]), "{said}");

    let no_client_cert = builder(&hosts, "/tls-wrong")
        .tls_root_ca(certs.ca_pem())
        .zookeeper_auth(SECURE_USER, SECURE_PASSWORD);
    let LockError::Unavailable { source } = fails_within(no_client_cert, connect_timeout).await else {
        panic!("not Unavailable");
    };
    assert!(source.to_string().contains("TLS"), "{source}");

    let plain = builder(&hosts, "/tls-wrong").zookeeper_auth(SECURE_USER, SECURE_PASSWORD);
    let plain = fails_within(plain, connect_timeout).await;
    assert!(matches!(plain, LockError::Unavailable { .. }), "{plain:?}");

    let anonymous = builder(&hosts, "/tls-wrong")
        .tls_root_ca(certs.ca_pem())
        .tls_client_auth(certs.client_cert_pem(), certs.client_key_pem());
    let LockError::Refused { reason, source } = fails_within(anonymous, connect_timeout).await else {
        panic!("not Refused");
    };
    assert!(reason.contains("authentication"), "{reason}: {source}");
}
