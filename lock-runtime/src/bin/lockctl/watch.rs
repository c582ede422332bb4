//! `lockctl watch`: looks at the locks every interval and prints what changed; a release
//! announced on a lock's channel (PSUBSCRIBE `<prefix>{PATTERN}:released`; on a Cluster,
//! SSUBSCRIBE to the channel of each lock seen held, as sharded pub/sub has no patterns) is
//! looked at and printed at once (releases are announced when someone waits for them, and on a
//! Cluster always; the others are seen at the next look). A lock taken and given back between
//! two looks is not seen.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use lock_runtime::keys::LockKeys;
use redis::cluster_async::ClusterConnection;
use redis::{Msg, PushInfo};
use serde_json::json;
use tokio::sync::mpsc;

use crate::error::Error;
use crate::inspect::{self, Holding, LockView};
use crate::output::{self, clock, now_unix_ms, ttl_text, Out};
use crate::target::{Conn, Listener, Target};

/// A holder that vanished this close to the end of its ttl is said to have expired.
const EXPIRY_SLACK: Duration = Duration::from_millis(50);

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

/// The locks last seen, by key.
pub(crate) type Seen = BTreeMap<String, LockView>;

/// Prints changes until the plan's time is up, Ctrl-C, or stdout closes.
pub(crate) async fn watch(target: &Target, plan: &Plan, out: &mut Out) -> Result<(), Error> {
    let prefix = target.prefix();
    let mut conn = target.connection().await?;
    let mut announcements = Announcements::open(target, &plan.pattern).await?;
    let mut seen = look(&mut conn, prefix, &plan.pattern).await?;
    announcements.follow(prefix, &seen).await?;
    eprintln!(
        "lockctl: watching locks matching {} ({} held now; a look every {} ms); Ctrl-C to stop",
        plan.pattern,
        seen.len(),
        plan.interval.as_millis()
    );
    let stop = stop_after(plan.stop_after);
    tokio::pin!(stop);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + plan.interval, plan.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut stop => return Ok(()),
            signal = &mut ctrl_c => {
                return signal.map_err(|e| Error::Failed(format!("cannot listen for Ctrl-C: {e}")));
            }
            _ = ticks.tick() => {
                let now = look(&mut conn, prefix, &plan.pattern).await?;
                print(out, changes(&seen, &now))?;
                seen = now;
                announcements.follow(prefix, &seen).await?;
            }
            channel = announcements.next() => {
                if let Some(key) = announced_key(prefix, &channel?) {
                    look_again(&mut conn, prefix, key, &mut seen, out).await?;
                    announcements.follow(prefix, &seen).await?;
                }
            }
        }
    }
}

