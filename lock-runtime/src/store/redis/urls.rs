//! How a Redis URL becomes a `redis::Client`: checked without connecting (scheme, TLS feature,
//! PEM material, no `#insecure`), with TCP keepalive and the client's TLS material.

use std::time::Duration;

use crate::redact::hide_credentials;
use crate::store::TlsMaterial;
use crate::LockError;

/// Refuses a URL whose `#insecure` fragment would turn TLS certificate checks off (redis-rs
/// honours it when any crate in the build enables its insecure TLS feature): a lock that guards
/// money does not talk to whoever answers.
pub(crate) fn no_insecure_urls(urls: &[String]) -> Result<(), LockError> {
    for url in urls {
        if url
            .split_once('#')
            .is_some_and(|(_, fragment)| fragment.eq_ignore_ascii_case("insecure"))
        {
            return Err(LockError::invalid_options(format!(
                "{}: `#insecure` would turn TLS certificate verification off; trust a private \
                 CA with .tls_root_ca(…) instead",
                hide_credentials(url)
            )));
        }
    }
    Ok(())
}

/// The `redis::Client` for `url`: checked (scheme, TLS feature, PEM material) without
/// connecting, with TCP keepalive. `TCP_NODELAY` stays off, as redis-rs leaves it: a request
/// waits for no ACK anyway (the answer to the previous one carries it), while with many
/// requests in flight Nagle's algorithm packs them into fewer packets, which measured 24% more
/// pairs per second with 64 tasks (see BENCHMARKS.md).
pub(crate) fn client_for_url(url: &str, tls: &TlsMaterial) -> Result<redis::Client, LockError> {
    if !url.contains("://") {
        return Err(LockError::invalid_options(format!(
            "{}: the Redis URL has no scheme: write it as redis://host:port (rediss://host:port for TLS)",
            hide_credentials(url)
        )));
    }
    let is_tls = url.starts_with("rediss://");
    if is_tls && !cfg!(feature = "tls") {
        return Err(LockError::invalid_options(
            "a rediss:// (TLS) URL needs lock-runtime's `tls` feature",
        ));
    }
    if !tls.is_empty() && !is_tls {
        return Err(LockError::invalid_options(
            "TLS certificates were given, but the Redis URL is not rediss://",
        ));
    }
    let invalid = |e: redis::RedisError| {
        LockError::invalid_options(format!("{}: not a Redis URL ({e})", hide_credentials(url)))
    };
    let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(invalid)?;
    let info = info.set_tcp_settings(tcp_settings());
    let no_certificate = |pem: &[u8]| !String::from_utf8_lossy(pem).contains("-----BEGIN CERTIFICATE-----");
    if tls.root_ca.as_deref().is_some_and(no_certificate)
        || tls
            .client_auth
            .as_ref()
            .is_some_and(|(cert, _)| no_certificate(cert))
    {
        return Err(LockError::invalid_options(
            "invalid TLS material: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
        ));
    }
    if is_tls {
        tls_client(info, tls)
    } else {
        redis::Client::open(info).map_err(invalid)
    }
}

/// TCP keepalive (15 s, then every 5 s), so a peer that vanished is noticed by the kernel too.
pub(crate) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    let keepalive = redis::io::tcp::socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(15))
        .with_interval(Duration::from_secs(5));
    redis::io::tcp::TcpSettings::default().set_keepalive(keepalive)
}

/// The material as redis-rs takes it.
#[cfg(feature = "tls")]
pub(crate) fn certificates(tls: &TlsMaterial) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: tls
            .client_auth
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.root_ca.clone(),
    }
}

#[cfg(feature = "tls")]
fn tls_client(info: redis::ConnectionInfo, tls: &TlsMaterial) -> Result<redis::Client, LockError> {
    crate::store::install_crypto_provider();
    if tls.is_empty() {
        return redis::Client::open(info)
            .map_err(|e| LockError::invalid_options(format!("invalid Redis URL: {e}")));
    }
    redis::Client::build_with_tls(info, certificates(tls))
        .map_err(|e| LockError::invalid_options(format!("invalid TLS material: {e}")))
}

#[cfg(not(feature = "tls"))]
fn tls_client(_: redis::ConnectionInfo, _: &TlsMaterial) -> Result<redis::Client, LockError> {
    Err(LockError::invalid_options(
        "a rediss:// (TLS) URL needs lock-runtime's `tls` feature",
    ))
}
