//! `lockctl release KEY --force`: deletes a lock whoever holds it, and announces the release so
//! that waiters take the lock at once (on a Cluster with `SPUBLISH`, as the library does). The delete compares what the key holds with what was read
//! (and shown) first, in one script on the same connection (`force.lua`): a lock that changed
//! hands in between is not deleted, whether or not the operator was asked (`--yes`).

use lock_runtime::keys::LockKeys;
use serde_json::json;

use crate::error::Error;
use crate::inspect::{self, Holding, LockView};
use crate::output::{holder_text, view_json, Out};
use crate::target::{Conn, Target};

/// The answer to `release` without `--force`.
pub(crate) fn refusal(key: &str) -> Error {
    Error::Usage(format!(
        "not releasing {key} without --force: the holder is not told and keeps running until its \
         next renewal finds the lock gone (or its ttl ends), so it may overlap with the next \
         holder; pass --force once you know the holder is stuck or gone"
    ))
}

/// Where a lock is read and force-deleted: Redis (below) or PostgreSQL (`postgres.rs`).
pub(crate) trait Locks {
    /// What `key` holds now.
    async fn read_one(&mut self, key: &str) -> Result<LockView, Error>;
    /// Deletes the lock `view` describes if the store still holds that, and announces it.
    async fn compare_and_delete(&mut self, view: &LockView) -> Result<Deleted, Error>;
}

/// A Redis deployment's connection, with the prefix.
struct OnRedis<'a> {
    conn: Conn,
    prefix: &'a str,
}

impl Locks for OnRedis<'_> {
    async fn read_one(&mut self, key: &str) -> Result<LockView, Error> {
        inspect::read_one(&mut self.conn, self.prefix, key).await
    }

    async fn compare_and_delete(&mut self, view: &LockView) -> Result<Deleted, Error> {
        compare_and_delete(&mut self.conn, self.prefix, view).await
    }
}

/// Shows who holds `key`, asks (unless `yes`), checks that the holder is still the one the
/// operator agreed to, and deletes the lock.
pub(crate) async fn release(target: &Target, key: &str, yes: bool, out: &mut Out) -> Result<(), Error> {
    inspect::check_key(key)?;
    let conn = target.connection().await?;
    let mut locks = OnRedis {
        conn,
        prefix: target.prefix(),
    };
    release_from(&mut locks, key, yes, out).await
}

/// [`release`] on any store.
pub(crate) async fn release_from(
    locks: &mut impl Locks,
    key: &str,
    yes: bool,
    out: &mut Out,
) -> Result<(), Error> {
    let before = locks.read_one(key).await?;
    if before.holding == Holding::Free {
        return report(out, &before, false);
    }
    if !yes {
        let question = format!(
            "release lock {key} held by {}? [y/N] ",
            holder_text(&before.holding)
        );
        if !confirm(question).await? {
            return Err(Error::Failed(format!("{key} not released: not confirmed")));
        }
        // Minutes may have passed: never delete a lock that another holder has taken since.
        let now = locks.read_one(key).await?;
        if now.holding == Holding::Free {
            return report(out, &before, false);
        }
        if !same_holder(&before.holding, &now.holding) {
            return Err(changed_hands(key, &now.holding));
        }
    }
    match locks.compare_and_delete(&before).await? {
        Deleted::Yes => report(out, &before, true),
        Deleted::Gone => report(out, &before, false),
        Deleted::ChangedHands => {
            let now = locks.read_one(key).await?;
            Err(changed_hands(key, &now.holding))
        }
    }
}

fn changed_hands(key: &str, now: &Holding) -> Error {
    Error::Failed(format!(
        "{key} not released: it changed hands since it was read (now {}); run again",
        holder_text(now)
    ))
}

/// What a compare-and-delete did.
pub(crate) enum Deleted {
    Yes,
    Gone,
    ChangedHands,
}

/// Deletes the lock `view` describes if the key still holds that (see `force.lua`).
async fn compare_and_delete(conn: &mut Conn, prefix: &str, view: &LockView) -> Result<Deleted, Error> {
    static FORCE: std::sync::LazyLock<redis::Script> =
        std::sync::LazyLock::new(|| redis::Script::new(include_str!("force.lua")));
    let (kind, value) = match &view.holding {
        Holding::Free => return Ok(Deleted::Gone),
        Holding::Exclusive { value, .. } => ("string", value.as_str()),
        Holding::Shared { .. } => ("hash", "read"),
        Holding::Foreign { kind, .. } => (kind.as_str(), ""),
    };
    let names = LockKeys::new(prefix, &view.key);
    debug_assert_eq!(names.lock(), view.lock_key);
    let answer: i64 = FORCE
        .key(names.lock())
        .key(names.waiting())
        .arg(kind)
        .arg(value)
        .arg(names.channel())
        // As the library's release script: sharded pub/sub on a Cluster, where its waiters
        // listen with SSUBSCRIBE.
        .arg(if conn.is_cluster() { "1" } else { "0" })
        .invoke_async(conn)
        .await?;
    Ok(match answer {
        1 => Deleted::Yes,
        0 => Deleted::Gone,
        _ => Deleted::ChangedHands,
    })
}

/// Whether the lock still has the holder the operator saw: the same value (kept or not for a
/// minimum hold), still shared (readers come and go), or the same foreign value.
fn same_holder(before: &Holding, now: &Holding) -> bool {
    match (before, now) {
        (Holding::Exclusive { value: a, .. }, Holding::Exclusive { value: b, .. }) => {
            let token = |v: &str| v.strip_suffix(":released").unwrap_or(v).to_owned();
            token(a) == token(b)
        }
        (Holding::Shared { .. }, Holding::Shared { .. }) => true,
        (a, b) => a == b,
    }
}

/// Asks on stderr and reads the answer from stdin; anything but `y`/`yes` (or end of input) is
/// no.
async fn confirm(question: String) -> Result<bool, Error> {
    let answer = tokio::task::spawn_blocking(move || {
        eprint!("{question}");
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await
    .map_err(|e| Error::Failed(format!("cannot read the answer: {e}")))?
    .map_err(|e| Error::Failed(format!("cannot read the answer: {e}")))?;
    Ok(matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"))
}

/// What happened: whether a lock was deleted, and what it was.
fn report(out: &mut Out, before: &LockView, released: bool) -> Result<(), Error> {
    let text = match (&before.holding, released) {
        (Holding::Free, _) => format!("{} is not held: nothing to release", before.key),
        (_, false) => format!("{} was already gone: nothing to release", before.key),
        (holding, true) => format!("released {} (was held by {})", before.key, holder_text(holding)),
    };
    let json = json!({ "key": before.key, "released": released, "previous": view_json(before) });
    out.record(&json, &text)
}
