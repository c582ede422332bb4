//! The multi-process checker: P worker processes × T tasks contend on K keys for D seconds
//! through `#[distributed_lock(…, watchdog, fencing)]`, while faults are injected, and the
//! history their writes left in a fenced store is checked afterwards.
//!
//! ```text
//! cargo run -p lock-tests --bin checker -- [--processes 3] [--tasks 4] [--keys 3] [--seconds 15]
//!                                          [--faults kill,stop,restart,blackhole,delay] [--json]
//! ```
//!
//! Each critical section reads a counter from the store and writes it back plus one (a
//! read-modify-write), both through the store's fenced script: the store accepts a write only
//! with a token at least as high as the highest it has accepted, and appends every accepted
//! write to the key's history. Workers reach the lock server through a fault proxy each; the
//! store is a second server that is never disturbed. Checked at the end, per key:
//! - no overlap as the store sees it: the accepted writes of one token form one contiguous run
//!   (no other holder's write landed inside a critical section);
//! - every accepted write carried the highest token so far;
//! - no lost update: the counter equals the number of accepted increments.
//!
//! Faults, one at a time, spread over the run: `kill` (SIGKILL of a worker), `stop` (SIGSTOP of
//! a worker for twice the ttl, then SIGCONT: its late writes must be refused by fencing),
//! `restart` (the lock server restarts empty), `blackhole` (a worker's connections go silent),
//! `delay` (a worker's connections are delayed by 100 ms for a second). Each is reported with
//! what it cost: how long until every key was written again. Exit status 0 when every check
//! held, 1 otherwise.

use std::collections::HashMap;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, LockClient, LockError};
use lock_tests::{FaultProxy, RedisServer};
use redis::AsyncCommands;

const TTL: Duration = Duration::from_millis(600);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("checker: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = if args.first().map(String::as_str) == Some("worker") {
        runtime.block_on(worker(&args[1..]))
    } else {
        runtime.block_on(coordinate(&args))
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("checker: {e}");
            ExitCode::FAILURE
        }
    }
}

type Fallible<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

// ---------------------------------------------------------------------------------------------
// The store

/// The fenced store every critical section writes to.
#[derive(Clone)]
struct Store {
    conn: redis::aio::MultiplexedConnection,
    script: std::sync::Arc<redis::Script>,
}

impl Store {
    async fn connect(url: &str) -> Fallible<Store> {
        let conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        let script = redis::Script::new(include_str!("../checker/store.lua"));
        Ok(Store {
            conn,
            script: std::sync::Arc::new(script),
        })
    }

    /// A fenced write; whether the store accepted it.
    async fn write(
        &self,
        key: u64,
        token: u64,
        writer: &str,
        op: &str,
        value: u64,
    ) -> redis::RedisResult<bool> {
        let mut conn = self.conn.clone();
        let accepted: i64 = self
            .script
            .key(format!("store:{{{key}}}"))
            .key(format!("history:{{{key}}}"))
            .arg(token)
            .arg(writer)
            .arg(op)
            .arg(value)
            .invoke_async(&mut conn)
            .await?;
        Ok(accepted == 1)
    }

    async fn value(&self, key: u64) -> redis::RedisResult<u64> {
        let mut conn = self.conn.clone();
        let value: Option<u64> = conn.hget(format!("store:{{{key}}}"), "value").await?;
        Ok(value.unwrap_or(0))
    }

    async fn history_len(&self, key: u64) -> redis::RedisResult<usize> {
        let mut conn = self.conn.clone();
        conn.llen(format!("history:{{{key}}}")).await
    }
}

// ---------------------------------------------------------------------------------------------
// A worker process

/// Why a critical section did not complete.
#[derive(Debug)]
enum Failure {
    Lock(LockError),
    Store(redis::RedisError),
}

impl From<LockError> for Failure {
    fn from(e: LockError) -> Self {
        Failure::Lock(e)
    }
}

impl From<redis::RedisError> for Failure {
    fn from(e: redis::RedisError) -> Self {
        Failure::Store(e)
    }
}

