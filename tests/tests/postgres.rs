//! The PostgreSQL store under faults, on servers the kit starts itself (one per test): a restart
//! while locks are held, connections killed by `pg_terminate_backend`, the server stopped, a
//! frozen holder's late write refused by the fence check, rows that do not pile up, and the
//! refusals a misconfigured client gets. The behaviour suite runs on PostgreSQL too
//! (`behaviour.rs`, `coordination.rs`, `read_write.rs`: the `postgres::` tests).

use std::time::Duration;

use lock_runtime::{LockClient, LockError};
use lock_tests::{
    assert_woken_by_the_release, eventually, holds_within, in_line, ttl, FaultProxy, PostgresServer, SECOND,
};
use sqlx::postgres::PgPool;
use sqlx::Connection;
use tokio::time::Instant;

/// The `key` column of a lock's row: its name, `<prefix>{<key>}`, as every store names it.
fn row_key(prefix: &str, key: &str) -> String {
    lock_runtime::redis::keys::LockKeys::new(prefix, key)
        .lock()
        .to_owned()
}

fn builder(url: &str) -> lock_runtime::LockClientBuilder {
    LockClient::builder()
        .postgres(url)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(1))
}

async fn client(server: &PostgresServer) -> LockClient {
    builder(&server.url())
        .build()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", server.url()))
}

async fn pool(server: &PostgresServer) -> PgPool {
    PgPool::connect(&server.url())
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", server.url()))
}

/// A client whose connections go through `proxy`.
async fn through(proxy: &FaultProxy) -> LockClient {
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    builder(&url).build().await.unwrap()
}

/// Runs a blocking step of the kit (it waits for the server) off the runtime's workers.
async fn blocking<T: Send + 'static>(step: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(step)
        .await
        .expect("the kit's step panicked")
}

/// How many sessions wait for a lock (a row's, a table's, an advisory one) and meet `and`, a
/// condition on their `pg_stat_activity` row.
async fn waiting_for_a_lock(db: &PgPool, and: &str) -> i64 {
    let asked = format!("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND ({and})");
    sqlx::query_scalar(&asked).fetch_one(db).await.unwrap()
}

/// A lock is a committed row: a restart (fast shutdown, then start) keeps it, its holder's
/// watchdog renews it once the server is back, others are refused meanwhile, and the fencing
/// token after it is larger (the sequence does not go back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_locks_survive_a_restart_and_their_holders_keep_them() {
    let server = PostgresServer::spawn();
    let (c, other) = (client(&server).await, client(&server).await);
    let guard = c
        .acquire("order:1", &ttl(6000).watchdog(true).fencing(true))
        .await
        .unwrap();
    let before = guard.fencing_token().unwrap();
    let mut server = blocking(move || {
        let mut server = server;
        server.restart();
        server
    })
    .await;
    // Held through two whole ttls after the restart: the watchdog renewed it on the new server.
    let until = Instant::now() + Duration::from_millis(12_000);
    let mut refused = 0;
    while Instant::now() < until {
        assert!(!guard.is_lost(), "the holder lost its lock across the restart");
        match other.acquire("order:1", &ttl(6000)).await {
            Err(LockError::Busy { .. }) => refused += 1,
            Err(LockError::Unavailable { .. }) => {} // reconnecting
            other => panic!("a second holder after the restart: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(refused > 10, "others were refused: {refused}");
    assert!(guard.release().await.unwrap(), "still ours after the restart");
    let next = other.acquire("order:1", &ttl(6000).fencing(true)).await.unwrap();
    assert!(
        next.fencing_token().unwrap() > before,
        "{:?} after {before}",
        next.fencing_token()
    );
    next.release().await.unwrap();
    server.stop();
}

/// Every connection of the clients killed by the server (`pg_terminate_backend`): requests go
/// on, on new connections, and the listening connection is opened again, so a waiter is still
/// woken by the release, not by its holder's expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_are_replaced_and_the_listener_listens_again() {
    let server = PostgresServer::spawn();
    let (c, other) = (client(&server).await, client(&server).await);
    let admin = pool(&server).await;
    // The listening connections' backends (a terminated one lingers in pg_stat_activity for a
    // moment after pg_terminate_backend answered).
    let listening = || async {
        sqlx::query_scalar::<_, i32>(
            "SELECT pid FROM pg_stat_activity \
             WHERE application_name = 'lock-runtime' AND query ILIKE 'LISTEN%'",
        )
        .fetch_all(&admin)
        .await
        .unwrap()
    };
    let holder = c.acquire("slow", &ttl(60_000)).await.unwrap();
    let waiter = in_line(&other, "slow", ttl(5000).wait(30 * SECOND)).await;
    eventually(5 * SECOND, "the waiter's client listens", || async {
        listening().await.len() == 1
    })
    .await;
    let before = listening().await;
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'lock-runtime'",
    )
    .fetch_all(&admin)
    .await
    .unwrap();
    assert!(killed.len() >= 3, "the pools' and the listener's: {killed:?}");
    eventually(10 * SECOND, "the listener is back", || async {
        let now = listening().await;
        now.len() == 1 && now != before
    })
    .await;
    // The waiter re-checked its lock (a release may have gone unheard) and waits again.
    assert!(!waiter.is_finished());
    let released = Instant::now();
    assert!(holder.release().await.unwrap(), "released on a new connection");
    let guard = waiter.await.unwrap().unwrap();
    assert_woken_by_the_release(released.elapsed());
    assert!(guard.release().await.unwrap());
}

/// A release while the listening connection is being opened again (killed just before) still
/// reaches the waiter at once: it re-checks the lock when the listener is lost, and once more
/// when it listens again, so a release between its attempt and the new `LISTEN` is not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_while_the_listener_reconnects_still_wakes_the_waiter() {
    let server = PostgresServer::spawn();
    let (c, other) = (client(&server).await, client(&server).await);
    let admin = pool(&server).await;
    for round in 0..5 {
        let key = format!("gap:{round}");
        let holder = c.acquire(&key, &ttl(60_000)).await.unwrap();
        let waiter = tokio::spawn({
            let (other, key) = (other.clone(), key.clone());
            async move { other.acquire(&key, &ttl(5000).wait(30 * SECOND)).await }
        });
        eventually(5 * SECOND, "the waiter listens", || async {
            let listening: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = 'lock-runtime' AND query ILIKE 'LISTEN%'",
            )
            .fetch_one(&admin)
            .await
            .unwrap();
            listening == 1 && other.waiting(&key).unwrap() == 1
        })
        .await;
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'lock-runtime' AND query ILIKE 'LISTEN%'",
        )
        .execute(&admin)
        .await
        .unwrap();
        let released = Instant::now();
        assert!(holder.release().await.unwrap());
        let guard = waiter.await.unwrap().unwrap();
        assert_woken_by_the_release(released.elapsed());
        assert!(guard.release().await.unwrap());
    }
}

