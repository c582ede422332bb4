//! Semaphores (`LockOptions::permits`, `permits = N`): up to N holders of one key, each permit a
//! lease with its own token, watchdog, fencing and wake-up, on every deployment that offers
//! them; RedLock refuses them with the reason.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{distributed_lock, LockClient, LockError, LockMode, LockOptions};
use lock_tests::{eventually, in_line, ttl, Target, SECOND};
use tokio::time::Instant;

lock_tests::on_every_deployment_with_permits!(
    at_most_n_holders_at_once_and_n_reached,
    concurrent_holders_hold_distinct_permits,
    a_forgotten_permit_lapses_at_its_ttl,
    fencing_tokens_rise_per_key_and_so_per_permit,
    another_count_for_a_held_key_is_invalid_options_naming_both,
    holder_shows_the_permits_taken_and_by_whom,
    operators_list_permits_and_force_release_them,
    the_watchdog_renews_each_permit,
    a_nested_call_uses_the_permit_it_holds,
    a_minimum_hold_keeps_the_permit,
    a_minimum_hold_longer_than_the_lease_keeps_the_permit,
    the_attribute_takes_a_permit,
    a_call_nested_in_a_permit_in_another_mode_is_refused_at_once,
    fair_waiters_get_permits_in_the_order_they_came,
    a_holder_asking_again_queues_behind_its_clients_waiter,
);

/// Wake-ups by another client's release (not on MySQL, which has no notifications: its
/// waiters poll, `tests/tests/mysql.rs`).
mod notified {
    use super::*;

    lock_tests::on_every_deployment_with_permits_and_notices!(
        a_release_wakes_a_waiter_of_another_client,
        releases_at_once_wake_one_waiter_each,
    );
}

/// Fair waiters of two clients, queued one after another while every permit is taken, get the
/// permits in the order they came, whichever client each permit is given back by.
async fn fair_waiters_get_permits_in_the_order_they_came(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let two = permits(2, 30_000).fair(true);
    let mut held = vec![
        c.acquire("sem:fair", &two).await.unwrap(),
        other.acquire("sem:fair", &two).await.unwrap(),
    ];
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for n in 0..4 {
        let client = if n % 2 == 0 { other.clone() } else { c.clone() };
        let before = lock_tests::waiting(&client, "sem:fair");
        let (order, wait) = (Arc::clone(&order), two.clone().wait(Duration::from_secs(30)));
        waiters.push(tokio::spawn({
            let client = client.clone();
            async move {
                let guard = client.acquire("sem:fair", &wait).await;
                order.lock().unwrap().push(n);
                guard
            }
        }));
        lock_tests::joined_line(&client, "sem:fair", before).await;
    }
    // Each permit given back lets the oldest waiter in; it then gives its permit back.
    for n in 0..4 {
        assert!(held.remove(0).release().await.unwrap());
        let got = tokio::time::timeout(10 * SECOND, waiters.remove(0))
            .await
            .unwrap_or_else(|_| panic!("waiter {n} got a permit"))
            .unwrap()
            .unwrap();
        held.push(got);
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3], "in the order they came");
    for guard in held {
        guard.release().await.unwrap();
    }
}

fn permits(n: u32, ttl_ms: u64) -> LockOptions {
    ttl(ttl_ms).permits(n)
}

