//! The wait loop: one acquire call, from its first attempt to a guard or an error. It attempts,
//! listens for releases when refused, sleeps until woken or until the holder's expiry, keeps a
//! fair waiter's place or a waiting writer's claim, takes a lock a fair release handed over, and
//! gives back what an abandoned call may have taken. The same for every store.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::core::{give_back, release_in_background, Abandoned, Core};
use crate::error::ShutDown;
use crate::guard::LockGuard;
use crate::state::LockState;
use crate::store::{
    lease_granted, Ask, Asked, Attempt, Capabilities, Flight, Kind, Lock, Mode, Release, SetAsk, SetAttempt,
    Waking,
};
use crate::telemetry::{self, Labels};
use crate::wakeups::Registration;
use crate::{LockError, LockOptions, FAIR_PLACE_KEPT};

/// The longest a waiter sleeps between attempts: it is woken by the holder's release, or at the
/// holder's expiry, and at the latest after this, in case a release message was missed.
pub const MAX_WAIT_NAP: Duration = Duration::from_secs(2);

/// One acquire call on a checked key.
pub(crate) struct Acquire<'a> {
    pub(crate) core: &'a Arc<Core>,
    /// The key as the caller gave it.
    pub(crate) key: &'a str,
    /// The lock, named by the store.
    pub(crate) lock: Lock,
    pub(crate) options: &'a LockOptions,
}

impl Acquire<'_> {
    /// Attempts until the lock is taken or the wait runs out. The steps are [`Call`]'s, in the
    /// order they run: the wait before an attempt ([`Call::wait_plan`]), a lock a fair release
    /// handed over ([`Call::handed`]), the attempt ([`Call::ask`]), and what its answer means
    /// ([`Call::hold`], [`Call::refused`]). Every way out goes through [`Call::outcome`], which
    /// records it. The awaits are all here, in one plain fn: a wrapping `async fn` would nest
    /// this future one level deeper in every caller's, and deep futures overflow rustc's layout
    /// query limit.
    pub(crate) async fn run(self) -> Result<LockGuard, LockError> {
        let Acquire {
            core,
            key,
            lock,
            options,
        } = self;
        let mut call = Call::new(core, key, &lock, options);
        let backend = &*core.store;
        loop {
            if let Some(wait) = call.wait_plan() {
                let listened = tokio::time::timeout_at(wait.listen_until, backend.listen(&lock)).await;
                if listened.is_err() && wait.listen_until < call.deadline {
                    call.napped(); // no release reached it
                }
                if let (Some(nap_end), Some(wakeup)) = (wait.sleep_until, call.wakeup.as_ref()) {
                    tokio::select! {
                        () = wakeup.woken() => {}
                        () = tokio::time::sleep_until(nap_end) => {
                            if nap_end < call.deadline {
                                call.napped(); // no wake-up came
                            }
                        }
                    }
                }
            }
            let handed = call.handed();
            // Counted before the check, so shutdown either refuses this attempt or waits for it
            // (until its lock, if it takes one, is registered). A lock handed over is given back
            // as the place is dropped.
            let in_flight = core.held.acquiring();
            if core.held.is_closed() {
                return call.outcome(Err(LockError::unavailable(ShutDown)));
            }
            // The lock's validity counts from `valid_from` for `lease`: when the attempt that
            // took it was sent, for its ttl; for a lock handed over, when the attempt whose place
            // it was handed over for was sent, for what was left of that place.
            let (attempt, started, (valid_from, lease)) = if let Some(handed) = handed {
                call.handed_over(handed)
            } else {
                let ask = call.ask();
                let first = call.at_once.take();
                let started = first.unwrap_or_else(Instant::now);
                let pending = PendingAcquire::new(core, &lock, &call.token, (&ask, call.kind));
                let answer = backend
                    .attempt(Asked::new(&lock, &call.token, &ask), &pending.flight)
                    .await;
                call.deciding = Decided {
                    attempt: started.elapsed(),
                    at_once: first.is_some(),
                };
                match answer {
                    Ok(answer) => {
                        pending.settled();
                        let lease = call.lease_of(&answer, started);
                        (answer, started, (started, lease))
                    }
                    Err(e) => return call.outcome(Err(e)), // `pending` releases in the background as it drops
                }
            };
            match attempt {
                Attempt::Acquired { fence, permit, .. } => {
                    let guard = call.hold(lock, (fence, permit), started, (valid_from, lease));
                    drop(in_flight); // registered: shutdown will find it
                    return call.outcome(Ok(guard));
                }
                Attempt::Held {
                    pttl_ms,
                    behind,
                    claimed,
                    kept,
                } => {
                    if let Err(busy) = call.refused(&lock, (pttl_ms, behind, claimed, kept), started) {
                        return call.outcome(Err(busy));
                    }
                }
                Attempt::NotReplicated { acked, wanted } => {
                    // Given back by the backend already.
                    let refused = LockError::NotReplicated {
                        key: key.to_owned(),
                        acked,
                        wanted,
                    };
                    return call.outcome(Err(refused));
                }
            }
        }
    }
}

