//! What the commands print: text for people, JSON for scripts (`--json`), each line flushed
//! as it is written so that `watch` can be piped.

use std::io::Write;

use serde_json::{json, Value};

use lock_runtime::admin::{Fence, Holding, LockView};

use crate::error::Error;

/// Standard output, in the format chosen.
#[derive(Debug)]
pub(crate) struct Out {
    json: bool,
}

impl Out {
    pub(crate) fn new(json: bool) -> Out {
        Out { json }
    }

    /// Writes the JSON or the text, whichever was chosen.
    pub(crate) fn record(&mut self, json: &Value, text: &str) -> Result<(), Error> {
        if self.json {
            self.line(&json.to_string())
        } else {
            self.line(text)
        }
    }

    /// Writes `text` and a newline, and flushes; a closed stdout is [`Error::Closed`].
    fn line(&mut self, text: &str) -> Result<(), Error> {
        let mut stdout = std::io::stdout().lock();
        match writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Error::Closed),
            Err(e) => Err(Error::Failed(format!("cannot write to standard output: {e}"))),
        }
    }

    /// `list`: a table (or a JSON array) of the locks held.
    pub(crate) fn list(&mut self, pattern: &str, views: &[LockView]) -> Result<(), Error> {
        let json = Value::Array(views.iter().map(view_json).collect());
        let text = if views.is_empty() {
            format!("no locks held matching {pattern}")
        } else {
            table(views)
        };
        self.record(&json, &text)
    }

    /// `show`: one key in full.
    pub(crate) fn show(&mut self, view: &LockView) -> Result<(), Error> {
        self.record(&view_json(view), &details(view))
    }
}

/// A key as JSON; every field is always there (`null` when it does not apply).
pub(crate) fn view_json(view: &LockView) -> Value {
    let (state, owner, value, kind) = match &view.holding {
        Holding::Free => ("free", None, None, None),
        Holding::Exclusive {
            value,
            owner,
            released,
        } => {
            let state = if *released { "released" } else { "held" };
            (state, Some(owner.as_str()), Some(value.as_str()), Some("string"))
        }
        Holding::Shared { .. } => ("shared", None, None, Some("hash")),
        Holding::Foreign { kind, value } => ("foreign", None, value.as_deref(), Some(kind.as_str())),
        _ => ("unknown", None, None, None),
    };
    let readers: Vec<Value> = match &view.holding {
        Holding::Shared { readers } => readers
            .iter()
            .map(|r| json!({ "owner": r.owner, "ttl_ms": millis(r.remaining), "value": r.value }))
            .collect(),
        _ => Vec::new(),
    };
    json!({
        "key": view.key,
        "lock_key": view.name,
        "state": state,
        "owner": owner,
        "readers": readers,
        "type": kind,
        "value": value,
        "ttl_ms": view.remaining.map(millis),
        "fence": fence_json(&view.fence),
        "fair_waiters": view.queued,
        "waiting_writers": view.writers,
    })
}

fn fence_json(fence: &Fence) -> Value {
    match fence {
        Fence::Token(token) => json!(token),
        Fence::Other(text) => json!(text),
        _ => Value::Null,
    }
}

