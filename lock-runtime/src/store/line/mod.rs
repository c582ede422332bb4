//! What the queue stores (etcd, ZooKeeper) share: each store keeps a place in a lock's line for
//! each of its callers (a key on a session lease, an ephemeral sequential node), and this client
//! deletes a held place when its holder's validity ends, as Redis expires a key at its ttl.
//! [`Book`] is that bookkeeping, the same for both: the places by token, when each held one is
//! due, the reaper's pick and the keeper's wait. What a place is, and how it is deleted, is the
//! store's.

pub(crate) mod sessions;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::store::{Flight, Kind, Release, Released, Renewal, Renewing};
use crate::LockError;

/// How often the keeper looks at least (for sessions and places due later than it was told).
pub(crate) const KEEPER_TICK: Duration = Duration::from_secs(1);

/// A place that could not be deleted is tried again this soon.
const RETRY: Duration = Duration::from_millis(100);

/// One of this client's places, as the [`Book`] keeps it: what the store knows of it (`of`,
/// reached through `Deref`), and how long it is held.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Placed<P> {
    /// What the store knows of the place (its key or node, its session, …).
    pub(crate) of: P,
    /// Held: deleted then unless renewed. `None`: a waiter's place, kept as long as the client.
    pub(crate) until: Option<Instant>,
    /// Given back, and kept for its minimum hold.
    pub(crate) kept: bool,
}

impl<P> Placed<P> {
    /// A waiter's place.
    pub(crate) fn waiting(of: P) -> Self {
        Placed {
            of,
            until: None,
            kept: false,
        }
    }

    /// A holder's place, deleted at `until` unless renewed.
    pub(crate) fn held(of: P, until: Instant) -> Self {
        Placed {
            of,
            until: Some(until),
            kept: false,
        }
    }

    /// A place given back and kept for its minimum hold, until `until`.
    pub(crate) fn kept_until(of: P, until: Instant) -> Self {
        Placed {
            of,
            until: Some(until),
            kept: true,
        }
    }

    /// Held, and not given back: what a renewal renews.
    pub(crate) fn holds(&self) -> bool {
        self.until.is_some() && !self.kept
    }
}

impl<P> std::ops::Deref for Placed<P> {
    type Target = P;

    fn deref(&self) -> &P {
        &self.of
    }
}

impl<P> std::ops::DerefMut for Placed<P> {
    fn deref_mut(&mut self) -> &mut P {
        &mut self.of
    }
}

/// A queue store's side of the steps every such store takes the same way: the store says how
/// it deletes, marks and watches one of its places ([`delete`](Line::delete),
/// [`mark_released`](Line::mark_released), [`unwatch`](Line::unwatch), …); the release, the
/// minimum hold, the reaper and a waiter's leaving are the same for each.
pub(crate) trait Line: Send + Sync {
    /// What the store knows of one of its places.
    type Place: Send;

    /// The store's name, for logs.
    const STORE: &'static str;

    /// This client's places.
    fn book(&self) -> &Book<Self::Place>;

    /// Deletes `place` if it is still the one this client put: whether it was there.
    fn delete(&self, place: &Self::Place) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// Marks `token`'s `place`, given back before its minimum hold's end, released, kept at
    /// least `hold_ms` by the store even if this client dies (on a lease of that long, say):
    /// the place as it is now, or `None` if it was no longer there.
    fn mark_released(
        &self,
        token: &str,
        place: &Self::Place,
        hold_ms: u64,
    ) -> impl Future<Output = Result<Option<Self::Place>, LockError>> + Send;

    /// Stops `token`'s watch of the place ahead of its own, if it has one.
    fn unwatch(&self, token: &str);

