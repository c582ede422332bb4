//! What a caller asks of one lock: [`LockOptions`] and [`OnLost`].

use std::time::Duration;

use crate::LockError;

/// The shortest ttl accepted: below it the clock drift allowance leaves no validity.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// The shortest ttl accepted with the watchdog: it renews every ttl/3, which leaves a round
/// trip less than ~ttl/3 of slack; below 60 ms one slow round trip would lose the lock.
pub const MIN_WATCHDOG_TTL: Duration = Duration::from_millis(60);
/// How long a fair waiter keeps its place in the queue without asking again: a waiter that died
/// delays the ones behind it by at most this (plus one of their naps, at most 300 ms).
pub const FAIR_PLACE_KEPT: Duration = Duration::from_secs(1);

/// The most permits one key may have ([`LockOptions::permits`]): each acquire of a permit looks
/// at every taken one, so the count stays small enough for that to be one short request.
pub const MAX_PERMITS: u32 = 1024;

/// The longest ttl, wait or minimum hold accepted (30 days): longer values are almost always a
/// unit mistake, and they keep every deadline far from overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// What happens to the guarded code when its lock is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnLost {
    /// Stop the guarded code (its future is dropped) and return [`LockError::Lost`]. The default:
    /// code that needs mutual exclusion must not go on without it.
    #[default]
    Abort,
    /// Let the guarded code finish and log a warning. For bodies that cannot be interrupted
    /// safely and use a fencing token to make a late write harmless.
    Continue,
}

/// Whether a lock is held by one caller or shared by readers.
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::{LockMode, LockOptions};
///
/// // Any number of readers of `prices:eu` at once, or one writer:
/// let read = LockOptions::new(Duration::from_secs(10)).mode(LockMode::Shared);
/// let write = LockOptions::new(Duration::from_secs(10)); // Exclusive, the default
/// assert_eq!(read.get_mode(), LockMode::Shared);
/// assert_eq!(write.get_mode(), LockMode::Exclusive);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LockMode {
    /// One holder at a time (the default): a plain lock, or the write side of a read-write lock.
    #[default]
    Exclusive,
    /// Any number of shared holders at once, and no exclusive holder meanwhile: the read side of
    /// a read-write lock. Each shared holder has its own token and lease (a crashed reader's
    /// share expires on its own), is renewed by the watchdog like a lock, and gives its share
    /// back with a token-checked release. Once an exclusive caller waits, new shared holders
    /// wait behind it (writers are not starved by a stream of readers).
    Shared,
}

/// How to take and hold one lock. Built from [`LockOptions::new`] and by-value setters.
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::{LockOptions, OnLost};
///
/// let options = LockOptions::new(Duration::from_secs(30))
///     .watchdog(true)
///     .wait(Duration::from_secs(5))
///     .fencing(true)
///     .on_lost(OnLost::Abort);
/// assert_eq!(options.ttl(), Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockOptions {
    ttl: Duration,
    watchdog: bool,
    wait: Duration,
    fencing: bool,
    hold_at_least: Duration,
    hold_at_most: Option<Duration>,
    on_lost: OnLost,
    fair: bool,
    mode: LockMode,
    permits: u32,
}

impl LockOptions {
    /// Options for a lock that expires `ttl` after it is taken (or after its last renewal).
    /// No watchdog, no wait (one attempt), no fencing, no minimum hold, [`OnLost::Abort`].
    pub fn new(ttl: Duration) -> Self {
        LockOptions {
            ttl,
            watchdog: false,
            wait: Duration::ZERO,
            fencing: false,
            hold_at_least: Duration::ZERO,
            hold_at_most: None,
            on_lost: OnLost::Abort,
            fair: false,
            mode: LockMode::Exclusive,
            permits: 1,
        }
    }

    /// Renew the lock every ttl/3 while it is held (default off: the ttl is a hard lease).
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// Keep trying for up to `wait` when the lock is held, woken by the holder's release
    /// (default zero: one attempt, then [`LockError::Busy`]).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Take a fencing token with the lock (default off): a number that strictly increases with
    /// every acquisition of the key, to hand to storage that rejects older tokens.
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// Keep the lock for at least this long after it was taken, even when released earlier, so a
    /// fast scheduled job is not run again by another instance in the same period (default zero).
    pub fn hold_at_least(mut self, hold: Duration) -> Self {
        self.hold_at_least = hold;
        self
    }

