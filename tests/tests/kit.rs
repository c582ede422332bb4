//! Self-tests of the test kit's fixtures: the fault proxy and the TLS redis-server.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lock_tests::{eventually, FaultProxy, RedisServer, TestCerts, SECOND};
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

/// How long a request that must not be answered is given to be answered anyway.
const SILENCE: Duration = Duration::from_millis(300);

const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";
const PONG: &[u8] = b"+PONG\r\n";

/// A multiplexed connection to `url` with no response timeout of its own: each test bounds its
/// requests with `tokio::time::timeout`.
async fn connect(url: &str) -> MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(2 * SECOND))
        .set_response_timeout(None);
    let client = redis::Client::open(url).unwrap_or_else(|e| panic!("bad url {url}: {e}"));
    timeout(
        5 * SECOND,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    .unwrap_or_else(|_| panic!("no connection to {url} within 5 s"))
    .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

async fn ping(conn: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(conn).await
}

/// PING answered with PONG within 5 s.
async fn assert_pings(conn: &mut MultiplexedConnection) {
    let reply = timeout(5 * SECOND, ping(conn))
        .await
        .unwrap_or_else(|_| panic!("no PING answer within 5 s"))
        .unwrap_or_else(|e| panic!("PING failed: {e}"));
    assert_eq!(reply, "PONG");
}

/// A PING that gets no answer, not even an error, within [`SILENCE`].
async fn assert_silent(conn: &mut MultiplexedConnection) {
    if let Ok(reply) = timeout(SILENCE, ping(conn)).await {
        panic!("expected no answer, got {reply:?}");
    }
}

/// The number of clients connected to `server`, the connection asking included.
async fn clients(server: &RedisServer) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut server.raw().await)
        .await
        .unwrap_or_else(|e| panic!("CLIENT LIST failed: {e}"));
    list.lines().count()
}

async fn raw_tcp(port: u16) -> tokio::net::TcpStream {
    timeout(5 * SECOND, tokio::net::TcpStream::connect(("127.0.0.1", port)))
        .await
        .unwrap_or_else(|_| panic!("no TCP connection within 5 s"))
        .unwrap_or_else(|e| panic!("cannot connect: {e}"))
}

/// Reads exactly `expected.len()` bytes within 5 s and compares.
async fn assert_reads(stream: &mut tokio::net::TcpStream, expected: &[u8]) {
    let mut got = vec![0u8; expected.len()];
    timeout(5 * SECOND, stream.read_exact(&mut got))
        .await
        .unwrap_or_else(|_| panic!("no reply within 5 s"))
        .unwrap_or_else(|e| panic!("read failed: {e}"));
    assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(expected));
}

async fn write(stream: &mut tokio::net::TcpStream, bytes: &[u8]) {
    stream
        .write_all(bytes)
        .await
        .unwrap_or_else(|e| panic!("write failed: {e}"));
}

mod proxy {
    use super::*;

