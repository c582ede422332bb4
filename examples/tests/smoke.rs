//! Runs every example as a user would, against a spawned redis-server (and without one), and
//! checks that it exits 0, prints its summary and leaves no key behind in Redis. `fenced_storage`
//! also runs against PostgreSQL: `DATABASE_URL`, else the machine's local server; where none
//! answers, that part is skipped (and says so) and the fallback to the in-process store is
//! checked instead.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use lock_tests::RedisServer;

/// The example binary `cargo test` built next to this test's own.
fn example(name: &str) -> Command {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir: PathBuf = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .join("examples");
    let mut command = Command::new(dir.join(name));
    command.stdin(Stdio::null());
    command
}

fn run(mut command: Command, redis_url: &str) -> (Output, String) {
    let output = command
        .env("REDIS_URL", redis_url)
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    (output, stdout)
}

/// The two columns of the `DOUBLE CHARGES` row: locked, naive.
fn double_charges(stdout: &str) -> (u64, u64) {
    let row = stdout
        .lines()
        .find(|l| l.starts_with("DOUBLE CHARGES"))
        .expect("a summary row");
    let numbers: Vec<u64> = row.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    (numbers[0], numbers[1])
}

/// The keys left on `server` after an example ran: none.
fn assert_no_keys_left(server: &RedisServer) {
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .expect("a connection to the test redis-server");
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert!(keys.is_empty(), "the example left keys in Redis: {keys:?}");
}

fn dead_url() -> String {
    let mut server = RedisServer::spawn();
    let url = server.url();
    server.kill();
    url
}

#[test]
fn payment_dedup_across_processes_on_redis() {
    let server = RedisServer::spawn();
    let (_, stdout) = run(example("payment_dedup"), &server.url());
    assert!(stdout.contains("separate processes"), "{stdout}");
    assert!(stdout.contains("requests handled"), "progress is shown: {stdout}");
    let (locked, naive) = double_charges(&stdout);
    assert_eq!(locked, 0, "{stdout}");
    assert!(
        naive > 0,
        "the naive handler's double charges show under the defaults:\n{stdout}"
    );
    assert!(
        stdout.contains("token"),
        "charges carry their fencing token: {stdout}"
    );
    assert_no_keys_left(&server);
}

/// With `LOCKS=postgres`, the locked handler's locks are rows in PostgreSQL: still no order
/// charged twice, across processes, and none of the run's rows left.
#[test]
fn payment_dedup_with_its_locks_in_postgres() {
    let url = postgres_url();
    if let Err(e) = postgres_bool(&url, "SELECT $1 = 'up'", "up") {
        let _ = writeln!(
            std::io::stderr(),
            "payment_dedup_with_its_locks_in_postgres: skipped, no PostgreSQL at {url} ({e})"
        );
        return;
    }
    let server = RedisServer::spawn();
    let mut command = example("payment_dedup");
    command
        .args(["--orders", "20", "--requests", "4", "--instances", "3"])
        .env("DATABASE_URL", &url)
        .env("LOCKS", "postgres");
    // The run's rows are under a prefix it makes itself (`payment-dedup:<its pid>:…`): none of
    // them may be left, so no more such rows after it than before.
    let rows = || {
        block_on(async {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM lock_runtime_locks WHERE starts_with(key, 'payment-dedup:')",
            )
            .fetch_one(&mut conn)
            .await
            .unwrap_or(0)
        })
    };
    let before = rows();
    let (_, stdout) = run(command, &server.url());
    assert!(stdout.contains("locks in PostgreSQL"), "{stdout}");
    assert_eq!(double_charges(&stdout).0, 0, "{stdout}");
    assert!(
        stdout.contains("token"),
        "charges carry their fencing token: {stdout}"
    );
    assert!(rows() <= before, "the run's lock rows are still there");
    assert_no_keys_left(&server);
}

#[test]
fn payment_dedup_without_redis_runs_in_memory() {
    let mut command = example("payment_dedup");
    command.args(["--orders", "20", "--requests", "4", "--instances", "3"]);
    let (_, stdout) = run(command, &dead_url());
    assert!(stdout.contains("in-memory backend"), "{stdout}");
    assert_eq!(double_charges(&stdout).0, 0, "{stdout}");
}