/// Where release announcements are heard.
enum Announcements {
    /// A pattern subscription on one server (or the primary the sentinels named): every
    /// matching lock's releases.
    Pattern(BoxStream<'static, Msg>),
    /// Sharded subscriptions on a Cluster, where the library announces releases with
    /// `SPUBLISH` and sharded pub/sub has no patterns: one `SSUBSCRIBE` (on its slot's node) per
    /// lock seen held, kept while it is held.
    Sharded {
        conn: ClusterConnection,
        heard: mpsc::UnboundedReceiver<PushInfo>,
        /// The channels subscribed to.
        subscribed: BTreeSet<String>,
    },
    /// Nothing (the Redis user may not subscribe): releases show at the next look.
    Unheard,
}

impl Announcements {
    /// Subscribes to the release announcements of the locks matching `pattern` (on a Cluster,
    /// [`follow`](Self::follow) subscribes lock by lock); none, with a warning, when the Redis
    /// user may not subscribe to them.
    async fn open(target: &Target, pattern: &str) -> Result<Announcements, Error> {
        let pubsub = match target.listener().await? {
            Listener::Pattern(pubsub) => pubsub,
            Listener::Sharded(conn, heard) => {
                return Ok(Announcements::Sharded {
                    conn,
                    heard,
                    subscribed: BTreeSet::new(),
                })
            }
        };
        let channels = LockKeys::new(&inspect::glob_escape(target.prefix()), pattern)
            .channel()
            .to_owned();
        let mut pubsub = pubsub;
        match pubsub.psubscribe(&channels).await {
            Ok(()) => Ok(Announcements::Pattern(pubsub.into_on_message().boxed())),
            Err(e) if is_no_permission(&e) => {
                eprintln!(
                    "lockctl: this Redis user may not PSUBSCRIBE {channels}; releases show at the next look"
                );
                Ok(Announcements::Unheard)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// On a Cluster, subscribes to the release channel of every lock in `seen` not subscribed
    /// to yet, and leaves those of locks no longer held; nothing elsewhere. A release between a
    /// look and this subscription shows at the next look.
    async fn follow(&mut self, prefix: &str, seen: &Seen) -> Result<(), Error> {
        let Announcements::Sharded { conn, subscribed, .. } = self else {
            return Ok(());
        };
        let wanted: BTreeSet<String> = seen.keys().map(|key| channel_of(prefix, key)).collect();
        let left: Vec<String> = subscribed.difference(&wanted).cloned().collect();
        for channel in left {
            conn.sunsubscribe(&channel).await?;
            subscribed.remove(&channel);
        }
        let new: Vec<String> = wanted.difference(subscribed).cloned().collect();
        for channel in new {
            match conn.ssubscribe(&channel).await {
                Ok(()) => {
                    subscribed.insert(channel);
                }
                Err(e) if is_no_permission(&e) => {
                    eprintln!(
                        "lockctl: this Redis user may not SSUBSCRIBE {channel}; releases show at the next look"
                    );
                    *self = Announcements::Unheard;
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The channel of the next release announced; never, when nothing is subscribed to.
    async fn next(&mut self) -> Result<String, Error> {
        let closed = || Error::Failed("the pub/sub connection to Redis closed".to_owned());
        match self {
            Announcements::Pattern(messages) => {
                let message = messages.next().await.ok_or_else(closed)?;
                Ok(message.get_channel_name().to_owned())
            }
            Announcements::Sharded {
                heard, subscribed, ..
            } => loop {
                let push = heard.recv().await.ok_or_else(closed)?;
                let channel = match push.data.first() {
                    Some(redis::Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                    _ => continue,
                };
                match push.kind {
                    redis::PushKind::SMessage => return Ok(channel),
                    // The server ended it (the slot moved): subscribed again after the next look.
                    redis::PushKind::SUnsubscribe => {
                        subscribed.remove(&channel);
                    }
                    // redis-rs subscribes again by itself after a reconnect.
                    _ => {}
                }
            },
            Announcements::Unheard => std::future::pending().await,
        }
    }
}

/// The release channel of the lock on `key`, as the library names it.
fn channel_of(prefix: &str, key: &str) -> String {
    LockKeys::new(prefix, key).channel().to_owned()
}

/// The ACL refuses the command, key or channel.
fn is_no_permission(e: &redis::RedisError) -> bool {
    matches!(e.kind(), redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)) || e.code() == Some("NOPERM")
}

/// Completes after `after`, or never.
pub(crate) async fn stop_after(after: Option<Duration>) {
    match after {
        Some(after) => tokio::time::sleep(after).await,
        None => std::future::pending().await,
    }
}

/// Looks at `key` at once, its release having been announced, and prints what changed.
async fn look_again(
    conn: &mut Conn,
    prefix: &str,
    key: &str,
    seen: &mut Seen,
    out: &mut Out,
) -> Result<(), Error> {
    let view = inspect::read_one(conn, prefix, key).await?;
    let now = Some(&view).filter(|v| v.holding != Holding::Free);
    print(out, key_changes(key, seen.get(key), now, true))?;
    update(seen, view);
    Ok(())
}

/// The locks held now whose keys match `pattern`.
async fn look(conn: &mut Conn, prefix: &str, pattern: &str) -> Result<Seen, Error> {
    let views = inspect::held(conn, prefix, pattern).await?;
    Ok(views.into_iter().map(|v| (v.key.clone(), v)).collect())
}

/// Records one key as just read.
fn update(seen: &mut Seen, view: LockView) {
    if view.holding == Holding::Free {
        seen.remove(&view.key);
    } else {
        seen.insert(view.key.clone(), view);
    }
}

/// The user's key of a release channel `<prefix>{key}:released`.
fn announced_key<'a>(prefix: &str, channel: &'a str) -> Option<&'a str> {
    LockKeys::user_key_of_channel(prefix, channel)
}

pub(crate) fn print(out: &mut Out, events: Vec<Event>) -> Result<(), Error> {
    for event in events {
        out.record(&event.json(), &event.text())?;
    }
    Ok(())
}

/// What changed between two looks, key by key in key order.
pub(crate) fn changes(before: &Seen, now: &Seen) -> Vec<Event> {
    let keys: BTreeSet<&String> = before.keys().chain(now.keys()).collect();
    keys.into_iter()
        .flat_map(|key| key_changes(key, before.get(key), now.get(key), false))
        .collect()
}

/// One holder of a lock as seen in one look: the exclusive holder, one reader, or a foreign
/// value.
#[derive(Debug, Clone)]
struct Sighting {
    /// What tells this holder from the next one: its value (without `:released`).
    id: String,
    owner: Option<String>,
    mode: Mode,
    /// Given back, kept until its minimum hold ends.
    released: bool,
    ttl_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    Exclusive,
    Shared,
    /// A value lock-runtime did not write, of this Redis type.
    Foreign(String),
}

impl Mode {
    fn name(&self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
            Mode::Foreign(_) => "foreign",
        }
    }
}

/// The holders in one look at a key.
fn sightings(view: &LockView) -> Vec<Sighting> {
    match &view.holding {
        Holding::Free => Vec::new(),
        Holding::Exclusive {
            value,
            owner,
            released,
        } => vec![Sighting {
            id: value.strip_suffix(":released").unwrap_or(value).to_owned(),
            owner: Some(owner.clone()),
            mode: Mode::Exclusive,
            released: *released,
            ttl_ms: view.ttl_ms,
        }],
        Holding::Shared { readers } => readers
            .iter()
            .map(|r| Sighting {
                id: r.value.clone(),
                owner: Some(r.owner.clone()),
                mode: Mode::Shared,
                released: false,
                ttl_ms: Some(r.ttl_ms),
            })
            .collect(),
        Holding::Foreign { kind, value } => vec![Sighting {
            id: format!("{kind} {}", value.as_deref().unwrap_or_default()),
            owner: None,
            mode: Mode::Foreign(kind.clone()),
            released: false,
            ttl_ms: view.ttl_ms,
        }],
    }
}

/// What changed at one key. `announced`: the look follows a release announced on its channel.
fn key_changes(key: &str, before: Option<&LockView>, now: Option<&LockView>, announced: bool) -> Vec<Event> {
    let old = before.map(sightings).unwrap_or_default();
    let new = now.map(sightings).unwrap_or_default();
    let gone: Vec<&Sighting> = old.iter().filter(|o| !new.iter().any(|n| n.id == o.id)).collect();
    let came: Vec<&Sighting> = new.iter().filter(|n| !old.iter().any(|o| o.id == n.id)).collect();
    let event = |what, holder: &Sighting| Event::new(key, what, holder, announced);
    let mut events: Vec<Event> = new
        .iter()
        .filter(|n| n.released && old.iter().any(|o| o.id == n.id && !o.released))
        .map(|n| event(What::Released, n))
        .collect();
    if let ([old_holder], [new_holder]) = (gone.as_slice(), came.as_slice()) {
        let exclusive = old_holder.mode == Mode::Exclusive && new_holder.mode == Mode::Exclusive;
        if exclusive && !old_holder.released && !announced {
            let mut taken = event(What::TakenOver, new_holder);
            taken.previous_owner.clone_from(&old_holder.owner);
            events.push(taken);
            return events;
        }
    }
    let read_at = before.map_or_else(Instant::now, |v| v.read_at);
    for holder in gone {
        let lapsed = holder.released || (!announced && ran_out(read_at, holder.ttl_ms));
        events.push(event(if lapsed { What::Expired } else { What::Released }, holder));
    }
    for holder in came {
        events.push(event(What::Acquired, holder));
        if holder.released {
            events.push(event(What::Released, holder));
        }
    }
    events
}

/// Whether a ttl read at `read_at` has run out by now.
fn ran_out(read_at: Instant, ttl_ms: Option<u64>) -> bool {
    ttl_ms.is_some_and(|ttl| Instant::now() + EXPIRY_SLACK >= read_at + Duration::from_millis(ttl))
}

/// One change, printed as one line.
#[derive(Debug)]
pub(crate) struct Event {
    at_ms: u64,
    key: String,
    what: What,
    holder: Sighting,
    /// For a take-over: who held it before.
    previous_owner: Option<String>,
    /// The look followed a release announcement.
    announced: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum What {
    Acquired,
    /// Given back (deleted, or kept for its minimum hold: then `holder.released`).
    Released,
    /// Its ttl ran out (or its minimum hold ended).
    Expired,
    /// Another holder has it, and the last look saw the previous one still holding it.
    TakenOver,
}

impl Event {
    fn new(key: &str, what: What, holder: &Sighting, announced: bool) -> Event {
        Event {
            at_ms: now_unix_ms(),
            key: key.to_owned(),
            what,
            holder: holder.clone(),
            previous_owner: None,
            announced,
        }
    }

    fn name(&self) -> &'static str {
        match self.what {
            What::Acquired => "acquired",
            What::Released => "released",
            What::Expired => "expired",
            What::TakenOver => "taken_over",
        }
    }

    /// Kept for a minimum hold: how long is left of it.
    fn kept_ms(&self) -> Option<u64> {
        (self.what == What::Released && self.holder.released)
            .then_some(self.holder.ttl_ms)
            .flatten()
    }

    /// The new holder's ttl, for an acquisition or take-over.
    fn ttl_ms(&self) -> Option<u64> {
        matches!(self.what, What::Acquired | What::TakenOver)
            .then_some(self.holder.ttl_ms)
            .flatten()
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "at_ms": self.at_ms,
            "event": self.name(),
            "key": self.key,
            "mode": self.holder.mode.name(),
            "owner": self.holder.owner,
            "ttl_ms": self.ttl_ms(),
            "kept_ms": self.kept_ms(),
            "previous_owner": self.previous_owner,
            "announced": self.announced,
        })
    }

    fn text(&self) -> String {
        format!(
            "{}  {}  {}",
            clock(self.at_ms),
            output::clean(&self.key),
            output::clean(&self.description())
        )
    }

    fn description(&self) -> String {
        let owner = self.holder.owner.as_deref().unwrap_or("?");
        let ttl = ttl_text(self.ttl_ms());
        let (what, by) = match &self.holder.mode {
            Mode::Exclusive => ("", owner.to_owned()),
            Mode::Shared => ("read share ", owner.to_owned()),
            Mode::Foreign(kind) => ("", format!("a foreign {kind} value")),
        };
        match self.what {
            What::Acquired => format!("{what}acquired by {by} (ttl {ttl})"),
            What::Released => match self.kept_ms() {
                Some(kept) => format!(
                    "{what}released by {by} (kept {} for its minimum hold)",
                    ttl_text(Some(kept))
                ),
                None => format!("{what}released by {by}"),
            },
            What::Expired => format!("{what}expired (held by {by})"),
            What::TakenOver => format!(
                "taken over by {by} (ttl {ttl}) from {}",
                self.previous_owner.as_deref().unwrap_or("?")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::{Fence, Reader};

    fn view(key: &str, holding: Holding, ttl_ms: u64) -> LockView {
        LockView {
            key: key.to_owned(),
            lock_key: format!("lock:{{{key}}}"),
            holding,
            ttl_ms: Some(ttl_ms),
            fence: Fence::None,
            fair_waiters: 0,
            waiting_writers: 0,
            read_at: Instant::now(),
        }
    }

    fn held(owner: &str, n: u8, released: bool) -> Holding {
        let token = format!("{:032x} {owner}", n);
        Holding::Exclusive {
            value: if released {
                format!("{token}:released")
            } else {
                token
            },
            owner: owner.to_owned(),
            released,
        }
    }

    fn names(events: &[Event]) -> Vec<(&'static str, Option<&str>)> {
        events
            .iter()
            .map(|e| (e.name(), e.holder.owner.as_deref()))
            .collect()
    }

    #[test]
    fn acquisitions_releases_expiries_and_take_overs() {
        let a = view("k", held("a", 1, false), 60_000);
        let short = view("k", held("a", 1, false), 0);
        let b = view("k", held("b", 2, false), 60_000);
        let kept = view("k", held("a", 1, true), 5_000);
        assert_eq!(
            names(&key_changes("k", None, Some(&a), false)),
            [("acquired", Some("a"))]
        );
        assert_eq!(
            names(&key_changes("k", Some(&a), None, false)),
            [("released", Some("a"))]
        );
        assert_eq!(
            names(&key_changes("k", Some(&short), None, false)),
            [("expired", Some("a"))]
        );
        assert_eq!(
            names(&key_changes("k", Some(&a), Some(&b), false)),
            [("taken_over", Some("b"))]
        );
        let announced = key_changes("k", Some(&a), Some(&b), true);
        assert_eq!(
            names(&announced),
            [("released", Some("a")), ("acquired", Some("b"))]
        );
        let held_back = key_changes("k", Some(&a), Some(&kept), false);
        assert_eq!(names(&held_back), [("released", Some("a"))]);
        assert_eq!(held_back[0].kept_ms(), Some(5_000));
        assert_eq!(
            names(&key_changes("k", Some(&kept), None, false)),
            [("expired", Some("a"))]
        );
        assert!(key_changes("k", Some(&a), Some(&a), false).is_empty());
    }

    #[test]
    fn readers_come_and_go_one_by_one() {
        let reader = |owner: &str, n: u8| Reader {
            value: format!("{:032x} {owner}", n),
            owner: owner.to_owned(),
            ttl_ms: 10_000,
        };
        let one = view(
            "k",
            Holding::Shared {
                readers: vec![reader("r1", 1)],
            },
            10_000,
        );
        let two = view(
            "k",
            Holding::Shared {
                readers: vec![reader("r1", 1), reader("r2", 2)],
            },
            10_000,
        );
        let other = view(
            "k",
            Holding::Shared {
                readers: vec![reader("r2", 2)],
            },
            10_000,
        );
        assert_eq!(
            names(&key_changes("k", Some(&one), Some(&two), false)),
            [("acquired", Some("r2"))]
        );
        assert_eq!(
            names(&key_changes("k", Some(&two), Some(&other), false)),
            [("released", Some("r1"))]
        );
    }
}