/// One critical section: a read-modify-write of key `k`'s counter, fenced.
#[distributed_lock(key = "chk:<k>", ttl_ms = 600, watchdog, fencing, wait_ms = 3000, client = locks)]
async fn critical(
    locks: &LockClient,
    store: &Store,
    k: u64,
    writer: &str,
    pause: Duration,
) -> Result<bool, Failure> {
    let token = lock_runtime::current()
        .and_then(|l| l.fencing_token())
        .unwrap_or(0);
    if !store.write(k, token, writer, "enter", 0).await? {
        return Ok(false);
    }
    let value = store.value(k).await?;
    tokio::time::sleep(pause).await; // widen the window a second holder would have to slip into
    Ok(store.write(k, token, writer, "set", value + 1).await?)
}

#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    attempts: u64,
    accepted: u64,
    refused: u64,
    busy: u64,
    lost: u64,
    unavailable: u64,
    other: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.attempts += other.attempts;
        self.accepted += other.accepted;
        self.refused += other.refused;
        self.busy += other.busy;
        self.lost += other.lost;
        self.unavailable += other.unavailable;
        self.other += other.other;
    }

    fn line(&self) -> String {
        format!(
            "tally attempts={} accepted={} refused={} busy={} lost={} unavailable={} other={}",
            self.attempts, self.accepted, self.refused, self.busy, self.lost, self.unavailable, self.other
        )
    }

    fn parse(line: &str) -> Option<Tally> {
        let fields: HashMap<&str, u64> = line
            .strip_prefix("tally ")?
            .split(' ')
            .filter_map(|kv| kv.split_once('='))
            .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
            .collect();
        Some(Tally {
            attempts: *fields.get("attempts")?,
            accepted: *fields.get("accepted")?,
            refused: *fields.get("refused")?,
            busy: *fields.get("busy")?,
            lost: *fields.get("lost")?,
            unavailable: *fields.get("unavailable")?,
            other: *fields.get("other")?,
        })
    }
}

/// `worker <lock-url> <store-url> <id> <tasks> <keys> <millis>`: runs the tasks until the time
/// is up and prints its tally.
async fn worker(args: &[String]) -> Fallible<bool> {
    let [lock_url, store_url, id, tasks, keys, millis] = args else {
        return Err("usage: checker worker <lock-url> <store-url> <id> <tasks> <keys> <millis>".into());
    };
    let (tasks, keys): (u64, u64) = (tasks.parse()?, keys.parse()?);
    let deadline = Instant::now() + Duration::from_millis(millis.parse()?);
    let locks = LockClient::builder()
        .url(lock_url)
        .connect_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_millis(300))
        .build_lazy()?;
    let store = Store::connect(store_url).await?;
    let mut running = Vec::new();
    for task in 0..tasks {
        let (locks, store) = (locks.clone(), store.clone());
        let writer = format!("w{id}.{task}");
        let mut dice = 0x9e37_79b9_7f4a_7c15_u64 ^ (u64::from(std::process::id()) << 8) ^ task;
        running.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            while Instant::now() < deadline {
                dice ^= dice << 13;
                dice ^= dice >> 7;
                dice ^= dice << 17;
                let (k, pause) = (dice % keys, Duration::from_millis(dice % 5));
                tally.attempts += 1;
                match critical(&locks, &store, k, &writer, pause).await {
                    Ok(true) => tally.accepted += 1,
                    Ok(false) => tally.refused += 1,
                    Err(Failure::Lock(LockError::Busy { .. })) => tally.busy += 1,
                    Err(Failure::Lock(LockError::Lost { .. })) => tally.lost += 1,
                    Err(Failure::Lock(LockError::Unavailable { .. })) => {
                        tally.unavailable += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(Failure::Store(e)) => {
                        eprintln!("checker worker: store error: {e}");
                        tally.other += 1;
                    }
                    Err(Failure::Lock(_)) => tally.other += 1,
                }
            }
            tally
        }));
    }
    let mut total = Tally::default();
    for task in running {
        total.add(&task.await?);
    }
    locks.shutdown().await;
    println!("{}", total.line());
    Ok(true)
}

// ---------------------------------------------------------------------------------------------
// The coordinator

struct Settings {
    processes: usize,
    tasks: u64,
    keys: u64,
    seconds: u64,
    faults: Vec<String>,
    json: bool,
}

