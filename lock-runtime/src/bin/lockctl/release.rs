//! `lockctl release KEY --force`: frees a lock whoever holds it, and wakes its waiters so that
//! they take the lock at once. The store frees it only if it still holds what was read (and
//! shown) first (`lock_runtime::admin::Admin::force_release`): a lock that changed hands in
//! between is not freed, whether or not the operator was asked (`--yes`).

use lock_runtime::admin::{Admin, ForceReleased, Holding, LockView};
use serde_json::json;

use crate::error::Error;
use crate::output::{holder_text, view_json, Out};

/// The answer to `release` without `--force`.
pub(crate) fn refusal(key: &str) -> Error {
    Error::Usage(format!(
        "not releasing {key} without --force: the holder is not told and keeps running until its \
         next renewal finds the lock gone (or its ttl ends), so it may overlap with the next \
         holder; pass --force once you know the holder is stuck or gone"
    ))
}

/// Shows who holds `key`, asks (unless `yes`), checks that the holder is still the one the
/// operator agreed to, and frees the lock.
pub(crate) async fn release(admin: &Admin, key: &str, yes: bool, out: &mut Out) -> Result<(), Error> {
    let before = admin.show(key).await?;
    if !before.is_held() {
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
        // Minutes may have passed: never free a lock that another holder has taken since.
        let now = admin.show(key).await?;
        if !now.is_held() {
            return report(out, &before, false);
        }
        if !same_holder(&before.holding, &now.holding) {
            return Err(changed_hands(key, &now.holding));
        }
    }
    match admin.force_release(&before).await? {
        ForceReleased::Freed => report(out, &before, true),
        ForceReleased::Changed => {
            let now = admin.show(key).await?;
            Err(changed_hands(key, &now.holding))
        }
        _ => report(out, &before, false),
    }
}

fn changed_hands(key: &str, now: &Holding) -> Error {
    Error::Failed(format!(
        "{key} not released: it changed hands since it was read (now {}); run again",
        holder_text(now)
    ))
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

/// What happened: whether a lock was freed, and what it was.
fn report(out: &mut Out, before: &LockView, released: bool) -> Result<(), Error> {
    let text = match (before.is_held(), released) {
        (false, _) => format!("{} is not held: nothing to release", before.key),
        (true, false) => format!("{} was already gone: nothing to release", before.key),
        (true, true) => format!(
            "released {} (was held by {})",
            before.key,
            holder_text(&before.holding)
        ),
    };
    let json = json!({ "key": before.key, "released": released, "previous": view_json(before) });
    out.record(&json, &text)
}
