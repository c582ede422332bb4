//! Why fencing tokens: a lock holder can be paused (a GC pause, a swapped-out VM, a slow disk)
//! past its ttl without knowing. Meanwhile its lock expires and another holder takes it and
//! writes. When the first one wakes up, it carries on and writes too: no lock can prevent that
//! late write, but storage that remembers the highest fencing token it accepted can refuse it.
//! This prints that story as a timeline.
//!
//! The storage is PostgreSQL when `DATABASE_URL` reaches a server: a table of accounts (this
//! run's own, `fenced_storage_accounts_<pid>_<ms>`, dropped at the end) with a `fence` column next
//! to the data, and every write is one statement that checks the token in its `WHERE` clause, so
//! that no other write can come between the check and the write:
//!
//! ```sql
//! UPDATE <table> SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2
//! ```
//!
//! No row updated means a holder with a newer token has written since: the write is refused.
//! Without `DATABASE_URL`, or when the server there does not answer or refuses, the example says
//! so in one line and uses a store in this process that applies the same rule.
//!
//! ```text
//! DATABASE_URL=postgres://user:password@localhost:5432/db cargo run --example fenced_storage
//! cargo run --example fenced_storage
//! ```
//!
//! Locks are in Redis at `REDIS_URL` (default `redis://127.0.0.1:6379`), else in the in-memory
//! backend; with `LOCKS=postgres` (and PostgreSQL at `DATABASE_URL`), in that database, through
//! the library's PostgreSQL store. The run's locks (keys, counter, rows) are deleted at the end.

use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use lock_examples::{delete_keys_under, redis_url, run_prefix, try_redis, Flags};
use lock_runtime::{distributed_lock, LockClient};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Connection, Row};
use tokio::time::Instant;

const USAGE: &str = "fenced_storage: a paused lock holder's late write, refused by its fencing token