    /// The release of `token`'s lock: its watch stopped, then what an attempt whose answer
    /// never came may have put deleted by the store (`unknown`, told the route that attempt
    /// took: a semaphore's, always, as its permit is not named by its token; a lock's, when
    /// this client knows no place of it), or the place this client knows given back
    /// ([`give_back`](Line::give_back)).
    fn release<'a, F>(
        &self,
        token: &str,
        release: &Release<'a>,
        unknown: impl FnOnce(&'a Flight) -> F + Send,
    ) -> impl Future<Output = Result<Released, LockError>> + Send
    where
        F: Future<Output = Result<Released, LockError>> + Send,
    {
        async move {
            self.unwatch(token);
            let place = self.book().forget(token);
            match (release.after, place) {
                (Some(flight), _) if release.kind == Kind::Permit => unknown(flight).await,
                (Some(flight), None) => unknown(flight).await,
                (None, None) => Ok(Released::NotOurs),
                (_, Some(place)) => self.give_back(token, place, release.hold_ms).await,
            }
        }
    }

    /// `place`'s deletion, for its release, failed with `error`: what the store does with it
    /// (it is not known to be gone).
    fn not_released(&self, token: &str, place: Placed<Self::Place>, error: &LockError);

    /// Gives `token`'s `place` back (taken out of the book by the caller): one kept for its
    /// minimum hold stays so; one given back before that hold's end is marked released and
    /// kept `hold_ms` longer (counted from the store's answer), then deleted (not marked, it
    /// goes back to the book as it was: deleted at its holder's validity's end); anything else
    /// is deleted, and its waiters hear of it through their watches.
    fn give_back(
        &self,
        token: &str,
        place: Placed<Self::Place>,
        hold_ms: u64,
    ) -> impl Future<Output = Result<Released, LockError>> + Send {
        async move {
            if place.kept {
                self.book().record(token, place);
                return Ok(Released::NotOurs);
            }
            if hold_ms > 0 && place.until.is_some() {
                return match self.mark_released(token, &place.of, hold_ms).await {
                    Ok(Some(kept)) => {
                        let until = Instant::now() + Duration::from_millis(hold_ms);
                        self.book().record(token, Placed::kept_until(kept, until));
                        Ok(Released::Quiet)
                    }
                    Ok(None) => Ok(Released::NotOurs),
                    Err(e) => {
                        self.book().record(token, place);
                        Err(e)
                    }
                };
            }
            match self.delete(&place.of).await {
                Ok(true) => Ok(Released::Quiet),
                Ok(false) => Ok(Released::NotOurs),
                Err(e) => {
                    self.not_released(token, place, &e);
                    Err(e)
                }
            }
        }
    }

    /// Deletes the places whose time is up (their holders' validity ended), as Redis expires a
    /// key at its ttl; one that cannot be deleted now is tried again soon.
    fn reap(&self) -> impl Future<Output = ()> + Send {
        async move {
            for (token, place) in self.book().ended(Instant::now()) {
                if let Err(e) = self.delete(&place.of).await {
                    self.book().not_deleted(&token, place.of, &e, Self::STORE);
                }
            }
        }
    }

    /// When the store's own upkeep (a session to renew, or to close when idle) is next due, if
    /// it has any.
    fn upkeep_due(&self) -> Option<Instant>;

    /// The store's upkeep at a due time, the reaper's round ([`reap`](Line::reap)) among it.
    fn upkeep(&self) -> impl Future<Output = ()> + Send;

    /// The keeper: the store's upkeep whenever it or a place is due, until the client goes.
    fn keep(self: std::sync::Arc<Self>) -> impl Future<Output = ()> + Send
    where
        Self: Sized,
    {
        async move {
            loop {
                if self.book().due_now(self.upkeep_due()).await {
                    self.upkeep().await;
                }
            }
        }
    }

    /// Takes `token`'s place out of its line (a waiter that stops waiting), its watch stopped. A
    /// place that could not be deleted would be kept by its session as long as this client
    /// lives, holding the line back: the reaper deletes it, trying again until it is.
    fn leave(&self, token: &str) -> impl Future<Output = Result<(), LockError>> + Send {
        async move {
            self.unwatch(token);
            if let Some(place) = self.book().forget(token) {
                if let Err(e) = self.delete(&place.of).await {
                    self.book().delete_soon(token, place.of);
                    return Err(e);
                }
            }
            Ok(())
        }
    }
}