/// How a call waits, fixed as it begins (from its options and its store's capabilities).
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// It has a wait (else one attempt decides it).
    will_wait: bool,
    /// What it asks to hold, and how waiters take turns.
    mode: Mode,
    /// A waiting call whose store queues every waiter (etcd, ZooKeeper): its first attempt
    /// takes its place in line, and the store wakes it by its token when the one ahead goes.
    queues: bool,
    /// A waiting call whose store does not carry another client's release to it (MySQL): it
    /// polls on a backoff.
    polls: bool,
    /// A fair waiter of a store that does not queue everyone: registered before its first
    /// attempt (its wake-up, or a lock handed over to it, may come as soon as that attempt took
    /// its place, before its answer is read); it listens only once refused.
    fair_early: bool,
}

/// The wait before an attempt: listen for releases until `listen_until`, then sleep until
/// woken or until `sleep_until` (if set).
struct Wait {
    listen_until: Instant,
    sleep_until: Option<Instant>,
}

/// One acquire call under way: how it waits ([`Shape`]), and where its wait stands (changed by
/// each refusal).
struct Call<'a> {
    core: &'a Arc<Core>,
    key: &'a str,
    options: &'a LockOptions,
    capabilities: Capabilities,
    shape: Shape,
    /// Which release the lock needs (derived here only).
    kind: Kind,
    called: Instant,
    deadline: Instant,
    /// One token for every attempt of this call: it is also a fair waiter's place in line.
    token: String,
    /// How long the attempt that decided the call took, and whether the call made it at once.
    deciding: Decided,
    /// An attempt made at once is sent as the call began (as far as a lock's validity, which
    /// counts from the send, can tell): one clock read fewer on the common path.
    at_once: Option<Instant>,
    /// Its registration for wake-ups (declared before `place`: dropped first, as it leaves).
    wakeup: Option<Registration>,
    /// A fair waiter's place in line, or a waiting writer's claim on a read-write lock: given
    /// up if the call ends without the lock.
    place: Option<QueuePlace>,
    claimed: bool,
    /// Until refused once, no holder's expiry is known.
    pttl_ms: Option<u64>,
    /// The place a fair waiter's last refused attempt kept (its stamp), and when that attempt
    /// was sent: a lock handed over for that place is valid from then.
    last_kept: Option<(u64, Instant)>,
    /// Sleep until woken before the next attempt.
    sleep_first: bool,
    /// Refusals counted for a polling waiter's backoff.
    refusals: u32,
    /// Whether the last refusal found this fair waiter behind others in line.
    was_behind: bool,
}

