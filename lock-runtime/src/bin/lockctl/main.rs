//! `lockctl`: the operators' tool for the locks of `lock-runtime` (feature `cli`).
//!
//! ```text
//! lockctl list [PATTERN]         the locks held now, sorted by key
//! lockctl show KEY               everything about one key
//! lockctl release KEY --force    free a lock whoever holds it, and wake its waiters
//! lockctl watch [PATTERN]        acquisitions, releases, expiries and take-overs as they happen
//! ```
//!
//! Where the locks live, as the library's builder says it: `--url` takes every URL
//! `LockClient::connect` does and picks the store from its scheme (`redis://`, `rediss://`,
//! `postgres://`, `etcd://`; several `etcd://` URLs are one cluster's members); `--cluster`,
//! `--sentinel --master-name NAME` and `--redlock` make the `--url` values a Redis Cluster's seed
//! nodes, the sentinels of a primary, or RedLock's masters. Every command goes through
//! `lock_runtime::admin`, the same on every store: this binary only reads the command line and
//! prints.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use lock_runtime::admin::Admin;
use lock_runtime::{LockClient, LockClientBuilder};

mod error;
mod output;
mod release;
mod watch;

use error::Error;
use output::Out;

/// Inspect and manage the distributed locks of lock-runtime, on any store it speaks.
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
    /// Where the locks live.
    #[arg(
        long,
        help = "Where the locks live, as LockClient::connect takes it: redis://[user:password@]host:port[/db] \
                (rediss:// for TLS), postgres://user:password@host:5432/db or etcd://host:2379; with \
                --cluster the seed nodes, with --sentinel the sentinels, with --redlock the masters, \
                and several etcd:// URLs one cluster's members (repeat --url, or separate the URLs \
                with commas)",
        global = true,
        env = "LOCKCTL_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379",
        action = clap::ArgAction::Append
    )]
    url: Vec<String>,
    /// The URLs are seed nodes of a Redis Cluster (the library's `.cluster(urls)`).
    #[arg(
        long,
        global = true,
        conflicts_with_all = ["sentinel", "redlock"],
        help = "The --url values are seed nodes of a Redis Cluster (as the library's .cluster(urls))"
    )]
    cluster: bool,
    /// The URLs are Redis Sentinels; the locks live on the primary they name.
    #[arg(
        long,
        global = true,
        requires = "master_name",
        conflicts_with = "redlock",
        help = "The --url values are Redis Sentinels; the locks live on the primary they name for \
                --master-name (as the library's .sentinel(urls, master_name))"
    )]
    sentinel: bool,
    /// The name the sentinels monitor the primary under (`master_name` of `.sentinel`).
    #[arg(long, global = true, value_name = "NAME", requires = "sentinel")]
    master_name: Option<String>,
    /// The URLs are RedLock's independent masters (the library's `.redlock(urls)`).
    #[arg(
        long,
        global = true,
        help = "The --url values are RedLock's independent masters (as the library's .redlock(urls)): \
                a lock is shown held when a majority hold it"
    )]
    redlock: bool,
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
    /// Trust the CA certificate(s) in this PEM file for a rediss:// server.
    #[arg(long, global = true, value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
    /// Present this client certificate (PEM) to a rediss:// server; needs --tls-key.
    #[arg(long, global = true, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM); needs --tls-cert.
    #[arg(long, global = true, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
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
    let at = shown(&cli.global);
    let mut store = store_named(&cli.global);
    match run(cli, &mut store) {
        Ok(()) | Err(Error::Closed) => ExitCode::SUCCESS,
        Err(e) => {
            let code = e.exit_code();
            eprintln!("lockctl: {}", e.describe(store, &at));
            ExitCode::from(code)
        }
    }
}

/// Runs one command on a single-threaded runtime (a CLI makes one request at a time).
fn run(cli: Cli, store: &mut &'static str) -> Result<(), Error> {
    if let Command::Release {
        key, force: false, ..
    } = &cli.command
    {
        return Err(release::refusal(key));
    }
    let admin = Admin::new(client(&cli.global)?.build_lazy()?);
    *store = store_name(admin.store());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Failed(format!("cannot start the async runtime: {e}")))?;
    let mut out = Out::new(cli.global.json);
    runtime.block_on(async {
        match cli.command {
            Command::List { pattern } => {
                let views = admin.list(&pattern).await?;
                out.list(&pattern, &views)
            }
            Command::Show { key } => {
                let view = admin.show(&key).await?;
                out.show(&view)
            }
            Command::Release { key, yes, .. } => release::release(&admin, &key, yes, &mut out).await,
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
                watch::watch(&admin, &plan, &mut out).await
            }
        }
    })
}

