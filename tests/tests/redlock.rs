//! RedLock: a quorum over five independent masters spawned here. With 3 or more reachable the
//! lock works; with 2 it fails `Unavailable` and leaves no key anywhere; a holder keeps its lock
//! when 2 masters die and learns `Lost` when 3 do; a paused master, resumed, grants no second
//! holder; racing clients never both hold a majority; a minority's stale key does not block.
//! (The behaviour suite also runs on a RedLock client: behaviour.rs.)

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockClientBuilder, LockError, LockOptions};
use lock_tests::{eventually, ttl, RedisServer, SECOND};
use redis::AsyncCommands;

fn spawn_masters() -> Vec<RedisServer> {
    (0..5).map(|_| RedisServer::spawn()).collect()
}

fn builder(masters: &[RedisServer]) -> LockClientBuilder {
    LockClient::builder()
        .redlock(masters.iter().map(RedisServer::url))
        .connect_timeout(SECOND)
        .response_timeout(Duration::from_millis(300))
}

async fn client(masters: &[RedisServer]) -> LockClient {
    builder(masters)
        .build()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the masters: {e}"))
}

/// How many running masters hold `key` (with any value).
async fn holders(masters: &[RedisServer], key: &str) -> usize {
    let mut n = 0;
    for master in masters {
        let Ok(client) = redis::Client::open(master.url()) else {
            continue;
        };
        let Ok(Ok(mut conn)) = tokio::time::timeout(SECOND, client.get_multiplexed_async_connection()).await
        else {
            continue; // down
        };
        let exists: bool = conn.exists(key).await.unwrap_or(false);
        n += usize::from(exists);
    }
    n
}

/// Every subset of masters down: with 3 or more up the lock is taken (on a majority) and
/// released (everywhere); with 2 or fewer the acquire fails `Unavailable` and leaves no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subset_of_masters_down_works_with_a_majority_and_fails_cleanly_without() {
    let mut masters = spawn_masters();
    let client = client(&masters).await;
    let other = client_without_build(&masters);
    for down in 0u32..32 {
        let up = 5 - down.count_ones();
        for (i, master) in masters.iter_mut().enumerate() {
            if down & (1 << i) != 0 {
                master.kill();
            }
        }
        let out = client.acquire("subset", &ttl(10_000)).await;
        if up >= 3 {
            let guard = out.unwrap_or_else(|e| panic!("{up} masters up: {e}"));
            assert!(
                holders(&masters, "lock:{subset}").await >= 3,
                "held on a majority"
            );
            let refused = other.acquire("subset", &ttl(10_000)).await;
            assert!(
                matches!(refused, Err(LockError::Busy { .. })),
                "{up} masters up: another client is refused: {refused:?}"
            );
            assert!(guard.release().await.unwrap());
        } else {
            assert!(
                matches!(&out, Err(LockError::Unavailable { .. })),
                "{up} masters up: {out:?}"
            );
        }
        assert_eq!(
            holders(&masters, "lock:{subset}").await,
            0,
            "down set {down:05b}: no key left"
        );
        for (i, master) in masters.iter_mut().enumerate() {
            if down & (1 << i) != 0 {
                master.restart();
            }
        }
    }
}

