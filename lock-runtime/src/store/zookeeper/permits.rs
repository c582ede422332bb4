//! Semaphores on ZooKeeper. A permit is claimed by an ephemeral sequential node
//! `_c_<uuid>-permit-<count>-<permit>-<seq>` under the lock's node, holding the caller's token;
//! of two claims of one permit the older (the lower sequence) holds it, and the newer one's
//! maker gives it up on seeing the older: every claim is read behind its own create on the
//! same session, so the newer of two always sees the older, and at most `count` callers hold at
//! once. A claim is refused (given up, `InvalidOptions` naming both counts) where the key's
//! line has a lock node (a lock or read-write lock, ours or Curator's) or where permits of
//! another count are claimed: the count is stored with the key. A lock's caller likewise
//! refuses a key with claims.
//!
//! A newcomer claims the lowest permit it believes free at once (a create and a read), and
//! when that permit was taken, the lowest free one it read; a fair newcomer reads first, and
//! queues behind any waiter it finds. A newcomer that will wait while another waiter of its
//! client queues at the key queues at once, fair or not (a client's waiters take their turns in
//! order). A caller that will wait and finds
//! every permit taken queues an ephemeral sequential node `_c_<uuid>-queue-<seq>`. The waiter
//! at rank `r` of the queue claims while more than `r` permits are free (the `r`-th free one:
//! the first waiters claim different permits at once, so releases close together are taken up
//! together); the first `count` waiters watch the claims that hold, and any other waiter the
//! queue node `count` places ahead of its own, whose going brings it among the first. A woken
//! waiter looks (behind a `sync`; the oldest one, told which claim went, claims that permit
//! without a look), claims, and deletes its queue node once it holds. The
//! fencing token is the claim's `czxid`: it rises with every claim made at the key. Curator's
//! recipes do not see these nodes (nor its `InterProcessSemaphoreV2` ours: it keeps leases
//! under a node of its own).

use futures_util::future::{join_all, select_all};
use tokio::time::Instant;
use zookeeper_client::EventType;

use super::names::{self, Permits, Standing};
use super::sessions::Session;
use super::{Looked, Place, Placed, ZkStore};
use crate::store::line::Line;
use crate::store::{permits_differ, Ask, Attempt, Flight, Lock};
use crate::LockError;

/// How many permits one attempt claims when the one it claimed was taken meanwhile.
const TRIES: usize = 4;

/// What a look at a semaphore's nodes says to do next.
enum Next {
    /// Claim this permit.
    Claim(u32),
    /// Look (a woken waiter, or one just queued).
    Look,
    /// Wait behind this queue node.
    Behind(String),
    /// Among the first waiters (at `rank`), no permit free for it: wait for a claim or a waiter
    /// ahead to go (the first waiter may claim the permit that went without a look).
    ForAClaim { rank: usize },
    /// Admitted, but every claim it made lost its race: look again at once.
    LostRaces,
    /// Refused, for a caller that will not wait.
    Refused,
    /// Queue (a newcomer that will wait, every permit taken).
    Queue,
}