/// A duration in whole milliseconds.
pub(crate) fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `text` as it may reach a terminal: keys, owners and values are request data, so control
/// characters (an escape sequence that would recolour or rewrite the screen, a newline that would
/// forge a line) and the invisible characters that reorder text are shown escaped (`\u{1b}`).
pub(crate) fn clean(text: &str) -> String {
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(hidden) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if hidden(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The `list` table: key, owner, ttl, fence, waiting.
fn table(views: &[LockView]) -> String {
    let mut rows = vec![["KEY", "OWNER", "TTL", "FENCE", "WAITING"].map(str::to_owned)];
    rows.extend(views.iter().map(|v| {
        [
            clean(&v.key),
            clean(&holder_text(&v.holding)),
            ttl_text(v.remaining.map(millis)),
            fence_text(&v.fence),
            waiting_text(v),
        ]
    }));
    let mut widths = [0; 5];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let lines: Vec<String> = rows
        .iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .zip(widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            cells.join("  ").trim_end().to_owned()
        })
        .collect();
    lines.join("\n")
}

/// `show`'s text: one `name: value` line per fact, readers one per line.
fn details(view: &LockView) -> String {
    let mut lines = vec![
        format!("key:             {}", clean(&view.key)),
        format!("stored as:       {}", clean(&view.name)),
        format!("state:           {}", clean(&state_text(&view.holding))),
    ];
    match &view.holding {
        Holding::Exclusive { value, .. } => lines.push(format!("value:           {}", clean(value))),
        Holding::Foreign {
            value: Some(value), ..
        } => lines.push(format!("value:           {}", clean(value))),
        Holding::Shared { readers } => lines.extend(readers.iter().map(|r| {
            format!(
                "reader:          {} (ttl {}; value {})",
                clean(&r.owner),
                ttl_text(Some(millis(r.remaining))),
                clean(&r.value)
            )
        })),
        _ => {}
    }
    if view.is_held() {
        lines.push(format!(
            "ttl:             {}",
            ttl_text(view.remaining.map(millis))
        ));
    }
    lines.push(format!("fence:           {}", fence_text(&view.fence)));
    lines.push(format!("fair waiters:    {}", view.queued));
    lines.push(format!("waiting writers: {}", view.writers));
    lines.join("\n")
}

/// Who holds it, in a few words.
pub(crate) fn holder_text(holding: &Holding) -> String {
    match holding {
        Holding::Free => "-".to_owned(),
        Holding::Exclusive {
            owner,
            released: false,
            ..
        } => owner.clone(),
        Holding::Exclusive {
            owner,
            released: true,
            ..
        } => format!("{owner} (released, minimum hold)"),
        Holding::Shared { readers } => {
            let count = match readers.len() {
                1 => "1 reader".to_owned(),
                n => format!("{n} readers"),
            };
            let owners: Vec<&str> = readers.iter().map(|r| r.owner.as_str()).collect();
            if owners.is_empty() {
                count
            } else {
                format!("{count}: {}", owners.join(", "))
            }
        }
        Holding::Foreign { kind, .. } => format!("(foreign {kind})"),
        _ => "?".to_owned(),
    }
}

/// `show`'s state line.
fn state_text(holding: &Holding) -> String {
    match holding {
        Holding::Free => "free".to_owned(),
        Holding::Exclusive {
            owner,
            released: false,
            ..
        } => format!("held by {owner}"),
        Holding::Exclusive {
            owner,
            released: true,
            ..
        } => {
            format!("released by {owner}, kept until its minimum hold ends")
        }
        Holding::Shared { .. } => format!("shared by {}", holder_text(holding)),
        Holding::Foreign { kind, .. } => {
            format!("a foreign {kind} value (not written by lock-runtime; left alone)")
        }
        _ => "unknown".to_owned(),
    }
}

/// A remaining life: `850ms`, `29.8s`, `12m05s`, `3h02m`; `no expiry` for none.
pub(crate) fn ttl_text(ttl_ms: Option<u64>) -> String {
    let Some(ms) = ttl_ms else {
        return "no expiry".to_owned();
    };
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{}.{}s", ms / 1000, ms % 1000 / 100),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// The fencing counter in a table cell: the number, `-` when there is none.
pub(crate) fn fence_text(fence: &Fence) -> String {
    match fence {
        Fence::Token(token) => token.to_string(),
        Fence::Other(text) => format!("? ({text})"),
        _ => "-".to_owned(),
    }
}

/// Who waits: `2 queued, 1 writer` (fair waiters in line, writers of a read-write lock), `-`
/// when nobody does.
fn waiting_text(view: &LockView) -> String {
    let mut parts = Vec::new();
    if view.queued > 0 {
        parts.push(format!("{} queued", view.queued));
    }
    match view.writers {
        0 => {}
        1 => parts.push("1 writer".to_owned()),
        n => parts.push(format!("{n} writers")),
    }
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(", ")
    }
}

/// The UTC time of day of `unix_ms`, `HH:MM:SS.mmm`.
pub(crate) fn clock(unix_ms: u64) -> String {
    let ms_of_day = unix_ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms_of_day / 3_600_000,
        ms_of_day % 3_600_000 / 60_000,
        ms_of_day % 60_000 / 1000,
        ms_of_day % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(ttl_text(None), "no expiry");
        assert_eq!(ttl_text(Some(850)), "850ms");
        assert_eq!(ttl_text(Some(29_876)), "29.8s");
        assert_eq!(ttl_text(Some(725_000)), "12m05s");
        assert_eq!(ttl_text(Some(10_920_000)), "3h02m");
        assert_eq!(clock(86_400_000 + 3_723_004), "01:02:03.004");
    }

    #[test]
    fn request_data_cannot_reach_the_terminal_raw() {
        assert_eq!(clean("order:42"), "order:42");
        assert_eq!(clean("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(clean("x\nforged"), "x\\u{a}forged");
        assert_eq!(clean("\u{202e}txt"), "\\u{202e}txt");
        assert_eq!(clean("čaj ☕"), "čaj ☕");
    }
}
