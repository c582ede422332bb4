//! The MySQL store: what only it does (keys compared byte for byte whatever the database's
//! collations, waiters of another client retrying without notifications, a table of an earlier
//! build gaining the lines and shares), and
//! faults on servers the kit starts itself (one `mariadbd` per test): a restart while locks are
//! held, a paused and a stopped server, and the refusals a misconfigured client gets. The
//! behaviour suite runs on MySQL too (`behaviour.rs`, `coordination.rs`, `admin.rs`: the
//! `mysql::` tests, on the machine's MariaDB).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockMode, MAX_WAIT_NAP};
use lock_tests::{eventually, in_line, ttl, FaultProxy, MariadbServer, Target, SECOND};
use tokio::time::Instant;

fn builder(url: &str) -> lock_runtime::LockClientBuilder {
    LockClient::builder()
        .mysql(url)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(1))
}

async fn client(server: &MariadbServer) -> LockClient {
    builder(&server.url())
        .build()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", server.url()))
}

/// Runs a blocking step of the kit (it waits for the server) off the runtime's workers.
async fn blocking<T: Send + 'static>(step: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(step)
        .await
        .expect("the kit's step panicked")
}

/// A transaction of the test's own that holds the row of the key `stuck` (free, inserted by it):
/// the store's statements on that key wait for it until it ends.
async fn holding_the_row_of_stuck(server: &MariadbServer) -> sqlx::MySqlConnection {
    use sqlx::Connection;
    let mut holder = sqlx::MySqlConnection::connect(&server.url()).await.unwrap();
    sqlx::raw_sql("START TRANSACTION")
        .execute(&mut holder)
        .await
        .unwrap();
    sqlx::query("INSERT INTO lock_runtime_locks (name, token, expires_ms, fence) VALUES ('lock:{stuck}', NULL, 0, NULL)")
        .execute(&mut holder)
        .await
        .unwrap();
    holder
}

/// Keys that MariaDB's default collations would call equal (case, accents, `ß`/`ss`, trailing
/// spaces) are different locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_compared_byte_for_byte() {
    let t = Target::mysql().await;
    let c = t.client();
    let keys = [
        "order", "Order", "ordér", "order ", "straße", "strasse", "ORDER  ",
    ];
    let mut held = Vec::new();
    for key in keys {
        let guard = c
            .acquire(key, &ttl(10_000))
            .await
            .unwrap_or_else(|e| panic!("{key:?} refused while only other keys are held: {e}"));
        held.push(guard);
    }
    for (guard, key) in held.into_iter().zip(keys) {
        assert_eq!(guard.key(), key);
        assert!(c.is_locked(key).await.unwrap());
        assert!(guard.release().await.unwrap(), "{key:?} was still ours");
    }
}

/// A database whose lock table an earlier build made (before fair mode and read-write locks)
/// gains the line and shares tables at the first client's connect, and serves every mode, its
/// locks kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_an_earlier_build_gains_fair_and_shared_locks() {
    let server = blocking(MariadbServer::spawn).await;
    server.sql(
        "CREATE TABLE lock_runtime_locks (name VARBINARY(1300) NOT NULL PRIMARY KEY, \
         token VARBINARY(2048) NULL, expires_ms BIGINT NOT NULL, fence BIGINT NULL) ENGINE = InnoDB",
    );
    let c = client(&server).await;
    let tables = server.sql(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'test' \
         AND table_name LIKE 'lock\\_runtime\\_%' ORDER BY table_name",
    );
    assert_eq!(
        tables.split_whitespace().collect::<Vec<_>>(),
        ["lock_runtime_line", "lock_runtime_locks", "lock_runtime_shares"],
        "{tables}"
    );
    let fair = c
        .acquire("upgraded", &ttl(10_000).fair(true).fencing(true))
        .await
        .unwrap();
    assert!(fair.fencing_token().is_some());
    assert!(fair.release().await.unwrap());
    let readers = [
        c.acquire("upgraded", &ttl(10_000).mode(LockMode::Shared))
            .await
            .unwrap(),
        c.acquire("upgraded", &ttl(10_000).mode(LockMode::Shared))
            .await
            .unwrap(),
    ];
    let shares = server.sql("SELECT COUNT(*) FROM lock_runtime_shares");
    assert_eq!(shares.trim(), "2", "a row per share");
    for guard in readers {
        assert!(guard.release().await.unwrap());
    }
    assert!(!c.is_locked("upgraded").await.unwrap());
}

