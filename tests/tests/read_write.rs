//! Read-write locks (`LockMode::Shared` beside the default exclusive mode): many readers or one
//! writer, writers not starved by readers, shares that expire, renew and are lost one by one,
//! wake-ups in both directions, on every deployment that offers them (RedLock refuses them).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::redis::AsyncCommands;
use lock_runtime::{LockClient, LockError, LockMode, LockOptions};
use lock_tests::{assert_woken_by_the_release, eventually, ttl, Target, SECOND};
use std::time::Instant;
use tokio::sync::Barrier;

lock_tests::on_every_deployment_with_one_counter!(
    readers_hold_the_lock_together,
    a_writer_excludes_readers_and_readers_exclude_writers,
    readers_and_writers_never_overlap_under_contention,
    a_crashed_readers_share_expires_on_its_own,
    a_shorter_extend_never_shortens_a_share,
    a_waiting_writer_keeps_new_readers_out,
    a_writer_is_not_starved_by_a_stream_of_readers,
    the_last_readers_release_wakes_a_waiting_writer,
    a_writers_release_wakes_every_waiting_reader,
    the_watchdog_renews_shares_and_a_lost_share_stops_its_body,
    a_shared_call_inside_an_exclusive_one_runs_but_not_the_reverse,
    a_reader_with_fencing_reads_the_last_writers_token,
    holder_lists_the_readers,
    a_writer_that_gives_up_lets_readers_in_at_once,
);

fn read(ms: u64) -> LockOptions {
    ttl(ms).mode(LockMode::Shared)
}

async fn readers_hold_the_lock_together(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let a = c.acquire("prices", &read(10_000)).await.unwrap();
    let b = other.acquire("prices", &read(10_000)).await.unwrap();
    let again = c.acquire("prices", &read(10_000)).await.unwrap();
    assert!(c.is_locked("prices").await.unwrap());
    // Eight readers in their bodies at the same time: each waits at the barrier until all are in.
    let inside = Arc::new(Barrier::new(8));
    let readers = (0..8).map(|i| {
        let (client, inside) = (
            if i % 2 == 0 { c.clone() } else { other.clone() },
            Arc::clone(&inside),
        );
        tokio::spawn(async move {
            client
                .run("prices", &read(10_000).wait(Duration::from_secs(5)), async move {
                    tokio::time::timeout(5 * SECOND, inside.wait()).await.is_ok()
                })
                .await
        })
    });
    for reader in futures_util::future::join_all(readers).await {
        assert!(reader.unwrap().unwrap(), "a reader waited alone at the barrier");
    }
    for guard in [a, b, again] {
        assert!(
            guard.release().await.unwrap(),
            "each share is its own, released once"
        );
    }
    assert!(
        !c.is_locked("prices").await.unwrap(),
        "the last share took the lock with it"
    );
}

