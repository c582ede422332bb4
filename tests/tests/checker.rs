//! The multi-process checker (`src/bin/checker/`), a short run of each cell of its matrix that
//! says something in a few seconds: every cell where the library promises no overlap (a fault of
//! a worker on one Redis, in memory, a failover with replica acknowledgement, every etcd,
//! ZooKeeper, PostgreSQL and MySQL cell) must show none, and no late body, stale write accepted or lost
//! update; the cells where the store itself can forget locks (one Redis restarted empty, a
//! failover without replica acknowledgement, a RedLock master restarted empty at once) are run
//! and their overlaps printed, never assumed to be zero (fencing must still refuse every stale
//! write where the store gives tokens). The matrix's other cell, RedLock with a delayed restart, runs only there. The
//! full matrix, by hand: `cargo run --release -p lock-tests --bin checker -- --matrix --seconds 60`.

use std::collections::HashMap;
use std::process::Command;

/// Runs the checker on one cell for `seconds` and returns its JSON report.
fn run(args: &[&str], seconds: u64) -> HashMap<String, serde_json::Value> {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("no temp dir: {e}"));
    let json = dir.path().join("report.json");
    let output = Command::new(env!("CARGO_BIN_EXE_checker"))
        .args(args)
        .args(["--seconds", &seconds.to_string()])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the checker: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    let text = std::fs::read_to_string(&json)
        .unwrap_or_else(|e| panic!("no report ({e}); {}:\n{stdout}\n{stderr}", output.status));
    let report: HashMap<String, serde_json::Value> =
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("bad report {text}: {e}"));
    assert!(
        output.status.success(),
        "{}: the run broke a promise\n{stdout}\n{stderr}",
        output.status
    );
    report
}

fn number(report: &HashMap<String, serde_json::Value>, name: &str) -> u64 {
    report
        .get(name)
        .and_then(serde_json::Value::as_u64)
        .unwrap_or_else(|| panic!("no number {name} in {report:?}"))
}

/// A cell the library promises: no overlap, no late body, no stale write, no lost update, and
/// the work went on (sections ran; after a failover or a restart of the store, every key was
/// written again: the deployment serves again). How soon a key held by a frozen, killed or
/// cut-off worker is taken again depends on which task picks it next, so that is measured by the
/// matrix, not asserted in these short runs.
fn promised(args: &[&str], seconds: u64) {
    let report = run(args, seconds);
    assert_eq!(
        report.get("promised"),
        Some(&serde_json::Value::Bool(true)),
        "{report:?}"
    );
    for field in [
        "overlaps",
        "late_bodies",
        "stale_accepted",
        "lost_updates",
        "other",
    ] {
        assert_eq!(number(&report, field), 0, "{field}: {report:?}");
    }
    assert_eq!(
        report.get("sum_drift").and_then(serde_json::Value::as_u64),
        Some(0),
        "the accounts' sum: {report:?}"
    );
    assert!(number(&report, "sections") >= 5, "the run did work: {report:?}");
    let faults = report["faults"].as_array().map_or(0, Vec::len);
    if !args.contains(&"none") {
        assert!(faults >= 1, "the fault was injected: {report:?}");
    }
    if args.contains(&"failover") || args.contains(&"restart") {
        assert_eq!(
            number(&report, "unrecovered"),
            0,
            "every key written again after each fault: {report:?}"
        );
    }
}

/// A cell where the store may forget a lock: its overlaps and late bodies are measured and
/// printed, not asserted (the exit status, which `run` checks, still requires that fencing
/// refused every stale write where the store gives tokens).
fn measured(args: &[&str], seconds: u64) {
    let report = run(args, seconds);
    assert_eq!(
        report.get("promised"),
        Some(&serde_json::Value::Bool(false)),
        "{report:?}"
    );
    assert_eq!(
        report.get("sum_drift").and_then(serde_json::Value::as_u64),
        Some(0),
        "the accounts' sum: {report:?}"
    );
    assert!(number(&report, "sections") >= 5, "the run did work: {report:?}");
    assert!(report["faults"].as_array().map_or(0, Vec::len) >= 1, "{report:?}");
    eprintln!(
        "measured {args:?}: overlaps {}, late bodies {}, stale writes accepted {}, refused by fencing {}, lost updates {}",
        number(&report, "overlaps"),
        number(&report, "late_bodies"),
        number(&report, "stale_accepted"),
        number(&report, "fenced_refused"),
        number(&report, "lost_updates")
    );
}

#[test]
fn memory_without_faults() {
    promised(&["--store", "memory", "--fault", "none"], 4);
}

#[test]
fn redis_without_faults() {
    promised(&["--store", "redis", "--fault", "none"], 4);
}

#[test]
fn redis_with_a_frozen_worker() {
    promised(&["--store", "redis", "--fault", "sigstop"], 8);
}

/// The semaphore load: every key has 2 permits, each permit's sections write to a resource of
/// their own, so two holders of one permit (or a permit outside the count) show as overlaps (an
/// `other` error).
#[test]
fn redis_semaphore_with_a_frozen_worker() {
    promised(&["--store", "redis", "--fault", "sigstop", "--permits", "2"], 8);
}

