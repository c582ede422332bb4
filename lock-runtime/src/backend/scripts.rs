//! The four Lua scripts of the protocol, and how they are sent: by hash (`EVALSHA`), and on
//! `NOSCRIPT` (a restarted server, a new primary after a failover, a node added to a cluster)
//! once more with their source (`EVAL`), to the same node as any keyed command. redis-rs's own
//! `Script` would answer `NOSCRIPT` with `SCRIPT LOAD`, which a cluster sends to every node: one
//! unreachable node would then fail an acquire that does not concern it.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, FromRedisValue, RedisResult, ToRedisArgs};

use super::connection::Conn;

pub(crate) static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../scripts/acquire.lua")));
pub(crate) static RENEW: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../scripts/renew.lua")));
pub(crate) static SHARE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../scripts/share.lua")));
pub(crate) static RELEASE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../scripts/release.lua")));

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

    /// A call of this script, to fill with keys and arguments.
    pub(crate) fn call(&'static self) -> Call {
        Call {
            lua: self,
            keys: Vec::with_capacity(5),
            args: Vec::with_capacity(5),
        }
    }
}

/// One call: its keys and arguments.
#[derive(Debug)]
pub(crate) struct Call {
    lua: &'static Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Call {
    pub(crate) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    /// How many keys the call names so far.
    pub(crate) fn key_count(&self) -> usize {
        self.keys.len()
    }

    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// `EVALSHA` (by hash) or `EVAL` (with the source).
    fn cmd(&self, by_hash: bool) -> Cmd {
        let mut cmd = if by_hash {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&self.lua.hash);
            cmd
        } else {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(self.lua.source);
            cmd
        };
        cmd.arg(self.keys.len()).arg(&self.keys).arg(&self.args);
        cmd
    }

    /// Runs the script on the node owning its first key.
    pub(crate) async fn invoke<T: FromRedisValue>(&self, conn: &mut Conn) -> RedisResult<T> {
        match self.cmd(true).query_async(conn).await {
            Err(e) if unknown_script(&e) => self.cmd(false).query_async(conn).await,
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
        let key = self.keys.first().map_or(&[][..], Vec::as_slice);
        match conn.then_wait(self.cmd(true), key, replicas, timeout).await {
            Err(e) if unknown_script(&e) => conn.then_wait(self.cmd(false), key, replicas, timeout).await,
            answer => answer,
        }
    }
}

fn unknown_script(e: &redis::RedisError) -> bool {
    e.code() == Some("NOSCRIPT")
}
