//! Where the locks are: one `redis::Client` (with the TLS material, if any) that every
//! connection of the command comes from, the lock client for `release` included.

use std::time::Duration;

use redis::aio::{MultiplexedConnection, PubSub};
use redis::AsyncConnectionConfig;

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

/// The server and the prefix every command works on.
#[derive(Debug)]
pub(crate) struct Target {
    client: redis::Client,
    prefix: String,
    timeout: Duration,
}

impl Target {
    /// Checks the URL (and reads the TLS files); connects nothing yet.
    pub(crate) fn new(global: &Global) -> Result<Target, Error> {
        if global.prefix.is_empty() {
            return Err(Error::Usage("--prefix must not be empty".to_owned()));
        }
        if !global.url.contains("://") {
            return Err(Error::Usage(format!(
                "the Redis URL {} has no scheme: write it as redis://host:port (rediss://host:port for TLS)",
                hide_credentials(&global.url)
            )));
        }
        Ok(Target {
            client: client(global)?,
            prefix: global.prefix.clone(),
            timeout: Duration::from_millis(global.timeout_ms),
        })
    }

    /// The key prefix.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A connection for reads, with the connect and answer timeouts.
    pub(crate) async fn connection(&self) -> Result<MultiplexedConnection, Error> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        Ok(self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }

    /// A pub/sub connection, within the connect timeout.
    pub(crate) async fn pubsub(&self) -> Result<PubSub, Error> {
        match tokio::time::timeout(self.timeout, self.client.get_async_pubsub()).await {
            Ok(pubsub) => Ok(pubsub?),
            Err(_) => Err(Error::Failed(format!(
                "no pub/sub connection within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }
}

/// The `redis::Client` for the URL, with TLS material when given.
#[cfg(feature = "tls")]
fn client(global: &Global) -> Result<redis::Client, Error> {
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
        return open(&global.url);
    }
    if !global.url.starts_with("rediss://") {
        return Err(Error::Usage(
            "TLS files were given, but the Redis URL is not rediss://".to_owned(),
        ));
    }
    let certificates = redis::TlsCertificates {
        client_tls,
        root_cert,
    };
    redis::Client::build_with_tls(global.url.as_str(), certificates)
        .map_err(|e| Error::Usage(format!("invalid Redis URL or TLS material: {e}")))
}

/// The `redis::Client` for the URL.
#[cfg(not(feature = "tls"))]
fn client(global: &Global) -> Result<redis::Client, Error> {
    if global.url.starts_with("rediss://") {
        return Err(Error::Usage(
            "a rediss:// (TLS) URL needs lockctl built with lock-runtime's `tls` feature".to_owned(),
        ));
    }
    open(&global.url)
}

fn open(url: &str) -> Result<redis::Client, Error> {
    redis::Client::open(url)
        .map_err(|e| Error::Usage(format!("invalid Redis URL {}: {e}", hide_credentials(url))))
}

/// A PEM file's bytes.
#[cfg(feature = "tls")]
fn read_pem(path: &std::path::Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::Failed(format!("cannot read {}: {e}", path.display())))
}

pub(crate) use crate::redact::hide_credentials;