impl<'a> Call<'a> {
    #[inline]
    fn new(core: &'a Arc<Core>, key: &'a str, lock: &Lock, options: &'a LockOptions) -> Self {
        let called = Instant::now();
        let will_wait = !options.get_wait().is_zero();
        let mode = Mode::of(options);
        let (fair, semaphore) = (mode.fair(), mode.semaphore());
        let capabilities = core.store.capabilities();
        let (queues, polls) = match capabilities.waking {
            Waking::Queued { .. } => (will_wait, false),
            Waking::Polled => (false, will_wait),
            Waking::Announced { .. } => (false, false),
        };
        let shape = Shape {
            will_wait,
            mode,
            queues,
            polls,
            fair_early: fair && will_wait && !queues,
        };
        let kind = mode.kind();
        let token = crate::holder::new_value(&core.owner);
        let place = if queues {
            Some(QueuePlace::new(core, lock, &token))
        } else {
            (fair && will_wait).then(|| QueuePlace::new(core, lock, &token).fair(kind))
        };
        // Registered before the first attempt where the store queues, and for a fair waiter.
        let mut wakeup =
            (queues || shape.fair_early).then(|| core.wakeups.register_early(lock.name(), &token));
        // Local waiters queue in order: a newcomer that would wait joins the end of the queue
        // instead of barging in ahead of waiters already there, and tries when woken. (A fair
        // waiter asks at once: its place in line is taken in the store.)
        let mut sleep_first = false;
        if will_wait && !fair && !queues && core.wakeups.queued(lock.name()) > 0 {
            wakeup = Some(core.wakeups.register(lock.name(), None));
            if semaphore {
                core.wakeups.spread(lock.name());
            }
            sleep_first = true;
        }
        Call {
            core,
            key,
            options,
            capabilities,
            shape,
            kind,
            called,
            deadline: called + options.get_wait(),
            token,
            deciding: Decided::default(),
            at_once: (!sleep_first).then_some(called),
            wakeup,
            place,
            claimed: false,
            pttl_ms: None,
            last_kept: None,
            sleep_first,
            refusals: 0,
            was_behind: false,
        }
    }

    /// Records how the call ended, and returns it. A call its first attempt decided took that
    /// attempt's time (one clock read fewer on the common path).
    #[inline]
    fn outcome(&self, result: Result<LockGuard, LockError>) -> Result<LockGuard, LockError> {
        let labels = Labels::new(self.shape.mode.shared(), self.key, self.core.metrics_key_class);
        let whole = if self.deciding.at_once {
            self.deciding.attempt
        } else {
            self.called.elapsed()
        };
        telemetry::acquire(&labels, telemetry::outcome(&result), self.deciding.attempt, whole);
        result
    }

    /// A wait that ended without a release or a wake-up reaching it.
    fn napped(&self) {
        telemetry::nap_ended(self.capabilities.name);
    }

    /// A fair waiter or a claiming writer keeps its place by asking again before it lapses (a
    /// place in a queueing store's line lasts as long as this client).
    fn keeps_place(&self) -> bool {
        (self.shape.mode.fair() || self.claimed) && !self.shape.queues
    }

    /// The wait before the next attempt, for a registered waiter (registered early: once in
    /// line). A waiter that keeps a place asks again by the end of its nap, however the
    /// subscriber fares (a subscription cut short goes on by itself); anyone else waits for it
    /// up to the own deadline.
    #[inline]
    fn wait_plan(&mut self) -> Option<Wait> {
        let fair_early = self.shape.fair_early;
        let wakeup = self.wakeup.as_ref().filter(|w| !fair_early || w.is_in_line())?;
        // No release of another client will wake it: the first of this client's waiters polls
        // on the backoff; the others wait for this client's releases (in arrival order).
        let polling_head = self.shape.polls && wakeup.is_head();
        let keeps_place = self.keeps_place();
        let sleep_first = std::mem::take(&mut self.sleep_first);
        let nap_end = (keeps_place || sleep_first).then(|| {
            let now = Instant::now();
            now + self
                .nap(polling_head, keeps_place)
                .min(self.deadline.saturating_duration_since(now))
        });
        Some(Wait {
            listen_until: nap_end.filter(|_| keeps_place).unwrap_or(self.deadline),
            sleep_until: nap_end.filter(|_| sleep_first),
        })
    }

    /// How long the next nap lasts, by how the waiter is woken.
    fn nap(&mut self, polling_head: bool, keeps_place: bool) -> Duration {
        let watched = self.shape.queues && self.capabilities.waking == Waking::Queued { watched: true };
        match (polling_head, watched) {
            (true, _) => nap(self.pttl_ms, keeps_place).min(poll_nap(&mut self.refusals, keeps_place)),
            // The store's watch wakes it: a nap is only a safety net.
            (_, true) => WATCHED_NAP.mul_f64(rand::random_range(0.85..=1.0)),
            _ => nap(self.pttl_ms, keeps_place),
        }
    }