/// A writer whose release (or renewal) waited for the lock's row while its lease ended, and a
/// reader took a share meanwhile: the release finds the lock no longer its own and leaves the
/// share alone (the lease is judged by the clock after the wait, and the share clears the
/// expired writer's value). The interleaving is made with the row locked by hand, and the
/// reader's share taken in that transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_writers_late_release_or_renewal_spares_the_readers() {
    let server = PostgresServer::spawn();
    let c = client(&server).await;
    let db = pool(&server).await;
    for late in ["release", "extend"] {
        let key = format!("shelf:{late}");
        let lock_key = row_key(lock_runtime::DEFAULT_PREFIX, &key);
        let ttl_ms = 600;
        let taken_at = Instant::now();
        let writer = c.acquire(&key, &ttl(ttl_ms)).await.unwrap();
        // Before the writer's lease ends, the row is held by a transaction of our own...
        let mut tx = db.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM lock_runtime_locks WHERE key = $1 FOR UPDATE")
            .bind(&lock_key)
            .execute(&mut *tx)
            .await
            .unwrap();
        assert!(
            taken_at.elapsed() < Duration::from_millis(ttl_ms / 2),
            "too slow to test"
        );
        // ... so the writer's late request starts in time, and waits for it.
        let late_request = tokio::spawn(async move {
            match late {
                "release" => writer.release().await.map(|released| released.to_string()),
                _ => writer
                    .extend(Duration::from_secs(30))
                    .await
                    .map(|()| "extended".to_owned()),
            }
        });
        eventually(5 * SECOND, "the writer's request waits for the row", || async {
            waiting_for_a_lock(&db, "true").await == 1
        })
        .await;
        // The writer's lease ends, by the database's clock (the row is read, not locked).
        eventually(5 * SECOND, "the writer's lease has ended", || async {
            let ended: bool = sqlx::query_scalar(
                "SELECT expires_ms < lock_runtime_v1_now() FROM lock_runtime_locks WHERE key = $1",
            )
            .bind(&lock_key)
            .fetch_one(&db)
            .await
            .unwrap();
            ended
        })
        .await;
        // A reader takes a share, in the transaction that holds the row, and commits.
        let (got,): (bool,) =
            sqlx::query_as("SELECT got FROM lock_runtime_v1_share($1, 'reader', 30000, false)")
                .bind(&lock_key)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
        assert!(got, "the reader takes a share of the expired lock");
        tx.commit().await.unwrap();
        let answer = late_request.await.unwrap();
        assert!(
            matches!(answer.as_deref(), Ok("false") | Err(LockError::Lost { .. })),
            "the expired writer's {late}: {answer:?}"
        );
        let holder = c.holder(&key).await.unwrap().expect("the reader still holds it");
        assert!(holder.is_shared(), "{holder:?}");
        let left = holder.remaining().unwrap();
        assert!(
            left > Duration::from_secs(20),
            "the reader's share is as it took it: {left:?}"
        );
    }
}

/// A release that keeps the lock for its minimum hold tells the waiters of other clients, so
/// they wait for the hold, not for the lease the lock had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_another_client_waits_for_the_minimum_hold_not_the_lease() {
    let t = lock_tests::Target::postgres().await;
    let (c, other) = (t.client(), t.other_client().await);
    let hold = Duration::from_millis(300);
    let holder = c.acquire("job", &ttl(60_000).hold_at_least(hold)).await.unwrap();
    let waiter = in_line(&other, "job", ttl(5000).wait(30 * SECOND)).await;
    let released = Instant::now();
    assert!(holder.release().await.unwrap(), "kept for its minimum hold");
    let guard = waiter.await.unwrap().unwrap();
    assert_woken_by_the_release(released.elapsed().saturating_sub(hold));
    assert!(guard.release().await.unwrap());
}

/// A writer that waited for readers (and claimed its turn, holding new readers back) takes the
/// lock with the mark those readers left (set again by their next refusal, or kept by the take:
/// the take itself keeping it is not isolated here), and its release wakes them at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_held_back_by_a_writers_claim_are_woken_by_its_release() {
    let t = lock_tests::Target::postgres().await;
    let (c, other) = (t.client(), t.other_client().await);
    let read = ttl(60_000).mode(lock_runtime::LockMode::Shared);
    let share = c.acquire("prices", &read).await.unwrap();
    let writer = in_line(&other, "prices", ttl(60_000).wait(30 * SECOND)).await;
    // A reader of a third client, refused by the writer's claim, waits.
    let third = t.other_client().await;
    let reader = in_line(&third, "prices", read.clone().wait(30 * SECOND)).await;
    assert!(share.release().await.unwrap());
    let write = writer.await.unwrap().unwrap();
    // The row still says a waiter wants to hear the release (the readers' mark).
    let db = PgPool::connect(&lock_tests::shared_postgres_url()).await.unwrap();
    let lock_key = row_key(c.prefix(), "prices");
    let marked: bool = sqlx::query_scalar("SELECT marked FROM lock_runtime_locks WHERE key = $1")
        .bind(&lock_key)
        .fetch_one(&db)
        .await
        .unwrap();
    assert!(marked, "the writer's acquire cleared the readers' mark");
    let released = Instant::now();
    assert!(write.release().await.unwrap());
    let share = reader.await.unwrap().unwrap();
    assert_woken_by_the_release(released.elapsed());
    assert!(share.release().await.unwrap());
}

/// A refused attempt commits without waiting for its WAL to be flushed (what it writes, a
/// place in line, a writer's claim, a waiting mark, grants nothing), and the row lock it holds
/// is let go sooner: a refused permit (fair or not), a refused lock (fair or not) and a share
/// refused by a writer or by a waiting writer's claim each leave `synchronous_commit` off for
/// their transaction. A grant commits as the server is set to. Each function is called in a
/// transaction of the test's own, which reads the setting before it rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_commits_without_waiting_for_the_flush_and_a_grant_waits() {
    let t = lock_tests::Target::postgres().await;
    let c = t.client();
    let permit = ttl(60_000).permits(2);
    let _permits = (
        c.acquire("lazy:sem", &permit).await.unwrap(),
        c.acquire("lazy:sem", &permit).await.unwrap(),
    );
    let _lock = c.acquire("lazy:lock", &ttl(60_000)).await.unwrap();
    // A share, and a writer of another client waiting behind it: its claim of the writers' turn
    // keeps new readers out.
    let _share = c
        .acquire("lazy:claimed", &ttl(60_000).mode(lock_runtime::LockMode::Shared))
        .await
        .unwrap();
    let other = t.other_client().await;
    let writer = in_line(&other, "lazy:claimed", ttl(60_000).wait(60 * SECOND)).await;
    // (key, token, ttl, permits, fencing, waiting, fair, joining, place ms)
    let fair_permit = "SELECT got FROM lock_runtime_v1_take_permit($1, 'lazy-token', 60000, 2, false, true, true, true, 5000)";
    let permit_not_fair = "SELECT got FROM lock_runtime_v1_take_permit($1, 'lazy-token', 60000, 2, false, true, false, true, 5000)";
    // (key, channel, token, ttl, fencing, waiting, fair, joining, claimed, place ms, lock ms)
    let fair_lock = "SELECT got FROM lock_runtime_v1_acquire($1, 'chan', 'lazy-token', 60000, false, true, true, true, false, 5000, 0)";
    let lock_not_fair = "SELECT got FROM lock_runtime_v1_acquire($1, 'chan', 'lazy-token', 60000, false, true, false, true, false, 5000, 0)";
    // (key, token, ttl, waiting)
    let share = "SELECT got FROM lock_runtime_v1_share($1, 'lazy-token', 60000, true)";
    let db = PgPool::connect(&lock_tests::shared_postgres_url()).await.unwrap();
    let set_to: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_ne!(
        set_to, "off",
        "the server commits lazily already: nothing to tell apart"
    );
    let set_to = set_to.as_str();
    for (what, statement, key, granted, commits) in [
        ("a refused fair permit", fair_permit, "lazy:sem", false, "off"),
        ("a refused permit", permit_not_fair, "lazy:sem", false, "off"),
        ("a refused fair lock", fair_lock, "lazy:lock", false, "off"),
        ("a refused lock", lock_not_fair, "lazy:lock", false, "off"),
        ("a share refused by a writer", share, "lazy:lock", false, "off"),
        ("a share refused by a claim", share, "lazy:claimed", false, "off"),
        ("a permit granted", permit_not_fair, "lazy:free-sem", true, set_to),
        (
            "a fair permit granted",
            fair_permit,
            "lazy:free-sem",
            true,
            set_to,
        ),
        ("a lock granted", lock_not_fair, "lazy:free-lock", true, set_to),
        ("a fair lock granted", fair_lock, "lazy:free-lock", true, set_to),
        ("a share granted", share, "lazy:free-share", true, set_to),
    ] {
        let mut tx = db.begin().await.unwrap();
        let got: bool = sqlx::query_scalar(statement)
            .bind(row_key(c.prefix(), key))
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(got, granted, "{what}: granted");
        let setting: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(setting, commits, "{what}: synchronous_commit for its transaction");
        tx.rollback().await.unwrap();
    }
    writer.abort();
}

