//! The set-up a fresh machine goes through: `scripts/protoc` finds a protoc without the system's,
//! and `scripts/test` says in one line what to install when it cannot install it itself.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

fn checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A directory to use as the whole `PATH`: links to the given programs, found on today's PATH.
fn path_of(programs: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let path = std::env::var_os("PATH").unwrap();
    for program in programs {
        let found = std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
            .unwrap_or_else(|| panic!("{program} is not on PATH"));
        symlink(found, dir.path().join(program)).unwrap();
    }
    dir
}

/// etcd-client's build runs `$PROTOC` (.cargo/config.toml names scripts/protoc): with no protoc
/// on PATH it runs the one the `protoc-bin-vendored` crate brought.
#[test]
fn protoc_without_the_systems() {
    let path = path_of(&["sh", "dirname", "uname", "sed"]);
    let out = Command::new("sh")
        .arg(checkout().join("scripts/protoc"))
        .arg("--version")
        .env_clear()
        .env("PATH", path.path())
        .env("HOME", std::env::var_os("HOME").unwrap())
        .envs(std::env::var_os("CARGO_HOME").map(|home| ("CARGO_HOME", home)))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.starts_with("libprotoc "),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Without the servers and without a way to install them (no apt-get here), `scripts/test` says
/// in one line what to install, and fails: it never runs the tests without them.
#[test]
fn the_test_command_names_what_is_missing() {
    let path = path_of(&["bash", "ls", "id", "dirname", "printf"]);
    let out = Command::new(path.path().join("bash"))
        .arg(checkout().join("scripts/test"))
        .arg("--setup")
        .env_clear()
        .env("PATH", path.path())
        .env("PG_BIN", "/nonexistent")
        .env("MARIADB_BIN", "/nonexistent")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("redis-server (or point $REDIS_SERVER at it)")
            && stderr.contains("etcd (or point $ETCD at it)")
            && stderr.contains("sudo apt-get install redis-server etcd-server")
            && stderr.contains("javac (a JDK"),
        "{stderr}"
    );
}
