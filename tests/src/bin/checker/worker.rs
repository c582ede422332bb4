//! A worker: tasks that run critical sections on the keys until the time is up.

use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, LockClient, LockError, LockOptions};

use crate::deploy::Kind;
use crate::store::{Op, Store};
use crate::Fallible;

/// How a reader's section name ends (the log's check lets readers of one writer's token overlap).
pub const READER: &str = ".r";

/// How often a long body writes (polls the store) while it holds the lock.
const POLL: Duration = Duration::from_millis(100);

/// How a worker process reaches the lock store: `kind|url,url,…|master|replicas`.
pub fn spec(kind: &str, urls: &[String], master: &str, replicas: usize) -> String {
    format!("{kind}|{}|{master}|{replicas}", urls.join(","))
}

/// The client a [`spec`] names.
pub async fn client(spec: &str) -> Fallible<LockClient> {
    let mut parts = spec.split('|');
    let (Some(kind), Some(urls), Some(master), Some(replicas), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(format!("bad lock spec {spec:?}").into());
    };
    let urls: Vec<&str> = urls.split(',').collect();
    let replicas: usize = replicas.parse()?;
    let builder = LockClient::builder();
    let builder = match kind {
        "redis" => builder.url(urls[0]),
        "sentinel" => builder.sentinel(urls, master),
        "cluster" => builder.cluster(urls),
        "redlock" => builder.redlock(urls),
        "etcd" => builder.etcd(urls),
        "postgres" => builder.postgres(urls[0]),
        "mysql" => builder.mysql(urls[0]),
        "zookeeper" => builder.zookeeper(urls),
        other => return Err(format!("no lock store {other:?}").into()),
    };
    let builder = if replicas > 0 {
        builder.wait_for_replicas(replicas, Duration::from_millis(500))
    } else {
        builder
    };
    Ok(builder
        .connect_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_millis(500))
        .build()
        .await?)
}

/// Why a critical section did not complete.
#[derive(Debug)]
enum Failure {
    Lock(LockError),
    Store(redis::RedisError),
    /// A semaphore's holder was given a permit outside its count.
    Permit(u32),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Lock(e) => write!(f, "{e}"),
            Failure::Store(e) => write!(f, "store: {e}"),
            Failure::Permit(p) => write!(f, "permit {p} is outside the key's count"),
        }
    }
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

/// The lease every section takes.
pub const TTL: Duration = Duration::from_millis(3000);

/// What the sections lock: `keys` keys, each with `permits` permits (1: a lock; more: a
/// semaphore, whose every permit writes to a resource of its own in the fenced store:
/// [`Load::resource`]).
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub keys: u64,
    pub permits: u32,
    /// Each section a transfer between two of the keys' accounts under one set lock
    /// (`run_all`, the attribute's `keys = [...]`) instead of a counter's increment.
    pub sets: bool,
    /// Every lock fair (a fair semaphore, fair sets with `permits`, `sets`).
    pub fair: bool,
    /// Half the sections readers (`LockMode::Shared`): each enters and polls with its token,
    /// the last writer's, and writes nothing else; the others writers, as without it.
    pub shared: bool,
}

impl Load {
    /// How a worker is told the load's kind: `locks` or `sets`, then `,fair` and `,shared`.
    pub fn sections(&self) -> String {
        let mut kind = if self.sets { "sets" } else { "locks" }.to_owned();
        if self.fair {
            kind.push_str(",fair");
        }
        if self.shared {
            kind.push_str(",shared");
        }
        kind
    }

    /// The fenced store's resource that permit `permit` of key `k` writes to: `k` for permit 0
    /// (a lock's own), then one per further permit.
    pub fn resource(&self, k: u64, permit: u32) -> u64 {
        k + self.keys * u64::from(permit)
    }
}

/// The options of every section: the lease renewed by the watchdog, up to 3 s of waiting, and a
/// fencing token where the store gives one (RedLock gives none: there every write carries token
/// 0, and the store accepts them all, stale or not); with more than one permit, a semaphore.
fn options(fencing: bool, load: Load) -> LockOptions {
    LockOptions::new(TTL)
        .watchdog(true)
        .wait(Duration::from_millis(3000))
        .fencing(fencing)
        .permits(load.permits)
        .fair(load.fair)
}

/// A reader's section (the `--shared` load): enters with its token (the last writer's), holds
/// the shared lock for `hold` writing every [`POLL`], and changes nothing.
#[distributed_lock(key = "chk:<k>", options = options, client = locks)]
async fn reading(
    locks: &LockClient,
    options: &LockOptions,
    store: &Store,
    k: u64,
    section: &str,
    hold: Duration,
) -> Result<bool, Failure> {
    let token = lock_runtime::current()
        .and_then(|l| l.fencing_token())
        .unwrap_or(0);
    if !store.write(k, token, section, Op::Enter).await? {
        return Ok(false);
    }
    hold_writing(store, &[(k, token)], section, hold).await
}

