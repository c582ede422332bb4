//! [`Watch`]: what changed between two looks at the locks matching a pattern, key by key, as
//! events: acquired, released, expired, taken over. A look is made every interval, and at once at
//! a lock whose release the store announces (the store listens for each lock seen held, as it
//! does for a waiter). A lock taken and given back between two looks is not seen.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio::time::{Instant, Interval};

use super::{Holding, LockView};
use crate::view::RELEASED;
use crate::wakeups::Watching;
use crate::{LockClient, LockError};

/// A holder that vanished this close to the end of its lease is said to have expired.
const EXPIRY_SLACK: Duration = Duration::from_millis(50);

/// A watch of the locks matching a pattern ([`Admin::watch`](super::Admin::watch)).
#[derive(Debug)]
pub struct Watch {
    client: LockClient,
    pattern: String,
    /// The locks last seen held, by key.
    seen: BTreeMap<String, LockView>,
    ticks: Interval,
    /// Where the store's release notices of the locks watched arrive (their names).
    heard: mpsc::UnboundedReceiver<String>,
    tell: mpsc::UnboundedSender<String>,
    /// The locks listened to, by name: their keys, and the watch that ends with it.
    listening: HashMap<String, (String, Watching)>,
}

impl Watch {
    pub(super) async fn start(
        client: LockClient,
        pattern: &str,
        every: Duration,
    ) -> Result<Watch, LockError> {
        let (tell, heard) = mpsc::unbounded_channel();
        let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut watch = Watch {
            client,
            pattern: pattern.to_owned(),
            seen: BTreeMap::new(),
            ticks,
            heard,
            tell,
            listening: HashMap::new(),
        };
        watch.seen = watch.look().await?;
        watch.follow().await;
        Ok(watch)
    }

    /// How many locks matching the pattern were held at the last look.
    pub fn held(&self) -> usize {
        self.seen.len()
    }

    /// The next changes, as soon as there are any (it looks again until something changed).
    pub async fn next(&mut self) -> Result<Vec<Event>, LockError> {
        loop {
            let events = tokio::select! {
                _ = self.ticks.tick() => {
                    let now = self.look().await?;
                    let events = changes(&self.seen, &now);
                    self.seen = now;
                    events
                }
                Some(name) = self.heard.recv() => {
                    let Some((key, _)) = self.listening.get(&name) else { continue };
                    let key = key.clone();
                    self.look_again(&key).await?
                }
            };
            self.follow().await;
            if !events.is_empty() {
                return Ok(events);
            }
        }
    }

    /// The locks held now whose keys match the pattern.
    async fn look(&self) -> Result<BTreeMap<String, LockView>, LockError> {
        let views = self.client.core().store.list(&self.pattern).await?;
        Ok(views.into_iter().map(|v| (v.key.clone(), v)).collect())
    }

    /// Looks at `key` at once, its release having been announced: what changed.
    async fn look_again(&mut self, key: &str) -> Result<Vec<Event>, LockError> {
        let core = self.client.core();
        let lock = core.lock(key)?;
        let view = core.store.inspect(&lock).await?;
        let now = Some(&view).filter(|v| v.is_held());
        let events = key_changes(key, self.seen.get(key), now, true);
        if view.is_held() {
            self.seen.insert(key.to_owned(), view);
        } else {
            self.seen.remove(key);
        }
        Ok(events)
    }

    /// Listens for the releases of every lock seen held (bounded by the response timeout
    /// each), and no longer for those that are not.
    async fn follow(&mut self) {
        let core = self.client.core();
        let wanted: BTreeSet<String> = self
            .seen
            .keys()
            .filter_map(|key| Some(core.lock(key).ok()?.name().to_owned()))
            .collect();
        self.listening.retain(|name, _| wanted.contains(name));
        for key in self.seen.keys() {
            let Ok(lock) = core.lock(key) else { continue };
            if self.listening.contains_key(lock.name()) {
                continue;
            }
            let watching = core.wakeups.watch(lock.name(), self.tell.clone());
            let _ = tokio::time::timeout(core.timeouts.response, core.store.listen(&lock)).await;
            self.listening
                .insert(lock.name().to_owned(), (key.clone(), watching));
        }
    }
}