impl ZkStore {
    /// One attempt at any free permit of a semaphore of `ask_.mode.permits()` (see the module doc).
    pub(super) async fn permit_attempt(
        &self,
        lock: &Lock,
        token: &str,
        ask_: &Ask,
        flight: &Flight,
    ) -> Result<Attempt, LockError> {
        let count = ask_.mode.permits();
        let sent = Instant::now();
        let (mut queued, session) = self.queued_on(token, ask_).await?;
        let sent = self.confirmed(sent, &session).await;
        // The release of an attempt whose answer never came follows it on this session.
        flight.set(session.id as u64);
        let uuid = names::uuid_of(token);
        // A newcomer claims at once; a woken waiter looks first (behind a `sync`).
        // The lowest permit this client does not hold of the key: free, when no other client
        // holds one.
        let unheld = (0..count)
            .find(|p| !self.holds_permit(lock.name(), *p))
            .unwrap_or(0);
        // A newcomer that will wait while another waiter of this client queues at the key
        // queues at once, and looks behind its node: this client's waiters take their turns in
        // order, as on every store (a caller that gave a permit back and asks again does not
        // take it back from under the waiter its release woke). A fair newcomer looks first
        // otherwise: it claims only while nobody queues. The oldest waiter woken by a claim's deletion
        // claims that permit at once (the claim's read behind it says the rest).
        let freed = super::locked(&self.shared.freed).remove(token);
        let mut next = match (&queued, freed) {
            (None, _) if ask_.join && self.queues_at(lock.name()) => Next::Queue,
            (None, _) if !ask_.mode.fair() => Next::Claim(unheld),
            (Some(_), Some(permit)) if permit < count => Next::Claim(permit),
            _ => Next::Look,
        };
        let mut claims = 0;
        loop {
            let (claim, children) = match next {
                Next::Claim(permit) => {
                    claims += 1;
                    let prefix = names::claim_prefix(lock.name(), &uuid, count, permit);
                    // A claim is decided by the claims older than itself, which its server
                    // applied before it.
                    let ((path, czxid), children) =
                        self.create_and_look(&session, lock, &prefix, token).await?;
                    (Some((path, czxid, permit)), children)
                }
                Next::Queue => {
                    let (place, children) = self.queue((lock, token), &session, &uuid).await?;
                    queued = Some(place);
                    (None, children)
                }
                _ => (None, self.look(&session, lock.name(), false, true).await),
            };
            let children = match children {
                Ok(looked) => looked.children,
                Err(e) => {
                    if let Some((path, czxid, permit)) = claim {
                        self.give_up(token, self.claim_place(lock, &session, (path, czxid, permit)))
                            .await;
                    }
                    return Err(e);
                }
            };
            let permits = Permits::of(&children);
            let held_as = if names::line(&children).is_empty() {
                permits.other_count(count)
            } else {
                Some(1)
            };
            if let Some(held) = held_as {
                if let Some(claim) = claim {
                    self.give_up(token, self.claim_place(lock, &session, claim)).await;
                }
                return Err(permits_differ(lock.key(), held, count));
            }
            if let Some((path, czxid, permit)) = claim {
                let place = self.claim_place(lock, &session, (path, czxid, permit));
                if permits.holds(place.path.rsplit('/').next().unwrap_or_default()) {
                    if let Some(queued) = queued.take() {
                        // Out of the queue: the next waiter wakes. The caller need not wait
                        // for that: the delete goes out now, its answer is read meanwhile.
                        self.shared.book.forget(token);
                        self.give_up_soon(token, queued);
                    }
                    return Ok(self.taken(token, place, ask_, (sent, &session), None));
                }
                // An older claim holds that permit: this one is given up.
                self.give_up(token, place).await;
            }
            let mine = queued
                .as_ref()
                .map(|q| q.path.rsplit('/').next().unwrap_or_default().to_owned());
            let standing = mine.as_deref().map(|mine| permits.standing(mine, count));
            if let Some(Standing::Gone) = standing {
                // Its queue node went (an operator deleted it): a newcomer again.
                self.shared.book.forget(token);
                queued = None;
            }
            next = next_step(
                lock.name(),
                standing,
                (&permits, count),
                ask_,
                (queued.is_some(), claims),
            );
            if let Some(answer) = self.wait_for(&next, (lock, token), &session, &permits) {
                return Ok(answer);
            }
        }
    }

    /// Queues the caller: its node `_c_<uuid>-queue-<seq>` made and recorded, and the lock's
    /// children read behind it (a permit another client gave back before the node was made is
    /// seen: see [`create_and_look`](Self::create_and_look)).
    async fn queue(
        &self,
        (lock, token): (&Lock, &str),
        session: &Session,
        uuid: &str,
    ) -> Result<(Place, Result<Looked, LockError>), LockError> {
        let prefix = names::queue_prefix(lock.name(), uuid);
        let ((path, czxid), children) = self.create_and_look(session, lock, &prefix, token).await?;
        // A waiter's node: no permit (and, as a claim's, no token left when it goes).
        let place = Place {
            permit: None,
            ..self.claim_place(lock, session, (path, czxid, 0))
        };
        self.shared.book.record(token, Placed::waiting(place.clone()));
        Ok((place, children))
    }

    /// A queued waiter's node (`None`: a newcomer, or a waiter whose session ended, and its
    /// queue node with it) and the session its attempt goes on.
    async fn queued_on(&self, token: &str, ask_: &Ask) -> Result<(Option<Place>, Session), LockError> {
        let mut queued = self
            .shared
            .book
            .places()
            .get(token)
            .filter(|p| p.until.is_none())
            .map(|p| p.of.clone());
        if let Some(session) = queued.as_ref().and_then(|q| self.shared.session(q.session)) {
            return Ok((queued, session));
        }
        if queued.take().is_some() {
            self.shared.book.forget(token);
            self.shared.unwatch(token);
        }
        Ok((None, self.session(ask_.ttl_ms).await?))
    }

