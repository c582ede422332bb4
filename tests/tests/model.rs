//! Model-based tests: seeded random sequences of operations (acquire with each option: ttl,
//! watchdog, fencing, minimum hold, fair, shared (read) or exclusive; `run` with each `on_lost`
//! policy; release, extend, drop, cancel, force release, time passing, and the queries) run
//! against the in-memory
//! backend and a spawned redis-server, and every answer is compared with a small model of the
//! contract in the guide (docs/). On a disagreement the sequence is shrunk (chunks, then single ops, then
//! simpler options, each candidate on a fresh store) and the test fails with the seed, the shrunk
//! sequence and a trace of its failing run.
//!
//! The model: per key, who holds it exclusively (a guard, or nobody but a released lock's
//! minimum hold) or which readers share it, each until when, and the highest fencing token seen
//! (each new writer's must be above it: Redis hands out microsecond timestamps, memory 1, 2, 3;
//! a reader takes none and reads the last one, 0 without a counter); per guard, its local
//! validity, whether it knows it is lost, and its minimum hold. From those it predicts every
//! answer: options a read lock refuses (fair, a minimum hold) are `InvalidOptions`, exactly;
//! an exclusive acquire is `Busy` exactly while the key is held, by a writer or a reader, and a
//! shared one exactly while a writer holds it (readers share); a fair acquire that does not
//! wait is a plain one. Waiting acquires are only cancelled: a cancelled waiting writer's claim
//! (no new reader while a writer waits) and a cancelled fair waiter's place (no fair acquire
//! ahead of it, and a fair release hands it the lock) may stand until they lapse
//! (`FAIR_PLACE_KEPT`), so in that window what they would decide is undecided;
//! `release` is `Ok(true)` exactly while the key holds the guard's
//! token (then the key is deleted, or kept until the minimum hold ends); `extend` is `Ok` while
//! the guard is not lost and the key is its own, `Err(Lost)` otherwise; `is_lost()` is true once
//! its validity passed (or it was told so) and false while valid; a reader's release, extend and
//! `is_lost()` follow its own share. `is_locked`, `remaining_ttl` (the writer's, or the last
//! share's), `holder` (a writer's owner label, `is_released()` exactly for a minimum
//! hold kept after its release; for readers `is_shared()` and one entry per share) and `force_release` (every
//! share too) follow the key. A `run` holds its lock like a guard (its `is_lost()` is
//! `current()`'s, from inside the body) while its body waits to be told to finish: with
//! `OnLost::Continue` the call never ends before that (lost or not) and then answers `Ok`; with
//! `OnLost::Abort` it never ends while the lock is not lost, ends with `Lost` within `SETTLE`
//! once `is_lost()` is true, and answers `Ok` when told to finish while valid (its release at
//! the loss honours a minimum hold, so the key may stay until the hold ends); dropping it
//! cancels the call. A dropped guard, and an acquire abandoned
//! by a 0 ms timeout, must leave the key free (a reader: its share gone) once their background
//! release lands (within
//! `SETTLE`, plus any minimum hold). After every step each key's `is_locked` and each guard's
//! `is_lost()` are checked too; at the end every guard is dropped and every key must come free,
//! with nothing left waiting or watched.
//!
//! One assumption: a watched lock is renewed in time (the watchdog renews at ttl/3 of 1.2 s;
//! the runtime would have to stall for ~0.8 s to lose one).
//!
//! Time: the model never assumes how long an operation takes. It times each one (a window
//! from just before the call to just after it) and knows each lease's end only as an interval of
//! instants. A lease is certainly live in a window that ends `MARGIN` (100 ms) before its earliest
//! end, certainly over in one that starts `MARGIN` after its latest end, and otherwise
//! undecided: then the answer is accepted either way and tells the model which way it went. Two
//! ttl classes far apart (150 ms, 10 s) and a "time passes" step of 400 ms make most checks
//! decided, and a loaded machine only makes more of them undecided, never wrong.
//!
//! Replay: `MODEL_SEED=0x… cargo test -p lock-tests --test model -- --nocapture` runs that one
//! sequence (the seed printed for it); `MODEL_RUNS=n` changes the number of sequences.
//!
//! The second model (`mod composition`, at the end) checks every mode composed — exclusive,
//! fair, shared, permits of 1 to 3, sets of overlapping keys — nested in any order, on every
//! store: memory, one Redis, a Redis Cluster, PostgreSQL, MySQL, etcd and ZooKeeper. Its long
//! run: `MODEL_SEQUENCES=5000 cargo test -p lock-tests --test model composition -- --nocapture`.

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{
    LockClient, LockError, LockGuard, LockInfo, LockMode, LockOptions, OnLost, FAIR_PLACE_KEPT,
};
use lock_tests::{Dice, Target};
use tokio::sync::Semaphore;
use tokio::time::Instant;

lock_tests::on_both_backends!(random_sequences_agree_with_the_model);

/// A short lease: surely over after one `NAP`, and live only for checks made right after it.
const SHORT: Duration = Duration::from_millis(150);
/// A long lease: live through almost any whole sequence.
const LONG: Duration = Duration::from_secs(10);
/// The watchdog's ttl: renewed every 400 ms, so a lock survives a stalled runtime of ~0.8 s,
/// and without renewals it would be gone after three naps.
const WATCHDOG: Duration = Duration::from_millis(1200);
/// The minimum hold: still held one nap after the acquire, surely over after two.
const HOLD: Duration = Duration::from_millis(600);
/// "Time passes".
const NAP: Duration = Duration::from_millis(400);
/// How far from a lease's end (or a hold's) a check must be to be decided.
const MARGIN: Duration = Duration::from_millis(100);
/// How long a background release (a dropped guard, an abandoned acquire) may take to land.
const SETTLE: Duration = Duration::from_secs(2);
/// How long Redis holds back writes (`CLIENT PAUSE … WRITE`) for a stalled cancel.
const STALL: Duration = Duration::from_millis(30);
/// How long a cancelled waiting acquire would otherwise wait.
const CANCELLED_WAIT: Duration = Duration::from_millis(300);

const KEYS: [&str; 3] = ["m0", "m1", "m2"];
/// Sequences per backend, and how many run at once (each on its own store).
const RUNS: u64 = 25;
const PARALLEL: usize = 5;
/// Sequence lengths.
const MIN_OPS: u64 = 25;
const MAX_OPS: u64 = 40;
/// The most time spent shrinking a failing sequence.
const SHRINK_BUDGET: Duration = Duration::from_secs(120);
/// How many times a shrunk candidate must pass to be taken as passing.
const SHRINK_TRIES: usize = 2;

/// The validity a lease loses to drift, as the guide states it (docs/holding.md): ttl/100 + 2 ms.
fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

// ---------------------------------------------------------------------------------------------
// Operations and their generator.

/// splitmix64: spreads consecutive seeds apart.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// ttl `SHORT`.
    Short,
    /// ttl `LONG`.
    Long,
    /// ttl `WATCHDOG`, renewed by the watchdog.
    Dog,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Acq {
    client: usize,
    key: usize,
    class: Class,
    fencing: bool,
    hold: bool,
    /// A read lock (`LockMode::Shared`).
    shared: bool,
    fair: bool,
}

impl Acq {
    fn ttl(&self) -> Duration {
        match self.class {
            Class::Short => SHORT,
            Class::Long => LONG,
            Class::Dog => WATCHDOG,
        }
    }

    fn options(&self) -> LockOptions {
        let mode = if self.shared {
            LockMode::Shared
        } else {
            LockMode::Exclusive
        };
        let options = LockOptions::new(self.ttl())
            .fencing(self.fencing)
            .watchdog(self.class == Class::Dog)
            .fair(self.fair)
            .mode(mode);
        if self.hold {
            options.hold_at_least(HOLD)
        } else {
            options
        }
    }

    /// The library refuses these options: a read lock is neither fair nor held for a minimum.
    fn invalid(&self) -> bool {
        self.shared && (self.fair || self.hold)
    }
}

/// One step. `guard` picks among the guards alive at that point (`guard % count`, in the order
/// they were taken), so that every sequence, shrunk ones included, is valid; with no guard
/// alive the step does nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `acquire` with wait 0.
    Acquire(Acq),
    /// `run` with wait 0 and `on_lost` abort (else continue), its body (in a task of its own)
    /// running until a `Release` of it tells it to finish; a `Drop` cancels the call.
    Run {
        acq: Acq,
        abort: bool,
    },
    /// The same acquire inside `tokio::time::timeout(0 ms, …)`, which fires at the timer's next
    /// millisecond tick: in memory the acquire is always answered at its first poll; on Redis it
    /// is abandoned unanswered (not yet sent, or in flight) or, when Redis is quick, answered.
    /// `stall` (Redis only): `CLIENT PAUSE 30 WRITE` first, so the request is surely in flight
    /// when abandoned and runs after that, taking the lock if it is free. `waiting`: with a wait
    /// of 300 ms, so that on a held key it is abandoned while waiting. A guard it returns
    /// anyway is dropped.
    Cancel {
        acq: Acq,
        waiting: bool,
        stall: bool,
    },
    Release {
        guard: usize,
    },
    /// By `SHORT` or (`long`) `LONG`; a watchdog lock always by `LONG` (the watchdog goes on
    /// renewing with its own ttl, ttl/3 after its last renewal, which a shorter extend may not
    /// survive).
    Extend {
        guard: usize,
        long: bool,
    },
    /// Drop the guard: released in the background.
    Drop {
        guard: usize,
    },
    /// Time passes: sleep `NAP`.
    Sleep,
    IsLocked {
        client: usize,
        key: usize,
    },
    RemainingTtl {
        client: usize,
        key: usize,
    },
    Holder {
        client: usize,
        key: usize,
    },
    ForceRelease {
        client: usize,
        key: usize,
    },
}

impl Op {
    fn random(d: &mut Dice) -> Op {
        let client = d.below(2) as usize;
        let key = d.below(KEYS.len() as u64) as usize;
        let guard = d.below(8) as usize;
        let roll = d.below(100);
        let acq = |d: &mut Dice| {
            let class = match d.below(100) {
                0..=39 => Class::Short,
                40..=74 => Class::Long,
                _ => Class::Dog,
            };
            let shared = d.chance(35);
            // A reader is rarely asked to be fair or to hold a minimum (refused): readers
            // mostly meet readers.
            let rarely = if shared { 10 } else { 25 };
            Acq {
                client,
                key,
                class,
                fencing: d.chance(50),
                hold: d.chance(rarely),
                shared,
                fair: d.chance(rarely + 5),
            }
        };
        match roll {
            0..=23 => Op::Acquire(acq(d)),
            24..=29 => Op::Run {
                acq: acq(d),
                abort: d.chance(50),
            },
            30..=39 => Op::Cancel {
                acq: acq(d),
                waiting: d.chance(35),
                stall: d.chance(50),
            },
            40..=54 => Op::Release { guard },
            55..=64 => Op::Extend {
                guard,
                long: d.chance(50),
            },
            65..=71 => Op::Drop { guard },
            72..=81 => Op::Sleep,
            82..=85 => Op::IsLocked { client, key },
            86..=89 => Op::Holder { client, key },
            90..=94 => Op::RemainingTtl { client, key },
            _ => Op::ForceRelease { client, key },
        }
    }

    /// Simpler forms of this step, tried while shrinking.
    fn simpler(&self) -> Vec<Op> {
        let mut out = Vec::new();
        let acq_simpler = |a: &Acq| {
            let mut v = Vec::new();
            if a.fencing {
                v.push(Acq { fencing: false, ..*a });
            }
            if a.hold {
                v.push(Acq { hold: false, ..*a });
            }
            if a.shared {
                v.push(Acq { shared: false, ..*a });
            }
            if a.fair {
                v.push(Acq { fair: false, ..*a });
            }
            if a.class != Class::Long {
                v.push(Acq {
                    class: Class::Long,
                    ..*a
                });
            }
            if a.client != 0 {
                v.push(Acq { client: 0, ..*a });
            }
            v
        };
        match *self {
            Op::Acquire(a) => out.extend(acq_simpler(&a).into_iter().map(Op::Acquire)),
            Op::Run { acq, abort } => {
                out.push(Op::Acquire(acq));
                if !abort {
                    out.push(Op::Run { acq, abort: true });
                }
                out.extend(acq_simpler(&acq).into_iter().map(|acq| Op::Run { acq, abort }));
            }
            Op::Cancel { acq, waiting, stall } => {
                if waiting {
                    out.push(Op::Cancel {
                        acq,
                        waiting: false,
                        stall,
                    });
                }
                out.extend(
                    acq_simpler(&acq)
                        .into_iter()
                        .map(|acq| Op::Cancel { acq, waiting, stall }),
                );
            }
            Op::Release { guard } if guard != 0 => out.push(Op::Release { guard: 0 }),
            Op::Extend { guard, long } if guard != 0 => out.push(Op::Extend { guard: 0, long }),
            Op::Drop { guard } if guard != 0 => out.push(Op::Drop { guard: 0 }),
            _ => {}
        }
        out
    }
}

fn generate(seed: u64) -> Vec<Op> {
    let mut d = Dice::new(seed);
    let len = MIN_OPS + d.below(MAX_OPS - MIN_OPS + 1);
    (0..len).map(|_| Op::random(&mut d)).collect()
}

// ---------------------------------------------------------------------------------------------
// The model.

/// The instants just before and just after one call: whatever it did, it did in between.
#[derive(Debug, Clone, Copy)]
struct Window {
    lo: Instant,
    hi: Instant,
}

impl Window {
    fn now() -> Window {
        let now = Instant::now();
        Window { lo: now, hi: now }
    }
}