/// Two clients renewing shares of the same keys, listed in opposite orders, never deadlock
/// (each renewal locks its rows in key order first). Driven through the store's renewal
/// function directly, so that the orders are the opposite ones every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_of_shares_in_opposite_orders_never_deadlock() {
    let t = lock_tests::Target::postgres().await;
    let db = PgPool::connect(&lock_tests::shared_postgres_url()).await.unwrap();
    let keys: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|k| row_key(t.client().prefix(), k))
        .collect();
    for key in &keys {
        for reader in ["ra", "rb"] {
            let (got,): (bool,) =
                sqlx::query_as("SELECT got FROM lock_runtime_v1_share($1, $2, 60000, false)")
                    .bind(key)
                    .bind(reader)
                    .fetch_one(&db)
                    .await
                    .unwrap();
            assert!(got);
        }
    }
    let renewals = ["ra", "rb"].map(|reader| {
        let (db, mut keys) = (db.clone(), keys.clone());
        if reader == "rb" {
            keys.reverse();
        }
        tokio::spawn(async move {
            let tokens = vec![reader; keys.len()];
            let ttls = vec![60_000_i64; keys.len()];
            for _ in 0..300 {
                let renewed: Vec<i32> = sqlx::query_scalar("SELECT lock_runtime_v1_renew($1, $2, $3)")
                    .bind(&keys)
                    .bind(&tokens)
                    .bind(&ttls)
                    .fetch_all(&db)
                    .await
                    .unwrap_or_else(|e| panic!("a renewal failed: {e}"));
                assert_eq!(renewed.len(), keys.len());
            }
        })
    });
    for renewal in renewals {
        renewal.await.unwrap();
    }
}

/// The server gone: every request fails with `Unavailable` within the timeouts (no hang), a
/// new client's `build` too; once the server is back, the same client works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_unavailable_without_a_hang() {
    let server = PostgresServer::spawn();
    let c = client(&server).await;
    let guard = c.acquire("held", &ttl(30_000)).await.unwrap();
    let mut server = blocking(move || {
        let mut server = server;
        server.kill();
        server
    })
    .await;
    // Bounded by the connect and response timeouts (3 s here), with room for a slow machine.
    let bound = Duration::from_secs(10);
    let started = Instant::now();
    let refused = c.acquire("other", &ttl(1000)).await;
    assert!(
        matches!(refused, Err(LockError::Unavailable { .. })),
        "{refused:?}"
    );
    assert!(matches!(
        c.is_locked("held").await,
        Err(LockError::Unavailable { .. })
    ));
    assert!(matches!(
        guard.extend(Duration::from_secs(30)).await,
        Err(LockError::Unavailable { .. })
    ));
    let built = builder(&server.url()).build().await;
    assert!(matches!(built, Err(LockError::Unavailable { .. })), "{built:?}");
    assert!(started.elapsed() < bound, "{:?}", started.elapsed());
    let server = blocking(move || {
        server.start_again();
        server
    })
    .await;
    eventually(10 * SECOND, "the client works again", || async {
        c.is_locked("held").await.is_ok()
    })
    .await;
    assert!(c.is_locked("held").await.unwrap(), "the lock survived the crash");
    assert!(guard.release().await.unwrap());
    drop(server);
}

/// A holder frozen past its lease (it neither renews nor knows) writes late: the next holder has
/// a larger token and wrote first, and the fence check in the late write's transaction refuses
/// it. A late write that comes while the newer one's transaction is open waits for it, then is
/// refused: the check and the write commit together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holders_fenced_write_is_refused() {
    use lock_runtime::fencing::postgres::{check_fence, create_fence_table};
    let server = PostgresServer::spawn();
    let (c, other) = (client(&server).await, client(&server).await);
    let db = pool(&server).await;
    let mut conn = db.acquire().await.unwrap();
    create_fence_table(&mut conn).await.unwrap();
    sqlx::query("CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO accounts VALUES (7, 100)")
        .execute(&mut *conn)
        .await
        .unwrap();
    // The first holder takes the lock, then freezes: no watchdog, its lease ends.
    let frozen = c.acquire("account:7", &ttl(300).fencing(true)).await.unwrap();
    let stale = frozen.fencing_token().unwrap();
    let next = other
        .acquire("account:7", &ttl(10_000).fencing(true).wait(10 * SECOND))
        .await
        .unwrap();
    let newer = next.fencing_token().unwrap();
    assert!(newer > stale, "{newer} <= {stale}");
    assert!(frozen.is_lost(), "the frozen holder's validity has passed");
    // The next holder writes, and holds its transaction open.
    let mut tx = db.begin().await.unwrap();
    assert!(check_fence(&mut tx, "account:7", newer).await.unwrap());
    sqlx::query("UPDATE accounts SET balance = 90 WHERE id = 7")
        .execute(&mut *tx)
        .await
        .unwrap();
    // The frozen one wakes and writes late: its check waits for the open transaction.
    let late = tokio::spawn({
        let db = db.clone();
        async move {
            let mut tx = db.begin().await.unwrap();
            if !check_fence(&mut tx, "account:7", stale).await.unwrap() {
                return false; // rolled back as `tx` drops
            }
            sqlx::query("UPDATE accounts SET balance = 0 WHERE id = 7")
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            true
        }
    });
    eventually(5 * SECOND, "the late check waits for the row", || async {
        waiting_for_a_lock(&db, "true").await == 1
    })
    .await;
    tx.commit().await.unwrap();
    assert!(!late.await.unwrap(), "the stale write was accepted");
    let balance: i32 = sqlx::query_scalar("SELECT balance FROM accounts WHERE id = 7")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(balance, 90, "only the newer holder's write is there");
    // The same holder writing again is not stale.
    let mut again = db.begin().await.unwrap();
    assert!(check_fence(&mut again, "account:7", newer).await.unwrap());
    again.commit().await.unwrap();
    assert!(!frozen.release().await.unwrap(), "its lock was no longer its");
    assert!(next.release().await.unwrap());
}

