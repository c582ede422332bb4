//! Where the locks are: one server, the primary the sentinels name (`--sentinel`), or a Redis
//! Cluster (`--cluster`); and the connections every command's requests go on. What differs
//! between deployments is decided here and nowhere else: which nodes a SCAN must walk (every
//! primary of a Cluster), which node a key's reads go to (its slot's), how many keys one
//! `MULTI` may read (a Cluster's transactions stay in one slot), whether a release is announced
//! with `PUBLISH` or, on a Cluster, `SPUBLISH` (as the library's own release script decides), and
//! how `watch` hears releases (a pattern subscription, or sharded subscriptions per lock).

use std::time::Duration;

use redis::aio::{MultiplexedConnection, PubSub};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, IntoConnectionInfo, PushInfo, Value};
use tokio::sync::mpsc;

use crate::error::Error;
use crate::Global;

/// The TLS options (the `tls` feature): the same material as the library's
/// `tls_root_ca` and `tls_client_auth`.
#[cfg(feature = "tls")]
#[derive(Debug, clap::Args)]
pub(crate) struct TlsArgs {
    /// Trust the CA certificate(s) in this PEM file for a rediss:// server.
    #[arg(long, global = true, value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
    /// Present this client certificate (PEM) to a rediss:// server; needs --tls-key.
    #[arg(long, global = true, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM); needs --tls-cert.
    #[arg(long, global = true, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
}

/// The deployment and the prefix every command works on.
#[derive(Debug)]
pub(crate) struct Target {
    place: Place,
    prefix: String,
    timeout: Duration,
}

/// Where the locks live, as the library's builder names it.
enum Place {
    /// One server (`.url`).
    Server(redis::Client),
    /// The primary the sentinels name (`.sentinel(urls, master_name)`), looked up for each
    /// connection, as the library does.
    Sentinel(Sentinels),
    /// A Redis Cluster from its seed nodes (`.cluster(urls)`).
    Cluster(Seeds),
}

impl std::fmt::Debug for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Server(_) => f.write_str("Place::Server"),
            Place::Sentinel(s) => write!(f, "Place::Sentinel({})", s.master_name),
            Place::Cluster(seeds) => write!(f, "Place::Cluster({} seed nodes)", seeds.nodes.len()),
        }
    }
}

/// The sentinels of one monitored primary.
struct Sentinels {
    /// redis-rs's client, which keeps a connection to the sentinel that last answered.
    client: tokio::sync::Mutex<SentinelClient>,
    master_name: String,
}

/// A Cluster's seed nodes, with the TLS material for every node.
struct Seeds {
    nodes: Vec<redis::ConnectionInfo>,
    tls: Option<Certificates>,
}

impl Target {
    /// Checks the URLs (and reads the TLS files); connects nothing yet.
    pub(crate) fn new(global: &Global) -> Result<Target, Error> {
        if global.prefix.is_empty() {
            return Err(Error::Usage("--prefix must not be empty".to_owned()));
        }
        let urls = urls(global);
        if urls.is_empty() {
            return Err(Error::Usage("--url is empty".to_owned()));
        }
        for url in &urls {
            if !url.contains("://") {
                return Err(Error::Usage(format!(
                    "the Redis URL {} has no scheme: write it as redis://host:port (rediss://host:port for TLS)",
                    hide_credentials(url)
                )));
            }
        }
        let tls = tls_material(global)?;
        let place = if global.cluster {
            Place::Cluster(seeds(&urls, tls)?)
        } else if global.sentinel {
            let master_name = global.master_name.as_deref().unwrap_or_default();
            Place::Sentinel(sentinels(&urls, master_name, tls.as_ref())?)
        } else {
            if urls.len() > 1 {
                return Err(Error::Usage(
                    "several --url values are the seed nodes of --cluster or the sentinels of \
                     --sentinel; a single server takes one"
                        .to_owned(),
                ));
            }
            Place::Server(client(&urls[0], tls)?)
        };
        Ok(Target {
            place,
            prefix: global.prefix.clone(),
            timeout: Duration::from_millis(global.timeout_ms),
        })
    }