/// One critical section: a read-modify-write of key `k`'s counter (of its permit's resource)
/// under its lock.
#[distributed_lock(key = "chk:<k>", options = options, client = locks)]
async fn critical(
    locks: &LockClient,
    options: &LockOptions,
    (store, load): (&Store, Load),
    k: u64,
    section: &str,
    hold: Duration,
) -> Result<bool, Failure> {
    let permit = lock_runtime::current().and_then(|l| l.permit()).unwrap_or(0);
    if permit >= load.permits {
        return Err(Failure::Permit(permit));
    }
    body(store, load.resource(k, permit), section, hold).await
}

/// One transfer: `amount` moves from account `from` to account `to` under a set lock on both.
#[distributed_lock(keys = ["chk:<from>", "chk:<to>"], options = options, client = locks)]
async fn transfer(
    locks: &LockClient,
    options: &LockOptions,
    store: &Store,
    (from, to): (u64, u64),
    section: &str,
    (hold, amount): (Duration, i64),
) -> Result<bool, Failure> {
    let info = lock_runtime::current();
    let token = |k: u64| {
        info.as_ref()
            .and_then(|l| l.fencing_token_for(&format!("chk:{k}")))
            .unwrap_or(0)
    };
    let (from_token, to_token) = (token(from), token(to));
    let accounts = [(from, from_token), (to, to_token)];
    if !write_each(store, &accounts, section, Op::Enter).await? {
        return Ok(false);
    }
    let (from_read, to_read) = (store.balance(from).await?, store.balance(to).await?);
    if !hold_writing(store, &accounts, section, hold).await? {
        return Ok(false);
    }
    Ok(store
        .transfer(
            (from, from_token, from_read),
            (to, to_token, to_read),
            section,
            amount,
        )
        .await?)
}

/// A critical section's body: enters, reads the counter, holds the lock for `hold` (writing
/// every [`POLL`] meanwhile) and writes the counter plus one. A body whose write the store
/// refuses stops, as a user's would.
async fn body(store: &Store, k: u64, section: &str, hold: Duration) -> Result<bool, Failure> {
    let token = lock_runtime::current()
        .and_then(|l| l.fencing_token())
        .unwrap_or(0);
    if !store.write(k, token, section, Op::Enter).await? {
        return Ok(false);
    }
    let value = store.value(k).await?;
    if !hold_writing(store, &[(k, token)], section, hold).await? {
        return Ok(false);
    }
    Ok(store.write(k, token, section, Op::Set(value + 1)).await?)
}

/// `op` written to each `(resource, token)` in turn; whether the store accepted every one (it
/// stops at the first it refuses).
async fn write_each(store: &Store, each: &[(u64, u64)], section: &str, op: Op) -> Result<bool, Failure> {
    for &(k, token) in each {
        if !store.write(k, token, section, op).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Holds the lock for `hold`, writing a poll to each `(resource, token)` every [`POLL`];
/// whether the store accepted every write.
async fn hold_writing(
    store: &Store,
    each: &[(u64, u64)],
    section: &str,
    hold: Duration,
) -> Result<bool, Failure> {
    let until = Instant::now() + hold;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(true);
        }
        tokio::time::sleep(left.min(POLL)).await;
        if !write_each(store, each, section, Op::Poll).await? {
            return Ok(false);
        }
    }
}

/// What a worker's critical sections came to.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub attempts: u64,
    pub completed: u64,
    pub refused: u64,
    pub busy: u64,
    pub lost: u64,
    pub unavailable: u64,
    pub not_replicated: u64,
    pub other: u64,
}

const FIELDS: [&str; 8] = [
    "attempts",
    "completed",
    "refused",
    "busy",
    "lost",
    "unavailable",
    "not_replicated",
    "other",
];

impl Tally {
    fn values(&self) -> [u64; 8] {
        [
            self.attempts,
            self.completed,
            self.refused,
            self.busy,
            self.lost,
            self.unavailable,
            self.not_replicated,
            self.other,
        ]
    }

    pub fn add(&mut self, o: &Tally) {
        self.attempts += o.attempts;
        self.completed += o.completed;
        self.refused += o.refused;
        self.busy += o.busy;
        self.lost += o.lost;
        self.unavailable += o.unavailable;
        self.not_replicated += o.not_replicated;
        self.other += o.other;
    }

    /// The tally as JSON members, by name.
    pub fn json(self) -> serde_json::Map<String, serde_json::Value> {
        FIELDS
            .iter()
            .zip(self.values())
            .map(|(k, v)| ((*k).to_owned(), v.into()))
            .collect()
    }

