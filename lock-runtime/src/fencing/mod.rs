//! Fencing helpers for the storage a lock guards: where a stale holder's late write is refused
//! because a newer holder's fencing token was seen (see
//! [`LockGuard::fencing_token`](crate::LockGuard::fencing_token)).
//!
//! - [`postgres`]: a table of the highest token per resource, checked in the business write's
//!   own transaction (the `postgres` feature).

pub mod postgres;
