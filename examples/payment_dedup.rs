//! Payment dedup across service instances: the incident this library exists for.
//!
//! Several instances of a payment service receive the same charge requests (double clicks,
//! client retries, a load balancer re-sending) for a set of orders, at the same time. The payment
//! gateway is usually quick, but now and then a call takes longer than a lock's ttl (a slow bank, a
//! GC pause): the client times out and re-sends. The same load runs through two handlers:
//!
//! - `charge_locked`: `#[distributed_lock(key = "order:<order_id>", ttl_ms = 500, watchdog, fencing)]`.
//!   The watchdog keeps the lock through a slow gateway call, so every order is charged once.
//! - `charge_naive`: hand-written `SET NX` + `EXPIRE` and a bare `DEL`. Its lock expires during a
//!   slow call, a retry takes it and charges again, and the first holder's `DEL` then frees the
//!   retry's lock for a third.
//!
//! With Redis reachable (`REDIS_URL`, default `redis://127.0.0.1:6379`) each instance is a
//! separate OS process (this program re-executes itself); without it, the instances are tasks on
//! the in-memory backend. With `LOCKS=postgres` and `DATABASE_URL`, the locked handler's locks
//! live in that PostgreSQL database (the library's PostgreSQL store), the ledger in Redis. Exits non-zero if the locked handler ever charges an order twice
//! or fails. A call whose lock lapsed while it ran (the machine or the store stalled for most of
//! a ttl) is stopped by the watchdog and counted apart (`stopped, lock lost`): it charged nothing
//! under a lock it no longer held.
//!
//! ```text
//! cargo run --example payment_dedup -- --orders 40 --requests 4 --instances 4
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use lock_examples::{delete_keys_under, redis_url, try_redis, Flags};
use lock_runtime::{distributed_lock, LockClient, LockError};
use redis::AsyncCommands;
use tokio::time::Instant;

const USAGE: &str = "payment_dedup: several instances charge the same orders; a lock makes it once.

usage: cargo run --example payment_dedup -- [--orders N] [--requests N] [--instances N]

  --orders N      orders to pay (default 40)
  --requests N    requests each order receives: the click, a double click, retries (default 4)
  --instances N   service instances sharing the load (default 4)

Redis: REDIS_URL (default redis://127.0.0.1:6379); without a Redis there, the instances run as
tasks on the in-memory backend.";

/// The lease of both handlers' locks. Gateway calls normally take 20-120 ms; one in seven
/// takes 700-1000 ms, longer than this.
const TTL_MS: u64 = 500;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Locked,
    Naive,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Locked => "locked",
            Mode::Naive => "naive",
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Load {
    orders: u64,
    requests: u64,
    instances: u64,
}

impl Load {
    /// The requests instance `instance` receives, as (order, request number).
    fn share(self, instance: u64) -> impl Iterator<Item = (u64, u64)> {
        (0..self.orders)
            .flat_map(move |order| (0..self.requests).map(move |request| (order, request)))
            .filter(move |(order, request)| (order + request) % self.instances == instance)
    }
}

/// A fixed pseudo-random number per (order, request): the same load for both handlers.
fn noise(order: u64, request: u64) -> u64 {
    let mut x = order.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ request.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 29)
}

/// When a request arrives after the start: orders are 40 ms apart; an order's requests come
/// as a click, a double click 30 ms later, then a retry each time the client's 600 ms timeout
/// runs out (sent whatever happened, as a load balancer re-sending does).
fn arrival(order: u64, request: u64) -> Duration {
    let retry = match request {
        0 => 0,
        1 => 30,
        n => 600 * (n - 1),
    };
    Duration::from_millis(order * 40 + retry + noise(order, request) % 60)
}

/// How long the payment gateway takes for this request.
fn gateway_latency(order: u64, request: u64) -> Duration {
    let n = noise(order, request);
    if n.is_multiple_of(7) {
        Duration::from_millis(700 + n % 300) // a slow bank
    } else {
        Duration::from_millis(20 + n % 100)
    }
}

/// The payments ledger and the naive handler's hand-made lock: in Redis when the instances are
/// processes, in this process when they are tasks.
#[derive(Clone)]
enum Store {
    Redis {
        conn: redis::aio::MultiplexedConnection,
        ns: String,
    },
    Memory(Arc<Mutex<MemoryStore>>),
}