/// A server that logs statements (`binlog_format=STATEMENT`) refuses InnoDB writes at READ
/// COMMITTED, the level of the store's transactions: the client is `Refused` at `build()`,
/// naming the setting to change, not `Unavailable` with the server's error alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_logs_statements_is_refused_naming_the_binlog_format() {
    let server =
        blocking(|| MariadbServer::spawn_with(&["--log-bin=binlog", "--binlog-format=STATEMENT"])).await;
    let refused = builder(&server.url()).build().await;
    let Err(LockError::Refused { reason, source }) = &refused else {
        panic!("{refused:?}")
    };
    assert!(
        reason.contains("binlog_format to ROW or MIXED") && source.to_string().contains("1665"),
        "{reason}: {source}"
    );
}

/// A share row left live without a live header (every share ends no later than its header, so
/// only a fault leaves one) is stale: a reader entering the free key deletes it, so the last
/// reader's release frees the key for a writer at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_without_a_live_header_does_not_hold_the_key() {
    use sqlx::Connection;
    let t = Target::mysql().await;
    let c = t.client();
    let name = format!("{}{{orphan}}", c.prefix());
    let mut raw = sqlx::MySqlConnection::connect(&lock_tests::shared_mysql_url())
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO lock_runtime_shares (name, token, expires_ms) VALUES (?, 'gone 0', 9223372036854775807)",
    )
    .bind(name.as_bytes())
    .execute(&mut raw)
    .await
    .unwrap();
    let reader = c
        .acquire("orphan", &ttl(10_000).mode(LockMode::Shared))
        .await
        .unwrap();
    assert!(reader.release().await.unwrap());
    let writer = c.acquire("orphan", &ttl(10_000)).await;
    assert!(writer.is_ok(), "{writer:?}");
}

/// A fair attempt never barges in ahead of a waiter's place in line, even one of a client that
/// vanished, until that place lapses; then the line moves on, and the lapsed place is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_barges_ahead_of_the_fair_line_until_its_head_lapses() {
    use sqlx::Connection;
    let t = Target::mysql().await;
    let c = t.client();
    let name = format!("{}{{barge}}", c.prefix());
    let mut raw = sqlx::MySqlConnection::connect(&lock_tests::shared_mysql_url())
        .await
        .unwrap();
    // A waiter of another process heads the line, its place kept a minute; the lock is free.
    sqlx::query(
        "INSERT INTO lock_runtime_line (name, token, kept_until) \
         VALUES (?, 'elsewhere', TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000 + 60000)",
    )
    .bind(name.as_bytes())
    .execute(&mut raw)
    .await
    .unwrap();
    let fair = ttl(5000).fair(true);
    let out = c.acquire("barge", &fair).await;
    assert!(
        matches!(out, Err(LockError::Busy { .. })),
        "a fair try must not barge: {out:?}"
    );
    let out = c
        .acquire("barge", &fair.clone().wait(Duration::from_millis(300)))
        .await;
    assert!(
        matches!(out, Err(LockError::Busy { .. })),
        "nor a fair wait: {out:?}"
    );
    // The waiter that gave up leaves its place in the background (its caller is not held up
    // for it): gone before the next try, which would otherwise find it ahead.
    let deadline = Instant::now() + 10 * SECOND;
    loop {
        let places: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM lock_runtime_line WHERE name = ? AND token <> 'elsewhere'",
        )
        .bind(name.as_bytes())
        .fetch_one(&mut raw)
        .await
        .unwrap();
        if places == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the waiter that gave up never left its place"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Its place lapses: the line moves on.
    sqlx::query("UPDATE lock_runtime_line SET kept_until = 0 WHERE name = ? AND token = 'elsewhere'")
        .bind(name.as_bytes())
        .execute(&mut raw)
        .await
        .unwrap();
    let guard = c.acquire("barge", &fair).await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM lock_runtime_line WHERE name = ?")
        .bind(name.as_bytes())
        .fetch_one(&mut raw)
        .await
        .unwrap();
    assert_eq!(left, 0, "the lapsed place and the waiter that gave up are gone");
    assert!(guard.release().await.unwrap());
}

