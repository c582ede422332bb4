//! Semaphores on etcd. Permit `i` of a semaphore of `n` permits is the key `L␣p/<n>/<i>`, put by
//! its holder on its session lease only where it does not exist (so at most `n` holders at
//! once), and only while nobody holds or waits for the key as a lock or read-write lock (its
//! line is empty) and no permit of another count is held: the count is stored with the key.
//!
//! Waiters queue under `L␣q/`, in revision order. A newcomer takes a permit only while nobody
//! queues, a queued waiter only while no place in the queue is older than its own (a compare
//! that every queued place was created at or after its own), so permits go to waiters in the
//! order they came. The oldest waiter watches the permits: any permit's deletion wakes it (one
//! waiter per release); every other waiter watches the place just ahead of its own. Taking a
//! permit deletes the waiter's place in the same transaction, which wakes the next, who takes
//! the next free permit or watches the permits in turn.
//!
//! An attempt is one transaction: it tries the lowest permit this client does not hold, and when
//! refused reads, in the same request, which permits are held, whether the line is empty, and
//! who queues ahead; it tries again at once when another permit was free (a second
//! transaction: another client held the one it tried). The fencing token is the
//! permit key's create revision: it rises with every permit taken of the key.

use std::collections::BTreeSet;

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use tokio::time::Instant;

use super::names::{Names, Part};
use super::sessions::Session;
use super::{id_of, newest_first, read_at, revision, EtcdStore, Place, Placed};
use crate::store::{permits_differ, Ask, Attempt, Lock};
use crate::LockError;

/// How many permits one attempt tries when the one it tried was taken meanwhile.
const TRIES: usize = 4;

/// The count of a range read with `count_only`.
fn count_at(answer: &[TxnOpResponse], position: usize) -> i64 {
    match answer.get(position) {
        Some(TxnOpResponse::Get(got)) => got.count(),
        _ => 0,
    }
}

impl EtcdStore {
    /// One attempt at any free permit of a semaphore of `ask.mode.permits()` (see the module doc).
    pub(super) async fn permit_attempt(
        &self,
        lock: &Lock,
        token: &str,
        ask: &Ask,
    ) -> Result<Attempt, LockError> {
        let names = Names::for_lock(lock.name());
        let count = ask.mode.permits();
        let sent = Instant::now();
        let session = self.session(ask.ttl_ms).await?;
        let mut queued = self
            .shared
            .book
            .places()
            .get(token)
            .filter(|p| p.until.is_none() && p.permit.is_none())
            .map(|p| p.of.clone());
        // The lowest permit this client does not hold of the key: free, when no other client
        // holds one.
        let mut guess = (0..count)
            .find(|p| !self.holds_permit(lock.name(), *p))
            .unwrap_or(0);
        let mut read = 0;
        for _ in 0..TRIES {
            let answer = self
                .pool()
                .txn(self.permit_txn(&names, token, count, guess, (&session, queued.as_ref())))
                .await?;
            if answer.succeeded() {
                if queued.is_some() {
                    self.shared.book.forget(token);
                }
                let place = Place {
                    name: lock.name().to_owned(),
                    key: names.permit(count, guess),
                    shared: false,
                    created: revision(&answer),
                    lease: session.id,
                    fenced: ask.fencing,
                    after_writer: 0,
                    permit: Some(guess),
                };
                return Ok(self.taken(token, place, ask, (sent, session), 0));
            }
            read = revision(&answer);
            let responses = answer.op_responses();
            // Held (or waited for) as a lock, or as a semaphore of another count: refused,
            // naming both counts.
            if count_at(&responses, 1) > 0 {
                return Err(permits_differ(lock.key(), 1, count));
            }
            let mut held = BTreeSet::new();
            for kv in read_at(&responses, 0) {
                match names.classify(kv.key()) {
                    Some(Part::Permit { count: other, .. }) if other != count => {
                        return Err(permits_differ(lock.key(), other, count));
                    }
                    Some(Part::Permit { permit, .. }) => {
                        held.insert(permit);
                    }
                    _ => {}
                }
            }
            if queued.is_some() && read_at(&responses, 3).is_empty() {
                // Its place went with its session (or an operator deleted it): a newcomer again.
                self.shared.book.forget(token);
                queued = None;
            }
            let ahead = read_at(&responses, 2).first().map(|kv| kv.key().to_vec());
            let free = (0..count).find(|p| !held.contains(p));
            match (ahead, free, queued.is_some()) {
                // Nobody ahead and a permit free (taken meanwhile by another): try it.
                (None, Some(free), _) => guess = free,
                (Some(ahead), _, true) => {
                    self.wait_behind(lock, token, ahead, read);
                    return Ok(Attempt::behind());
                }
                (None, None, true) => {
                    self.watch_permits(lock, token, &names, count, read);
                    return Ok(Attempt::behind());
                }
                _ if !ask.join => return Ok(Attempt::HELD),
                _ => return self.enqueue(lock, token, (&names, session)).await,
            }
        }
        // Every permit it tried was taken meanwhile: a waiter waits for the next deletion.
        if ask.join && queued.is_some() {
            self.watch_permits(lock, token, &names, count, read);
            return Ok(Attempt::behind());
        }
        if ask.join {
            return self.enqueue(lock, token, (&names, session)).await;
        }
        Ok(Attempt::HELD)
    }