    /// Hold the lock for at most this long after it was taken, however long the body runs
    /// (ShedLock's `lockAtMostFor`; default none): the watchdog does not renew it past this
    /// point, nor does [`extend`](crate::LockGuard::extend), and the lost-lock policy applies
    /// there ([`OnLost::Abort`]: the body is dropped and the call fails with
    /// [`LockError::Lost`]). So a hung body cannot keep a watchdog lock forever. At least the
    /// ttl, else [`LockError::InvalidOptions`]. A nested (reentrant) call runs under the
    /// outermost call's limit.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_runtime::LockOptions;
    ///
    /// // Renewed every 10 s while the job runs, but never held past 10 minutes.
    /// let options = LockOptions::new(Duration::from_secs(30))
    ///     .watchdog(true)
    ///     .hold_at_most(Duration::from_secs(600));
    /// assert_eq!(options.get_hold_at_most(), Some(Duration::from_secs(600)));
    /// ```
    pub fn hold_at_most(mut self, hold: Duration) -> Self {
        self.hold_at_most = Some(hold);
        self
    }

    /// What to do with the guarded code when the lock is lost (default [`OnLost::Abort`]).
    pub fn on_lost(mut self, policy: OnLost) -> Self {
        self.on_lost = policy;
        self
    }

    /// Waiters get the lock in the order they began waiting, across all clients and processes
    /// (default off: a release wakes one waiter per client, and whichever asks first gets it).
    ///
    /// Fair waiters queue in Redis, next to the lock; a release hands the lock to exactly the
    /// next one (which holds it without asking), and nobody (not even a caller that does not
    /// wait) takes the lock ahead of the queue. A waiter that died keeps its place, or a lock
    /// handed to it, for at most [`FAIR_PLACE_KEPT`] after its last attempt, so it delays the
    /// others by at most that much and one of their naps (300 ms); one that gives up or is
    /// cancelled leaves at once. Fairness holds among
    /// callers that all ask for it: a non-fair acquire on the same key ignores the queue.
    pub fn fair(mut self, on: bool) -> Self {
        self.fair = on;
        self
    }

    /// Exclusive (the default: one holder) or shared (a read lock: many holders at once, none
    /// while an exclusive holder has the key). See [`LockMode`].
    pub fn mode(mut self, mode: LockMode) -> Self {
        self.mode = mode;
        self
    }

    /// Lets up to `n` holders in at once: a semaphore (default 1, the ordinary lock). Each
    /// holder takes one permit, numbered `0..n` ([`LockGuard::permit`](crate::LockGuard::permit)),
    /// with its own token and lease: everything else holds per permit (ttl, watchdog, waiting
    /// woken by a release, minimum and maximum hold, the lost policy, reentrancy, fencing with
    /// tokens that rise per key and so per permit). A permit whose holder stops renewing lapses
    /// at its ttl. The count is stored with the key while any permit is taken: an acquire
    /// asking a different count for the same key is [`LockError::InvalidOptions`] naming both.
    /// Not with [`LockMode::Shared`]; at most [`MAX_PERMITS`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_runtime::LockOptions;
    ///
    /// // At most 4 exports of one tenant at once, across every instance:
    /// let options = LockOptions::new(Duration::from_secs(30)).permits(4).watchdog(true);
    /// assert_eq!(options.get_permits(), 4);
    /// ```
    pub fn permits(mut self, n: u32) -> Self {
        self.permits = n;
        self
    }

    /// How many holders may hold the key at once (see [`permits`](Self::permits)).
    pub fn get_permits(&self) -> u32 {
        self.permits
    }

    /// Whether these options take a permit of a semaphore (more than one permit).
    pub(crate) fn is_semaphore(&self) -> bool {
        self.permits > 1
    }

    /// The lock mode (see [`mode`](Self::mode)).
    pub fn get_mode(&self) -> LockMode {
        self.mode
    }

    /// Whether waiters queue in the order they arrived.
    pub fn is_fair(&self) -> bool {
        self.fair
    }

    /// The lease length.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether the watchdog renews the lock.
    pub fn is_watchdog(&self) -> bool {
        self.watchdog
    }

    /// How long an acquire keeps trying (see [`wait`](Self::wait)).
    pub fn get_wait(&self) -> Duration {
        self.wait
    }

    /// Whether a fencing token is taken.
    pub fn is_fencing(&self) -> bool {
        self.fencing
    }

    /// The minimum hold (see [`hold_at_least`](Self::hold_at_least)).
    pub fn get_hold_at_least(&self) -> Duration {
        self.hold_at_least
    }

    /// The maximum hold, if any (see [`hold_at_most`](Self::hold_at_most)).
    pub fn get_hold_at_most(&self) -> Option<Duration> {
        self.hold_at_most
    }