/// Operators see a key's fair waiters (its line's live places) and the writers that claimed
/// their turn from its readers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_fair_waiters_and_claiming_writers() {
    let t = Target::mysql().await;
    let (c, other) = (t.client(), t.other_client().await);
    let admin = lock_runtime::admin::Admin::new(c.clone());
    let fair = ttl(10_000).fair(true);
    let held = c.acquire("line", &fair).await.unwrap();
    let waiter = in_line(&other, "line", fair.clone().wait(10 * SECOND)).await;
    let reader = c
        .acquire("claimed", &ttl(10_000).mode(LockMode::Shared))
        .await
        .unwrap();
    let writer = in_line(&other, "claimed", ttl(10_000).wait(10 * SECOND)).await;
    let line = admin.show("line").await.unwrap();
    assert_eq!((line.queued, line.writers), (1, 0), "{line:?}");
    let claimed = admin.show("claimed").await.unwrap();
    assert_eq!((claimed.queued, claimed.writers), (0, 1), "{claimed:?}");
    let listed = admin.list("*").await.unwrap();
    let counts: Vec<(&str, u64, u64)> = listed
        .iter()
        .map(|view| (view.key.as_str(), view.queued, view.writers))
        .collect();
    assert_eq!(counts, [("claimed", 0, 1), ("line", 1, 0)]);
    assert!(held.release().await.unwrap());
    assert!(reader.release().await.unwrap());
    for got in [waiter.await.unwrap(), writer.await.unwrap()] {
        assert!(got.unwrap().release().await.unwrap());
    }
}

/// Waiters of the client that releases are woken by the release, one at a time, in arrival
/// order; a waiter of another client takes the lock after an early release at its next try,
/// at its next poll (8 to 256 ms apart), not at the holder's expiry or a 2 s nap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_own_releases_and_others_retry_within_the_nap() {
    let t = Target::mysql().await;
    let (c, other) = (t.client(), t.other_client().await);
    let holder = c.acquire("fifo", &ttl(60_000)).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let before = lock_tests::waiting(&c, "fifo");
        tasks.push(tokio::spawn({
            let (c, order) = (c.clone(), Arc::clone(&order));
            async move {
                let guard = c.acquire("fifo", &ttl(5000).wait(30 * SECOND)).await.unwrap();
                order.lock().unwrap().push(i);
                guard.release().await.unwrap();
            }
        }));
        lock_tests::joined_line(&c, "fifo", before).await;
    }
    let released_at = Instant::now();
    holder.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3], "first come, first served");
    assert!(
        released_at.elapsed() < MAX_WAIT_NAP,
        "each release woke the next waiter: {:?}",
        released_at.elapsed()
    );

    let holder = c.acquire("across", &ttl(60_000)).await.unwrap();
    let before = lock_tests::waiting(&other, "across");
    let waiter = tokio::spawn({
        let other = other.clone();
        async move {
            let guard = other.acquire("across", &ttl(5000).wait(30 * SECOND)).await;
            (guard.map(|g| g.key().to_owned()), Instant::now())
        }
    });
    // The waiter has been refused and sleeps.
    lock_tests::joined_line(&other, "across", before).await;
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let (taken, at) = waiter.await.unwrap();
    assert_eq!(taken.unwrap(), "across");
    let after = at.duration_since(released_at);
    assert!(
        after < MAX_WAIT_NAP / 2,
        "taken {after:?} after the release, not at the holder's expiry"
    );
}

