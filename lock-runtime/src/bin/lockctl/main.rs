//! `lockctl`: the operators' tool for the locks of `lock-runtime` (feature `cli`).
//!
//! ```text
//! lockctl list [PATTERN]         the locks held now, sorted by key
//! lockctl show KEY               everything about one key
//! lockctl release KEY --force    delete a lock whoever holds it, and wake its waiters
//! lockctl watch [PATTERN]        acquisitions and releases as they happen
//! ```
//!
//! Where the locks live, as the library's builder says it: one server (`--url`, as `.url`), a
//! Redis Cluster (`--cluster`, the `--url` values its seed nodes, as `.cluster(urls)`), or the
//! primary that Redis Sentinels name (`--sentinel --master-name NAME`, the `--url` values the
//! sentinels, as `.sentinel(urls, master_name)`). On a Cluster, `list` and `watch` walk every
//! primary, one key's reads (and `force.lua`) go to the primary owning its slot, `release`
//! announces with `SPUBLISH` and `watch` hears releases by `SSUBSCRIBE` to the channel of each
//! lock it has seen held, as the library's waiters there do (see `target.rs`).
//!
//! With `--postgres URL` (the `postgres` feature) the same commands read the library's
//! PostgreSQL store instead (see `postgres.rs`), and with `--etcd ENDPOINTS` (the `etcd`
//! feature) its etcd store (see `etcd.rs`).
//!
//! It reads the data model the library writes (see the crate docs): the lock of key `k` at
//! `<prefix>{k}`, its fencing counter at `<prefix>{k}:fence`, fair waiters at
//! `<prefix>{k}:queue` and `<prefix>{k}:queue:kept`, waiting writers at `<prefix>{k}:writers`,
//! the waiting mark at `<prefix>{k}:waiting`, and releases announced on `<prefix>{k}:released`.
//! Every one of these keys carries an expiry: the lock its ttl, the counter an hour after its
//! last token, the others about a second after the last waiter stopped asking. It never writes,
//! except `release --force`, which deletes with one compare-and-delete script (`force.lua`) on the
//! connection it read with.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

// The library's connection type (a file shared with it).
#[path = "../../backend/conn.rs"]
mod conn;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod inspect;
mod output;
#[cfg(feature = "postgres")]
mod postgres;
// The library's own (a file shared with it, so both hide the same credentials).
#[path = "../../redact.rs"]
mod redact;
mod release;
mod target;
mod watch;

use error::Error;
use output::Out;
use target::Target;

/// Inspect and manage the distributed locks of lock-runtime on Redis (or PostgreSQL, with
/// `--postgres`, or etcd, with `--etcd`).
#[derive(Debug, Parser)]
#[command(name = "lockctl", version)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every command takes, before or after its name.
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
struct Global {
    /// The Redis server (`redis://[user:password@]host:port[/db]`, `rediss://…` for TLS); with
    /// `--cluster` or `--sentinel`, one of several (repeat it, or separate URLs with commas).
    #[arg(
        long,
        help = "The Redis server: redis://[user:password@]host:port[/db], or rediss://… for TLS; \
                with --cluster the seed nodes, with --sentinel the sentinels (repeat --url, or \
                separate the URLs with commas)",
        global = true,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379",
        action = clap::ArgAction::Append
    )]
    url: Vec<String>,
    /// The URLs are seed nodes of a Redis Cluster (the library's `.cluster(urls)`).
    #[arg(
        long,
        global = true,
        conflicts_with = "sentinel",
        help = "The --url values are seed nodes of a Redis Cluster (as the library's .cluster(urls)): \
                list and watch walk every primary, release announces with SPUBLISH"
    )]
    cluster: bool,
    /// The URLs are Redis Sentinels; the locks live on the primary they name.
    #[arg(
        long,
        global = true,
        requires = "master_name",
        help = "The --url values are Redis Sentinels; the locks live on the primary they name for \
                --master-name (as the library's .sentinel(urls, master_name))"
    )]
    sentinel: bool,
    /// The name the sentinels monitor the primary under (`master_name` of `.sentinel`).
    #[arg(long, global = true, value_name = "NAME", requires = "sentinel")]
    master_name: Option<String>,
    /// The locks are in this PostgreSQL database (the library's `.postgres(url)`; the
    /// `postgres` feature) instead of Redis.
    #[cfg(feature = "postgres")]
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "LOCKCTL_POSTGRES_URL",
        hide_env_values = true,
        conflicts_with_all = ["cluster", "sentinel"],
        help = "The locks are in this PostgreSQL database (postgres://user:password@host:5432/db, as \
                the library's .postgres(url)) instead of Redis"
    )]
    postgres: Option<String>,
    /// The locks are in this etcd cluster (the library's `.etcd(endpoints)`; the `etcd`
    /// feature) instead of Redis.
    #[cfg(feature = "etcd")]
    #[arg(
        long,
        global = true,
        value_name = "ENDPOINTS",
        env = "LOCKCTL_ETCD_ENDPOINTS",
        value_delimiter = ',',
        conflicts_with_all = ["cluster", "sentinel"],
        help = "The locks are in this etcd cluster (http://host:2379, repeat --etcd or separate the \
                members with commas, as the library's .etcd(endpoints)) instead of Redis"
    )]
    etcd: Vec<String>,
    /// The key prefix the services' lock clients use.
    #[arg(long, global = true, default_value = lock_runtime::DEFAULT_PREFIX)]
    prefix: String,
    /// Machine-readable output: a JSON array (list), an object (show, release), JSON lines (watch).
    #[arg(long, global = true)]
    json: bool,
    /// How long to wait for the connection and for each answer, in milliseconds.
    #[arg(long, global = true, value_name = "MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout_ms: u64,
    #[cfg(feature = "tls")]
    #[command(flatten)]
    tls: target::TlsArgs,
}