    /// The lock a fair release handed this waiter, to hold without asking (fencing token,
    /// permit, and when the attempt that kept its place was sent): only when the hand-over was
    /// for the place its last attempt kept (one for an earlier place may have lapsed since, and
    /// gone to the next in line), with enough of that place's lease left to be worth holding
    /// (else asking extends it to the ttl). A fencing waiter the release could take no token
    /// for, and one whose locks replicas must acknowledge, ask instead: the lock is theirs
    /// already, if it still is.
    #[inline]
    fn handed(&self) -> Option<(u64, Option<u32>, Instant)> {
        let handed = self.wakeup.as_ref().and_then(Registration::handed_over)?;
        let (kept, sent) = self.last_kept?;
        let lease = self.place_lease();
        let usable = handed.kept == kept
            && Instant::now() + lease / 2 < sent + lease
            && !(self.options.is_fencing() && handed.fence == 0)
            && self.capabilities.waking == Waking::Announced { hands_over: true };
        usable.then_some((handed.fence, handed.permit, sent))
    }

    /// How long a fair waiter's place lasts after its attempt.
    fn place_lease(&self) -> Duration {
        FAIR_PLACE_KEPT.min(self.options.ttl())
    }

    /// The answer for a lock [`handed`](Self::handed) over: taken now, valid from the send of
    /// the attempt whose place it was, for what was left of that place.
    fn handed_over(
        &mut self,
        (fence, permit, sent): (u64, Option<u32>, Instant),
    ) -> (Attempt, Instant, (Instant, Duration)) {
        tracing::debug!(key = self.key, "lock handed over by a fair release");
        self.deciding = Decided::default(); // no request decided it
        let acquired = Attempt::Acquired {
            fence: self.options.is_fencing().then_some(fence),
            granted_until: None,
            permit,
        };
        (acquired, Instant::now(), (sent, self.place_lease()))
    }

    /// The next attempt's request.
    #[inline]
    fn ask(&self) -> Ask {
        let shape = self.shape;
        Ask {
            ttl_ms: self.options.ttl_ms(),
            fencing: self.options.is_fencing(),
            waiting: self
                .wakeup
                .as_ref()
                .is_some_and(|w| !shape.fair_early || w.is_in_line()),
            mode: shape.mode,
            join: shape.will_wait,
            claimed: self.claimed,
            wait_left: shape
                .will_wait
                .then(|| self.deadline.saturating_duration_since(Instant::now())),
        }
    }

    /// How long a lock `answer` took (sent at `started`) is valid: its ttl, or less where the
    /// store keeps it for less whatever happens to this client (etcd: its session lease was
    /// last renewed a while ago); renewed a third of the way there.
    #[inline]
    fn lease_of(&self, answer: &Attempt, started: Instant) -> Duration {
        match answer {
            Attempt::Acquired { granted_until, .. } => {
                lease_granted(*granted_until, started, self.options.ttl())
            }
            _ => self.options.ttl(),
        }
    }

    /// The lock is taken: its guard (taken at `started`, valid from `valid_from` for `lease`; a
    /// minimum hold and the hold time count from `started`: after the release, for a lock
    /// handed over).
    #[inline]
    fn hold(
        &mut self,
        lock: Lock,
        (fence, permit): (Option<u64>, Option<u32>),
        started: Instant,
        (valid_from, lease): (Instant, Duration),
    ) -> LockGuard {
        match self.wakeup.take() {
            // A reader passes the wake-up on: the next waiter may be a reader too (where the
            // store queues, it wakes each waiter itself).
            Some(wakeup) if self.shape.mode.shared() && !self.shape.queues => drop(wakeup),
            Some(wakeup) => wakeup.acquired(),
            None => {}
        }
        if let Some(place) = self.place.take() {
            place.taken();
        }
        tracing::debug!(key = self.key, fence, permit, "lock acquired");
        let token = std::mem::take(&mut self.token);
        let mut state = LockState::new(
            (lock, self.kind),
            token,
            fence,
            self.options,
            started,
            (valid_from, lease),
        );
        state.permit = permit;
        state.by_key_class = self.core.metrics_key_class;
        LockGuard::new(
            Arc::clone(self.core),
            state,
            self.options.is_watchdog(),
            (valid_from, lease),
        )
    }