/// A lock is a committed row: a restart keeps it, its holder's watchdog renews it once the
/// server is back, others are refused meanwhile, and the fencing token after it is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_locks_survive_a_restart_and_their_holders_keep_them() {
    let server = MariadbServer::spawn();
    let (c, other) = (client(&server).await, client(&server).await);
    let guard = c
        .acquire("order:1", &ttl(6000).watchdog(true).fencing(true))
        .await
        .unwrap();
    let before = guard.fencing_token().unwrap();
    let server = blocking(move || {
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
    drop(server);
}

/// A paused server (SIGSTOP) and a stopped one: every request ends as `Unavailable` within
/// the timeouts, naming the database, and the client works again once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_or_stopped_server_is_unavailable_without_a_hang() {
    let server = MariadbServer::spawn();
    let c = client(&server).await;
    let guard = c.acquire("held", &ttl(30_000)).await.unwrap();
    // Bounded by the connect and response timeouts (3 s here), with room for a slow machine.
    let bound = Duration::from_secs(10);
    server.pause();
    let started = Instant::now();
    let refused = c.acquire("other", &ttl(1000)).await;
    let Err(LockError::Unavailable { source }) = &refused else {
        panic!("{refused:?}")
    };
    let at = format!("MySQL at 127.0.0.1:{}/test", server.port());
    assert!(source.to_string().contains(&at), "{source}");
    assert!(matches!(
        guard.extend(Duration::from_secs(30)).await,
        Err(LockError::Unavailable { .. })
    ));
    assert!(started.elapsed() < bound, "{:?}", started.elapsed());
    server.resume();
    eventually(10 * SECOND, "the client works again", || async {
        c.is_locked("held").await.is_ok()
    })
    .await;
    let mut server = blocking(move || {
        let mut server = server;
        server.kill();
        server
    })
    .await;
    let started = Instant::now();
    assert!(matches!(
        c.is_locked("held").await,
        Err(LockError::Unavailable { .. })
    ));
    let built = builder(&server.url()).build().await;
    let Err(LockError::Unavailable { source }) = &built else {
        panic!("{built:?}")
    };
    assert!(source.to_string().contains("cannot connect"), "{source}");
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

/// A wrong password, an unknown user, a missing database and a user without the rights locking needs are
/// `Refused`, naming what to fix; a client that may not create the table works once it exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misconfigured_clients_are_refused_with_what_to_fix() {
    let server = MariadbServer::spawn();
    let port = server.port();
    let missing = builder(&format!("mysql://root@127.0.0.1:{port}/no_such_db"))
        .build()
        .await;
    assert!(
        matches!(&missing, Err(LockError::Refused { reason, .. }) if reason.contains("does not exist")),
        "{missing:?}"
    );
    server.sql(
        "CREATE USER 'locker'@'127.0.0.1' IDENTIFIED BY 'secret'; \
         GRANT SELECT ON test.* TO 'locker'@'127.0.0.1';",
    );
    let wrong = builder(&format!("mysql://locker:nope@127.0.0.1:{port}/test"))
        .build()
        .await;
    let Err(LockError::Refused { reason, source }) = &wrong else {
        panic!("{wrong:?}")
    };
    assert!(reason.contains("wrong user or password"), "{reason}");
    assert!(!source.to_string().contains("nope"), "{source}");
    // A user the server does not know; and one that may only log in through the server's
    // socket (error 1698, not 1045: the trial met it on Debian's MariaDB).
    let nobody = builder(&format!("mysql://nobody@127.0.0.1:{port}/test"))
        .build()
        .await;
    assert!(
        matches!(&nobody, Err(LockError::Refused { reason, .. }) if reason.contains("wrong user or password")),
        "{nobody:?}"
    );
    let said = nobody.err().map(|e| e.to_string()).unwrap_or_default();
    lock_tests::as_troubleshooting_says(&said, port, 3306);
    server.sql("CREATE USER 'by_socket'@'127.0.0.1' IDENTIFIED VIA unix_socket;");
    let by_socket = builder(&format!("mysql://by_socket@127.0.0.1:{port}/test"))
        .build()
        .await;
    let Err(LockError::Refused { reason, source }) = &by_socket else {
        panic!("{by_socket:?}")
    };
    assert!(
        reason.contains("wrong user or password") && source.to_string().contains("1698"),
        "{reason}: {source}"
    );
    let url = format!("mysql://locker:secret@127.0.0.1:{port}/test");
    let denied = builder(&url).build().await;
    assert!(
        matches!(&denied, Err(LockError::Refused { reason, .. }) if reason.contains("lacks a right")),
        "{denied:?}"
    );
    // Made by a client that may; then the rights the guide names are enough, and each is
    // needed: without INSERT on the line (a fair waiter's place) the client is refused when it
    // connects, not at its first fair acquire.
    client(&server).await;
    server.sql(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON test.lock_runtime_locks TO 'locker'@'127.0.0.1'; \
         GRANT SELECT, UPDATE, DELETE ON test.lock_runtime_line TO 'locker'@'127.0.0.1'; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON test.lock_runtime_shares TO 'locker'@'127.0.0.1';",
    );
    let no_place = builder(&url).build().await;
    assert!(
        matches!(&no_place, Err(LockError::Refused { reason, source })
            if reason.contains("lacks a right") && source.to_string().contains("lock_runtime_line")),
        "{no_place:?}"
    );
    server.sql("GRANT INSERT ON test.lock_runtime_line TO 'locker'@'127.0.0.1';");
    let granted = builder(&url).build().await.unwrap();
    let guard = granted
        .acquire("granted", &ttl(1000).fencing(true))
        .await
        .unwrap();
    assert!(guard.fencing_token().is_some());
    assert!(guard.release().await.unwrap());
    let bad = LockClient::builder().mysql("postgres://localhost/x").build_lazy();
    assert!(matches!(bad, Err(LockError::InvalidOptions { .. })), "{bad:?}");
    let c = LockClient::connect(&format!("mariadb://root@127.0.0.1:{port}/test"))
        .await
        .unwrap();
    let guard = c.acquire("connected", &ttl(1000)).await.unwrap();
    assert!(guard.release().await.unwrap());
    assert!(format!("{c:?}").contains("MySQL"), "{c:?}");
    drop(server);
}

