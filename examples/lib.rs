//! What the examples share: finding a lock backend, a key prefix of their own per run (and the
//! clean-up of what they left under it), the command-line flags they take, and the axum app of
//! `axum_orders` (here so that a test can serve it on a loopback port).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::LockClient;

#[path = "axum_orders_app.rs"]
pub mod axum_orders;

/// `REDIS_URL`, or Redis on its default port.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// Connects to Redis at `url` if it answers within a second; `None` (after saying so in one
/// line) otherwise, so the example can fall back to the in-memory backend.
pub async fn try_redis(url: &str, prefix: &str) -> Option<LockClient> {
    let connected = LockClient::builder()
        .url(url)
        .prefix(prefix)
        .connect_timeout(Duration::from_secs(1))
        .build()
        .await;
    match connected {
        Ok(client) => Some(client),
        Err(e) => {
            println!("no Redis at {url} ({e}): running the instances as tasks on the in-memory backend");
            None
        }
    }
}

/// One client per instance, as separate services would have: on Redis at `url` under `prefix`,
/// or, when Redis does not answer, one in-memory client shared by every instance (one store in
/// this process). Whether they are on Redis.
pub async fn one_client_each(count: u64, url: &str, prefix: &str) -> (Vec<LockClient>, bool) {
    let mut clients = Vec::new();
    for _ in 0..count.max(1) {
        match try_redis(url, prefix).await {
            Some(client) => clients.push(client),
            None => return (vec![LockClient::in_memory(); count.max(1) as usize], false),
        }
    }
    (clients, true)
}

/// Waits for every task (also after one failed, so nothing runs on past a clean-up), and
/// answers the first failure.
pub async fn join_all<E>(tasks: Vec<tokio::task::JoinHandle<Result<(), E>>>) -> anyhow::Result<()>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let mut outcome: anyhow::Result<()> = Ok(());
    for task in tasks {
        let finished = match task.await {
            Ok(result) => result.map_err(anyhow::Error::from),
            Err(e) => Err(e.into()),
        };
        outcome = outcome.and(finished);
    }
    outcome
}

/// A lock prefix for one run of an example, `<name>:<pid>:<unix ms>:`, which no other run shares:
/// the run can then delete everything under it when it ends ([`delete_keys_under`]) without
/// touching another run's locks.
pub fn run_prefix(name: &str) -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{name}:{}:{ms}:", std::process::id())
}

/// Deletes every key under `prefix` from Redis at `url` (`SCAN MATCH`, then `DEL`) and returns
/// how many there were: what a run left behind, such as fencing counters (kept an hour after their last token) and
/// locks still inside their `hold_at_least`. Only for a prefix no one else uses, such as
/// [`run_prefix`]'s: a service keeps the fencing counters of the locks it shares, since the
/// counter is what keeps its tokens above those its storage has already accepted.
pub async fn delete_keys_under(url: &str, prefix: &str) -> redis::RedisResult<u64> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let pattern = format!("{}*", glob_escape(prefix));
    let mut cursor = 0u64;
    let mut deleted = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        if !keys.is_empty() {
            let n: u64 = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await?;
            deleted += n;
        }
        if next == 0 {
            return Ok(deleted);
        }
        cursor = next;
    }
}

/// `text` as a `SCAN MATCH` pattern that matches only itself.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Reads `--name value` flags into `u64`s, for the examples' few numeric options.
#[derive(Debug)]
pub struct Flags {
    args: Vec<String>,
}

impl Flags {
    /// The process's arguments; prints `usage` and exits on `--help`.
    pub fn from_env(usage: &str) -> Flags {
        let args: Vec<String> = std::env::args().skip(1).collect();
        if args.iter().any(|a| a == "--help" || a == "-h") {
            println!("{usage}");
            std::process::exit(0);
        }
        Flags { args }
    }

    /// The value after `--name`, if present.
    pub fn text(&self, name: &str) -> Option<&str> {
        let flag = format!("--{name}");
        self.args
            .iter()
            .position(|a| *a == flag)
            .and_then(|i| self.args.get(i + 1))
            .map(String::as_str)
    }

    /// The number after `--name`, or `default`; exits with a message when it is not a number.
    pub fn number(&self, name: &str, default: u64) -> u64 {
        match self.text(name) {
            None => default,
            Some(value) => value.parse().unwrap_or_else(|_| {
                eprintln!("--{name} takes a whole number, not `{value}`");
                std::process::exit(2);
            }),
        }
    }
}