/// The set load: transfers between 16 accounts under one set lock on both, so an overlap or a
/// late body on either account loses money (the sum of the balances moves) or an update.
#[test]
fn redis_sets_with_a_frozen_worker() {
    promised(&["--store", "redis", "--fault", "sigstop", "--sets"], 8);
}

#[test]
fn mysql_sets_with_a_worker_cut_off() {
    promised(&["--store", "mysql", "--fault", "partition", "--sets"], 8);
}

#[test]
fn redis_with_a_killed_worker() {
    promised(&["--store", "redis", "--fault", "sigkill"], 6);
}

#[test]
fn redis_with_a_worker_cut_off() {
    promised(&["--store", "redis", "--fault", "partition"], 8);
}

#[test]
fn sentinel_failover_with_replica_acknowledgement() {
    promised(
        &[
            "--store",
            "sentinel",
            "--wait-for-replicas",
            "1",
            "--fault",
            "failover",
        ],
        12,
    );
}

#[test]
fn cluster_failover_with_replica_acknowledgement() {
    promised(
        &[
            "--store",
            "cluster",
            "--wait-for-replicas",
            "1",
            "--fault",
            "failover",
        ],
        10,
    );
}

#[test]
fn etcd_leader_killed() {
    // 12 s, as the Sentinel cell: at 8 s a CI run under load ended before the keys were
    // written again after the election (78 attempts in the whole run, 40 of them unavailable).
    promised(&["--store", "etcd", "--fault", "failover"], 12);
}

/// The semaphore load on etcd (2 permits a key, each permit's sections writing to a resource of
/// its own) while the leader is killed.
#[test]
fn etcd_semaphore_leader_killed() {
    promised(&["--store", "etcd", "--fault", "failover", "--permits", "2"], 12);
}

#[test]
fn etcd_with_a_frozen_worker() {
    promised(&["--store", "etcd", "--fault", "sigstop"], 8);
}

#[test]
fn etcd_with_a_worker_cut_off() {
    promised(&["--store", "etcd", "--fault", "partition"], 8);
}

#[test]
fn postgres_with_a_worker_cut_off() {
    promised(&["--store", "postgres", "--fault", "partition"], 8);
}

#[test]
fn postgres_with_a_frozen_worker() {
    promised(&["--store", "postgres", "--fault", "sigstop"], 8);
}

#[test]
fn postgres_restarted() {
    promised(&["--store", "postgres", "--fault", "restart"], 8);
}

#[test]
fn mysql_with_a_worker_cut_off() {
    promised(&["--store", "mysql", "--fault", "partition"], 8);
}

/// The semaphore load on MySQL (2 permits a key) with a worker cut off.
#[test]
fn mysql_semaphore_with_a_worker_cut_off() {
    promised(&["--store", "mysql", "--fault", "partition", "--permits", "2"], 8);
}

/// Readers and writers on MySQL (its shares are transactions of their own) with a worker cut off.
#[test]
fn mysql_readers_and_writers_with_a_worker_cut_off() {
    promised(&["--store", "mysql", "--fault", "partition", "--shared"], 8);
}

/// Fair locks on MySQL (its lines are transactions of their own) with a worker frozen.
#[test]
fn mysql_fair_with_a_frozen_worker() {
    promised(&["--store", "mysql", "--fault", "sigstop", "--fair"], 8);
}

#[test]
fn mysql_with_a_frozen_worker() {
    promised(&["--store", "mysql", "--fault", "sigstop"], 8);
}

#[test]
fn mysql_restarted() {
    // Longer than PostgreSQL's: a restart late in an 8 s run was sometimes not followed by a
    // section on every key before it ended (counted as unrecovered; never an overlap).
    promised(&["--store", "mysql", "--fault", "restart"], 12);
}

#[test]
fn redis_restarted_empty_is_measured() {
    measured(&["--store", "redis", "--fault", "restart"], 7);
}

#[test]
fn sentinel_failover_without_acknowledgement_is_measured() {
    measured(&["--store", "sentinel", "--fault", "failover"], 10);
}

#[test]
fn cluster_failover_without_acknowledgement_is_measured() {
    measured(&["--store", "cluster", "--fault", "failover"], 10);
}

#[test]
fn redlock_master_restarted_empty_is_measured() {
    measured(&["--store", "redlock", "--fault", "restart-empty"], 6);
}

#[test]
fn zookeeper_leader_killed() {
    promised(&["--store", "zookeeper", "--fault", "failover"], 8);
}

/// The semaphore load on ZooKeeper (2 permits a key) with a worker frozen past its sessions.
#[test]
fn zookeeper_semaphore_with_a_frozen_worker() {
    promised(
        &["--store", "zookeeper", "--fault", "sigstop", "--permits", "2"],
        8,
    );
}

#[test]
fn zookeeper_with_a_frozen_worker() {
    promised(&["--store", "zookeeper", "--fault", "sigstop"], 8);
}

#[test]
fn zookeeper_with_a_worker_cut_off() {
    promised(&["--store", "zookeeper", "--fault", "partition"], 8);
}