/// What to do.
#[derive(Debug, Subcommand)]
enum Command {
    /// List the locks held now, sorted by key: owner, remaining ttl, last fencing token, waiters.
    List {
        /// A glob over the locks' keys (`*`, `?`, `[abc]`), as in `order:*`.
        #[arg(default_value = "*")]
        pattern: String,
    },
    /// Everything about one key: holder(s), stored value, ttl, fencing counter, waiters.
    Show {
        /// The lock's key, as the service names it (without the prefix).
        key: String,
    },
    /// Delete a lock whoever holds it, and wake its waiters (needs --force).
    Release {
        /// The lock's key, as the service names it (without the prefix).
        key: String,
        /// Required: the holder is not told, and keeps running until its next renewal finds the
        /// lock gone (or its ttl ends), so it may overlap with the next holder.
        #[arg(long)]
        force: bool,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Print acquisitions, releases, expiries and hand-overs as they happen, until Ctrl-C.
    Watch {
        /// A glob over the locks' keys, as for `list`.
        #[arg(default_value = "*")]
        pattern: String,
        /// How often to look, in milliseconds (releases someone waited for are also reported as
        /// announced).
        #[arg(long, value_name = "MS", default_value_t = 200,
              value_parser = clap::value_parser!(u64).range(10..))]
        interval_ms: u64,
        /// Stop after this many milliseconds (default: until Ctrl-C or stdout closes).
        #[arg(long, value_name = "MS")]
        for_ms: Option<u64>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let shown_url = target::shown(&cli.global);
    match run(cli) {
        Ok(()) | Err(Error::Closed) => ExitCode::SUCCESS,
        Err(e) => {
            let code = e.exit_code();
            eprintln!("lockctl: {}", e.describe(&shown_url));
            ExitCode::from(code)
        }
    }
}

/// Runs one command on a single-threaded runtime (a CLI makes one request at a time).
fn run(cli: Cli) -> Result<(), Error> {
    if let Command::Release {
        key, force: false, ..
    } = &cli.command
    {
        return Err(release::refusal(key));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Failed(format!("cannot start the async runtime: {e}")))?;
    let mut out = Out::new(cli.global.json);
    #[cfg(feature = "postgres")]
    if let Some(url) = &cli.global.postgres {
        if cli.global.prefix.is_empty() {
            return Err(Error::Usage("--prefix must not be empty".to_owned()));
        }
        let timeout = Duration::from_millis(cli.global.timeout_ms);
        return runtime.block_on(postgres::run(
            cli.command,
            url,
            &cli.global.prefix,
            timeout,
            &mut out,
        ));
    }
    #[cfg(feature = "etcd")]
    if !cli.global.etcd.is_empty() {
        #[cfg(feature = "postgres")]
        if cli.global.postgres.is_some() {
            return Err(Error::Usage("give --etcd or --postgres, not both".to_owned()));
        }
        if cli.global.prefix.is_empty() {
            return Err(Error::Usage("--prefix must not be empty".to_owned()));
        }
        let timeout = Duration::from_millis(cli.global.timeout_ms);
        return runtime.block_on(etcd::run(
            cli.command,
            &cli.global.etcd,
            &cli.global.prefix,
            timeout,
            &mut out,
        ));
    }
    let target = Target::new(&cli.global)?;
    runtime.block_on(async {
        match cli.command {
            Command::List { pattern } => inspect::list(&target, &pattern, &mut out).await,
            Command::Show { key } => inspect::show(&target, &key, &mut out).await,
            Command::Release { key, yes, .. } => release::release(&target, &key, yes, &mut out).await,
            Command::Watch {
                pattern,
                interval_ms,
                for_ms,
            } => {
                let plan = watch::Plan {
                    pattern,
                    interval: Duration::from_millis(interval_ms),
                    stop_after: for_ms.map(Duration::from_millis),
                };
                watch::watch(&target, &plan, &mut out).await
            }
        }
    })
}
