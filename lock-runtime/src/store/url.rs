//! Which store a URL names ([`LockClient::connect`](crate::LockClient::connect), `lockctl
//! --url`): one scheme (or a few spellings of it) per store, in one table.

use std::sync::Arc;

use super::{Refused, StoreConfig};
use crate::{LockClientBuilder, LockError};

/// A store's schemes, the builder's methods that name it, the cargo feature it needs (and
/// whether it is on), and how a URL of it becomes a description.
struct Scheme {
    schemes: &'static [&'static str],
    store: &'static str,
    /// The builder's methods for this store (each defined in the store's folder), as the
    /// builder's messages must name them (checked by a test).
    #[cfg_attr(not(test), allow(dead_code))]
    builder: &'static [&'static str],
    feature: Option<(&'static str, bool)>,
    config: fn(&str) -> Result<Arc<dyn StoreConfig>, LockError>,
}

/// Every store a URL can name.
const SCHEMES: &[Scheme] = &[
    Scheme {
        schemes: &["redis", "rediss", "redis+unix", "unix", "valkey", "valkeys"],
        store: "Redis",
        builder: &[".redis_client", ".cluster", ".sentinel", ".redlock"],
        feature: Some(("redis", cfg!(feature = "redis"))),
        #[cfg(feature = "redis")]
        config: super::redis::config::from_url,
        #[cfg(not(feature = "redis"))]
        config: needs_feature,
    },
    Scheme {
        schemes: &["postgres", "postgresql"],
        store: "PostgreSQL",
        builder: &[".postgres"],
        feature: Some(("postgres", cfg!(feature = "postgres"))),
        #[cfg(feature = "postgres")]
        config: super::postgres::from_url,
        #[cfg(not(feature = "postgres"))]
        config: needs_feature,
    },
    Scheme {
        schemes: &["mysql", "mariadb"],
        store: "MySQL",
        builder: &[".mysql"],
        feature: Some(("mysql", cfg!(feature = "mysql"))),
        #[cfg(feature = "mysql")]
        config: super::mysql::from_url,
        #[cfg(not(feature = "mysql"))]
        config: needs_feature,
    },
    Scheme {
        schemes: &["etcd"],
        store: "etcd",
        builder: &[".etcd"],
        feature: Some(("etcd", cfg!(feature = "etcd"))),
        #[cfg(feature = "etcd")]
        config: super::etcd::from_url,
        #[cfg(not(feature = "etcd"))]
        config: needs_feature,
    },
    Scheme {
        schemes: &["zk", "zookeeper", "zks"],
        store: "ZooKeeper",
        builder: &[".zookeeper"],
        feature: Some(("zookeeper", cfg!(feature = "zookeeper"))),
        #[cfg(feature = "zookeeper")]
        config: super::zookeeper::from_url,
        #[cfg(not(feature = "zookeeper"))]
        config: needs_feature,
    },
];

/// A store whose feature is off (never called: [`config_for_url`] says so first).
#[allow(dead_code)] // when every store's feature is on
fn needs_feature(_: &str) -> Result<Arc<dyn StoreConfig>, LockError> {
    Err(LockError::invalid_options("this store's cargo feature is off"))
}

/// Any store, by URL.
impl LockClientBuilder {
    /// Where the locks live, by URL: its scheme picks the store, as for
    /// [`LockClient::connect`](crate::LockClient::connect) (`redis://`, `rediss://`, `postgres://`, `mysql://`, `etcd://host:port`,
    /// `zk://host:port,host:port`, `zk://user:password@…`, `zks://…` over TLS).
    /// A scheme it does not know fails at `build()`, with the schemes it does.
    ///
    /// ```
    /// # fn demo() -> Result<(), lock_runtime::LockError> {
    /// let locks = lock_runtime::LockClient::builder()
    ///     .store("redis://127.0.0.1:6379")
    ///     .prefix("billing:lock:")
    ///     .build_lazy()?;
    /// # let _ = locks; Ok(()) }
    /// # demo().unwrap();
    /// ```
    pub fn store(self, url: &str) -> Self {
        let config = config_for_url(url).unwrap_or_else(|refusal| Arc::new(Refused::new(url, refusal)));
        self.place_shared(config)
    }
}

/// The store `url` names, by its scheme.
pub(crate) fn config_for_url(url: &str) -> Result<Arc<dyn StoreConfig>, LockError> {
    let shown = crate::redact::hide_credentials(url);
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(LockError::invalid_options(format!(
            "{shown}: no scheme; write it as {}",
            known()
        )));
    };
    let scheme = scheme.to_ascii_lowercase();
    if let Some(store) = SCHEMES.iter().find(|s| s.schemes.contains(&scheme.as_str())) {
        if let Some((feature, false)) = store.feature {
            return Err(LockError::invalid_options(format!(
                "{shown}: a {scheme}:// URL ({}) needs lock-runtime's `{feature}` feature",
                store.store
            )));
        }
        return (store.config)(url);
    }
    let hint = match scheme.as_str() {
        "http" | "https" => {
            " (an etcd endpoint is etcd://host:2379 here; .etcd([…]) takes http:// endpoints)"
        }
        _ => "",
    };
    Err(LockError::invalid_options(format!(
        "{shown}: unknown scheme `{scheme}://`{hint}; the schemes are {}",
        known()
    )))
}

/// The schemes, as a message lists them.
fn known() -> String {
    let all: Vec<String> = SCHEMES
        .iter()
        .map(|s| {
            let names: Vec<String> = s.schemes.iter().map(|n| format!("{n}://")).collect();
            match s.feature {
                Some((feature, _)) => format!("{} ({}, feature `{feature}`)", names.join(", "), s.store),
                None => format!("{} ({})", names.join(", "), s.store),
            }
        })
        .collect();
    all.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The builder's messages name every store's builder methods, as the table lists them, and
    /// nothing else: a store added to the table without them in the message fails here.
    #[test]
    fn the_builder_names_the_builder_methods_of_every_store_in_the_table() {
        let named: Vec<&str> = crate::builder::STORE_METHODS
            .split(['(', ' '])
            .filter(|word| word.starts_with('.'))
            .collect();
        let mut expected = vec![".store", ".url"];
        expected.extend(SCHEMES.iter().flat_map(|s| s.builder.iter().copied()));
        assert_eq!(named, expected, "{}", crate::builder::STORE_METHODS);
    }

    #[test]
    fn a_scheme_it_does_not_know_is_named_with_the_ones_it_does() {
        let Err(LockError::InvalidOptions { reason }) = config_for_url("http://u:secret@h:2379") else {
            panic!("http:// taken");
        };
        assert!(reason.contains("etcd://host:2379"), "{reason}");
        assert!(
            reason.contains("redis://") && reason.contains("postgres://"),
            "{reason}"
        );
        assert!(!reason.contains("secret"), "{reason}");
        let Err(LockError::InvalidOptions { reason }) = config_for_url("127.0.0.1:6379") else {
            panic!("no scheme taken");
        };
        assert!(reason.contains("no scheme"), "{reason}");
        #[cfg(feature = "redis")]
        assert!(config_for_url("redis://127.0.0.1:6379").is_ok());
    }
}