usage: [DATABASE_URL=postgres://user:password@host:5432/db [LOCKS=postgres]] cargo run --example fenced_storage

Storage: PostgreSQL at DATABASE_URL (a table of its own, dropped at the end), else a store in
this process. Locks: with LOCKS=postgres, in that database; else Redis at REDIS_URL (default
redis://127.0.0.1:6379), else the in-memory backend.";

/// The account both holders write.
const ACCOUNT: i64 = 7;

/// How long PostgreSQL has to answer a connection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The account's row: its balance, and the highest fencing token a write to it carried.
#[derive(Clone, Copy, Debug)]
struct Account {
    balance: i64,
    fence: i64,
}

/// What the storage said to a write.
#[derive(Clone, Copy, Debug)]
enum Write {
    Accepted,
    /// A write with a newer token came first; `fence` is that token.
    Rejected {
        fence: i64,
    },
}

/// Storage that accepts a write only with a token at least as high as any it has accepted. The
/// same token twice is the same holder writing again, not a stale one.
#[derive(Debug)]
enum Store {
    Postgres(Postgres),
    InProcess(Mutex<Account>),
}

/// Where the run's locks are.
#[derive(Clone, Copy, Debug)]
enum Locks {
    Redis,
    /// In the storage's own database (`LOCKS=postgres`): the library's PostgreSQL store.
    Postgres,
    InMemory,
}

/// The account in a table of this run's own.
#[derive(Debug)]
struct Postgres {
    pool: PgPool,
    table: String,
}

impl Store {
    /// PostgreSQL at `DATABASE_URL` with the account's table created, if that works; the
    /// in-process store otherwise. Says which in one line.
    async fn open() -> Store {
        let in_process = || {
            Store::InProcess(Mutex::new(Account {
                balance: 100,
                fence: 0,
            }))
        };
        let Ok(url) = std::env::var("DATABASE_URL") else {
            println!("store: in this process (DATABASE_URL is not set)");
            return in_process();
        };
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            println!("store: in this process (DATABASE_URL is not a postgres:// URL)");
            return in_process();
        }
        let options = match PgConnectOptions::from_str(&url) {
            Ok(options) => options,
            Err(e) => {
                println!("store: in this process (DATABASE_URL is not a PostgreSQL URL: {e})");
                return in_process();
            }
        };
        // Where, without the password the URL may carry.
        let server = format!(
            "{}:{}/{}",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or(options.get_username())
        );
        match Postgres::open(options).await {
            Ok(postgres) => {
                println!(
                    "store: PostgreSQL at {server}, table {} (the token is checked in the UPDATE's WHERE)",
                    postgres.table
                );
                Store::Postgres(postgres)
            }
            Err(e) => {
                println!(
                    "store: in this process (no PostgreSQL at {server}: {})",
                    one_line(&e)
                );
                in_process()
            }
        }
    }

    /// Why a write with `token` was refused, `fence` being the newer token that wrote first.
    fn rejection(&self, token: u64, fence: i64) -> String {
        match self {
            Store::Postgres(_) => {
                format!(
                    "write REJECTED by PostgreSQL: the UPDATE matched no row (fence {fence} > token {token})"
                )
            }
            Store::InProcess(_) => {
                format!("write REJECTED by the store: token {token} < {fence} already seen")
            }
        }
    }

    /// Sets the balance if `token` is at least the highest token a write has carried.
    async fn write(&self, token: u64, balance: i64) -> anyhow::Result<Write> {
        // Tokens count microseconds since 1970 (see acquire.lua): far below i64::MAX.
        let token = i64::try_from(token).context("a fencing token beyond BIGINT")?;
        match self {
            Store::Postgres(pg) => pg.write(token, balance).await,
            Store::InProcess(account) => {
                let mut account = account.lock().unwrap_or_else(|e| e.into_inner());
                if token < account.fence {
                    return Ok(Write::Rejected { fence: account.fence });
                }
                *account = Account {
                    balance,
                    fence: token,
                };
                Ok(Write::Accepted)
            }
        }
    }

    async fn read(&self) -> anyhow::Result<Account> {
        match self {
            Store::Postgres(pg) => pg.read().await,
            Store::InProcess(account) => Ok(*account.lock().unwrap_or_else(|e| e.into_inner())),
        }
    }

    /// Deletes the library's rows of this run's locks (a fenced lock's row keeps its last token
    /// for an hour).
    async fn delete_lock_rows(&self, prefix: &str) -> anyhow::Result<()> {
        if let Store::Postgres(pg) = self {
            sqlx::query("DELETE FROM lock_runtime_locks WHERE starts_with(key, $1)")
                .bind(prefix)
                .execute(&pg.pool)
                .await
                .context("deleting this run's lock rows")?;
        }
        Ok(())
    }

    /// Drops what `open` created, and says so.
    async fn close(self) -> anyhow::Result<()> {
        if let Store::Postgres(pg) = self {
            let table = pg.table.clone();
            pg.drop_table().await?;
            println!("dropped table {table}");
        }
        Ok(())
    }
}

impl Postgres {
    /// Connects, creates this run's table and its account row.
    async fn open(options: PgConnectOptions) -> anyhow::Result<Postgres> {
        // One attempt on a connection of its own first: a pool retries a refused connection until
        // its timeout, then says only that it timed out.
        let mut conn = tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options))
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {CONNECT_TIMEOUT:?}"))??;
        // A name no other run uses: runs at the same time (or a test and a developer) never
        // share rows, and the drop at the end removes only this run's.
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let table = format!("fenced_storage_accounts_{}_{ms}", std::process::id());
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (
                 id BIGINT PRIMARY KEY,
                 balance BIGINT NOT NULL,
                 fence BIGINT NOT NULL  -- the highest fencing token a write carried
             )"
        ))
        .execute(&mut conn)
        .await
        .context("creating the table")?;
        let seeded = sqlx::query(&format!(
            "INSERT INTO {table} (id, balance, fence) VALUES ($1, 100, 0) ON CONFLICT (id) DO NOTHING"
        ))
        .bind(ACCOUNT)
        .execute(&mut conn)
        .await;
        if let Err(e) = seeded {
            let _ = sqlx::query(&format!("DROP TABLE {table}"))
                .execute(&mut conn)
                .await;
            return Err(anyhow::Error::new(e).context("adding the account"));
        }
        let _ = conn.close().await;
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_lazy_with(options);
        Ok(Postgres { pool, table })
    }

    /// One statement: the token check and the write cannot be split by another writer.
    async fn write(&self, token: i64, balance: i64) -> anyhow::Result<Write> {
        let updated = sqlx::query(&format!(
            "UPDATE {} SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2",
            self.table
        ))
        .bind(balance)
        .bind(token)
        .bind(ACCOUNT)
        .execute(&self.pool)
        .await?;
        if updated.rows_affected() == 1 {
            return Ok(Write::Accepted);
        }
        // Which newer token won, for the message (the row exists: `open` added it).
        let fence = self.read().await?.fence;
        Ok(Write::Rejected { fence })
    }

    async fn read(&self) -> anyhow::Result<Account> {
        let row = sqlx::query(&format!(
            "SELECT balance, fence FROM {} WHERE id = $1",
            self.table
        ))
        .bind(ACCOUNT)
        .fetch_one(&self.pool)
        .await?;
        Ok(Account {
            balance: row.try_get("balance")?,
            fence: row.try_get("fence")?,
        })
    }

    async fn drop_table(self) -> anyhow::Result<()> {
        sqlx::query(&format!("DROP TABLE {}", self.table))
            .execute(&self.pool)
            .await
            .with_context(|| format!("dropping table {}", self.table))?;
        self.pool.close().await;
        Ok(())
    }
}

/// `e` and its causes on one line, each text once (sqlx repeats a database error's text in its
/// source).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

/// Prints what happens, with the time since the start.
struct Timeline {
    start: Instant,
}