#[test]
fn payment_dedup_help() {
    let mut command = example("payment_dedup");
    command.arg("--help");
    let (_, stdout) = run(command, &dead_url());
    assert!(stdout.contains("--orders N"), "{stdout}");
}

#[test]
fn scheduled_job_runs_once_per_tick() {
    let server = RedisServer::spawn();
    let mut command = example("scheduled_job");
    command.args(["--ticks", "2"]);
    let (_, stdout) = run(command, &server.url());
    assert!(stdout.contains("tick 2:"), "{stdout}");
    assert!(stdout.contains("ran exactly once per tick"), "{stdout}");
    // Including the last tick's lock, which hold_at_least_ms keeps after the job.
    assert_no_keys_left(&server);
}

#[test]
fn export_worker_keeps_each_tenant_within_its_permits() {
    let server = RedisServer::spawn();
    let mut command = example("export_worker");
    command.args(["--jobs", "12"]);
    let (_, stdout) = run(command, &server.url());
    assert!(
        stdout.contains("ok: every tenant ran at most 2 exports at once, and reached 2"),
        "{stdout}"
    );
    assert_no_keys_left(&server);
}

#[test]
fn transfer_holds_both_accounts_and_keeps_the_total() {
    let server = RedisServer::spawn();
    let mut command = example("transfer");
    command.args(["--transfers", "30"]);
    let (_, stdout) = run(command, &server.url());
    assert!(
        stdout.contains("ok: with keys = [from, to] every transfer went through"),
        "{stdout}"
    );
    assert_no_keys_left(&server);
}

/// `DATABASE_URL`, else the machine's own PostgreSQL (trust auth, database `test`).
fn postgres_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".to_owned())
}

fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

/// Runs `query` (one bool column, `$1` bound to `arg`) on PostgreSQL at `url`; `Err` with the
/// reason when it does not answer.
fn postgres_bool(url: &str, query: &str, arg: &str) -> Result<bool, String> {
    use sqlx::Connection;
    block_on(async {
        let connect = sqlx::PgConnection::connect(url);
        let mut conn = tokio::time::timeout(Duration::from_secs(3), connect)
            .await
            .map_err(|_| "no answer within 3 s".to_owned())?
            .map_err(|e| e.to_string())?;
        let answer = sqlx::query_scalar(query).bind(arg).fetch_one(&mut conn).await;
        let _ = conn.close().await;
        answer.map_err(|e| e.to_string())
    })
}

/// Runs `fenced_storage` with `DATABASE_URL` set to `database_url` (or unset), against a spawned
/// redis-server; checks the story and that no key is left. Returns its output.
fn run_fenced_storage(database_url: Option<&str>) -> String {
    let server = RedisServer::spawn();
    let mut command = example("fenced_storage");
    match database_url {
        Some(url) => command.env("DATABASE_URL", url),
        None => command.env_remove("DATABASE_URL"),
    };
    let (_, stdout) = run(command, &server.url());
    assert!(stdout.contains("writes balance=90 with token"), "{stdout}");
    assert!(stdout.contains("write REJECTED"), "{stdout}");
    assert!(stdout.contains("the store holds balance=90"), "{stdout}");
    assert!(stdout.contains("ok: the stale write was refused"), "{stdout}");
    assert_no_keys_left(&server);
    stdout
}

#[test]
fn fenced_storage_on_postgres_rejects_the_stale_write() {
    let url = postgres_url();
    if let Err(e) = postgres_bool(&url, "SELECT $1 = 'up'", "up") {
        // Straight to stderr: the test harness does not capture that, so the skip shows.
        let _ = writeln!(
            std::io::stderr(),
            "fenced_storage_on_postgres_rejects_the_stale_write: skipped the PostgreSQL part, \
             no PostgreSQL answers at DATABASE_URL or postgres://root@127.0.0.1:5432/test ({e}); \
             checking the fallback to the in-process store instead"
        );
        let stdout = run_fenced_storage(Some(&url));
        assert!(
            stdout.contains("store: in this process (no PostgreSQL at"),
            "{stdout}"
        );
        assert!(stdout.contains("write REJECTED by the store"), "{stdout}");
        return;
    }
    let stdout = run_fenced_storage(Some(&url));
    let table = stdout
        .lines()
        .find_map(|l| l.strip_prefix("store: PostgreSQL at "))
        .and_then(|l| l.split_whitespace().nth(2))
        .unwrap_or_else(|| panic!("a line saying the store is PostgreSQL, and its table: {stdout}"))
        .to_owned();
    assert!(table.starts_with("fenced_storage_accounts_"), "{stdout}");
    assert!(
        stdout.contains("write REJECTED by PostgreSQL: the UPDATE matched no row"),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("dropped table {table}")), "{stdout}");
    let exists = postgres_bool(&url, "SELECT to_regclass($1) IS NOT NULL", &table).unwrap();
    assert!(!exists, "table {table} is still there");
}

