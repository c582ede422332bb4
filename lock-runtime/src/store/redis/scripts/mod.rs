//! The Redis protocol: the Lua scripts (each `.lua` file here) and their Rust halves, one typed
//! call and one typed answer per script ([`acquire`], [`share`], [`renew`], [`release`]), and how
//! they are sent: by hash (`EVALSHA`), and on `NOSCRIPT` (a restarted server, a new primary
//! after a failover, a node added to a cluster) once more with their source (`EVAL`), to the
//! same node as any keyed command. redis-rs's own `Script` would answer `NOSCRIPT` with
//! `SCRIPT LOAD`, which a cluster sends to every node: one unreachable node would then fail an
//! acquire that does not concern it.
//!
//! | script | what | prefixed with |
//! |---|---|---|
//! | `acquire.lua` | one attempt at an exclusive lock that is not fair (with fencing, or waiting) | `fence.lua`, `taking.lua` |
//! | `fair.lua` | one attempt at a fair lock | `fence.lua`, `taking.lua` |
//! | `share.lua` | one attempt at a read share | |
//! | `permit.lua` | one attempt at any free permit of a semaphore | `fence.lua` |
//! | `set.lua` | one attempt at every lock of a set (a transfer's accounts), all or none | `fence.lua` |
//! | `renew.lua` | renews many locks | |
//! | `unlock.lua` | the common release | |
//! | `release.lua` | every other release (fair hand-over, minimum hold, read share, permit) | `fence.lua` |
//! | `rights.lua` | checks once per client that it may run all of the above | |
//! | `inspect.lua` | reads one lock at one instant (`holder`, `lock_runtime::admin`) | |
//! | `force.lua` | an operator's forced release of what was seen (`lock_runtime::admin`) | |
//!
//! The cheapest attempt, a bare `SET NX PX … GET`, is no script: the Redis store sends it itself.

pub(crate) mod acquire;
pub(crate) mod force;
pub(crate) mod inspect;
pub(crate) mod permit;
pub(crate) mod release;
pub(crate) mod renew;
pub(crate) mod share;

use std::io::Write;
use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, FromRedisValue, RedisResult, RedisWrite, ToRedisArgs};

use super::connection::Conn;
use super::deployment::Deployment;

static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("fence.lua"),
        include_str!("taking.lua"),
        include_str!("acquire.lua")
    ))
});
static FAIR: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("fence.lua"),
        include_str!("taking.lua"),
        include_str!("fair.lua")
    ))
});
static RENEW: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("renew.lua")));
static SHARE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("share.lua")));
/// A set of locks, all or none.
pub(crate) static SET: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(concat!(include_str!("fence.lua"), include_str!("set.lua"))));
static PERMIT: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(concat!(include_str!("fence.lua"), include_str!("permit.lua"))));
/// The common release (a lock that is neither fair nor kept for a minimum hold): release.lua's
/// work for that case, in a script small enough to cost Redis what a bare compare-and-delete does.
static UNLOCK: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("unlock.lua")));
/// Run once per client before its first lock: that it may run every command the others run.
pub(crate) static RIGHTS: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("rights.lua")));
/// One lock as it is now.
static INSPECT: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("inspect.lua")));
/// An operator's forced release, compared with what was seen.
static FORCE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("force.lua")));
static RELEASE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(concat!(include_str!("fence.lua"), include_str!("release.lua"))));

/// A caller's token at one lock, on one deployment: what every attempt and release script is
/// called with. Each script builds its own `KEYS` and `ARGV` from it and what the call asks:
/// an exclusive lock that is not fair ([`exclusive`](Self::exclusive)), a fair one
/// ([`fair`](Self::fair)), a permit ([`permit`](Self::permit)), a read share
/// ([`share`](Self::share)); the common release ([`unlock`](Self::unlock)) and any other
/// ([`release`](Self::release)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller<'a> {
    /// The lock's key.
    pub(crate) lock: &'a str,
    pub(crate) token: &'a str,
    /// Whether a waiter marks the lock as waited for (so a release announces only then), and
    /// how a release is announced (`SPUBLISH` on a Cluster).
    pub(crate) deployment: Deployment,
}