    /// The key prefix.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A connection for reads and `release`, with the connect and answer timeouts: to the
    /// server, to the primary the sentinels name now, or to the Cluster (which routes each
    /// key's requests to the primary owning its slot and follows MOVED/ASK).
    pub(crate) async fn connection(&self) -> Result<Conn, Error> {
        match &self.place {
            Place::Server(client) => Ok(Conn::Server(self.multiplexed(client).await?)),
            Place::Sentinel(sentinels) => {
                let primary = self.primary(sentinels).await?;
                Ok(Conn::Server(self.multiplexed(&primary).await?))
            }
            Place::Cluster(seeds) => Ok(Conn::Cluster(self.cluster(seeds, None).await?)),
        }
    }

    /// Where `watch` hears release announcements: a pub/sub connection to the server (or
    /// primary), or a RESP3 Cluster connection whose sharded messages arrive on a channel.
    pub(crate) async fn listener(&self) -> Result<Listener, Error> {
        let server = match &self.place {
            Place::Server(client) => client.clone(),
            Place::Sentinel(sentinels) => self.primary(sentinels).await?,
            Place::Cluster(seeds) => {
                let (pushes, heard) = mpsc::unbounded_channel();
                let conn = self.cluster(seeds, Some(pushes)).await?;
                return Ok(Listener::Sharded(conn, heard));
            }
        };
        let pubsub = self
            .within("a pub/sub connection", server.get_async_pubsub())
            .await?;
        Ok(Listener::Pattern(pubsub))
    }

    async fn multiplexed(&self, client: &redis::Client) -> Result<MultiplexedConnection, Error> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        Ok(client
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }

    /// The primary the sentinels name now (redis-rs asks them in turn, and checks its role).
    async fn primary(&self, sentinels: &Sentinels) -> Result<redis::Client, Error> {
        let mut client = sentinels.client.lock().await;
        self.within("an answer from the sentinels", client.async_get_client())
            .await
    }

    /// A Cluster connection; with `pushes`, a RESP3 one whose pub/sub messages go there.
    async fn cluster(
        &self,
        seeds: &Seeds,
        pushes: Option<mpsc::UnboundedSender<PushInfo>>,
    ) -> Result<ClusterConnection, Error> {
        let mut builder = ClusterClientBuilder::new(seeds.nodes.clone())
            .connection_timeout(self.timeout)
            .response_timeout(self.timeout);
        if let Some(pushes) = pushes {
            builder = builder
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(pushes);
        }
        builder = with_tls(builder, seeds.tls.clone());
        let client = builder
            .build()
            .map_err(|e| Error::Usage(format!("invalid Redis Cluster configuration: {e}")))?;
        self.within("a Redis Cluster connection", client.get_async_connection())
            .await
    }

    /// `request`'s answer, or a failure after the timeout.
    async fn within<T>(
        &self,
        what: &str,
        request: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.timeout, request).await {
            Ok(answer) => Ok(answer?),
            Err(_) => Err(Error::Failed(format!(
                "no {what} within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }
}

/// A connection of one command: to one server (or the primary the sentinels named), or to a
/// Cluster, the library's own type. Requests go through it as through redis-rs's own
/// connections; what a deployment changes is in its methods below.
pub(crate) use crate::conn::Conn;

/// A node whose keys a SCAN walks.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    /// The one server.
    Server,
    /// A Cluster primary, by the address redis-rs knows it by.
    Primary { host: String, port: u16 },
}

impl Conn {
    /// On a Cluster: a release is announced with sharded pub/sub (`SPUBLISH`, on the lock's
    /// shard), as the library's release script does there.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }

    /// How many keys one `MULTI`/`EXEC` may read: a page on one server; on a Cluster one key
    /// (its lock, counter and waiters share its hash tag, so one slot), since a transaction
    /// cannot span slots.
    pub(crate) fn keys_per_transaction(&self, page: usize) -> usize {
        match self {
            Conn::Server(_) => page,
            Conn::Cluster(_) => 1,
        }
    }

    /// The nodes that together hold every key: the server, or each primary of the Cluster.
    pub(crate) async fn nodes(&mut self) -> Result<Vec<Node>, Error> {
        let Conn::Cluster(conn) = self else {
            return Ok(vec![Node::Server]);
        };
        // Each primary answers under the address redis-rs routes to it by.
        let all_primaries = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let answers = conn.route_command(redis::cmd("PING"), all_primaries).await?;
        let Value::Map(answers) = answers else {
            return Err(unexpected("PING to every primary", &answers));
        };
        let mut nodes = Vec::with_capacity(answers.len());
        for (address, answer) in answers {
            if let Value::ServerError(_) = answer {
                answer.extract_error()?;
            }
            let address = String::from_redis_value(address)?;
            let parsed = address
                .rsplit_once(':')
                .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)));
            let Some((host, port)) = parsed else {
                return Err(Error::Failed(format!(
                    "unexpected Redis Cluster node address {address:?}"
                )));
            };
            nodes.push(Node::Primary { host, port });
        }
        Ok(nodes)
    }