    /// The attempt sent at `started` was refused (the holder's remaining ms, whether this fair
    /// waiter is behind others, whether it claimed the writers' turn, the place it kept): `Busy`
    /// once the wait has run out, else the call goes on, listening from its first refusal.
    #[inline]
    fn refused(
        &mut self,
        lock: &Lock,
        (left, behind, claim, kept): (Option<u64>, bool, bool, Option<u64>),
        started: Instant,
    ) -> Result<(), LockError> {
        if claim && !self.claimed {
            self.claimed = true;
            let place = self.place.take();
            let place = place.unwrap_or_else(|| QueuePlace::new(self.core, lock, &self.token));
            self.place = Some(place.claimed());
        }
        if Instant::now() >= self.deadline {
            tracing::debug!(key = self.key, "lock busy");
            return Err(LockError::Busy {
                key: self.key.to_owned(),
            });
        }
        // The call goes on: it will not have taken only this attempt's time.
        self.deciding.at_once = false;
        self.pttl_ms = left;
        self.last_kept = kept.map(|kept| (kept, started));
        if self.shape.polls && self.shape.mode.fair() {
            // A fair waiter that reached the head of the line polls from the shortest nap
            // again: the lock is its own as soon as the holder goes.
            if self.was_behind && !behind {
                self.refusals = 0;
            }
            self.was_behind = behind;
        }
        if let Some(wakeup) = &self.wakeup {
            wakeup.refused();
        }
        self.listen(lock, behind);
        Ok(())
    }

    /// After a refusal: in line where the store queues, or a fair waiter registered early; at
    /// the first refusal of anyone else, registered to listen for the release, then tried again
    /// at once, so a release between that attempt and the subscription is not missed (an
    /// uncontended acquire never pays for the subscription; a fair waiter with others ahead in
    /// line need not: no release before its turn names it). Later refusals sleep first.
    fn listen(&mut self, lock: &Lock, behind: bool) {
        let (shape, wakeups) = (self.shape, &self.core.wakeups);
        if let (true, Some(wakeup)) = (shape.queues, &self.wakeup) {
            wakeup.in_line();
            self.sleep_first = behind;
        } else if let Some(wakeup) = self
            .wakeup
            .as_ref()
            .filter(|w| shape.fair_early && !w.is_in_line())
        {
            wakeup.in_line();
            if shape.mode.semaphore() {
                wakeups.spread(lock.name());
            }
            self.sleep_first = behind;
        } else if self.wakeup.is_none() {
            let name = shape.mode.fair().then_some(self.token.as_str());
            self.wakeup = Some(wakeups.register(lock.name(), name));
            if shape.mode.semaphore() {
                wakeups.spread(lock.name());
            }
            self.sleep_first = behind;
        } else {
            self.sleep_first = true;
        }
    }
}

/// What one attempt at a whole set of locks in one request came to ([`take_set_at_once`]).
pub(crate) enum SetTaken {
    /// Every lock of the set, held by one guard.
    All(LockGuard),
    /// Nothing taken: this key is held.
    Refused(String),
    /// The store cannot take this set in one request: take it key by key.
    NotHere,
}

