//! [`Conn`]: an open connection to one Redis server or to a Redis Cluster, usable wherever
//! redis-rs takes a connection (`query_async`, scripts). Shared with `lockctl` (included there
//! by path), so that the library and the tool send their commands through one type.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, RedisFuture, Value};

/// An open connection: to one server (or the primary the sentinels named), or to a Cluster.
#[derive(Clone)]
// Cloned for every request: boxing the larger variant would allocate each time.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Conn {
    Server(MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Server(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Server(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