impl Timeline {
    fn say(&self, who: &str, what: impl AsRef<str>) {
        println!(
            "{:>6} ms  {who}  {}",
            self.start.elapsed().as_millis(),
            what.as_ref()
        );
    }
}

fn token() -> u64 {
    lock_runtime::current()
        .and_then(|lock| lock.fencing_token())
        .unwrap_or(0)
}

/// Holder A: takes the lock for 300 ms, then is paused for 700 ms before it writes. It does not
/// watch its lock (`on_lost = "continue"`), as code in such a pause cannot. Returns whether its
/// late write got through.
#[distributed_lock(key = "account:7", ttl_ms = 300, fencing, on_lost = "continue", client = locks)]
async fn holder_a(locks: &LockClient, store: &Store, log: &Timeline) -> anyhow::Result<bool> {
    let token = token();
    log.say("A", format!("takes the lock (ttl 300 ms), fencing token {token}"));
    log.say("A", "is paused (a long GC pause) ...");
    tokio::time::sleep(Duration::from_millis(700)).await;
    log.say("A", format!("wakes up and writes balance=50 with token {token}"));
    Ok(match store.write(token, 50).await? {
        Write::Accepted => {
            log.say("A", "write ACCEPTED: the stale holder overwrote B's data");
            true
        }
        Write::Rejected { fence } => {
            log.say("A", store.rejection(token, fence));
            false
        }
    })
}

/// Holder B: waits for the lock, which it gets once A's lease runs out.
#[distributed_lock(key = "account:7", ttl_ms = 5000, fencing, wait_ms = 5000, client = locks)]
async fn holder_b(locks: &LockClient, store: &Store, log: &Timeline) -> anyhow::Result<()> {
    let token = token();
    log.say(
        "B",
        format!("takes the lock after A's lease expired, fencing token {token}"),
    );
    match store.write(token, 90).await? {
        Write::Accepted => log.say("B", format!("writes balance=90 with token {token}: accepted")),
        Write::Rejected { fence } => log.say("B", format!("write rejected: token {fence} came first")),
    }
    Ok(())
}

/// Runs A and B against `store`; whether A's stale write got through.
async fn story(a: &LockClient, b: &LockClient, store: &Store) -> anyhow::Result<bool> {
    let log = Timeline {
        start: Instant::now(),
    };
    let (a_accepted, b_done) = tokio::join!(holder_a(a, store, &log), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        log.say("B", "asks for the lock (waits up to 5 s)");
        holder_b(b, store, &log).await
    });
    b_done?;
    let a_accepted = a_accepted?;
    let account = store.read().await?;
    println!(
        "\nthe store holds balance={} (token {})",
        account.balance, account.fence
    );
    Ok(a_accepted)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Flags::from_env(USAGE);
    // This run's own lock keys, deleted at the end with the fencing counter.
    let prefix = run_prefix("fenced-storage-example");
    let url = redis_url();
    let store = Store::open().await;
    // Two clients, as two processes would have (in memory: one shared backend).
    let locks_in_database = std::env::var("LOCKS").is_ok_and(|v| v == "postgres");
    let (a, b, place) = match (&store, locks_in_database) {
        (Store::Postgres(_), true) => {
            let database = std::env::var("DATABASE_URL").context("DATABASE_URL")?;
            let client = || async {
                LockClient::builder()
                    .postgres(&database)
                    .prefix(&prefix)
                    .connect_timeout(CONNECT_TIMEOUT)
                    .build()
                    .await
                    .context("a lock client of PostgreSQL")
            };
            println!("locks: PostgreSQL, the same database (LOCKS=postgres)");
            (client().await?, client().await?, Locks::Postgres)
        }
        _ => match try_redis(&url, &prefix).await {
            Some(a) => {
                let b = LockClient::builder()
                    .url(&url)
                    .prefix(&prefix)
                    .connect_timeout(Duration::from_secs(1))
                    .build()
                    .await
                    .context("a second client of Redis")?;
                (a, b, Locks::Redis)
            }
            None => {
                let shared = LockClient::in_memory();
                (shared.clone(), shared, Locks::InMemory)
            }
        },
    };

    let outcome = story(&a, &b, &store).await;
    // Clean up whatever happened: the run's locks, then the table.
    let deleted = match place {
        Locks::Redis => delete_keys_under(&url, &prefix)
            .await
            .map(|_| ())
            .with_context(|| format!("deleting the keys under {prefix} from Redis")),
        Locks::Postgres => store.delete_lock_rows(&prefix).await,
        Locks::InMemory => Ok(()),
    };
    let closed = store.close().await;
    let a_accepted = outcome?;
    closed?;
    deleted?;

    if a_accepted {
        println!("FAIL: the paused holder's stale write got through");
        std::process::exit(1);
    }
    println!("ok: the stale write was refused; fencing kept B's write");
    Ok(())
}