/// Every lock of `locks` (checked, in canonical order, more than one) in one request where the
/// store can ([`Store::attempt_set`](crate::store::Store::attempt_set)): for exclusive locks
/// that are not fair, before the set is taken key by key. Not while this client's own callers
/// wait for a key of the set (a set does not barge in ahead of them: key by key, it queues
/// behind them, as a single lock does). An attempt whose answer never comes (cancelled, timed
/// out) releases each lock after it, in the background, and once more a while later (see
/// [`Abandoned::InFlight`]).
pub(crate) async fn take_set_at_once(
    core: &Arc<Core>,
    locks: &[Lock],
    options: &LockOptions,
) -> Result<SetTaken, LockError> {
    if locks.iter().any(|lock| core.wakeups.queued(lock.name()) > 0) {
        return Ok(SetTaken::NotHere);
    }
    // A token per lock, as when each is taken alone.
    let tokens: Vec<String> = locks
        .iter()
        .map(|_| crate::holder::new_value(&core.owner))
        .collect();
    let once = Ask::once(options.ttl_ms(), options.is_fencing());
    // A caller that will wait goes on key by key when refused: the store need not say by whom,
    // and gives up within the wait.
    let will_wait = !options.get_wait().is_zero();
    let ask = Ask {
        join: will_wait,
        wait_left: will_wait.then(|| options.get_wait()),
        ..once
    };
    let in_flight = core.held.acquiring();
    if core.held.is_closed() {
        return Err(LockError::unavailable(ShutDown));
    }
    let pending: Vec<PendingAcquire<'_>> = locks
        .iter()
        .zip(&tokens)
        .map(|(lock, token)| PendingAcquire::new(core, lock, token, (&once, Kind::Plain)).of_set())
        .collect();
    let started = Instant::now();
    // One route for the set, recorded in the first lock's place (so a cancelled attempt's
    // release of that lock follows it at once) and copied to the others once answered.
    let spare = Flight::default();
    let flight = pending.first().map_or(&spare, |p| &p.flight);
    let answer = core
        .store
        .attempt_set(
            SetAsk {
                locks,
                tokens: &tokens,
                ask: &ask,
            },
            flight,
        )
        .await;
    if let Some(route) = flight.get() {
        pending.iter().for_each(|p| p.flight.set(route));
    }
    let answer = answer?; // `pending` releases each lock in the background as it drops
    pending.into_iter().for_each(PendingAcquire::settled);
    let (fences, lease) = match answer {
        None => return Ok(SetTaken::NotHere),
        Some(SetAttempt::Refused { at, .. }) => {
            let key = locks.get(at).map_or("", Lock::key);
            return Ok(SetTaken::Refused(key.to_owned()));
        }
        Some(SetAttempt::Taken {
            fences,
            granted_until,
        }) => (fences, lease_granted(granted_until, started, options.ttl())),
    };
    let lease = (started, lease);
    let mut guards: Vec<LockGuard> = locks
        .iter()
        .zip(tokens)
        .zip(fences.into_iter().chain(std::iter::repeat(None)))
        .map(|((lock, token), fence)| {
            let mut state =
                LockState::new((lock.clone(), Kind::Plain), token, fence, options, started, lease);
            state.by_key_class = core.metrics_key_class;
            let labels = Labels::new(false, lock.key(), core.metrics_key_class);
            telemetry::acquire(&labels, "acquired", started.elapsed(), started.elapsed());
            LockGuard::new(Arc::clone(core), state, options.is_watchdog(), lease)
        })
        .collect();
    drop(in_flight); // registered: shutdown will find them
    tracing::debug!(keys = locks.len(), "a set of locks acquired in one request");
    let more = guards.split_off(1.min(guards.len()));
    Ok(match guards.pop() {
        Some(first) => SetTaken::All(first.with_more(more)),
        None => SetTaken::NotHere,
    })
}

/// An acquire request in flight. If it is dropped before its answer is seen (the caller was
/// cancelled, or the answer timed out), the script may still have taken the lock on the server,
/// with nobody to release it for a whole ttl: so the token-checked release is sent in the
/// background. It follows the acquire on the same connection, and is harmless if the lock was
/// never taken. An attempt that may have claimed the writers' turn of a read-write lock gives
/// the claim up too, so that it does not hold readers back until it lapses.
struct PendingAcquire<'a> {
    core: &'a Arc<Core>,
    lock: &'a Lock,
    token: &'a str,
    kind: Kind,
    may_claim: bool,
    settled: bool,
    /// One lock of a set taken in one request (see [`Abandoned::InFlight`]).
    of_set: bool,
    /// The route the attempt took, for its release if its answer never comes (kept inline:
    /// nothing is allocated for it on the common path).
    flight: Flight,
    /// The ttl it asked for: how long what it may have taken lasts.
    ttl: Duration,
}

