//! A queue store's sessions (etcd's leases, ZooKeeper's sessions): one per ttl class, a ttl
//! rounded up to whole seconds, so that the places of a client that dies lapse with its
//! session within about their ttl, and nothing is granted per lock. [`ByClass`] is the registry
//! both keep them in: found by class or by id, marked used when a lock asks for one, and those
//! idle for [`IDLE`] with no place on them taken out, for the store to end. How a session is
//! opened, kept alive and ended is the store's.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// A session unused this long, with no place on it, is ended.
pub(crate) const IDLE: Duration = Duration::from_secs(60);

/// A ttl's class: its whole seconds, rounded up (at least 1).
pub(crate) fn class_of(ttl_ms: u64) -> u64 {
    ttl_ms.div_ceil(1000).max(1)
}

/// What the registry needs of a store's session.
pub(crate) trait Session: Clone {
    /// Its id: what the store's places name as their owner (a lease, a session id).
    fn id(&self) -> i64;
}

/// A session and when a lock last asked for it (or the keeper found a place on it).
#[derive(Debug)]
struct Kept<S> {
    session: S,
    used: Instant,
}

/// One client's sessions, by class.
#[derive(Debug)]
pub(crate) struct ByClass<S> {
    /// Never held across an await.
    by_class: Mutex<HashMap<u64, Kept<S>>>,
}

impl<S> Default for ByClass<S> {
    fn default() -> Self {
        ByClass {
            by_class: Mutex::new(HashMap::new()),
        }
    }
}

impl<S: Session> ByClass<S> {
    fn all(&self) -> MutexGuard<'_, HashMap<u64, Kept<S>>> {
        // Every update is one step, so a poisoned map is still consistent.
        self.by_class.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The session of `class`, marked used now.
    pub(crate) fn used(&self, class: u64) -> Option<S> {
        let mut all = self.all();
        let kept = all.get_mut(&class)?;
        kept.used = Instant::now();
        Some(kept.session.clone())
    }

    /// `session` for `class`, unless one is there already (two first uses at once): the one
    /// kept is answered.
    pub(crate) fn add(&self, class: u64, session: S) -> S {
        let kept = Kept {
            session,
            used: Instant::now(),
        };
        self.all().entry(class).or_insert(kept).session.clone()
    }

    /// The session with id `id`, if it is one of ours.
    pub(crate) fn by_id(&self, id: i64) -> Option<S> {
        let all = self.all();
        all.values()
            .find(|k| k.session.id() == id)
            .map(|k| k.session.clone())
    }

    /// Changes the session with id `id` in place; what `change` answers, if it is one of ours.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // etcd's renewals
    pub(crate) fn update<R>(&self, id: i64, change: impl FnOnce(&mut S) -> R) -> Option<R> {
        let mut all = self.all();
        let kept = all.values_mut().find(|k| k.session.id() == id)?;
        Some(change(&mut kept.session))
    }

    /// The sessions for which `pick` says yes.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // etcd's renewals
    pub(crate) fn those(&self, pick: impl Fn(&S) -> bool) -> Vec<S> {
        let all = self.all();
        all.values()
            .map(|k| &k.session)
            .filter(|s| pick(s))
            .cloned()
            .collect()
    }

    /// The earliest of `when` over the sessions.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // etcd's renewals
    pub(crate) fn earliest(&self, when: impl Fn(&S) -> Instant) -> Option<Instant> {
        self.all().values().map(|k| when(&k.session)).min()
    }

    /// Forgets the session `id` (it ended): the next use of its class opens another.
    pub(crate) fn forget(&self, id: i64) {
        self.all().retain(|_, k| k.session.id() != id);
    }

    /// Takes out the sessions unused for [`IDLE`] on which no place of this client is
    /// (`in_use`), for the store to end; a session in use counts as used now.
    pub(crate) fn take_idle(&self, in_use: impl Fn(i64) -> bool) -> Vec<S> {
        let now = Instant::now();
        let mut idle = Vec::new();
        self.all().retain(|_, k| {
            if in_use(k.session.id()) {
                k.used = now;
            }
            let keep = now.saturating_duration_since(k.used) < IDLE;
            if !keep {
                idle.push(k.session.clone());
            }
            keep
        });
        idle
    }

    /// When the next session may become idle.
    #[cfg_attr(not(feature = "zookeeper"), allow(dead_code))] // ZooKeeper's keeper
    pub(crate) fn next_idle(&self) -> Option<Instant> {
        self.all().values().map(|k| k.used + IDLE).min()
    }

    /// Takes every session out (the client is going), for the store to end.
    pub(crate) fn take_all(&self) -> Vec<S> {
        self.all().drain().map(|(_, k)| k.session).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Lease(i64, &'static str);

    impl Session for Lease {
        fn id(&self) -> i64 {
            self.0
        }
    }

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(class_of(0), 1);
        assert_eq!(class_of(1), 1);
        assert_eq!(class_of(1000), 1);
        assert_eq!(class_of(1001), 2);
        assert_eq!(class_of(30_000), 30);
    }

    #[test]
    fn the_first_session_of_a_class_stays_and_is_found_by_class_and_id() {
        let sessions = ByClass::default();
        assert_eq!(sessions.add(2, Lease(7, "first")), Lease(7, "first"));
        assert_eq!(sessions.add(2, Lease(8, "second")), Lease(7, "first"));
        assert_eq!(sessions.used(2), Some(Lease(7, "first")));
        assert_eq!(sessions.used(3), None);
        assert_eq!(sessions.by_id(7), Some(Lease(7, "first")));
        assert_eq!(sessions.by_id(8), None);
        assert_eq!(
            sessions.update(7, |s| std::mem::replace(&mut s.1, "renewed")),
            Some("first")
        );
        assert_eq!(sessions.those(|s| s.1 == "renewed"), vec![Lease(7, "renewed")]);
        sessions.forget(7);
        assert_eq!(sessions.used(2), None);
        assert_eq!(sessions.add(2, Lease(9, "again")), Lease(9, "again"));
        assert_eq!(sessions.take_all(), vec![Lease(9, "again")]);
        assert_eq!(sessions.by_id(9), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_idle_with_no_place_on_it_is_taken_out() {
        let sessions = ByClass::default();
        sessions.add(1, Lease(1, "holds"));
        sessions.add(2, Lease(2, "idle"));
        sessions.add(3, Lease(3, "asked"));
        assert_eq!(sessions.next_idle(), Some(Instant::now() + IDLE));
        tokio::time::advance(IDLE / 2).await;
        sessions.used(3);
        assert!(sessions.take_idle(|id| id == 1).is_empty());
        tokio::time::advance(IDLE / 2).await;
        // 1 has a place, 3 was asked for half an idle time ago.
        assert_eq!(sessions.take_idle(|id| id == 1), vec![Lease(2, "idle")]);
        tokio::time::advance(IDLE / 2).await;
        // 1's place was last seen half an idle time ago; 3 was asked for an idle time ago.
        assert_eq!(sessions.take_idle(|_| false), vec![Lease(3, "asked")]);
        tokio::time::advance(IDLE / 2).await;
        assert_eq!(sessions.take_idle(|_| false), vec![Lease(1, "holds")]);
        assert_eq!(sessions.next_idle(), None);
    }
}
