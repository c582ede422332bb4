//! Self-tests of the test kit's MariaDB servers: root logs in over TCP, a restart and a kill
//! keep what was committed, a paused server does not answer, and a dropped one leaves nothing.
//!
//! ```text
//! cargo test -p lock-tests --test mariadb_kit
//! ```

use std::io::Read;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use lock_tests::{shared_mysql_url, MariadbServer};

/// Whether a new connection to `port` gets the server's greeting (the first packet of the
/// MySQL protocol, sent by the server) within `within`.
fn greets(port: u16, within: Duration) -> bool {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("no connection: {e}"));
    stream
        .set_read_timeout(Some(within))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut first = [0u8; 4];
    stream.read_exact(&mut first).is_ok()
}

#[test]
fn a_kit_server_lets_root_in_and_keeps_its_data_across_a_restart_and_a_kill() {
    let mut server = MariadbServer::spawn();
    let port = server.port();
    assert_eq!(server.url(), format!("mysql://root@127.0.0.1:{port}/test"));
    assert_eq!(server.sql("SELECT 1"), "1\n");
    assert_eq!(server.sql("SELECT current_user()"), "root@127.0.0.1\n");
    server.sql("CREATE TABLE test.t (x int); INSERT INTO test.t VALUES (7)");

    let before = server.pid();
    server.restart();
    assert_ne!(server.pid(), before, "the same process after a restart");
    assert_eq!(server.port(), port, "another port after a restart");
    assert_eq!(
        server.sql("SELECT x FROM test.t"),
        "7\n",
        "the restart lost the row"
    );

    server.sql("INSERT INTO test.t VALUES (8)");
    server.kill();
    assert_eq!(server.pid(), None);
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "a killed server still listens"
    );
    server.start_again();
    assert_eq!(
        server.sql("SELECT x FROM test.t ORDER BY x"),
        "7\n8\n",
        "crash recovery lost a committed row"
    );

    server.pause();
    assert!(
        !greets(port, Duration::from_millis(300)),
        "a paused server greeted a new connection"
    );
    server.resume();
    assert!(
        greets(port, Duration::from_secs(5)),
        "a resumed server did not greet"
    );
    assert_eq!(server.sql("SELECT count(*) FROM test.t"), "2\n");

    let (dir, pid) = (server.dir().to_path_buf(), server.pid());
    drop(server);
    assert!(!dir.exists(), "the temp dir outlived its server");
    let pid = pid.unwrap_or_else(|| panic!("no pid"));
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the process outlived its server"
    );
}

#[test]
fn the_shared_url_points_at_a_server_that_listens() {
    let url = shared_mysql_url();
    let address = url
        .strip_prefix("mysql://")
        .and_then(|rest| rest.split('/').next())
        .and_then(|authority| authority.rsplit('@').next())
        .unwrap_or_else(|| panic!("not a mysql:// url: {url}"));
    TcpStream::connect(address).unwrap_or_else(|e| panic!("nothing listens at {address} ({url}): {e}"));
    assert_eq!(shared_mysql_url(), url, "another url at the second call");
}