fn client_without_build(masters: &[RedisServer]) -> LockClient {
    builder(masters)
        .build_lazy()
        .unwrap_or_else(|e| panic!("bad configuration: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_keeps_its_lock_when_two_masters_die_and_learns_lost_when_three_do() {
    let mut masters = spawn_masters();
    let client = client(&masters).await;
    let lease = Duration::from_millis(600);
    let guard = client
        .acquire("survivor", &LockOptions::new(lease).watchdog(true))
        .await
        .unwrap();
    masters[0].kill();
    masters[1].kill();
    tokio::time::sleep(3 * lease).await; // past its lease: renewed on the three left
    assert!(!guard.is_lost(), "a majority still renews it");
    assert!(matches!(
        client.acquire("survivor", &ttl(10_000)).await,
        Err(LockError::Busy { .. })
    ));
    let killed_at = Instant::now();
    masters[2].kill();
    tokio::time::timeout(lease + SECOND, guard.lost())
        .await
        .expect("with two masters left, the holder learns that the lock is lost");
    assert!(
        killed_at.elapsed() <= lease + Duration::from_millis(100),
        "lost within its validity: {:?}",
        killed_at.elapsed()
    );
}

/// A master frozen for longer than the ttl and then resumed still holds the key it had; that
/// minority never makes a second holder while the majority holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_resumed_grants_no_second_holder() {
    let masters = spawn_masters();
    let (holder, other) = (client(&masters).await, client(&masters).await);
    let lease = Duration::from_millis(500);
    let guard = holder
        .acquire("paused", &LockOptions::new(lease).watchdog(true))
        .await
        .unwrap();
    masters[0].pause();
    masters[1].pause();
    let paused_until = Instant::now() + 3 * lease;
    while Instant::now() < paused_until {
        let out = other.acquire("paused", &ttl(10_000)).await;
        assert!(matches!(out, Err(LockError::Busy { .. })), "{out:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    masters[0].resume();
    masters[1].resume();
    for _ in 0..10 {
        assert!(matches!(
            other.acquire("paused", &ttl(10_000)).await,
            Err(LockError::Busy { .. })
        ));
    }
    assert!(!guard.is_lost());
    assert!(guard.release().await.unwrap());
    other
        .acquire("paused", &ttl(10_000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Two clients racing for the same key, many times: never both hold it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_clients_never_both_hold_a_majority() {
    let masters = spawn_masters();
    let (a, b) = (client(&masters).await, client(&masters).await);
    let mut won = [0u32; 3];
    let options = ttl(10_000);
    for round in 0..300 {
        let key = format!("race-{round}");
        let (x, y) = tokio::join!(a.acquire(&key, &options), b.acquire(&key, &options));
        assert!(!(x.is_ok() && y.is_ok()), "round {round}: both hold the lock");
        for out in [&x, &y] {
            assert!(
                matches!(out, Ok(_) | Err(LockError::Busy { .. })),
                "round {round}: {out:?}"
            );
        }
        won[usize::from(x.is_ok()) + 2 * usize::from(y.is_ok())] += 1;
        for guard in [x, y].into_iter().flatten() {
            guard.release().await.unwrap();
        }
    }
    // A split vote (neither gets a majority) gives the key back everywhere.
    eprintln!("rounds won by neither / a / b: {won:?}");
    for round in 0..300 {
        assert_eq!(holders(&masters, &format!("lock:{{race-{round}}}")).await, 0);
    }
}

/// Stale keys of a crashed client: on a minority they do not block at all; on a majority they
/// block only until their ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_clients_stale_keys_block_no_longer_than_their_ttl() {
    let masters = spawn_masters();
    let client = client(&masters).await;
    let stale = |n: usize, key: &'static str, px: u64| {
        let masters = &masters;
        async move {
            for master in &masters[..n] {
                let () = master
                    .raw()
                    .await
                    .set_options(
                        key,
                        "crashed-client-token",
                        redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(px)),
                    )
                    .await
                    .unwrap();
            }
        }
    };
    stale(2, "lock:{minority}", 60_000).await;
    client
        .acquire("minority", &ttl(10_000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    stale(3, "lock:{majority}", 400).await;
    let started = Instant::now();
    assert!(matches!(
        client.acquire("majority", &ttl(10_000)).await,
        Err(LockError::Busy { .. })
    ));
    let guard = client
        .acquire("majority", &ttl(10_000).wait(5 * SECOND))
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(350),
        "{:?}",
        started.elapsed()
    );
    // Held on a majority (a master whose stale key had not expired yet keeps it till then).
    assert!(holders(&masters, "lock:{majority}").await >= 3);
    guard.release().await.unwrap();
}

/// A release heard from any master wakes another client's waiter, not its timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_another_clients_waiter() {
    let masters = spawn_masters();
    let (holder, waiter) = (client(&masters).await, client(&masters).await);
    let guard = holder.acquire("woken", &ttl(60_000)).await.unwrap();
    let waiting = lock_tests::spawn_waiter(waiter, "woken", 20 * SECOND);
    eventually(5 * SECOND, "the waiter subscribes on every master", || async {
        let mut subscribed = 0;
        for master in &masters {
            if master
                .subscribed_channels()
                .await
                .contains(&"lock:{woken}:released".to_owned())
            {
                subscribed += 1;
            }
        }
        subscribed == 5
    })
    .await;
    let released_at = Instant::now();
    assert!(guard.release().await.unwrap());
    let (acquired_at, got) = waiting.await.unwrap();
    got.unwrap().release().await.unwrap();
    lock_tests::assert_woken_by_the_release(acquired_at - released_at);
}

#[tokio::test]
async fn what_redlock_cannot_offer_is_refused() {
    let masters: Vec<String> = (1..=5).map(|p| format!("redis://127.0.0.1:{p}")).collect();
    let lazy = LockClient::builder().redlock(&masters).build_lazy().unwrap();
    for options in [ttl(1000).fencing(true), ttl(1000).fair(true).wait(SECOND)] {
        let out = lazy.acquire("k", &options).await;
        assert!(
            matches!(&out, Err(LockError::InvalidOptions { reason }) if reason.contains("RedLock")),
            "{out:?}"
        );
    }
    let out = LockClient::builder().redlock(&masters[..2]).build_lazy();
    assert!(matches!(out, Err(LockError::InvalidOptions { .. })), "{out:?}");
    let out = LockClient::builder()
        .redlock(&masters)
        .wait_for_replicas(1, SECOND)
        .build_lazy();
    assert!(matches!(out, Err(LockError::InvalidOptions { .. })), "{out:?}");
}

/// A release answers once a majority released; the other masters' releases follow their own
/// acquires (never overtake them), so no master is left holding the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_pairs_leave_no_key_on_any_master() {
    let masters = spawn_masters();
    let client = client(&masters).await;
    for _ in 0..300 {
        let guard = client.acquire("quick", &ttl(60_000)).await.unwrap();
        assert!(guard.release().await.unwrap());
    }
    eventually(
        2 * SECOND,
        "every master's release follows its acquire",
        || async { holders(&masters, "lock:{quick}").await == 0 },
    )
    .await;
}
