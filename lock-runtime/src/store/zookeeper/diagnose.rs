//! Why no server granted a session, host by host. zookeeper-client answers a failed connect
//! with one error for the whole ensemble (`NoHosts`), so when a session cannot be opened each
//! server is tried again by hand: its name resolved, a TCP connection made, and, on plain
//! connections, ZooKeeper's `srvr` command asked (the one four-letter word servers answer by
//! default). What each step found is the cause named in the error: `refused the connection`,
//! `cannot be resolved`, `no TCP answer`, `not ZooKeeper`, `not serving requests`. Only a failed
//! connect pays for it, and all servers are tried at once, each step bounded.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long each step waits for one server.
const STEP: Duration = Duration::from_millis(700);
/// How long a server is given to speak first: ZooKeeper never does, MySQL, SSH and SMTP do.
const GREETING: Duration = Duration::from_millis(150);

/// One line per server: `host:port <what was found>`, joined by `; `.
pub(super) async fn servers(hosts: &[String], tls: bool) -> String {
    let found = futures_util::future::join_all(hosts.iter().map(|host| server(host, tls))).await;
    hosts
        .iter()
        .zip(found)
        .map(|(host, found)| format!("{host} {found}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// What `host` (`host:port`) does when a client comes.
async fn server(host: &str, tls: bool) -> String {
    let addresses = match tokio::time::timeout(STEP, tokio::net::lookup_host(host)).await {
        Ok(Ok(addresses)) => addresses.collect::<Vec<_>>(),
        Ok(Err(e)) => return format!("cannot be resolved ({e})"),
        Err(_) => return format!("cannot be resolved (no answer within {STEP:?})"),
    };
    let Some(address) = addresses.first() else {
        return "cannot be resolved (no address)".to_owned();
    };
    let mut stream = match tokio::time::timeout(STEP, TcpStream::connect(address)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return "refused the connection (nothing listens on that port)".to_owned();
        }
        Ok(Err(e)) => return format!("cannot be connected to ({e})"),
        Err(_) => return format!("gave no TCP answer within {STEP:?} (a host that is down, or a firewall)"),
    };
    if tls {
        return "accepts connections but opened no ZooKeeper session over TLS (its certificate \
                not signed by the CA given to .tls_root_ca(…), a client certificate it refused, \
                or a port that does not speak TLS)"
            .to_owned();
    }
    let mut answer = vec![0_u8; 256];
    match tokio::time::timeout(GREETING, stream.read(&mut answer)).await {
        Ok(Ok(0)) => return "closes connections at once (not a ZooKeeper server?)".to_owned(),
        Ok(Ok(n)) => return format!("is not ZooKeeper: it speaks first ({})", shown(&answer[..n])),
        Ok(Err(e)) => return format!("broke the connection ({e})"),
        Err(_) => {}
    }
    if let Err(e) = stream.write_all(b"srvr").await {
        return format!("broke the connection ({e})");
    }
    let mut read = 0;
    let answered = tokio::time::timeout(STEP, async {
        while read < answer.len() {
            match stream.read(&mut answer[read..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&answer[..read]);
    if read == 0 {
        return match answered {
            Err(_) => format!(
                "accepts connections but answered nothing within {STEP:?} (not ZooKeeper, or a \
                 stopped server)"
            ),
            Ok(()) => "closed the connection without an answer (not ZooKeeper?)".to_owned(),
        };
    }
    if text.contains("not currently serving requests") {
        return "is ZooKeeper, not serving requests (it has no quorum: is a majority of the \
                ensemble up?)"
            .to_owned();
    }
    if text.starts_with("Zookeeper version") || text.contains("not in the whitelist") {
        return "is ZooKeeper but granted no session".to_owned();
    }
    format!("is not ZooKeeper: it answered {}", shown(&answer[..read]))
}

/// The first bytes of an answer, printable: `"…"` with other bytes escaped, cut at 40.
fn shown(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(40)];
    let text: String = cut.escape_ascii().to_string();
    match bytes.len() > 40 {
        true => format!("\"{text}…\""),
        false => format!("\"{text}\""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn each_server_is_named_with_what_it_did() {
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let refused = closed.local_addr().unwrap().to_string();
        drop(closed);

        let greeter = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let greets = greeter.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = greeter.accept().await {
                let _ = s.write_all(b"\x4a\x00\x00\x00\x0a5.5.5-10.11.6-MariaDB").await;
            }
        });
        let redis = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let errs = redis.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = redis.accept().await {
                let mut buf = [0_u8; 4];
                let _ = s.read_exact(&mut buf).await;
                let _ = s.write_all(b"-ERR unknown command 'srvr'\r\n").await;
            }
        });
        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let quiet = silent.local_addr().unwrap().to_string();

        let hosts = [
            refused.clone(),
            "no-such-host.invalid:2181".to_owned(),
            greets.clone(),
            errs.clone(),
            quiet.clone(),
        ];
        let said = servers(&hosts, false).await;
        let each: Vec<&str> = said.split("; ").collect();
        assert_eq!(each.len(), 5, "{said}");
        assert!(
            each[0].starts_with(&format!("{refused} refused the connection")),
            "{said}"
        );
        assert!(
            each[1].starts_with("no-such-host.invalid:2181 cannot be resolved"),
            "{said}"
        );
        assert!(
            each[2].starts_with(&format!("{greets} is not ZooKeeper: it speaks first (\"J\\x00")),
            "{said}"
        );
        assert!(
            each[3].starts_with(&format!("{errs} is not ZooKeeper: it answered \"-ERR")),
            "{said}"
        );
        assert!(
            each[4].starts_with(&format!("{quiet} accepts connections but answered nothing")),
            "{said}"
        );
        drop(silent);
    }
}
