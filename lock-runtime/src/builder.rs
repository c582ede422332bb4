//! Configuring a client: where its locks live, how it reaches them, and how it labels them.
//! Where the locks live is one store's description (a [`StoreConfig`]), given by that store's
//! builder method (each store's folder adds its own: `.url`, `.cluster`, `.sentinel`,
//! `.redis_client`, `.redlock`, `.postgres`, `.etcd`) and checked by that store at `build()`;
//! everything else here is the same for every store.

use std::sync::Arc;
use std::time::Duration;

use crate::core::Core;
use crate::store::{Replicas, Settings, StoreConfig, Timeouts, TlsMaterial};
use crate::wakeups::Wakeups;
use crate::{LockClient, LockError, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, DEFAULT_RESPONSE_TIMEOUT};

impl LockClient {
    /// A builder for a client with a custom prefix or timeouts.
    pub fn builder() -> LockClientBuilder {
        LockClientBuilder::default()
    }
}

/// Every way of giving the builder its store, as its messages list them: `.store`, `.url`, then
/// each store's own methods (checked against the URL table, which names them per store:
/// `store/url.rs`).
pub(crate) const STORE_METHODS: &str = ".store(…), .url(…), .redis_client(…), .cluster(…), \
     .sentinel(…), .redlock(…), .postgres(…), .mysql(…), .etcd(…) or .zookeeper(…)";

/// Configures a [`LockClient`].
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// use lock_runtime::LockClient;
///
/// let locks = LockClient::builder()
///     .url("redis://127.0.0.1:6379/0")
///     .prefix("billing:lock:")
///     .connect_timeout(Duration::from_secs(2))
///     .response_timeout(Duration::from_millis(500))
///     .build()
///     .await?;
/// # let _ = locks; Ok(()) }
/// ```
///
/// With TLS and a private CA (the `tls` feature), started before Redis is reachable:
///
/// ```no_run
/// # #[cfg(feature = "tls")]
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use lock_runtime::LockClient;
///
/// let locks = LockClient::builder()
///     .url("rediss://locker:secret@redis.internal:6380")
///     .tls_root_ca(&std::fs::read("/etc/redis/ca.pem")?)
///     .tls_client_auth(&std::fs::read("client.pem")?, &std::fs::read("client.key")?)
///     .build_lazy()?; // connects on first use
/// # let _ = locks; Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClientBuilder {
    /// Where the locks live: each store's builder method adds its description (exactly one must
    /// be given).
    places: Vec<Arc<dyn StoreConfig>>,
    replicas: Option<(usize, Duration)>,
    owner: Option<String>,
    metrics_key_class: bool,
    tls: TlsMaterial,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl Default for LockClientBuilder {
    fn default() -> Self {
        LockClientBuilder {
            places: Vec::new(),
            replicas: None,
            owner: None,
            metrics_key_class: false,
            tls: TlsMaterial::default(),
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
        }
    }
}

impl std::fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Each store's description shows where it points, never who logs in.
        f.debug_struct("LockClientBuilder")
            .field("store", &self.places)
            .field("wait_for_replicas", &self.replicas)
            .field("owner", &self.owner)
            .field("tls", &self.tls)
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .finish()
    }
}

impl LockClientBuilder {
    /// Where the locks live: a store's builder method gives its description here.
    pub(crate) fn place(self, config: impl StoreConfig + 'static) -> Self {
        self.place_shared(Arc::new(config))
    }

