//! Whether this client ran without a stall lately: a task that beats every [`BEAT`] on the
//! client's runtime, so that a request sent after the process was stopped (SIGSTOP, a long GC-like
//! pause of the machine) or its runtime blocked is not counted as if its session were fresh.
//!
//! Why it matters: a session's timer runs at the leader, and a follower tells the leader that a
//! session was active only in its reply to the leader's next ping (every half tick). While this
//! client runs, zookeeper-client sends something at least every half of its per-server connection
//! timeout, so the leader always heard of the session at most a bounded time ago (the margin of
//! [`super::sessions`]). During a stall nothing is sent; the first request after it reaches a
//! follower, which answers it, while the leader may still expire the session before the
//! follower's report arrives. A lock granted by that answer, counted from its send, could outlive
//! its node. So after a gap in the beats, nothing is granted nor renewed until the session is
//! known fresh at the leader again: a request sent at least [`Confirm`]'s window after the gap
//! ended (by then this client's ping or request since the gap was reported, and refreshed the
//! session, or the session is gone and the read shows it), or a session opened after the gap.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How often the pulse beats.
pub(super) const BEAT: Duration = Duration::from_millis(100);

/// A beat this much later than the previous one marks a stall (the runtime was blocked or the
/// process stopped): a hiccup shorter than this is covered by the sessions' margin instead.
pub(super) const SKIP: Duration = Duration::from_millis(300);

#[derive(Debug, Default)]
struct Beats {
    /// The last beat; `None` before the first.
    last: Option<Instant>,
    /// The first beat after the last stall seen, if any.
    since: Option<Instant>,
}

/// This client's pulse (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Pulse(Mutex<Beats>);

impl Pulse {
    fn beats(&self) -> std::sync::MutexGuard<'_, Beats> {
        // Every update is one step, so a poisoned pulse is still consistent.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One beat at `now`.
    fn beat(&self, now: Instant) {
        let mut beats = self.beats();
        if beats
            .last
            .is_some_and(|last| now.saturating_duration_since(last) > SKIP)
        {
            beats.since = Some(now);
        }
        beats.last = Some(now);
    }

    /// Beats until the client goes (the task is aborted).
    pub(super) async fn run(&self) {
        let mut beats = tokio::time::interval(BEAT);
        // After a stall, one beat (the gap is what is measured), not a burst.
        beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            beats.tick().await;
            self.beat(Instant::now());
        }
    }

    /// Whether a request sent at `sent` on a session opened at `opened` may count its session
    /// fresh at the leader: `Ok`, or when to ask again (`Err`). `confirm` is the session's
    /// window from a stall's end to a request that may count it.
    pub(super) fn fresh(&self, sent: Instant, opened: Instant, confirm: Duration) -> Result<(), Instant> {
        let beats = self.beats();
        let now = Instant::now();
        match (beats.last, beats.since) {
            // The pulse has not beaten for a while, though this task runs: a stall is being
            // left (or the pulse's runtime went and it starts again). Asked again after its beat.
            (Some(last), _) if now.saturating_duration_since(last) > SKIP => Err(now + BEAT),
            (_, Some(since)) if opened < since && sent < since + confirm => Err(since + confirm),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_holds_requests_until_the_window_after_it() {
        let pulse = Pulse::default();
        let start = Instant::now();
        let confirm = Duration::from_millis(700);
        // Never beaten yet: nothing known of a stall.
        assert_eq!(pulse.fresh(start, start, confirm), Ok(()));
        pulse.beat(start);
        pulse.beat(start + BEAT);
        assert_eq!(pulse.fresh(start + BEAT, start, confirm), Ok(()));
        // A stall of a second: held until `confirm` after the beat that ended it.
        let thawed = start + BEAT + Duration::from_secs(1);
        pulse.beat(thawed);
        assert_eq!(pulse.fresh(thawed, start, confirm), Err(thawed + confirm));
        assert_eq!(pulse.fresh(thawed + confirm, start, confirm), Ok(()));
        // A session opened after the stall is fresh from its handshake.
        assert_eq!(pulse.fresh(thawed, thawed, confirm), Ok(()));
        // A send judged only after a stall that followed it waits too (never less safe).
        assert_eq!(pulse.fresh(start, start, confirm), Err(thawed + confirm));
    }
}
