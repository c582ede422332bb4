//! Who holds a lock: the owner label stored in its value, for operators and dashboards.
//!
//! A lock's value is `<uuid> <owner>`: a fresh UUID v4 per acquisition call (what makes the value
//! unique, and what renewals and releases compare, with the rest of the value) and the owner
//! label of the client that took it ([`LockClientBuilder::owner`](crate::LockClientBuilder::owner),
//! by default `<hostname>:<pid>`).

use std::time::Duration;

use crate::view::{Holding, LockView};

/// What [`LockClient::holder`](crate::LockClient::holder) found at a held lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    owner: Option<String>,
    remaining: Option<Duration>,
    released: bool,
    /// The owner labels of a read-write lock's shared holders (empty for an exclusive holder).
    readers: Vec<String>,
    /// A semaphore's count, and who holds which of its permits.
    permits: Option<(u32, Vec<(u32, String)>)>,
}

impl Holder {
    /// Who a store found holding the lock; `None` when it is free.
    pub(crate) fn from_view(view: &LockView) -> Option<Holder> {
        let remaining = view.remaining;
        Some(match &view.holding {
            Holding::Free => return None,
            Holding::Exclusive { owner, released, .. } => Holder {
                owner: Some(owner.clone()),
                remaining,
                released: *released,
                readers: Vec::new(),
                permits: None,
            },
            Holding::Shared { readers } => Holder {
                owner: None,
                remaining,
                released: false,
                readers: readers.iter().map(|r| r.owner.clone()).collect(),
                permits: None,
            },
            Holding::Permits { holders, .. } if holders.is_empty() => return None,
            Holding::Permits { permits, holders } => Holder {
                owner: None,
                remaining,
                released: false,
                readers: Vec::new(),
                permits: Some((
                    *permits,
                    holders
                        .iter()
                        .map(|h| (h.permit.unwrap_or_default(), h.owner.clone()))
                        .collect(),
                )),
            },
            Holding::Foreign { .. } => Holder {
                owner: None,
                remaining,
                released: false,
                readers: Vec::new(),
                permits: None,
            },
        })
    }

    /// The owner label of the client holding it (`<hostname>:<pid>` unless set with
    /// [`owner`](crate::LockClientBuilder::owner)); `None` when the key holds something this
    /// library did not write.
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    /// How long the lock has left, `None` when the key has no expiry (not a lock of ours).
    pub fn remaining(&self) -> Option<Duration> {
        self.remaining
    }

    /// Held by shared holders ([`LockMode::Shared`](crate::LockMode::Shared)): see
    /// [`readers`](Self::readers). [`owner`](Self::owner) is then `None`, and
    /// [`remaining`](Self::remaining) is how long the last share has left.
    pub fn is_shared(&self) -> bool {
        !self.readers.is_empty()
    }

    /// The owner labels of the shared holders, one per share (a client holding two shares
    /// appears twice); empty when the lock is held exclusively.
    pub fn readers(&self) -> &[String] {
        &self.readers
    }

    /// For a semaphore ([`LockOptions::permits`](crate::LockOptions::permits)): how many
    /// permits the key has. [`owner`](Self::owner) is then `None`, and
    /// [`remaining`](Self::remaining) is how long the last permit taken has left.
    pub fn permits(&self) -> Option<u32> {
        self.permits.as_ref().map(|(n, _)| *n)
    }

    /// For a semaphore: how many of its permits are taken now.
    pub fn permits_taken(&self) -> usize {
        self.permits.as_ref().map_or(0, |(_, taken)| taken.len())
    }

    /// For a semaphore: who holds which permit, `(permit, owner label)` sorted by permit
    /// (empty for a lock).
    pub fn permit_holders(&self) -> &[(u32, String)] {
        self.permits.as_ref().map_or(&[], |(_, taken)| taken.as_slice())
    }

    /// Its holder released it, and it is kept until its minimum hold (`hold_at_least`) ends.
    pub fn is_released(&self) -> bool {
        self.released
    }
}

/// A fresh value for one acquisition call: a UUID v4 and the owner label. The UUID's random bits
/// come from rand's thread-local CSPRNG (uuid's `fast-rng`), seeded and reseeded from the OS: a
/// system call per acquisition cost more than the rest of an acquire's client work.
pub(crate) fn new_value(owner: &str) -> String {
    let mut value = String::with_capacity(uuid::fmt::Simple::LENGTH + 1 + owner.len());
    value.push_str(
        uuid::Uuid::new_v4()
            .simple()
            .encode_lower(&mut uuid::Uuid::encode_buffer()),
    );
    value.push(' ');
    value.push_str(owner);
    value
}

/// `<hostname>:<pid>`, the default owner label.
pub(crate) fn default_owner() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

/// Checks an owner label: 1 to 256 bytes, no control characters.
pub(crate) fn check_owner(owner: &str) -> Result<(), crate::LockError> {
    if owner.is_empty() || owner.len() > 256 || owner.chars().any(char::is_control) {
        return Err(crate::LockError::invalid_options(
            "the owner label must be 1 to 256 bytes without control characters",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_carry_a_fresh_uuid_and_the_owner() {
        let (a, b) = (new_value("web-1:42"), new_value("web-1:42"));
        assert_ne!(a, b);
        let found = |value: &[u8]| {
            let mut view = LockView::free("k", "lock:{k}");
            view.holding = Holding::of_value(value);
            view.remaining = Some(Duration::from_secs(3));
            Holder::from_view(&view).unwrap_or_else(|| panic!("not held"))
        };
        let holder = found(a.as_bytes());
        assert_eq!(holder.owner(), Some("web-1:42"));
        assert!(!holder.is_released());
        let kept = found(format!("{a}:released").as_bytes());
        assert_eq!(kept.owner(), Some("web-1:42"));
        assert!(kept.is_released());
        assert_eq!(found(b"someone else's value").owner(), None);
        assert!(default_owner().contains(':'));
        assert!(
            check_owner("").is_err() && check_owner("a\nb").is_err() && check_owner("job runner 7").is_ok()
        );
    }
}