    /// A tally from [`json`](Self::json)'s members (extra members are ignored).
    pub fn from_json(json: &serde_json::Value) -> Option<Tally> {
        let get = |name: &str| json.get(name).and_then(serde_json::Value::as_u64);
        Some(Tally {
            attempts: get("attempts")?,
            completed: get("completed")?,
            refused: get("refused")?,
            busy: get("busy")?,
            lost: get("lost")?,
            unavailable: get("unavailable")?,
            not_replicated: get("not_replicated")?,
            other: get("other")?,
        })
    }
}

/// Runs `tasks` tasks on `locks` until `deadline`: each picks a key and a hold at random and
/// runs a critical section. Most holds are short (5–50 ms); one in five is long (2–5 s,
/// longer than a failover takes), so that a lock a store loses is often still in use.
pub async fn run(
    locks: LockClient,
    fencing: bool,
    store_url: &str,
    id: &str,
    tasks: u64,
    load: Load,
    deadline: Instant,
) -> Fallible<Tally> {
    let store = Store::connect(store_url).await?;
    let options = options(fencing, load);
    let reads = options.clone().mode(lock_runtime::LockMode::Shared);
    let keys = load.keys;
    let mut running = Vec::new();
    for task in 0..tasks {
        let (locks, store, options, reads) = (locks.clone(), store.clone(), options.clone(), reads.clone());
        let writer = format!("w{id}.{task}");
        let mut dice = 0x9e37_79b9_7f4a_7c15_u64 ^ (u64::from(std::process::id()) << 16) ^ (task << 8);
        for b in id.bytes() {
            dice = dice.rotate_left(5) ^ u64::from(b);
        }
        running.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            while Instant::now() < deadline {
                dice ^= dice << 13;
                dice ^= dice >> 7;
                dice ^= dice << 17;
                let k = dice % keys;
                let hold = if (dice >> 20).is_multiple_of(5) {
                    Duration::from_millis(2000 + (dice >> 24) % 3000)
                } else {
                    Duration::from_millis(5 + (dice >> 24) % 45)
                };
                // No hold past the end of the run (an acquire begun just before it may still
                // wait up to `wait_ms`).
                let hold = hold.min(deadline.saturating_duration_since(Instant::now()));
                tally.attempts += 1;
                let mut section = format!("{writer}.{}", tally.attempts);
                // Half the sections of the `--shared` load read, from another bit of the draw.
                let reader = load.shared && (dice >> 56).is_multiple_of(2);
                if reader {
                    section.push_str(READER);
                }
                let outcome = if reader {
                    reading(&locks, &reads, &store, k, &section, hold).await
                } else if load.sets {
                    // Another account than `k`, and an amount, from the same draw.
                    let other = (k + 1 + (dice >> 40) % (keys - 1)) % keys;
                    let amount = 1 + ((dice >> 48) % 100) as i64;
                    transfer(&locks, &options, &store, (k, other), &section, (hold, amount)).await
                } else {
                    critical(&locks, &options, (&store, load), k, &section, hold).await
                };
                match outcome {
                    Ok(true) => tally.completed += 1,
                    Ok(false) => tally.refused += 1,
                    Err(Failure::Lock(LockError::Busy { .. })) => tally.busy += 1,
                    Err(Failure::Lock(LockError::Lost { .. })) => tally.lost += 1,
                    Err(Failure::Lock(LockError::NotReplicated { .. })) => {
                        tally.not_replicated += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(Failure::Lock(LockError::Unavailable { .. })) => {
                        tally.unavailable += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(e) => {
                        if tally.other == 0 {
                            eprintln!("checker worker {writer}: {e} (further errors counted, not shown)");
                        }
                        tally.other += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
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
    Ok(total)
}

/// `worker <spec> <store-url> <id> <tasks> <keys> <millis> <permits> <locks|sets>[,fair][,shared]`:
/// a worker process. Prints its tally.
pub async fn main(args: &[String]) -> Fallible<()> {
    let [spec, store_url, id, tasks, keys, millis, permits, sections] = args else {
        return Err(
            "usage: checker worker <spec> <store-url> <id> <tasks> <keys> <millis> <permits> <locks|sets>[,fair][,shared]"
                .into(),
        );
    };
    let deadline = Instant::now() + Duration::from_millis(millis.parse()?);
    let (tasks, keys): (u64, u64) = (tasks.parse()?, keys.parse()?);
    let kinds: Vec<&str> = sections.split(',').collect();
    let sets = kinds.contains(&"sets");
    if keys < 1 + u64::from(sets) {
        return Err("a worker needs at least one key (two for transfers)".into());
    }
    let load = Load {
        keys,
        permits: permits.parse()?,
        sets,
        fair: kinds.contains(&"fair"),
        shared: kinds.contains(&"shared"),
    };
    let locks = client(spec).await?;
    let fencing = Kind::parse(spec.split('|').next().unwrap_or_default())?.fences();
    let tally = run(locks, fencing, store_url, id, tasks, load, deadline).await?;
    println!("tally {}", serde_json::Value::Object(tally.json()));
    Ok(())
}
