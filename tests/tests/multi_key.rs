//! Multi-key locks (`LockClient::acquire_all`, `run_all`, the attribute's `keys = [...]`): every
//! key of a set or none, any order of the same keys without deadlock, one deadline for the set,
//! a key's release waking the waiter, fencing per key, nested subsets, losing any key losing the
//! set; on every deployment.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{distributed_lock, LockClient, LockError, LockMode, LockOptions, OnLost};
use lock_tests::{eventually, ttl, waiting, Dice, Target, SECOND};
use tokio::time::Instant;

lock_tests::on_every_deployment!(
    all_or_nothing_while_one_key_is_held_elsewhere,
    opposite_orders_never_deadlock_nor_overlap,
    duplicates_are_taken_once,
    nested_calls_on_a_subset_run_without_acquiring,
    one_key_freed_under_a_running_body_loses_the_set,
    a_sets_body_is_told_when_any_key_is_lost,
    a_set_never_answers_with_a_key_that_lapsed_while_it_waited,
    a_set_nested_out_of_canonical_order_is_refused_at_once,
    calls_nested_two_deep_in_a_set_never_wait_for_themselves,
    a_transfer_between_four_accounts_keeps_the_total,
    keys_sharing_a_hash_tag_are_one_set,
);

mod notified {
    use super::*;

    lock_tests::on_every_deployment_with_notices!(the_release_of_the_blocking_key_wakes_the_waiter);
}

mod fenced {
    use super::*;

    lock_tests::on_every_deployment_with_fencing!(each_key_of_a_set_has_its_own_rising_token);
}

/// Fair and shared sets: each key of the set in that mode, as a single key is (taken key by
/// key in the canonical order), where the store offers the mode.
mod modes {
    use super::*;

    lock_tests::on_every_deployment_with_one_counter!(
        shared_sets_share_and_hold_a_writer_back,
        fair_sets_are_served_in_the_order_they_came,
    );
}

/// A set of semaphores: a permit of each key.
mod permits {
    use super::*;

    lock_tests::on_every_deployment_with_permits!(
        a_semaphore_set_holds_a_permit_of_each_key,
        a_set_of_locks_over_a_semaphores_key_is_told_the_count,
    );
}

async fn all_or_nothing_while_one_key_is_held_elsewhere(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let held = other.acquire("set:b", &ttl(10_000)).await.unwrap();
    let refused = c.acquire_all(["set:a", "set:b", "set:c"], &ttl(10_000)).await;
    assert!(matches!(refused, Err(LockError::Busy { .. })), "{refused:?}");
    // Nothing of the set stays taken: "set:a" (before the refused key) was given back.
    for key in ["set:a", "set:c"] {
        assert!(!c.is_locked(key).await.unwrap(), "{key} left taken");
    }
    // A wait that runs out gives back just the same.
    let started = Instant::now();
    let waited = c
        .acquire_all(
            ["set:c", "set:b", "set:a"],
            &ttl(10_000).wait(Duration::from_millis(300)),
        )
        .await;
    assert!(matches!(waited, Err(LockError::Busy { .. })), "{waited:?}");
    assert!(
        started.elapsed() < 3 * SECOND,
        "one deadline for the set: {:?}",
        started.elapsed()
    );
    for key in ["set:a", "set:c"] {
        assert!(!c.is_locked(key).await.unwrap(), "{key} left taken");
    }
    held.release().await.unwrap();
    let all = c
        .acquire_all(["set:a", "set:b", "set:c"], &ttl(10_000))
        .await
        .unwrap();
    assert_eq!(all.keys().collect::<Vec<_>>(), ["set:a", "set:b", "set:c"]);
    assert!(all.release().await.unwrap());
    for key in ["set:a", "set:b", "set:c"] {
        assert!(!c.is_locked(key).await.unwrap());
    }
}

/// Two callers of two clients take the same two keys in opposite orders, 200 rounds each with
/// a wait: both finish every round (no deadlock), and never are both inside.
async fn opposite_orders_never_deadlock_nor_overlap(t: Target) {
    const ROUNDS: usize = 200;
    let clients = [t.client(), t.other_client().await];
    let inside = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, client)| {
            let inside = Arc::clone(&inside);
            tokio::spawn(async move {
                let keys = if i == 0 {
                    ["set:x", "set:y"]
                } else {
                    ["set:y", "set:x"]
                };
                let options = ttl(10_000).wait(Duration::from_secs(30));
                for _ in 0..ROUNDS {
                    client
                        .run_all(keys, &options, async {
                            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "both inside");
                            tokio::task::yield_now().await;
                            inside.fetch_sub(1, Ordering::SeqCst);
                        })
                        .await
                        .expect("every round within its wait: no deadlock");
                }
            })
        })
        .collect();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("no deadlock")
            .unwrap();
    }
}

