//! The metrics a client records (feature `metrics`), read back through a debugging recorder:
//! acquires by outcome and mode, waits, hold times, renewals, losses and failures, and the
//! optional key-class label (never the key itself).

use std::sync::Mutex;
use std::time::Duration;

use lock_runtime::{LockError, LockMode};
use lock_tests::{eventually, test_builder, ttl, RedisServer, SECOND};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};

/// Everything recorded so far: a snapshot drains the recorder (counters reset, histogram
/// samples taken), so each one is added to what was seen before.
struct Seen {
    snapshotter: Snapshotter,
    /// Per series: a counter's increments, or a histogram's sample count.
    series: Mutex<Vec<(CompositeKey, u64)>>,
}

impl Seen {
    fn series(&self) -> Vec<(CompositeKey, u64)> {
        let mut seen = self.series.lock().unwrap();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let value = match value {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(samples) => samples.len() as u64,
                DebugValue::Gauge(_) => 0,
            };
            seen.push((key, value));
        }
        seen.clone()
    }

    /// The sum of `kind` `name` over the series whose labels include every one of `labels`.
    fn total(&self, kind: MetricKind, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.series()
            .into_iter()
            .filter(|(key, _)| key.kind() == kind && matches(key, name, labels))
            .map(|(_, value)| value)
            .sum()
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.total(MetricKind::Counter, name, labels)
    }

    /// How many samples histogram `name` got, over the series matching `labels`.
    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.total(MetricKind::Histogram, name, labels)
    }
}

fn matches(key: &CompositeKey, name: &str, labels: &[(&str, &str)]) -> bool {
    let key = key.key();
    key.name() == name
        && labels
            .iter()
            .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
}