#[derive(Default)]
struct MemoryStore {
    paid: HashSet<u64>,
    charges: Vec<String>,
    stats: HashMap<String, u64>,
    naive_locks: HashMap<String, Instant>,
}

impl MemoryStore {
    fn live_lock(&mut self, key: &str) -> bool {
        match self.naive_locks.get(key) {
            Some(expiry) if *expiry > Instant::now() => true,
            Some(_) => {
                self.naive_locks.remove(key);
                false
            }
            None => false,
        }
    }
}

fn memory(store: &Mutex<MemoryStore>) -> std::sync::MutexGuard<'_, MemoryStore> {
    store.lock().unwrap_or_else(|e| e.into_inner())
}

impl Store {
    async fn is_paid(&self, order: u64) -> anyhow::Result<bool> {
        Ok(match self {
            Store::Redis { conn, ns } => conn.clone().sismember(format!("{ns}:paid"), order).await?,
            Store::Memory(m) => memory(m).paid.contains(&order),
        })
    }

    /// Records a charge (with the fencing token that authorised it, if any) and marks the order paid.
    async fn record_charge(&self, order: u64, instance: u64, token: Option<u64>) -> anyhow::Result<()> {
        let entry = format!(
            "{order} {instance} {}",
            token.map_or("-".to_owned(), |t| t.to_string())
        );
        match self {
            Store::Redis { conn, ns } => {
                let mut conn = conn.clone();
                let _: () = redis::pipe()
                    .rpush(format!("{ns}:charges"), entry)
                    .sadd(format!("{ns}:paid"), order)
                    .query_async(&mut conn)
                    .await?;
            }
            Store::Memory(m) => {
                let mut m = memory(m);
                m.charges.push(entry);
                m.paid.insert(order);
            }
        }
        Ok(())
    }

    async fn count(&self, what: &str) -> anyhow::Result<()> {
        match self {
            Store::Redis { conn, ns } => {
                let _: i64 = conn.clone().hincr(format!("{ns}:stats"), what, 1).await?;
            }
            Store::Memory(m) => *memory(m).stats.entry(what.to_owned()).or_default() += 1,
        }
        Ok(())
    }

    async fn handled(&self) -> anyhow::Result<u64> {
        Ok(match self {
            Store::Redis { conn, ns } => {
                let n: Option<u64> = conn.clone().hget(format!("{ns}:stats"), "handled").await?;
                n.unwrap_or(0)
            }
            Store::Memory(m) => memory(m).stats.get("handled").copied().unwrap_or(0),
        })
    }

    /// The naive lock, step 1: `SET key 1 NX`.
    async fn set_nx(&self, key: &str) -> anyhow::Result<bool> {
        Ok(match self {
            Store::Redis { conn, ns } => conn.clone().set_nx(format!("{ns}:{key}"), 1).await?,
            Store::Memory(m) => {
                let mut m = memory(m);
                if m.live_lock(key) {
                    false
                } else {
                    // No expiry yet: a crash before step 2 would leave it forever.
                    m.naive_locks
                        .insert(key.to_owned(), Instant::now() + Duration::from_secs(3600 * 24));
                    true
                }
            }
        })
    }

    /// The naive lock, step 2: `EXPIRE`, as a separate command.
    async fn expire(&self, key: &str, ttl_ms: u64) -> anyhow::Result<()> {
        match self {
            Store::Redis { conn, ns } => {
                let _: bool = conn.clone().pexpire(format!("{ns}:{key}"), ttl_ms as i64).await?;
            }
            Store::Memory(m) => {
                if let Some(expiry) = memory(m).naive_locks.get_mut(key) {
                    *expiry = Instant::now() + Duration::from_millis(ttl_ms);
                }
            }
        }
        Ok(())
    }

    /// The naive unlock: a bare `DEL`, whoever holds the key now.
    async fn del(&self, key: &str) -> anyhow::Result<()> {
        match self {
            Store::Redis { conn, ns } => {
                let _: i64 = conn.clone().del(format!("{ns}:{key}")).await?;
            }
            Store::Memory(m) => {
                memory(m).naive_locks.remove(key);
            }
        }
        Ok(())
    }