    /// Changes the store description given last, if it is a `C` (a store's own setting, such
    /// as etcd's user): `method` (`.etcd_user`) needs `store` (`.etcd([…])`) before it, and
    /// fails at `build()` without.
    #[cfg_attr(
        not(any(feature = "etcd", feature = "postgres", feature = "zookeeper")),
        allow(dead_code)
    )]
    pub(crate) fn refine<C>(mut self, method: &str, store: &str, change: impl FnOnce(&mut C)) -> Self
    where
        C: StoreConfig + Clone + 'static,
    {
        let last = self.places.last().map(|place| {
            let any: &dyn std::any::Any = &**place;
            any.downcast_ref::<C>().cloned()
        });
        match last {
            Some(Some(mut config)) => {
                change(&mut config);
                if let Some(place) = self.places.last_mut() {
                    *place = Arc::new(config);
                }
                self
            }
            _ => {
                let refusal = LockError::invalid_options(format!("{method}(…) needs {store} before it"));
                let refused: Arc<dyn StoreConfig> = Arc::new(crate::store::Refused::new("", refusal));
                match self.places.last_mut() {
                    Some(last) => *last = refused,
                    None => self.places.push(refused),
                }
                self
            }
        }
    }

    /// [`place`](Self::place), for a description already shared.
    pub(crate) fn place_shared(mut self, config: Arc<dyn StoreConfig>) -> Self {
        self.places.push(config);
        self
    }

    /// Every acquire (with its fencing counter) counts only once `replicas` replicas have
    /// acknowledged it, and so does every renewal: on Redis (one server, Sentinel, Cluster),
    /// `WAIT replicas timeout` is sent right behind the write, in the same round trip. When
    /// fewer acknowledge within `timeout`, an acquire gives the lock back and fails with
    /// [`LockError::NotReplicated`], and a renewal moves no validity. A lock acknowledged this
    /// way survives a failover to one of those replicas. Stores that replicate otherwise
    /// (RedLock, PostgreSQL, etcd) refuse it at `build()`, saying what they do instead.
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.replicas = Some((replicas, timeout));
        self
    }

    /// Trusts the CA certificate(s) in `pem` for a `rediss://` server (or `https://` etcd
    /// members), instead of the system's trust store: for servers whose certificate a private
    /// CA signed. Given with [`zookeeper`](Self::zookeeper), it reaches the ensemble over TLS
    /// (the `tls` feature; ZooKeeper over TLS needs it).
    pub fn tls_root_ca(mut self, pem: &[u8]) -> Self {
        self.tls.root_ca = Some(pem.to_vec());
        self
    }

    /// Presents this client certificate (PEM chain and its PEM private key) to a `rediss://`
    /// server started with `--tls-auth-clients yes` (or to `https://` etcd members started
    /// with `--client-cert-auth`, or to ZooKeeper servers with `ssl.clientAuth=need`).
    pub fn tls_client_auth(mut self, cert_pem: &[u8], key_pem: &[u8]) -> Self {
        self.tls.client_auth = Some((cert_pem.to_vec(), key_pem.to_vec()));
        self
    }

    /// A label stored with every lock this client takes (default `<hostname>:<pid>`), shown by
    /// [`LockClient::holder`]: name the service instance, so an operator can see who holds a
    /// lock. 1 to 256 bytes without control characters.
    pub fn owner(mut self, owner: &str) -> Self {
        self.owner = Some(owner.to_owned());
        self
    }

    /// Labels every metric (feature `metrics`) with `key_class`, the key's text before its first
    /// `:` (`order:42` → `order`), to tell lock families apart without a series per key. Off by
    /// default; keys whose text before the first `:` is unbounded would make as many series.
    pub fn metrics_key_class(mut self, on: bool) -> Self {
        self.metrics_key_class = on;
        self
    }

    /// Put before every key (default [`DEFAULT_PREFIX`], `"lock:"`): up to [`MAX_PREFIX_LEN`]
    /// bytes, without a NUL byte (checked at `build()`, as `InvalidOptions`).
    pub fn prefix(mut self, prefix: &str) -> Self {
        prefix.clone_into(&mut self.prefix);
        self
    }

    /// How long to wait for a connection (default [`DEFAULT_CONNECT_TIMEOUT`], 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long any one request may take (default [`DEFAULT_RESPONSE_TIMEOUT`], 2 s). Keep it
    /// well below your ttls: a renewal that takes longer than the lock's validity loses it.
    /// Two requests in a row without an answer, and the connection is replaced.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Connects, so that a server that is down or refuses this client is reported at start:
    /// [`LockError::Unavailable`] when it cannot be reached within the connect timeout,
    /// [`LockError::Refused`] when it answers but refuses (credentials, database index, an ACL
    /// without a right locking needs: checked here, on keys under the prefix), and
    /// [`LockError::InvalidOptions`] for a missing or malformed URL, bad TLS material or a zero
    /// timeout.
    pub async fn build(self) -> Result<LockClient, LockError> {
        let client = self.build_lazy()?;
        client.core().store.connect().await?;
        Ok(client)
    }

    /// Checks the configuration (URL, timeouts, TLS material) without connecting; the first
    /// operation connects. A service can start while its store is down: its operations fail
    /// with [`LockError::Unavailable`] until the store is back, and then work.
    pub fn build_lazy(self) -> Result<LockClient, LockError> {
        if self.connect_timeout.is_zero() || self.response_timeout.is_zero() {
            return Err(LockError::invalid_options("timeouts must be greater than zero"));
        }
        let timeouts = Timeouts {
            connect: self.connect_timeout,
            response: self.response_timeout,
        };
        let replicas = match self.replicas {
            None => None,
            Some((0, _)) => {
                return Err(LockError::invalid_options(
                    "wait_for_replicas needs at least 1 replica (leave it out to not wait)",
                ))
            }
            Some((_, timeout)) if timeout.is_zero() => {
                // `WAIT n 0` would block until the replicas answer, however long that takes.
                return Err(LockError::invalid_options(
                    "the wait_for_replicas timeout must be greater than zero",
                ));
            }
            Some((wanted, timeout)) => Some(Replicas { wanted, timeout }),
        };
        let place = match self.places.as_slice() {
            [] => {
                return Err(LockError::invalid_options(format!(
                    "no store given to the builder: say where the locks live ({STORE_METHODS})"
                )))
            }
            [place] => place,
            _ => {
                return Err(LockError::invalid_options(format!(
                    "give the builder one store ({STORE_METHODS}), not several"
                )))
            }
        };
        let owner = self.owner_label()?;
        check_prefix(&self.prefix)?;
        let wakeups = Wakeups::new();
        let settings = Settings {
            prefix: self.prefix.clone(),
            timeouts,
            tls: self.tls.clone(),
            replicas,
            notices: wakeups.notices(),
        };
        let store = place.open(settings)?;
        let core = Core::new(
            (store, wakeups, timeouts),
            self.prefix,
            owner,
            self.metrics_key_class,
        );
        Ok(LockClient::from_core(core))
    }

    /// The owner label: the one given (checked), else `<hostname>:<pid>`.
    fn owner_label(&self) -> Result<String, LockError> {
        match &self.owner {
            Some(owner) => {
                crate::holder::check_owner(owner)?;
                Ok(owner.clone())
            }
            None => Ok(crate::holder::default_owner()),
        }
    }
}