/// Rows do not pile up: a released lock without fencing leaves no row, and the locks of
/// crashed holders (never released) are swept once they have expired, by the client's
/// occasional sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_and_expired_locks_leave_no_rows() {
    let server = PostgresServer::spawn();
    let c = client(&server).await;
    let db = pool(&server).await;
    let rows = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM lock_runtime_locks")
            .fetch_one(&db)
            .await
            .unwrap()
    };
    let guard = c.acquire("released", &ttl(5000)).await.unwrap();
    assert_eq!(rows().await, 1);
    assert!(guard.release().await.unwrap());
    assert_eq!(rows().await, 0, "the release deleted the row");
    // Forgotten guards: each one's row stays until it has expired (its release, in the
    // background, is lost with the crash here: the guards are leaked).
    for i in 0..20 {
        std::mem::forget(c.acquire(&format!("crashed:{i}"), &ttl(100)).await.unwrap());
    }
    assert_eq!(rows().await, 20);
    // Until the sweep deletes them (every 1024 acquires, once expired for 2 s).
    let sweeping = async {
        loop {
            let guard = c.acquire("busy", &ttl(5000)).await.unwrap();
            guard.release().await.unwrap();
        }
    };
    tokio::select! {
        () = eventually(30 * SECOND, "the expired rows are swept", || async { rows().await == 0 }) => {}
        () = sweeping => {}
    }
}

/// A client dropped closes its connections, the listening one too: a service that makes
/// clients and drops them leaks no connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_client_closes_its_connections() {
    let server = PostgresServer::spawn();
    let admin = pool(&server).await;
    let connections = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lock-runtime'",
        )
        .fetch_one(&admin)
        .await
        .unwrap()
    };
    let (c, other) = (client(&server).await, client(&server).await);
    let holder = c.acquire("k", &ttl(60_000)).await.unwrap();
    let waiter = in_line(&other, "k", ttl(5000).wait(SECOND)).await;
    assert!(matches!(waiter.await.unwrap(), Err(LockError::Busy { .. })));
    assert!(connections().await >= 3, "the pools' and the listener's");
    drop(holder);
    c.shutdown().await;
    drop((c, other));
    eventually(10 * SECOND, "every connection is closed", || async {
        connections().await == 0
    })
    .await;
}

/// Misconfigurations are refused with what to fix: a database that does not exist, a role that
/// may not make the tables, and a URL that is not PostgreSQL's; `LockClient::connect` takes a
/// `postgres://` URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misconfigured_clients_are_refused_with_what_to_fix() {
    let server = PostgresServer::spawn();
    let base = format!("postgres://postgres@127.0.0.1:{}", server.port());
    let missing = builder(&format!("{base}/no_such_db")).build().await;
    assert!(
        matches!(&missing, Err(LockError::Refused { reason, .. }) if reason.contains("does not exist")),
        "{missing:?}"
    );
    let mut admin = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    for statement in ["CREATE ROLE lockless LOGIN", "CREATE DATABASE locks"] {
        sqlx::raw_sql(statement).execute(&mut admin).await.unwrap();
    }
    let mut locks = sqlx::PgConnection::connect(&format!("{base}/locks"))
        .await
        .unwrap();
    sqlx::raw_sql("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        .execute(&mut locks)
        .await
        .unwrap();
    let url = format!("postgres://lockless@127.0.0.1:{}/locks", server.port());
    let denied = builder(&url).build().await;
    assert!(
        matches!(&denied, Err(LockError::Refused { reason, .. }) if reason.contains("lacks a right")),
        "{denied:?}"
    );
    // Once a client that may create has made the schema, the rights the guide names are enough.
    builder(&format!("{base}/locks")).build().await.unwrap();
    // The tables alone are not enough: the build is refused (not the first fenced or fair
    // acquire), naming the database and what is missing.
    sqlx::raw_sql(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON lock_runtime_locks, lock_runtime_line, \
         lock_runtime_fenced TO lockless",
    )
    .execute(&mut locks)
    .await
    .unwrap();
    let partly = builder(&url).build().await;
    let Err(LockError::Refused { reason, source }) = &partly else {
        panic!("{partly:?}")
    };
    assert!(reason.contains("lacks a right"), "{reason}");
    let said = source.to_string();
    let at = format!("PostgreSQL at 127.0.0.1:{}/locks", server.port());
    assert!(
        said.contains(&at) && said.contains("lock_runtime_fences"),
        "{said}"
    );
    sqlx::raw_sql("GRANT USAGE ON SEQUENCE lock_runtime_fences TO lockless")
        .execute(&mut locks)
        .await
        .unwrap();
    let partly = builder(&url).build().await;
    assert!(
        matches!(&partly, Err(LockError::Refused { source, .. }) if source.to_string().contains("lock_runtime_arrivals")),
        "{partly:?}"
    );
    sqlx::raw_sql("GRANT USAGE ON SEQUENCE lock_runtime_arrivals TO lockless")
        .execute(&mut locks)
        .await
        .unwrap();
    // A semaphore's holders are rows of their own table.
    let partly = builder(&url).build().await;
    assert!(
        matches!(&partly, Err(LockError::Refused { source, .. }) if source.to_string().contains("lock_runtime_permits")),
        "{partly:?}"
    );
    sqlx::raw_sql("GRANT SELECT, INSERT, UPDATE, DELETE ON lock_runtime_permits TO lockless")
        .execute(&mut locks)
        .await
        .unwrap();
    let granted = builder(&url).build().await.unwrap();
    let fair = ttl(1000).fair(true).fencing(true);
    let guard = granted.acquire("granted", &fair).await.unwrap();
    assert!(guard.fencing_token().is_some());
    assert!(guard.release().await.unwrap());
    let read = ttl(1000).mode(lock_runtime::LockMode::Shared);
    assert!(granted
        .acquire("granted", &read)
        .await
        .unwrap()
        .release()
        .await
        .unwrap());
    let bad = LockClient::builder().postgres("mysql://localhost/x").build_lazy();
    assert!(matches!(bad, Err(LockError::InvalidOptions { .. })), "{bad:?}");
    let c = LockClient::connect(&format!("{base}/postgres")).await.unwrap();
    let guard = c.acquire("connected", &ttl(1000)).await.unwrap();
    assert!(guard.release().await.unwrap());
    assert!(format!("{c:?}").contains("PostgreSQL"), "{c:?}");
}

/// Readers racing on one key, each share as short as it gets, so that a reader often arrives
/// while the last one's release deletes the row: every share taken is in the store while it is
/// held. (A share once met the row deleted under it, between the statement that saw the row and
/// the one that locked it, and took a lock that was nowhere: a writer then entered beside it.)
/// Clients starting together on a database without the schema make it once: each one that
/// found it missing and waited for the one making it finds it there once it may make it, and
/// makes nothing (a second making would lock the table against the first one's holders until it
/// commits: a watchdog's renewals waited, and locks with a short ttl were lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_starting_together_make_the_schema_once() {
    let server = PostgresServer::spawn();
    let admin = pool(&server).await;
    // The store's advisory lock for making the schema (the ASCII of "lockrtv1"), held here so
    // that both clients find the schema missing and wait for it.
    let mut gate = admin.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(0x6c6f_636b_7274_7631_i64)
        .execute(&mut *gate)
        .await
        .unwrap();
    let url = server.url();
    let starting: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                builder(&url)
                    .connect_timeout(Duration::from_secs(30))
                    .build()
                    .await
            })
        })
        .collect();
    eventually(20 * SECOND, "both clients wait to make the schema", || async {
        waiting_for_a_lock(&admin, "wait_event = 'advisory'").await == 2
    })
    .await;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(0x6c6f_636b_7274_7631_i64)
        .execute(&mut *gate)
        .await
        .unwrap();
    for client in starting {
        client.await.unwrap().unwrap();
    }
    // One transaction made the table and, last, the function every making replaces: a second
    // making would have replaced it in a transaction of its own.
    let made_by: Vec<String> = sqlx::query_scalar(
        "SELECT xmin::text FROM pg_class WHERE oid = 'lock_runtime_locks'::regclass \
         UNION ALL SELECT xmin::text FROM pg_proc WHERE oid = 'lock_runtime_v1_sweep(integer)'::regprocedure",
    )
    .fetch_all(&admin)
    .await
    .unwrap();
    assert_eq!(made_by.len(), 2, "{made_by:?}");
    assert_eq!(made_by[0], made_by[1], "the schema was made twice");
}