    async fn report(&self) -> anyhow::Result<Report> {
        let (charges, stats): (Vec<String>, HashMap<String, u64>) = match self {
            Store::Redis { conn, ns } => {
                let mut conn = conn.clone();
                (
                    conn.lrange(format!("{ns}:charges"), 0, -1).await?,
                    conn.hgetall(format!("{ns}:stats")).await?,
                )
            }
            Store::Memory(m) => {
                let m = memory(m);
                (m.charges.clone(), m.stats.clone())
            }
        };
        let mut by_order: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for charge in &charges {
            let mut parts = charge.split(' ');
            let order: u64 = parts.next().unwrap_or_default().parse().unwrap_or_default();
            let instance = parts.next().unwrap_or_default();
            let token = parts.next().unwrap_or_default();
            by_order.entry(order).or_default().push(if token == "-" {
                format!("instance {instance}")
            } else {
                format!("instance {instance}, token {token}")
            });
        }
        let stat = |name: &str| stats.get(name).copied().unwrap_or(0);
        let first = by_order
            .iter()
            .next()
            .map(|(order, charges)| format!("order {order} charged once ({})", charges.join("; ")));
        Ok(Report {
            charges: charges.len() as u64,
            orders_charged: by_order.len() as u64,
            busy: stat("busy"),
            already_paid: stat("already_paid"),
            errors: stat("error"),
            lost: stat("lost"),
            doubles: by_order.into_iter().filter(|(_, c)| c.len() > 1).collect(),
            first,
        })
    }

    /// Deletes this run's keys: ledger, stats, the naive locks and the fencing counters (and,
    /// with the locks in PostgreSQL, their rows).
    async fn clean_up(&self, url: &str) -> anyhow::Result<()> {
        if let Store::Redis { ns, .. } = self {
            delete_keys_under(url, &format!("{ns}:")).await?;
            if let Some(database) = lock_database() {
                let pool = sqlx::PgPool::connect(&database).await?;
                sqlx::query("DELETE FROM lock_runtime_locks WHERE starts_with(key, $1)")
                    .bind(format!("{ns}:"))
                    .execute(&pool)
                    .await?;
            }
        }
        Ok(())
    }
}

struct Report {
    charges: u64,
    orders_charged: u64,
    busy: u64,
    already_paid: u64,
    errors: u64,
    /// Calls stopped because their lock lapsed while they ran.
    lost: u64,
    doubles: BTreeMap<u64, Vec<String>>,
    /// How the first order's charge was recorded.
    first: Option<String>,
}

impl Report {
    fn double_charges(&self) -> u64 {
        self.charges - self.orders_charged
    }
}

/// One service instance.
struct Instance {
    id: u64,
    locks: LockClient,
    store: Store,
}

enum Outcome {
    Charged,
    AlreadyPaid,
    Busy,
}

impl Instance {
    /// The payment gateway: slow now and then.
    async fn gateway(&self, order: u64, request: u64) {
        tokio::time::sleep(gateway_latency(order, request)).await;
    }
}

/// The correct handler: one line of attribute.
#[distributed_lock(key = "order:<order_id>", ttl_ms = 500, watchdog, fencing, client = instance.locks)]
async fn charge_locked(instance: &Instance, order_id: u64, request: u64) -> anyhow::Result<Outcome> {
    if instance.store.is_paid(order_id).await? {
        return Ok(Outcome::AlreadyPaid);
    }
    instance.gateway(order_id, request).await;
    let token = lock_runtime::current().and_then(|lock| lock.fencing_token());
    instance.store.record_charge(order_id, instance.id, token).await?;
    Ok(Outcome::Charged)
}