/// What changed between two looks, key by key in key order.
fn changes(before: &BTreeMap<String, LockView>, now: &BTreeMap<String, LockView>) -> Vec<Event> {
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
    mode: HolderMode,
    /// Given back, kept until its minimum hold ends.
    released: bool,
    remaining: Option<Duration>,
}

/// How a holder holds a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HolderMode {
    /// Alone.
    Exclusive,
    /// A read share.
    Shared,
    /// One permit of a semaphore: this one.
    Permit(u32),
    /// A value this library did not write, of this kind.
    Foreign(String),
}

impl HolderMode {
    /// `exclusive`, `shared` or `foreign`.
    pub fn name(&self) -> &'static str {
        match self {
            HolderMode::Exclusive => "exclusive",
            HolderMode::Shared => "shared",
            HolderMode::Permit(_) => "permit",
            HolderMode::Foreign(_) => "foreign",
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
            id: value.strip_suffix(RELEASED).unwrap_or(value).to_owned(),
            owner: Some(owner.clone()),
            mode: HolderMode::Exclusive,
            released: *released,
            remaining: view.remaining,
        }],
        Holding::Shared { readers } => readers
            .iter()
            .map(|r| Sighting {
                id: r.value.clone(),
                owner: Some(r.owner.clone()),
                mode: HolderMode::Shared,
                released: false,
                remaining: Some(r.remaining),
            })
            .collect(),
        Holding::Permits { holders, .. } => holders
            .iter()
            .map(|h| Sighting {
                id: h.value.strip_suffix(RELEASED).unwrap_or(&h.value).to_owned(),
                owner: Some(h.owner.clone()),
                mode: HolderMode::Permit(h.permit.unwrap_or_default()),
                released: h.value.ends_with(RELEASED),
                remaining: Some(h.remaining),
            })
            .collect(),
        Holding::Foreign { kind, value } => vec![Sighting {
            id: format!("{kind} {}", value.as_deref().unwrap_or_default()),
            owner: None,
            mode: HolderMode::Foreign(kind.clone()),
            released: false,
            remaining: view.remaining,
        }],
    }
}

/// What changed at one key. `announced`: the look follows a release the store announced.
fn key_changes(key: &str, before: Option<&LockView>, now: Option<&LockView>, announced: bool) -> Vec<Event> {
    let old = before.map(sightings).unwrap_or_default();
    let new = now.map(sightings).unwrap_or_default();
    let gone: Vec<&Sighting> = old.iter().filter(|o| !new.iter().any(|n| n.id == o.id)).collect();
    let came: Vec<&Sighting> = new.iter().filter(|n| !old.iter().any(|o| o.id == n.id)).collect();
    let event = |what, holder: &Sighting| Event::new(key, what, holder, announced);
    let mut events: Vec<Event> = new
        .iter()
        .filter(|n| n.released && old.iter().any(|o| o.id == n.id && !o.released))
        .map(|n| event(EventKind::Released, n))
        .collect();
    if let ([old_holder], [new_holder]) = (gone.as_slice(), came.as_slice()) {
        let exclusive = old_holder.mode == HolderMode::Exclusive && new_holder.mode == HolderMode::Exclusive;
        if exclusive && !old_holder.released && !announced {
            let mut taken = event(EventKind::TakenOver, new_holder);
            taken.previous_owner.clone_from(&old_holder.owner);
            events.push(taken);
            return events;
        }
    }
    let read_at = before.map_or_else(Instant::now, |v| v.read_at);
    for holder in gone {
        let lapsed = holder.released || (!announced && ran_out(read_at, holder.remaining));
        events.push(event(
            if lapsed {
                EventKind::Expired
            } else {
                EventKind::Released
            },
            holder,
        ));
    }
    for holder in came {
        events.push(event(EventKind::Acquired, holder));
        if holder.released {
            events.push(event(EventKind::Released, holder));
        }
    }
    events
}