/// Released locks leave no row; a fenced lock's row (its last token) stays until the sweep,
/// and the next token of the key is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_locks_leave_no_row_and_fenced_ones_keep_their_token() {
    let server = MariadbServer::spawn();
    let c = client(&server).await;
    let rows = |server: &MariadbServer| -> String {
        server.sql("SELECT CAST(name AS CHAR), token IS NULL FROM lock_runtime_locks ORDER BY name")
    };
    c.acquire("plain", &ttl(5000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let first = c.acquire("fenced", &ttl(5000).fencing(true)).await.unwrap();
    let token = first.fencing_token().unwrap();
    first.release().await.unwrap();
    let left = rows(&server);
    assert!(!left.contains("{plain}"), "{left}");
    assert!(left.contains("{fenced}\t1"), "{left}");
    let second = c.acquire("fenced", &ttl(5000).fencing(true)).await.unwrap();
    let token2 = second.fencing_token().unwrap();
    assert!(token2 > token);
    second.release().await.unwrap();
    // A key's last token ahead of the clock (a clock stepped back): the next is one more.
    let ahead = token2 + 10_000_000_000;
    server.sql(&format!(
        "UPDATE lock_runtime_locks SET fence = {ahead} WHERE name LIKE '%{{fenced}}'"
    ));
    let third = c.acquire("fenced", &ttl(5000).fencing(true)).await.unwrap();
    assert_eq!(third.fencing_token(), Some(ahead + 1));
    third.release().await.unwrap();
}

/// A client's first acquire sweeps, in the background, the rows nothing needs: an expired
/// unfenced lock's at once, a fenced lock's an hour after it expired; a recently expired fenced
/// lock's row (its last token) stays. More than one batch of them (1,000 rows) are swept in
/// batches, one after another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_deletes_only_rows_nothing_needs() {
    let server = MariadbServer::spawn();
    client(&server).await; // makes the table
    server.sql(
        "INSERT INTO lock_runtime_locks (name, token, expires_ms, fence) VALUES \
         ('old{plain}', 'x', 1, NULL), ('old{fenced}', NULL, 1, 7), \
         ('new{fenced}', NULL, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000) - 1000, 8)",
    );
    // MariaDB's sequence engine: 2,500 crashed holders' rows.
    server.sql(
        "INSERT INTO lock_runtime_locks (name, token, expires_ms, fence) \
         SELECT CONCAT('old{crashed:', seq, '}'), 'x', 1, NULL FROM seq_1_to_2500",
    );
    let c = client(&server).await;
    c.acquire("sweeper", &ttl(1000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let rows = || server.sql("SELECT CAST(name AS CHAR) FROM lock_runtime_locks ORDER BY name");
    eventually(10 * SECOND, "the sweep ran", || async {
        !rows().contains("old{")
    })
    .await;
    assert_eq!(rows().trim(), "new{fenced}");
}

/// A holder cut off from the database (a proxy between them stops relaying, a firewall dropping
/// the flows): its watchdog's renewals go unanswered, so it counts its lock lost when the
/// validity it had runs out, before the lease on the server ends and another client takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_stops_before_another_takes_the_lock() {
    let server = MariadbServer::spawn();
    let proxy = FaultProxy::start(server.port());
    let cut = builder(&format!("mysql://root@127.0.0.1:{}/test", proxy.port()))
        .build()
        .await
        .unwrap();
    let other = client(&server).await;
    let guard = cut
        .acquire("payout:1", &ttl(2000).watchdog(true).fencing(true))
        .await
        .unwrap();
    let first = guard.fencing_token().unwrap();
    proxy.silence_new(true);
    proxy.blackhole_existing();
    let taken = other
        .acquire("payout:1", &ttl(2000).fencing(true).wait(20 * SECOND))
        .await
        .unwrap();
    assert!(
        guard.is_lost(),
        "another client took the lock while the cut-off holder still counted it valid"
    );
    assert!(taken.fencing_token().unwrap() > first);
    assert!(taken.release().await.unwrap());
    drop(guard);
}

/// A partition that silences every connection the client has: its requests time out, and once
/// new connections get through again the client works, however many requests were abandoned on
/// silent connections meanwhile.
/// A client cut off in the middle of a transaction (a fair attempt, which locks the key's row
/// first) leaves that row locked only until the server ends its silent session, about the
/// response timeout later: another client's fair waiter gets the lock then, not after InnoDB's
/// lock wait (50 s) or the server's idle limit (8 hours).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cut_off_inside_a_transaction_blocks_the_key_only_briefly() {
    let server = blocking(MariadbServer::spawn).await;
    let proxy = FaultProxy::start(server.port());
    // The cut client's response timeout is its sessions' idle limit inside a transaction.
    let cut = builder(&format!("mysql://root@127.0.0.1:{}/test", proxy.port()))
        .response_timeout(3 * SECOND)
        .build()
        .await
        .unwrap();
    let other = builder(&server.url())
        .response_timeout(8 * SECOND)
        .build()
        .await
        .unwrap();
    // The key's row, made by a transaction of the test's own that holds it: the cut client's
    // attempt starts its transaction and waits there for the row.
    let fair = ttl(5000).fair(true);
    let mut holder = holding_the_row_of_stuck(&server).await;
    let attempt = tokio::spawn({
        let cut = cut.clone();
        async move { cut.acquire("stuck", &ttl(5000).fair(true)).await }
    });
    eventually(5 * SECOND, "the cut client's attempt waits for the row", || {
        // (Its statement that locks the row, running: waiting for the test's transaction.)
        let rows = server.sql(
            "SELECT COUNT(*) FROM information_schema.processlist \
             WHERE info LIKE 'INSERT INTO lock_runtime_locks %VALUES (?, NULL, 0, NULL)%'",
        );
        async move { rows.trim() == "1" }
    })
    .await;
    // Cut off while it waits: the row lock it is granted next is answered into the silence.
    proxy.blackhole_existing();
    sqlx::raw_sql("COMMIT").execute(&mut holder).await.unwrap();
    let cut_off = attempt.await.unwrap();
    assert!(
        matches!(cut_off, Err(LockError::Unavailable { .. })),
        "{cut_off:?}"
    );
    let started = Instant::now();
    let got = other
        .acquire("stuck", &fair.clone().wait(20 * SECOND))
        .await
        .unwrap();
    let waited = started.elapsed();
    // The cut session ends 3 s after its last answer, within the other client's response
    // timeout: without that limit, the other's attempt waits for the row until it times out
    // (InnoDB's lock wait is 50 s), and the acquire fails.
    assert!(waited < 15 * SECOND, "waited {waited:?}");
    assert!(got.release().await.unwrap());
    proxy.reset_all();
}