/// A client of a newer build makes its schema again while another's locks are held (a rolling
/// upgrade): their renewals and a fair caller's requests go on meanwhile, as nothing of the
/// making locks the tables they write when the tables have their columns and indexes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn making_the_schema_again_holds_up_no_request() {
    let server = PostgresServer::spawn();
    let holder = client(&server).await;
    let admin = pool(&server).await;
    let guard = holder
        .acquire("upgrade", &ttl(600).watchdog(true).fencing(true))
        .await
        .unwrap();
    // The schema as an older build's, then a session that keeps the mark's row locked, so the
    // next making waits at its end with everything before done.
    sqlx::raw_sql("COMMENT ON FUNCTION lock_runtime_v1_sweep(integer) IS 'an older build'")
        .execute(&admin)
        .await
        .unwrap();
    let mut keeping = admin.begin().await.unwrap();
    sqlx::raw_sql("COMMENT ON FUNCTION lock_runtime_v1_sweep(integer) IS 'kept'")
        .execute(&mut *keeping)
        .await
        .unwrap();
    let url = server.url();
    let newer = tokio::spawn(async move {
        builder(&url)
            .connect_timeout(Duration::from_secs(30))
            .build()
            .await
    });
    eventually(20 * SECOND, "the making waits", || async {
        waiting_for_a_lock(&admin, "application_name = 'lock-runtime'").await > 0
    })
    .await;
    // Five ttls with the making under way: every renewal answered in time.
    let until = Instant::now() + Duration::from_millis(3000);
    while Instant::now() < until {
        assert!(!guard.is_lost(), "a renewal waited for the making");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A fair caller's request writes to the line's table: nothing of the making holds that up
    // either (its indexes are there).
    let fair = holder
        .acquire("upgrade:fair", &ttl(5000).fair(true))
        .await
        .expect("a fair acquire during the making");
    assert!(fair.release().await.unwrap());
    keeping.rollback().await.unwrap();
    let newer = newer.await.unwrap().unwrap();
    assert!(guard.release().await.unwrap(), "held throughout");
    drop(newer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_taken_while_the_row_goes_is_in_the_store() {
    let t = lock_tests::Target::postgres().await;
    let clients = [t.client(), t.other_client().await];
    let tasks = (0..8).map(|i| {
        let client = clients[i % 2].clone();
        tokio::spawn(async move {
            let options = ttl(10_000).mode(lock_runtime::LockMode::Shared);
            for _ in 0..100 {
                let share = client.acquire("race", &options).await.unwrap();
                assert!(client.is_locked("race").await.unwrap(), "a share that is nowhere");
                assert!(share.release().await.unwrap(), "a share that was not there");
            }
        })
    });
    for task in futures_util::future::join_all(tasks).await {
        task.unwrap();
    }
}

/// Fencing tokens never repeat after a failover to an asynchronous standby that missed the
/// sequence's last values (the same hole as a point-in-time restore or `synchronous_commit =
/// off`): the standby is cut off from its primary (a proxy between them stops relaying), fenced
/// locks are taken on the primary, the primary is killed, the standby promoted. Its sequence is
/// behind what the primary handed out, and every token after the failover is still larger than
/// every token before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_repeat_after_a_failover_to_a_standby_that_missed_them() {
    let mut primary = PostgresServer::spawn();
    let proxy = FaultProxy::start(primary.port());
    let port = proxy.port();
    let standby = blocking(move || PostgresServer::standby_of(port)).await;
    let db = pool(&primary).await;
    let replica = pool(&standby).await;
    let c = client(&primary).await;
    let mut issued = Vec::new();
    for key in ["account:7", "account:8"] {
        issued.push(fenced_pair(&c, key).await);
    }
    // The standby has everything so far, then hears nothing more.
    let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&db)
        .await
        .unwrap();
    eventually(
        30 * SECOND,
        "the standby replayed the schema and the first locks",
        || async {
            sqlx::query_scalar::<_, bool>("SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)")
                .bind(&lsn)
                .fetch_one(&replica)
                .await
                .unwrap_or(false)
        },
    )
    .await;
    proxy.blackhole();
    for round in 0..40 {
        let key = if round % 2 == 0 { "account:7" } else { "account:9" };
        issued.push(fenced_pair(&c, key).await);
    }
    let handed_out: i64 = sqlx::query_scalar("SELECT last_value FROM lock_runtime_fences")
        .fetch_one(&db)
        .await
        .unwrap();
    drop((c, db));
    blocking(move || primary.kill()).await;
    let promoted: bool = sqlx::query_scalar("SELECT pg_promote(true, 60)")
        .fetch_one(&replica)
        .await
        .unwrap();
    assert!(promoted);
    let behind: i64 = sqlx::query_scalar("SELECT last_value FROM lock_runtime_fences")
        .fetch_one(&replica)
        .await
        .unwrap();
    assert!(
        behind < handed_out,
        "the standby's sequence ({behind}) should be behind what the primary handed out ({handed_out}): the test cut nothing"
    );
    let before = issued.iter().copied().max().unwrap();
    let after = client(&standby).await;
    for key in ["account:7", "account:8", "account:9", "account:10"] {
        let token = fenced_pair(&after, key).await;
        assert!(
            token > before,
            "{key}: {token} after the failover, {before} before it"
        );
    }
}

/// A fenced lock taken and released: its token.
async fn fenced_pair(c: &LockClient, key: &str) -> u64 {
    let guard = c.acquire(key, &ttl(5000).fencing(true)).await.unwrap();
    let token = guard.fencing_token().unwrap();
    assert!(guard.release().await.unwrap());
    token
}

/// A key's next token is larger than its last even when the database clock is behind that last
/// token (a clock stepped back, a host whose clock is slow): the row keeps the last token, and the
/// next is one more, on the plain acquire's statement and on the function's (a fair lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_tokens_rise_when_the_clock_is_behind_its_last_token() {
    let server = PostgresServer::spawn();
    let c = client(&server).await;
    let db = pool(&server).await;
    // Far above the clock in microseconds (about 1.8e15 in 2026).
    let ahead: i64 = 100_000_000_000_000_000;
    for (key, options) in [
        ("plain", ttl(5000).fencing(true)),
        ("fair", ttl(5000).fencing(true).fair(true)),
    ] {
        fenced_pair(&c, key).await;
        let set = sqlx::query("UPDATE lock_runtime_locks SET fence = $2 WHERE key = $1")
            .bind(format!("lock:{{{key}}}"))
            .bind(ahead)
            .execute(&db)
            .await
            .unwrap();
        assert_eq!(
            set.rows_affected(),
            1,
            "a fenced lock's row stays after its release"
        );
        let guard = c.acquire(key, &options).await.unwrap();
        assert_eq!(guard.fencing_token(), Some(ahead as u64 + 1), "{key}");
        assert!(guard.release().await.unwrap());
    }
}

