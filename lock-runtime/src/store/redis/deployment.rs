//! Which Redis deployment a store talks to, and what that changes in the protocol: the scripts
//! are the same everywhere, and only a Cluster differs (its pub/sub is sharded, a request may
//! only touch keys of one slot, and a script naming a key that does not exist is refused while
//! its slot migrates). Routing itself (which node a request goes to) is the connection's
//! ([`Servers`]).

use super::servers::Servers;
use crate::store::Renewing;

/// A Redis store's deployment, as the protocol sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deployment {
    /// One server, or the primary the sentinels name: one keyspace, plain pub/sub.
    Primary,
    /// A Redis Cluster: keys are spread over slots, pub/sub is sharded by slot.
    #[cfg(feature = "cluster")]
    Cluster,
}

impl Deployment {
    pub(crate) fn of(servers: &Servers) -> Deployment {
        match servers {
            #[cfg(feature = "cluster")]
            Servers::Cluster(_) => Deployment::Cluster,
            _ => Deployment::Primary,
        }
    }

    /// Releases are announced on the lock's shard (`SPUBLISH`), and waiters listen there
    /// (`SSUBSCRIBE`): told to the scripts as their "sharded" flag.
    pub(crate) fn sharded(self) -> bool {
        match self {
            Deployment::Primary => false,
            #[cfg(feature = "cluster")]
            Deployment::Cluster => true,
        }
    }

    /// The command that announces a release.
    pub(crate) fn publish(self) -> &'static str {
        if self.sharded() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    /// Whether a refused waiter marks the lock ([`waiting`](super::keys::waiting)) so that its release
    /// announces itself, and a release nobody waits for skips the announcement. Not on a
    /// Cluster: a script naming the mark, which mostly does not exist, would be refused while
    /// its slot migrates; there every release announces.
    pub(crate) fn marks(self) -> bool {
        !self.sharded()
    }

    /// `locks` cut into the groups one request may renew together: all of them on one server,
    /// one group per slot on a Cluster. Each group lists indices into `locks`.
    pub(crate) fn by_slot(self, locks: &[Renewing<'_>]) -> Vec<Vec<usize>> {
        match self {
            Deployment::Primary => vec![(0..locks.len()).collect()],
            #[cfg(feature = "cluster")]
            Deployment::Cluster => {
                use redis::cluster_routing::Slot;
                let mut by_slot: std::collections::HashMap<Slot, Vec<usize>> =
                    std::collections::HashMap::new();
                for (i, (lock, _, _)) in locks.iter().enumerate() {
                    by_slot.entry(Slot::for_key(lock.name())).or_default().push(i);
                }
                by_slot.into_values().collect()
            }
        }
    }
}
