//! The server the Redis phases talk to: one given with `--url`, or a
//! `redis-server` the bench starts on a free loopback port in a scratch dir
//! and kills when the value is dropped (also when a phase fails or panics),
//! by the launcher the tests use (`kvtier-redis-harness`).

use kvtier_redis_harness::RedisServer;
use std::path::Path;
use std::time::{Duration, Instant};

pub struct Server {
    pub url: String,
    pub host: String,
    pub port: u16,
    /// `redis_version` from INFO server.
    pub version: String,
    /// Present when the bench started the server.
    launched: Option<RedisServer>,
}

/// A program on PATH, if any (`redis-server`, `redis-benchmark`).
pub use kvtier_redis_harness::on_path as find_on_path;

/// Host and port of a `redis://host:port[/db]` URL (for redis-benchmark).
fn host_port(url: &str) -> Result<(String, u16), String> {
    let rest = url
        .split_once("://")
        .map(|(_, r)| r)
        .ok_or_else(|| format!("--url {url:?}: expected redis://host:port"))?;
    let authority = rest.split('/').next().unwrap_or("");
    let hostport = authority.rsplit('@').next().unwrap_or("");
    match hostport.rsplit_once(':') {
        Some((h, p)) => Ok((
            h.to_string(),
            p.parse()
                .map_err(|_| format!("--url: bad port in {hostport:?}"))?,
        )),
        None => Ok((hostport.to_string(), 6379)),
    }
}

impl Server {
    /// The server at `url`, or a new local one.
    pub fn open(url: Option<&str>) -> Result<Server, String> {
        match url {
            Some(url) => {
                let (host, port) = host_port(url)?;
                let mut s = Server {
                    url: url.to_string(),
                    host,
                    port,
                    version: String::new(),
                    launched: None,
                };
                s.version = s.wait_ready(Duration::from_secs(3))?;
                Ok(s)
            }
            None => Server::start(),
        }
    }

    fn start() -> Result<Server, String> {
        let launched = RedisServer::try_start().map_err(|why| format!("{why} (or pass --url)"))?;
        if let Some(pid) = launched.pid() {
            crate::contention::count_as_own(pid);
        }
        let mut s = Server {
            url: launched.url(),
            host: "127.0.0.1".into(),
            port: launched.port(),
            version: String::new(),
            launched: Some(launched),
        };
        s.version = s.wait_ready(Duration::from_secs(3))?;
        Ok(s)
    }

    /// Waits until the server answers PING; returns its version.
    fn wait_ready(&self, limit: Duration) -> Result<String, String> {
        let start = Instant::now();
        loop {
            match self.info_version() {
                Ok(v) => return Ok(v),
                Err(e) if start.elapsed() > limit => {
                    return Err(format!("{}: no answer: {e}", self.shown()))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn info_version(&self) -> Result<String, String> {
        let mut c = self.connect()?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut c)
            .map_err(|e| e.to_string())?;
        Ok(info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("unknown")
            .trim()
            .to_string())
    }

    pub fn connect(&self) -> Result<redis::Connection, String> {
        let client = redis::Client::open(self.url.as_str()).map_err(|e| e.to_string())?;
        client
            .get_connection_with_timeout(Duration::from_secs(5))
            .map_err(|e| format!("{}: {e}", self.shown()))
    }

    /// The URL without any password.
    pub fn shown(&self) -> String {
        format!("redis://{}:{}", self.host, self.port)
    }

    pub fn started_here(&self) -> Option<&Path> {
        self.launched.as_ref().map(RedisServer::dir)
    }

    /// Makes the server's allocator return the memory it holds free to the
    /// kernel (`MEMORY PURGE`; jemalloc only, and only on a server started
    /// here), so that the next writes fault fresh memory in, as a first fill
    /// does. Without it, memory freed by the previous pass's deletes is
    /// reused for as long as jemalloc keeps it (its decay, about 10 s): a
    /// fresh-keys bound that ran on reused memory (3 faults per 64 KiB SET
    /// against 19 when fresh) was twice as fast as one that did not.
    pub fn release_free_memory(&self) -> Result<(), String> {
        if self.started_here().is_none() {
            return Ok(());
        }
        let mut c = self.connect()?;
        redis::cmd("MEMORY")
            .arg("PURGE")
            .query::<()>(&mut c)
            .map_err(|e| format!("MEMORY PURGE: {e}"))
    }

    /// Bytes the server uses (INFO memory), 0 if unknown.
    pub fn used_memory(&self) -> u64 {
        let Ok(mut c) = self.connect() else { return 0 };
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query(&mut c)
            .unwrap_or_default();
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// `process_id` from INFO server, if the server answers.
    pub fn pid(&self) -> Option<u32> {
        let mut c = self.connect().ok()?;
        let info: String = redis::cmd("INFO").arg("server").query(&mut c).ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Minor page faults of the server process so far (/proc/<pid>/stat),
    /// when it runs on this machine (a server given with --url may not).
    pub fn minor_faults(&self, pid: Option<u32>) -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
        // The fields after the command's closing parenthesis: state is the
        // first, minflt the eighth (field 10 of proc(5)).
        let (_, rest) = stat.rsplit_once(')')?;
        rest.split_whitespace().nth(7)?.parse().ok()
    }

    /// Keys in the server's current database.
    pub fn dbsize(&self) -> Result<u64, String> {
        let mut c = self.connect()?;
        redis::cmd("DBSIZE")
            .query(&mut c)
            .map_err(|e| format!("DBSIZE: {e}"))
    }

    /// Deletes every key starting with `prefix` (SCAN + DEL), so a server
    /// given with --url is left as it was found.
    pub fn delete_prefix(&self, prefix: &str) -> Result<u64, String> {
        let mut c = self.connect()?;
        let mut deleted = 0u64;
        let pattern = format!("{prefix}*");
        let mut cursor: u64 = 0;
        loop {
            let (next, names): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query(&mut c)
                .map_err(|e| format!("SCAN: {e}"))?;
            if !names.is_empty() {
                let n: u64 = redis::cmd("DEL")
                    .arg(&names)
                    .query(&mut c)
                    .map_err(|e| format!("DEL: {e}"))?;
                deleted += n;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn urls_give_host_and_port() {
        assert_eq!(
            host_port("redis://127.0.0.1:7000").unwrap(),
            ("127.0.0.1".into(), 7000)
        );
        assert_eq!(
            host_port("redis://:pw@127.0.0.1:7001/0").unwrap(),
            ("127.0.0.1".into(), 7001)
        );
        assert_eq!(host_port("redis://h").unwrap(), ("h".into(), 6379));
        assert!(host_port("127.0.0.1:1").is_err());
    }
}