/// Two services whose connections have different `search_path`s (the URL's `options`, a role's
/// or a database's setting) lock in one table: the store's connections resolve its names in
/// its schema (`public` unless the builder names another), whatever the path says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_with_different_search_paths_exclude_each_other() {
    let server = PostgresServer::spawn();
    let admin = pool(&server).await;
    sqlx::raw_sql("CREATE SCHEMA app_a; CREATE SCHEMA app_b; ALTER ROLE postgres SET search_path = app_b")
        .execute(&admin)
        .await
        .unwrap();
    let a = builder(&format!("{}?options=-c%20search_path%3Dapp_a", server.url()))
        .build()
        .await
        .unwrap();
    // The role's setting: app_b.
    let b = client(&server).await;
    let held = a.acquire("order:1", &ttl(10_000)).await.unwrap();
    let refused = b.acquire("order:1", &ttl(10_000)).await;
    assert!(matches!(refused, Err(LockError::Busy { .. })), "{refused:?}");
    let held_b = b.acquire("order:2", &ttl(10_000)).await.unwrap();
    let refused = a.acquire("order:2", &ttl(10_000)).await;
    assert!(matches!(refused, Err(LockError::Busy { .. })), "{refused:?}");
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_schema::text FROM information_schema.tables WHERE table_name = 'lock_runtime_locks'",
    )
    .fetch_all(&admin)
    .await
    .unwrap();
    assert_eq!(tables, ["public"]);
    // A schema of its own, named by the builder: another table, other locks.
    let own = builder(&server.url())
        .postgres_schema("locking")
        .build()
        .await
        .unwrap();
    let apart = own.acquire("order:1", &ttl(10_000)).await.unwrap();
    let in_locking: i64 =
        sqlx::query_scalar("SELECT count(*) FROM locking.lock_runtime_locks WHERE key = 'lock:{order:1}'")
            .fetch_one(&admin)
            .await
            .unwrap();
    assert_eq!(in_locking, 1);
    for guard in [held, held_b, apart] {
        assert!(guard.release().await.unwrap());
    }
    for bad in ["Locks", "my-locks", "", "pg_locks", "1locks"] {
        let refused = builder(&server.url()).postgres_schema(bad).build_lazy();
        assert!(
            matches!(refused, Err(LockError::InvalidOptions { .. })),
            "{bad:?}: {refused:?}"
        );
    }
    let misplaced = LockClient::builder().postgres_schema("locking").build_lazy();
    assert!(
        matches!(&misplaced, Err(LockError::InvalidOptions { reason }) if reason.contains(".postgres(url)")),
        "{misplaced:?}"
    );
}

/// A database whose default isolation is SERIALIZABLE: the store's own statements still run at
/// READ COMMITTED, so 16 waiters on one key get it in turn instead of failing with
/// serialization errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_database_default_still_serves_every_waiter() {
    let server = PostgresServer::spawn_with(&["default_transaction_isolation=serializable"]);
    let admin = pool(&server).await;
    let default: String = sqlx::query_scalar("SHOW default_transaction_isolation")
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(default, "serializable");
    let c = client(&server).await;
    let inside = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waiters: Vec<_> = (0..16)
        .map(|_| {
            let (c, inside) = (c.clone(), inside.clone());
            tokio::spawn(async move {
                let options = ttl(10_000).wait(60 * SECOND).fencing(true);
                let guard = c.acquire("hot", &options).await?;
                assert!(
                    !inside.swap(true, std::sync::atomic::Ordering::SeqCst),
                    "two holders"
                );
                tokio::task::yield_now().await;
                inside.store(false, std::sync::atomic::Ordering::SeqCst);
                guard.release().await
            })
        })
        .collect();
    for waiter in waiters {
        assert!(waiter.await.unwrap().unwrap());
    }
}

/// An acquire blocked behind the lock's row, locked by another session (`SELECT … FOR UPDATE`
/// in a long transaction), answers `Busy` when its wait runs out, not at the response timeout,
/// and leaves nothing waiting on the server: once that session commits, the key is free (not
/// held by nobody for a ttl). With a wait longer than the response timeout, the attempt is
/// abandoned at the response timeout (on the server too: its connection's `statement_timeout`),
/// and its release, on another connection, queues behind it on the row, or, if it got there
/// first and found nothing, is sent again once the attempt has ended; so again the key is free
/// afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_behind_a_locked_row_keeps_to_its_wait() {
    let server = PostgresServer::spawn();
    let db = pool(&server).await;
    let c = builder(&server.url())
        .response_timeout(3 * SECOND)
        .build()
        .await
        .unwrap();
    let waiting_on_locks = || waiting_for_a_lock(&db, "application_name = 'lock-runtime'");
    for (wait, answered_before) in [(SECOND / 2, 3 * SECOND), (6 * SECOND, 6 * SECOND)] {
        // Free (no token), and kept from the client's sweep (which deletes free rows whose
        // lease ended; it runs in the background from the client's first attempt, and under
        // load could delete the row between this insert and the lock on it).
        sqlx::query(
            "INSERT INTO lock_runtime_locks (key, expires_ms) VALUES ('lock:{row}', lock_runtime_v1_now() + 600000) \
             ON CONFLICT (key) DO UPDATE SET expires_ms = EXCLUDED.expires_ms",
        )
        .execute(&db)
        .await
        .unwrap();
        let mut tx = db.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM lock_runtime_locks WHERE key = 'lock:{row}' FOR UPDATE")
            .execute(&mut *tx)
            .await
            .unwrap();
        let called = Instant::now();
        let answer = c.acquire("row", &ttl(60_000).wait(wait)).await;
        let took = called.elapsed();
        assert!(took < answered_before, "{wait:?}: answered after {took:?}");
        if wait < SECOND {
            assert!(matches!(answer, Err(LockError::Busy { .. })), "{answer:?}");
            assert_eq!(
                waiting_on_locks().await,
                0,
                "the attempt gave up on the server too"
            );
        } else {
            assert!(matches!(answer, Err(LockError::Unavailable { .. })), "{answer:?}");
            // The server gives it up too (the connection's `statement_timeout`): what the
            // abandoned acquire sent (its attempt, its leaving the line) does not wait on for
            // the row, to take it for nobody whenever it comes free. Only its release does.
            let given_up = holds_within(8 * SECOND, || async {
                waiting_for_a_lock(
                    &db,
                    "application_name = 'lock-runtime' AND query NOT LIKE '%lock_runtime_v1_hand_back%'",
                )
                .await
                    == 0
            })
            .await;
            assert!(
                given_up,
                "the abandoned attempt still waits for the row on the server"
            );
        }
        tx.commit().await.unwrap();
        // Free: whatever the abandoned attempt took, its release came after it (sent again
        // if it failed: under load it may outlast the response timeout behind the row), or was
        // sent again once the attempt had ended (it reached the row first: seen under the full
        // suite's load, and made certain in the test below).
        let freed = holds_within(20 * SECOND, || async { !c.is_locked("row").await.unwrap() }).await;
        if !freed {
            // What a failure here needs to be understood (seen once under the full suite's
            // load, unexplained): the row as it is, and what the server is still running. Read
            // as well as it can be: an error reading them must not hide the failure.
            let row: Result<Option<(Option<String>, i64)>, _> = sqlx::query_as(
                "SELECT token, expires_ms - lock_runtime_v1_now() FROM lock_runtime_locks \
                 WHERE key = 'lock:{row}'",
            )
            .fetch_optional(&db)
            .await;
            let running: Result<Vec<(String, Option<String>, String)>, _> = sqlx::query_as(
                "SELECT coalesce(state, ''), wait_event_type, left(query, 120) FROM pg_stat_activity \
                 WHERE application_name = 'lock-runtime'",
            )
            .fetch_all(&db)
            .await;
            panic!("{wait:?}: the key is not free within 20s: row (token, ms left) {row:?}; the client's sessions {running:?}");
        }
        let guard = c.acquire("row", &ttl(5000)).await.unwrap();
        assert!(guard.release().await.unwrap());
    }
}