/// One test, because the recorder is global to the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_records_what_its_locks_do() {
    let recorder = DebuggingRecorder::new();
    let seen = Seen {
        snapshotter: recorder.snapshotter(),
        series: Mutex::default(),
    };
    recorder.install().expect("the only recorder of this test binary");

    let server = RedisServer::spawn();
    let client = test_builder(&server.url())
        .metrics_key_class(true)
        .build()
        .await
        .unwrap();
    let exclusive = [("mode", "exclusive")];

    // Acquired, busy, and a release with its hold time.
    let guard = client.acquire("order:1", &ttl(10_000)).await.unwrap();
    assert!(matches!(
        client.acquire("order:1", &ttl(10_000)).await,
        Err(LockError::Busy { .. })
    ));
    guard.release().await.unwrap();
    assert_eq!(
        seen.counter(
            "lock_acquires_total",
            &[("outcome", "acquired"), ("mode", "exclusive")]
        ),
        1
    );
    assert_eq!(seen.counter("lock_acquires_total", &[("outcome", "busy")]), 1);
    assert_eq!(
        seen.samples("lock_acquire_seconds", &[("outcome", "acquired")]),
        1
    );
    assert_eq!(seen.samples("lock_wait_seconds", &[("outcome", "busy")]), 1);
    assert_eq!(seen.samples("lock_held_seconds", &exclusive), 1);
    // Labelled by the key's class, never by the key.
    assert_eq!(seen.counter("lock_acquires_total", &[("key_class", "order")]), 2);
    assert!(
        seen.series()
            .iter()
            .all(|(key, _)| key.key().labels().all(|l| !l.value().contains("order:1"))),
        "a label carries the whole key"
    );

    // Bad input is counted as invalid, under the same labels.
    assert!(client.acquire("", &ttl(10_000)).await.is_err());
    assert!(client.acquire("order:2", &ttl(1)).await.is_err());
    assert_eq!(seen.counter("lock_acquires_total", &[("outcome", "invalid")]), 2);

    // A share is counted apart.
    let share = client
        .acquire("prices:eu", &ttl(10_000).mode(LockMode::Shared))
        .await
        .unwrap();
    share.release().await.unwrap();
    assert_eq!(
        seen.counter(
            "lock_acquires_total",
            &[("mode", "shared"), ("outcome", "acquired")]
        ),
        1
    );

    // Renewals, and a lock lost under its holder.
    let watched = client
        .acquire("job:nightly", &ttl(150).watchdog(true))
        .await
        .unwrap();
    eventually(2 * SECOND, "the watchdog renews", || async {
        seen.counter("lock_renewals_total", &[]) >= 2
    })
    .await;
    assert!(client.force_release("job:nightly").await.unwrap());
    tokio::time::timeout(2 * SECOND, watched.lost()).await.unwrap();
    assert_eq!(seen.counter("lock_lost_total", &[("key_class", "job")]), 1);
    drop(watched);

    // Failures: a renewal and a release while Redis is frozen.
    let frozen = client
        .acquire("report:1", &ttl(3000).watchdog(true))
        .await
        .unwrap();
    server.pause();
    eventually(3 * SECOND, "a renewal fails", || async {
        seen.counter("lock_renewal_failures_total", &[]) >= 1
    })
    .await;
    assert!(frozen.release().await.is_err());
    assert!(seen.counter("lock_release_failures_total", &[]) >= 1);
    // Sent again in the background while the lease lasts, each try failing on the frozen
    // server; given up when it ends (3 s at most after its last renewal).
    assert_eq!(seen.counter("lock_releases_given_up_total", &[]), 0);
    eventually(
        8 * SECOND,
        "the failed release is given up at the end of its lease",
        || async { seen.counter("lock_releases_given_up_total", &[]) == 1 },
    )
    .await;
    assert!(
        seen.counter("lock_release_failures_total", &[]) >= 2,
        "it was sent again"
    );
    server.resume();

    // Naps: a fair waiter on Redis asks again every 300 ms while the holder keeps the lock (no
    // release names it), each nap counted; a waiter queued on ZooKeeper is woken by its watch
    // when the holder lets go after longer than the 2 s waiters used to nap, with no nap.
    let fair_holder = client.acquire("nap:1", &ttl(10_000)).await.unwrap();
    let fair = ttl(10_000).fair(true).wait(10 * SECOND);
    let fair_waiter = tokio::spawn({
        let client = client.clone();
        async move { client.acquire("nap:1", &fair).await.unwrap() }
    });
    eventually(5 * SECOND, "a fair waiter's nap ends", || async {
        seen.counter("lock_wait_naps_total", &[("store", "redis")]) >= 1
    })
    .await;
    fair_holder.release().await.unwrap();
    fair_waiter.await.unwrap().release().await.unwrap();

    let zk = lock_tests::ZkEnsemble::shared().hosts();
    let zk_client = || {
        lock_runtime::LockClient::builder()
            .zookeeper(&zk)
            .prefix("/metrics")
            .build()
    };
    let (holding, waiting) = (zk_client().await.unwrap(), zk_client().await.unwrap());
    let held = holding.acquire("nap", &ttl(10_000)).await.unwrap();
    // And a semaphore's: both its permits held.
    let two = ttl(10_000).permits(2);
    let permits = [
        holding.acquire("nap-sem", &two).await.unwrap(),
        holding.acquire("nap-sem", &two).await.unwrap(),
    ];
    let waiter = tokio::spawn({
        let waiting = waiting.clone();
        async move {
            waiting
                .acquire("nap", &ttl(10_000).wait(10 * SECOND))
                .await
                .unwrap()
        }
    });
    let permit_waiter =
        tokio::spawn(async move { waiting.acquire("nap-sem", &two.wait(10 * SECOND)).await.unwrap() });
    // The holder keeps them past the old nap (1.7 to 2 s) before letting go.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    held.release().await.unwrap();
    let [first, second] = permits;
    first.release().await.unwrap();
    waiter.await.unwrap().release().await.unwrap();
    permit_waiter.await.unwrap().release().await.unwrap();
    second.release().await.unwrap();
    assert_eq!(
        seen.counter("lock_wait_naps_total", &[("store", "zookeeper")]),
        0,
        "a waiter was woken by a nap, not by its watch"
    );
}