async fn timed<F: std::future::Future>(f: F) -> (Window, F::Output) {
    let lo = Instant::now();
    let out = f.await;
    (
        Window {
            lo,
            hi: Instant::now(),
        },
        out,
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Live,
    Over,
    Undecided,
}

/// When a lease ends.
#[derive(Debug, Clone, Copy)]
enum Lease {
    /// Somewhere in `lo..=hi` (for a guard's own validity, `lo` already less the drift).
    Until { lo: Instant, hi: Instant },
    /// Renewed by the watchdog for as long as the guard lives; the key's remaining ttl is at most
    /// `max_left` (the watchdog's ttl, or a longer extend's until the next renewal).
    Renewed { max_left: Duration },
}

impl Lease {
    /// A lease taken or renewed for `ttl` by a request in `w`.
    fn timed(w: Window, ttl: Duration) -> Lease {
        Lease::Until {
            lo: w.lo + ttl - drift(ttl),
            hi: w.hi + ttl,
        }
    }

    /// This lease after a renewal that asked for `renewed`: a lease is only ever lengthened
    /// (`PEXPIRE … GT`), so each end is the later of the two.
    fn lengthened(self, renewed: Lease) -> Lease {
        match (self, renewed) {
            (Lease::Until { lo, hi }, Lease::Until { lo: lo2, hi: hi2 }) => Lease::Until {
                lo: lo.max(lo2),
                hi: hi.max(hi2),
            },
            (_, renewed) => renewed,
        }
    }

    fn status(&self, w: Window) -> Status {
        match *self {
            Lease::Renewed { .. } => Status::Live,
            Lease::Until { lo, hi } => {
                if w.hi + MARGIN < lo {
                    Status::Live
                } else if w.lo > hi + MARGIN {
                    Status::Over
                } else {
                    Status::Undecided
                }
            }
        }
    }

    fn show(&self) -> String {
        match *self {
            Lease::Until { lo, hi } => format!("ending {}..{} from now", from_now(lo), from_now(hi)),
            Lease::Renewed { max_left } => {
                format!("renewed by the watchdog ({max_left:?} ttl at most)")
            }
        }
    }
}

/// `t` relative to now, for messages.
fn from_now(t: Instant) -> String {
    let now = Instant::now();
    if t >= now {
        format!("+{:.1?}", t - now)
    } else {
        format!("-{:.1?}", now - t)
    }
}

/// Who holds a key exclusively in the store.
#[derive(Debug, Clone, Copy)]
struct Holder {
    /// The guard whose token is in the key; `None` after a release that left a minimum hold,
    /// or (`waiter`) for a lock a fair release handed to a cancelled waiter.
    owner: Option<usize>,
    lease: Lease,
    /// Handed by a fair release to a waiter that was cancelled (its place had not lapsed yet):
    /// it gives the lock back in the background, or its place lapses.
    waiter: bool,
}

impl Holder {
    fn show(&self) -> String {
        match self.owner {
            Some(id) => format!("g{id}, lease {}", self.lease.show()),
            None if self.waiter => format!("a cancelled fair waiter, {}", self.lease.show()),
            None => format!("a released lock's minimum hold, {}", self.lease.show()),
        }
    }
}

/// One reader's share of a key.
#[derive(Debug, Clone, Copy)]
struct Share {
    owner: usize,
    lease: Lease,
}

#[derive(Debug, Default)]
struct KeyModel {
    /// The exclusive holder; never at once with `readers` (an acquire of either kind that
    /// succeeds shows the other gone).
    holder: Option<Holder>,
    /// The shared holders.
    readers: Vec<Share>,
    /// The highest fencing token seen for the key: every later writer's must be greater, and a
    /// reader reads the last one (0 without a counter).
    last_fence: Option<u64>,
    /// Tokens may have been taken that the model never saw (by a fenced acquire abandoned in
    /// flight, or for a fair waiter a release handed the lock to): a reader's may then be
    /// higher than the last one seen.
    unseen_fences: bool,
    /// Until when a waiting acquire that was cancelled may still stand in the store: a waiting
    /// writer's claim (no new reader enters), a fair waiter's place (no fair acquire goes ahead
    /// of it, and a fair release hands it the lock). Each lapses `FAIR_PLACE_KEPT` after its
    /// attempt at the latest, and goes sooner when the background leave lands.
    waiter_until: Option<Instant>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lost {
    No,
    /// `is_lost()` said so once: it stays so.
    Yes,
    /// An extend succeeded but its answer may have come after the old validity ran out (then
    /// the guard stays lost): the next `is_lost()` says which.
    Unsettled,
}

/// What the model knows of one guard.
#[derive(Debug)]
struct GuardModel {
    id: usize,
    key: usize,
    watchdog: bool,
    /// A reader's share.
    shared: bool,
    /// Its release hands the lock to the next fair waiter.
    fair: bool,
    /// When its minimum hold ends, if it has one.
    hold: Option<(Instant, Instant)>,
    /// Its local validity (the instant past which `is_lost()` is true).
    validity: Lease,
    lost: Lost,
}

impl GuardModel {
    /// What `is_lost()` must say in `w`, if decided.
    fn expect_lost(&self, w: Window) -> Option<bool> {
        if self.lost == Lost::Yes {
            return Some(true);
        }
        match self.validity.status(w) {
            Status::Over => Some(true),
            Status::Live if self.lost == Lost::No => Some(false),
            _ => None,
        }
    }
}

/// What holds a lock taken by a step: a guard, or a body running under `LockClient::run`.
enum Real {
    Guard(LockGuard),
    Run(Running),
}

/// A body running under `LockClient::run` in a task of its own, until told to finish.
struct Running {
    /// `lock_runtime::current()` from inside the body.
    info: LockInfo,
    /// `OnLost::Abort` (else `Continue`).
    abort: bool,
    finish: Option<tokio::sync::oneshot::Sender<()>>,
    /// `None` once its outcome was checked.
    task: Option<tokio::task::JoinHandle<Result<(), LockError>>>,
}

impl Drop for Running {
    /// Dropping it cancels the call (its guard releases in the background).
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl Real {
    fn key(&self) -> &str {
        match self {
            Real::Guard(g) => g.key(),
            Real::Run(r) => r.info.key(),
        }
    }

    fn fencing_token(&self) -> Option<u64> {
        match self {
            Real::Guard(g) => g.fencing_token(),
            Real::Run(r) => r.info.fencing_token(),
        }
    }

    fn is_lost(&self) -> bool {
        match self {
            Real::Guard(g) => g.is_lost(),
            Real::Run(r) => r.info.is_lost(),
        }
    }
}

struct Slot {
    real: Real,
    model: GuardModel,
}

/// What the model says of a key (or of one side of it: its writer, its readers) in a window.
#[derive(Debug, Clone)]
enum KeyNow {
    Free,
    /// Held: by whom.
    Held(String),
    /// Held until a lease end that may fall inside the window.
    Maybe,
}

#[derive(Debug, Default, Clone)]
struct Stats {
    /// Answers the model predicted.
    decided: u64,
    /// Answers accepted either way, the timing being too close to call.
    undecided: u64,
    /// How often each kind of outcome came up: what the sequences exercised.
    seen: std::collections::BTreeMap<&'static str, u64>,
}

impl Stats {
    fn add(&mut self, other: &Stats) {
        self.decided += other.decided;
        self.undecided += other.undecided;
        for (k, v) in &other.seen {
            *self.seen.entry(k).or_default() += v;
        }
    }
}

#[derive(Debug)]
struct Failure {
    /// The step that disagreed (`None`: the final checks, or a panic).
    step: Option<usize>,
    what: String,
    trace: Vec<String>,
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Redis,
    Memory,
}

/// One sequence on one fresh store, with the model alongside.
struct Run {
    clients: [LockClient; 2],
    keys: [KeyModel; 3],
    guards: Vec<Slot>,
    next_guard: usize,
    trace: Vec<String>,
    stats: Stats,
    // Last: the clients drop before the server does.
    target: Target,
}

impl Run {
    async fn new(backend: Backend) -> Run {
        let target = match backend {
            Backend::Redis => Target::redis().await,
            Backend::Memory => Target::memory(),
        };
        Run {
            clients: [target.client(), target.other_client().await],
            keys: Default::default(),
            guards: Vec::new(),
            next_guard: 0,
            trace: Vec::new(),
            stats: Stats::default(),
            target,
        }
    }

    fn note(&mut self, line: String) {
        self.trace.push(line);
    }

    fn hit(&mut self, what: &'static str) {
        *self.stats.seen.entry(what).or_default() += 1;
    }

    fn decided(&mut self, decided: bool) {
        if decided {
            self.stats.decided += 1;
        } else {
            self.stats.undecided += 1;
        }
    }

    /// The state of the key's exclusive holder in `w`; a lease surely over is forgotten on the
    /// way.
    fn writer_now(&mut self, key: usize, w: Window) -> KeyNow {
        let Some(holder) = self.keys[key].holder else {
            return KeyNow::Free;
        };
        match holder.lease.status(w) {
            Status::Live => KeyNow::Held(holder.show()),
            Status::Undecided => KeyNow::Maybe,
            Status::Over => {
                if holder.owner.is_some() {
                    self.hit("a guard's lease ran out in the store");
                }
                self.keys[key].holder = None;
                KeyNow::Free
            }
        }
    }

    /// The state of the key's readers in `w`: held while a share surely is; shares surely over
    /// are forgotten on the way.
    fn readers_now(&mut self, key: usize, w: Window) -> KeyNow {
        let before = self.keys[key].readers.len();
        self.keys[key]
            .readers
            .retain(|r| r.lease.status(w) != Status::Over);
        if self.keys[key].readers.len() < before {
            self.hit("a reader's share ran out in the store");
        }
        let readers = &self.keys[key].readers;
        let live: Vec<String> = readers
            .iter()
            .filter(|r| r.lease.status(w) == Status::Live)
            .map(|r| format!("g{}", r.owner))
            .collect();
        if !live.is_empty() {
            KeyNow::Held(format!("reader(s) {}", live.join(", ")))
        } else if readers.is_empty() {
            KeyNow::Free
        } else {
            KeyNow::Maybe
        }
    }

    /// The key's state in `w`: held by its writer or by a reader.
    fn key_now(&mut self, key: usize, w: Window) -> KeyNow {
        match (self.writer_now(key, w), self.readers_now(key, w)) {
            (KeyNow::Held(h), _) | (_, KeyNow::Held(h)) => KeyNow::Held(h),
            (KeyNow::Free, KeyNow::Free) => KeyNow::Free,
            _ => KeyNow::Maybe,
        }
    }

    /// Whether a cancelled waiter may still stand at the key in `w` (see
    /// [`KeyModel::waiter_until`]).
    fn waiter_stands(&mut self, key: usize, w: Window) -> bool {
        match self.keys[key].waiter_until {
            Some(until) if w.lo <= until + MARGIN => true,
            Some(_) => {
                self.keys[key].waiter_until = None;
                false
            }
            None => false,
        }
    }

    /// Checks an answer saying whether `key` was held during `w`, and learns from it.
    fn observe_held(&mut self, key: usize, w: Window, held: bool, what: &str) -> Result<(), String> {
        match self.key_now(key, w) {
            KeyNow::Free => {
                self.decided(true);
                ensure!(
                    !held,
                    "{what}: `{}` is held, but the model has it free",
                    KEYS[key]
                );
            }
            KeyNow::Held(h) => {
                self.decided(true);
                ensure!(
                    held,
                    "{what}: `{}` is free, but the model has it held by {h}",
                    KEYS[key]
                );
            }
            KeyNow::Maybe => {
                self.decided(false);
                if !held {
                    self.keys[key].holder = None;
                    self.keys[key].readers.clear();
                }
            }
        }
        Ok(())
    }

    /// The store's state of `g`'s lock (or share): live (the key holds its token), over, or
    /// undecided.
    fn owned(&self, g: &GuardModel, w: Window) -> Status {
        let k = &self.keys[g.key];
        if g.shared {
            return k
                .readers
                .iter()
                .find(|r| r.owner == g.id)
                .map_or(Status::Over, |r| r.lease.status(w));
        }
        match k.holder {
            Some(Holder {
                owner: Some(owner),
                lease,
                ..
            }) if owner == g.id => lease.status(w),
            _ => Status::Over,
        }
    }

    fn pick(&self, guard: usize) -> Option<usize> {
        (!self.guards.is_empty()).then(|| guard % self.guards.len())
    }

    /// Waits until `key` is free, at most `within`: free as seen on every client's
    /// connection, each asked in turn, so that an acquire abandoned in flight on any of them
    /// (sent before the question on its connection) has run, with its release queued behind it.
    async fn settles_free(&mut self, key: usize, within: Duration, what: &str) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            let mut free = true;
            for client in &self.clients {
                match client.is_locked(KEYS[key]).await {
                    Ok(locked) => free &= !locked,
                    Err(e) => return Err(format!("{what}: is_locked failed: {e:?}")),
                }
            }
            if free {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "{what}: `{}` still held after {within:?}",
                KEYS[key]
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.decided(true);
        self.keys[key].holder = None;
        self.keys[key].readers.clear();
        Ok(())
    }

    /// Waits until `key` has no more shares than the model's surely live ones (a share given
    /// back in the background, or taken by an acquire abandoned in flight on any client's
    /// connection, is gone), at most `within`.
    async fn settles_shares(&mut self, key: usize, within: Duration, what: &str) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            // Asked on every client's connection in turn, as in `settles_free`; the last answer
            // counts, but not before each connection has carried one question.
            let mut answer = None;
            for client in &self.clients {
                answer = Some(timed(client.holder(KEYS[key])).await);
            }
            let Some((w, found)) = answer else {
                return Err(format!("{what}: no client"));
            };
            let found = found.map_err(|e| format!("{what}: holder failed: {e:?}"))?;
            let shares = found.as_ref().map_or(0, |h| h.readers().len());
            let live = self.keys[key]
                .readers
                .iter()
                .filter(|r| r.lease.status(w) == Status::Live)
                .count();
            if shares <= live {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "{what}: `{}` still has {shares} share(s) after {within:?}, the model {live}",
                KEYS[key]
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.decided(true);
        Ok(())
    }

    /// How long past now the key may legitimately stay held by `holder` (its lease, and its
    /// owner's minimum hold), not counting a background release's own delay.
    fn may_stay(&self, holder: &Holder) -> Duration {
        let now = Instant::now();
        let lease = match holder.lease {
            Lease::Until { hi, .. } => hi.saturating_duration_since(now),
            Lease::Renewed { .. } => Duration::ZERO,
        };
        let hold = holder
            .owner
            .and_then(|id| self.guards.iter().find(|s| s.model.id == id))
            .and_then(|s| s.model.hold)
            .map_or(Duration::ZERO, |(_, hi)| hi.saturating_duration_since(now));
        lease.max(hold)
    }

    /// How long past now `key` may legitimately stay held: by its holder, its readers' leases,
    /// or (its holder's release handing it over) a cancelled fair waiter.
    fn key_may_stay(&self, key: usize) -> Duration {
        let now = Instant::now();
        let k = &self.keys[key];
        let mut stay = k.holder.map_or(Duration::ZERO, |h| self.may_stay(&h));
        for r in &k.readers {
            if let Lease::Until { hi, .. } = r.lease {
                stay = stay.max(hi.saturating_duration_since(now));
            }
        }
        if let Some(until) = k.waiter_until {
            stay = stay.max((until + MARGIN).saturating_duration_since(now));
        }
        stay
    }

    /// Checks a remaining ttl the store gave for `key` in `w`: within the holder's lease, or
    /// the last reader's.
    fn check_left(&self, key: usize, w: Window, left: Duration, what: &str) -> Result<(), String> {
        let k = &self.keys[key];
        let leases: Vec<Lease> = match k.holder {
            Some(h) => vec![h.lease],
            None => k.readers.iter().map(|r| r.lease).collect(),
        };
        if leases.is_empty() {
            return Ok(());
        }
        let (mut least, mut most) = (Duration::ZERO, Duration::ZERO);
        for lease in leases {
            match lease {
                Lease::Until { lo, hi } => {
                    most = most.max(hi.saturating_duration_since(w.lo) + MARGIN);
                    least = least.max(lo.saturating_duration_since(w.hi).saturating_sub(MARGIN));
                }
                Lease::Renewed { max_left } => most = most.max(max_left + MARGIN),
            }
        }
        ensure!(
            least <= left && left <= most,
            "{what} of `{}` is {left:?}, the model expects {least:?}..={most:?}",
            KEYS[key]
        );
        Ok(())
    }

    /// Checks an acquire's answer; on success records the new guard and returns its slot.
    fn acquired(
        &mut self,
        a: &Acq,
        w: Window,
        result: Result<Real, LockError>,
    ) -> Result<(Option<usize>, String), String> {
        let key = KEYS[a.key];
        if a.invalid() {
            self.decided(true);
            return match result {
                Err(LockError::InvalidOptions { .. }) => {
                    self.hit("acquire: invalid options refused");
                    Ok((None, "InvalidOptions".into()))
                }
                other => Err(format!(
                    "acquire of `{key}` answered {:?}, the model expects InvalidOptions (a \
                     read lock is neither fair nor held for a minimum)",
                    other.map(|r| format!("Ok(guard of `{}`)", r.key()))
                )),
            };
        }
        // A reader is kept out by a writer (and a waiting writer's claim), a writer by anyone
        // (and a fair one by a fair waiter's place).
        let mut now = if a.shared {
            self.writer_now(a.key, w)
        } else {
            self.key_now(a.key, w)
        };
        if matches!(now, KeyNow::Free) && (a.shared || a.fair) && self.waiter_stands(a.key, w) {
            now = KeyNow::Maybe;
        }
        match result {
            Ok(guard) => {
                self.hit(match (a.shared, a.fair) {
                    (true, _) => "acquire: taken, shared",
                    (_, true) => "acquire: taken, fair",
                    _ => "acquire: taken",
                });
                if a.shared && !self.keys[a.key].readers.is_empty() {
                    self.hit("acquire: shared with other readers");
                }
                match now {
                    KeyNow::Held(h) => {
                        self.decided(true);
                        return Err(format!("acquired `{key}` while the model has it held by {h}"));
                    }
                    KeyNow::Maybe => self.decided(false),
                    KeyNow::Free => self.decided(true),
                }
                ensure!(guard.key() == key, "the guard's key is `{}`", guard.key());
                let token = guard.fencing_token();
                let model = &mut self.keys[a.key];
                if a.fencing {
                    let Some(token) = token else {
                        return Err(format!("a fenced acquire of `{key}` has no fencing token"));
                    };
                    if a.shared {
                        // A reader takes no token of its own: it reads the last writer's.
                        let last = model.last_fence.unwrap_or(0);
                        if model.unseen_fences {
                            ensure!(
                                token >= last,
                                "a reader of `{key}` read fencing token {token}, below the last one {last}"
                            );
                        } else {
                            ensure!(
                                token == last,
                                "a reader of `{key}` read fencing token {token}, the model expects \
                                 the last writer's, {last}"
                            );
                        }
                        *self
                            .stats
                            .seen
                            .entry("acquire: a reader read the last writer's token")
                            .or_default() += 1;
                    } else if let Some(last) = model.last_fence {
                        *self
                            .stats
                            .seen
                            .entry("acquire: fencing token above an earlier one")
                            .or_default() += 1;
                        ensure!(
                            token > last,
                            "fencing token {token} of `{key}` is not above the earlier {last}"
                        );
                    }
                    model.last_fence = Some(token);
                } else {
                    ensure!(token.is_none(), "an unfenced acquire got a token {token:?}");
                }
                let id = self.next_guard;
                self.next_guard += 1;
                let lease = if a.class == Class::Dog {
                    Lease::Renewed { max_left: WATCHDOG }
                } else {
                    Lease::timed(w, a.ttl())
                };
                // A run with `OnLost::Abort` releases its lock as soon as its validity ends,
                // which is a little before the key's expiry (the drift): with a minimum hold,
                // that release keeps the key until the hold ends.
                let aborts = matches!(guard, Real::Run(Running { abort: true, .. }));
                let key_lease = match lease {
                    Lease::Until { lo, hi } if aborts && a.hold => Lease::Until {
                        lo,
                        hi: hi.max(w.hi + HOLD),
                    },
                    lease => lease,
                };
                if a.shared {
                    model.holder = None;
                    model.readers.push(Share { owner: id, lease });
                } else {
                    model.readers.clear();
                    model.holder = Some(Holder {
                        owner: Some(id),
                        lease: key_lease,
                        waiter: false,
                    });
                }
                self.guards.push(Slot {
                    real: guard,
                    model: GuardModel {
                        id,
                        key: a.key,
                        watchdog: a.class == Class::Dog,
                        shared: a.shared,
                        fair: a.fair,
                        hold: a.hold.then(|| (w.lo + HOLD, w.hi + HOLD)),
                        validity: lease,
                        lost: Lost::No,
                    },
                });
                let kind = if a.shared { ", shared" } else { "" };
                Ok((
                    Some(self.guards.len() - 1),
                    format!("Ok(g{id}{kind}, fence {token:?})"),
                ))
            }
            Err(LockError::Busy { key: busy }) => {
                ensure!(busy == key, "Busy names `{busy}`");
                self.hit(if a.shared {
                    "acquire: busy, shared"
                } else {
                    "acquire: busy"
                });
                match now {
                    KeyNow::Free => {
                        self.decided(true);
                        Err(format!("Busy on `{key}`, but the model has it free"))
                    }
                    KeyNow::Held(_) => {
                        self.decided(true);
                        Ok((None, "Busy".into()))
                    }
                    KeyNow::Maybe => {
                        self.decided(false);
                        Ok((None, "Busy".into()))
                    }
                }
            }
            Err(e) => Err(format!("acquire of `{key}` failed: {e:?}")),
        }
    }

    /// A fair guard's token left `key` (released, or given back in the background): a fair
    /// release hands the lock to the next waiter in line, which may be a cancelled one whose
    /// place has not lapsed yet. Then the key stays held until that waiter gives it back or its
    /// place lapses.
    fn fair_release(&mut self, key: usize, w: Window) {
        if !self.waiter_stands(key, w) {
            return;
        }
        let until = self.keys[key].waiter_until.unwrap_or(w.hi);
        self.hit("release: fair, a cancelled waiter may be handed the lock");
        self.keys[key].unseen_fences = true;
        self.keys[key].holder = Some(Holder {
            owner: None,
            lease: Lease::Until {
                lo: w.lo,
                hi: until + MARGIN,
            },
            waiter: true,
        });
    }

    /// Tells a run's body to finish and checks the call's answer under its lost-lock policy:
    /// `Ok` unless it was lost with `OnLost::Abort` (then it answers `Lost`, and most often
    /// had already, found at a check); then the key comes free as for a dropped guard.
    async fn finish_run(&mut self, slot: usize) -> Result<String, String> {
        let id = self.guards[slot].model.id;
        let Real::Run(run) = &mut self.guards[slot].real else {
            unreachable!("only a run is finished")
        };
        let abort = run.abort;
        if let Some(finish) = run.finish.take() {
            let _ = finish.send(());
        }
        let outcome = match run.task.take() {
            None => "its call had ended with Lost".to_owned(),
            Some(task) => {
                let (w, joined) = timed(task).await;
                let result = joined.map_err(|e| format!("g{id}'s run failed: {e}"))?;
                let expected = self.guards[slot].model.expect_lost(w);
                self.decided(expected.is_some() || !abort);
                match (&result, abort) {
                    (Ok(()), false) => self.hit("run: on_lost continue, its body finished"),
                    (Ok(()), true) => {
                        ensure!(
                            expected != Some(true),
                            "g{id}'s run (on_lost abort) finished its body, but the model has it lost"
                        );
                        self.hit("run: on_lost abort, its body finished while held");
                    }
                    (Err(LockError::Lost { .. }), true) => {
                        ensure!(
                            expected != Some(false),
                            "g{id}'s run (on_lost abort) answered Lost, but the model has it valid"
                        );
                        self.hit("run: on_lost abort, lost as its body finished");
                    }
                    _ => {
                        return Err(format!(
                            "g{id}'s run (on_lost {}) answered {result:?}",
                            if abort { "abort" } else { "continue" }
                        ))
                    }
                }
                format!("{result:?}")
            }
        };
        let freed = self.drop_guard(slot).await?;
        Ok(format!("g{id} finished: {outcome}; {freed}"))
    }

    /// Drops the guard in `slot`; if its token may still be in the key, waits for the
    /// background release (and its minimum hold) to free the key, or a reader's share to go.
    async fn drop_guard(&mut self, slot: usize) -> Result<String, String> {
        let Slot { real, model: g } = self.guards.remove(slot);
        let w = Window::now();
        let status = self.owned(&g, w);
        if g.shared {
            let lease = self.keys[g.key]
                .readers
                .iter()
                .find(|r| r.owner == g.id)
                .map(|r| r.lease);
            self.keys[g.key].readers.retain(|r| r.owner != g.id);
            drop(real);
            if status == Status::Over {
                self.hit("drop: not the holder");
                return Ok(format!("dropped g{} (not a reader)", g.id));
            }
            let stay = match lease {
                Some(Lease::Until { hi, .. }) if status == Status::Undecided => {
                    hi.saturating_duration_since(w.hi)
                }
                _ => Duration::ZERO,
            };
            let what = format!("g{} dropped", g.id);
            self.settles_shares(g.key, SETTLE + stay, &what).await?;
            self.hit("drop: a reader, its share given back in the background");
            return Ok(format!("dropped g{}, its share gone", g.id));
        }
        let stay = match (status, g.hold) {
            (Status::Over, _) => None,
            (_, Some((_, hold_hi))) => Some(hold_hi.saturating_duration_since(w.hi)),
            (_, None) => Some(Duration::ZERO),
        };
        let stay = stay.map(|hold| {
            let lease = match self.keys[g.key].holder.map(|h| h.lease) {
                Some(Lease::Until { hi, .. }) if status == Status::Undecided => {
                    hi.saturating_duration_since(w.hi)
                }
                _ => Duration::ZERO,
            };
            hold.max(lease)
        });
        drop(real);
        match stay {
            None => {
                self.hit("drop: not the holder");
                Ok(format!("dropped g{} (not the holder)", g.id))
            }
            Some(stay) => {
                let mut stay = stay;
                if g.fair && self.waiter_stands(g.key, w) {
                    self.keys[g.key].unseen_fences = true;
                    stay = stay.max(self.key_may_stay(g.key));
                }
                let what = format!("g{} dropped", g.id);
                self.settles_free(g.key, SETTLE + stay, &what).await?;
                self.hit("drop: the holder, freed in the background");
                Ok(format!("dropped g{}, `{}` freed", g.id, KEYS[g.key]))
            }
        }
    }

    async fn step(&mut self, op: Op) -> Result<String, String> {
        match op {
            Op::Acquire(a) => {
                let c = self.clients[a.client].clone();
                let (w, result) = timed(c.acquire(KEYS[a.key], &a.options())).await;
                Ok(self.acquired(&a, w, result.map(Real::Guard))?.1)
            }
            Op::Run { acq: a, abort } => {
                let c = self.clients[a.client].clone();
                let policy = if abort { OnLost::Abort } else { OnLost::Continue };
                let options = a.options().on_lost(policy);
                let (started, info) = tokio::sync::oneshot::channel::<LockInfo>();
                let (finish, finished) = tokio::sync::oneshot::channel::<()>();
                let key = KEYS[a.key];
                let lo = Instant::now();
                let mut task = tokio::spawn(async move {
                    c.run(key, &options, async move {
                        if let Some(info) = lock_runtime::current() {
                            let _ = started.send(info);
                        }
                        let _ = finished.await;
                    })
                    .await
                });
                let result = match info.await {
                    Ok(info) => Ok(Real::Run(Running {
                        info,
                        abort,
                        finish: Some(finish),
                        task: Some(task),
                    })),
                    // The body never ran: the call's answer says why.
                    Err(_) => match (&mut task).await {
                        Ok(Ok(())) => return Err("the run's body ran outside any lock".into()),
                        Ok(Err(e)) => Err(e),
                        Err(e) => return Err(format!("the run's task failed: {e}")),
                    },
                };
                let w = Window {
                    lo,
                    hi: Instant::now(),
                };
                Ok(self.acquired(&a, w, result)?.1)
            }
            Op::Cancel {
                acq: a,
                waiting,
                stall,
            } => {
                let c = self.clients[a.client].clone();
                let mut options = a.options();
                if waiting {
                    options = options.wait(CANCELLED_WAIT);
                }
                let server = self.target.server().filter(|_| stall);
                if let Some(server) = server {
                    ::redis::cmd("CLIENT")
                        .arg("PAUSE")
                        .arg(STALL.as_millis() as u64)
                        .arg("WRITE")
                        .query_async::<()>(&mut server.raw().await)
                        .await
                        .map_err(|e| format!("CLIENT PAUSE failed: {e}"))?;
                }
                let acquire = c.acquire(KEYS[a.key], &options);
                let (mut w, result) = timed(tokio::time::timeout(Duration::ZERO, acquire)).await;
                if let (Some(server), Err(_)) = (server, &result) {
                    // The abandoned request runs when the pause ends (Redis checks for that up to
                    // 100 ms late), before a write sent after it on another connection: once that
                    // write is answered, the acquire has run, and its release (queued behind it
                    // on its connection).
                    ::redis::cmd("SET")
                        .arg("model:probe")
                        .arg(1)
                        .query_async::<()>(&mut server.raw().await)
                        .await
                        .map_err(|e| format!("SET after CLIENT PAUSE failed: {e}"))?;
                    w.hi = Instant::now();
                    self.hit("cancel: abandoned while stalled in flight");
                }
                let outcome = match result {
                    Ok(result) => match self.acquired(&a, w, result.map(Real::Guard))? {
                        (Some(slot), got) => {
                            self.hit("cancel: completed before the timeout, guard dropped");
                            format!("{got}, then {}", self.drop_guard(slot).await?)
                        }
                        (None, got) => got,
                    },
                    Err(_elapsed) => {
                        if waiting && (a.fair || !a.shared) {
                            // Its claim or its place may stand until it lapses.
                            let until = w.hi + FAIR_PLACE_KEPT;
                            let k = &mut self.keys[a.key];
                            k.waiter_until = Some(k.waiter_until.map_or(until, |u| u.max(until)));
                        }
                        if a.fencing && !a.shared {
                            self.keys[a.key].unseen_fences = true;
                        }
                        let writer_held = matches!(self.writer_now(a.key, w), KeyNow::Held(_));
                        match self.key_now(a.key, w) {
                            KeyNow::Held(_) if a.shared && !writer_held => {
                                // Readers hold it: it may have taken a share too, given back in
                                // the background.
                                self.hit("cancel: a reader abandoned on a shared key");
                                let within = SETTLE + self.key_may_stay(a.key);
                                self.settles_shares(a.key, within, "after a cancelled acquire")
                                    .await?;
                                "cancelled, no share left".to_owned()
                            }
                            KeyNow::Held(_) => {
                                self.hit(if waiting {
                                    "cancel: abandoned while waiting for a held key"
                                } else {
                                    "cancel: abandoned on a held key"
                                });
                                "cancelled".to_owned()
                            }
                            KeyNow::Free => {
                                self.hit("cancel: abandoned on a free key, the key freed");
                                self.settles_free(a.key, SETTLE, "after a cancelled acquire")
                                    .await?;
                                "cancelled, key free".to_owned()
                            }
                            KeyNow::Maybe => {
                                let within = SETTLE + self.key_may_stay(a.key);
                                self.settles_free(a.key, within, "after a cancelled acquire")
                                    .await?;
                                "cancelled, key free".to_owned()
                            }
                        }
                    }
                };
                let deadline = Instant::now() + SETTLE;
                while c.waiting_channels() != 0 {
                    ensure!(
                        Instant::now() < deadline,
                        "a cancelled acquire left {} channel(s) waited on",
                        c.waiting_channels()
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Ok(outcome)
            }
            Op::Release { guard } => {
                let Some(slot) = self.pick(guard) else {
                    return Ok("no guard".into());
                };
                if matches!(self.guards[slot].real, Real::Run(_)) {
                    return self.finish_run(slot).await;
                }
                let Slot { real, model: g } = self.guards.remove(slot);
                let Real::Guard(real) = real else {
                    unreachable!("a run is finished above")
                };
                let (w, result) = timed(real.release()).await;
                let status = self.owned(&g, w);
                self.decided(status != Status::Undecided);
                match result {
                    Ok(true) => {
                        ensure!(
                            status != Status::Over,
                            "release of g{} said it was still ours, but the model has it expired \
                             or taken (the key: {})",
                            g.id,
                            self.keys[g.key].holder.map_or("free".to_owned(), |h| h.show())
                        );
                        self.hit(if g.shared {
                            "release: Ok(true), a reader"
                        } else {
                            "release: Ok(true)"
                        });
                        if g.shared {
                            self.keys[g.key].readers.retain(|r| r.owner != g.id);
                            return Ok(format!("g{}: {result:?}", g.id));
                        }
                        // With a minimum hold still ahead, the key stays until it ends.
                        self.keys[g.key].holder = match g.hold {
                            Some((hold_lo, hold_hi)) if w.lo <= hold_hi => Some(Holder {
                                owner: None,
                                lease: Lease::Until {
                                    lo: w.lo.max(hold_lo),
                                    hi: w.hi.max(hold_hi + (w.hi - w.lo) + Duration::from_millis(1)),
                                },
                                waiter: false,
                            }),
                            _ => None,
                        };
                        if self.keys[g.key].holder.is_some() {
                            self.hit("release: Ok(true), key kept for the minimum hold");
                        } else if g.fair {
                            self.fair_release(g.key, w);
                        }
                    }
                    Ok(false) => {
                        self.hit("release: Ok(false)");
                        ensure!(
                            status != Status::Live,
                            "release of g{} said it was not ours, but the model has it held by it",
                            g.id
                        );
                        if g.shared {
                            self.keys[g.key].readers.retain(|r| r.owner != g.id);
                        } else if status == Status::Undecided {
                            self.keys[g.key].holder = None;
                        }
                    }
                    Err(e) => return Err(format!("release of g{} failed: {e:?}", g.id)),
                }
                Ok(format!("g{}: {result:?}", g.id))
            }
            Op::Extend { guard, long } => {
                let Some(slot) = self.pick(guard) else {
                    return Ok("no guard".into());
                };
                let watchdog = self.guards[slot].model.watchdog;
                let ttl = if long || watchdog { LONG } else { SHORT };
                let Real::Guard(guard) = &self.guards[slot].real else {
                    return Ok("a run's lock: no extend".into());
                };
                let (w, result) = timed(guard.extend(ttl)).await;
                let g = &self.guards[slot].model;
                let id = g.id;
                let local = g.expect_lost(w).map(|lost| !lost);
                let store = self.owned(g, w);
                let valid_through_answer =
                    g.lost == Lost::No && g.validity.status(Window { lo: w.hi, hi: w.hi }) == Status::Live;
                let must_fail = local == Some(false) || store == Status::Over;
                let must_succeed = local == Some(true) && store == Status::Live;
                self.decided(must_fail || must_succeed);
                match result {
                    Ok(()) => {
                        ensure!(
                            !must_fail,
                            "extend of g{id} succeeded, but the model has it lost (locally: {:?}, \
                             in the store: {store:?})",
                            local.map(|ok| !ok)
                        );
                        let key = self.guards[slot].model.key;
                        let k = &mut self.keys[key];
                        let lease = if self.guards[slot].model.shared {
                            k.readers.iter_mut().find(|r| r.owner == id).map(|r| &mut r.lease)
                        } else {
                            k.holder.as_mut().map(|h| &mut h.lease)
                        }
                        .ok_or_else(|| format!("extend of g{id} succeeded on a free key"))?;
                        let g = &mut self.guards[slot].model;
                        if watchdog {
                            *lease = Lease::Renewed { max_left: LONG };
                        } else {
                            *lease = lease.lengthened(Lease::timed(w, ttl));
                            g.validity = g.validity.lengthened(Lease::timed(w, ttl));
                        }
                        self.stats
                            .seen
                            .entry("extend: Ok")
                            .and_modify(|n| *n += 1)
                            .or_insert(1);
                        g.lost = if valid_through_answer {
                            Lost::No
                        } else {
                            Lost::Unsettled
                        };
                    }
                    Err(LockError::Lost { .. }) => {
                        ensure!(
                            !must_succeed,
                            "extend of g{id} failed with Lost, but the model has it held and valid"
                        );
                        self.guards[slot].model.lost = Lost::Yes;
                        self.hit("extend: Err(Lost)");
                    }
                    Err(ref e) => return Err(format!("extend of g{id} failed: {e:?}")),
                }
                Ok(format!("g{id} by {ttl:?}: {result:?}"))
            }
            Op::Drop { guard } => match self.pick(guard) {
                Some(slot) => self.drop_guard(slot).await,
                None => Ok("no guard".into()),
            },
            Op::Sleep => {
                tokio::time::sleep(NAP).await;
                Ok(format!("slept {NAP:?}"))
            }
            Op::IsLocked { client, key } => {
                let (w, result) = timed(self.clients[client].is_locked(KEYS[key])).await;
                let held = result.map_err(|e| format!("is_locked failed: {e:?}"))?;
                self.observe_held(key, w, held, "is_locked")?;
                self.hit("is_locked");
                Ok(format!("{held}"))
            }
            Op::RemainingTtl { client, key } => {
                let (w, result) = timed(self.clients[client].remaining_ttl(KEYS[key])).await;
                let left = result.map_err(|e| format!("remaining_ttl failed: {e:?}"))?;
                self.observe_held(key, w, left.is_some(), "remaining_ttl")?;
                if let Some(left) = left {
                    self.hit("remaining_ttl: Some");
                    self.check_left(key, w, left, "remaining_ttl")?;
                }
                Ok(format!("{left:?}"))
            }
            Op::Holder { client, key } => {
                let (w, result) = timed(self.clients[client].holder(KEYS[key])).await;
                let found = result.map_err(|e| format!("holder failed: {e:?}"))?;
                self.observe_held(key, w, found.is_some(), "holder")?;
                let Some(found) = found else {
                    return Ok("None".into());
                };
                let name = KEYS[key];
                let holder = self.keys[key].holder;
                let all = self.keys[key].readers.len();
                let live = self.keys[key]
                    .readers
                    .iter()
                    .filter(|r| r.lease.status(w) == Status::Live)
                    .count();
                if let Some(h) = holder {
                    self.hit("holder: a writer");
                    ensure!(
                        !found.is_shared() && found.readers().is_empty() && found.owner().is_some(),
                        "holder of `{name}` is {found:?}, the model has it held by {}",
                        h.show()
                    );
                    let released = h.owner.is_none() && !h.waiter;
                    // A run with `OnLost::Abort` releases its lock by itself once its validity
                    // ends (which the model learns only after this step): with a minimum hold
                    // the key is then kept, released, until the hold ends.
                    let may_have_aborted = h
                        .owner
                        .and_then(|id| self.guards.iter().find(|s| s.model.id == id))
                        .is_some_and(|s| {
                            matches!(s.real, Real::Run(Running { abort: true, .. }))
                                && s.model.validity.status(w) != Status::Live
                        });
                    ensure!(
                        found.is_released() == released || may_have_aborted,
                        "holder of `{name}` is {found:?}, the model has it held by {}",
                        h.show()
                    );
                } else if all > 0 {
                    self.hit("holder: readers");
                    let n = found.readers().len();
                    ensure!(
                        found.is_shared() && found.owner().is_none() && live <= n && n <= all,
                        "holder of `{name}` is {found:?}, the model has {live}..={all} reader(s)"
                    );
                }
                let left = found
                    .remaining()
                    .ok_or_else(|| format!("holder of `{name}` has no remaining ttl"))?;
                self.check_left(key, w, left, "the holder's remaining ttl")?;
                Ok(format!(
                    "shared {}, {} reader(s), released {}, {left:?} left",
                    found.is_shared(),
                    found.readers().len(),
                    found.is_released()
                ))
            }
            Op::ForceRelease { client, key } => {
                let (w, result) = timed(self.clients[client].force_release(KEYS[key])).await;
                let removed = result.map_err(|e| format!("force_release failed: {e:?}"))?;
                self.hit(if removed {
                    "force_release: true"
                } else {
                    "force_release: false"
                });
                self.observe_held(key, w, removed, "force_release")?;
                let owners: Vec<usize> = self.keys[key]
                    .holder
                    .and_then(|h| h.owner)
                    .into_iter()
                    .chain(self.keys[key].readers.iter().map(|r| r.owner))
                    .collect();
                for owner in owners {
                    if let Some(s) = self.guards.iter_mut().find(|s| s.model.id == owner) {
                        if s.model.watchdog {
                            *self
                                .stats
                                .seen
                                .entry("force_release: of a watched lock")
                                .or_default() += 1;
                            // Its watchdog finds out at its next renewal, and its validity ends at
                            // the latest one ttl after the last renewal, sent before this.
                            s.model.validity = Lease::Until {
                                lo: w.lo,
                                hi: w.hi + WATCHDOG,
                            };
                        }
                    }
                }
                self.keys[key].holder = None;
                self.keys[key].readers.clear();
                Ok(format!("{removed}"))
            }
        }
    }

    /// After every step: each key's state, and each guard's `is_lost()`.
    async fn check(&mut self) -> Result<(), String> {
        for (key, name) in KEYS.iter().enumerate() {
            let (w, result) = timed(self.clients[0].is_locked(name)).await;
            let held = result.map_err(|e| format!("is_locked failed: {e:?}"))?;
            self.observe_held(key, w, held, "check")?;
        }
        let mut outcomes = Vec::new();
        for s in &mut self.guards {
            // Read before `is_lost()`: a run's call ends only after its lock was lost.
            let ended = match &s.real {
                Real::Run(run) => run.task.as_ref().map(|t| t.is_finished()),
                Real::Guard(_) => None,
            };
            let lo = Instant::now();
            let lost = s.real.is_lost();
            let w = Window {
                lo,
                hi: Instant::now(),
            };
            let expected = s.model.expect_lost(w);
            outcomes.push(expected.is_some());
            if let Some(expected) = expected {
                ensure!(
                    lost == expected,
                    "g{}.is_lost() is {lost}, the model expects {expected} (validity {}, lost {:?})",
                    s.model.id,
                    s.model.validity.show(),
                    s.model.lost
                );
            }
            if lost {
                if s.model.lost != Lost::Yes {
                    *self
                        .stats
                        .seen
                        .entry(if s.model.watchdog {
                            "is_lost: a watched guard found out"
                        } else {
                            "is_lost: a guard's lease ran out"
                        })
                        .or_default() += 1;
                }
                s.model.lost = Lost::Yes;
            } else if s.model.lost == Lost::Unsettled {
                s.model.lost = Lost::No;
            }
            // The lost-lock policy of a run: with `Continue` the call goes on until its body
            // is told to finish; with `Abort` it ends exactly when the lock is lost (the body
            // dropped, `Lost` answered), soon after `is_lost()` says so, and never before.
            let (Real::Run(run), Some(ended)) = (&mut s.real, ended) else {
                continue;
            };
            let id = s.model.id;
            if !run.abort {
                ensure!(
                    !ended,
                    "g{id}'s run (on_lost continue) ended before its body was told to finish"
                );
                if lost {
                    *self
                        .stats
                        .seen
                        .entry("run: on_lost continue, lost and going on")
                        .or_default() += 1;
                }
                continue;
            }
            ensure!(
                !ended || lost,
                "g{id}'s run (on_lost abort) ended, but its lock is not lost"
            );
            if lost {
                let task = run.task.take().expect("a task not yet checked");
                let joined = tokio::time::timeout(SETTLE, task).await.map_err(|_| {
                    format!("g{id}'s lock is lost, but its run (on_lost abort) goes on after {SETTLE:?}")
                })?;
                let result = joined.map_err(|e| format!("g{id}'s run failed: {e}"))?;
                ensure!(
                    matches!(result, Err(LockError::Lost { .. })),
                    "g{id}'s run (on_lost abort) lost its lock and answered {result:?}"
                );
                *self
                    .stats
                    .seen
                    .entry("run: on_lost abort, the call ended with Lost")
                    .or_default() += 1;
            }
        }
        for decided in outcomes {
            self.decided(decided);
        }
        Ok(())
    }

    /// At the end: every guard dropped, every key freed in time, nothing waiting or watched.
    async fn finish(&mut self) -> Result<(), String> {
        let mut stays = [None; 3];
        for (key, stay) in stays.iter_mut().enumerate() {
            if self.keys[key].holder.is_some() || !self.keys[key].readers.is_empty() {
                *stay = Some(self.key_may_stay(key));
            }
        }
        self.guards.clear();
        for (key, stay) in stays.into_iter().enumerate() {
            match stay {
                Some(stay) => {
                    self.settles_free(key, SETTLE + stay, "at the end, every guard dropped")
                        .await?
                }
                None => {
                    let (w, result) = timed(self.clients[0].is_locked(KEYS[key])).await;
                    let held = result.map_err(|e| format!("is_locked failed: {e:?}"))?;
                    self.observe_held(key, w, held, "at the end")?;
                }
            }
        }
        let deadline = Instant::now() + SETTLE;
        for c in &self.clients {
            while c.waiting_channels() != 0 || c.watched_locks() != 0 {
                ensure!(
                    Instant::now() < deadline,
                    "at the end: {} channel(s) waited on, {} lock(s) watched",
                    c.waiting_channels(),
                    c.watched_locks()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        Ok(())
    }

    async fn run(&mut self, ops: &[Op]) -> Result<(), Failure> {
        for (i, op) in ops.iter().enumerate() {
            let picked = match op {
                Op::Release { guard } | Op::Extend { guard, .. } | Op::Drop { guard } => self
                    .pick(*guard)
                    .map(|s| format!(" [g{}]", self.guards[s].model.id))
                    .unwrap_or_default(),
                _ => String::new(),
            };
            let result = match self.step(*op).await {
                Ok(outcome) => {
                    self.note(format!("{i:>3}: {op:?}{picked} -> {outcome}"));
                    self.check().await
                }
                Err(e) => {
                    self.note(format!("{i:>3}: {op:?}{picked} -> DISAGREES"));
                    Err(e)
                }
            };
            if let Err(what) = result {
                return Err(Failure {
                    step: Some(i),
                    what,
                    trace: std::mem::take(&mut self.trace),
                });
            }
        }
        self.finish().await.map_err(|what| Failure {
            step: None,
            what,
            trace: std::mem::take(&mut self.trace),
        })
    }
}

/// Runs `ops` on a fresh store of `backend`, in a task of its own (a panic is a failure too).
async fn execute(backend: Backend, ops: Vec<Op>) -> Result<Stats, Failure> {
    let task = tokio::spawn(async move {
        let mut run = Run::new(backend).await;
        run.run(&ops).await?;
        if std::env::var_os("MODEL_TRACE").is_some() {
            println!("{}", run.trace.join("\n"));
        }
        Ok(run.stats)
    });
    match task.await {
        Ok(result) => result,
        Err(e) => {
            let what = match e.try_into_panic() {
                Ok(panic) => panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "a panic".into()),
                Err(e) => e.to_string(),
            };
            Err(Failure {
                step: None,
                what: format!("panicked: {what}"),
                trace: Vec::new(),
            })
        }
    }
}

/// Makes a failing sequence smaller while it still fails on a fresh store: cut after the
/// failing step, remove halves, quarters, … single steps, then simplify steps.
/// Returns the smallest failing sequence found, its failure, and how many candidates were tried
/// and how many of them failed again.
async fn shrink(backend: Backend, mut ops: Vec<Op>, mut failure: Failure) -> (Vec<Op>, Failure, u32, u32) {
    let deadline = Instant::now() + SHRINK_BUDGET;
    let mut tries = 0u32;
    let mut shrunk = 0u32;
    // A disagreement may need a timing to show (an abandoned acquire on Redis is sometimes
    // answered before the timeout fires): a candidate counts as passing only if it passes
    // `SHRINK_TRIES` times.
    let mut attempt = |candidate: Vec<Op>| {
        tries += 1;
        async move {
            for _ in 0..SHRINK_TRIES {
                if let Err(f) = execute(backend, candidate.clone()).await {
                    return Some((candidate, f));
                }
            }
            None
        }
    };
    if let Some(step) = failure.step.filter(|&s| s + 1 < ops.len()) {
        if let Some((c, f)) = attempt(ops[..=step].to_vec()).await {
            (ops, failure) = (c, f);
            shrunk += 1;
        }
    }
    let mut chunk = ops.len() / 2;
    while chunk >= 1 && Instant::now() < deadline {
        let mut i = 0;
        while i < ops.len() && Instant::now() < deadline {
            let mut candidate = ops.clone();
            candidate.drain(i..(i + chunk).min(ops.len()));
            if candidate.is_empty() {
                i += chunk;
                continue;
            }
            match attempt(candidate).await {
                Some((mut c, f)) => {
                    if let Some(step) = f.step {
                        c.truncate(step + 1);
                    }
                    println!("  {backend:?}: shrunk to {} steps", c.len());
                    (ops, failure) = (c, f);
                    shrunk += 1;
                }
                None => i += chunk,
            }
        }
        chunk /= 2;
    }
    let mut i = 0;
    while i < ops.len() && Instant::now() < deadline {
        let mut simplified = false;
        for simpler in ops[i].simpler() {
            let mut candidate = ops.clone();
            candidate[i] = simpler;
            if let Some((c, f)) = attempt(candidate).await {
                (ops, failure) = (c, f);
                shrunk += 1;
                simplified = true;
                break;
            }
        }
        if !simplified {
            i += 1;
        }
    }
    (ops, failure, tries, shrunk)
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    let value = value.trim();
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => value.replace('_', "").parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}={value}: {e}")))
}

fn seeds() -> Vec<u64> {
    if let Some(seed) = env_u64("MODEL_SEED") {
        return vec![seed];
    }
    let runs = env_u64("MODEL_RUNS").unwrap_or(RUNS);
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let base = clock ^ u64::from(std::process::id()).rotate_left(32);
    (0..runs).map(|i| mix(base.wrapping_add(i))).collect()
}

async fn random_sequences_agree_with_the_model(t: Target) {
    let backend = if t.server().is_some() {
        Backend::Redis
    } else {
        Backend::Memory
    };
    drop(t);
    let seeds = seeds();
    let started = Instant::now();
    let slots = Arc::new(Semaphore::new(PARALLEL));
    let mut runs = Vec::new();
    for seed in seeds {
        let ops = generate(seed);
        let slots = Arc::clone(&slots);
        let task = tokio::spawn({
            let ops = ops.clone();
            async move {
                let _slot = slots.acquire_owned().await;
                let begun = Instant::now();
                (execute(backend, ops).await, begun.elapsed())
            }
        });
        runs.push((seed, ops, task));
    }
    let mut failures = Vec::new();
    let mut totals = Stats::default();
    let count = runs.len();
    for (seed, ops, task) in runs {
        let (result, took) = task.await.expect("the run's task");
        match result {
            Ok(stats) => {
                totals.add(&stats);
                println!(
                    "model {backend:?} seed {seed:#018x}: {} steps agree ({} answers checked, {} \
                     too close to call) in {took:.2?}",
                    ops.len(),
                    stats.decided,
                    stats.undecided
                );
            }
            Err(f) => {
                println!(
                    "model {backend:?} seed {seed:#018x}: DISAGREES at step {:?}: {}",
                    f.step, f.what
                );
                failures.push((seed, ops, f));
            }
        }
    }
    println!(
        "model {backend:?}: {count} sequences, {} answers checked, {} too close to call, in {:.2?}",
        totals.decided,
        totals.undecided,
        started.elapsed()
    );
    for (what, n) in &totals.seen {
        println!("  {n:>5} × {what}");
    }
    let Some((seed, ops, failure)) = failures.into_iter().next() else {
        return;
    };
    println!(
        "model {backend:?} seed {seed:#018x}: shrinking {} steps",
        ops.len()
    );
    let first = failure.what.clone();
    let (ops, failure, tries, shrunk) = shrink(backend, ops, failure).await;
    let again = if shrunk == 0 {
        " (no smaller sequence failed again: the disagreement needs a timing to show)"
    } else {
        ""
    };
    let steps: String = ops
        .iter()
        .enumerate()
        .map(|(i, op)| format!("\n  {i:>3}: {op:?}"))
        .collect();
    panic!(
        "the {backend:?} backend disagrees with the model (seed {seed:#018x}; replay with \
         MODEL_SEED={seed:#x}).\nFirst disagreement: {first}\nShrunk ({tries} candidates tried, {shrunk} failed again) to {} steps{again}:{steps}\n\
         Its disagreement, at step {:?}: {}\nIts run:\n{}",
        ops.len(),
        failure.step,
        failure.what,
        failure.trace.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Composition: every mode, nested in any order, on every store.

/// The whole contract composed: seeded random sequences of calls in every mode — exclusive,
/// fair, shared (read), permits of 1 to 3 (mismatched counts included) — on single keys and on
/// sets of 2–3 overlapping keys, opened on call chains of two clients, each call either a new
/// chain or nested in a chain's innermost call (every ordered pair of modes, sets inside singles
/// and singles inside sets), with closes, cancellations (a chain's task aborted), operators'
/// forced releases, looks at `current()` and probes of `is_locked`; beside the chains, bare
/// `acquire`/`acquire_all` guards (other owners) that are extended, released or dropped, and
/// time passing (a third of the lease). Every answer is compared
/// with a model of docs/attribute.md's nesting table and docs/waiting.md's rules:
///
/// - A nested call runs in what the chain holds only when that serves it (same mode or weaker,
///   the same permit count); else `InvalidOptions`. A set nested in a chain holding part of it
///   takes the rest only when every held key comes before every missing one in canonical order,
///   else `InvalidOptions`. A call in a held lock that is lost answers `Lost`.
/// - Keys the chain does not hold are acquired (no wait): free for an exclusive call when nobody
///   holds them, for a shared call when no writer does, for a permit of n while fewer than n
///   permits of n are taken; a key held as a semaphore of another count is `InvalidOptions`
///   (a lock counts 1), a permit asked of a key held as a lock is refused (`Busy` or
///   `InvalidOptions`: the store's choice); a set is refused when any key is.
/// - `current()` inside a call names the keys of its frame in canonical order, is lost when any
///   of them is (told within a renewal after a forced release: checked with a deadline), and
///   names each key's permit where it is one.
/// - `is_locked(key)` is whether the model has a holder; a forced release answers whether it
///   had one; a cancelled chain's keys come free (its holders gone) within a deadline.
/// - A guard names its keys and permits; `extend` is `Ok` while none of its keys was freed by
///   force, `Lost` after; `release` is `Ok(true)` exactly while every key is still its own;
///   `is_lost()` follows its keys (told within a deadline); a dropped guard's keys come free
///   within a deadline.
///
/// Every call renews (watchdog, 1.2 s lease) and lets its body go on when lost
/// (`OnLost::Continue`), so that no lease ends by itself and a loss is told, not acted on.
/// `COMPOSITION_SEED=0x…` replays one sequence, `COMPOSITION_BASE=0x…` a whole run (each run
/// prints its base); `MODEL_SEQUENCES=n` sets how many run per store.
mod composition {
    use std::collections::BTreeSet;
    use std::future::Future;
    use std::pin::Pin;

    use tokio::sync::{mpsc, oneshot};

    use super::*;

    lock_tests::on_targets!(
        memory => lock_tests::Target::memory(),
        redis => lock_tests::Target::redis().await,
        cluster => lock_tests::Target::cluster().await,
        postgres => lock_tests::Target::postgres().await,
        mysql => lock_tests::Target::mysql().await,
        etcd => lock_tests::Target::etcd().await,
        zookeeper => lock_tests::Target::zookeeper().await;
        [compositions_agree_with_the_model]
    );

    /// Sequences per store in `cargo test`, and how many run at once.
    const SEQUENCES: u64 = 150;
    const AT_ONCE: usize = 10;
    const CHAINS: usize = 4;
    /// Guard slots for bare acquires.
    const GUARDS: usize = 2;
    const KEY_COUNT: usize = 3;
    /// The lease (renewed every 400 ms by the watchdog).
    const LEASE: Duration = Duration::from_millis(1200);
    /// How long a loss may take to be told, and a cancelled chain's keys to come free.
    const TOLD: Duration = Duration::from_secs(4);
    /// How long after a chain is cancelled its keys may still be refused: its calls' releases
    /// are sent in the background, and a store that releases in several statements (a MySQL
    /// permit: its row, then its header) may show no holder before the last one lands.
    const SETTLE: Duration = Duration::from_secs(2);
    /// How long any one answer may take before the run counts as hung.
    const HUNG: Duration = Duration::from_secs(15);

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Mode {
        Exclusive,
        Fair,
        Shared,
        Permits(u32),
    }

    /// How a key is held, as the nesting rules see it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Held {
        Exclusive,
        Shared,
        Permit(u32),
    }

    impl Mode {
        fn held(self) -> Held {
            match self {
                Mode::Shared => Held::Shared,
                Mode::Permits(n) if n > 1 => Held::Permit(n),
                _ => Held::Exclusive,
            }
        }

        fn options(self) -> LockOptions {
            let options = LockOptions::new(LEASE).watchdog(true).on_lost(OnLost::Continue);
            match self {
                Mode::Exclusive => options,
                Mode::Fair => options.fair(true),
                Mode::Shared => options.mode(LockMode::Shared),
                Mode::Permits(n) => options.permits(n),
            }
        }
    }

    /// Whether a lock held as `held` serves a nested call in `mode` (the nesting table).
    fn serves(held: Held, mode: Mode) -> bool {
        match (held, mode.held()) {
            (Held::Permit(n), Held::Permit(m)) => n == m,
            (Held::Permit(_), _) | (_, Held::Permit(_)) => false,
            (Held::Shared, Held::Exclusive) => false,
            _ => true,
        }
    }

    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Op {
        /// A call on `keys` (a set when `set`, else the one key) in `mode`: nested in `chain`'s
        /// innermost call when it has one, else the first call of a new chain on `client`.
        Open {
            chain: usize,
            client: usize,
            keys: Vec<usize>,
            set: bool,
            /// `None`: the mode of the chain's innermost call (exclusive for a new chain), so
            /// that nested calls the enclosing one serves are drawn as often as the others.
            mode: Option<Mode>,
        },
        /// The innermost call of `chain` returns.
        Close { chain: usize },
        /// `chain`'s task is aborted: every call in it is cancelled.
        Cancel { chain: usize },
        /// `current()` inside `chain`'s innermost call.
        Look { chain: usize },
        /// An operator's forced release of a key.
        Force { key: usize },
        /// `is_locked(key)`.
        Probe { key: usize },
        /// A bare `acquire` (one key) or `acquire_all` (a set) into guard slot `slot`, from
        /// outside any call: another owner than every chain.
        Grab {
            slot: usize,
            client: usize,
            keys: Vec<usize>,
            set: bool,
            mode: Mode,
        },
        /// `extend` of the guard in `slot`.
        Extend { slot: usize },
        /// `release` of the guard in `slot`.
        Release { slot: usize },
        /// The guard in `slot` dropped: released in the background.
        Drop { slot: usize },
        /// Time passes (400 ms, a third of the lease): the watchdog keeps every lock.
        Nap,
    }

    /// What a store offers, found by asking it.
    #[derive(Debug, Clone, Copy)]
    struct Offers {
        fair_and_shared: bool,
    }

    fn generate(seed: u64, offers: Offers) -> Vec<Op> {
        let mut dice = Dice::new(mix(seed));
        let steps = 18 + dice.below(16);
        let modes: Vec<Mode> = if offers.fair_and_shared {
            vec![
                Mode::Exclusive,
                Mode::Fair,
                Mode::Shared,
                Mode::Permits(1),
                Mode::Permits(2),
                Mode::Permits(3),
            ]
        } else {
            vec![
                Mode::Exclusive,
                Mode::Permits(1),
                Mode::Permits(2),
                Mode::Permits(3),
            ]
        };
        (0..steps)
            .map(|_| {
                let chain = dice.below(CHAINS as u64) as usize;
                let slot = dice.below(GUARDS as u64) as usize;
                let keys_of = |dice: &mut Dice, set: bool| {
                    if set {
                        let mut keys: Vec<usize> = (0..KEY_COUNT).collect();
                        // Two or three of the keys, in a random order (the call sorts them).
                        let drop = dice.below(KEY_COUNT as u64 + 1) as usize;
                        if drop < KEY_COUNT {
                            keys.remove(drop);
                        }
                        if dice.chance(50) {
                            keys.reverse();
                        }
                        keys
                    } else {
                        vec![dice.below(KEY_COUNT as u64) as usize]
                    }
                };
                match dice.below(120) {
                    100..=107 => {
                        let set = dice.chance(50);
                        Op::Grab {
                            slot,
                            client: dice.below(2) as usize,
                            keys: keys_of(&mut dice, set),
                            set,
                            mode: modes[dice.below(modes.len() as u64) as usize],
                        }
                    }
                    108..=110 => Op::Extend { slot },
                    111..=113 => Op::Release { slot },
                    114..=116 => Op::Drop { slot },
                    117..=119 => Op::Nap,
                    0..=49 => {
                        let set = dice.chance(45);
                        let keys = keys_of(&mut dice, set);
                        Op::Open {
                            chain,
                            client: dice.below(2) as usize,
                            keys,
                            set,
                            mode: (!dice.chance(40)).then(|| modes[dice.below(modes.len() as u64) as usize]),
                        }
                    }
                    50..=69 => Op::Close { chain },
                    70..=74 => Op::Cancel { chain },
                    75..=84 => Op::Look { chain },
                    85..=88 => Op::Force {
                        key: dice.below(KEY_COUNT as u64) as usize,
                    },
                    _ => Op::Probe {
                        key: dice.below(KEY_COUNT as u64) as usize,
                    },
                }
            })
            .collect()
    }

    // -----------------------------------------------------------------------------------------
    // The real calls: each chain is a task whose innermost body takes the chain's commands.

    /// What a call answered when opened.
    #[derive(Debug)]
    enum Opened {
        Entered,
        Refused(LockError),
    }

    /// What `current()` said.
    #[derive(Debug)]
    struct Seen {
        keys: Vec<String>,
        lost: bool,
        permits: Vec<Option<u32>>,
    }

    enum Command {
        Open(Call, oneshot::Sender<Opened>),
        Close(oneshot::Sender<Result<(), String>>),
        Look(oneshot::Sender<Seen>),
    }

    #[derive(Debug, Clone)]
    struct Call {
        keys: Vec<String>,
        set: bool,
        mode: Mode,
    }

    type Closing = Option<oneshot::Sender<Result<(), String>>>;

    /// A call's body: takes its chain's commands until told to close (answering that the
    /// closing call returns), opening nested calls inside itself.
    fn body<'a>(
        client: &'a LockClient,
        commands: &'a mut mpsc::UnboundedReceiver<Command>,
    ) -> Pin<Box<dyn Future<Output = Closing> + Send + 'a>> {
        Box::pin(async move {
            loop {
                match commands.recv().await? {
                    Command::Close(done) => return Some(done),
                    Command::Look(reply) => {
                        let seen = match lock_runtime::current() {
                            Some(info) => Seen {
                                keys: info.keys().map(str::to_owned).collect(),
                                lost: info.is_lost(),
                                permits: info.keys().map(|k| info.permit_for(k)).collect(),
                            },
                            None => Seen {
                                keys: Vec::new(),
                                lost: false,
                                permits: Vec::new(),
                            },
                        };
                        let _ = reply.send(seen);
                    }
                    Command::Open(call, reply) => {
                        if let Some(done) = open(client, commands, call, reply).await {
                            let _ = done.send(Ok(()));
                        }
                    }
                }
            }
        })
    }

    /// Runs `call` with a body that says it entered and then takes the chain's commands;
    /// answers the close command of the call, once it has returned.
    async fn open(
        client: &LockClient,
        commands: &mut mpsc::UnboundedReceiver<Command>,
        call: Call,
        reply: oneshot::Sender<Opened>,
    ) -> Closing {
        let options = call.mode.options();
        let mut reply = Some(reply);
        let entered = &mut reply;
        let inner = async move {
            if let Some(reply) = entered.take() {
                let _ = reply.send(Opened::Entered);
            }
            body(client, commands).await
        };
        let answer = if call.set {
            Box::pin(client.run_all(&call.keys, &options, inner)).await
        } else {
            Box::pin(client.run(&call.keys[0], &options, inner)).await
        };
        match answer {
            Ok(closing) => closing,
            Err(e) => {
                if let Some(reply) = reply.take() {
                    let _ = reply.send(Opened::Refused(e));
                    None
                } else {
                    // Entered, then ended with an error: the body was dropped with the close's
                    // answer, which then reports it (never, with `OnLost::Continue`).
                    None
                }
            }
        }
    }

    /// A chain's task: its first call, then nothing.
    struct Chain {
        commands: mpsc::UnboundedSender<Command>,
        task: tokio::task::JoinHandle<()>,
    }

    fn start_chain(client: LockClient, call: Call, reply: oneshot::Sender<Opened>) -> Chain {
        let (commands, mut receiver) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            if let Some(done) = open(&client, &mut receiver, call, reply).await {
                let _ = done.send(Ok(()));
            }
        });
        Chain { commands, task }
    }

    // -----------------------------------------------------------------------------------------
    // The model.

    /// One lock taken by a call: a key held in a mode by a chain.
    #[derive(Debug, Clone)]
    struct KeyState {
        key: usize,
        held: Held,
        /// Given back (its call closed or was cancelled).
        released: bool,
        /// When it was freed by force: lost from then on (told within `TOLD`).
        lost_at: Option<Instant>,
    }

    #[derive(Debug, Clone)]
    struct CallModel {
        /// The mode it was called in.
        mode: Mode,
        /// The states of its frame (`current()`), in canonical (key) order.
        frame: Vec<usize>,
        /// The states it took itself (released when it returns).
        took: Vec<usize>,
    }

    #[derive(Debug, Default)]
    struct Model {
        states: Vec<KeyState>,
        /// Each chain's calls, outermost first; `None` for a chain not running.
        chains: Vec<Vec<CallModel>>,
        /// Until when each key's releases by a cancelled chain may still be landing.
        settling: Vec<Option<Instant>>,
        /// Each guard slot's states, in canonical order.
        guards: Vec<Option<Vec<usize>>>,
    }

    /// A prediction of an open.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Expect {
        /// Runs, in a frame of these states (existing) and these new ones (key, held).
        Enters {
            held: Vec<usize>,
            new: Vec<(usize, Held)>,
        },
        /// One of these errors ("busy", "invalid", "lost").
        Fails(BTreeSet<&'static str>),
        /// Lost or entering: a lost lock not yet told.
        LostOrEnters { held: Vec<usize> },
        /// Enters as `Enters` says, or fails with one of these: a key a cancelled chain's
        /// release may not have reached yet.
        EntersOrFails {
            held: Vec<usize>,
            new: Vec<(usize, Held)>,
            fails: BTreeSet<&'static str>,
        },
    }

    fn kind(e: &LockError) -> &'static str {
        match e {
            LockError::Busy { .. } => "busy",
            LockError::InvalidOptions { .. } => "invalid",
            LockError::Lost { .. } => "lost",
            _ => "other",
        }
    }

    impl Model {
        fn new() -> Model {
            Model {
                states: Vec::new(),
                chains: vec![Vec::new(); CHAINS],
                settling: vec![None; KEY_COUNT],
                guards: vec![None; GUARDS],
            }
        }

        fn live(&self, key: usize) -> impl Iterator<Item = &KeyState> {
            self.states
                .iter()
                .filter(move |s| s.key == key && !s.released && s.lost_at.is_none())
        }

        /// Whether the state is lost: `Some(true)` surely told, `None` lost but maybe not told
        /// yet, `Some(false)` not lost.
        fn lost(&self, state: usize) -> Option<bool> {
            match self.states[state].lost_at {
                None => Some(false),
                Some(at) if at.elapsed() > TOLD => Some(true),
                Some(_) => None,
            }
        }

        /// The state of `key` the chain holds (the innermost call's frame holding it).
        fn held_by(&self, chain: usize, key: usize) -> Option<usize> {
            self.chains
                .get(chain)?
                .iter()
                .rev()
                .flat_map(|call| call.frame.iter())
                .copied()
                .find(|&s| self.states[s].key == key)
        }

        fn predict(&self, chain: usize, keys: &[usize], set: bool, mode: Mode) -> Expect {
            let keys: Vec<usize> = keys
                .iter()
                .copied()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let held: Vec<Option<usize>> = keys.iter().map(|&k| self.held_by(chain, k)).collect();
            let fail = |what: &[&'static str]| Expect::Fails(what.iter().copied().collect());
            if set {
                let first_missing = held.iter().position(Option::is_none);
                let last_held = held.iter().rposition(Option::is_some);
                if let (Some(missing), Some(later)) = (first_missing, last_held) {
                    if later > missing {
                        return fail(&["invalid"]);
                    }
                }
            }
            let mut kept = Vec::new();
            for state in held.iter().flatten() {
                if !serves(self.states[*state].held, mode) {
                    return fail(&["invalid"]);
                }
                kept.push(*state);
            }
            let missing: Vec<usize> = keys
                .iter()
                .zip(&held)
                .filter(|(_, h)| h.is_none())
                .map(|(k, _)| *k)
                .collect();
            if missing.is_empty() {
                return match self.any_lost(&kept) {
                    Some(true) => fail(&["lost"]),
                    None => Expect::LostOrEnters { held: kept },
                    Some(false) => Expect::Enters {
                        held: kept,
                        new: Vec::new(),
                    },
                };
            }
            let mut refusals = BTreeSet::new();
            let mut settling = false;
            for &key in &missing {
                settling |= self.is_settling(key);
                let holders: Vec<Held> = self.live(key).map(|s| s.held).collect();
                let verdict: &[&'static str] = match (mode.held(), holders.first()) {
                    (_, None) => &[],
                    (Held::Exclusive | Held::Shared, Some(_))
                        if holders.iter().any(|h| matches!(h, Held::Permit(_))) =>
                    {
                        &["invalid"]
                    }
                    (Held::Exclusive, Some(_)) => &["busy"],
                    (Held::Shared, Some(_)) if holders.contains(&Held::Exclusive) => &["busy"],
                    (Held::Shared, Some(_)) => &[],
                    (Held::Permit(n), Some(Held::Permit(m))) if n != *m => &["invalid"],
                    (Held::Permit(n), Some(Held::Permit(_))) if holders.len() as u32 >= n => &["busy"],
                    (Held::Permit(_), Some(Held::Permit(_))) => &[],
                    // Held as a lock (exclusive or shared): the store's choice.
                    (Held::Permit(_), Some(_)) => &["busy", "invalid"],
                };
                refusals.extend(verdict.iter().copied());
            }
            if !refusals.is_empty() {
                if settling {
                    refusals.extend(["busy", "invalid"]);
                }
                return Expect::Fails(refusals);
            }
            let new = missing.iter().map(|&k| (k, mode.held())).collect();
            match settling {
                true => Expect::EntersOrFails {
                    held: kept,
                    new,
                    fails: ["busy", "invalid"].into_iter().collect(),
                },
                false => Expect::Enters { held: kept, new },
            }
        }

        /// An acquire from outside every chain (a bare `acquire`/`acquire_all`).
        fn predict_outside(&self, keys: &[usize], mode: Mode) -> Expect {
            self.predict(CHAINS, keys, true, mode)
        }

        fn is_settling(&self, key: usize) -> bool {
            self.settling[key].is_some_and(|until| Instant::now() < until)
        }

        /// New states for locks just taken; answers their indices.
        fn take(&mut self, new: Vec<(usize, Held)>) -> Vec<usize> {
            new.into_iter()
                .map(|(key, held)| {
                    self.states.push(KeyState {
                        key,
                        held,
                        released: false,
                        lost_at: None,
                    });
                    self.states.len() - 1
                })
                .collect()
        }

        /// Whether any of `states` is lost: `Some(true)` surely told, `None` lost but maybe not
        /// told yet, `Some(false)` none lost.
        fn any_lost(&self, states: &[usize]) -> Option<bool> {
            let lost: Vec<Option<bool>> = states.iter().map(|&s| self.lost(s)).collect();
            if lost.contains(&Some(true)) {
                Some(true)
            } else if lost.contains(&None) {
                None
            } else {
                Some(false)
            }
        }

        /// Records an entered call.
        fn enter(&mut self, chain: usize, mode: Mode, held: Vec<usize>, new: Vec<(usize, Held)>) {
            let took = self.take(new);
            let mut frame: Vec<usize> = held.into_iter().chain(took.iter().copied()).collect();
            frame.sort_by_key(|&s| self.states[s].key);
            self.chains[chain].push(CallModel { mode, frame, took });
        }

        fn close(&mut self, chain: usize) {
            if let Some(call) = self.chains[chain].pop() {
                for state in call.took {
                    self.states[state].released = true;
                }
            }
        }

        /// The keys a cancelled chain held, all given back.
        fn cancel(&mut self, chain: usize) -> BTreeSet<usize> {
            let mut keys = BTreeSet::new();
            while let Some(call) = self.chains[chain].pop() {
                for state in call.took {
                    self.states[state].released = true;
                    keys.insert(self.states[state].key);
                }
            }
            for &key in &keys {
                self.settling[key] = Some(Instant::now() + SETTLE);
            }
            keys
        }

        /// A guard taken: its new states.
        fn grab(&mut self, slot: usize, new: Vec<(usize, Held)>) {
            self.guards[slot] = Some(self.take(new));
        }

        /// Whether a guard is lost (as [`any_lost`](Self::any_lost)).
        fn guard_lost(&self, slot: usize) -> Option<bool> {
            self.any_lost(self.guards[slot].as_deref().unwrap_or_default())
        }

        /// A guard given back (released, or dropped: then its keys settle).
        fn let_go(&mut self, slot: usize, dropped: bool) {
            for state in self.guards[slot].take().unwrap_or_default() {
                self.states[state].released = true;
                if dropped {
                    let key = self.states[state].key;
                    self.settling[key] = Some(Instant::now() + SETTLE);
                }
            }
        }

        /// A forced release: whether anyone held the key.
        fn force(&mut self, key: usize) -> bool {
            let mut had = false;
            for state in &mut self.states {
                if state.key == key && !state.released && state.lost_at.is_none() {
                    state.lost_at = Some(Instant::now());
                    had = true;
                }
            }
            had
        }

        /// How many holders the store should show for `key`.
        fn holders(&self, key: usize) -> usize {
            self.live(key).count()
        }
    }

    // -----------------------------------------------------------------------------------------
    // A run.

    struct Sequence {
        clients: [LockClient; 2],
        admin: LockClient,
        prefix: String,
        chains: Vec<Option<Chain>>,
        model: Model,
        trace: Vec<String>,
        /// Answers by what they were: for the figures.
        answers: std::collections::BTreeMap<String, usize>,
        guards: Vec<Option<LockGuard>>,
    }

    impl Drop for Sequence {
        fn drop(&mut self) {
            for chain in self.chains.iter().flatten() {
                chain.task.abort();
            }
        }
    }

    async fn within<T>(what: &str, f: impl Future<Output = T>) -> Result<T, String> {
        tokio::time::timeout(HUNG, f)
            .await
            .map_err(|_| format!("{what}: no answer within {HUNG:?} (hung)"))
    }

    impl Sequence {
        fn key(&self, key: usize) -> String {
            format!("{}c{key}", self.prefix)
        }

        async fn step(&mut self, op: &Op) -> Result<(), String> {
            match op {
                Op::Open {
                    chain,
                    client,
                    keys,
                    set,
                    mode,
                } => self.open(*chain, *client, keys, *set, *mode).await,
                Op::Close { chain } => self.close(*chain).await,
                Op::Cancel { chain } => self.cancel(*chain).await,
                Op::Look { chain } => self.look(*chain, false).await,
                Op::Force { key } => self.force(*key).await,
                Op::Grab {
                    slot,
                    client,
                    keys,
                    set,
                    mode,
                } => self.grab(*slot, *client, keys, *set, *mode).await,
                Op::Extend { slot } => self.extend(*slot).await,
                Op::Release { slot } => self.release(*slot).await,
                Op::Drop { slot } => {
                    if self.guards[*slot].take().is_some() {
                        self.model.let_go(*slot, true);
                    }
                    Ok(())
                }
                Op::Nap => {
                    tokio::time::sleep(LEASE / 3).await;
                    Ok(())
                }
                Op::Probe { key } => {
                    let name = self.key(*key);
                    let locked = within("is_locked", self.admin.is_locked(&name))
                        .await?
                        .map_err(|e| format!("is_locked({name}): {e}"))?;
                    let expected = self.model.holders(*key) > 0;
                    match locked == expected || self.model.is_settling(*key) {
                        true => Ok(()),
                        false => Err(format!("is_locked({name}) = {locked}, the model says {expected}")),
                    }
                }
            }
        }

        async fn open(
            &mut self,
            chain: usize,
            client: usize,
            keys: &[usize],
            set: bool,
            mode: Option<Mode>,
        ) -> Result<(), String> {
            let mode = mode.unwrap_or_else(|| {
                self.model.chains[chain]
                    .last()
                    .map_or(Mode::Exclusive, |call| call.mode)
            });
            self.trace.push(format!("    in mode {mode:?}"));
            let expect = self.model.predict(chain, keys, set, mode);
            let call = Call {
                keys: keys.iter().map(|&k| self.key(k)).collect(),
                set,
                mode,
            };
            let (reply, answer) = oneshot::channel();
            match &self.chains[chain] {
                Some(running) => {
                    if running.commands.send(Command::Open(call, reply)).is_err() {
                        return Err("the chain's innermost body is gone".into());
                    }
                }
                None => {
                    let client = self.clients[client].clone();
                    self.chains[chain] = Some(start_chain(client, call, reply));
                }
            }
            let answer = within("open", answer)
                .await?
                .map_err(|_| "the call ended without answering".to_owned())?;
            self.trace
                .push(format!("    answered {answer:?}, the model expected {expect:?}"));
            let nested = if self.model.chains[chain].is_empty() {
                "first"
            } else {
                "nested"
            };
            let outcome = match &answer {
                Opened::Entered => "entered",
                Opened::Refused(e) => kind(e),
            };
            *self.answers.entry(format!("{nested} {outcome}")).or_default() += 1;
            match (answer, expect) {
                (Opened::Entered, Expect::Enters { held, new }) => {
                    self.model.enter(chain, mode, held, new);
                }
                (Opened::Entered, Expect::LostOrEnters { held }) => {
                    self.model.enter(chain, mode, held, Vec::new());
                }
                (Opened::Entered, Expect::EntersOrFails { held, new, .. }) => {
                    self.model.enter(chain, mode, held, new);
                }
                (Opened::Refused(e), Expect::EntersOrFails { fails, .. }) if fails.contains(kind(&e)) => {}
                (Opened::Refused(e), Expect::Fails(kinds)) if kinds.contains(kind(&e)) => {}
                (Opened::Refused(e), Expect::LostOrEnters { .. }) if kind(&e) == "lost" => {}
                (answer, expect) => {
                    return Err(format!("open answered {answer:?}, the model expected {expect:?}"));
                }
            }
            if self.model.chains[chain].is_empty() {
                // A new chain that was refused has ended.
                if let Some(done) = self.chains[chain].take() {
                    let _ = within("the refused chain's end", done.task).await?;
                }
            }
            Ok(())
        }

        async fn close(&mut self, chain: usize) -> Result<(), String> {
            let Some(running) = &self.chains[chain] else {
                return Ok(());
            };
            let (done, closed) = oneshot::channel();
            if running.commands.send(Command::Close(done)).is_err() {
                return Err("the chain's innermost body is gone".into());
            }
            let closed = within("close", closed)
                .await?
                .map_err(|_| "the closed call ended with an error after it entered".to_owned())?;
            closed?;
            self.model.close(chain);
            if self.model.chains[chain].is_empty() {
                if let Some(done) = self.chains[chain].take() {
                    within("the chain's end", done.task)
                        .await?
                        .map_err(|e| format!("the chain's task: {e}"))?;
                }
            }
            Ok(())
        }

        async fn cancel(&mut self, chain: usize) -> Result<(), String> {
            let Some(running) = self.chains[chain].take() else {
                return Ok(());
            };
            running.task.abort();
            let _ = running.task.await;
            let keys = self.model.cancel(chain);
            for key in keys {
                let name = self.key(key);
                let expected = self.model.holders(key);
                let deadline = Instant::now() + TOLD;
                loop {
                    let seen = self.holders_in_store(&name).await?;
                    if seen == expected {
                        break;
                    }
                    if Instant::now() > deadline {
                        return Err(format!(
                            "a cancelled chain's {name} still shows {seen} holders after {TOLD:?}, the model {expected}"
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            Ok(())
        }

        async fn holders_in_store(&self, name: &str) -> Result<usize, String> {
            let holder = within("holder", self.admin.holder(name))
                .await?
                .map_err(|e| format!("holder({name}): {e}"))?;
            Ok(match holder {
                None => 0,
                Some(h) if h.is_released() => 0,
                Some(h) if h.permits().is_some() => h.permits_taken(),
                Some(h) if h.is_shared() => h.readers().len(),
                Some(_) => 1,
            })
        }

        /// `current()` in `chain`'s innermost call; with `until_told`, waits (to `TOLD`) for a
        /// lost frame to say so.
        async fn look(&mut self, chain: usize, until_told: bool) -> Result<(), String> {
            let Some(call) = self.model.chains[chain].last().cloned() else {
                return Ok(());
            };
            let Some(running) = &self.chains[chain] else {
                return Err("the model has calls on a chain that is not running".into());
            };
            let names: Vec<String> = call
                .frame
                .iter()
                .map(|&s| self.key(self.model.states[s].key))
                .collect();
            let deadline = Instant::now() + TOLD;
            loop {
                let (reply, seen) = oneshot::channel();
                if running.commands.send(Command::Look(reply)).is_err() {
                    return Err("the chain's innermost body is gone".into());
                }
                let seen = within("look", seen)
                    .await?
                    .map_err(|_| "no answer to a look".to_owned())?;
                if seen.keys != names {
                    return Err(format!("current() names {:?}, the model {names:?}", seen.keys));
                }
                for (&state, permit) in call.frame.iter().zip(&seen.permits) {
                    let ok = match self.model.states[state].held {
                        Held::Permit(n) => permit.is_some_and(|p| p < n),
                        _ => permit.is_none(),
                    };
                    if !ok {
                        return Err(format!(
                            "current().permit_for({}) = {permit:?} for a lock held as {:?}",
                            self.key(self.model.states[state].key),
                            self.model.states[state].held
                        ));
                    }
                }
                let lost = self.model.any_lost(&call.frame);
                let (surely, maybe) = (lost == Some(true), lost.is_none());
                match (seen.lost, surely, maybe) {
                    (true, _, _) if surely || maybe => return Ok(()),
                    (false, false, false) => return Ok(()),
                    (false, false, true) if !until_told => return Ok(()),
                    (false, _, _) if Instant::now() < deadline && until_told => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    (seen, _, _) => {
                        return Err(format!(
                            "current().is_lost() = {seen} for {names:?}, the model says {}",
                            if surely || maybe { "lost" } else { "held" }
                        ));
                    }
                }
            }
        }

        async fn grab(
            &mut self,
            slot: usize,
            client: usize,
            keys: &[usize],
            set: bool,
            mode: Mode,
        ) -> Result<(), String> {
            if self.guards[slot].is_some() {
                return Ok(());
            }
            // As a new chain's first call: the chain `CHAINS` never holds anything.
            let expect = self.model.predict_outside(keys, mode);
            let names: Vec<String> = keys.iter().map(|&k| self.key(k)).collect();
            let options = mode.options();
            let client = &self.clients[client];
            let answer = if set {
                within("acquire_all", client.acquire_all(&names, &options)).await?
            } else {
                within("acquire", client.acquire(&names[0], &options)).await?
            };
            self.trace
                .push(format!("    answered {answer:?}, the model expected {expect:?}"));
            let outcome = match &answer {
                Ok(_) => "entered",
                Err(e) => kind(e),
            };
            *self.answers.entry(format!("guard {outcome}")).or_default() += 1;
            match (answer, expect) {
                (Ok(guard), Expect::Enters { new, .. } | Expect::EntersOrFails { new, .. }) => {
                    self.model.grab(slot, new);
                    self.guards[slot] = Some(guard);
                    self.look_guard(slot, false)
                }
                (Err(e), Expect::Fails(kinds) | Expect::EntersOrFails { fails: kinds, .. })
                    if kinds.contains(kind(&e)) =>
                {
                    Ok(())
                }
                (answer, expect) => Err(format!(
                    "acquire answered {answer:?}, the model expected {expect:?}"
                )),
            }
        }

        /// The guard's keys, permits and loss against the model; with `until_told`, a lost
        /// guard may take until `TOLD` to say so (checked by the caller's loop).
        fn look_guard(&self, slot: usize, until_told: bool) -> Result<(), String> {
            let (Some(guard), Some(states)) = (&self.guards[slot], &self.model.guards[slot]) else {
                return Ok(());
            };
            let names: Vec<String> = states
                .iter()
                .map(|&s| self.key(self.model.states[s].key))
                .collect();
            let keys: Vec<String> = guard.keys().map(str::to_owned).collect();
            if keys != names {
                return Err(format!("the guard holds {keys:?}, the model {names:?}"));
            }
            for (&state, name) in states.iter().zip(&names) {
                let permit = guard.permit_for(name);
                let ok = match self.model.states[state].held {
                    Held::Permit(n) => permit.is_some_and(|p| p < n),
                    _ => permit.is_none(),
                };
                if !ok {
                    return Err(format!("the guard's permit_for({name}) = {permit:?}"));
                }
            }
            match (guard.is_lost(), self.model.guard_lost(slot)) {
                (true, Some(true) | None) | (false, Some(false)) => Ok(()),
                (false, None) if !until_told => Ok(()),
                (lost, model) => Err(format!("the guard's is_lost() = {lost}, the model {model:?}")),
            }
        }

        async fn extend(&mut self, slot: usize) -> Result<(), String> {
            let Some(guard) = &self.guards[slot] else {
                return Ok(());
            };
            let answer = within("extend", guard.extend(LEASE)).await?;
            self.trace.push(format!("    answered {answer:?}"));
            match (answer, self.model.guard_lost(slot)) {
                // Freed by force is lost in the store at once, told or not: the renewal finds
                // it gone.
                (Ok(()), Some(false)) | (Err(LockError::Lost { .. }), Some(true) | None) => Ok(()),
                (answer, lost) => Err(format!(
                    "extend answered {answer:?}, the model says lost {lost:?}"
                )),
            }
        }

        async fn release(&mut self, slot: usize) -> Result<(), String> {
            let Some(guard) = self.guards[slot].take() else {
                return Ok(());
            };
            // Ours exactly while no key of it was freed by force.
            let lost = self.model.guard_lost(slot);
            let answer = within("release", guard.release()).await?;
            self.trace.push(format!("    answered {answer:?}"));
            self.model.let_go(slot, false);
            match (answer, lost) {
                (Ok(true), Some(false)) | (Ok(false), Some(true) | None) => Ok(()),
                (answer, lost) => Err(format!(
                    "release answered {answer:?}, the model says lost {lost:?}"
                )),
            }
        }

        async fn force(&mut self, key: usize) -> Result<(), String> {
            let name = self.key(key);
            let freed = within("force_release", self.admin.force_release(&name))
                .await?
                .map_err(|e| format!("force_release({name}): {e}"))?;
            let expected = self.model.force(key);
            if freed != expected && !self.model.is_settling(key) {
                return Err(format!(
                    "force_release({name}) = {freed}, the model says {expected}"
                ));
            }
            // Every chain whose innermost frame covers the key is told, within a renewal or two,
            // and every guard holding it.
            for chain in 0..CHAINS {
                self.look(chain, true).await?;
            }
            for slot in 0..GUARDS {
                let deadline = Instant::now() + TOLD;
                while self.look_guard(slot, true).is_err() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                self.look_guard(slot, true)?;
            }
            Ok(())
        }
    }

    /// Runs `ops` on fresh keys; `Err((step, what, trace))` on the first disagreement.
    async fn execute(
        clients: &[LockClient; 2],
        admin: &LockClient,
        prefix: String,
        ops: &[Op],
    ) -> Result<std::collections::BTreeMap<String, usize>, (usize, String, Vec<String>)> {
        let mut run = Sequence {
            clients: clients.clone(),
            admin: admin.clone(),
            prefix,
            chains: (0..CHAINS).map(|_| None).collect(),
            model: Model::new(),
            trace: Vec::new(),
            answers: std::collections::BTreeMap::new(),
            guards: (0..GUARDS).map(|_| None).collect(),
        };
        let mut failed = None;
        for (i, op) in ops.iter().enumerate() {
            run.trace.push(format!("{i:>3}: {op:?}"));
            if let Err(what) = run.step(op).await {
                failed = Some((i, what));
                break;
            }
        }
        if failed.is_none() {
            for slot in 0..GUARDS {
                if let Err(what) = run.release(slot).await {
                    failed = Some((ops.len(), what));
                    break;
                }
            }
        }
        if failed.is_none() {
            // Every chain closed, innermost first; then every key free.
            for chain in 0..CHAINS {
                while !run.model.chains[chain].is_empty() {
                    if let Err(what) = run.close(chain).await {
                        failed = Some((ops.len(), what));
                        break;
                    }
                }
            }
        }
        if failed.is_none() {
            'keys: for key in 0..KEY_COUNT {
                let name = run.key(key);
                let deadline = Instant::now() + SETTLE + TOLD;
                loop {
                    match run.holders_in_store(&name).await {
                        Ok(0) => break,
                        Ok(n) if Instant::now() > deadline => {
                            failed = Some((
                                ops.len(),
                                format!("{name} has {n} holders after every call closed"),
                            ));
                            break 'keys;
                        }
                        Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                        Err(what) => {
                            failed = Some((ops.len(), what));
                            break 'keys;
                        }
                    }
                }
            }
        }
        match failed {
            None => Ok(std::mem::take(&mut run.answers)),
            Some((step, what)) => {
                let trace = std::mem::take(&mut run.trace);
                let names: Vec<String> = (0..KEY_COUNT).map(|k| run.key(k)).collect();
                drop(run);
                // Whatever the failed run held goes (its tasks are aborted; forced releases).
                for name in names {
                    let _ = admin.force_release(&name).await;
                }
                Err((step, what, trace))
            }
        }
    }

    /// Whether the store offers fair and shared locks (MySQL does not yet): asked, on a key of
    /// its own.
    async fn offers(client: &LockClient) -> Offers {
        let probe = client
            .acquire("composition:probe", &LockOptions::new(LEASE).fair(true))
            .await;
        let fair_and_shared = match probe {
            Ok(guard) => {
                let _ = guard.release().await;
                true
            }
            Err(LockError::InvalidOptions { .. }) => false,
            Err(e) => panic!("probing the store: {e}"),
        };
        Offers { fair_and_shared }
    }

    /// The run's seeds: `COMPOSITION_SEED` alone, or `MODEL_SEQUENCES` of them from a base
    /// (`COMPOSITION_BASE`, else the clock), which the run prints so that it can be run again
    /// whole.
    fn seeds() -> (Vec<u64>, Option<u64>) {
        if let Some(seed) = env_u64("COMPOSITION_SEED") {
            return (vec![seed], None);
        }
        let runs = env_u64("MODEL_SEQUENCES").unwrap_or(SEQUENCES);
        let base = env_u64("COMPOSITION_BASE").unwrap_or_else(|| {
            let clock = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            clock ^ u64::from(std::process::id()).rotate_left(32)
        });
        ((0..runs).map(|i| mix(base.wrapping_add(i))).collect(), Some(base))
    }

    /// Sequences that fail again, shrunk: chunks dropped, then single steps, while it fails.
    async fn shrink(
        clients: &[LockClient; 2],
        admin: &LockClient,
        seed: u64,
        mut ops: Vec<Op>,
        mut failure: (usize, String, Vec<String>),
    ) -> (Vec<Op>, (usize, String, Vec<String>)) {
        let started = Instant::now();
        let mut attempt = 0u64;
        let mut chunk = ops.len() / 2;
        while chunk >= 1 && started.elapsed() < SHRINK_BUDGET {
            let mut at = 0;
            let mut smaller = false;
            while at < ops.len() && started.elapsed() < SHRINK_BUDGET {
                let mut candidate = ops.clone();
                candidate.drain(at..(at + chunk).min(candidate.len()));
                attempt += 1;
                let prefix = format!("shrink{seed:x}.{attempt}:");
                match execute(clients, admin, prefix, &candidate).await {
                    Err(failed) => {
                        ops = candidate;
                        failure = failed;
                        smaller = true;
                    }
                    Ok(_) => at += chunk,
                }
            }
            if !smaller {
                chunk /= 2;
            }
        }
        (ops, failure)
    }

    async fn compositions_agree_with_the_model(t: Target) {
        let clients = [t.client(), t.other_client().await];
        let admin = t.other_client().await;
        let offers = offers(&clients[0]).await;
        let store = format!("{:?}", clients[0]);
        let (seeds, base) = seeds();
        let started = Instant::now();
        let slots = Arc::new(Semaphore::new(AT_ONCE));
        let mut runs = Vec::new();
        for seed in &seeds {
            let ops = generate(*seed, offers);
            let (clients, admin, slots) = (clients.clone(), admin.clone(), Arc::clone(&slots));
            let prefix = format!("{seed:x}:");
            runs.push((
                *seed,
                ops.clone(),
                tokio::spawn(async move {
                    let _slot = slots.acquire_owned().await;
                    execute(&clients, &admin, prefix, &ops).await
                }),
            ));
        }
        let mut drawn = std::collections::BTreeMap::<String, usize>::new();
        let mut failed = None;
        for (seed, ops, run) in runs {
            for op in &ops {
                let name = match op {
                    Op::Open {
                        set, mode, chain: _, ..
                    } => {
                        let mode = mode.map_or("as the enclosing call".to_owned(), |m| format!("{m:?}"));
                        format!("open {} {mode}", if *set { "set" } else { "single" })
                    }
                    other => format!("{other:?}")
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .to_owned(),
                };
                *drawn.entry(name).or_default() += 1;
            }
            match run.await.expect("the sequence's task") {
                Ok(answers) => {
                    for (what, n) in answers {
                        *drawn.entry(format!("answered: {what}")).or_default() += n;
                    }
                }
                Err(failure) => {
                    failed.get_or_insert((seed, ops, failure));
                }
            }
        }
        let again = base.map_or(String::new(), |base| format!(", COMPOSITION_BASE={base:#x}"));
        println!(
            "composition model on {store}: {} sequences ({offers:?}{again}) in {:.1?}",
            seeds.len(),
            started.elapsed()
        );
        for (what, n) in &drawn {
            println!("  {n:>6} × {what}");
        }
        let Some((seed, ops, failure)) = failed else {
            return;
        };
        let first = failure.1.clone();
        let (ops, (step, what, trace)) = shrink(&clients, &admin, seed, ops, failure).await;
        panic!(
            "{store} disagrees with the composition model (seed {seed:#018x}; replay with \
             COMPOSITION_SEED={seed:#x}).\nFirst disagreement: {first}\nShrunk to {} steps; at \
             step {step}: {what}\nIts run:\n{}",
            ops.len(),
            trace.join("\n")
        );
    }
}