    /// The transaction that takes permit `guess` of `count` for `token`, or reads why not: the
    /// permits held (0), how many are in the lock's line (1), who queues ahead (2: anyone for a
    /// newcomer, the place just ahead for `queued`), and `queued`'s own place (3).
    fn permit_txn(
        &self,
        names: &Names,
        token: &str,
        count: u32,
        guess: u32,
        (session, queued): (&Session, Option<&Place>),
    ) -> Txn {
        let permit = names.permit(count, guess);
        let (line, line_end) = names.line();
        let (queue, queue_end) = names.queue();
        let mut when = vec![
            Compare::create_revision(line.clone(), CompareOp::Equal, 0).with_range(line_end.clone()),
            Compare::create_revision(permit.clone(), CompareOp::Equal, 0),
        ];
        for (start, end) in names.permits_not_of(count) {
            when.push(Compare::create_revision(start, CompareOp::Equal, 0).with_range(end));
        }
        // Permits go in the order their waiters came: a newcomer only while nobody queues, a
        // queued waiter only while no queued place is older than its own.
        when.push(match queued {
            None => {
                Compare::create_revision(queue.clone(), CompareOp::Equal, 0).with_range(queue_end.clone())
            }
            Some(place) => Compare::create_revision(queue.clone(), CompareOp::Greater, place.created - 1)
                .with_range(queue_end.clone()),
        });
        let mut then = vec![TxnOp::put(
            permit,
            token,
            Some(PutOptions::new().with_lease(session.id)),
        )];
        let (permits, permits_end) = names.permits();
        let ahead = match queued {
            Some(place) => newest_first(Some(place.created), 1),
            None => GetOptions::new().with_limit(1),
        };
        let mut otherwise = vec![
            TxnOp::get(
                permits,
                Some(GetOptions::new().with_range(permits_end).with_keys_only()),
            ),
            TxnOp::get(
                line,
                Some(GetOptions::new().with_range(line_end).with_count_only()),
            ),
            TxnOp::get(queue, Some(ahead.with_range(queue_end).with_keys_only())),
        ];
        if let Some(place) = queued {
            then.push(TxnOp::delete(place.key.clone(), None));
            otherwise.push(TxnOp::get(
                place.key.clone(),
                Some(GetOptions::new().with_keys_only()),
            ));
        }
        Txn::new().when(when).and_then(then).or_else(otherwise)
    }

    /// Puts `token`'s place at the end of the semaphore's queue (one write), and has it watch
    /// the place ahead of it; the oldest tries again at once, as a waiter in the queue.
    async fn enqueue(
        &self,
        lock: &Lock,
        token: &str,
        (names, session): (&Names, Session),
    ) -> Result<Attempt, LockError> {
        let key = names.queued(id_of(token));
        let (queue, queue_end) = names.queue();
        let newest_two = GetOptions::new()
            .with_range(queue_end)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(2)
            .with_keys_only();
        let put = TxnOp::put(key.clone(), token, Some(PutOptions::new().with_lease(session.id)));
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([put, TxnOp::get(queue.clone(), Some(newest_two.clone()))])
            .or_else([TxnOp::get(key.clone(), None), TxnOp::get(queue, Some(newest_two))]);
        let answer = self.pool().txn(txn).await?;
        let responses = answer.op_responses();
        let created = match answer.succeeded() {
            true => revision(&answer),
            // An earlier send of this attempt put it.
            false => read_at(&responses, 0)
                .first()
                .map_or(0, |kv| kv.create_revision()),
        };
        let ahead = read_at(&responses, 1)
            .iter()
            .find(|kv| kv.create_revision() < created)
            .map(|kv| kv.key().to_vec());
        let place = Place {
            name: lock.name().to_owned(),
            key,
            shared: false,
            created,
            lease: session.id,
            // A place in the queue leaves no fencing token when it goes (a lock's writer does).
            fenced: false,
            after_writer: 0,
            permit: None,
        };
        self.shared.book.record(token, Placed::waiting(place));
        match ahead {
            Some(ahead) => {
                self.wait_behind(lock, token, ahead, revision(&answer));
                Ok(Attempt::behind())
            }
            // The oldest: it tries again at once, as a waiter in the queue (a permit may have
            // been given back before its place was put, and its own refusal's read was older).
            None => Ok(Attempt::Held {
                pttl_ms: None,
                behind: false,
                claimed: false,
                kept: None,
            }),
        }
    }

    /// Whether this client holds permit `permit` of the lock named `name`.
    fn holds_permit(&self, name: &str, permit: u32) -> bool {
        self.shared
            .book
            .places()
            .values()
            .any(|p| p.name == name && p.permit == Some(permit))
    }

    /// Has `token` (the oldest waiter) watch the permits of `count`, from the revision after
    /// `read`: the next permit given back wakes it.
    fn watch_permits(&self, lock: &Lock, token: &str, names: &Names, count: u32, read: i64) {
        let (start, end) = names.permits_of(count);
        self.shared.watcher.watch_range(
            self.pool(),
            &self.shared.notices,
            (lock.name(), token),
            (start, Some(end)),
            read + 1,
        );
    }
}
