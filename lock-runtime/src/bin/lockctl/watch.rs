//! `lockctl watch`: prints the changes `lock_runtime::admin::Watch` sees (a look every interval,
//! and one at once at a lock whose release the store announces), one line (or JSON object) per
//! event, until the time is up, Ctrl-C, or stdout closes.

use std::time::{Duration, UNIX_EPOCH};

use lock_runtime::admin::{Admin, Event, EventKind, HolderMode};
use serde_json::json;

use crate::error::Error;
use crate::output::{self, clock, millis, ttl_text, Out};

/// What to watch, how often, and for how long.
#[derive(Debug)]
pub(crate) struct Plan {
    /// A glob over the locks' keys.
    pub(crate) pattern: String,
    /// Time between two looks.
    pub(crate) interval: Duration,
    /// Stop after this long; `None`: until Ctrl-C or stdout closes.
    pub(crate) stop_after: Option<Duration>,
}

/// Prints changes until the plan's time is up, Ctrl-C, or stdout closes.
pub(crate) async fn watch(admin: &Admin, plan: &Plan, out: &mut Out) -> Result<(), Error> {
    let mut watch = admin.watch(&plan.pattern, plan.interval).await?;
    eprintln!(
        "lockctl: watching locks matching {} ({} held now; a look every {} ms); Ctrl-C to stop",
        plan.pattern,
        watch.held(),
        plan.interval.as_millis()
    );
    let stop = stop_after(plan.stop_after);
    tokio::pin!(stop);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            () = &mut stop => return Ok(()),
            signal = &mut ctrl_c => {
                return signal.map_err(|e| Error::Failed(format!("cannot listen for Ctrl-C: {e}")));
            }
            events = watch.next() => {
                for event in events? {
                    out.record(&event_json(&event), &event_text(&event))?;
                }
            }
        }
    }
}

/// Completes after `after`, or never.
async fn stop_after(after: Option<Duration>) {
    match after {
        Some(after) => tokio::time::sleep(after).await,
        None => std::future::pending().await,
    }
}

fn at_ms(event: &Event) -> u64 {
    event
        .at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn event_json(event: &Event) -> serde_json::Value {
    json!({
        "at_ms": at_ms(event),
        "event": event.kind.name(),
        "key": event.key,
        "mode": event.mode.name(),
        "owner": event.owner,
        "ttl_ms": event.lease().map(millis),
        "kept_ms": event.kept().map(millis),
        "previous_owner": event.previous_owner,
        "announced": event.announced,
    })
}

fn event_text(event: &Event) -> String {
    format!(
        "{}  {}  {}",
        clock(at_ms(event)),
        output::clean(&event.key),
        output::clean(&description(event))
    )
}

fn description(event: &Event) -> String {
    let owner = event.owner.as_deref().unwrap_or("?");
    let ttl = ttl_text(event.lease().map(millis));
    let (what, by) = match &event.mode {
        HolderMode::Shared => ("read share ".to_owned(), owner.to_owned()),
        HolderMode::Permit(permit) => (format!("permit {permit} "), owner.to_owned()),
        HolderMode::Foreign(kind) => (String::new(), format!("a foreign {kind} value")),
        _ => (String::new(), owner.to_owned()),
    };
    match event.kind {
        EventKind::Acquired => format!("{what}acquired by {by} (ttl {ttl})"),
        EventKind::Released => match event.kept() {
            Some(kept) => format!(
                "{what}released by {by} (kept {} for its minimum hold)",
                ttl_text(Some(millis(kept)))
            ),
            None => format!("{what}released by {by}"),
        },
        EventKind::Expired => format!("{what}expired (held by {by})"),
        EventKind::TakenOver => format!(
            "taken over by {by} (ttl {ttl}) from {}",
            event.previous_owner.as_deref().unwrap_or("?")
        ),
        _ => format!("{} ({by})", event.kind.name()),
    }
}