/// An acquire waiting for a row another session holds is given up on the server when its
/// client gives it up (the store's sessions wait for a row as long as the response timeout, not
/// InnoDB's 50 s): it does not go on to take the key for nobody once the row comes free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_acquire_stops_waiting_for_the_row_on_the_server() {
    let server = blocking(MariadbServer::spawn).await;
    let c = builder(&server.url())
        .response_timeout(3 * SECOND)
        .build()
        .await
        .unwrap();
    assert!(!c.is_locked("stuck").await.unwrap(), "the table is made");
    let mut holder = holding_the_row_of_stuck(&server).await;
    let answer = c.acquire("stuck", &ttl(60_000)).await;
    assert!(matches!(answer, Err(LockError::Unavailable { .. })), "{answer:?}");
    eventually(
        8 * SECOND,
        "the abandoned attempt stops waiting for the row on the server",
        || {
            let rows = server.sql(
                "SELECT COUNT(*) FROM information_schema.processlist \
             WHERE info LIKE 'INSERT INTO lock_runtime_locks%' AND info NOT LIKE '%processlist%'",
            );
            async move { rows.trim() == "0" }
        },
    )
    .await;
    sqlx::raw_sql("COMMIT").execute(&mut holder).await.unwrap();
    let guard = c.acquire("stuck", &ttl(5000)).await.unwrap();
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cut_off_by_a_partition_works_again_once_it_heals() {
    let server = MariadbServer::spawn();
    let proxy = FaultProxy::start(server.port());
    let c = builder(&format!("mysql://root@127.0.0.1:{}/test", proxy.port()))
        .build()
        .await
        .unwrap();
    for round in 0..3 {
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

/// Nothing listening at the database's address: `build()` fails within the connect timeout,
/// in one line naming the store, the address and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_is_named_with_its_address() {
    let port = lock_tests::free_port();
    let started = Instant::now();
    let refused = builder(&format!("mysql://root:secret@127.0.0.1:{port}/test"))
        .build()
        .await;
    // The builder's connect timeout is 2 s.
    assert!(started.elapsed() < 3 * SECOND, "{:?}", started.elapsed());
    let Err(LockError::Unavailable { source }) = &refused else {
        panic!("{refused:?}")
    };
    let said = source.to_string();
    assert!(
        said.starts_with(&format!("MySQL at 127.0.0.1:{port}/test: cannot connect"))
            && said.to_lowercase().contains("refused")
            && !said.contains("secret"),
        "{said}"
    );
}

/// A multi-key set is one statement (a multi-row insert whose refusal of any row fails it whole),
/// and a second only to read the fencing tokens when asked for, or to name the lock held when a
/// caller that will not wait is refused; a refused set leaves nothing taken. Counted by the
/// server (its `Com_*` status).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_is_one_statement_and_a_refused_one_takes_nothing() {
    let server = blocking(MariadbServer::spawn).await;
    let (c, other) = (client(&server).await, client(&server).await);
    // A client's first acquire sweeps in the background: settled before counting.
    for client in [&c, &other] {
        client
            .acquire("warm", &ttl(1000))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let ran = || -> u64 {
        server
            .sql(
                "SHOW GLOBAL STATUS WHERE Variable_name IN \
                 ('Com_select', 'Com_insert', 'Com_update', 'Com_delete', 'Com_insert_select')",
            )
            .lines()
            .filter_map(|line| line.split('\t').nth(1)?.trim().parse::<u64>().ok())
            .sum()
    };
    let mut last = ran();
    eventually(5 * SECOND, "the sweeps are done", || {
        let now = ran();
        let settled = now == last;
        last = now;
        async move { settled }
    })
    .await;
    let keys = ["set:a", "set:b", "set:c"];
    for (fencing, statements) in [(false, 1), (true, 2)] {
        let before = ran();
        let all = c.acquire_all(keys, &ttl(10_000).fencing(fencing)).await.unwrap();
        assert_eq!(ran() - before, statements, "fencing: {fencing}");
        let tokens: Vec<Option<u64>> = keys.iter().map(|k| all.fencing_token_for(k)).collect();
        assert!(tokens.iter().all(|t| t.is_some() == fencing), "{tokens:?}");
        assert!(all.release().await.unwrap());
    }
    let held = other.acquire("set:b", &ttl(10_000)).await.unwrap();
    let before = ran();
    let refused = c.acquire_all(keys, &ttl(10_000)).await;
    assert_eq!(
        ran() - before,
        2,
        "the set's statement, and the read that names the lock held"
    );
    assert!(
        matches!(refused, Err(LockError::Busy { ref key }) if key == "set:b"),
        "{refused:?}"
    );
    for key in ["set:a", "set:c"] {
        assert!(!c.is_locked(key).await.unwrap(), "{key} left taken");
    }
    held.release().await.unwrap();
    // A lock whose holder stopped renewing (left, as by a crashed process): once its lease
    // ended, its row is taken by the set's statement, and its token rises.
    let lapsed = other.acquire("set:c", &ttl(200).fencing(true)).await.unwrap();
    let before = lapsed.fencing_token().unwrap();
    std::mem::forget(lapsed);
    eventually(5 * SECOND, "the lease ends", || async {
        !c.is_locked("set:c").await.unwrap()
    })
    .await;
    let all = c.acquire_all(keys, &ttl(10_000).fencing(true)).await.unwrap();
    assert!(all.fencing_token_for("set:c").unwrap() > before);
    assert!(all.release().await.unwrap());
}

/// A semaphore on MySQL: a free permit is one statement (the header and the permit in one
/// insert), a refused try two (the claim, and the read that says why); once the last holder
/// leaves the key is free at once, for a lock or another count; two waiters of another client
/// get the two permits given back by polling (no notifications).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_is_one_statement_a_permit_and_its_key_is_freed_by_its_last_holder() {
    let server = blocking(MariadbServer::spawn).await;
    let (c, other) = (client(&server).await, client(&server).await);
    for client in [&c, &other] {
        client
            .acquire("warm", &ttl(1000))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let ran = || -> u64 {
        server
            .sql(
                "SHOW GLOBAL STATUS WHERE Variable_name IN \
                 ('Com_select', 'Com_insert', 'Com_update', 'Com_delete', 'Com_insert_select')",
            )
            .lines()
            .filter_map(|line| line.split('\t').nth(1)?.trim().parse::<u64>().ok())
            .sum()
    };
    let mut last = ran();
    eventually(5 * SECOND, "the sweeps are done", || {
        let now = ran();
        let settled = now == last;
        last = now;
        async move { settled }
    })
    .await;
    let two = ttl(10_000).permits(2);
    let before = ran();
    let first = c.acquire("sem", &two.clone().fencing(true)).await.unwrap();
    assert_eq!(ran() - before, 1, "a free permit: one statement");
    assert!(first.fencing_token().is_some());
    let second = other.acquire("sem", &two).await.unwrap();
    assert_ne!(first.permit(), second.permit());
    let before = ran();
    let refused = c.acquire("sem", &two).await;
    assert!(matches!(refused, Err(LockError::Busy { .. })), "{refused:?}");
    assert_eq!(ran() - before, 2, "the claim, and the read that says why");
    // Two waiters of another client; both permits given back at once.
    let waiting = two.clone().wait(10 * SECOND);
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let (c, waiting) = (c.clone(), waiting.clone());
            tokio::spawn(async move { c.acquire("sem", &waiting).await })
        })
        .collect();
    eventually(5 * SECOND, "both wait", || async {
        lock_tests::waiting(&c, "sem") == 2
    })
    .await;
    let (a, b) = tokio::join!(first.release(), second.release());
    assert!(a.unwrap() && b.unwrap());
    let mut guards = Vec::new();
    for waiter in waiters {
        guards.push(waiter.await.unwrap().expect("each waiter gets a permit"));
    }
    for guard in guards {
        assert!(guard.release().await.unwrap());
    }
    // The last holder gone, the key is free at once: for a lock, and then for another count.
    let lock = other.acquire("sem", &ttl(10_000)).await.unwrap();
    assert!(lock.release().await.unwrap());
    let three = other.acquire("sem", &ttl(10_000).permits(3)).await.unwrap();
    assert!(three.release().await.unwrap());
    // A permit kept for a minimum hold longer than its ttl keeps the key a semaphore's past
    // the ttl, until the hold ends.
    let kept = c
        .acquire(
            "sem:kept",
            &ttl(300).permits(2).hold_at_least(Duration::from_secs(3)),
        )
        .await
        .unwrap();
    let released = Instant::now();
    assert!(kept.release().await.unwrap());
    tokio::time::sleep_until(released + Duration::from_millis(600)).await;
    let refused = other.acquire("sem:kept", &ttl(10_000)).await;
    assert!(
        matches!(&refused, Err(LockError::InvalidOptions { reason }) if reason.contains("2 permits")),
        "past the ttl, within the hold: {refused:?}"
    );
    eventually(10 * SECOND, "the hold ends", || async {
        other.acquire("sem:kept", &ttl(10_000)).await.is_ok()
    })
    .await;
}

/// An acquire abandoned unanswered may reach the server after its release: the release goes on
/// another connection, finds nothing, and the attempt then takes the key for nobody. Made to
/// happen here by a proxy that holds the attempt back past the response timeout while the
/// release goes straight. The release is sent again once the attempt has ended on the
/// server: the key is held until then, not for its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_acquire_that_lands_after_its_release_is_given_back() {
    let server = blocking(MariadbServer::spawn).await;
    let proxy = FaultProxy::start(server.port());
    let c = builder(&format!("mysql://root@127.0.0.1:{}/test", proxy.port()))
        .response_timeout(3 * SECOND)
        .build()
        .await
        .unwrap();
    lock_tests::a_late_attempt_is_given_back(&c, &proxy).await;
}