    #[tokio::test]
    async fn relays_requests_and_counts_connections() {
        let server = RedisServer::spawn();
        let proxy = FaultProxy::start(server.port());
        assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}", proxy.port()));
        assert_eq!(proxy.accepted(), 0);
        let mut conn = connect(&proxy.url()).await;
        assert_pings(&mut conn).await;
        let _: () = redis::cmd("SET")
            .arg("through-proxy")
            .arg("yes")
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("SET failed: {e}"));
        let value: String = redis::cmd("GET")
            .arg("through-proxy")
            .query_async(&mut server.raw().await)
            .await
            .unwrap_or_else(|e| panic!("GET failed: {e}"));
        assert_eq!(value, "yes");
        assert_eq!(proxy.accepted(), 1);
    }

    #[tokio::test]
    async fn relays_a_large_value_both_ways() {
        let server = RedisServer::spawn();
        let proxy = FaultProxy::start(server.port());
        let mut conn = connect(&proxy.url()).await;
        let big = "x".repeat(1 << 20);
        let _: () = timeout(
            5 * SECOND,
            redis::cmd("SET").arg("big").arg(&big).query_async(&mut conn),
        )
        .await
        .unwrap_or_else(|_| panic!("SET not answered within 5 s"))
        .unwrap_or_else(|e| panic!("SET failed: {e}"));
        let back: String = timeout(5 * SECOND, redis::cmd("GET").arg("big").query_async(&mut conn))
            .await
            .unwrap_or_else(|_| panic!("GET not answered within 5 s"))
            .unwrap_or_else(|e| panic!("GET failed: {e}"));
        assert!(back == big, "the value came back altered");
    }

    #[tokio::test]
    async fn delay_holds_back_each_direction() {
        let server = RedisServer::spawn();
        let proxy = FaultProxy::start(server.port());
        let mut conn = connect(&proxy.url()).await;
        assert_pings(&mut conn).await;

        let delay = Duration::from_millis(300);
        proxy.delay(delay);
        let started = Instant::now();
        assert_pings(&mut conn).await;
        let took = started.elapsed();
        assert!(took >= 2 * delay, "a delayed round trip took only {took:?}");

        proxy.relay();
        let started = Instant::now();
        assert_pings(&mut conn).await;
        let took = started.elapsed();
        assert!(took < delay, "after relay() a round trip still took {took:?}");
    }

    #[tokio::test]
    async fn blackhole_existing_silences_open_connections_only() {
        let server = RedisServer::spawn();
        let proxy = FaultProxy::start(server.port());
        let mut old = connect(&proxy.url()).await;
        assert_pings(&mut old).await;
        assert_eq!(proxy.accepted(), 1);

        proxy.blackhole_existing();
        assert_eq!(proxy.dropped(), 0);
        assert_silent(&mut old).await;
        eventually(
            5 * SECOND,
            "the PING reaches the proxy, which drops it",
            || async { proxy.dropped() == PING.len() },
        )
        .await;

        let mut new = connect(&proxy.url()).await;
        assert_pings(&mut new).await;
        assert_eq!(proxy.accepted(), 2);
        // The old one stays silent even now that new connections work, and is not closed.
        assert_silent(&mut old).await;
        assert_eq!(clients(&server).await, 3, "old, new, and the one asking");
    }

    #[tokio::test]
    async fn blackhole_existing_keeps_silent_when_the_server_closes() {
        let mut server = RedisServer::spawn();
        let proxy = FaultProxy::start(server.port());
        let mut stream = raw_tcp(proxy.port()).await;
        write(&mut stream, PING).await;
        assert_reads(&mut stream, PONG).await;
        proxy.blackhole_existing();
        // The server's side closes; the client must not hear of it.
        server.kill();
        let mut byte = [0u8; 1];
        if let Ok(read) = timeout(SILENCE, stream.read(&mut byte)).await {
            panic!("a silenced connection reported {read:?}");
        }
    }

    #[tokio::test]
    async fn blackhole_silences_everything_and_drops_what_it_read() {
        let server = RedisServer::spawn();
        let proxy = FaultProxy::start(server.port());
        let mut old = raw_tcp(proxy.port()).await;
        write(&mut old, PING).await;
        assert_reads(&mut old, PONG).await;

        proxy.blackhole();
        write(&mut old, PING).await;
        let mut new = raw_tcp(proxy.port()).await;
        write(&mut new, PING).await;
        for stream in [&mut old, &mut new] {
            let mut byte = [0u8; 1];
            if let Ok(read) = timeout(SILENCE, stream.read(&mut byte)).await {
                panic!("a blackholed connection reported {read:?}");
            }
        }
        // Both PINGs reached the proxy, which threw them away.
        eventually(5 * SECOND, "the proxy drops both PINGs", || async {
            proxy.dropped() == 2 * PING.len()
        })
        .await;
        assert_eq!(proxy.accepted(), 2);

        proxy.relay();
        // The PINGs sent into the blackhole are gone: the first answer is the ECHO's.
        for stream in [&mut old, &mut new] {
            write(stream, b"*2\r\n$4\r\nECHO\r\n$5\r\nafter\r\n").await;
            assert_reads(stream, b"$5\r\nafter\r\n").await;
        }
    }

    #[tokio::test]
    async fn reset_all_fails_open_connections_and_keeps_accepting() {
        let server = RedisServer::spawn();
        let proxy = FaultProxy::start(server.port());
        let mut conn = connect(&proxy.url()).await;
        assert_pings(&mut conn).await;
        assert_eq!(clients(&server).await, 2);

        proxy.reset_all();
        let failed = timeout(5 * SECOND, ping(&mut conn))
            .await
            .unwrap_or_else(|_| panic!("a reset connection hangs instead of failing"));
        assert!(failed.is_err(), "a reset connection answered {failed:?}");
        // The upstream side is closed too.
        eventually(5 * SECOND, "the server drops the proxied client", || async {
            clients(&server).await == 1
        })
        .await;

        let mut again = connect(&proxy.url()).await;
        assert_pings(&mut again).await;
        assert_eq!(proxy.accepted(), 2);
    }

    #[tokio::test]
    async fn reset_all_sends_rst_not_fin() {
        let server = RedisServer::spawn();
        let proxy = FaultProxy::start(server.port());
        let mut stream = raw_tcp(proxy.port()).await;
        write(&mut stream, PING).await;
        assert_reads(&mut stream, PONG).await;

        proxy.reset_all();
        let mut byte = [0u8; 1];
        let read = timeout(5 * SECOND, stream.read(&mut byte))
            .await
            .unwrap_or_else(|_| panic!("no reset within 5 s"));
        match read {
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
            Ok(n) => panic!("expected a reset, read {n} bytes (0 = an orderly close)"),
        }
    }

    #[tokio::test]
    async fn reset_all_also_resets_silenced_connections() {
        let server = RedisServer::spawn();
        let proxy = FaultProxy::start(server.port());
        let mut stream = raw_tcp(proxy.port()).await;
        write(&mut stream, PING).await;
        assert_reads(&mut stream, PONG).await;
        proxy.blackhole_existing();
        proxy.reset_all();
        let mut byte = [0u8; 1];
        let read = timeout(5 * SECOND, stream.read(&mut byte))
            .await
            .unwrap_or_else(|_| panic!("no reset within 5 s"));
        assert!(read.is_err(), "expected a reset, got {read:?}");
    }

    #[tokio::test]
    async fn a_dead_upstream_resets_the_client() {
        let mut server = RedisServer::spawn();
        let proxy = FaultProxy::start(server.port());
        server.kill();
        // The reset may come before the client's connect() has looked at the socket, which
        // then fails; otherwise the first read does.
        let connected = timeout(
            5 * SECOND,
            tokio::net::TcpStream::connect(("127.0.0.1", proxy.port())),
        )
        .await
        .unwrap_or_else(|_| panic!("no TCP connection within 5 s"));
        let result = match connected {
            Ok(mut stream) => {
                let mut byte = [0u8; 1];
                timeout(5 * SECOND, stream.read(&mut byte))
                    .await
                    .unwrap_or_else(|_| panic!("no reset within 5 s"))
            }
            Err(e) => Err(e),
        };
        match result {
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
            Ok(n) => panic!("expected a reset, read {n} bytes (0 = an orderly close)"),
        }
    }

    #[tokio::test]
    async fn dropping_the_proxy_closes_its_connections() {
        let server = RedisServer::spawn();
        let proxy = FaultProxy::start(server.port());
        let mut stream = raw_tcp(proxy.port()).await;
        write(&mut stream, PING).await;
        assert_reads(&mut stream, PONG).await;
        drop(proxy);
        let mut byte = [0u8; 1];
        let read = timeout(5 * SECOND, stream.read(&mut byte))
            .await
            .unwrap_or_else(|_| panic!("the connection stays open after the drop"));
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "expected the connection closed, got {read:?}"
        );
    }

    /// No Tokio runtime at all on the test's side.
    #[test]
    fn works_from_a_plain_test() {
        let server = RedisServer::spawn();
        let proxy = FaultProxy::start(server.port());
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", proxy.port()))
            .unwrap_or_else(|e| panic!("cannot connect: {e}"));
        stream
            .set_read_timeout(Some(5 * SECOND))
            .unwrap_or_else(|e| panic!("cannot set a read timeout: {e}"));
        let mut reply = [0u8; 7];
        stream
            .write_all(PING)
            .and_then(|()| stream.read_exact(&mut reply))
            .unwrap_or_else(|e| panic!("PING through the proxy failed: {e}"));
        assert_eq!(&reply, PONG);
        proxy.reset_all();
        match stream.read(&mut reply) {
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
            Ok(n) => panic!("expected a reset, read {n} bytes"),
        }
    }
}

