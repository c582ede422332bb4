//! TLS fixtures: [`TestCerts`], a throwaway certificate authority and the certificates it signs,
//! and [`RedisServer::spawn_tls`], a `redis-server` that also listens with TLS.

use std::ffi::OsString;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::{other_free_port, RedisServer};

/// PEM certificates and keys for TLS tests, all new at each [`TestCerts::generate`]:
///
/// - a self-signed CA ([`ca_pem`](Self::ca_pem));
/// - a server certificate signed by it, for `127.0.0.1` (IP address) and `localhost` (DNS
///   name), extended key usage serverAuth ([`server_cert_pem`](Self::server_cert_pem),
///   [`server_key_pem`](Self::server_key_pem));
/// - a client certificate signed by it, extended key usage clientAuth
///   ([`client_cert_pem`](Self::client_cert_pem), [`client_key_pem`](Self::client_key_pem));
/// - another self-signed CA that signed none of them ([`wrong_ca_pem`](Self::wrong_ca_pem)),
///   for tests that a client trusting only it refuses the server.
///
/// Keys are ECDSA P-256, in PKCS#8 PEM (`BEGIN PRIVATE KEY`); certificates are valid from 1975
/// to 4096, so no test ever meets an expired one.
#[derive(Debug, Clone)]
pub struct TestCerts {
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
    wrong_ca: String,
}

impl TestCerts {
    /// Generates a new CA, server and client certificates signed by it, and an unrelated CA.
    pub fn generate() -> TestCerts {
        let (ca_params, ca_key) = new_ca("lock-tests CA");
        let ca = ok(ca_params.self_signed(&ca_key), "the CA certificate");
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = key_pair();
        let server_params = leaf_params(
            "lock-tests server",
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let server_cert = ok(
            server_params.signed_by(&server_key, &issuer),
            "the server certificate",
        );

        let client_key = key_pair();
        let client_params = leaf_params("lock-tests client", &[], ExtendedKeyUsagePurpose::ClientAuth);
        let client_cert = ok(
            client_params.signed_by(&client_key, &issuer),
            "the client certificate",
        );

        let (wrong_params, wrong_key) = new_ca("lock-tests wrong CA");
        let wrong_ca = ok(wrong_params.self_signed(&wrong_key), "the wrong CA certificate");

        TestCerts {
            ca: ca.pem(),
            server_cert: server_cert.pem(),
            server_key: server_key.serialize_pem(),
            client_cert: client_cert.pem(),
            client_key: client_key.serialize_pem(),
            wrong_ca: wrong_ca.pem(),
        }
    }

    /// The CA certificate that signed the server and client certificates.
    pub fn ca_pem(&self) -> &[u8] {
        self.ca.as_bytes()
    }

    /// The server certificate (SANs `127.0.0.1` and `localhost`), signed by the CA.
    pub fn server_cert_pem(&self) -> &[u8] {
        self.server_cert.as_bytes()
    }

    /// The server certificate's private key.
    pub fn server_key_pem(&self) -> &[u8] {
        self.server_key.as_bytes()
    }

    /// The client certificate, signed by the CA.
    pub fn client_cert_pem(&self) -> &[u8] {
        self.client_cert.as_bytes()
    }

    /// The client certificate's private key.
    pub fn client_key_pem(&self) -> &[u8] {
        self.client_key.as_bytes()
    }

    /// A self-signed CA certificate unrelated to the others: trusting only it, a client must
    /// refuse the server.
    pub fn wrong_ca_pem(&self) -> &[u8] {
        self.wrong_ca.as_bytes()
    }
}

fn ok<T>(result: Result<T, rcgen::Error>, what: &str) -> T {
    result.unwrap_or_else(|e| panic!("cannot generate {what}: {e}"))
}

fn key_pair() -> KeyPair {
    ok(KeyPair::generate(), "a key pair")
}

fn new_ca(name: &str) -> (CertificateParams, KeyPair) {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (params, key_pair())
}

fn leaf_params(name: &str, names: &[&str], usage: ExtendedKeyUsagePurpose) -> CertificateParams {
    let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
    // An IP address becomes an IP SAN, anything else a DNS SAN.
    let mut params = ok(CertificateParams::new(names), "certificate parameters");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    params
}

impl RedisServer {
    /// Like [`RedisServer::spawn`], but the server also listens with TLS on a second free port
    /// ([`tls_port`](Self::tls_port)), with `certs`' server certificate and key, trusting `certs`'
    /// CA for client certificates. With `require_client_cert`, a client must present a
    /// certificate signed by that CA (`--tls-auth-clients yes`); without, none is asked for
    /// (`--tls-auth-clients no`). The plaintext port stays open, for [`raw`](Self::raw) and
    /// [`url`](Self::url). The PEM files are written into the server's temp dir, and
    /// [`restart`](Self::restart) keeps TLS and both ports.
    pub fn spawn_tls(certs: &TestCerts, require_client_cert: bool) -> RedisServer {
        RedisServer::spawn_with(|dir, port| {
            let tls_port = other_free_port(port);
            let file = |name: &str, pem: &[u8]| {
                let path = dir.join(name);
                std::fs::write(&path, pem).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
                path.into_os_string()
            };
            let args: Vec<OsString> = vec![
                "--tls-port".into(),
                tls_port.to_string().into(),
                "--tls-cert-file".into(),
                file("server.crt", certs.server_cert_pem()),
                "--tls-key-file".into(),
                file("server.key", certs.server_key_pem()),
                "--tls-ca-cert-file".into(),
                file("ca.crt", certs.ca_pem()),
                "--tls-auth-clients".into(),
                if require_client_cert { "yes" } else { "no" }.into(),
            ];
            (Some(tls_port), args)
        })
    }

    /// The TLS port, for a server made by [`spawn_tls`](Self::spawn_tls); `None` otherwise.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// `rediss://127.0.0.1:<tls_port>`. Panics if the server was not made by
    /// [`spawn_tls`](Self::spawn_tls).
    pub fn tls_url(&self) -> String {
        let Some(port) = self.tls_port else {
            panic!(
                "the redis-server on port {} does not listen with TLS: start it with \
                 RedisServer::spawn_tls",
                self.port
            );
        };
        format!("rediss://127.0.0.1:{port}")
    }
}