async fn a_writer_excludes_readers_and_readers_exclude_writers(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let writer = c.acquire("catalogue", &ttl(10_000)).await.unwrap();
    assert!(matches!(
        other.acquire("catalogue", &read(10_000)).await,
        Err(LockError::Busy { .. })
    ));
    writer.release().await.unwrap();
    let reader = other.acquire("catalogue", &read(10_000)).await.unwrap();
    for options in [ttl(10_000), ttl(10_000).fencing(true)] {
        assert!(
            matches!(
                c.acquire("catalogue", &options).await,
                Err(LockError::Busy { .. })
            ),
            "a writer got in beside a reader ({options:?})"
        );
    }
    assert!(reader.release().await.unwrap());
    c.acquire("catalogue", &ttl(10_000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Readers and writers of several clients take turns on one key; a shared tally checks that no
/// writer ever overlaps anyone, while readers do overlap.
async fn readers_and_writers_never_overlap_under_contention(t: Target) {
    let clients = [t.client(), t.other_client().await];
    let readers_in = Arc::new(AtomicUsize::new(0));
    let writers_in = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let tasks = (0..12).map(|i| {
        let client = clients[i % 2].clone();
        let (readers_in, writers_in, most_readers) = (
            Arc::clone(&readers_in),
            Arc::clone(&writers_in),
            Arc::clone(&most_readers),
        );
        tokio::spawn(async move {
            let writer = i % 4 == 0;
            for _ in 0..6 {
                let options = if writer { ttl(10_000) } else { read(10_000) };
                let (readers_in, writers_in, most_readers) = (&readers_in, &writers_in, &most_readers);
                client
                    .run("tally", &options.wait(Duration::from_secs(30)), async move {
                        if writer {
                            assert_eq!(writers_in.fetch_add(1, Ordering::SeqCst), 0, "two writers");
                            assert_eq!(readers_in.load(Ordering::SeqCst), 0, "a writer beside readers");
                            tokio::time::sleep(Duration::from_millis(3)).await;
                            writers_in.fetch_sub(1, Ordering::SeqCst);
                        } else {
                            let now = readers_in.fetch_add(1, Ordering::SeqCst) + 1;
                            most_readers.fetch_max(now, Ordering::SeqCst);
                            assert_eq!(writers_in.load(Ordering::SeqCst), 0, "a reader beside a writer");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            readers_in.fetch_sub(1, Ordering::SeqCst);
                        }
                    })
                    .await
                    .unwrap();
            }
        })
    });
    for task in futures_util::future::join_all(tasks).await {
        task.unwrap();
    }
    assert!(
        most_readers.load(Ordering::SeqCst) >= 2,
        "readers never shared the lock"
    );
}

async fn a_crashed_readers_share_expires_on_its_own(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let staying = c.acquire("report", &read(10_000)).await.unwrap();
    // A reader that stops renewing without giving its share back (its process froze or died):
    // leaked, so no release is ever sent.
    std::mem::forget(other.acquire("report", &read(300)).await.unwrap());
    assert_eq!(c.holder("report").await.unwrap().unwrap().readers().len(), 2);
    eventually(3 * SECOND, "the crashed reader's share expires", || async {
        c.holder("report")
            .await
            .unwrap()
            .is_some_and(|h| h.readers().len() == 1)
    })
    .await;
    // The lock stays the other reader's until it leaves, and is then free at once.
    assert!(matches!(
        c.acquire("report", &ttl(10_000)).await,
        Err(LockError::Busy { .. })
    ));
    staying.release().await.unwrap();
    c.acquire("report", &ttl(10_000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Issue 23: a share's lease, like an exclusive lock's, is only ever lengthened: a shorter
/// `extend` after a longer one leaves the longer one standing in the readers' hash and in the
/// reader's validity (before, it cut the share to 300 ms while the reader went on believing in
/// 60 s, and a writer got in beside it).
async fn a_shorter_extend_never_shortens_a_share(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let share = other.acquire("index", &read(300)).await.unwrap();
    share.extend(Duration::from_secs(60)).await.unwrap();
    share.extend(Duration::from_millis(300)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await; // past both the ttl and the short extend
    assert!(!share.is_lost());
    assert!(matches!(
        c.acquire("index", &ttl(10_000)).await,
        Err(LockError::Busy { .. })
    ));
    assert!(share.release().await.unwrap());
    c.acquire("index", &ttl(10_000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

async fn a_waiting_writer_keeps_new_readers_out(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let reader = c.acquire("rates", &read(60_000)).await.unwrap();
    let writer = lock_tests::spawn_waiter(other.clone(), "rates", Duration::from_secs(30));
    // Once the writer has asked (and claimed its turn), a new reader is refused, although only
    // readers hold the lock.
    until_new_readers_are_refused(&c, "rates").await;
    let released = Instant::now();
    reader.release().await.unwrap();
    let (got_it, guard) = writer.await.unwrap();
    assert_claimant_woken_by_the_release(got_it - released);
    guard.unwrap().release().await.unwrap();
    // The writer is done: readers enter again.
    c.acquire("rates", &read(10_000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Readers that always overlap (each enters before the last leaves) would keep a writer out
/// for ever if new readers could always join; the writer gets in within a few reads.
async fn a_writer_is_not_starved_by_a_stream_of_readers(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let stop = Arc::new(AtomicBool::new(false));
    let first_in = Arc::new(Barrier::new(5));
    let readers: Vec<_> = (0..4)
        .map(|i| {
            // All on one client, the writer on another: the readers' own client queues nobody
            // behind the writer, so only writer preference lets it in.
            let (client, stop, first_in) = (c.clone(), Arc::clone(&stop), Arc::clone(&first_in));
            tokio::spawn(async move {
                let mut reads = 0;
                while !stop.load(Ordering::SeqCst) {
                    let options = read(10_000).wait(Duration::from_secs(30));
                    let guard = client.acquire("menu", &options).await.unwrap();
                    if reads == 0 {
                        first_in.wait().await;
                    }
                    reads += 1;
                    tokio::time::sleep(Duration::from_millis(40 + 10 * i)).await;
                    guard.release().await.unwrap();
                }
                reads
            })
        })
        .collect();
    first_in.wait().await; // all four readers are in: the lock is never free from here on
    let asked = Instant::now();
    let writer = other
        .acquire("menu", &ttl(10_000).wait(Duration::from_secs(20)))
        .await
        .expect("the writer was starved by the readers");
    let waited = asked.elapsed();
    stop.store(true, Ordering::SeqCst);
    writer.release().await.unwrap();
    for reader in readers {
        assert!(reader.await.unwrap() >= 1);
    }
    // Bounded by the readers' hold (≤ 70 ms) plus a waiting writer's nap (≤ 300 ms), with
    // generous room for a loaded machine; without writer preference it would wait 20 s.
    assert!(waited < 5 * SECOND, "the writer waited {waited:?}");
}

async fn the_last_readers_release_wakes_a_waiting_writer(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let first = c.acquire("stock", &read(60_000)).await.unwrap();
    let second = other.acquire("stock", &read(60_000)).await.unwrap();
    let writer = lock_tests::spawn_waiter(other.clone(), "stock", Duration::from_secs(30));
    eventually(2 * SECOND, "the writer waits", || async {
        other.waiting("stock").unwrap() == 1
    })
    .await;
    first.release().await.unwrap();
    // One reader left; the other still reads, and keeps every writer out.
    assert_eq!(c.holder("stock").await.unwrap().unwrap().readers().len(), 1);
    assert!(matches!(
        c.acquire("stock", &ttl(10_000)).await,
        Err(LockError::Busy { .. })
    ));
    let released = Instant::now();
    second.release().await.unwrap();
    let (got_it, guard) = writer.await.unwrap();
    assert_claimant_woken_by_the_release(got_it - released);
    guard.unwrap().release().await.unwrap();
}

/// Waits until a waiting writer has claimed its turn on `key`: a new reader is then refused,
/// although only readers hold the lock.
async fn until_new_readers_are_refused(c: &LockClient, key: &str) {
    eventually(
        3 * SECOND,
        "a new reader is refused while the writer waits",
        || async {
            match c.acquire(key, &read(10_000)).await {
                Ok(guard) => {
                    guard.release().await.unwrap();
                    false
                }
                Err(LockError::Busy { .. }) => true,
                Err(e) => panic!("{e}"),
            }
        },
    )
    .await;
}

/// A writer that claimed its turn asks again at least every 255 ms (its claim must not lapse),
/// so "woken by the release" means well before that: the release's wake-up takes a round trip.
fn assert_claimant_woken_by_the_release(handoff: Duration) {
    assert!(
        handoff < Duration::from_millis(200),
        "the waiting writer came on its own timer, not woken by the last reader's release: {handoff:?}"
    );
}

async fn a_writers_release_wakes_every_waiting_reader(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let writer = c.acquire("board", &ttl(60_000)).await.unwrap();
    let inside = Arc::new(Barrier::new(4));
    let readers: Vec<_> = (0..4)
        .map(|i| {
            let (client, inside) = (if i < 3 { other.clone() } else { c.clone() }, Arc::clone(&inside));
            tokio::spawn(async move {
                let options = read(10_000).wait(Duration::from_secs(30));
                client
                    .run("board", &options, async move {
                        let got_it = Instant::now();
                        // All four in at once: none waits for another to leave.
                        let together = tokio::time::timeout(5 * SECOND, inside.wait()).await.is_ok();
                        (got_it, together)
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    eventually(2 * SECOND, "the readers wait", || async {
        // (In memory both handles are one client, which sees all four.)
        other.waiting("board").unwrap() >= 3 && c.waiting("board").unwrap() >= 1
    })
    .await;
    let released = Instant::now();
    writer.release().await.unwrap();
    for reader in readers {
        let (got_it, together) = reader.await.unwrap();
        assert!(together, "the readers did not share the lock");
        assert_woken_by_the_release(got_it - released);
    }
}

async fn the_watchdog_renews_shares_and_a_lost_share_stops_its_body(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let options = read(300).watchdog(true);
    let kept = c
        .run("feed", &options, async {
            tokio::time::sleep(Duration::from_millis(900)).await; // three ttls
            lock_runtime::current().is_some_and(|lock| !lock.is_lost())
        })
        .await
        .unwrap();
    assert!(kept, "the watchdog did not keep the share");
    // A share deleted under its holder (an operator's force release): the holder finds out at
    // its next renewal and its body is stopped.
    let started = Instant::now();
    let lost = c
        .run("feed", &options, async {
            assert!(other.force_release("feed").await.unwrap());
            tokio::time::sleep(Duration::from_secs(30)).await;
        })
        .await;
    assert!(matches!(lost, Err(LockError::Lost { .. })), "{lost:?}");
    assert!(started.elapsed() < 5 * SECOND);
}

async fn a_shared_call_inside_an_exclusive_one_runs_but_not_the_reverse(t: Target) {
    let c = t.client();
    let inner = c
        .run("ledger", &ttl(10_000), async {
            c.run("ledger", &read(10_000), async { "read under the write lock" })
                .await
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(inner, "read under the write lock");
    let upgrade = c
        .run("ledger", &read(10_000), async {
            c.run("ledger", &ttl(10_000).wait(Duration::from_secs(5)), async {})
                .await
        })
        .await
        .unwrap();
    assert!(
        matches!(upgrade, Err(LockError::InvalidOptions { .. })),
        "an upgrade must fail at once, not wait for itself: {upgrade:?}"
    );
    assert!(!c.is_locked("ledger").await.unwrap());
}

async fn a_reader_with_fencing_reads_the_last_writers_token(t: Target) {
    let c = t.client();
    let writer = c.acquire("table", &ttl(10_000).fencing(true)).await.unwrap();
    let written = writer.fencing_token().unwrap();
    writer.release().await.unwrap();
    let reader = c.acquire("table", &read(10_000).fencing(true)).await.unwrap();
    assert_eq!(reader.fencing_token(), Some(written));
    reader.release().await.unwrap();
    let next = c.acquire("table", &ttl(10_000).fencing(true)).await.unwrap();
    assert!(
        next.fencing_token().unwrap() > written,
        "a share took no token of its own"
    );
    next.release().await.unwrap();
}

async fn holder_lists_the_readers(t: Target) {
    let c = t.client();
    let a = c.acquire("shelf", &read(10_000)).await.unwrap();
    let b = c.acquire("shelf", &read(5_000)).await.unwrap();
    let holder = c.holder("shelf").await.unwrap().unwrap();
    assert!(holder.is_shared());
    assert_eq!(holder.owner(), None);
    assert_eq!(holder.readers().len(), 2);
    let own = c.holder("shelf").await.unwrap();
    assert!(
        own.is_some_and(|h| h.readers().iter().all(|r| r.contains(':'))),
        "owners are <host>:<pid>"
    );
    let left = holder.remaining().unwrap();
    assert!(
        left > Duration::from_secs(5) && left <= Duration::from_secs(10),
        "{left:?}"
    );
    if let Some(server) = t.server() {
        // The data model: the readers' hash at the lock key.
        let mut raw = server.raw().await;
        let mode: Option<String> = ::redis::cmd("HGET")
            .arg("lock:{shelf}")
            .arg("mode")
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(mode.as_deref(), Some("read"));
    }
    a.release().await.unwrap();
    b.release().await.unwrap();
    assert!(c.holder("shelf").await.unwrap().is_none());
}

async fn a_writer_that_gives_up_lets_readers_in_at_once(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let reader = c.acquire("cache", &read(60_000)).await.unwrap();
    let writer = lock_tests::spawn_waiter(other.clone(), "cache", Duration::from_secs(30));
    until_new_readers_are_refused(&c, "cache").await;
    // A reader waiting behind the claim: told to try again when the writer gives up, not when
    // the claim would have lapsed (it was refused with up to 1 s to wait).
    // On the other client than the writer's: its own client's queue would pass the turn on.
    let waiting_reader = tokio::spawn({
        let c = c.clone();
        async move {
            let got = c
                .acquire("cache", &read(10_000).wait(Duration::from_secs(30)))
                .await;
            (Instant::now(), got)
        }
    });
    eventually(2 * SECOND, "the reader waits", || async {
        c.waiting("cache").unwrap() >= 1
    })
    .await;
    let gave_up = Instant::now();
    writer.abort();
    let _ = writer.await;
    let (got_it, share) = waiting_reader.await.unwrap();
    assert!(
        got_it - gave_up < Duration::from_millis(500),
        "the waiting reader was not told the claim was withdrawn: {:?}",
        got_it - gave_up
    );
    share.unwrap().release().await.unwrap();
    reader.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_read_write_locks() {
    let t = Target::redlock().await;
    let refused = t.client().acquire("prices", &read(10_000)).await;
    assert!(
        matches!(refused, Err(LockError::InvalidOptions { .. })),
        "{refused:?}"
    );
}

/// A writer refused by readers claims its turn in `<prefix>{<key>}:writers` (its token, scored
/// by the server ms when the claim lapses), and that key lives as long as the last claim:
/// `FAIR_PLACE_KEPT` (1 s) from the writer's last attempt, so no claim outlives its writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writers_claim_is_kept_for_a_second() {
    let t = Target::redis().await;
    let (c, other) = (t.client(), t.other_client().await);
    let mut raw = t.server().unwrap().raw().await;
    let writers = lock_runtime::redis::keys::LockKeys::new(lock_runtime::DEFAULT_PREFIX, "claims").writers();
    let holding = c.acquire("claims", &read(60_000)).await.unwrap();
    let writer = lock_tests::spawn_waiter(other.clone(), "claims", Duration::from_secs(30));
    until_new_readers_are_refused(&c, "claims").await;
    let claims: Vec<(String, u64)> = raw.zrange_withscores(&writers, 0, -1).await.unwrap();
    let pttl: i64 = raw.pttl(&writers).await.unwrap();
    let now_ms: u64 = ::redis::cmd("TIME")
        .query_async::<Vec<u64>>(&mut raw)
        .await
        .map(|time| time[0] * 1000 + time[1] / 1000)
        .unwrap();
    assert_eq!(claims.len(), 1, "one writer, one claim: {claims:?}");
    let kept = lock_runtime::FAIR_PLACE_KEPT.as_millis() as u64;
    assert!(
        claims[0].1 > now_ms && claims[0].1 <= now_ms + kept,
        "the claim lapses within a second: {} at {now_ms}",
        claims[0].1
    );
    assert!(
        0 < pttl && pttl <= kept as i64,
        "the key lives as its claim: {pttl} ms"
    );
    holding.release().await.unwrap();
    let (_, taken) = writer.await.unwrap();
    assert!(taken.unwrap().release().await.unwrap());
    let left: bool = raw.exists(&writers).await.unwrap();
    assert!(!left, "taking the lock ended the claim");
}

/// The waiting mark is only ever beside a lock (every release deletes it with the lock, and
/// nothing else would): a reader held back by a waiting writer's claim while no lock is at the
/// key sets none, and the writer that claimed marks the lock when it takes it, for the readers
/// its claim held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_alone_leaves_no_mark_and_the_claimant_marks_its_lock() {
    let t = Target::redis().await;
    let (c, other) = (t.client(), t.other_client().await);
    let server = t.server().unwrap();
    let mut raw = server.raw().await;
    // A writer's claim, with no lock at the key (as when its readers have just left).
    let now_ms: u64 = ::redis::cmd("TIME")
        .query_async::<Vec<String>>(&mut raw)
        .await
        .unwrap()[0]
        .parse::<u64>()
        .unwrap()
        * 1000;
    let _: () = ::redis::cmd("ZADD")
        .arg("lock:{ledger}:writers")
        .arg(now_ms + 60_000)
        .arg("a writer")
        .query_async(&mut raw)
        .await
        .unwrap();
    let scripts_before = server.command_calls("evalsha").await;
    let reader = tokio::spawn({
        let c = c.clone();
        async move {
            c.acquire("ledger", &read(10_000).wait(Duration::from_millis(300)))
                .await
        }
    });
    // Refused by the claim at its first attempt and at the one it makes once it listens.
    eventually(5 * SECOND, "the reader was refused twice", || async {
        server.command_calls("evalsha").await >= scripts_before + 2
    })
    .await;
    let mark: bool = ::redis::cmd("EXISTS")
        .arg("lock:{ledger}:waiting")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        !mark,
        "a reader refused by a claim alone marked a key that holds no lock"
    );
    assert!(matches!(reader.await.unwrap(), Err(LockError::Busy { .. })));
    let _: () = ::redis::cmd("DEL")
        .arg("lock:{ledger}:writers")
        .query_async(&mut raw)
        .await
        .unwrap();

    // A writer claims its turn behind a reader, then takes the lock when the reader leaves.
    let holding = c.acquire("ledger", &read(60_000)).await.unwrap();
    let writer = lock_tests::spawn_waiter(other.clone(), "ledger", Duration::from_secs(30));
    until_new_readers_are_refused(&c, "ledger").await;
    holding.release().await.unwrap();
    let (_, taken) = writer.await.unwrap();
    let taken = taken.unwrap();
    let mark_ttl: i64 = ::redis::cmd("PTTL")
        .arg("lock:{ledger}:waiting")
        .query_async(&mut raw)
        .await
        .unwrap();
    // Its ttl (10 s) and a second: set as it took the lock, not left from before.
    assert!(
        (10_000..=11_000).contains(&mark_ttl),
        "the claimant's lock is not marked until a second after it expires: {mark_ttl}"
    );
    assert!(taken.release().await.unwrap());
    let mark: bool = ::redis::cmd("EXISTS")
        .arg("lock:{ledger}:waiting")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(!mark, "the release left the mark behind");
}