/// The `--url` values: with `--cluster`, `--sentinel` or `--redlock`, or for etcd, each may list
/// several, separated by commas (a single server's URL is taken whole).
fn urls(global: &Global) -> Vec<String> {
    let several = global.cluster || global.sentinel || global.redlock || is_etcd(&global.url);
    if !several {
        return global.url.clone();
    }
    global
        .url
        .iter()
        .flat_map(|url| url.split(','))
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect()
}

fn is_etcd(urls: &[String]) -> bool {
    urls.first()
        .is_some_and(|url| url.get(..7).is_some_and(|s| s.eq_ignore_ascii_case("etcd://")))
}

/// A client builder for the store the options name.
fn client(global: &Global) -> Result<LockClientBuilder, Error> {
    if global.prefix.is_empty() {
        return Err(Error::Usage("--prefix must not be empty".to_owned()));
    }
    let urls = urls(global);
    let timeout = Duration::from_millis(global.timeout_ms);
    let builder = LockClient::builder()
        .prefix(&global.prefix)
        .connect_timeout(timeout)
        .response_timeout(timeout);
    let builder = if global.cluster {
        builder.cluster(&urls)
    } else if global.sentinel {
        let master_name = global.master_name.as_deref().unwrap_or_default();
        if master_name.is_empty() {
            return Err(Error::Usage("--master-name must not be empty".to_owned()));
        }
        builder.sentinel(&urls, master_name)
    } else if global.redlock {
        builder.redlock(&urls)
    } else if is_etcd(&urls) {
        // One etcd:// URL for every member.
        let members: Vec<&str> = urls.iter().map(|url| url.get(7..).unwrap_or_default()).collect();
        builder.store(&format!("etcd://{}", members.join(",")))
    } else {
        match urls.as_slice() {
            [url] => builder.store(url),
            [] => return Err(Error::Usage("--url is empty".to_owned())),
            _ => {
                return Err(Error::Usage(
                    "several --url values are the seed nodes of --cluster, the sentinels of \
                     --sentinel, RedLock's masters (--redlock), or an etcd cluster's members \
                     (etcd://…); one server takes one"
                        .to_owned(),
                ))
            }
        }
    };
    tls(builder, global)
}

/// The TLS material given, for a rediss:// server.
fn tls(mut builder: LockClientBuilder, global: &Global) -> Result<LockClientBuilder, Error> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| Error::Failed(format!("cannot read {}: {e}", path.display())))
    };
    if let Some(ca) = &global.tls_ca {
        builder = builder.tls_root_ca(&read(ca)?);
    }
    if let (Some(cert), Some(key)) = (&global.tls_cert, &global.tls_key) {
        builder = builder.tls_client_auth(&read(cert)?, &read(key)?);
    }
    Ok(builder)
}

/// The store the options name, as a message says it, before the client is made.
fn store_named(global: &Global) -> &'static str {
    let scheme = global
        .url
        .first()
        .and_then(|url| url.split_once("://"))
        .map_or("", |(scheme, _)| scheme)
        .to_ascii_lowercase();
    match scheme.as_str() {
        "postgres" | "postgresql" => "PostgreSQL",
        "etcd" => "etcd",
        _ => "Redis",
    }
}

/// The store, as a message says it.
fn store_name(store: &'static str) -> &'static str {
    match store {
        "redis" | "RedLock" => "Redis",
        other => other,
    }
}

/// Where the locks are, as an operator's messages show it: without credentials, and saying what
/// the URLs are.
fn shown(global: &Global) -> String {
    let urls: Vec<String> = urls(global).iter().map(|url| hide_credentials(url)).collect();
    let urls = urls.join(", ");
    if global.cluster {
        format!("{urls} (Redis Cluster seed nodes)")
    } else if global.sentinel {
        let name = global.master_name.as_deref().unwrap_or_default();
        format!("{urls} (the sentinels of {name})")
    } else if global.redlock {
        format!("{urls} (RedLock masters)")
    } else {
        urls
    }
}

/// `url` with its user and password replaced by `<credentials>`.
fn hide_credentials(url: &str) -> String {
    lock_runtime::admin::hide_credentials(url)
}