/// An acquire abandoned unanswered may reach the server after its release: the release goes on
/// another connection, finds nothing, and the attempt then takes the key for nobody. Made to
/// happen here by a proxy that holds the attempt back past the response timeout while the
/// release goes straight. The release is sent again once the attempt's statement has
/// ended on the server (the connection's `statement_timeout` bounds it): the key is held until
/// then, not for its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_acquire_that_lands_after_its_release_is_given_back() {
    let server = PostgresServer::spawn();
    let proxy = FaultProxy::start(server.port());
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    let c = builder(&url).response_timeout(3 * SECOND).build().await.unwrap();
    lock_tests::a_late_attempt_is_given_back(&c, &proxy).await;
}

/// A partition that silences every connection the client has (a firewall dropping the flows):
/// its requests time out, and once new connections get through again the client works, however
/// many requests were abandoned on silent connections meanwhile (each such connection is closed,
/// not handed back to the pool, whose way back would wait for its answer forever and keep its
/// slot: once every slot was lost so, the client never recovered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cut_off_by_a_partition_works_again_once_it_heals() {
    let server = PostgresServer::spawn();
    let proxy = FaultProxy::start(server.port());
    let c = through(&proxy).await;
    // Rounds: each leaves every connection that was open silent (in the pool, or abandoned).
    for round in 0..4 {
        // Open connections: pairs at once, more than the pool holds.
        let warm: Vec<_> = (0..20)
            .map(|i| {
                let c = c.clone();
                tokio::spawn(async move {
                    let guard = c.acquire(&format!("warm:{round}:{i}"), &ttl(5000)).await?;
                    guard.release().await
                })
            })
            .collect();
        for pair in warm {
            assert!(pair.await.unwrap().unwrap());
        }
        proxy.silence_new(true);
        proxy.blackhole_existing();
        // More requests at once than the pool has connections, each abandoned at the response
        // timeout.
        let cut: Vec<_> = (0..12)
            .map(|i| {
                let c = c.clone();
                tokio::spawn(async move { c.acquire(&format!("cut:{i}"), &ttl(5000)).await })
            })
            .collect();
        for attempt in cut {
            let answer = attempt.await.unwrap();
            assert!(matches!(answer, Err(LockError::Unavailable { .. })), "{answer:?}");
        }
        proxy.silence_new(false);
        eventually(15 * SECOND, "the client works again", || async {
            match c.acquire("after", &ttl(5000)).await {
                Ok(guard) => guard.release().await.is_ok(),
                Err(_) => false,
            }
        })
        .await;
    }
}

/// Nothing listening at the database's address: `build()` fails within the connect timeout
/// (the pool retries a refused connection for three quarters of it) with one line naming the
/// store, the address and why, not "pool timed out".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_is_named_with_its_address() {
    let port = lock_tests::free_port();
    let started = Instant::now();
    let refused = builder(&format!("postgres://postgres@127.0.0.1:{port}/test"))
        .build()
        .await;
    // The builder's connect timeout is 2 s.
    assert!(started.elapsed() < 3 * SECOND, "{:?}", started.elapsed());
    let Err(LockError::Unavailable { source }) = &refused else {
        panic!("{refused:?}")
    };
    let said = source.to_string();
    assert!(
        said.starts_with(&format!(
            "PostgreSQL at 127.0.0.1:{port}/test (schema public): cannot connect"
        )) && said.to_lowercase().contains("refused"),
        "{said}"
    );
}

/// A multi-key set is one statement (`lock_runtime_v1_take_set`), taken with or without fencing
/// or refused, all or none, as the server counts its statements (pg_stat_statements).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_is_one_statement_taken_or_refused() {
    let server =
        blocking(|| PostgresServer::spawn_with(&["shared_preload_libraries=pg_stat_statements"])).await;
    let statements = pool(&server).await;
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&statements)
        .await
        .unwrap();
    let (c, other) = (client(&server).await, client(&server).await);
    // A client's first acquire sweeps in the background: not counted below.
    for client in [&c, &other] {
        client
            .acquire("warm", &ttl(1000))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let ran = || async {
        let calls: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements \
             WHERE query NOT ILIKE '%pg_stat_statements%' AND query NOT ILIKE '%lock_runtime_v1_sweep%'",
        )
        .fetch_one(&statements)
        .await
        .unwrap();
        calls
    };
    let keys = ["set:a", "set:b", "set:c"];
    for fencing in [false, true] {
        let before = ran().await;
        let all = c.acquire_all(keys, &ttl(10_000).fencing(fencing)).await.unwrap();
        assert_eq!(ran().await - before, 1, "one statement (fencing: {fencing})");
        assert_eq!(all.fencing_token_for("set:b").is_some(), fencing);
        assert!(all.release().await.unwrap());
    }
    let held = other.acquire("set:b", &ttl(10_000)).await.unwrap();
    let before = ran().await;
    let refused = c.acquire_all(keys, &ttl(10_000)).await;
    assert_eq!(ran().await - before, 1, "refused in the same one statement");
    assert!(
        matches!(refused, Err(LockError::Busy { ref key }) if key == "set:b"),
        "{refused:?}"
    );
    for key in ["set:a", "set:c"] {
        assert!(!c.is_locked(key).await.unwrap(), "{key} left taken");
    }
    held.release().await.unwrap();
}

/// A set attempt abandoned while its statement waits for a row another session has locked (its
/// caller's future dropped): the release of a later row may run before the statement takes it,
/// and find nothing; once the statement went on and took every row, the set is still given
/// back, by the release sent again a while later, long before the locks' ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_set_is_given_back_even_after_its_statement_took_it() {
    let server = blocking(PostgresServer::spawn).await;
    let c = client(&server).await;
    let sql = pool(&server).await;
    // The row the statement locks first, made and then locked by another session.
    c.acquire("set:ab1", &ttl(1000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    sqlx::query("INSERT INTO lock_runtime_locks (key) VALUES ('lock:{set:ab1}') ON CONFLICT DO NOTHING")
        .execute(&sql)
        .await
        .unwrap();
    let mut blocker = sql.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM lock_runtime_locks WHERE key = 'lock:{set:ab1}' FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let keys = ["set:ab1", "set:ab2"];
    let abandoned = tokio::time::timeout(Duration::from_millis(300), c.acquire_all(keys, &ttl(60_000))).await;
    assert!(abandoned.is_err(), "the statement waits for the locked row");
    // Time for the release of "set:ab2" to find it free while the statement still waits. (Were
    // it slower, it would find the lock taken after the commit and free it: the test would pass
    // without proving the second release, never fail wrongly.)
    tokio::time::sleep(Duration::from_millis(200)).await;
    blocker.commit().await.unwrap();
    // The statement goes on and takes "set:ab2" for nobody (the first row's release queued
    // behind it, and gives that one back).
    eventually(5 * SECOND, "the statement took the later row", || async {
        c.is_locked("set:ab2").await.unwrap()
    })
    .await;
    eventually(10 * SECOND, "the whole set is given back", || async {
        !c.is_locked("set:ab1").await.unwrap() && !c.is_locked("set:ab2").await.unwrap()
    })
    .await;
}

/// A set's statement that finds a key's row, waits for another row, and meanwhile sees that row
/// deleted by its holder's release, never answers taken without it: it is refused at that key
/// (making the row then would lock out of order), and a caller that will wait takes the set key
/// by key; either way another caller of that key is refused while the set holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_whose_row_is_released_while_it_waits_still_holds_that_key() {
    let server = blocking(PostgresServer::spawn).await;
    let (c, other) = (client(&server).await, client(&server).await);
    let sql = pool(&server).await;
    // "set:rb1" is locked first by the statement; its row is held locked by another session.
    let fenced = ttl(60_000).fencing(true);
    c.acquire("set:rb1", &fenced)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let held = other.acquire("set:rb2", &ttl(60_000)).await.unwrap();
    let mut blocker = sql.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM lock_runtime_locks WHERE key = 'lock:{set:rb1}' FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let set = tokio::spawn({
        let c = c.clone();
        async move {
            c.acquire_all(["set:rb1", "set:rb2"], &ttl(60_000).wait(5 * SECOND))
                .await
        }
    });
    eventually(
        5 * SECOND,
        "the set's statement waits for the locked row",
        || async { waiting_for_a_lock(&sql, "query LIKE '%lock_runtime_v1_take_set%'").await > 0 },
    )
    .await;
    // The row it found for "set:rb2" goes with its holder's release.
    assert!(held.release().await.unwrap());
    blocker.commit().await.unwrap();
    let set = tokio::time::timeout(10 * SECOND, set)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let refused = other.acquire("set:rb2", &ttl(10_000)).await;
    assert!(
        matches!(refused, Err(LockError::Busy { .. })),
        "the set holds set:rb2: {refused:?}"
    );
    assert!(set.release().await.unwrap());
}