/// 10 tasks of two clients contend for 3 permits: never more than 3 inside at once, and 3
/// reached (each holder stays until 3 were inside together, or a deadline passed).
async fn at_most_n_holders_at_once_and_n_reached(t: Target) {
    const N: usize = 3;
    let clients = [t.client(), t.other_client().await];
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let client = clients[i % 2].clone();
            let (inside, most) = (Arc::clone(&inside), Arc::clone(&most));
            tokio::spawn(async move {
                let options = permits(N as u32, 10_000).wait(Duration::from_secs(30));
                client
                    .run("sem:cap", &options, async {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        // Stay until N were inside together (at most 2 s): N is reached
                        // whenever the store lets N in.
                        let until = Instant::now() + 2 * SECOND;
                        while most.load(Ordering::SeqCst) < N && Instant::now() < until {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
            })
        })
        .collect();
    for task in tasks {
        task.await
            .unwrap()
            .expect("every task gets a permit within its wait");
    }
    assert_eq!(most.load(Ordering::SeqCst), N, "at most N at once, and N reached");
}

async fn concurrent_holders_hold_distinct_permits(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let mut guards = Vec::new();
    for i in 0..4 {
        let client = if i % 2 == 0 { &c } else { &other };
        guards.push(client.acquire("sem:distinct", &permits(4, 10_000)).await.unwrap());
    }
    let held: BTreeSet<u32> = guards.iter().map(|g| g.permit().unwrap()).collect();
    assert_eq!(held, (0..4).collect(), "each permit once");
    let fifth = other.acquire("sem:distinct", &permits(4, 10_000)).await;
    assert!(matches!(fifth, Err(LockError::Busy { .. })), "{fifth:?}");
    // The permit given back is the one taken next.
    let freed = guards.remove(1);
    let permit = freed.permit();
    assert!(freed.release().await.unwrap());
    let again = other.acquire("sem:distinct", &permits(4, 10_000)).await.unwrap();
    assert_eq!(again.permit(), permit);
    again.release().await.unwrap();
    for guard in guards {
        assert!(guard.release().await.unwrap());
    }
    assert!(!c.is_locked("sem:distinct").await.unwrap());
}

/// A holder that gives its permit back and asks again at once, while a waiter of its own client
/// waits, takes its turn behind that waiter (not fair: a client's waiters take turns in order on
/// every store), and the waiter gets the permit the release freed.
async fn a_holder_asking_again_queues_behind_its_clients_waiter(t: Target) {
    let c = t.client();
    let options = permits(2, 60_000);
    let (first, second) = (
        c.acquire("sem:again", &options).await.unwrap(),
        c.acquire("sem:again", &options).await.unwrap(),
    );
    let waiting = permits(2, 60_000).wait(Duration::from_secs(30));
    let waiter = in_line(&c, "sem:again", waiting.clone()).await;
    t.refused_waiter("sem:again").await;
    assert!(first.release().await.unwrap());
    // Its first attempt goes out before the woken waiter's can (polled here once, at once).
    let mut again = Box::pin({
        let c = c.clone();
        async move { c.acquire("sem:again", &waiting).await }
    });
    assert!(
        futures_util::poll!(&mut again).is_pending(),
        "no permit is free for it"
    );
    let again = tokio::spawn(again);
    let got = tokio::time::timeout(10 * SECOND, waiter)
        .await
        .expect("the waiter gets the permit the release freed, not the holder asking again")
        .unwrap()
        .unwrap();
    assert!(!again.is_finished(), "the holder asking again waits its turn");
    assert!(got.release().await.unwrap());
    let again = tokio::time::timeout(10 * SECOND, again)
        .await
        .expect("its turn comes")
        .unwrap()
        .unwrap();
    again.release().await.unwrap();
    second.release().await.unwrap();
}

async fn a_release_wakes_a_waiter_of_another_client(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let first = c.acquire("sem:wake", &permits(2, 60_000)).await.unwrap();
    let second = c.acquire("sem:wake", &permits(2, 60_000)).await.unwrap();
    let waiter = in_line(
        &other,
        "sem:wake",
        permits(2, 10_000).wait(Duration::from_secs(30)),
    )
    .await;
    // Refused, it sleeps until woken (the holders' permits have a minute left).
    t.refused_waiter("sem:wake").await;
    let released_at = Instant::now();
    let permit = second.permit();
    assert!(second.release().await.unwrap());
    let guard = waiter.await.unwrap().expect("woken by the release");
    lock_tests::assert_woken_by_the_release(released_at.elapsed());
    assert_eq!(guard.permit(), permit);
    guard.release().await.unwrap();
    first.release().await.unwrap();
}

/// Two permits given back at once wake two waiters (one each), not the first waiter twice: the
/// second would otherwise sleep until its nap ends with a permit free.
async fn releases_at_once_wake_one_waiter_each(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let options = permits(2, 60_000);
    let (a, b) = (
        c.acquire("sem:both", &options).await.unwrap(),
        c.acquire("sem:both", &options).await.unwrap(),
    );
    let waiting = permits(2, 10_000).wait(Duration::from_secs(30));
    let first = in_line(&other, "sem:both", waiting.clone()).await;
    let second = in_line(&other, "sem:both", waiting).await;
    t.refused_waiter("sem:both").await;
    let released_at = Instant::now();
    let (ra, rb) = tokio::join!(a.release(), b.release());
    assert!(ra.unwrap() && rb.unwrap());
    let (first, second) = (first.await.unwrap().unwrap(), second.await.unwrap().unwrap());
    lock_tests::assert_woken_by_the_release(released_at.elapsed());
    assert_ne!(first.permit(), second.permit());
    first.release().await.unwrap();
    second.release().await.unwrap();
}

async fn a_forgotten_permit_lapses_at_its_ttl(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let kept = c.acquire("sem:crash", &permits(2, 60_000)).await.unwrap();
    // A holder that vanishes without giving its permit back (a crashed process).
    std::mem::forget(c.acquire("sem:crash", &permits(2, 300)).await.unwrap());
    let started = Instant::now();
    let guard = other
        .acquire("sem:crash", &permits(2, 5000).wait(Duration::from_secs(10)))
        .await
        .expect("the lapsed permit is taken");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert_ne!(guard.permit(), kept.permit());
    guard.release().await.unwrap();
    kept.release().await.unwrap();
}

async fn fencing_tokens_rise_per_key_and_so_per_permit(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let options = permits(2, 10_000).fencing(true);
    let mut last: [u64; 2] = [0, 0];
    let mut all = Vec::new();
    for round in 0..6 {
        let client = if round % 2 == 0 { &c } else { &other };
        let a = client.acquire("sem:fence", &options).await.unwrap();
        let b = client.acquire("sem:fence", &options).await.unwrap();
        for guard in [&a, &b] {
            let (permit, token) = (guard.permit().unwrap() as usize, guard.fencing_token().unwrap());
            assert!(
                token > last[permit],
                "permit {permit}: {token} after {}",
                last[permit]
            );
            last[permit] = token;
            all.push(token);
        }
        a.release().await.unwrap();
        b.release().await.unwrap();
    }
    assert!(
        all.windows(2).all(|w| w[1] > w[0]),
        "tokens rise per key: {all:?}"
    );
    let inside = c
        .run("sem:fence", &options, async {
            lock_runtime::current().map(|l| (l.permit(), l.fencing_token()))
        })
        .await
        .unwrap()
        .unwrap();
    assert!(inside.0.is_some() && inside.1.unwrap() > *all.last().unwrap());
}

async fn another_count_for_a_held_key_is_invalid_options_naming_both(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let held = c.acquire("sem:count", &permits(3, 10_000)).await.unwrap();
    for (asked, named) in [
        (permits(2, 10_000), "2 permits"),
        (ttl(10_000), "1 permit"),
        (
            ttl(10_000).fencing(true).wait(Duration::from_millis(100)),
            "1 permit",
        ),
        (ttl(10_000).mode(LockMode::Shared), "1 permit"),
        (
            ttl(10_000).fair(true).wait(Duration::from_millis(100)),
            "1 permit",
        ),
    ] {
        match other.acquire("sem:count", &asked).await {
            Err(LockError::InvalidOptions { reason }) => {
                assert!(reason.contains("3 permits") && reason.contains(named), "{reason}");
            }
            got => panic!("{asked:?}: {got:?}"),
        }
    }
    held.release().await.unwrap();
    // A lock held: a semaphore of the key is refused too.
    let lock = c.acquire("sem:count", &ttl(10_000)).await.unwrap();
    match other.acquire("sem:count", &permits(3, 10_000)).await {
        Err(LockError::InvalidOptions { reason }) => assert!(reason.contains("1 permit"), "{reason}"),
        got => panic!("{got:?}"),
    }
    lock.release().await.unwrap();
    // Free again: any count may take it.
    other
        .acquire("sem:count", &permits(5, 10_000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

async fn holder_shows_the_permits_taken_and_by_whom(t: Target) {
    let c = t.client();
    let a = c.acquire("sem:who", &permits(3, 10_000)).await.unwrap();
    let b = c.acquire("sem:who", &permits(3, 10_000)).await.unwrap();
    let holder = c.holder("sem:who").await.unwrap().expect("held");
    assert_eq!(holder.permits(), Some(3));
    assert_eq!(holder.permits_taken(), 2);
    let taken: Vec<u32> = holder.permit_holders().iter().map(|(p, _)| *p).collect();
    let mut expected = vec![a.permit().unwrap(), b.permit().unwrap()];
    expected.sort_unstable();
    assert_eq!(taken, expected);
    assert!(holder.permit_holders().iter().all(|(_, owner)| !owner.is_empty()));
    assert!(holder.owner().is_none() && !holder.is_shared());
    a.release().await.unwrap();
    b.release().await.unwrap();
    assert!(c.holder("sem:who").await.unwrap().is_none());
}

/// What `lockctl list`/`show` print and `lockctl release --force` does, through
/// `lock_runtime::admin`: the count and each holder's permit, and a forced release that frees
/// every permit of what was seen and lets a waiter in.
async fn operators_list_permits_and_force_release_them(t: Target) {
    use lock_runtime::admin::{Admin, ForceReleased, Holding};
    let (c, other) = (t.client(), t.other_client().await);
    let admin = Admin::new(c.clone());
    let a = c.acquire("sem:ops", &permits(2, 60_000)).await.unwrap();
    let b = c.acquire("sem:ops", &permits(2, 60_000)).await.unwrap();
    let listed = admin.list("sem:ops").await.unwrap();
    let [seen] = listed.as_slice() else {
        panic!("one lock listed: {listed:?}");
    };
    let Holding::Permits { permits: 2, holders } = &seen.holding else {
        panic!("a semaphore of 2: {seen:?}");
    };
    let shown: Vec<Option<u32>> = holders.iter().map(|h| h.permit).collect();
    assert_eq!(shown, [Some(0), Some(1)]);
    let waiter = tokio::spawn({
        let other = other.clone();
        async move {
            other
                .acquire("sem:ops", &permits(2, 10_000).wait(Duration::from_secs(20)))
                .await
        }
    });
    eventually(5 * SECOND, "the waiter waits", || async {
        other.waiting("sem:ops").unwrap_or(0) > 0
    })
    .await;
    assert_eq!(admin.force_release(seen).await.unwrap(), ForceReleased::Freed);
    let got = tokio::time::timeout(20 * SECOND, waiter).await.unwrap().unwrap();
    got.expect("the waiter takes a freed permit")
        .release()
        .await
        .unwrap();
    assert!(a.is_lost() || !a.release().await.unwrap(), "forced out");
    assert!(b.is_lost() || !b.release().await.unwrap(), "forced out");
}

async fn the_watchdog_renews_each_permit(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let options = permits(2, 900).watchdog(true);
    let a = c.acquire("sem:renewed", &options).await.unwrap();
    let b = other.acquire("sem:renewed", &options).await.unwrap();
    // Three ttls later both are still held: a third caller is refused.
    tokio::time::sleep(Duration::from_millis(2700)).await;
    assert!(!a.is_lost() && !b.is_lost());
    let third = c.acquire("sem:renewed", &permits(2, 900)).await;
    assert!(matches!(third, Err(LockError::Busy { .. })), "{third:?}");
    assert!(a.release().await.unwrap());
    assert!(b.release().await.unwrap());
}

async fn a_nested_call_uses_the_permit_it_holds(t: Target) {
    let c = t.client();
    let options = permits(2, 10_000);
    let other = c.acquire("sem:nested", &options).await.unwrap();
    let (outer, inner) = c
        .run("sem:nested", &options, async {
            let outer = lock_runtime::current().and_then(|l| l.permit());
            // The one free permit is this call's: a nested call must not need another.
            let inner = c
                .run("sem:nested", &options, async {
                    lock_runtime::current().and_then(|l| l.permit())
                })
                .await
                .expect("runs without acquiring again");
            (outer, inner)
        })
        .await
        .unwrap();
    assert!(outer.is_some());
    assert_eq!(outer, inner);
    other.release().await.unwrap();
}

async fn a_minimum_hold_keeps_the_permit(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let options = permits(2, 10_000).hold_at_least(Duration::from_millis(600));
    // The hold counts from when the acquire was sent: at or after this.
    let asked_at = Instant::now();
    let a = c.acquire("sem:hold", &options).await.unwrap();
    let b = c.acquire("sem:hold", &options).await.unwrap();
    assert!(a.release().await.unwrap());
    let refused = other.acquire("sem:hold", &permits(2, 10_000)).await;
    assert!(
        matches!(refused, Err(LockError::Busy { .. })) || asked_at.elapsed() >= Duration::from_millis(590),
        "kept for its minimum hold: {refused:?}"
    );
    let after = other
        .acquire("sem:hold", &permits(2, 10_000).wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(
        asked_at.elapsed() >= Duration::from_millis(590),
        "{:?}",
        asked_at.elapsed()
    );
    after.release().await.unwrap();
    b.release().await.unwrap();
}

async fn a_minimum_hold_longer_than_the_lease_keeps_the_permit(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    // A lease of 1 s, released at once, kept for 3 s.
    let options = permits(2, 1000).hold_at_least(Duration::from_millis(3000));
    let asked_at = Instant::now();
    let a = c.acquire("sem:long-hold", &options).await.unwrap();
    let b = c.acquire("sem:long-hold", &options).await.unwrap();
    assert!(a.release().await.unwrap());
    assert!(b.release().await.unwrap());
    // Past both leases (each guard's validity is over), the permits are still kept: the key's
    // record lasts as long as the longest hold, not the lease the permits had left.
    let past_the_leases = Duration::from_millis(1500);
    tokio::time::sleep_until(asked_at + past_the_leases).await;
    let refused = other.acquire("sem:long-hold", &permits(2, 10_000)).await;
    assert!(
        matches!(refused, Err(LockError::Busy { .. })) || asked_at.elapsed() >= Duration::from_millis(2900),
        "a permit kept for its minimum hold was free at {:?}: {refused:?}",
        asked_at.elapsed()
    );
    let after = other
        .acquire("sem:long-hold", &permits(2, 10_000).wait(Duration::from_secs(6)))
        .await
        .unwrap();
    assert!(
        asked_at.elapsed() >= Duration::from_millis(2900),
        "{:?}",
        asked_at.elapsed()
    );
    after.release().await.unwrap();
}

#[distributed_lock(key = "sem:mixed", client = client)]
async fn exclusive_inside(client: &LockClient) -> Result<(), LockError> {
    Ok(())
}

/// A call nested in a permit that the permit cannot serve (an exclusive or shared call, a
/// permit of another count) is `InvalidOptions` at once, naming both calls: it would otherwise
/// run beside the other permit's holder. A lock likewise refuses a permit nested in it.
async fn a_call_nested_in_a_permit_in_another_mode_is_refused_at_once(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let two = permits(2, 10_000);
    let beside = other.acquire("sem:mixed", &two).await.unwrap();
    let answers = c
        .run("sem:mixed", &two, async {
            let exclusive = c.run("sem:mixed", &ttl(10_000), async {}).await;
            let shared = c
                .run("sem:mixed", &ttl(10_000).mode(LockMode::Shared), async {})
                .await;
            let three = c.run("sem:mixed", &permits(3, 10_000), async {}).await;
            let attribute = exclusive_inside(&c).await;
            let same = c.run("sem:mixed", &two, async {}).await;
            (exclusive, shared, three, attribute, same)
        })
        .await
        .unwrap();
    let (exclusive, shared, three, attribute, same) = answers;
    for (what, answer) in [
        ("exclusive", exclusive),
        ("shared", shared),
        ("attribute", attribute),
    ] {
        match answer {
            Err(LockError::InvalidOptions { reason }) => {
                assert!(reason.contains("permit of 2"), "{what}: {reason}");
                assert!(reason.contains("sem:mixed"), "{what}: {reason}");
            }
            other => panic!("{what} inside a permit: {other:?}"),
        }
    }
    match three {
        Err(LockError::InvalidOptions { reason }) => {
            assert!(
                reason.contains("permit of 3") && reason.contains("permit of 2"),
                "{reason}"
            );
        }
        other => panic!("a permit of 3 inside a permit of 2: {other:?}"),
    }
    assert!(same.is_ok(), "the same count runs in the permit held: {same:?}");
    beside.release().await.unwrap();
    // A lock serves no permit nested in it.
    let nested = c
        .run("sem:mixed", &ttl(10_000), async {
            c.run("sem:mixed", &two, async {}).await
        })
        .await
        .unwrap();
    assert!(
        matches!(&nested, Err(LockError::InvalidOptions { reason }) if reason.contains("exclusive call")),
        "{nested:?}"
    );
}

#[distributed_lock(key = "sem:export:<tenant>", permits = 2, ttl_ms = 10000, wait_ms = 10000, client = client)]
async fn export(
    client: &LockClient,
    tenant: u32,
    inside: &AtomicUsize,
    most: &AtomicUsize,
) -> Result<Option<u32>, LockError> {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(30)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(lock_runtime::current().and_then(|l| l.permit()))
}

async fn the_attribute_takes_a_permit(t: Target) {
    let c = t.client();
    let (inside, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let runs = (0..6).map(|_| export(&c, 7, &inside, &most));
    let permits: Vec<_> = futures_util::future::join_all(runs).await;
    for permit in permits {
        assert!(matches!(permit, Ok(Some(0 | 1))), "{permit:?}");
    }
    let most = most.load(Ordering::SeqCst);
    assert!((1..=2).contains(&most), "{most}");
}

#[tokio::test]
async fn permits_are_checked_before_any_request() {
    let c = LockClient::in_memory();
    for (options, says) in [
        (permits(0, 1000), "at least 1"),
        (permits(lock_runtime::MAX_PERMITS + 1, 1000), "maximum"),
        (permits(2, 1000).mode(LockMode::Shared), "shared"),
    ] {
        match c.acquire("sem:bad", &options).await {
            Err(LockError::InvalidOptions { reason }) => assert!(reason.contains(says), "{reason}"),
            got => panic!("{options:?}: {got:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_permits_with_the_reason() {
    let t = Target::redlock().await;
    match t.client().acquire("sem:redlock", &permits(3, 1000)).await {
        Err(LockError::InvalidOptions { reason }) => {
            assert!(
                reason.contains("RedLock") && reason.contains("majority"),
                "{reason}"
            )
        }
        got => panic!("{got:?}"),
    }
    eventually(SECOND, "nothing was taken", || async {
        !t.client().is_locked("sem:redlock").await.unwrap()
    })
    .await;
}

/// Issue 55: on Redis a fair semaphore's release hands its permit to the head of the line in
/// the same script (as a fair lock's release hands the lock over), so no permit is free between
/// a release and the waiter it admits, which holds it without asking. Seen in the hash (a place
/// in line that never asks is handed the permit by the release itself), and end to end:
/// another client's waiter holds the permit given back, with a fencing token taken when it
/// renews (the hand-over took none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_fair_semaphores_release_hands_its_permit_to_the_head_of_the_line() {
    let server = lock_tests::RedisServer::spawn();
    let a = LockClient::connect(&server.url()).await.unwrap();
    let b = LockClient::connect(&server.url()).await.unwrap();
    let two = permits(2, 30_000).fair(true).fencing(true);
    let first = a.acquire("sem:hand", &two).await.unwrap();
    let second = a.acquire("sem:hand", &two).await.unwrap();
    let names = lock_runtime::redis::keys::LockKeys::new(lock_runtime::DEFAULT_PREFIX, "sem:hand");
    let mut raw = server.raw().await;
    // A place nobody keeps asking for, first in line: only the release can give it a permit.
    let (secs, _): (u64, u64) = ::redis::cmd("TIME").query_async(&mut raw).await.unwrap();
    let kept = secs * 1000 + 60_000;
    let _: () = ::redis::pipe()
        .cmd("ZADD")
        .arg(names.permits_queue())
        .arg(1)
        .arg("a place")
        .ignore()
        .cmd("ZADD")
        .arg(names.permits_kept())
        .arg(kept)
        .arg("a place")
        .ignore()
        .query_async(&mut raw)
        .await
        .unwrap();
    let given = first.permit().unwrap();
    assert!(first.release().await.unwrap());
    let handed: Option<String> = ::redis::cmd("HGET")
        .arg(names.lock())
        .arg("a place")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        handed.as_deref(),
        Some(format!("{kept}:{given}:0").as_str()),
        "the release handed the permit to the head of the line, until its place lapses"
    );
    let line: usize = ::redis::cmd("ZCARD")
        .arg(names.permits_queue())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(line, 0, "out of the line");
    // Another client's waiter, handed the next permit given back.
    let waiter = in_line(&b, "sem:hand", two.clone().wait(30 * SECOND)).await;
    let given = second.permit();
    let last_fence = second.fencing_token().unwrap();
    assert!(second.release().await.unwrap());
    let guard = waiter.await.unwrap().unwrap();
    assert_eq!(guard.permit(), given, "the permit given back");
    assert!(guard.fencing_token().unwrap() > last_fence);
    assert!(guard.release().await.unwrap());
}
