//! Operators' tools (`lock_runtime::admin`), through the library, on every deployment: what
//! `lockctl` does, the same on each store.

use std::time::Duration;

use lock_runtime::admin::{Admin, EventKind, Fence, ForceReleased, Holding};
use lock_runtime::{LockMode, LockOptions};
use lock_tests::{Target, SECOND};

lock_tests::on_every_deployment!(
    list_and_show_tell_who_holds_what,
    a_forced_release_frees_what_was_seen_and_wakes_a_waiter,
    a_forced_release_spares_a_lock_that_changed_hands,
    a_watch_sees_locks_come_and_go,
);

/// Fencing counters, shares and semaphores, where the store keeps them (not RedLock).
mod counted {
    use super::{
        a_forced_release_of_readers_spares_a_semaphore_that_came_after,
        list_shows_fencing_counters_and_shares,
    };

    lock_tests::on_every_deployment_with_one_counter!(
        list_shows_fencing_counters_and_shares,
        a_forced_release_of_readers_spares_a_semaphore_that_came_after,
    );
}

fn minute() -> LockOptions {
    LockOptions::new(Duration::from_secs(60))
}

fn owner(holding: &Holding) -> Option<&str> {
    match holding {
        Holding::Exclusive { owner, .. } => Some(owner),
        _ => None,
    }
}

async fn list_and_show_tell_who_holds_what(t: Target) {
    let c = t.client();
    let admin = Admin::new(c.clone());
    let _a = c.acquire("order:1", &minute()).await.unwrap();
    let _b = c.acquire("order:2", &minute()).await.unwrap();
    let _c = c.acquire("invoice:1", &minute()).await.unwrap();
    let orders = admin.list("order:*").await.unwrap();
    let keys: Vec<&str> = orders.iter().map(|v| v.key.as_str()).collect();
    assert_eq!(keys, ["order:1", "order:2"], "{orders:?}");
    for view in &orders {
        assert!(owner(&view.holding).is_some(), "{view:?}");
        let left = view.remaining.unwrap_or_default();
        assert!(
            left > Duration::ZERO && left <= Duration::from_secs(60),
            "{view:?}"
        );
    }
    assert_eq!(admin.list("*").await.unwrap().len(), 3);
    assert!(admin.list("payment:*").await.unwrap().is_empty());
    let free = admin.show("order:3").await.unwrap();
    assert!(!free.is_held(), "{free:?}");
    assert_eq!(free.key, "order:3");
    let held = admin.show("order:1").await.unwrap();
    assert_eq!(owner(&held.holding), owner(&orders[0].holding));
}

async fn list_shows_fencing_counters_and_shares(t: Target) {
    let c = t.client();
    let admin = Admin::new(c.clone());
    let fenced = c.acquire("fenced", &minute().fencing(true)).await.unwrap();
    let token = fenced.fencing_token().unwrap();
    let shown = admin.show("fenced").await.unwrap();
    assert_eq!(shown.fence, Fence::Token(token), "{shown:?}");
    let read = minute().mode(LockMode::Shared);
    let (r1, r2) = (
        c.acquire("shared", &read).await.unwrap(),
        c.acquire("shared", &read).await.unwrap(),
    );
    let shared = admin.show("shared").await.unwrap();
    let Holding::Shared { readers } = &shared.holding else {
        panic!("not shown shared: {shared:?}");
    };
    assert_eq!(readers.len(), 2, "{shared:?}");
    drop((r1.release().await, r2.release().await, fenced.release().await));
}

async fn a_forced_release_frees_what_was_seen_and_wakes_a_waiter(t: Target) {
    let (c, other) = (t.client(), t.other_client().await);
    let admin = Admin::new(c.clone());
    let stuck = c.acquire("stuck", &minute()).await.unwrap();
    let waiters = other.clone();
    let waiting = tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let got = other.acquire("stuck", &minute().wait(20 * SECOND)).await;
        (started.elapsed(), got)
    });
    lock_tests::eventually(5 * SECOND, "the waiter waits", || async {
        waiters.waiting("stuck").unwrap_or(0) > 0
    })
    .await;
    let seen = admin.show("stuck").await.unwrap();
    assert_eq!(admin.force_release(&seen).await.unwrap(), ForceReleased::Freed);
    let (waited, got) = tokio::time::timeout(20 * SECOND, waiting).await.unwrap().unwrap();
    let guard = got.expect("the waiter takes the freed lock");
    assert!(waited < 20 * SECOND);
    assert!(
        stuck.is_lost() || !stuck.release().await.unwrap(),
        "the old holder no longer has it"
    );
    drop(guard);
    // Nothing to free now.
    let gone = admin.show("nothing").await.unwrap();
    assert_eq!(admin.force_release(&gone).await.unwrap(), ForceReleased::Gone);
}

async fn a_forced_release_spares_a_lock_that_changed_hands(t: Target) {
    let c = t.client();
    let admin = Admin::new(c.clone());
    let first = c.acquire("hands", &minute()).await.unwrap();
    let seen = admin.show("hands").await.unwrap();
    assert!(first.release().await.unwrap());
    let second = c.acquire("hands", &minute()).await.unwrap();
    assert_eq!(admin.force_release(&seen).await.unwrap(), ForceReleased::Changed);
    assert!(!second.is_lost());
    assert!(c.is_locked("hands").await.unwrap(), "the new holder keeps it");
    assert!(second.release().await.unwrap());
}

/// Readers seen, gone by the forced release, and a semaphore holding the key since: it changed
/// hands (another kind of holder counts as much as another writer).
async fn a_forced_release_of_readers_spares_a_semaphore_that_came_after(t: Target) {
    let c = t.client();
    let admin = Admin::new(c.clone());
    let read = minute().mode(LockMode::Shared);
    let reader = c.acquire("kinds", &read).await.unwrap();
    let seen = admin.show("kinds").await.unwrap();
    assert!(reader.release().await.unwrap());
    let permit = c.acquire("kinds", &minute().permits(2)).await.unwrap();
    assert_eq!(admin.force_release(&seen).await.unwrap(), ForceReleased::Changed);
    assert!(!permit.is_lost());
    assert!(permit.release().await.unwrap());
}

async fn a_watch_sees_locks_come_and_go(t: Target) {
    let c = t.client();
    let admin = Admin::new(c.clone());
    let mut watch = admin.watch("job:*", Duration::from_millis(50)).await.unwrap();
    assert_eq!(watch.held(), 0);
    let guard = c.acquire("job:nightly", &minute()).await.unwrap();
    let _other = c.acquire("report:1", &minute()).await.unwrap();
    let events = tokio::time::timeout(10 * SECOND, watch.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        (events[0].kind, events[0].key.as_str()),
        (EventKind::Acquired, "job:nightly")
    );
    assert!(events[0].lease().is_some_and(|l| l <= Duration::from_secs(60)));
    assert!(guard.release().await.unwrap());
    let events = tokio::time::timeout(10 * SECOND, watch.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        (events[0].kind, events[0].key.as_str()),
        (EventKind::Released, "job:nightly")
    );
}
