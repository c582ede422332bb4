//! Configuring a client: where its locks live, how it reaches them, and how it labels them. Each
//! store is one builder method and one arm of [`LockClientBuilder::build_lazy`].

use std::sync::Arc;
use std::time::Duration;

use crate::backend::connection::{client_for_url, Place, Timeouts, TlsMaterial};
use crate::backend::redis::RedisBackend;
use crate::backend::redlock::RedlockBackend;
use crate::backend::replicas::Replicas;
use crate::backend::{LockKeys, Store};
use crate::core::Core;
use crate::{LockClient, LockError, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, DEFAULT_RESPONSE_TIMEOUT};

impl LockClient {
    /// A builder for a client with a custom prefix or timeouts.
    pub fn builder() -> LockClientBuilder {
        LockClientBuilder::default()
    }
}

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
    url: Option<String>,
    redis_client: Option<redis::Client>,
    cluster: Option<Vec<String>>,
    sentinel: Option<(Vec<String>, String)>,
    redlock: Option<Vec<String>>,
    postgres: Option<String>,
    etcd: Option<Vec<String>>,
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
            url: None,
            redis_client: None,
            cluster: None,
            sentinel: None,
            redlock: None,
            postgres: None,
            etcd: None,
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
        // The URL may carry a password: show where it points, not who logs in.
        let url = self.url.as_deref().map(crate::redact::hide_credentials);
        f.debug_struct("LockClientBuilder")
            .field("url", &url)
            .field("redis_client", &self.redis_client)
            .field(
                "cluster",
                &self.cluster.as_ref().map(|urls| {
                    urls.iter()
                        .map(|u| crate::redact::hide_credentials(u))
                        .collect::<Vec<_>>()
                }),
            )
            .field(
                "sentinel",
                &self.sentinel.as_ref().map(|(urls, name)| {
                    (
                        urls.iter()
                            .map(|u| crate::redact::hide_credentials(u))
                            .collect::<Vec<_>>(),
                        name,
                    )
                }),
            )
            .field(
                "redlock",
                &self.redlock.as_ref().map(|urls| {
                    urls.iter()
                        .map(|u| crate::redact::hide_credentials(u))
                        .collect::<Vec<_>>()
                }),
            )
            .field(
                "postgres",
                &self.postgres.as_deref().map(crate::redact::hide_credentials),
            )
            .field(
                "etcd",
                &self.etcd.as_ref().map(|urls| {
                    urls.iter()
                        .map(|u| crate::redact::hide_credentials(u))
                        .collect::<Vec<_>>()
                }),
            )
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
    /// The Redis server: `redis://[user:password@]host:port[/db]`, or `rediss://…` for TLS
    /// (with the `tls` feature). Give this or [`redis_client`](Self::redis_client).
    pub fn url(mut self, url: &str) -> Self {
        self.url = Some(url.to_owned());
        self
    }

    /// The Redis server, as a `redis::Client` you built: for anything redis-rs supports that
    /// this builder does not name (your own TLS setup, RESP3, a Unix socket, …). Give this or
    /// [`url`](Self::url).
    pub fn redis_client(mut self, client: redis::Client) -> Self {
        self.redis_client = Some(client);
        self
    }

    /// A Redis Cluster (the `cluster` feature, on by default), given some of its nodes: the
    /// client learns the rest, sends each request to the primary owning the lock's slot
    /// (following MOVED/ASK while slots migrate and failovers), and wakes waiters with sharded
    /// pub/sub on that slot.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .cluster(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
    ///     .wait_for_replicas(1, std::time::Duration::from_millis(100))
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    pub fn cluster<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.cluster = Some(urls.into_iter().map(|u| u.as_ref().to_owned()).collect());
        self
    }

    /// A primary managed by Redis Sentinel (the `sentinel` feature, on by default): `urls` are
    /// the sentinels', `master_name` the name they monitor it under. Each connection asks the
    /// sentinels for the primary (and checks its `ROLE`); after a failover (announced by the
    /// sentinels, or found by a request that reached the demoted node or a dead connection) the
    /// client reconnects to the new primary. The primary is reached with the first URL's user,
    /// password, database and TLS mode.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .sentinel(["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"], "locks")
    ///     .wait_for_replicas(1, std::time::Duration::from_millis(100))
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    pub fn sentinel<I, S>(mut self, urls: I, master_name: &str) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.sentinel = Some((
            urls.into_iter().map(|u| u.as_ref().to_owned()).collect(),
            master_name.to_owned(),
        ));
        self
    }

    /// A quorum of independent Redis masters (RedLock; at least 3, usually 5): a lock is held
    /// while a majority of them hold it. An acquire is sent to all at once and holds once a
    /// majority said yes with validity to spare; renewals count on a majority; a release goes to
    /// all, and waiters hear releases from any. Fencing and fair mode are refused
    /// ([`LockError::InvalidOptions`]): there is no single counter or line. See the guide's
    /// deployments page (`docs/deployments.md`, "RedLock") for when to choose it, and when not.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .redlock([
    ///         "redis://10.0.1.1:6379",
    ///         "redis://10.0.2.1:6379",
    ///         "redis://10.0.3.1:6379",
    ///         "redis://10.0.4.1:6379",
    ///         "redis://10.0.5.1:6379",
    ///     ])
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    pub fn redlock<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.redlock = Some(urls.into_iter().map(|u| u.as_ref().to_owned()).collect());
        self
    }

    /// A PostgreSQL database (`postgres://user:password@host:5432/database`; the `postgres`
    /// feature): each lock is a row of `lock_runtime_locks` (made, with the other tables and
    /// functions the store needs, by the first client that connects, in the connection's
    /// `search_path`), leased on the database's clock, with fencing tokens from one sequence and
    /// waiters woken by `LISTEN`/`NOTIFY`. No connection or transaction is held while a lock is
    /// held; every request is one statement. The prefix starts each row's key, as on Redis.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .postgres("postgres://app:secret@db.internal:5432/orders")
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres(mut self, url: &str) -> Self {
        self.postgres = Some(url.to_owned());
        self
    }

    /// An etcd v3 cluster (`http://host:2379` for each member; the `etcd` feature; TLS to etcd
    /// is not offered yet): each lock is a key attached to a lease of its own, its
    /// fencing token the revision that took it (strictly increasing across leader changes),
    /// and waiters are woken by a watch, in revision order when fair. etcd's leases have whole
    /// seconds and a minimum (2 s with etcd's default election timeout): the server's lease is
    /// the ttl rounded up to it, while the holder's validity is the ttl as asked. The prefix
    /// starts each key, as on Redis.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .etcd(["http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://10.0.0.3:2379"])
    ///     .build()
    ///     .await?;
    /// # let _ = locks; Ok(()) }
    /// ```
    #[cfg(feature = "etcd")]
    pub fn etcd<I, S>(mut self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.etcd = Some(endpoints.into_iter().map(|u| u.as_ref().to_owned()).collect());
        self
    }

    /// Every acquire (with its fencing counter) counts only once `replicas` replicas have
    /// acknowledged it: `WAIT replicas timeout` is sent right behind the acquire, in the same
    /// round trip. When fewer acknowledge within `timeout`, the lock is given back and the
    /// acquire fails with [`LockError::NotReplicated`]. A lock acknowledged this way survives a
    /// failover to one of those replicas. Renewals and releases do not wait.
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.replicas = Some((replicas, timeout));
        self
    }

    /// Trusts the CA certificate(s) in `pem` for a `rediss://` server, instead of the system's
    /// trust store: for servers whose certificate a private CA signed.
    pub fn tls_root_ca(mut self, pem: &[u8]) -> Self {
        self.tls.root_ca = Some(pem.to_vec());
        self
    }

    /// Presents this client certificate (PEM chain and its PEM private key) to a `rediss://`
    /// server started with `--tls-auth-clients yes`.
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

    /// Put before every key (default [`DEFAULT_PREFIX`], `"lock:"`).
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
        // The rights check's keys: under the prefix, where the user's key rights are.
        let probe = LockKeys::new(client.prefix(), "rights-check");
        client.core().store.connect(&probe).await?;
        Ok(client)
    }

    /// Checks the configuration (URL, timeouts, TLS material) without connecting; the first
    /// operation connects. A service can start while Redis is down: its operations fail with
    /// [`LockError::Unavailable`] until Redis is back, and then work.
    pub fn build_lazy(self) -> Result<LockClient, LockError> {
        self.no_insecure_urls()?;
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
        if let Some(urls) = &self.redlock {
            return self.build_redlock(urls, timeouts, replicas.is_some());
        }
        if let Some(url) = &self.postgres {
            return self.build_postgres(url, timeouts, replicas.is_some());
        }
        if let Some(endpoints) = &self.etcd {
            return self.build_etcd(endpoints, timeouts, replicas.is_some());
        }
        let answer_within = timeouts.response + replicas.map_or(Duration::ZERO, |r| 2 * r.timeout);
        let place = self.place(timeouts, answer_within)?;
        let store = Arc::new(RedisBackend::new(place, timeouts, replicas));
        self.client(store)
    }

    /// Refuses a URL whose `#insecure` fragment would turn TLS certificate checks off (redis-rs
    /// honours it when any crate in the build enables its insecure TLS feature): a lock that
    /// guards money does not talk to whoever answers.
    fn no_insecure_urls(&self) -> Result<(), LockError> {
        let urls = self
            .url
            .iter()
            .chain(self.cluster.iter().flatten())
            .chain(self.sentinel.iter().flat_map(|(urls, _)| urls))
            .chain(self.redlock.iter().flatten());
        for url in urls {
            if url
                .split_once('#')
                .is_some_and(|(_, fragment)| fragment.eq_ignore_ascii_case("insecure"))
            {
                return Err(LockError::invalid_options(format!(
                    "{}: `#insecure` would turn TLS certificate verification off; trust a private \
                     CA with .tls_root_ca(…) instead",
                    crate::redact::hide_credentials(url)
                )));
            }
        }
        Ok(())
    }

    fn build_redlock(
        &self,
        urls: &[String],
        timeouts: Timeouts,
        replicas: bool,
    ) -> Result<LockClient, LockError> {
        self.one_place()?;
        if replicas {
            return Err(LockError::invalid_options(
                "wait_for_replicas does not apply to RedLock: its masters are independent",
            ));
        }
        if urls.len() > crate::backend::redlock::MAX_MASTERS {
            return Err(LockError::invalid_options(format!(
                "RedLock takes at most {} masters",
                crate::backend::redlock::MAX_MASTERS
            )));
        }
        if urls.len() < 3 {
            return Err(LockError::invalid_options(
                "RedLock needs at least 3 independent masters (5 is usual)",
            ));
        }
        let clients = urls
            .iter()
            .map(|url| client_for_url(url, &self.tls))
            .collect::<Result<Vec<_>, _>>()?;
        self.client(Arc::new(RedlockBackend::new(clients, timeouts)))
    }

    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    fn build_postgres(&self, url: &str, timeouts: Timeouts, replicas: bool) -> Result<LockClient, LockError> {
        self.one_place()?;
        if replicas {
            return Err(LockError::invalid_options(
                "wait_for_replicas does not apply to PostgreSQL: set synchronous_commit and \
                 synchronous_standby_names on the server, and every lock waits for its standbys",
            ));
        }
        if !self.tls.is_empty() {
            return Err(LockError::invalid_options(
                "TLS for PostgreSQL goes into its URL (sslmode, sslrootcert, sslcert, sslkey), not the builder",
            ));
        }
        #[cfg(feature = "postgres")]
        return self.client(Arc::new(crate::backend::postgres::PostgresBackend::new(
            url, timeouts,
        )?));
        #[cfg(not(feature = "postgres"))]
        Err(LockError::invalid_options(
            "a PostgreSQL store needs lock-runtime's `postgres` feature",
        ))
    }

    #[cfg_attr(not(feature = "etcd"), allow(unused_variables))]
    fn build_etcd(
        &self,
        endpoints: &[String],
        timeouts: Timeouts,
        replicas: bool,
    ) -> Result<LockClient, LockError> {
        self.one_place()?;
        if replicas {
            return Err(LockError::invalid_options(
                "wait_for_replicas does not apply to etcd: every write is committed by a majority \
                 of its members before it answers",
            ));
        }
        if !self.tls.is_empty() {
            return Err(LockError::invalid_options(
                "TLS to etcd is not offered yet: the builder's TLS material is for Redis",
            ));
        }
        #[cfg(feature = "etcd")]
        return self.client(Arc::new(crate::backend::etcd::EtcdBackend::new(
            endpoints.to_vec(),
            timeouts,
        )?));
        #[cfg(not(feature = "etcd"))]
        Err(LockError::invalid_options(
            "an etcd store needs lock-runtime's `etcd` feature",
        ))
    }

    /// A client of `store`, with this builder's prefix, owner and metrics labels.
    fn client(&self, store: Arc<dyn Store>) -> Result<LockClient, LockError> {
        let core = Core::new(
            store,
            self.prefix.clone(),
            self.owner_label()?,
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

    /// Checks that exactly one of the ways to say where the locks live was given.
    fn one_place(&self) -> Result<(), LockError> {
        let given = [
            self.url.is_some(),
            self.redis_client.is_some(),
            self.cluster.is_some(),
            self.sentinel.is_some(),
            self.redlock.is_some(),
            self.postgres.is_some(),
            self.etcd.is_some(),
        ];
        match given.iter().filter(|&&g| g).count() {
            0 => Err(LockError::invalid_options(
                "no store given to the builder (.url(…), .redis_client(…), .cluster(…), .sentinel(…), .redlock(…), .postgres(…) or .etcd(…))",
            )),
            1 => Ok(()),
            _ => Err(LockError::invalid_options(
                "give the builder one of .url(…), .redis_client(…), .cluster(…), .sentinel(…), .redlock(…), .postgres(…) or .etcd(…), not several",
            )),
        }
    }

    /// Where the locks live, for every deployment but RedLock.
    fn place(&self, timeouts: Timeouts, answer_within: Duration) -> Result<Place, LockError> {
        self.one_place()?;
        if let Some(url) = &self.url {
            return Ok(Place::Server(client_for_url(url, &self.tls)?));
        }
        if let Some(client) = &self.redis_client {
            if !self.tls.is_empty() {
                return Err(LockError::invalid_options(
                    "TLS certificates go into the redis::Client given to .redis_client(…), not the builder",
                ));
            }
            return Ok(Place::Server(client.clone()));
        }
        #[cfg(feature = "cluster")]
        if let Some(urls) = &self.cluster {
            let cluster =
                crate::backend::cluster::ClusterPlace::new(urls, &self.tls, timeouts, answer_within)?;
            return Ok(Place::Cluster(Arc::new(cluster)));
        }
        #[cfg(feature = "sentinel")]
        if let Some((urls, master_name)) = &self.sentinel {
            let sentinels = crate::backend::sentinel::Sentinels::new(urls, master_name, &self.tls)?;
            return Ok(Place::Sentinel(Arc::new(sentinels)));
        }
        let _ = (timeouts, answer_within);
        Err(LockError::invalid_options(
            "this deployment needs a lock-runtime feature that is off",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_debug_hides_credentials() {
        let shown = format!(
            "{:?}",
            LockClient::builder().url("redis://user:secret@host:6379/0")
        );
        assert!(!shown.contains("secret") && !shown.contains("user"), "{shown}");
        assert!(shown.contains("redis://<credentials>@host:6379/0"), "{shown}");
    }
}