    /// Where `next` leaves the attempt: waiting (its watch set) or refused, or `None` to go on
    /// (claim, look, or look again behind its own queue node: a permit may have been given
    /// back before its node was in the queue).
    fn wait_for(
        &self,
        next: &Next,
        (lock, token): (&Lock, &str),
        session: &Session,
        permits: &Permits,
    ) -> Option<Attempt> {
        match next {
            Next::Claim(_) | Next::Look | Next::Queue => None,
            Next::Behind(ahead) => {
                self.watch(lock, token, session, ahead.clone());
                Some(Attempt::behind())
            }
            Next::LostRaces => {
                // It lost every race for a permit free for it (newcomers claimed them first):
                // it looks again at once rather than wait for a holder whose release would
                // leave that permit idle meanwhile. Each race lost is another caller's permit
                // taken, so this ends.
                self.shared.notices.turn(lock.name(), token.as_bytes(), None);
                Some(Attempt::behind())
            }
            Next::ForAClaim { rank } => {
                let holding = permits.holding.iter().map(|c| c.name.as_str());
                let ahead = permits.queue.iter().take(*rank).map(|(name, _)| name.as_str());
                let watched = holding
                    .chain(ahead)
                    .map(|name| format!("{}/{name}", lock.name()))
                    .collect();
                self.watch_claims((lock, token), session, watched, *rank == 0);
                Some(Attempt::behind())
            }
            Next::Refused => Some(Attempt::HELD),
        }
    }

    /// Makes the node `prefix` (a claim, or a queue node) and reads the lock's children behind it,
    /// in one round trip: the requests go out together on the session, whose server answers them
    /// in order, so the read sees the node, and with it every change the leader committed before
    /// the node (a server applies changes in the leader's order: a `sync` would add a round trip
    /// to the leader, ahead of every later request of the session, and show only what was
    /// committed meanwhile, which a watch set after the read hears of). Read again if it does not
    /// (the create had to make the lock's node first, after the read).
    async fn create_and_look(
        &self,
        session: &Session,
        lock: &Lock,
        prefix: &str,
        token: &str,
    ) -> Result<((String, i64), Result<Looked, LockError>), LockError> {
        let (created, looked) = tokio::join!(
            self.create_at(session, lock, prefix, token),
            self.look(session, lock.name(), false, false)
        );
        let (path, czxid) = created?;
        let name = path.rsplit('/').next().unwrap_or_default();
        let looked = match looked {
            Ok(looked) if looked.children.iter().any(|c| c == name) => Ok(looked),
            _ => self.look(session, lock.name(), false, false).await,
        };
        Ok(((path, czxid), looked))
    }

    /// Whether another waiter of this client queues at the lock named `name`.
    fn queues_at(&self, name: &str) -> bool {
        self.shared
            .book
            .places()
            .values()
            .any(|p| p.name == name && p.until.is_none() && p.permit.is_none())
    }

    /// Whether this client holds permit `permit` of the lock named `name`.
    fn holds_permit(&self, name: &str, permit: u32) -> bool {
        self.shared
            .book
            .places()
            .values()
            .any(|p| p.name == name && p.permit == Some(permit) && p.until.is_some())
    }

    /// The node of a claim this attempt made.
    fn claim_place(
        &self,
        lock: &Lock,
        session: &Session,
        (path, czxid, permit): (String, i64, u32),
    ) -> Place {
        Place {
            name: lock.name().to_owned(),
            path,
            shared: false,
            czxid,
            session: session.id,
            // A claim's token is its own czxid: nothing is left on the lock's node.
            leaves_fence: false,
            permit: Some(permit),
        }
    }

    /// Deletes a node this attempt made and no longer needs (a claim it does not hold, its queue
    /// node once it holds): by the reaper, if not now, under a name of its own (not the
    /// token's, which names the caller's own node).
    async fn give_up(&self, token: &str, place: Place) {
        if self.shared.delete(&place).await.is_err() {
            let leftover = format!("{token}\0{}", place.path);
            self.shared.book.delete_soon(&leftover, place);
        }
    }