/// Keys that start with the same `{tag}` (one Cluster slot: one script there too) and keys of
/// different slots are sets alike.
async fn keys_sharing_a_hash_tag_are_one_set(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let tagged = c
        .acquire_all(["{acct}:1", "{acct}:2"], &ttl(10_000))
        .await
        .unwrap();
    let refused = other
        .acquire_all(["{acct}:2", "set:tag-other"], &ttl(10_000))
        .await;
    assert!(matches!(refused, Err(LockError::Busy { .. })), "{refused:?}");
    assert!(!other.is_locked("set:tag-other").await.unwrap());
    assert!(tagged.release().await.unwrap());
}

async fn duplicates_are_taken_once(t: Target) {
    let c = t.client();
    let guard = c
        .acquire_all(["set:dup", "set:dup2", "set:dup"], &ttl(10_000))
        .await
        .unwrap();
    assert_eq!(guard.keys().collect::<Vec<_>>(), ["set:dup", "set:dup2"]);
    assert!(
        guard.release().await.unwrap(),
        "each taken once, each ours to give back"
    );
}

async fn the_release_of_the_blocking_key_wakes_the_waiter(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let holder = c.acquire("set:w2", &ttl(60_000)).await.unwrap();
    let waiter = tokio::spawn({
        let other = other.clone();
        async move {
            let got = other
                .acquire_all(["set:w1", "set:w2"], &ttl(10_000).wait(Duration::from_secs(30)))
                .await;
            (got, Instant::now())
        }
    });
    eventually(5 * SECOND, "the waiter waits for set:w2", || async {
        other.waiting("set:w2").unwrap() == 1
    })
    .await;
    t.refused_waiter("set:w2").await;
    let released_at = Instant::now();
    assert!(holder.release().await.unwrap());
    let (got, at) = waiter.await.unwrap();
    lock_tests::assert_woken_by_the_release(at - released_at);
    got.unwrap().release().await.unwrap();
}

async fn each_key_of_a_set_has_its_own_rising_token(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let options = ttl(10_000).fencing(true);
    let first = c.acquire_all(["set:f1", "set:f2"], &options).await.unwrap();
    let before = [
        first.fencing_token_for("set:f1"),
        first.fencing_token_for("set:f2"),
    ];
    assert!(before.iter().all(Option::is_some), "{before:?}");
    assert_eq!(first.fencing_token_for("set:other"), None);
    first.release().await.unwrap();
    let (after, inside) = other
        .run_all(["set:f2", "set:f1"], &options, async {
            let info = lock_runtime::current().unwrap();
            (
                [info.fencing_token_for("set:f1"), info.fencing_token_for("set:f2")],
                info.keys().map(str::to_owned).collect::<Vec<_>>(),
            )
        })
        .await
        .unwrap();
    assert_eq!(inside, ["set:f1", "set:f2"]);
    for (b, a) in before.iter().zip(&after) {
        assert!(a > b, "per key: {after:?} after {before:?}");
    }
}

/// Readers of a set share every key of it, whatever order they name it in; a writer of one of
/// its keys, and a writer's set, wait until the last reader of that key leaves.
async fn shared_sets_share_and_hold_a_writer_back(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let read = ttl(10_000).mode(LockMode::Shared);
    let first = c.acquire_all(["set:r1", "set:r2"], &read).await.unwrap();
    let second = other.acquire_all(["set:r2", "set:r1"], &read).await.unwrap();
    let refused = other.acquire("set:r2", &ttl(10_000)).await;
    assert!(matches!(refused, Err(LockError::Busy { .. })), "{refused:?}");
    let before = waiting(&other, "set:r1");
    let writer = tokio::spawn({
        let other = other.clone();
        async move {
            other
                .acquire_all(["set:r1", "set:r2"], &ttl(10_000).wait(Duration::from_secs(30)))
                .await
        }
    });
    lock_tests::joined_line(&other, "set:r1", before).await;
    assert!(first.release().await.unwrap());
    assert!(!writer.is_finished(), "the second reader still holds both keys");
    assert!(second.release().await.unwrap());
    let writer = tokio::time::timeout(10 * SECOND, writer)
        .await
        .expect("the writer gets in once the readers left")
        .unwrap()
        .unwrap();
    let reader = c.acquire_all(["set:r2"], &read).await;
    assert!(matches!(reader, Err(LockError::Busy { .. })), "{reader:?}");
    assert!(writer.release().await.unwrap());
}