fn settings(args: &[String]) -> Fallible<Settings> {
    let mut s = Settings {
        processes: 3,
        tasks: 4,
        keys: 3,
        seconds: 15,
        faults: ["kill", "stop", "restart", "blackhole", "delay"]
            .map(String::from)
            .to_vec(),
        json: false,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--processes" => s.processes = value()?.parse()?,
            "--tasks" => s.tasks = value()?.parse()?,
            "--keys" => s.keys = value()?.parse()?,
            "--seconds" => s.seconds = value()?.parse()?,
            "--faults" => {
                s.faults = value()?
                    .split(',')
                    .filter(|f| !f.is_empty())
                    .map(String::from)
                    .collect()
            }
            "--json" => s.json = true,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if s.processes < 3 {
        return Err("--processes must be at least 3 (faults pick different workers)".into());
    }
    Ok(s)
}

struct Cost {
    fault: String,
    at: Duration,
    recovered_after: Option<Duration>,
}

async fn coordinate(args: &[String]) -> Fallible<bool> {
    let s = settings(args)?;
    let mut lock_server = RedisServer::spawn();
    let store_server = RedisServer::spawn();
    let store = Store::connect(&store_server.url()).await?;
    let millis = s.seconds * 1000;
    let exe = std::env::current_exe()?;
    let mut proxies = Vec::new();
    let mut workers: Vec<Option<Child>> = Vec::new();
    for id in 0..s.processes {
        let proxy = FaultProxy::start(lock_server.port());
        let child = Command::new(&exe)
            .args(["worker", &proxy.url(), &store_server.url(), &id.to_string()])
            .args([s.tasks.to_string(), s.keys.to_string(), millis.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        proxies.push(proxy);
        workers.push(Some(child));
    }
    let started = Instant::now();
    let mut costs = Vec::new();
    let slots = s.faults.len() as u32 + 2;
    for (i, fault) in s.faults.iter().enumerate() {
        let at = Duration::from_millis(millis) * (i as u32 + 1) / slots;
        tokio::time::sleep(at.saturating_sub(started.elapsed())).await;
        let at = started.elapsed();
        let lengths = history_lengths(&store, s.keys).await?;
        match fault.as_str() {
            "kill" => {
                if let Some(mut child) = workers[0].take() {
                    child.kill()?;
                    child.wait()?;
                }
            }
            "stop" => {
                let pid = workers[1].as_ref().map(Child::id).ok_or("worker 1 is gone")?;
                signal("-STOP", pid)?;
                tokio::time::sleep(TTL * 2).await;
                signal("-CONT", pid)?;
            }
            "restart" => lock_server.restart(),
            "blackhole" => proxies[2].blackhole_existing(),
            "delay" => {
                let proxy = &proxies[1 % proxies.len()];
                proxy.delay(Duration::from_millis(100));
                tokio::time::sleep(Duration::from_secs(1)).await;
                proxy.relay();
            }
            other => return Err(format!("unknown fault {other}").into()),
        }
        let recovered_after = recovery(&store, s.keys, &lengths).await?;
        costs.push(Cost {
            fault: fault.clone(),
            at,
            recovered_after,
        });
    }
    let mut tally = Tally::default();
    for child in workers.into_iter().flatten() {
        let output = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
        let text = String::from_utf8_lossy(&output.stdout);
        match text.lines().find_map(Tally::parse) {
            Some(t) if output.status.success() => tally.add(&t),
            _ => return Err(format!("a worker failed ({}): {text}", output.status).into()),
        }
    }
    let verdict = check(&store, s.keys).await?;
    report(&s, &tally, &costs, &verdict, started.elapsed());
    Ok(verdict.overlaps == 0 && verdict.stale_accepted == 0 && verdict.lost_updates == 0)
}

fn signal(signal: &str, pid: u32) -> Fallible<()> {
    let status = Command::new("kill").args([signal, &pid.to_string()]).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill {signal} {pid} failed").into())
    }
}

async fn history_lengths(store: &Store, keys: u64) -> Fallible<Vec<usize>> {
    let mut lengths = Vec::new();
    for k in 0..keys {
        lengths.push(store.history_len(k).await?);
    }
    Ok(lengths)
}

/// How long after the fault ended until every key was written again; `None`
/// when that took more than 10 s.
async fn recovery(store: &Store, keys: u64, before: &[usize]) -> Fallible<Option<Duration>> {
    let polled = Instant::now();
    while polled.elapsed() < Duration::from_secs(10) {
        let now = history_lengths(store, keys).await?;
        if now.iter().zip(before).all(|(n, b)| n > b) {
            return Ok(Some(polled.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(None)
}

#[derive(Default)]
struct Verdict {
    accepted_writes: u64,
    increments: u64,
    refused_stale: u64,
    overlaps: u64,
    stale_accepted: u64,
    lost_updates: u64,
}

/// Reads every key's history and counter back from the store and checks them.
async fn check(store: &Store, keys: u64) -> Fallible<Verdict> {
    let mut verdict = Verdict::default();
    let mut conn = store.conn.clone();
    for k in 0..keys {
        let history: Vec<String> = conn.lrange(format!("history:{{{k}}}"), 0, -1).await?;
        let fields: HashMap<String, u64> = conn.hgetall(format!("store:{{{k}}}")).await?;
        let mut highest = 0u64;
        let mut finished: std::collections::HashSet<u64> = std::collections::HashSet::new();
        let mut current: Option<u64> = None;
        let mut sets = 0u64;
        for entry in &history {
            let mut parts = entry.split(' ');
            let token: u64 = parts
                .next()
                .and_then(|t| t.parse().ok())
                .ok_or("bad history entry")?;
            let op = parts.nth(1).ok_or("bad history entry")?;
            verdict.accepted_writes += 1;
            if token < highest {
                verdict.stale_accepted += 1;
            }
            highest = highest.max(token);
            if current != Some(token) {
                // A holder's run of writes ended; another one's must not come back later.
                if let Some(previous) = current {
                    finished.insert(previous);
                }
                if finished.contains(&token) {
                    verdict.overlaps += 1;
                }
                current = Some(token);
            }
            if op == "set" {
                sets += 1;
            }
        }
        let value = fields.get("value").copied().unwrap_or(0);
        let increments = fields.get("increments").copied().unwrap_or(0);
        verdict.increments += increments;
        verdict.refused_stale += fields.get("rejected").copied().unwrap_or(0);
        verdict.lost_updates += increments.abs_diff(value) + sets.abs_diff(increments);
    }
    Ok(verdict)
}

fn report(s: &Settings, t: &Tally, costs: &[Cost], v: &Verdict, took: Duration) {
    let ms = |d: Option<Duration>| d.map_or("null".to_owned(), |d| d.as_millis().to_string());
    if s.json {
        let faults: Vec<String> = costs
            .iter()
            .map(|c| {
                format!(
                    r#"{{"fault":"{}","at_ms":{},"recovered_after_ms":{}}}"#,
                    c.fault,
                    c.at.as_millis(),
                    ms(c.recovered_after)
                )
            })
            .collect();
        println!(
            r#"{{"processes":{},"tasks":{},"keys":{},"seconds":{},"critical_sections":{},"completed":{},"refused_by_fencing":{},"busy":{},"lost":{},"unavailable":{},"other_errors":{},"accepted_writes":{},"increments":{},"stale_writes_refused":{},"faults":[{}],"overlaps":{},"stale_writes_accepted":{},"lost_updates":{}}}"#,
            s.processes,
            s.tasks,
            s.keys,
            s.seconds,
            t.attempts,
            t.accepted,
            t.refused,
            t.busy,
            t.lost,
            t.unavailable,
            t.other,
            v.accepted_writes,
            v.increments,
            v.refused_stale,
            faults.join(","),
            v.overlaps,
            v.stale_accepted,
            v.lost_updates
        );
        return;
    }
    println!(
        "checker: {} processes × {} tasks on {} keys for {} s (took {:.1} s)",
        s.processes,
        s.tasks,
        s.keys,
        s.seconds,
        took.as_secs_f64()
    );
    println!(
        "critical sections: {} attempted, {} completed, {} refused by fencing, {} busy, {} lost, {} unavailable, {} other",
        t.attempts, t.accepted, t.refused, t.busy, t.lost, t.unavailable, t.other
    );
    println!(
        "store: {} accepted writes, {} increments, {} stale writes refused",
        v.accepted_writes, v.increments, v.refused_stale
    );
    for c in costs {
        println!(
            "fault {:<9} at {:>6} ms: every key written again {} ms after it ended",
            c.fault,
            c.at.as_millis(),
            ms(c.recovered_after)
        );
    }
    println!(
        "overlaps observed: {}, stale writes accepted: {}, lost updates: {}",
        v.overlaps, v.stale_accepted, v.lost_updates
    );
}