impl<'a> PendingAcquire<'a> {
    fn new(core: &'a Arc<Core>, lock: &'a Lock, token: &'a str, (ask, kind): (&Ask, Kind)) -> Self {
        PendingAcquire {
            core,
            lock,
            token,
            kind,
            may_claim: ask.join && !ask.mode.fair() && !ask.mode.shared(),
            settled: false,
            of_set: false,
            flight: Flight::default(),
            ttl: Duration::from_millis(ask.ttl_ms),
        }
    }

    /// One lock of a set attempt in one request.
    fn of_set(mut self) -> Self {
        self.of_set = true;
        self
    }

    /// An answer came: `Acquired` hands the lock to a guard, `Held` took nothing. An error is not
    /// an answer (a timed-out script may still have run), so it leaves the release armed.
    fn settled(mut self) {
        self.settled = true;
    }
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        if !self.settled {
            release_in_background(
                Arc::clone(self.core),
                Abandoned::InFlight {
                    lock: self.lock.clone(),
                    token: self.token.to_owned(),
                    kind: self.kind,
                    flight: std::mem::take(&mut self.flight),
                    of_set: self.of_set,
                    ttl: self.ttl,
                },
            );
            if self.may_claim {
                drop(QueuePlace::new(self.core, self.lock, self.token).claimed());
            }
        }
    }
}

/// The attempt that decided an acquire call: how long it took, and whether it was made as the
/// call began (then the call took that long too).
#[derive(Debug, Clone, Copy, Default)]
struct Decided {
    attempt: Duration,
    at_once: bool,
}

/// A fair waiter's place in the store's queue, or a waiting writer's claim on a read-write lock
/// (see [`Attempt::Held`]). Unless the lock was taken with it, it is given up
/// in the background when the waiter stops (its wait ran out, an error, a cancelled caller), so
/// the waiters behind it do not wait for the place to lapse.
struct QueuePlace {
    core: Arc<Core>,
    lock: Lock,
    token: String,
    /// It may hold a writer's claim: leaving tells the readers it held back.
    claimed: bool,
    /// A place in the fair line: a release may have handed the lock (or a permit) to it
    /// meanwhile, so leaving also gives that back (to the next in line), as this kind.
    fair: Option<Kind>,
    taken: bool,
}

impl QueuePlace {
    fn new(core: &Arc<Core>, lock: &Lock, token: &str) -> Self {
        QueuePlace {
            core: Arc::clone(core),
            lock: lock.clone(),
            token: token.to_owned(),
            claimed: false,
            fair: None,
            taken: false,
        }
    }

    fn claimed(mut self) -> Self {
        self.claimed = true;
        self
    }

    fn fair(mut self, kind: Kind) -> Self {
        self.fair = Some(kind);
        self
    }

    /// The lock was taken: the acquire script already removed the place.
    fn taken(mut self) {
        self.taken = true;
    }
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (core, lock, token, claimed, fair) = (
            Arc::clone(&self.core),
            self.lock.clone(),
            std::mem::take(&mut self.token),
            self.claimed,
            self.fair,
        );
        // Counted as a background release: shutdown waits for it.
        let releasing = core.held.releasing();
        runtime.spawn(async move {
            let _releasing = releasing;
            if let Err(e) = core.store.leave(&lock, &token, claimed).await {
                tracing::debug!(key = %lock.key(), error = %e, "could not leave the fair queue; the place lapses");
            }
            // Out of line now, so no later release hands it the lock; one before may have
            // (token-checked: nothing happens if none did).
            if let Some(kind) = fair {
                let release = Release {
                    hold_ms: 0,
                    kind,
                    after: None,
                };
                if let Err(e) = give_back(&core, &lock, &token, release).await {
                    tracing::debug!(key = %lock.key(), error = %e, "could not give back a lock handed over to a waiter that left; it lapses with the waiter's place");
                }
            }
        });
    }
}

