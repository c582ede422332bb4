//! What the examples share: finding a lock backend, the command-line flags they take, and the
//! axum app of `axum_orders` (here so that a test can serve it on a loopback port).

use std::time::Duration;

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
