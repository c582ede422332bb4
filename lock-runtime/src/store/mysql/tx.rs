//! Requests of more than one statement (a fair waiter's place, a reader's share, a fair
//! semaphore's line): one short READ COMMITTED transaction, which first locks the key's row, so
//! every such request on one key runs alone, and the one-statement requests on the key (a plain
//! acquire, which writes the same row) wait for it. READ COMMITTED: a locking read locks the
//! rows it finds, not the gaps between them, so a request on one key never waits for another
//! key's.
//!
//! A request that fails anywhere inside its transaction closes its connection (the server rolls
//! the transaction back as the connection goes): an open transaction never goes back to the
//! pool. A client that stops between two statements (frozen, cut off) would leave the key's row
//! locked until the server noticed: InnoDB keeps an open transaction's locks, and a silent peer
//! is noticed only at `wait_timeout` (8 hours by default). So a transaction sets its session's
//! `wait_timeout` to the response timeout (at least a second) first, and back to the server's
//! after its commit: the server ends a client silent that long inside a transaction, and rolls
//! it back (MySQL 8 and MariaDB alike; MariaDB's `idle_transaction_timeout` is not MySQL's). One the server ended or rolled back whole (a killed connection, a deadlock's victim, a
//! lock wait timeout, a Group Replication conflict at commit) changed nothing and is sent again
//! on another connection, as a one-statement request is; every request here is idempotent for
//! one token.

use std::future::Future;
use std::pin::Pin;

use sqlx::MySqlConnection;

use super::MysqlStore;
use crate::store::sql::{Checkout, SqlStore};
use crate::LockError;

/// What a step of a transaction answers: it borrows the connection for its statements.
pub(super) type Step<'c, T> = Pin<Box<dyn Future<Output = Result<T, sqlx::Error>> + Send + 'c>>;

/// Starts the transaction (binds, in the text: the idle limit in seconds): the session's idle
/// limit, READ COMMITTED for this one transaction (the session's level is the server's or the
/// URL's); one round trip, as text (no statement here needs preparing).
const BEGIN: &str =
    "SET SESSION wait_timeout = {}; SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";
/// Ends it, and gives the session the server's idle limit back.
const COMMIT: &str = "COMMIT; SET SESSION wait_timeout = DEFAULT";

impl MysqlStore {
    /// Runs `work` over `args` in one transaction (see the module doc), within the response
    /// timeout.
    pub(super) async fn transact<A, T, W>(&self, args: &A, work: W) -> Result<T, LockError>
    where
        A: Sync + ?Sized,
        W: for<'c> Fn(&'c mut MySqlConnection, &'c A) -> Step<'c, T> + Send + Sync,
        T: Send,
    {
        let pool = self.ready().await?;
        let idle = self.sql.timeouts.response.as_secs_f64().ceil().max(1.0);
        let begin = BEGIN.replace("{}", &format!("{idle:.0}"));
        let answer = async {
            let mut ended = 0;
            loop {
                let mut checkout = Checkout::new(pool.acquire().await?, self.sql.timeouts.response);
                let answer = match checkout.get() {
                    Some(conn) => run(conn, &begin, args, &work).await,
                    None => Err(sqlx::Error::PoolClosed),
                };
                // Failed, the connection is dropped unanswered: closed, not pooled.
                if answer.is_ok() {
                    checkout.answered();
                }
                drop(checkout);
                match answer {
                    Err(e) if self.ended_by_server(&e) && ended <= super::POOL_SIZE => ended += 1,
                    answer => return answer,
                }
            }
        };
        match tokio::time::timeout(self.sql.timeouts.response, answer).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(self.failed(e).await),
            Err(_) => Err(self.timed_out(self.sql.timeouts.response)),
        }
    }
}

/// BEGIN, the work, COMMIT.
async fn run<A, T, W>(conn: &mut MySqlConnection, begin: &str, args: &A, work: &W) -> Result<T, sqlx::Error>
where
    A: ?Sized,
    W: for<'c> Fn(&'c mut MySqlConnection, &'c A) -> Step<'c, T>,
{
    text(&mut *conn, begin).await?;
    let done = work(&mut *conn, args).await?;
    text(&mut *conn, COMMIT).await?;
    Ok(done)
}

/// Statements sent as text.
fn text<'c>(conn: &'c mut MySqlConnection, sql: &'c str) -> Step<'c, ()> {
    Box::pin(async move {
        // A `&str` without arguments goes as text (COM_QUERY), not prepared.
        sqlx::Executor::execute(conn, sql).await?;
        Ok(())
    })
}