    /// The lost-lock policy (see [`on_lost`](Self::on_lost)).
    pub fn get_on_lost(&self) -> OnLost {
        self.on_lost
    }

    /// The ttl in whole milliseconds, as Redis takes it (sub-millisecond parts round up).
    pub(crate) fn ttl_ms(&self) -> u64 {
        ceil_millis(self.ttl)
    }

    /// Rejects options that cannot work, with a message that says which and why.
    pub(crate) fn validate(&self) -> Result<(), LockError> {
        if self.ttl.is_zero() {
            return Err(LockError::invalid_options("ttl must be greater than zero"));
        }
        if self.ttl < MIN_TTL {
            return Err(LockError::invalid_options(format!(
                "ttl {:?} is below the minimum of {MIN_TTL:?}",
                self.ttl
            )));
        }
        if self.watchdog && self.ttl < MIN_WATCHDOG_TTL {
            return Err(LockError::invalid_options(format!(
                "ttl {:?} is too short for the watchdog (renews every ttl/3); use at least {MIN_WATCHDOG_TTL:?}",
                self.ttl
            )));
        }
        if self.permits == 0 {
            return Err(LockError::invalid_options(
                "permits must be at least 1 (1 is the ordinary lock)",
            ));
        }
        if self.permits > MAX_PERMITS {
            return Err(LockError::invalid_options(format!(
                "permits {} exceeds the maximum of {MAX_PERMITS}",
                self.permits
            )));
        }
        if self.is_semaphore() && self.mode == LockMode::Shared {
            return Err(LockError::invalid_options(format!(
                "permits ({}) cannot be combined with a shared (read) lock: a semaphore's \
                 holders are counted, readers are not",
                self.permits
            )));
        }
        if self.mode == LockMode::Shared {
            if self.fair {
                return Err(LockError::invalid_options(
                    "a shared (read) lock cannot be fair: waiting writers are preferred over new readers instead",
                ));
            }
            if !self.hold_at_least.is_zero() {
                return Err(LockError::invalid_options(
                    "a shared (read) lock takes no minimum hold: a hold keeps others out, and readers do not exclude each other",
                ));
            }
        }
        if let Some(most) = self.hold_at_most {
            if most < self.ttl {
                return Err(LockError::invalid_options(format!(
                    "hold_at_most {most:?} is below the ttl {:?}: the first lease would already \
                     outlast it (use a shorter ttl, or no maximum)",
                    self.ttl
                )));
            }
            if most < self.hold_at_least {
                return Err(LockError::invalid_options(format!(
                    "hold_at_most {most:?} is below hold_at_least {:?}",
                    self.hold_at_least
                )));
            }
        }
        for (name, value) in [
            ("ttl", self.ttl),
            ("wait", self.wait),
            ("hold_at_least", self.hold_at_least),
            ("hold_at_most", self.hold_at_most.unwrap_or_default()),
        ] {
            if value > MAX_DURATION {
                return Err(LockError::invalid_options(format!(
                    "{name} {value:?} exceeds the maximum of {MAX_DURATION:?}"
                )));
            }
        }
        Ok(())
    }
}

/// How much validity a lease of `ttl` loses to clock drift and the request's own flight time:
/// ttl/100 + 2 ms (as in the Redlock paper's drift factor).
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

pub(crate) fn ceil_millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_zero_short_and_huge() {
        let ok = LockOptions::new(Duration::from_secs(1));
        assert!(ok.validate().is_ok());
        for bad in [
            LockOptions::new(Duration::ZERO),
            LockOptions::new(Duration::from_millis(5)),
            LockOptions::new(Duration::from_millis(30)).watchdog(true),
            LockOptions::new(MAX_DURATION + Duration::from_secs(1)),
            ok.clone().wait(Duration::MAX),
            ok.clone().hold_at_least(Duration::MAX),
            ok.clone().hold_at_most(Duration::from_millis(999)),
            ok.clone().hold_at_most(Duration::MAX),
            ok.clone()
                .hold_at_least(Duration::from_secs(5))
                .hold_at_most(Duration::from_secs(2)),
            ok.clone().mode(LockMode::Shared).fair(true),
            ok.clone()
                .mode(LockMode::Shared)
                .hold_at_least(Duration::from_secs(1)),
        ] {
            assert!(
                matches!(bad.validate(), Err(LockError::InvalidOptions { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn drift_and_millis() {
        assert_eq!(drift(Duration::from_secs(30)), Duration::from_millis(302));
        assert_eq!(ceil_millis(Duration::from_micros(1500)), 2);
        assert_eq!(ceil_millis(Duration::from_millis(7)), 7);
    }
}