/// How long a waiter sleeps before trying again, unless a release wakes it first: until the
/// holder's key expires (never past [`MAX_WAIT_NAP`]; a fair waiter, never past [`FAIR_NAP`],
/// which keeps its place in line), less up to 15% of jitter so that waiters on one lock do not
/// all retry at the same instant.
fn nap(pttl_ms: Option<u64>, fair: bool) -> Duration {
    let longest = if fair { FAIR_NAP } else { MAX_WAIT_NAP };
    let until_expiry = pttl_ms.map_or(longest, Duration::from_millis);
    until_expiry.min(longest).mul_f64(rand::random_range(0.85..=1.0))
}

/// How long a waiter queued in a store that wakes it reliably
/// ([`Waking::Queued`] `{ watched: true }`) sleeps before it looks again unwoken: a
/// safety net only, counted in `lock_wait_naps_total` when it ends a wait (a semaphore's waiter
/// too: the oldest one watches every claim that holds, and one that lost its races for a free
/// permit looks again at once).
const WATCHED_NAP: Duration = Duration::from_secs(30);

/// The longest a fair waiter sleeps between attempts: well within [`FAIR_PLACE_KEPT`], so a
/// live waiter never loses its place.
const FAIR_NAP: Duration = Duration::from_millis(300);

/// A waiter's naps where no release of another client reaches it (the store
/// is [`Waking::Polled`]): the first after 8 ms, doubling to at most
/// 256 ms, each less up to 15% of jitter, and never past the holder's expiry. A lock given back
/// by another client is found within 256 ms; a waiter costs at most about four attempts a
/// second.
const POLL_NAPS: (Duration, Duration) = (Duration::from_millis(8), Duration::from_millis(256));

/// The longest poll of a waiter that keeps a place (a fair waiter, a writer that claimed its
/// turn) where the store polls: no release of another client tells it that it reached the head
/// of the line, so it finds out within this long (and takes the lock then, if the holder went),
/// at about sixteen attempts a second; it polls from [`POLL_NAPS`]' first nap again once it is
/// the head.
const PLACE_POLL_MOST: Duration = Duration::from_millis(64);

/// The backoff's next nap after `refusals` earlier ones (counted here); `keeps_place`: a
/// waiter's that keeps a place in line, at most [`PLACE_POLL_MOST`].
fn poll_nap(refusals: &mut u32, keeps_place: bool) -> Duration {
    let (first, most) = POLL_NAPS;
    let most = if keeps_place { PLACE_POLL_MOST } else { most };
    let nap = first.saturating_mul(1 << (*refusals).min(16)).min(most);
    *refusals = refusals.saturating_add(1);
    nap.mul_f64(rand::random_range(0.85..=1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naps_end_by_the_holders_expiry_and_are_bounded() {
        for _ in 0..100 {
            let n = nap(Some(100), false);
            assert!(
                n <= Duration::from_millis(100) && n >= Duration::from_millis(85),
                "{n:?}"
            );
            assert!(nap(None, false) <= MAX_WAIT_NAP);
            assert!(nap(Some(60_000), false) <= MAX_WAIT_NAP);
            assert!(nap(None, true) <= FAIR_NAP && FAIR_NAP * 3 < crate::FAIR_PLACE_KEPT);
        }
    }

    #[test]
    fn polling_naps_double_from_the_first_to_the_longest() {
        let mut refusals = 0;
        let naps: Vec<Duration> = (0..8).map(|_| poll_nap(&mut refusals, false)).collect();
        let (first, most) = POLL_NAPS;
        assert!(naps[0] <= first && naps[0] >= first.mul_f64(0.85), "{naps:?}");
        assert!(naps[1] > first && naps[1] <= first * 2, "{naps:?}");
        assert!(naps[7] <= most && naps[7] >= most.mul_f64(0.85), "{naps:?}");
        let mut many = u32::MAX;
        assert!(poll_nap(&mut many, false) <= most);
        // A waiter that keeps a place polls at most every 64 ms.
        let mut refusals = 0;
        let naps: Vec<Duration> = (0..8).map(|_| poll_nap(&mut refusals, true)).collect();
        assert!(naps[0] <= first && naps[7] <= PLACE_POLL_MOST, "{naps:?}");
        assert!(naps[7] >= PLACE_POLL_MOST.mul_f64(0.85), "{naps:?}");
    }
}