/// Whether a lease read at `read_at` has run out by now.
fn ran_out(read_at: Instant, remaining: Option<Duration>) -> bool {
    remaining.is_some_and(|left| Instant::now() + EXPIRY_SLACK >= read_at + left)
}

/// One change at one lock.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Event {
    /// When it was seen.
    pub at: SystemTime,
    /// The lock's key.
    pub key: String,
    /// What happened.
    pub kind: EventKind,
    /// How the holder it concerns holds (held) the lock.
    pub mode: HolderMode,
    /// That holder's owner label (`None` for a foreign value).
    pub owner: Option<String>,
    /// For a take-over: who held it before.
    pub previous_owner: Option<String>,
    /// The look followed a release the store announced.
    pub announced: bool,
    released: bool,
    remaining: Option<Duration>,
}

/// What happened to a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventKind {
    /// Taken.
    Acquired,
    /// Given back (freed, or kept for its minimum hold: see [`Event::kept`]).
    Released,
    /// Its lease ran out (or its minimum hold ended).
    Expired,
    /// Another holder has it, and the last look saw the previous one still holding it.
    TakenOver,
}

impl EventKind {
    /// `acquired`, `released`, `expired`, `taken_over`.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Acquired => "acquired",
            EventKind::Released => "released",
            EventKind::Expired => "expired",
            EventKind::TakenOver => "taken_over",
        }
    }
}

impl Event {
    fn new(key: &str, kind: EventKind, holder: &Sighting, announced: bool) -> Event {
        Event {
            at: SystemTime::now(),
            key: key.to_owned(),
            kind,
            mode: holder.mode.clone(),
            owner: holder.owner.clone(),
            previous_owner: None,
            announced,
            released: holder.released,
            remaining: holder.remaining,
        }
    }

    /// Released but kept for a minimum hold: how long is left of it.
    pub fn kept(&self) -> Option<Duration> {
        (self.kind == EventKind::Released && self.released)
            .then_some(self.remaining)
            .flatten()
    }

    /// The new holder's lease, for an acquisition or take-over.
    pub fn lease(&self) -> Option<Duration> {
        matches!(self.kind, EventKind::Acquired | EventKind::TakenOver)
            .then_some(self.remaining)
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{Fence, Reader};

    fn view(key: &str, holding: Holding, ttl_ms: u64) -> LockView {
        let mut view = LockView::free(key, &format!("lock:{{{key}}}"));
        view.holding = holding;
        view.remaining = Some(Duration::from_millis(ttl_ms));
        view.fence = Fence::None;
        view
    }

    fn held(owner: &str, n: u8, released: bool) -> Holding {
        let token = format!("{:032x} {owner}", n);
        Holding::Exclusive {
            value: if released {
                format!("{token}{RELEASED}")
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
            .map(|e| (e.kind.name(), e.owner.as_deref()))
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
        assert_eq!(held_back[0].kept(), Some(Duration::from_secs(5)));
        assert_eq!(
            names(&key_changes("k", Some(&kept), None, false)),
            [("expired", Some("a"))]
        );
        assert!(key_changes("k", Some(&a), Some(&a), false).is_empty());
    }

    #[test]
    fn readers_come_and_go_one_by_one() {
        let reader = |owner: &str, n: u8| Reader::of(&format!("{:032x} {owner}", n), Duration::from_secs(10));
        let shared = |readers: Vec<Reader>| view("k", Holding::shared(readers), 10_000);
        let one = shared(vec![reader("r1", 1)]);
        let two = shared(vec![reader("r1", 1), reader("r2", 2)]);
        let other = shared(vec![reader("r2", 2)]);
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