    /// Sends `cmd` to `node` (a SCAN, whose cursor belongs to one node).
    pub(crate) async fn on_node<T: FromRedisValue>(&mut self, node: &Node, cmd: Cmd) -> Result<T, Error> {
        let answer = match (self, node) {
            (Conn::Server(conn), _) => cmd.query_async(conn).await?,
            (Conn::Cluster(conn), Node::Primary { host, port }) => {
                let by_address = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                conn.route_command(cmd, RoutingInfo::SingleNode(by_address))
                    .await?
            }
            (Conn::Cluster(conn), Node::Server) => cmd.query_async(conn).await?,
        };
        Ok(T::from_redis_value(answer)?)
    }

    /// `TIME` on the node that holds `key` (whose clock its shares and places expire by).
    pub(crate) async fn time_at(&mut self, key: &str) -> Result<(u64, u64), Error> {
        let time = redis::cmd("TIME");
        let answer = match self {
            Conn::Server(conn) => time.query_async(conn).await?,
            Conn::Cluster(conn) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let owner = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                conn.route_command(time, owner).await?
            }
        };
        Ok(FromRedisValue::from_redis_value(answer)?)
    }
}

/// Where `watch` hears releases.
pub(crate) enum Listener {
    /// A pub/sub connection to one server: a pattern subscription hears every matching lock.
    Pattern(PubSub),
    /// A RESP3 Cluster connection and what it hears: sharded pub/sub has no patterns, so each
    /// lock's channel is subscribed to (`SSUBSCRIBE`, on its slot's node) while it is held.
    Sharded(ClusterConnection, mpsc::UnboundedReceiver<PushInfo>),
}

fn unexpected(what: &str, answer: &Value) -> Error {
    Error::Failed(format!("unexpected answer from Redis to {what}: {answer:?}"))
}