/// The classic broken handler: `SET NX`, then `EXPIRE`, then a bare `DEL`.
async fn charge_naive(instance: &Instance, order_id: u64, request: u64) -> anyhow::Result<Outcome> {
    let key = format!("naive:order:{order_id}");
    if !instance.store.set_nx(&key).await? {
        return Ok(Outcome::Busy);
    }
    instance.store.expire(&key, TTL_MS).await?; // a crash just before this leaves the lock forever
    let outcome = if instance.store.is_paid(order_id).await? {
        Outcome::AlreadyPaid
    } else {
        instance.gateway(order_id, request).await; // may outlast the ttl: the lock is gone meanwhile
        instance.store.record_charge(order_id, instance.id, None).await?;
        Outcome::Charged
    };
    instance.store.del(&key).await?; // deletes whoever holds it now
    Ok(outcome)
}

/// Serves this instance's share of the load, each request at its arrival time.
async fn serve(instance: Arc<Instance>, mode: Mode, load: Load, start: Instant) -> anyhow::Result<()> {
    let mut requests = Vec::new();
    for (order, request) in load.share(instance.id) {
        let instance = Arc::clone(&instance);
        requests.push(tokio::spawn(async move {
            tokio::time::sleep_until(start + arrival(order, request)).await;
            let outcome = match mode {
                Mode::Locked => charge_locked(&instance, order, request).await,
                Mode::Naive => charge_naive(&instance, order, request).await,
            };
            let counted = match outcome {
                Ok(Outcome::Charged) => "charged",
                Ok(Outcome::AlreadyPaid) => "already_paid",
                Ok(Outcome::Busy) => "busy",
                Err(e) if matches!(e.downcast_ref(), Some(LockError::Busy { .. })) => "busy",
                // The lock lapsed while the call ran (the machine or the store stalled for most
                // of a ttl): the watchdog stopped the handler, so this request charged nothing
                // under a lock it no longer held. A retry of the order charges it.
                Err(e) if matches!(e.downcast_ref(), Some(LockError::Lost { .. })) => {
                    eprintln!(
                        "instance {}: order {order}: {e:#}; the handler was stopped",
                        instance.id
                    );
                    "lost"
                }
                Err(e) => {
                    eprintln!("instance {}: order {order}: {e:#}", instance.id);
                    "error"
                }
            };
            instance.store.count(counted).await?;
            instance.store.count("handled").await
        }));
    }
    for request in requests {
        request.await??;
    }
    Ok(())
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// With `LOCKS=postgres`, the PostgreSQL database at `DATABASE_URL` the locked handler's locks
/// live in (the library's PostgreSQL store; the ledger stays in Redis).
fn lock_database() -> Option<String> {
    std::env::var("LOCKS")
        .is_ok_and(|v| v == "postgres")
        .then(|| std::env::var("DATABASE_URL").ok())
        .flatten()
}

/// A child process: one instance against Redis.
async fn run_child(flags: &Flags, load: Load) -> anyhow::Result<()> {
    let url = flags.text("url").context("--url")?;
    let ns = flags.text("ns").context("--ns")?.to_owned();
    let mode = if flags.text("mode") == Some("naive") {
        Mode::Naive
    } else {
        Mode::Locked
    };
    let id = flags.number("instance", 0);
    let start_at = flags.number("start-at", 0);
    let builder = match lock_database() {
        Some(database) => LockClient::builder().postgres(&database),
        None => LockClient::builder().url(url),
    };
    let locks = builder.prefix(&format!("{ns}:lock:")).build().await?;
    let conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let start = Instant::now() + Duration::from_millis(start_at.saturating_sub(unix_ms()));
    let instance = Arc::new(Instance {
        id,
        locks,
        store: Store::Redis { conn, ns },
    });
    serve(instance, mode, load, start).await
}

/// Runs the load through one handler, on processes (Redis) or tasks (in memory), showing progress.
async fn run_mode(mode: Mode, load: Load, url: &str, redis: bool) -> anyhow::Result<Report> {
    let total = load.orders * load.requests;
    let (store, work): (Store, tokio::task::JoinHandle<anyhow::Result<()>>) = if redis {
        let ns = format!(
            "payment-dedup:{}:{}:{}",
            std::process::id(),
            unix_ms(),
            mode.name()
        );
        let conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        let start_at = unix_ms() + 300; // time for the processes to start and connect
        let exe = std::env::current_exe()?;
        let mut children = Vec::new();
        for id in 0..load.instances {
            let child = tokio::process::Command::new(&exe)
                .args(["--child", "--mode", mode.name(), "--url", url, "--ns", &ns])
                .args(["--instance", &id.to_string(), "--start-at", &start_at.to_string()])
                .args([
                    "--orders",
                    &load.orders.to_string(),
                    "--requests",
                    &load.requests.to_string(),
                ])
                .args(["--instances", &load.instances.to_string()])
                .stdin(Stdio::null())
                .spawn()
                .context("starting an instance process")?;
            children.push(child);
        }
        let work = tokio::spawn(async move {
            for mut child in children {
                let status = child.wait().await?;
                anyhow::ensure!(status.success(), "an instance process failed: {status}");
            }
            Ok(())
        });
        (Store::Redis { conn, ns }, work)
    } else {
        let store = Store::Memory(Arc::default());
        let locks = LockClient::in_memory();
        let start = Instant::now();
        let instances: Vec<_> = (0..load.instances)
            .map(|id| {
                let instance = Arc::new(Instance {
                    id,
                    locks: locks.clone(),
                    store: store.clone(),
                });
                tokio::spawn(serve(instance, mode, load, start))
            })
            .collect();
        let work = tokio::spawn(async move {
            for instance in instances {
                instance.await??;
            }
            Ok(())
        });
        (store, work)
    };
    let label = match mode {
        Mode::Locked => "#[distributed_lock]   ",
        Mode::Naive => "naive SET NX / DEL    ",
    };
    let report = async {
        let mut ticker = tokio::time::interval(Duration::from_millis(500));
        while !work.is_finished() {
            ticker.tick().await;
            let handled = store.handled().await?;
            println!("  {label} {handled:>4}/{total} requests handled");
        }
        work.await??;
        store.report().await
    }
    .await;
    // Also when the run failed: the keys are this run's alone.
    store.clean_up(url).await?;
    report
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::from_env(USAGE);
    let load = Load {
        orders: flags.number("orders", 40).max(1),
        requests: flags.number("requests", 4).max(1),
        instances: flags.number("instances", 4).max(1),
    };
    if flags.text("mode").is_some() && std::env::args().any(|a| a == "--child") {
        return run_child(&flags, load).await;
    }

    let url = redis_url();
    let redis = try_redis(&url, "lock:").await.is_some();
    let where_ = match (redis, lock_database()) {
        (true, Some(_)) => format!("separate processes on {url}; locks in PostgreSQL, LOCKS=postgres"),
        (true, None) => format!("separate processes on {url}"),
        (false, _) => "tasks, in-memory backend".to_owned(),
    };
    println!(
        "{} orders x {} requests, {} instances ({where_})",
        load.orders, load.requests, load.instances
    );
    println!("gateway: 20-120 ms, one call in seven 700-1000 ms (a slow bank); lock ttl {TTL_MS} ms\n");

    let locked = run_mode(Mode::Locked, load, &url, redis).await?;
    let naive = run_mode(Mode::Naive, load, &url, redis).await?;

    let total = load.orders * load.requests;
    println!("\n                       #[distributed_lock]   naive SET NX+EXPIRE / DEL");
    let row = |name: &str, a: u64, b: u64| println!("{name:<24}{a:>18}{b:>28}");
    row("orders", load.orders, load.orders);
    row("requests", total, total);
    row("charges made", locked.charges, naive.charges);
    row("rejected as busy", locked.busy, naive.busy);
    row("seen already paid", locked.already_paid, naive.already_paid);
    row("errors", locked.errors, naive.errors);
    row("stopped, lock lost", locked.lost, naive.lost);
    row("DOUBLE CHARGES", locked.double_charges(), naive.double_charges());
    if let Some(first) = &locked.first {
        println!("  locked: {first}");
    }
    for (order, charges) in naive.doubles.iter().take(3) {
        println!(
            "  naive: order {order} charged {} times ({})",
            charges.len(),
            charges.join("; ")
        );
    }

    if locked.double_charges() > 0 || locked.errors > 0 {
        println!("\nFAIL: the locked handler charged an order twice or failed");
        std::process::exit(1);
    }
    println!(
        "\nok: the locked handler charged each of {} orders once; the naive one double-charged {}",
        locked.orders_charged,
        naive.doubles.len()
    );
    Ok(())
}
