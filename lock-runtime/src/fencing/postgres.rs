//! Fenced writes in PostgreSQL (the `postgres` feature): the database refuses a stale holder's
//! late write, in the business write's own transaction.
//!
//! A lock cannot stop a holder that was paused past its lease (a GC pause, a frozen VM) from
//! writing when it wakes: by then the next holder may have written. The storage can, if it
//! remembers the highest fencing token it accepted for the resource and refuses older ones, in
//! the same transaction as the write, so that nothing comes between the check and the write.
//! [`check_fence`] is that check: call it first in the transaction, write only if it accepts,
//! and commit. The fence row stays locked until the transaction ends, so a concurrent write with
//! an older token waits for it, then is refused.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool, token: u64) -> Result<(), Box<dyn std::error::Error>> {
//! let mut tx = pool.begin().await?;
//! if !lock_runtime::fencing::postgres::check_fence(&mut tx, "account:7", token).await? {
//!     return Err("a newer holder has written: this one's lock expired".into()); // rolls back
//! }
//! sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 7")
//!     .execute(&mut *tx)
//!     .await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! The tokens come from [`LockGuard::fencing_token`](crate::LockGuard::fencing_token) (or
//! [`current`](crate::current) inside a guarded body) of a lock taken with
//! [`fencing`](crate::LockOptions::fencing), on any store. The table, [`FENCES_TABLE`], is made
//! by [`create_fence_table`], and by every lock client on PostgreSQL as it connects (in the
//! store's schema, `public` unless `.postgres_schema` names another). These functions run on
//! the caller's connection, so they find the table through its `search_path`: with a schema of
//! the store's own, put it on that path, or make the table where the path finds it with
//! [`create_fence_table`].
//!
//! Where the business row can carry the token itself, one statement does the same without a
//! table: `UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2` (no row
//! updated: refused). The `fenced_storage` example does that.

use sqlx::PgConnection;

/// The table that keeps, per resource, the highest fencing token a write carried.
pub const FENCES_TABLE: &str = "lock_runtime_fenced";

const CREATE: &str = "SELECT pg_advisory_xact_lock(7813586151716824945); \
     CREATE TABLE IF NOT EXISTS lock_runtime_fenced (resource text PRIMARY KEY, token bigint NOT NULL)";

const CHECK: &str = "INSERT INTO lock_runtime_fenced AS f (resource, token) VALUES ($1, $2) \
     ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token \
     RETURNING token";

/// Makes [`FENCES_TABLE`] if it is missing (in one transaction of its own, one client at a time,
/// so clients starting together do not race).
pub async fn create_fence_table(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(CREATE).execute(conn).await?;
    Ok(())
}

/// In the caller's transaction: `true` if no write for `resource` carried a larger token than
/// `token` (the same token again is the same holder writing again), and records `token` as the
/// highest; `false` if a newer holder has written, and then the caller must not write (and
/// should roll back). Run it before the write, and commit both together.
pub async fn check_fence(conn: &mut PgConnection, resource: &str, token: u64) -> Result<bool, sqlx::Error> {
    let token = i64::try_from(token).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let accepted: Option<i64> = sqlx::query_scalar(CHECK)
        .bind(resource)
        .bind(token)
        .fetch_optional(conn)
        .await?;
    Ok(accepted.is_some())
}
