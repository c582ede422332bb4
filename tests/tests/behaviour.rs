//! The lock's behaviour, run unchanged against a spawned redis-server (plaintext, and TLS with a
//! client certificate) and the in-memory backend.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockError, LockOptions, OnLost};
use lock_tests::{eventually, ttl, Target, SECOND};
use tokio::time::Instant;

lock_tests::on_every_deployment!(
    lock_unlock_twice,
    independent_keys,
    held_lock_is_busy,
    fifty_contenders_one_winner,
    ttl_is_set_on_the_key,
    late_release_returns_false_and_spares_the_new_holder,
    non_owner_cannot_extend_or_release,
    watchdog_keeps_a_short_lock_alive,
    external_delete_is_noticed_as_lost,
    dropped_guard_releases_in_background,
    bad_keys_and_options_are_rejected,
    run_releases_when_body_returns_err,
    run_releases_on_cancellation,
    run_releases_on_panic,
    on_lost_abort_stops_the_body,
    on_lost_continue_lets_the_body_finish,
    lease_without_watchdog_is_lost_at_its_ttl,
    extend_moves_the_deadline,
    a_shorter_extend_never_shortens_the_lease,
    hold_at_most_ends_a_watchdog_lock,
    a_body_that_is_always_ready_is_stopped_at_its_lease,
    one_watchdog_renews_many_locks_and_loses_only_the_one_gone,
    shutdown_gives_back_every_lock_and_refuses_new_ones,
    holder_names_the_owner_and_what_is_left,
    debug_output_is_short_and_holds_no_token,
);

async fn lock_unlock_twice(t: Target) {
    let c = t.client();
    for _ in 0..2 {
        let guard = c.acquire("twice", &ttl(5000)).await.unwrap();
        assert_eq!(guard.key(), "twice");
        assert!(c.is_locked("twice").await.unwrap());
        assert!(guard.release().await.unwrap());
        assert!(!c.is_locked("twice").await.unwrap());
    }
}

async fn independent_keys(t: Target) {
    let c = t.client();
    let a = c.acquire("key-a", &ttl(5000)).await.unwrap();
    let b = c.acquire("key-b", &ttl(5000)).await.unwrap();
    assert!(a.release().await.unwrap());
    assert!(c.is_locked("key-b").await.unwrap());
    assert!(b.release().await.unwrap());
}