/// The `--url` values: on a Cluster or through sentinels, each may list several, separated by
/// commas (a single server's URL is taken whole).
pub(crate) fn urls(global: &Global) -> Vec<String> {
    if !(global.cluster || global.sentinel) {
        return global.url.clone();
    }
    global
        .url
        .iter()
        .flat_map(|url| url.split(','))
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The URLs as an operator's messages show them: without credentials, and saying what they are.
pub(crate) fn shown(global: &Global) -> String {
    let urls: Vec<String> = urls(global).iter().map(|url| hide_credentials(url)).collect();
    let urls = urls.join(", ");
    if global.cluster {
        format!("{urls} (Redis Cluster seed nodes)")
    } else if global.sentinel {
        let name = global.master_name.as_deref().unwrap_or_default();
        format!("{urls} (the sentinels of {name})")
    } else {
        urls
    }
}

/// The Cluster's seed nodes.
fn seeds(urls: &[String], tls: Option<Certificates>) -> Result<Seeds, Error> {
    let mut nodes = Vec::with_capacity(urls.len());
    for url in urls {
        check_scheme(url, tls.as_ref())?;
        nodes.push(url.as_str().into_connection_info().map_err(|e| {
            Error::Usage(format!(
                "invalid Redis Cluster URL {}: {e}",
                hide_credentials(url)
            ))
        })?);
    }
    Ok(Seeds { nodes, tls })
}

/// The sentinels of `master_name`. As in the library, the primary is reached with the first
/// URL's credentials, database and TLS mode (sentinels and data nodes usually share them).
fn sentinels(urls: &[String], master_name: &str, tls: Option<&Certificates>) -> Result<Sentinels, Error> {
    if master_name.is_empty() {
        return Err(Error::Usage("--master-name must not be empty".to_owned()));
    }
    if tls.is_some() {
        return Err(Error::Usage(
            "--tls-ca, --tls-cert and --tls-key are not supported with --sentinel (nor by the \
             library's .sentinel(…)); use rediss:// with a public CA"
                .to_owned(),
        ));
    }
    let mut infos = Vec::with_capacity(urls.len());
    for url in urls {
        check_scheme(url, None)?;
        infos.push(
            url.as_str()
                .into_connection_info()
                .map_err(|e| Error::Usage(format!("invalid Sentinel URL {}: {e}", hide_credentials(url))))?,
        );
    }
    let mut node =
        SentinelNodeConnectionInfo::default().set_redis_connection_info(infos[0].redis_settings().clone());
    if urls[0].starts_with("rediss://") {
        node = node.set_tls_mode(redis::TlsMode::Secure);
    }
    // An owned `String` suits redis-rs with and without its rustls feature.
    let name: String = master_name.to_owned();
    let client = SentinelClient::build(infos, name, Some(node), SentinelServerType::Master)
        .map_err(|e| Error::Usage(format!("invalid Sentinel configuration: {e}")))?;
    Ok(Sentinels {
        client: tokio::sync::Mutex::new(client),
        master_name: master_name.to_owned(),
    })
}

/// TLS material for every node: redis-rs's certificates (the `tls` feature).
#[cfg(feature = "tls")]
type Certificates = redis::TlsCertificates;

/// Without the `tls` feature there is no TLS material: no value of this type exists.
#[cfg(not(feature = "tls"))]
#[derive(Clone)]
enum Certificates {}

/// The TLS material given (the `tls` feature), to present to every node; `None` without any.
#[cfg(feature = "tls")]
fn tls_material(global: &Global) -> Result<Option<Certificates>, Error> {
    // rustls needs a process-wide crypto provider; the library installs the same one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = &global.tls;
    let root_cert = tls.tls_ca.as_deref().map(read_pem).transpose()?;
    let client_tls = match (&tls.tls_cert, &tls.tls_key) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read_pem(cert)?,
            client_key: read_pem(key)?,
        }),
        _ => None,
    };
    if root_cert.is_none() && client_tls.is_none() {
        return Ok(None);
    }
    Ok(Some(redis::TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// Without the `tls` feature there is no TLS material.
#[cfg(not(feature = "tls"))]
fn tls_material(_: &Global) -> Result<Option<Certificates>, Error> {
    Ok(None)
}

/// Refuses a `rediss://` URL lockctl cannot speak, and TLS files for a URL without TLS.
fn check_scheme(url: &str, tls: Option<&Certificates>) -> Result<(), Error> {
    let secure = url.starts_with("rediss://");
    if secure && !cfg!(feature = "tls") {
        return Err(Error::Usage(
            "a rediss:// (TLS) URL needs lockctl built with lock-runtime's `tls` feature".to_owned(),
        ));
    }
    if tls.is_some() && !secure {
        return Err(Error::Usage(
            "TLS files were given, but the Redis URL is not rediss://".to_owned(),
        ));
    }
    Ok(())
}

/// The `redis::Client` for one server's URL, with the TLS material when given.
fn client(url: &str, tls: Option<Certificates>) -> Result<redis::Client, Error> {
    check_scheme(url, tls.as_ref())?;
    match tls {
        None => redis::Client::open(url)
            .map_err(|e| Error::Usage(format!("invalid Redis URL {}: {e}", hide_credentials(url)))),
        Some(certificates) => with_certificates(url, certificates),
    }
}

#[cfg(feature = "tls")]
fn with_certificates(url: &str, certificates: Certificates) -> Result<redis::Client, Error> {
    redis::Client::build_with_tls(url, certificates)
        .map_err(|e| Error::Usage(format!("invalid Redis URL or TLS material: {e}")))
}

#[cfg(not(feature = "tls"))]
fn with_certificates(_: &str, certificates: Certificates) -> Result<redis::Client, Error> {
    match certificates {}
}

/// Every node of a Cluster is reached with the same TLS material.
#[cfg(feature = "tls")]
fn with_tls(builder: ClusterClientBuilder, tls: Option<Certificates>) -> ClusterClientBuilder {
    match tls {
        Some(certificates) => builder.certs(certificates),
        None => builder,
    }
}

#[cfg(not(feature = "tls"))]
fn with_tls(builder: ClusterClientBuilder, _: Option<Certificates>) -> ClusterClientBuilder {
    builder
}

/// A PEM file's bytes.
#[cfg(feature = "tls")]
fn read_pem(path: &std::path::Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::Failed(format!("cannot read {}: {e}", path.display())))
}

use crate::redact::hide_credentials;