/// This client's places in line, by their callers' tokens, and when each held one is due to be
/// deleted.
#[derive(Debug)]
pub(crate) struct Book<P> {
    places: Mutex<HashMap<String, Placed<P>>>,
    /// When places are due to be deleted, by token (see [`Placed::until`]).
    due: Mutex<BTreeSet<(Instant, String)>>,
    /// Told when something became due sooner than the keeper's next look.
    changed: Notify,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is one step, so a poisoned map is still consistent.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl<P> Default for Book<P> {
    fn default() -> Self {
        Book {
            places: Mutex::new(HashMap::new()),
            due: Mutex::new(BTreeSet::new()),
            changed: Notify::new(),
        }
    }
}

impl<P> Book<P> {
    /// The places, by token (one step at a time: the lock is not held across an await).
    pub(crate) fn places(&self) -> MutexGuard<'_, HashMap<String, Placed<P>>> {
        locked(&self.places)
    }

    /// Records `token`'s place (a held one is deleted at its `until` unless renewed).
    pub(crate) fn record(&self, token: &str, place: Placed<P>) {
        if let Some(until) = place.until {
            self.delete_at(token, until);
        }
        self.places().insert(token.to_owned(), place);
    }

    /// Takes `token`'s place out of this client's records (and out of the reaper's).
    pub(crate) fn forget(&self, token: &str) -> Option<Placed<P>> {
        let place = self.places().remove(token)?;
        if let Some(until) = place.until {
            locked(&self.due).remove(&(until, token.to_owned()));
        }
        Some(place)
    }

    /// Deletes `token`'s place at `until` unless it is renewed by then. The keeper looks at
    /// least every [`KEEPER_TICK`], so it is told only of what is due sooner (an acquire costs
    /// no wake-up of its task).
    pub(crate) fn delete_at(&self, token: &str, until: Instant) {
        locked(&self.due).insert((until, token.to_owned()));
        if until < Instant::now() + KEEPER_TICK {
            self.changed.notify_one();
        }
    }