impl<'a> Caller<'a> {
    /// The first of an attempt's `KEYS`: the lock, and its counter when the caller asked for
    /// fencing.
    fn fenced(&self, fencing: bool) -> Vec<std::borrow::Cow<'a, str>> {
        let mut named = vec![std::borrow::Cow::Borrowed(self.lock)];
        if fencing {
            named.push(std::borrow::Cow::Owned(super::keys::fence(self.lock)));
        }
        named
    }
}

/// `1`/`0`, as the scripts take flags.
fn flag(on: bool) -> &'static str {
    if on {
        "1"
    } else {
        "0"
    }
}

/// Names `lock`'s waiting mark after the keys in `named` when `marks`, and says where it is in
/// `KEYS` as the attempt scripts take it (`''`: not given).
pub(crate) fn mark_at(named: &mut Vec<std::borrow::Cow<'_, str>>, lock: &str, marks: bool) -> String {
    if !marks {
        return String::new();
    }
    named.push(std::borrow::Cow::Owned(super::keys::waiting(lock)));
    named.len().to_string()
}

/// A script's source and its SHA1.
#[derive(Debug)]
pub(crate) struct Lua {
    source: &'static str,
    hash: String,
}

impl Lua {
    fn new(source: &'static str) -> Lua {
        Lua {
            source,
            hash: redis::Script::new(source).get_hash().to_owned(),
        }
    }

    /// A call of this script on `keys`, to fill with arguments. The request is written as it is
    /// built (no intermediate copies of the keys and arguments: this is on every release's path).
    pub(crate) fn call<K: AsRef<str>>(&'static self, keys: &[K]) -> Call {
        let size = keys.iter().map(|k| k.as_ref().len()).sum::<usize>();
        let mut call = self.begin(keys.len(), size);
        for key in keys {
            call.cmd.arg(key.as_ref());
        }
        call
    }

    /// A call of this script on `lock` and its helper key `<lock><suffix>`, the helper's name
    /// written into the request as it is built, never made on its own (the common release's
    /// path: its waiting mark).
    pub(crate) fn call_with_helper(&'static self, lock: &str, suffix: &str) -> Call {
        let mut call = self.begin(2, 2 * lock.len() + suffix.len());
        call.cmd.arg(lock);
        let mut helper = call.cmd.writer_for_next_arg();
        // Written into the request's own buffer (a `Vec`): it cannot fail.
        let _ = helper
            .write_all(lock.as_bytes())
            .and_then(|()| helper.write_all(suffix.as_bytes()));
        drop(helper);
        call
    }

    /// `EVALSHA <hash> <keys>`, with room for `keys` keys of `size` bytes in all and the
    /// arguments after them.
    fn begin(&'static self, keys: usize, size: usize) -> Call {
        let mut cmd = Cmd::with_capacity(keys + 9, size + 160);
        cmd.arg("EVALSHA").arg(&self.hash).arg(keys);
        Call { lua: self, cmd }
    }
}

/// One call: `EVALSHA`, its keys and its arguments.
#[derive(Debug)]
pub(crate) struct Call {
    lua: &'static Lua,
    cmd: Cmd,
}

impl Call {
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// The same call by source (`EVAL`), for a node that has not cached the script.
    fn by_source(&self) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(self.lua.source);
        for arg in self.cmd.args_iter().skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        cmd
    }

    /// The first key (where a keyed command is routed on a Cluster).
    fn first_key(&self) -> &[u8] {
        match self.cmd.args_iter().nth(3) {
            Some(redis::Arg::Simple(key)) => key,
            _ => &[],
        }
    }

    /// Runs the script on the node owning its first key.
    pub(crate) async fn invoke<T: FromRedisValue>(&self, conn: &mut Conn) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if unknown_script(&e) => self.by_source().query_async(conn).await,
            answer => answer,
        }
    }

    /// [`invoke`](Self::invoke), then `WAIT replicas timeout` on the same node in the same
    /// round trip: the answer and how many replicas acknowledged the script's writes.
    pub(crate) async fn invoke_then_wait<T: FromRedisValue>(
        &self,
        conn: &mut Conn,
        replicas: usize,
        timeout: Duration,
    ) -> RedisResult<(T, usize)> {
        let key = self.first_key();
        match conn.then_wait(self.cmd.clone(), key, replicas, timeout).await {
            Err(e) if unknown_script(&e) => conn.then_wait(self.by_source(), key, replicas, timeout).await,
            answer => answer,
        }
    }
}

fn unknown_script(e: &redis::RedisError) -> bool {
    e.code() == Some("NOSCRIPT")
}