    /// [`give_up`](Self::give_up) in the background.
    fn give_up_soon(&self, token: &str, place: Place) {
        let shared = std::sync::Arc::clone(&self.shared);
        let leftover = format!("{token}\0{}", place.path);
        tokio::spawn(async move {
            if shared.delete(&place).await.is_err() {
                shared.book.delete_soon(&leftover, place);
            }
        });
    }

    /// Has `token` (one of the first waiters) woken when any of the nodes `watched` (the claims
    /// that hold a permit, and the queue nodes ahead of it) changes or goes; at once if one went
    /// already. The `oldest` waiter is told which permit went: nobody is ahead of it, so it
    /// claims that one without a look.
    fn watch_claims(
        &self,
        (lock, token): (&Lock, &str),
        session: &Session,
        watched: Vec<String>,
        oldest: bool,
    ) {
        let client = session.client.clone();
        let shared = std::sync::Arc::clone(&self.shared);
        let (name, waiter) = (lock.name().to_owned(), token.to_owned());
        let within = self.ensemble().timeouts.response;
        let task = tokio::spawn(async move {
            // Every watch asked at once: the requests go out together on the session's
            // connection, one round trip for all of them.
            let asked = join_all(watched.iter().map(|path| client.check_and_watch_stat(path)));
            let mut watchers = Vec::with_capacity(watched.len());
            // The node seen to go: a claim's permit is free (unless a newcomer claims it first).
            let mut gone = None;
            match tokio::time::timeout(within, asked).await {
                Ok(answers) => {
                    for (at, answer) in answers.into_iter().enumerate() {
                        match answer {
                            Ok((Some(_), watcher)) => watchers.push(Box::pin(watcher.changed())),
                            // Gone already: a permit may be free.
                            Ok((None, _)) => {
                                gone = Some(at);
                                watchers.clear();
                                break;
                            }
                            Err(e) => {
                                tracing::debug!(error = %e, "cannot watch a semaphore's claims");
                                watchers.clear();
                                break;
                            }
                        }
                    }
                }
                Err(_) => tracing::debug!("no answer to the watch of a semaphore's claims"),
            }
            if !watchers.is_empty() {
                let (event, at, _) = select_all(watchers).await;
                if event.event_type == EventType::NodeDeleted {
                    gone = Some(at);
                }
            }
            let permit = gone
                .filter(|_| oldest)
                .and_then(|at| watched.get(at))
                .and_then(|path| names::parse_claim(path.rsplit('/').next().unwrap_or_default()));
            if let Some(claim) = permit {
                // Only while it is still watched (`unwatch` forgets both): a waiter gone
                // meanwhile leaves nothing behind.
                let watches = super::locked(&shared.watches);
                if watches.contains_key(&waiter) {
                    super::locked(&shared.freed).insert(waiter.clone(), claim.permit);
                }
            }
            shared.notices.turn(&name, waiter.as_bytes(), None);
        });
        if let Some(old) = super::locked(&self.shared.watches).insert(token.to_owned(), task.abort_handle()) {
            old.abort();
        }
    }
}

/// What an attempt does next, from its standing in the queue (`None`: not queued) and the
/// permits it read (of `count`), having made `claims` claims so far: a fair newcomer does not
/// claim ahead of waiters in the queue; a caller that will not wait is refused where it would
/// queue.
fn next_step(
    name: &str,
    standing: Option<Standing<'_>>,
    (permits, count): (&Permits, u32),
    ask_: &Ask,
    (queued, claims): (bool, usize),
) -> Next {
    let barred = ask_.mode.fair() && !queued && !permits.queue.is_empty();
    match (standing, permits.free(count)) {
        (Some(Standing::Behind(ahead)), _) => Next::Behind(format!("{name}/{ahead}")),
        (Some(Standing::Admitted(permit)), _) if claims < TRIES => Next::Claim(permit),
        (Some(Standing::Admitted(_)), _) => Next::LostRaces,
        (Some(Standing::Next { rank }), _) => Next::ForAClaim { rank },
        _ if barred && !ask_.join => Next::Refused,
        _ if barred => Next::Queue,
        (_, Some(free)) if claims < TRIES => Next::Claim(free),
        _ if !ask_.join => Next::Refused,
        _ => Next::Queue,
    }
}