/// Fair sets of the same keys, named in either order, get in in the order their callers came,
/// each behind the holder of one of the keys.
async fn fair_sets_are_served_in_the_order_they_came(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let holder = c.acquire("set:fa", &ttl(30_000)).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let fair = ttl(10_000).fair(true).wait(Duration::from_secs(30));
    let mut waiters = Vec::new();
    for (n, (client, keys)) in [
        (other.clone(), ["set:fa", "set:fb"]),
        (c.clone(), ["set:fb", "set:fa"]),
        (other.clone(), ["set:fb", "set:fa"]),
    ]
    .into_iter()
    .enumerate()
    {
        let before = waiting(&client, "set:fa");
        let (order, fair) = (Arc::clone(&order), fair.clone());
        waiters.push(tokio::spawn({
            let client = client.clone();
            async move {
                client
                    .run_all(keys, &fair, async {
                        order.lock().unwrap().push(n);
                    })
                    .await
            }
        }));
        // In line behind the one before it: the canonical order's first key is "set:fa".
        lock_tests::joined_line(&client, "set:fa", before).await;
    }
    assert!(holder.release().await.unwrap());
    for waiter in waiters {
        tokio::time::timeout(20 * SECOND, waiter)
            .await
            .expect("every fair set gets in")
            .unwrap()
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
}

/// A set with `permits` holds a permit of each key: as many holders of the same set as permits,
/// and one more is refused until a holder leaves.
async fn a_semaphore_set_holds_a_permit_of_each_key(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let two = ttl(10_000).permits(2);
    let first = c.acquire_all(["set:p1", "set:p2"], &two).await.unwrap();
    let second = other.acquire_all(["set:p2", "set:p1"], &two).await.unwrap();
    let permits: BTreeSet<Option<u32>> = [first.permit(), second.permit()].into_iter().collect();
    assert_eq!(permits.len(), 2, "distinct permits of the first key: {permits:?}");
    // Each key's permit, by key: distinct per key between the two holders.
    for key in ["set:p1", "set:p2"] {
        let each: BTreeSet<Option<u32>> = [first.permit_for(key), second.permit_for(key)]
            .into_iter()
            .collect();
        assert!(
            each.iter().all(Option::is_some) && each.len() == 2,
            "{key}: {each:?}"
        );
    }
    assert_eq!(first.permit_for("set:p1"), first.permit());
    assert_eq!(first.permit_for("set:elsewhere"), None);
    let inside = other_set_permits(&c, &two).await;
    assert!(
        inside.iter().all(Option::is_none),
        "every permit is taken: {inside:?}"
    );
    let third = c.acquire_all(["set:p1", "set:p2"], &two).await;
    assert!(matches!(third, Err(LockError::Busy { .. })), "{third:?}");
    // The refused set gave back the permit of "set:p1" it may have taken: one leaving lets it in.
    assert!(second.release().await.unwrap());
    let third = c.acquire_all(["set:p1", "set:p2"], &two).await.unwrap();
    assert!(third.release().await.unwrap());
    assert!(first.release().await.unwrap());
}

/// What `current().permit_for(key)` says inside a set of semaphores `c` takes (with `wait` 0:
/// `[None, None]` when the set is refused).
async fn other_set_permits(c: &LockClient, options: &LockOptions) -> [Option<u32>; 2] {
    c.run_all(["set:p2", "set:p1"], options, async {
        let info = lock_runtime::current().expect("inside");
        [info.permit_for("set:p1"), info.permit_for("set:p2")]
    })
    .await
    .unwrap_or([None, None])
}

/// A set of locks naming a key a semaphore holds is refused as a single lock is: with
/// `InvalidOptions` naming both counts, whether it would wait or not, and nothing taken.
async fn a_set_of_locks_over_a_semaphores_key_is_told_the_count(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let permit = c.acquire("set:sem", &ttl(10_000).permits(3)).await.unwrap();
    for wait in [Duration::ZERO, Duration::from_millis(300)] {
        let refused = other
            .acquire_all(["set:sem", "set:sem-other"], &ttl(10_000).wait(wait))
            .await;
        assert!(
            matches!(&refused, Err(LockError::InvalidOptions { reason }) if reason.contains("3 permits")),
            "{refused:?}"
        );
        assert!(!other.is_locked("set:sem-other").await.unwrap());
    }
    assert!(permit.release().await.unwrap());
}

async fn nested_calls_on_a_subset_run_without_acquiring(t: Target) {
    let c = t.client();
    let options = ttl(10_000);
    let ran = c
        .run_all(["set:n1", "set:n2", "set:n3"], &options, async {
            let subset = c.run_all(["set:n3", "set:n1"], &options, async { 1 }).await;
            let one = c.run("set:n2", &options, async { 2 }).await;
            (subset.unwrap(), one.unwrap())
        })
        .await
        .unwrap();
    assert_eq!(ran, (1, 2));
    assert!(
        !c.is_locked("set:n2").await.unwrap(),
        "released once, by the outermost call"
    );
}

async fn one_key_freed_under_a_running_body_loses_the_set(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    // Renewed every second: the freed key is found gone at the next renewal, long before the
    // other key's lease could end under load.
    let options = ttl(3000).watchdog(true);
    let body_ran_on = Arc::new(AtomicUsize::new(0));
    let run = tokio::spawn({
        let (c, ran) = (c.clone(), Arc::clone(&body_ran_on));
        async move {
            c.run_all(["set:l1", "set:l2"], &options, async {
                loop {
                    ran.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
        }
    });
    eventually(5 * SECOND, "the body runs", || async {
        body_ran_on.load(Ordering::SeqCst) > 0
    })
    .await;
    assert!(other.force_release("set:l2").await.unwrap());
    let outcome = tokio::time::timeout(10 * SECOND, run)
        .await
        .expect("stopped")
        .unwrap();
    assert!(
        matches!(outcome, Err(LockError::Lost { ref key }) if key == "set:l2"),
        "{outcome:?}"
    );
    assert!(
        !c.is_locked("set:l1").await.unwrap(),
        "the set's other lock was given back"
    );
}

/// `current().is_lost()` and `current().lost()` inside a set's body say the set is lost when
/// any key is, not only the first: the guide tells a continuing body to check it before each
/// write.
async fn a_sets_body_is_told_when_any_key_is_lost(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let options = ttl(3000).watchdog(true).on_lost(OnLost::Continue);
    let (freed_tx, freed_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn({
        let c = c.clone();
        async move {
            c.run_all(["set:k1", "set:k2"], &options, async move {
                let info = lock_runtime::current().expect("inside the set");
                assert!(!info.is_lost());
                freed_rx.await.expect("the second key is freed");
                // Told within a renewal (1 s) or two, long before the first key's lease ends.
                tokio::time::timeout(5 * SECOND, info.lost())
                    .await
                    .expect("current().lost() resolves when the second key is lost");
                info.is_lost()
            })
            .await
        }
    });
    eventually(5 * SECOND, "the set is held", || async {
        other.is_locked("set:k2").await.unwrap()
    })
    .await;
    assert!(other.force_release("set:k2").await.unwrap());
    freed_tx.send(()).unwrap();
    let seen = tokio::time::timeout(10 * SECOND, run)
        .await
        .expect("ends")
        .unwrap();
    assert!(matches!(seen, Ok(true)), "{seen:?}");
}

/// A set that waits for its later key keeps the keys it took: without the watchdog, with a
/// lease shorter than the wait, the first key does not lapse to a third client meanwhile, and
/// the set answers `Ok` only holding every key.
async fn a_set_never_answers_with_a_key_that_lapsed_while_it_waited(t: Target) {
    let (c, other, third) = (t.client(), t.other_client().await, t.other_client().await);
    let lease = ttl(1000);
    let blocker = other.acquire("set:w2", &ttl(10_000)).await.unwrap();
    let set = tokio::spawn({
        let c = c.clone();
        async move {
            c.acquire_all(["set:w1", "set:w2"], &lease.wait(Duration::from_secs(8)))
                .await
        }
    });
    eventually(5 * SECOND, "the set took its first key", || async {
        third.is_locked("set:w1").await.unwrap()
    })
    .await;
    let took_first = Instant::now();
    let intruder = tokio::spawn({
        let third = third.clone();
        async move {
            third
                .acquire("set:w1", &ttl(10_000).wait(Duration::from_secs(20)))
                .await
        }
    });
    // Twice the lease passes while the set waits for "set:w2".
    tokio::time::sleep_until(took_first + Duration::from_millis(2000)).await;
    assert!(
        !intruder.is_finished(),
        "a third client took the set's first key while it waited: {:?}",
        intruder.await
    );
    assert!(blocker.release().await.unwrap());
    let both = tokio::time::timeout(10 * SECOND, set)
        .await
        .expect("answers")
        .unwrap()
        .unwrap();
    assert!(!both.is_lost(), "the set answered with a lost key: {both:?}");
    assert!(!intruder.is_finished(), "the first key is still the set's");
    assert!(both.release().await.unwrap());
    let intruder = tokio::time::timeout(10 * SECOND, intruder)
        .await
        .expect("gets it")
        .unwrap();
    intruder.unwrap().release().await.unwrap();
}

/// A set nested in a call that holds a later key of it than one it must take could wait in a
/// cycle with another caller's set (which takes them in order): refused at once, naming both
/// calls; held keys that all come first are fine (the rest are taken after them, in order).
async fn a_set_nested_out_of_canonical_order_is_refused_at_once(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let options = ttl(10_000).wait(Duration::from_secs(4));
    let (inside_tx, inside_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let t1 = tokio::spawn({
        let (c, options) = (c.clone(), options.clone());
        async move {
            c.run("set:o2", &options, async {
                inside_tx.send(()).unwrap();
                // The other caller's set is waiting for "set:o2" (it took "set:o1").
                go_rx.await.unwrap();
                c.run_all(["set:o1", "set:o2"], &options, async {}).await
            })
            .await
        }
    });
    inside_rx.await.unwrap();
    let t2 = tokio::spawn({
        let (other, options) = (other.clone(), options.clone());
        async move { other.run_all(["set:o2", "set:o1"], &options, async {}).await }
    });
    eventually(5 * SECOND, "the other set took its first key", || async {
        c.is_locked("set:o1").await.unwrap()
    })
    .await;
    go_tx.send(()).unwrap();
    let nested = tokio::time::timeout(3 * SECOND, t1)
        .await
        .expect("refused at once, not after a wait")
        .unwrap()
        .unwrap();
    match nested {
        Err(LockError::InvalidOptions { reason }) => {
            assert!(
                reason.contains("`set:o1`") && reason.contains("`set:o2`"),
                "{reason}"
            );
        }
        other => panic!("a set nested out of order: {other:?}"),
    }
    assert!(
        t2.await.unwrap().is_ok(),
        "the other set gets both keys once the outer call ends"
    );
    // In order: the held key comes first, the rest is taken after it.
    let ran = c
        .run("set:o1", &options, async {
            c.run_all(["set:o2", "set:o1"], &options, async {
                lock_runtime::current().unwrap().keys().count()
            })
            .await
        })
        .await
        .unwrap();
    assert!(matches!(ran, Ok(2)), "{ran:?}");
    assert!(!c.is_locked("set:o2").await.unwrap());
}

/// A call nested in a call that is itself nested in a set runs at once on the set's other
/// keys: it takes its turn with the set's other nested calls, not with the call it is inside.
async fn calls_nested_two_deep_in_a_set_never_wait_for_themselves(t: Target) {
    let c = t.client();
    let options = ttl(10_000);
    let ran = tokio::time::timeout(
        5 * SECOND,
        c.run_all(["set:d1", "set:d2"], &options, async {
            c.run("set:d1", &options, async {
                let one = c.run("set:d2", &options, async { 1 }).await;
                let both = c.run_all(["set:d2", "set:d1"], &options, async { 2 }).await;
                (one, both)
            })
            .await
        }),
    )
    .await
    .expect("a nested call waited for the call it is inside");
    assert!(matches!(ran, Ok(Ok((Ok(1), Ok(2))))), "{ran:?}");
}

/// Accounts in "storage" (an in-process map) read, awaited over and written back by transfers
/// in random directions: without a set lock (or with two single locks taken in request order,
/// which may deadlock) updates would be lost.
#[distributed_lock(keys = ["acct:<from>", "acct:<to>"], ttl_ms = 10000, wait_ms = 30000, client = locks)]
async fn transfer(
    locks: &LockClient,
    accounts: &Mutex<HashMap<u64, i64>>,
    from: u64,
    to: u64,
    amount: i64,
) -> Result<(), LockError> {
    let (a, b) = {
        let accounts = accounts.lock().unwrap();
        (accounts[&from], accounts[&to])
    };
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    let mut accounts = accounts.lock().unwrap();
    accounts.insert(from, a - amount);
    accounts.insert(to, b + amount);
    Ok(())
}

async fn a_transfer_between_four_accounts_keeps_the_total(t: Target) {
    let clients = [t.client(), t.other_client().await];
    let accounts = Arc::new(Mutex::new(
        (0..4).map(|a| (a, 1000)).collect::<HashMap<u64, i64>>(),
    ));
    let mut dice = Dice::new(42);
    let mut tasks = Vec::new();
    for i in 0..24 {
        let from = dice.below(4);
        let to = (from + 1 + dice.below(3)) % 4;
        let (locks, accounts) = (clients[i % 2].clone(), Arc::clone(&accounts));
        tasks.push(tokio::spawn(async move {
            // A store too slow to answer within the response timeout (a loaded CI machine)
            // fails a transfer as a user's would see it, whole: it is tried again.
            let mut tries = 0;
            loop {
                match transfer(&locks, &accounts, from, to, 10).await {
                    Err(LockError::Unavailable { .. }) if tries < 3 => tries += 1,
                    done => break done,
                }
            }
        }));
    }
    for task in tasks {
        if let Err(e) = task.await.unwrap() {
            panic!("every transfer within its wait: {e:?}");
        }
    }
    let total: i64 = accounts.lock().unwrap().values().sum();
    assert_eq!(total, 4000, "no update lost");
}

/// On one Redis a set is one script (`set.lua`), all or none: the uncontended acquire of two keys
/// costs one request, and a refused one leaves nothing taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_on_one_redis_is_taken_in_one_script() {
    let t = Target::redis().await;
    let (c, server) = (t.client(), t.server().expect("a redis-server"));
    // The rights check runs once, before the first lock.
    c.acquire("set:warm", &ttl(1000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Scripts run by hash, or by source the first time (after NOSCRIPT, which is not counted).
    let scripts_run = || async { server.command_calls("evalsha").await + server.command_calls("eval").await };
    for fencing in [false, true] {
        let (scripts, sets) = (scripts_run().await, server.command_calls("set").await);
        let both = c
            .acquire_all(["set:s1", "set:s2", "set:s3"], &ttl(10_000).fencing(fencing))
            .await
            .unwrap();
        assert_eq!(scripts_run().await - scripts, 1, "one script");
        assert_eq!(
            server.command_calls("set").await - sets,
            3,
            "its three SETs, no other"
        );
        assert_eq!(both.fencing_token_for("set:s2").is_some(), fencing);
        assert!(both.release().await.unwrap());
    }
    let held = t
        .other_client()
        .await
        .acquire("set:s3", &ttl(10_000))
        .await
        .unwrap();
    let scripts = scripts_run().await;
    let refused = c.acquire_all(["set:s1", "set:s2", "set:s3"], &ttl(10_000)).await;
    assert!(
        matches!(refused, Err(LockError::Busy { ref key }) if key == "set:s3"),
        "{refused:?}"
    );
    assert_eq!(scripts_run().await - scripts, 1, "refused in the same one script");
    assert!(!c.is_locked("set:s1").await.unwrap() && !c.is_locked("set:s2").await.unwrap());
    held.release().await.unwrap();
}

#[tokio::test]
async fn empty_and_oversized_sets_are_invalid_keys() {
    let c = LockClient::in_memory();
    let none: [&str; 0] = [];
    assert!(matches!(
        c.acquire_all(none, &ttl(1000)).await,
        Err(LockError::InvalidKey { .. })
    ));
    let many: Vec<String> = (0..=lock_runtime::MAX_KEYS).map(|i| format!("k{i}")).collect();
    assert!(matches!(
        c.acquire_all(&many, &ttl(1000)).await,
        Err(LockError::InvalidKey { .. })
    ));
    assert!(matches!(
        c.run_all(&many, &ttl(1000), async {}).await,
        Err(LockError::InvalidKey { .. })
    ));
    // 64 keys, and a duplicate more, are fine.
    let mut most = many[..lock_runtime::MAX_KEYS].to_vec();
    most.push(most[0].clone());
    c.acquire_all(&most, &ttl(1000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