async fn held_lock_is_busy(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let guard = c.acquire("busy", &ttl(5000)).await.unwrap();
    let err = other.acquire("busy", &ttl(5000)).await.unwrap_err();
    assert!(
        matches!(&err, LockError::Busy { key } if key == "busy"),
        "{err:?}"
    );
    assert!(guard.release().await.unwrap());
    other
        .acquire("busy", &ttl(5000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

async fn fifty_contenders_one_winner(t: Target) {
    let clients = [t.client(), t.other_client().await];
    let attempts = (0..50).map(|i| {
        let c = clients[i % 2].clone();
        tokio::spawn(async move { c.acquire("contended", &ttl(10_000)).await })
    });
    let results = futures_util::future::join_all(attempts).await;
    let mut winners = Vec::new();
    for result in results {
        match result.unwrap() {
            Ok(guard) => winners.push(guard),
            Err(LockError::Busy { .. }) => {}
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(winners.len(), 1);
}

async fn ttl_is_set_on_the_key(t: Target) {
    let c = t.client();
    let guard = c.acquire("ttl", &ttl(5000)).await.unwrap();
    let left = c.remaining_ttl("ttl").await.unwrap().expect("a lock has a ttl");
    assert!(
        left <= Duration::from_millis(5000) && left > Duration::from_millis(3000),
        "{left:?}"
    );
    guard.release().await.unwrap();
    assert_eq!(c.remaining_ttl("ttl").await.unwrap(), None);
}

async fn late_release_returns_false_and_spares_the_new_holder(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let stale = c.acquire("late", &ttl(50)).await.unwrap();
    eventually(2 * SECOND, "the short lock expires", || async {
        !c.is_locked("late").await.unwrap()
    })
    .await;
    assert!(stale.is_lost());
    let fresh = other.acquire("late", &ttl(5000)).await.unwrap();
    assert!(
        !stale.release().await.unwrap(),
        "a late release must report it was not ours"
    );
    assert!(
        c.is_locked("late").await.unwrap(),
        "the new holder's lock must survive"
    );
    assert!(fresh.release().await.unwrap());
}

async fn non_owner_cannot_extend_or_release(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let stale = c.acquire("owner", &ttl(50)).await.unwrap();
    eventually(2 * SECOND, "the short lock expires", || async {
        !c.is_locked("owner").await.unwrap()
    })
    .await;
    let owner = other.acquire("owner", &ttl(5000)).await.unwrap();
    let err = stale.extend(Duration::from_secs(60)).await.unwrap_err();
    assert!(matches!(err, LockError::Lost { .. }), "{err:?}");
    match c.remaining_ttl("owner").await.unwrap() {
        Some(left) => assert!(
            left <= Duration::from_secs(5),
            "a non-owner extended the lock: {left:?}"
        ),
        None => assert!(
            !t.shows_others_remaining(),
            "another client's lock shows no lease"
        ),
    }
    assert!(!stale.release().await.unwrap());
    assert!(
        c.is_locked("owner").await.unwrap(),
        "a non-owner released the lock"
    );
    assert!(owner.release().await.unwrap());
}

async fn watchdog_keeps_a_short_lock_alive(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let guard = c.acquire("dog", &ttl(300).watchdog(true)).await.unwrap();
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        assert!(!guard.is_lost());
        assert!(matches!(
            other.acquire("dog", &ttl(300)).await,
            Err(LockError::Busy { .. })
        ));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        guard.release().await.unwrap(),
        "the lock must still be ours after 5 ttls"
    );
}

async fn external_delete_is_noticed_as_lost(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let guard = c.acquire("deleted", &ttl(300).watchdog(true)).await.unwrap();
    assert!(other.force_release("deleted").await.unwrap());
    tokio::time::timeout(2 * SECOND, guard.lost())
        .await
        .expect("the watchdog notices the missing key");
    assert!(guard.is_lost());
    assert!(!guard.release().await.unwrap());
}

async fn dropped_guard_releases_in_background(t: Target) {
    let c = t.client();
    let guard = c.acquire("dropped", &ttl(60_000).watchdog(true)).await.unwrap();
    drop(guard);
    eventually(2 * SECOND, "a dropped guard is released", || async {
        !c.is_locked("dropped").await.unwrap()
    })
    .await;
}

async fn bad_keys_and_options_are_rejected(t: Target) {
    let c = t.client();
    let long = "k".repeat(1025);
    // The same answer on every store (PostgreSQL's text cannot hold a NUL byte).
    for key in ["", long.as_str(), "a\0b", "\0"] {
        let err = c.acquire(key, &ttl(1000)).await.unwrap_err();
        assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
        let err = c.run(key, &ttl(1000), async {}).await.unwrap_err();
        assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
    }
    c.acquire(&"k".repeat(1024), &ttl(1000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    c.acquire("ключ-🔒", &ttl(1000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // A newline, spaces, a tab: keys as written, each its own lock on every store.
    let odd = ["line\nbreak", " ", "  ", "\t", "line", "ß", "ss", "k ", "K"];
    let mut held = Vec::new();
    for key in odd {
        held.push(c.acquire(key, &ttl(10_000)).await.unwrap());
    }
    for guard in held {
        guard.release().await.unwrap();
    }
    for options in [
        ttl(0),
        ttl(5),
        ttl(30).watchdog(true),
        ttl(1000).wait(Duration::MAX),
        ttl(1000).hold_at_least(Duration::MAX),
        LockOptions::new(Duration::MAX),
    ] {
        let err = c.acquire("opts", &options).await.unwrap_err();
        assert!(
            matches!(err, LockError::InvalidOptions { .. }),
            "{options:?}: {err:?}"
        );
    }
    assert!(
        !c.is_locked("opts").await.unwrap(),
        "a rejected call must not take the lock"
    );
}

async fn run_releases_when_body_returns_err(t: Target) {
    let c = t.client();
    let out: Result<Result<(), &str>, _> = c.run("err", &ttl(5000), async { Err("declined") }).await;
    assert_eq!(out.unwrap(), Err("declined"));
    assert!(!c.is_locked("err").await.unwrap());
}

async fn run_releases_on_cancellation(t: Target) {
    let c = t.client();
    let entered = Arc::new(tokio::sync::Notify::new());
    let body = {
        let entered = Arc::clone(&entered);
        async move {
            entered.notify_one();
            std::future::pending::<()>().await
        }
    };
    let options = ttl(60_000).watchdog(true);
    let run = c.run("cancelled", &options, body);
    tokio::select! {
        _ = run => unreachable!("the body never finishes"),
        () = async { entered.notified().await; } => {}
    }
    // `run` was dropped mid-body, as a timeout or a client disconnect would.
    eventually(2 * SECOND, "a cancelled run releases", || async {
        !c.is_locked("cancelled").await.unwrap()
    })
    .await;
    let timed_out = tokio::time::timeout(
        Duration::from_millis(50),
        c.run("cancelled", &ttl(60_000), std::future::pending::<()>()),
    )
    .await;
    assert!(timed_out.is_err());
    eventually(2 * SECOND, "a timed-out run releases", || async {
        !c.is_locked("cancelled").await.unwrap()
    })
    .await;
}

async fn run_releases_on_panic(t: Target) {
    let c = t.client();
    let task = {
        let c = c.clone();
        tokio::spawn(async move {
            c.run("panics", &ttl(60_000).watchdog(true), async {
                panic!("the body panics");
            })
            .await
        })
    };
    assert!(task.await.unwrap_err().is_panic());
    eventually(2 * SECOND, "a panicking run releases", || async {
        !c.is_locked("panics").await.unwrap()
    })
    .await;
}

async fn on_lost_abort_stops_the_body(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let finished = AtomicBool::new(false);
    let out = c
        .run("abort", &ttl(300).watchdog(true), async {
            other.force_release("abort").await.unwrap();
            tokio::time::sleep(10 * SECOND).await;
            finished.store(true, Ordering::SeqCst);
        })
        .await;
    assert!(
        matches!(out, Err(LockError::Lost { ref key }) if key == "abort"),
        "{out:?}"
    );
    assert!(!finished.load(Ordering::SeqCst));
}

async fn on_lost_continue_lets_the_body_finish(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let options = ttl(300).watchdog(true).on_lost(OnLost::Continue);
    let out = c
        .run("continue", &options, async {
            other.force_release("continue").await.unwrap();
            // Wait until the loss has certainly been seen: another holder got the lock.
            let taken = other
                .acquire("continue", &ttl(5000).wait(5 * SECOND))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(400)).await; // > ttl/3: a renewal saw it
            taken.release().await.unwrap();
            7
        })
        .await;
    assert_eq!(out.unwrap(), 7);
}

async fn lease_without_watchdog_is_lost_at_its_ttl(t: Target) {
    let c = t.client();
    let started = Instant::now();
    let guard = c.acquire("lease", &ttl(200)).await.unwrap();
    tokio::time::timeout(2 * SECOND, guard.lost())
        .await
        .expect("a lease ends");
    assert!(
        started.elapsed() >= Duration::from_millis(190),
        "lost early: {:?}",
        started.elapsed()
    );
    assert!(guard.is_lost());
    let out = c
        .run("lease-run", &ttl(200), tokio::time::sleep(10 * SECOND))
        .await;
    assert!(matches!(out, Err(LockError::Lost { .. })), "{out:?}");
}

async fn extend_moves_the_deadline(t: Target) {
    let c = t.client();
    let guard = c.acquire("extend", &ttl(200)).await.unwrap();
    guard.extend(Duration::from_secs(60)).await.unwrap();
    let left = c.remaining_ttl("extend").await.unwrap().unwrap();
    assert!(left > Duration::from_secs(50), "{left:?}");
    tokio::time::sleep(Duration::from_millis(300)).await; // past the original ttl
    assert!(!guard.is_lost());
    assert!(guard.release().await.unwrap());
}

/// Issue 23: a renewal (here an `extend`) shorter than the lease already set leaves the later
/// expiry standing, on the server and in the holder's validity; before, the second `extend` cut
/// the server's lease to 300 ms while the holder went on believing in it.
async fn a_shorter_extend_never_shortens_the_lease(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let guard = c.acquire("extend-shorter", &ttl(200)).await.unwrap();
    guard.extend(Duration::from_secs(60)).await.unwrap();
    guard.extend(Duration::from_millis(300)).await.unwrap();
    let left = c.remaining_ttl("extend-shorter").await.unwrap().unwrap();
    assert!(left > Duration::from_secs(50), "{left:?}");
    tokio::time::sleep(Duration::from_millis(500)).await; // past both the ttl and the short extend
    assert!(!guard.is_lost());
    let err = other.acquire("extend-shorter", &ttl(1000)).await.unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }), "{err:?}");
    assert!(guard.release().await.unwrap());
}

/// Issue 23: the watchdog renews a lock past its ttl but not past its maximum hold: there a
/// guarded body is stopped (`Lost`), a bare guard is lost, `extend` cannot move it past the
/// limit, and the key is free again at about the limit (its renewals asked for no more).
async fn hold_at_most_ends_a_watchdog_lock(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let capped = ttl(150).watchdog(true).hold_at_most(Duration::from_millis(600));
    let started = Instant::now();
    let out = c.run("most-run", &capped, tokio::time::sleep(10 * SECOND)).await;
    assert!(matches!(out, Err(LockError::Lost { .. })), "{out:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    let guard = c.acquire("most-guard", &capped).await.unwrap();
    tokio::time::timeout(5 * SECOND, guard.lost())
        .await
        .expect("lost at its maximum hold");
    assert!(matches!(
        guard.extend(Duration::from_secs(60)).await,
        Err(LockError::Lost { .. })
    ));
    eventually(2 * SECOND, "the capped lock's key expires", || async {
        other.acquire("most-guard", &ttl(1000)).await.is_ok()
    })
    .await;
    let below = c
        .acquire("most-bad", &ttl(1000).hold_at_most(Duration::from_millis(500)))
        .await;
    assert!(
        matches!(below, Err(LockError::InvalidOptions { .. })),
        "{below:?}"
    );
}

/// Runs until `until` has passed, always with ready work: every poll exhausts tokio's
/// cooperative budget, which once starved the lost signal.
async fn always_ready(until: Duration) -> &'static str {
    let started = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    loop {
        let _ = tx.send(());
        rx.recv().await;
        if started.elapsed() > until {
            return "finished";
        }
    }
}

async fn a_body_that_is_always_ready_is_stopped_at_its_lease(t: Target) {
    let c = t.client();
    let started = Instant::now();
    let out = c.run("ready", &ttl(100), always_ready(2 * SECOND)).await;
    let took = started.elapsed();
    assert!(matches!(out, Err(LockError::Lost { .. })), "{out:?}");
    assert!(took < SECOND, "stopped {took:?} after a 100 ms lease began");

    let started = Instant::now();
    let continued = ttl(100).on_lost(OnLost::Continue);
    let out = c
        .run("ready", &continued, always_ready(Duration::from_millis(300)))
        .await;
    assert_eq!(out.ok(), Some("finished"), "on_lost = continue lets it finish");
    assert!(started.elapsed() >= Duration::from_millis(300));
}

async fn one_watchdog_renews_many_locks_and_loses_only_the_one_gone(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    // A 1 s lease, renewed every third of it: fifty acquires in a row on etcd (two raft writes
    // each) on a loaded 2-core machine outlast a 300 ms one's validity before the first renewal.
    let options = ttl(1000).watchdog(true);
    let mut guards = Vec::new();
    for i in 0..50 {
        guards.push(c.acquire(&format!("many:{i}"), &options).await.unwrap());
    }
    assert_eq!(c.watched_locks(), 50);
    // One is deleted behind its holder's back, one is released mid-way.
    assert!(other.force_release("many:7").await.unwrap());
    let released = guards.remove(20);
    assert!(released.release().await.unwrap());
    eventually(2 * SECOND, "the deleted lock is found lost", || async {
        guards[7].is_lost()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(2100)).await; // over two ttls: renewals kept the rest
    for (i, guard) in guards.iter().enumerate() {
        if i != 7 {
            assert!(!guard.is_lost(), "{}: lost", guard.key());
            assert!(
                c.is_locked(guard.key()).await.unwrap(),
                "{}: expired",
                guard.key()
            );
        }
    }
    assert!(
        !c.is_locked("many:20").await.unwrap(),
        "a released lock is never renewed again"
    );
    assert!(
        !c.is_locked("many:7").await.unwrap(),
        "a lost lock is never re-created"
    );
    assert_eq!(c.watched_locks(), 48);
    for guard in guards {
        let _ = guard.release().await;
    }
    assert_eq!(c.watched_locks(), 0);
}

async fn shutdown_gives_back_every_lock_and_refuses_new_ones(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let renewed = c
        .acquire("down:renewed", &ttl(60_000).watchdog(true))
        .await
        .unwrap();
    let plain = c.acquire("down:plain", &ttl(60_000)).await.unwrap();
    // A minimum hold far longer than the test: the shutdown below must honour it however long
    // the steps before it take under load.
    let held_on = c
        .acquire("down:hold", &ttl(60_000).hold_at_least(Duration::from_secs(30)))
        .await
        .unwrap();
    drop(c.acquire("down:dropped", &ttl(60_000)).await.unwrap()); // released in the background
    let body = tokio::spawn({
        let c = c.clone();
        async move {
            c.run("down:body", &ttl(60_000), std::future::pending::<()>())
                .await
        }
    });
    eventually(2 * SECOND, "the body holds its lock", || async {
        other.is_locked("down:body").await.unwrap()
    })
    .await;

    c.shutdown().await;
    for key in ["down:renewed", "down:plain", "down:dropped", "down:body"] {
        assert!(
            !other.is_locked(key).await.unwrap(),
            "{key} still held after shutdown"
        );
    }
    assert!(
        other.is_locked("down:hold").await.unwrap(),
        "a minimum hold is honoured"
    );
    let out = body.await.unwrap();
    assert!(
        matches!(out, Err(LockError::Lost { .. })),
        "the body is stopped: {out:?}"
    );
    assert!(renewed.is_lost() && plain.is_lost() && held_on.is_lost());
    assert_eq!(c.watched_locks(), 0);
    let out = c.acquire("down:new", &ttl(1000)).await;
    assert!(
        matches!(&out, Err(LockError::Unavailable { source }) if source.is::<lock_runtime::ShutDown>()),
        "{out:?}"
    );
    // Guards released after the shutdown find their locks gone; nothing is disturbed.
    assert_eq!(plain.release().await.ok(), Some(false));
    drop(renewed);
    drop(held_on);
}

async fn holder_names_the_owner_and_what_is_left(t: Target) {
    let c = t.client();
    assert_eq!(c.holder("owned").await.unwrap(), None);
    let guard = c
        .acquire("owned", &ttl(5000).hold_at_least(Duration::from_secs(2)))
        .await
        .unwrap();
    let holder = c.holder("owned").await.unwrap().expect("held");
    let owner = holder.owner().expect("written by this library");
    assert!(
        owner.ends_with(&format!(":{}", std::process::id())),
        "the default owner is <hostname>:<pid>: {owner}"
    );
    let left = holder.remaining().expect("a lock has an expiry");
    assert!(
        left <= Duration::from_millis(5000) && left > Duration::from_millis(3000),
        "{left:?}"
    );
    assert!(!holder.is_released());
    assert!(guard.release().await.unwrap());
    let kept = c
        .holder("owned")
        .await
        .unwrap()
        .expect("kept for its minimum hold");
    assert!(kept.is_released() && kept.owner() == Some(owner));
    assert!(matches!(c.holder("").await, Err(LockError::InvalidKey { .. })));
}

/// `{:?}` of a guard, of what `current()` gives, of a holder and of the client: short, and
/// never the lock's token (the capability to renew or release it), which the store holds as the
/// lock's value.
async fn debug_output_is_short_and_holds_no_token(t: Target) {
    let c = t.client();
    let guard = c.acquire("debugged", &ttl(10_000)).await.unwrap();
    // The token: the first word of the value the store holds (`<uuid> <owner>`).
    let view = lock_runtime::admin::Admin::new(c.clone())
        .show("debugged")
        .await
        .unwrap();
    let token = match view.holding {
        lock_runtime::admin::Holding::Exclusive { value, .. } => {
            value.split(' ').next().unwrap_or_default().to_owned()
        }
        other => panic!("held by one holder: {other:?}"),
    };
    assert!(token.len() >= 16, "a token: {token:?}");
    let holder = c.holder("debugged").await.unwrap().unwrap();
    let info = c
        .run("debugged-info", &ttl(10_000), async { lock_runtime::current() })
        .await
        .unwrap()
        .unwrap();
    for shown in [
        format!("{guard:?}"),
        format!("{info:?}"),
        format!("{holder:?}"),
        format!("{c:?}"),
    ] {
        assert!(shown.len() < 300, "{} characters: {shown}", shown.len());
        assert!(!shown.contains(token.as_str()), "the token {token} is in {shown}");
    }
    let shown = format!("{guard:?}");
    assert!(
        shown.contains("debugged") && shown.contains("exclusive"),
        "{shown}"
    );
    guard.release().await.unwrap();
}
