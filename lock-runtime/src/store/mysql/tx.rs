//! Requests of more than one statement (a fair waiter's place, a reader's share, a fair
//! semaphore's line): one short READ COMMITTED transaction, which first locks the key's row, so
//! every such request on one key runs alone, and the one-statement requests on the key (a plain
//! acquire, which writes the same row) wait for it. READ COMMITTED: a locking read locks the
//! rows it finds, not the gaps between them, so a request on one key never waits for another
//! key's.
//!
//! A request that fails anywhere inside its transaction closes its connection (the server rolls
//! the transaction back as the connection goes): an open transaction never goes back to the
//! pool. One the server ended or rolled back whole (a killed connection, a deadlock's victim, a
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

/// Starts the transaction: READ COMMITTED for this one transaction only (the session's level is
/// the server's or the URL's; one round trip, as text: neither statement needs preparing).
const BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";

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
        let answer = async {
            let mut ended = 0;
            loop {
                let mut checkout = Checkout::new(pool.acquire().await?, self.timeouts.response);
                let answer = match checkout.get() {
                    Some(conn) => run(conn, args, &work).await,
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
        match tokio::time::timeout(self.timeouts.response, answer).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(self.failed(e).await),
            Err(_) => Err(self.timed_out(self.timeouts.response)),
        }
    }
}

/// BEGIN, the work, COMMIT.
async fn run<A, T, W>(conn: &mut MySqlConnection, args: &A, work: &W) -> Result<T, sqlx::Error>
where
    A: ?Sized,
    W: for<'c> Fn(&'c mut MySqlConnection, &'c A) -> Step<'c, T>,
{
    text(&mut *conn, BEGIN).await?;
    let done = work(&mut *conn, args).await?;
    text(&mut *conn, "COMMIT").await?;
    Ok(done)
}

/// Statements sent as text.
fn text<'c>(conn: &'c mut MySqlConnection, sql: &'static str) -> Step<'c, ()> {
    Box::pin(async move {
        // A `&str` without arguments goes as text (COM_QUERY), not prepared.
        sqlx::Executor::execute(conn, sql).await?;
        Ok(())
    })
}
