//! The client crate's bound: the `redis` crate alone (a well-known client;
//! the library speaks through its own), no kvtier in between, sending the SET and GET
//! pipelines kvtier sends: values of the same size (kvtier's header, 56 +
//! key bytes, then the block), jobs of the same number of blocks, as many
//! connections as kvtier has jobs in flight. Loads copy each reply's payload
//! into a primary row, as any user of the crate must; nothing is checksummed.

use super::server::Server;
use crate::data::KEY_LEN;
use crate::jobs::Kind;
use crate::primary::Primary;
use redis::{Connection, RedisWrite, ToRedisArgs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Instant;

/// kvtier's value header for a KEY_LEN-byte key (see src/backend/redis/format.rs).
pub const HEADER: usize = 56 + KEY_LEN;

/// A value as kvtier writes it: the header's bytes, then the block, written
/// straight into the command buffer (as kvtier does; no intermediate copy).
pub struct Value<'a>(pub &'a [u8]);

impl ToRedisArgs for Value<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        use std::io::Write;
        let mut arg = out.writer_for_next_arg();
        arg.write_all(&[0x5a; HEADER]).expect("writing into memory");
        arg.write_all(self.0).expect("writing into memory");
    }
}

/// The key names of a pass (built before the clock starts).
pub fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}:{i}")).collect()
}

/// Copies a GET reply's payload into `dst`, checking its size.
fn take_reply(name: &str, reply: Option<Vec<u8>>, dst: &mut [u8]) -> Result<(), String> {
    match reply {
        Some(v) if v.len() == HEADER + dst.len() => {
            dst.copy_from_slice(&v[HEADER..]);
            Ok(())
        }
        Some(v) => Err(format!(
            "client bound: {name}: {} bytes, expected {}",
            v.len(),
            HEADER + dst.len()
        )),
        None => Err(format!("client bound: {name}: not on the server")),
    }
}

/// One bulk pass over `names` (key `i` with source row `i % rows`, or loaded
/// into the thread's own destination rows): `connections` threads, each with
/// its own connection, take the next job of `job_blocks` keys and send it as
/// one pipeline. Returns the seconds from the first thread's start to the
/// last one's end (each thread takes its own timestamps, as the other
/// backends' bounds do).
pub fn pass(
    server: &Server,
    primary: &Primary,
    kind: Kind,
    names: &[String],
    job_blocks: usize,
    connections: usize,
) -> Result<f64, String> {
    let n = names.len();
    let jobs = n.div_ceil(job_blocks);
    let threads = connections.clamp(1, jobs.max(1));
    assert!(
        threads * job_blocks <= primary.rows,
        "each client thread needs its own destination rows"
    );
    let mut conns = (0..threads)
        .map(|_| server.connect())
        .collect::<Result<Vec<Connection>, String>>()?;
    let ready = Barrier::new(threads);
    let next = AtomicUsize::new(0);
    let (ready, next) = (&ready, &next);
    let spans = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .iter_mut()
            .enumerate()
            .map(|(t, conn)| {
                s.spawn(move || -> Result<(Instant, Instant), String> {
                    ready.wait();
                    let start = Instant::now();
                    loop {
                        let job = next.fetch_add(1, Ordering::Relaxed);
                        if job >= jobs {
                            return Ok((start, Instant::now()));
                        }
                        let keys = job * job_blocks..((job + 1) * job_blocks).min(n);
                        let mut pipe = redis::pipe();
                        match kind {
                            Kind::Store => {
                                for i in keys {
                                    pipe.cmd("SET")
                                        .arg(&names[i])
                                        .arg(Value(primary.row(i % primary.rows)));
                                }
                                pipe.query::<()>(conn)
                                    .map_err(|e| format!("client bound: SET pipeline: {e}"))?;
                            }
                            Kind::Load => {
                                for i in keys.clone() {
                                    pipe.cmd("GET").arg(&names[i]);
                                }
                                let replies: Vec<Option<Vec<u8>>> = pipe
                                    .query(conn)
                                    .map_err(|e| format!("client bound: GET pipeline: {e}"))?;
                                if replies.len() != keys.len() {
                                    return Err("client bound: short GET pipeline reply".into());
                                }
                                for (j, (i, reply)) in keys.zip(replies).enumerate() {
                                    let dst = primary.row(primary.rows + t * job_blocks + j);
                                    take_reply(&names[i], reply, dst)?;
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client bound thread panicked"))
            .collect::<Result<Vec<_>, String>>()
    })?;
    let first = spans.iter().map(|s| s.0).min().expect("one thread");
    let last = spans.iter().map(|s| s.1).max().expect("one thread");
    Ok((last - first).as_secs_f64())
}

/// One SET of `block` under `name`, on its own (a 4 KiB round trip).
pub fn set_one(conn: &mut Connection, name: &str, block: &[u8]) -> Result<(), String> {
    redis::cmd("SET")
        .arg(name)
        .arg(Value(block))
        .query::<()>(conn)
        .map_err(|e| format!("client bound: SET: {e}"))
}

/// One GET of `name`, its payload copied into `dst`.
pub fn get_one(conn: &mut Connection, name: &str, dst: &mut [u8]) -> Result<(), String> {
    let reply: Option<Vec<u8>> = redis::cmd("GET")
        .arg(name)
        .query(conn)
        .map_err(|e| format!("client bound: GET: {e}"))?;
    take_reply(name, reply, dst)
}
