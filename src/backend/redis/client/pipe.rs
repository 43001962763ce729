//! A pipeline for either kind of connection: a plain pipeline to one
//! server, or a cluster pipeline that the client splits by node (and
//! re-routes on MOVED/ASK).

use super::conn::Conn;
use redis::cluster::ClusterPipeline;
use redis::{Cmd, FromRedisValue, Pipeline, RedisResult};

pub(in crate::backend::redis) enum Pipe {
    Single(Pipeline),
    Cluster(ClusterPipeline),
}

impl Pipe {
    pub(in crate::backend::redis) fn new(conn: &Conn) -> Pipe {
        match conn {
            Conn::Direct(_) | Conn::Single(_) => Pipe::Single(redis::pipe()),
            Conn::Cluster(_) => Pipe::Cluster(redis::cluster::cluster_pipe()),
        }
    }

    pub(in crate::backend::redis) fn add(&mut self, cmd: Cmd) {
        match self {
            Pipe::Single(p) => {
                p.add_command(cmd);
            }
            Pipe::Cluster(p) => {
                p.add_command(cmd);
            }
        }
    }

    pub(in crate::backend::redis) fn query<T: FromRedisValue>(
        &self,
        conn: &mut Conn,
    ) -> RedisResult<T> {
        match (self, conn) {
            (Pipe::Single(p), Conn::Direct(c)) => p.query(c),
            (Pipe::Single(p), Conn::Single(c)) => p.query(c),
            (Pipe::Cluster(p), Conn::Cluster(c)) => p.query(c),
            _ => unreachable!("a pipeline is made for its connection"),
        }
    }
}