mod tls {
    use super::*;

    /// PEM files for redis-cli, in a temp dir that lives as long as this value.
    struct Files {
        dir: tempfile::TempDir,
    }

    impl Files {
        fn new(certs: &TestCerts) -> Files {
            let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("no temp dir: {e}"));
            for (name, pem) in [
                ("ca.crt", certs.ca_pem()),
                ("wrong-ca.crt", certs.wrong_ca_pem()),
                ("client.crt", certs.client_cert_pem()),
                ("client.key", certs.client_key_pem()),
            ] {
                std::fs::write(dir.path().join(name), pem)
                    .unwrap_or_else(|e| panic!("cannot write {name}: {e}"));
            }
            Files { dir }
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }
    }

    /// Runs `redis-cli --tls -h 127.0.0.1 -p <port> --cacert <ca> [--cert --key] ping` and
    /// returns its stdout and stderr, trimmed and joined.
    async fn cli_ping(port: u16, ca: &Path, client: Option<(&Path, &Path)>) -> String {
        let mut command = tokio::process::Command::new("redis-cli");
        command
            .args(["--tls", "-h", "127.0.0.1", "-p", &port.to_string()])
            .arg("--cacert")
            .arg(ca);
        if let Some((cert, key)) = client {
            command.arg("--cert").arg(cert).arg("--key").arg(key);
        }
        command
            .arg("ping")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let output = timeout(10 * SECOND, command.output())
            .await
            .unwrap_or_else(|_| panic!("redis-cli did not finish within 10 s"))
            .unwrap_or_else(|e| panic!("cannot run redis-cli (Debian: apt-get install redis-tools): {e}"));
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        )
    }

    #[test]
    fn certificates_are_pem() {
        let certs = TestCerts::generate();
        for pem in [
            certs.ca_pem(),
            certs.server_cert_pem(),
            certs.client_cert_pem(),
            certs.wrong_ca_pem(),
        ] {
            assert!(pem.starts_with(b"-----BEGIN CERTIFICATE-----"));
        }
        for pem in [certs.server_key_pem(), certs.client_key_pem()] {
            assert!(pem.starts_with(b"-----BEGIN PRIVATE KEY-----"));
        }
        assert_ne!(certs.ca_pem(), certs.wrong_ca_pem());
        assert_ne!(certs.ca_pem(), TestCerts::generate().ca_pem());
    }

    #[tokio::test]
    async fn server_answers_over_tls_and_plaintext() {
        let certs = TestCerts::generate();
        let mut server = RedisServer::spawn_tls(&certs, false);
        let files = Files::new(&certs);
        let tls_port = server
            .tls_port()
            .unwrap_or_else(|| panic!("a TLS server without a TLS port"));
        assert_ne!(tls_port, server.port());
        assert_eq!(server.tls_url(), format!("rediss://127.0.0.1:{tls_port}"));

        assert_eq!(cli_ping(tls_port, &files.path("ca.crt"), None).await, "PONG");
        assert_pings(&mut server.raw().await).await;
        let refused = cli_ping(tls_port, &files.path("wrong-ca.crt"), None).await;
        assert!(
            refused.contains("certificate verify failed"),
            "a client trusting the wrong CA got: {refused}"
        );

        server.restart();
        assert_eq!(server.tls_port(), Some(tls_port));
        assert_eq!(cli_ping(tls_port, &files.path("ca.crt"), None).await, "PONG");
        assert_pings(&mut server.raw().await).await;
    }

    #[tokio::test]
    async fn server_requiring_client_certificates() {
        let certs = TestCerts::generate();
        let mut server = RedisServer::spawn_tls(&certs, true);
        let files = Files::new(&certs);
        let tls_port = server
            .tls_port()
            .unwrap_or_else(|| panic!("a TLS server without a TLS port"));
        let (ca, cert, key) = (
            files.path("ca.crt"),
            files.path("client.crt"),
            files.path("client.key"),
        );

        assert_eq!(cli_ping(tls_port, &ca, Some((&cert, &key))).await, "PONG");
        let without = cli_ping(tls_port, &ca, None).await;
        // TLS 1.3: the client finishes its handshake before the server checks its certificate,
        // so redis-cli connects and fails at the first request.
        assert!(
            without.starts_with("Error:") && !without.contains("PONG"),
            "a client without a certificate got: {without}"
        );

        server.restart();
        assert_eq!(cli_ping(tls_port, &ca, Some((&cert, &key))).await, "PONG");
        let without = cli_ping(tls_port, &ca, None).await;
        assert!(
            without.starts_with("Error:") && !without.contains("PONG"),
            "after restart, a client without a certificate got: {without}"
        );
    }

    #[test]
    #[should_panic(expected = "does not listen with TLS")]
    fn tls_url_of_a_plain_server_panics() {
        let server = RedisServer::spawn();
        assert_eq!(server.tls_port(), None);
        let _ = server.tls_url();
    }
}
