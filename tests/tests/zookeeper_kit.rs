//! Self-tests of the test kit's ZooKeeper ensemble and its Curator program: three servers
//! serve and elect a leader, a killed leader is followed by another, and Curator's mutex takes
//! and gives back a lock on it.
//!
//! ```text
//! cargo test -p lock-tests --test zookeeper_kit
//! ```

use std::time::Duration;

use lock_tests::{Curator, CuratorLock, ZkEnsemble};

#[test]
fn an_ensemble_serves_and_elects_another_leader_when_its_leader_dies() {
    let mut ensemble = ZkEnsemble::spawn();
    let leader = ensemble.wait_for_leader();
    ensemble.kill(leader);
    let next = ensemble.wait_for_leader();
    assert_ne!(next, leader);
    ensemble.restart(leader);
    let all: Vec<usize> = (0..3).collect();
    ensemble.wait_ready(&all);
}

#[test]
fn curator_takes_and_gives_back_its_mutex_on_the_ensemble() {
    let ensemble = ZkEnsemble::shared();
    let hosts = ensemble.hosts().join(",");
    let mut a = Curator::start(&hosts);
    let mut b = Curator::start(&hosts);
    assert!(a.acquire("/kit/m", CuratorLock::Mutex, Duration::ZERO));
    assert!(!b.acquire("/kit/m", CuratorLock::Mutex, Duration::from_millis(100)));
    let held = a.children("/kit/m");
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(
        held[0].starts_with("_c_") && held[0].contains("-lock-"),
        "{held:?}"
    );
    a.release("/kit/m", CuratorLock::Mutex);
    assert!(b.acquire("/kit/m", CuratorLock::Mutex, Duration::from_secs(5)));
    b.release("/kit/m", CuratorLock::Mutex);
}