    /// Notes what a renewal found of each of `locks` (the `at`th sent at `sent_at(at)`): a
    /// renewed place is held its ttl from then (never shortened, as `PEXPIRE … GT` on Redis), a
    /// gone one forgotten.
    pub(crate) fn renewed(
        &self,
        locks: &[Renewing<'_>],
        found: &[Renewal],
        sent_at: impl Fn(usize) -> Instant,
    ) {
        let mut places = self.places();
        for (at, ((_, token, ttl_ms), found)) in locks.iter().zip(found).enumerate() {
            match found {
                Renewal::Renewed { .. } => {
                    let until = sent_at(at) + Duration::from_millis(*ttl_ms);
                    if let Some(place) = places.get_mut(*token) {
                        place.until = place.until.map(|was| was.max(until));
                    }
                }
                Renewal::Gone => {
                    places.remove(*token);
                }
                _ => {}
            }
        }
    }

    /// The places whose time is up at `now`, taken out of the records (for the store to
    /// delete). A place renewed since it was put in the queue is put back at its new time.
    pub(crate) fn ended(&self, now: Instant) -> Vec<(String, Placed<P>)> {
        let mut due = Vec::new();
        {
            let mut queue = locked(&self.due);
            while queue.first().is_some_and(|(at, _)| *at <= now) {
                if let Some((_, token)) = queue.pop_first() {
                    due.push(token);
                }
            }
        }
        let mut ended = Vec::new();
        let mut places = self.places();
        for token in due {
            match places.get(&token).and_then(|p| p.until) {
                Some(until) if until <= now => {
                    if let Some(place) = places.remove(&token) {
                        ended.push((token, place));
                    }
                }
                Some(until) => {
                    locked(&self.due).insert((until, token));
                }
                None => {}
            }
        }
        ended
    }

    /// `place` could not be deleted (`error`): the reaper tries again soon, and again, until it
    /// is, or its session ends it. A store that refuses the deletion (the client lost the right)
    /// would refuse it again: the place is left to its session, with a warning.
    pub(crate) fn not_deleted(&self, token: &str, place: P, error: &LockError, store: &str) {
        if matches!(error, LockError::Refused { .. }) {
            tracing::warn!(%error, store, "the store refuses to delete a lock's place in line: it stays until its session ends");
            return;
        }
        tracing::debug!(%error, store, "could not delete a lock's place in line; trying again");
        self.delete_soon(token, place);
    }

    /// `place` could not be deleted: the reaper tries again soon (a place lives as long as its
    /// session: this client).
    pub(crate) fn delete_soon(&self, token: &str, place: P) {
        let again = Instant::now() + RETRY;
        self.places()
            .entry(token.to_owned())
            .or_insert_with(|| Placed::held(place, again));
        self.delete_at(token, again);
    }

    /// Wakes the keeper now (it has something new to look after: a session, say).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // etcd's new session lease
    pub(crate) fn wake_keeper(&self) {
        self.changed.notify_one();
    }

    /// Whether a place is due now, or else `also` (the store's own next task, a session's
    /// renewal say) is: if neither, waits until the sooner of them, the next tick, or a place
    /// due sooner, and answers `false` (the keeper then asks again).
    pub(crate) async fn due_now(&self, also: Option<Instant>) -> bool {
        let next = [also, locked(&self.due).first().map(|(at, _)| *at)]
            .into_iter()
            .flatten()
            .min();
        let now = Instant::now();
        match next {
            Some(at) if at <= now => true,
            next => {
                let at = next.map_or(now + KEEPER_TICK, |at| at.min(now + KEEPER_TICK));
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = self.changed.notified() => {}
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn held_places_end_at_their_time_and_waiters_never() {
        let book = Book::default();
        let now = Instant::now();
        book.record("a", Placed::held((), now + Duration::from_millis(10)));
        book.record("b", Placed::held((), now + Duration::from_millis(20)));
        book.record("waiter", Placed::waiting(()));
        assert!(book.ended(now).is_empty());
        let ended = book.ended(now + Duration::from_millis(15));
        assert_eq!(
            ended,
            vec![("a".to_owned(), Placed::held((), now + Duration::from_millis(10)))]
        );
        // Renewed: put back at its new time, not ended.
        book.places()
            .insert("b".into(), Placed::held((), now + Duration::from_millis(40)));
        assert!(book.ended(now + Duration::from_millis(25)).is_empty());
        assert_eq!(book.ended(now + Duration::from_millis(40)).len(), 1);
        assert!(book.ended(now + Duration::from_secs(3600)).is_empty());
        assert!(book.places().contains_key("waiter"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_forgotten_place_is_not_reaped() {
        let book = Book::default();
        let now = Instant::now();
        book.record("a", Placed::held((), now));
        assert_eq!(book.forget("a"), Some(Placed::held((), now)));
        assert!(book.ended(now + Duration::from_secs(1)).is_empty());
        assert!(book.forget("a").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_place_not_deleted_is_tried_again_soon_unless_refused() {
        let book = Book::default();
        let now = Instant::now();
        let unavailable = LockError::unavailable("down");
        book.not_deleted("a", (), &unavailable, "test");
        assert_eq!(book.places().get("a"), Some(&Placed::held((), now + RETRY)));
        assert_eq!(book.ended(now + RETRY).len(), 1);
        let refused = LockError::Refused {
            reason: "no right",
            source: "denied".into(),
        };
        book.not_deleted("b", (), &refused, "test");
        assert!(book.places().get("b").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_keeper_wakes_for_what_is_due_sooner_than_its_tick() {
        let book = std::sync::Arc::new(Book::default());
        let start = Instant::now();
        // Nothing due: it sleeps a tick.
        assert!(!book.due_now(None).await);
        assert_eq!(Instant::now() - start, KEEPER_TICK);
        // Something due sooner than the tick, recorded while it sleeps: it wakes for it.
        let keeper = {
            let book = std::sync::Arc::clone(&book);
            tokio::spawn(async move { book.due_now(None).await })
        };
        tokio::task::yield_now().await;
        let soon = Instant::now() + Duration::from_millis(5);
        book.record("a", Placed::held((), soon));
        assert!(!keeper.await.unwrap());
        assert!(Instant::now() < soon + KEEPER_TICK / 2);
        tokio::time::sleep_until(soon).await;
        assert!(book.due_now(None).await);
        // The store's own next task counts too.
        assert!(book.due_now(Some(Instant::now())).await);
    }

    /// A place with a hold, and a store whose deletion answers as told, recording what it was
    /// asked.
    #[derive(Default)]
    struct Told {
        book: Book<()>,
        /// What the next deletion answers: `Some(found)`, or `None` for an unavailable store.
        answer: Mutex<Option<bool>>,
        asked: Mutex<Vec<&'static str>>,
        /// When its own upkeep is due (`None`: never).
        upkeep_at: Mutex<Option<Instant>>,
    }

    impl Line for Told {
        type Place = ();
        const STORE: &'static str = "test";

        fn book(&self) -> &Book<()> {
            &self.book
        }

        async fn delete(&self, _: &()) -> Result<bool, LockError> {
            locked(&self.asked).push("delete");
            locked(&self.answer).ok_or_else(|| LockError::unavailable("down"))
        }

        /// Answers after 50 ms, so that what counts from its answer can be told from what
        /// counts from its request.
        async fn mark_released(&self, _: &str, _: &(), hold_ms: u64) -> Result<Option<()>, LockError> {
            assert_eq!(hold_ms, 250);
            locked(&self.asked).push("mark_released");
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(Some(()))
        }

        fn unwatch(&self, _: &str) {
            locked(&self.asked).push("unwatch");
        }

        fn not_released(&self, _: &str, _: Placed<()>, _: &LockError) {
            locked(&self.asked).push("not_released");
        }

        fn upkeep_due(&self) -> Option<Instant> {
            *locked(&self.upkeep_at)
        }

        /// Its own upkeep done, it is not due again (as a store's renewed session is not).
        async fn upkeep(&self) {
            locked(&self.asked).push("upkeep");
            locked(&self.upkeep_at).take_if(|at| *at <= Instant::now());
            self.reap().await;
        }
    }

    /// The keeper runs the store's upkeep when a held place's time is up (the reaper then deletes
    /// it) and when the store's own upkeep is due, with no place due; never before either.
    #[tokio::test(start_paused = true)]
    async fn the_keeper_runs_the_upkeep_when_a_place_or_the_store_is_due() {
        let line = std::sync::Arc::new(Told::default());
        *locked(&line.answer) = Some(true);
        let start = Instant::now();
        line.book
            .record("held", Placed::held((), start + Duration::from_secs(5)));
        let keeper = tokio::spawn(line.clone().keep());
        let asked = |line: &Told| locked(&line.asked).clone();
        let deadline = start + Duration::from_secs(30);
        while !asked(&line).contains(&"delete") {
            assert!(
                Instant::now() < deadline,
                "the keeper never deleted the place: {:?}",
                asked(&line)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            Instant::now() >= start + Duration::from_secs(5),
            "deleted before its time"
        );
        assert_eq!(asked(&line), ["upkeep", "delete"]);
        assert!(!line.book.places().contains_key("held"));
        // Nothing held: the store's own upkeep, when it says it is due.
        let due = Instant::now() + Duration::from_secs(7);
        *locked(&line.upkeep_at) = Some(due);
        while asked(&line).len() < 3 {
            assert!(
                Instant::now() < deadline + Duration::from_secs(30),
                "no upkeep: {:?}",
                asked(&line)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(Instant::now() >= due, "upkeep before it was due");
        assert_eq!(asked(&line)[2], "upkeep");
        keeper.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_place_given_back_is_kept_held_longer_or_deleted() {
        let line = Told::default();
        let now = Instant::now();
        let held = |kept| Placed {
            of: (),
            until: Some(now + Duration::from_secs(1)),
            kept,
        };
        // Kept for its minimum hold already: it stays, and the reaper deletes it at its end.
        assert_eq!(
            line.give_back("kept", held(true), 0).await.unwrap(),
            Released::NotOurs
        );
        assert!(line.book.places().contains_key("kept"));
        assert_eq!(line.book.ended(now + Duration::from_secs(1)).len(), 1);
        // Given back before its minimum hold's end: kept that much longer, not deleted.
        assert_eq!(
            line.give_back("early", held(false), 250).await.unwrap(),
            Released::Quiet
        );
        // Else deleted: whether it was there says whether it was ours.
        *locked(&line.answer) = Some(true);
        assert_eq!(
            line.give_back("a", held(false), 0).await.unwrap(),
            Released::Quiet
        );
        *locked(&line.answer) = Some(false);
        assert_eq!(
            line.give_back("b", held(false), 0).await.unwrap(),
            Released::NotOurs
        );
        // A deletion that failed is the store's to follow up.
        *locked(&line.answer) = None;
        assert!(line.give_back("c", held(false), 0).await.is_err());
        assert_eq!(
            *locked(&line.asked),
            ["mark_released", "delete", "delete", "delete", "not_released"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_leaves_and_could_not_be_deleted_is_reaped_soon() {
        let line = Told::default();
        line.book.record("waiter", Placed::waiting(()));
        assert!(line.leave("waiter").await.is_err());
        let again = Instant::now() + RETRY;
        assert_eq!(line.book.ended(again).len(), 1);
        // Left (deleted): nothing of it stays.
        line.book.record("other", Placed::waiting(()));
        *locked(&line.answer) = Some(true);
        line.leave("other").await.unwrap();
        assert!(line.book.places().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_gives_back_the_known_place_or_looks_for_an_unknown_one() {
        let line = Told::default();
        *locked(&line.answer) = Some(true);
        let flight = Flight::default();
        let release = |kind, after| Release {
            hold_ms: 0,
            kind,
            after,
        };
        let unknown = |_: &Flight| async {
            locked(&line.asked).push("unknown");
            Ok(Released::Freed)
        };
        let (plain, plain_abandoned, permit_abandoned) = (
            release(Kind::Plain, None),
            release(Kind::Plain, Some(&flight)),
            release(Kind::Permit, Some(&flight)),
        );
        // Known and answered: given back (deleted).
        line.book.record("a", Placed::held((), Instant::now()));
        let given = line.release("a", &plain, unknown);
        assert_eq!(given.await.unwrap(), Released::Quiet);
        // Not known: not ours, unless an attempt's answer never came.
        let given = line.release("b", &plain, unknown);
        assert_eq!(given.await.unwrap(), Released::NotOurs);
        let given = line.release("b", &plain_abandoned, unknown);
        assert_eq!(given.await.unwrap(), Released::Freed);
        // A semaphore's abandoned attempt is looked for even with a place known (its queue
        // place), and that place is forgotten.
        line.book.record("c", Placed::waiting(()));
        let given = line.release("c", &permit_abandoned, unknown);
        assert_eq!(given.await.unwrap(), Released::Freed);
        assert!(line.book.places().is_empty());
        assert_eq!(
            *locked(&line.asked),
            ["unwatch", "delete", "unwatch", "unwatch", "unknown", "unwatch", "unknown"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_place_kept_for_its_hold_is_deleted_when_the_hold_ends() {
        let line = Told::default();
        let asked = Instant::now();
        let held = Placed::held((), asked + Duration::from_secs(30));
        let kept = line.give_back("a", held, 250).await.unwrap();
        assert_eq!(kept, Released::Quiet);
        // Counted from the store's answer, 50 ms after the request.
        let hold_end = asked + Duration::from_millis(50 + 250);
        assert_eq!(
            line.book.places().get("a").map(|p| (p.until, p.kept)),
            Some((Some(hold_end), true))
        );
        assert_eq!(line.book.ended(hold_end).len(), 1);
    }
}