/// Issue 55: a fair semaphore's release hands its permit to the waiter at the head of the line
/// in the same statement (as a fair lock's release hands the lock over), so no permit is free
/// between a release and the attempt of the waiter it admits, and that waiter holds without
/// asking. Seen in the table (a place in line that never asks is handed the permit by the
/// release itself), and end to end: another client's waiter holds the permit given back, with
/// a fencing token above every one taken before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_semaphores_release_hands_its_permit_to_the_head_of_the_line() {
    let server = PostgresServer::spawn();
    let db = pool(&server).await;
    let (a, b) = (client(&server).await, client(&server).await);
    let two = ttl(30_000).permits(2).fair(true).fencing(true);
    let first = a.acquire("sem", &two).await.unwrap();
    let second = a.acquire("sem", &two).await.unwrap();
    // A place nobody keeps asking for: only the release can give it a permit.
    sqlx::query(
        "INSERT INTO lock_runtime_line (key, token, arrival, kept_until, stamp) \
         VALUES ('lock:{sem}#permits', 'a place', nextval('lock_runtime_arrivals'), \
                 lock_runtime_v1_now() + 60000, 7)",
    )
    .execute(&db)
    .await
    .unwrap();
    let given = first.permit();
    assert!(first.release().await.unwrap());
    let handed: Option<(i32, i64)> = sqlx::query_as(
        "SELECT permit, fence FROM lock_runtime_permits WHERE key = 'lock:{sem}' AND token = 'a place'",
    )
    .fetch_optional(&db)
    .await
    .unwrap();
    let (permit, fence) = handed.expect("the release handed the permit to the head of the line");
    assert_eq!(Some(permit as u32), given, "the permit given back");
    assert!(
        fence as u64 > second.fencing_token().unwrap(),
        "a fencing token of its own"
    );
    let line: i64 =
        sqlx::query_scalar("SELECT count(*) FROM lock_runtime_line WHERE key = 'lock:{sem}#permits'")
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(line, 0, "out of the line");
    // Another client's waiter, handed the next permit given back.
    let waiter = in_line(&b, "sem", two.clone().wait(30 * SECOND)).await;
    let given = second.permit();
    let last_fence = fence as u64;
    assert!(second.release().await.unwrap());
    let guard = waiter.await.unwrap().unwrap();
    assert_eq!(guard.permit(), given, "the permit given back");
    assert!(guard.fencing_token().unwrap() > last_fence);
    assert!(guard.release().await.unwrap());
}

/// An acquire whose answer was lost took the lock on the server; its release in the background
/// went into a partition and failed too. It is sent again once the partition heals, so the key
/// is free long before its ttl (given up after one failure, the lock was held for nobody for a
/// minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_of_an_abandoned_acquire_is_sent_again_after_it_failed() {
    let server = PostgresServer::spawn();
    let db = pool(&server).await;
    let proxy = FaultProxy::start(server.port());
    let c = through(&proxy).await;
    // Its statements prepared on every connection of the pool first (a statement new to a
    // connection waits for the server to parse it before it is sent): pairs at once, more
    // than the pool holds.
    let warm: Vec<_> = (0..20)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move { c.acquire(&format!("warm:{i}"), &ttl(5000)).await?.release().await })
        })
        .collect();
    for pair in warm {
        assert!(pair.await.unwrap().unwrap());
    }
    // Applied, its answer lost.
    proxy.drop_answers();
    let acquire = tokio::spawn({
        let c = c.clone();
        async move { c.acquire("lost", &ttl(60_000)).await }
    });
    let holder = "SELECT count(*) FROM lock_runtime_locks WHERE key = 'lock:{lost}' AND token IS NOT NULL";
    eventually(10 * SECOND, "the acquire took the lock on the server", || async {
        sqlx::query_scalar::<_, i64>(holder).fetch_one(&db).await.unwrap() == 1
    })
    .await;
    // Its release goes into the partition.
    proxy.blackhole();
    let dropped = proxy.dropped();
    let answer = acquire.await.unwrap();
    assert!(matches!(answer, Err(LockError::Unavailable { .. })), "{answer:?}");
    eventually(10 * SECOND, "the release was sent into the partition", || async {
        proxy.dropped() > dropped
    })
    .await;
    proxy.relay();
    eventually(10 * SECOND, "the key is free", || async {
        sqlx::query_scalar::<_, i64>(holder).fetch_one(&db).await.unwrap() == 0
    })
    .await;
}

/// A semaphore's attempt takes the lowest permit no holder has, wherever the gaps are (the
/// first, inside, the last), and is refused once every permit is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_takes_the_lowest_free_permit() {
    let t = lock_tests::Target::postgres().await;
    let (c, key) = (t.client(), "lowest-free");
    let options = ttl(30_000).permits(20);
    let mut held = std::collections::BTreeMap::new();
    for _ in 0..20 {
        let guard = c.acquire(key, &options).await.unwrap();
        held.insert(guard.permit().unwrap(), guard);
    }
    assert_eq!(
        held.keys().copied().collect::<Vec<_>>(),
        (0..20).collect::<Vec<_>>()
    );
    let refused = c.acquire(key, &options).await;
    assert!(matches!(refused, Err(LockError::Busy { .. })), "{refused:?}");
    for permit in [13, 4, 19, 0, 5] {
        assert!(held.remove(&permit).unwrap().release().await.unwrap());
    }
    let mut taken = Vec::new();
    for _ in 0..5 {
        let guard = c.acquire(key, &options).await.unwrap();
        taken.push(guard.permit().unwrap());
        held.insert(guard.permit().unwrap(), guard);
    }
    assert_eq!(taken, [0, 4, 5, 13, 19]);
    for (_, guard) in held {
        assert!(guard.release().await.unwrap());
    }
}