/// With `LOCKS=postgres` the locks are in the storage's own database, through the library's
/// PostgreSQL store: the same story, and no lock row of the run left behind.
#[test]
fn fenced_storage_with_its_locks_in_postgres() {
    let url = postgres_url();
    if let Err(e) = postgres_bool(&url, "SELECT $1 = 'up'", "up") {
        let _ = writeln!(
            std::io::stderr(),
            "fenced_storage_with_its_locks_in_postgres: skipped, no PostgreSQL at {url} ({e})"
        );
        return;
    }
    let server = RedisServer::spawn();
    let mut command = example("fenced_storage");
    command.env("DATABASE_URL", &url).env("LOCKS", "postgres");
    let (_, stdout) = run(command, &server.url());
    assert!(
        stdout.contains("locks: PostgreSQL, the same database"),
        "{stdout}"
    );
    assert!(
        stdout.contains("write REJECTED by PostgreSQL: the UPDATE matched no row"),
        "{stdout}"
    );
    assert!(stdout.contains("ok: the stale write was refused"), "{stdout}");
    let left = postgres_bool(
        &url,
        "SELECT EXISTS (SELECT 1 FROM lock_runtime_locks WHERE starts_with(key, $1))",
        "fenced-storage-example",
    )
    .unwrap();
    assert!(!left, "the run's lock rows are still there");
    assert_no_keys_left(&server);
}

#[test]
fn fenced_storage_without_database_url_uses_the_in_process_store() {
    let stdout = run_fenced_storage(None);
    assert!(
        stdout.contains("store: in this process (DATABASE_URL is not set)"),
        "{stdout}"
    );
    assert!(stdout.contains("write REJECTED by the store"), "{stdout}");
    assert!(!stdout.contains("dropped table"), "{stdout}");
    // Without Redis either: the in-memory lock backend.
    let mut command = example("fenced_storage");
    command.env_remove("DATABASE_URL");
    let (_, stdout) = run(command, &dead_url());
    assert!(
        stdout.contains("in-memory backend") && stdout.contains("write REJECTED"),
        "{stdout}"
    );
}

#[test]
fn fenced_storage_falls_back_when_postgres_refuses() {
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://root@127.0.0.1:{closed_port}/test");
    let stdout = run_fenced_storage(Some(&url));
    assert!(
        stdout.contains(&format!(
            "store: in this process (no PostgreSQL at 127.0.0.1:{closed_port}/test"
        )),
        "{stdout}"
    );
    assert!(stdout.contains("write REJECTED by the store"), "{stdout}");
}

/// Sends `POST path` over a fresh connection; returns the status code and body.
fn post(port: u16, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, response)
}

#[test]
fn axum_orders_serves_over_http() {
    let server = RedisServer::spawn();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut command = example("axum_orders");
    command
        .args(["--port", &port.to_string()])
        .env("REDIS_URL", server.url())
        .stdout(Stdio::piped());
    let mut child = command.spawn().expect("the example starts");
    let mut first_line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first_line)
        .expect("a line");
    assert!(first_line.starts_with("listening on"), "{first_line}");
    let (status, body) = post(port, "/orders/1/pay");
    let (again, again_body) = post(port, "/orders/1/pay");
    // SIGTERM, as a process manager stops it: it shuts down gracefully and exits 0.
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    let exited = loop {
        match child.try_wait().expect("the example's status") {
            Some(status) => break Some(status),
            None if Instant::now() > deadline => break None,
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    if exited.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("order 1 paid"), "{body}");
    assert_eq!(again, 200, "{again_body}");
    assert!(again_body.contains("already paid"), "{again_body}");
    let exited = exited.expect("the example stops within 10 s of SIGTERM");
    assert!(exited.success(), "{exited:?}");
    assert_no_keys_left(&server);
}
