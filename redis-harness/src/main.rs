//! `kvtier-redis-harness [--cluster MASTERS]`: the harness's server (or a
//! cluster of MASTERS masters, no replicas) for tests outside Rust (the
//! Python tests' fixtures). Prints its URL (a cluster's: every node, comma
//! separated) on one line once it is ready, then holds it until stdin
//! closes, and kills it. Exits 2 on bad arguments, 1 if no server starts
//! (no redis-server on PATH, say: its reason on stderr).

use kvtier_redis_harness::{RedisCluster, RedisServer};
use std::io::{Read, Write};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let masters = match args.as_slice() {
        [] => None,
        [flag, n] if flag == "--cluster" => match n.parse::<usize>() {
            Ok(n) if n > 0 => Some(n),
            _ => usage(&format!("--cluster {n:?}: a number of masters, at least 1")),
        },
        _ => usage(&format!("unexpected arguments {args:?}")),
    };
    // Kept alive until stdin closes; dropped (killed) after.
    let (url, _server, _cluster) = match masters {
        None => match RedisServer::try_start() {
            Ok(server) => (server.url(), Some(server), None),
            Err(why) => fail(&why),
        },
        Some(n) => match RedisCluster::start(n, 0) {
            Some(cluster) => (cluster.url(), None, Some(cluster)),
            None => fail("no redis-server or redis-cli on PATH"),
        },
    };
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{url}").and_then(|()| out.flush()).is_err() {
        return;
    }
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
}

fn usage(why: &str) -> ! {
    eprintln!("kvtier-redis-harness: {why}\nusage: kvtier-redis-harness [--cluster MASTERS]");
    std::process::exit(2)
}

fn fail(why: &str) -> ! {
    eprintln!("kvtier-redis-harness: {why}");
    std::process::exit(1)
}