/// The longest prefix accepted, in bytes: with the longest key it stays within what every store
/// can index (PostgreSQL's btree keys, its `NOTIFY` payload, ZooKeeper's paths).
pub const MAX_PREFIX_LEN: usize = 256;

/// A store's servers as the builder keeps them: each address given to a builder method that
/// takes a list (a Cluster's nodes, the sentinels, RedLock's masters, etcd's endpoints,
/// ZooKeeper's hosts).
#[cfg_attr(
    not(any(feature = "redis", feature = "etcd", feature = "zookeeper")),
    allow(dead_code)
)]
pub(crate) fn addresses(list: impl IntoIterator<Item = impl AsRef<str>>) -> Vec<String> {
    list.into_iter().map(|a| a.as_ref().to_owned()).collect()
}

/// The prefix, if every store can hold it before any key.
fn check_prefix(prefix: &str) -> Result<(), LockError> {
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(LockError::invalid_options(format!(
            ".prefix(…) is {} bytes long: at most {MAX_PREFIX_LEN}",
            prefix.len()
        )));
    }
    if prefix.contains('\0') {
        return Err(LockError::invalid_options(
            ".prefix(…) contains a NUL byte (\\0), which not every store can hold",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The builder's "no store" message names every way of giving one (each store's builder
    /// method, defined in its folder).
    #[tokio::test]
    async fn without_a_store_every_store_is_named() {
        let Err(LockError::InvalidOptions { reason }) = LockClient::builder().build().await else {
            panic!("a builder without a store built a client");
        };
        for method in [
            ".store(",
            ".url(",
            ".cluster(",
            ".sentinel(",
            ".redis_client(",
            ".redlock(",
            ".postgres(",
            ".mysql(",
            ".etcd(",
            ".zookeeper(",
        ] {
            assert!(reason.contains(method), "{method}: {reason}");
        }
    }

    // A Redis URL is the builder's simplest store to name.
    #[cfg(feature = "redis")]
    #[test]
    fn builder_debug_hides_credentials() {
        let shown = format!(
            "{:?}",
            LockClient::builder().url("redis://user:secret@host:6379/0")
        );
        assert!(!shown.contains("secret") && !shown.contains("user"), "{shown}");
        assert!(shown.contains("redis://<credentials>@host:6379/0"), "{shown}");
    }

    // A Redis URL is the builder's simplest store to name.
    #[cfg(feature = "redis")]
    #[test]
    fn prefixes_every_store_can_hold() {
        let build = |prefix: &str| {
            LockClient::builder()
                .url("redis://localhost")
                .prefix(prefix)
                .build_lazy()
        };
        for bad in ["p".repeat(MAX_PREFIX_LEN + 1), "a\0b:".to_owned()] {
            let refused = build(&bad);
            assert!(
                matches!(refused, Err(LockError::InvalidOptions { .. })),
                "{refused:?}"
            );
        }
        for good in [
            "p".repeat(MAX_PREFIX_LEN),
            String::new(),
            "billing lock\n:".to_owned(),
        ] {
            assert!(build(&good).is_ok(), "{good:?}");
        }
    }
}
