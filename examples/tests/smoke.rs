//! Runs every example as a user would, against a spawned redis-server (and without one), and
//! checks that it exits 0 and prints its summary.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

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
}

#[test]
fn fenced_storage_rejects_the_stale_write() {
    let server = RedisServer::spawn();
    let (_, stdout) = run(example("fenced_storage"), &server.url());
    assert!(stdout.contains("write REJECTED"), "{stdout}");
    assert!(stdout.contains("the store holds balance=90"), "{stdout}");
    let (_, stdout) = run(example("fenced_storage"), &dead_url());
    assert!(
        stdout.contains("in-memory backend") && stdout.contains("write REJECTED"),
        "{stdout}"
    );
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
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("order 1 paid"), "{body}");
    assert_eq!(again, 200, "{again_body}");
    assert!(again_body.contains("already paid"), "{again_body}");
}
