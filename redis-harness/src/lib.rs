//! Real Redis (or Valkey) servers for kvtier's tests, its benchmark and the
//! Python tests (through the `kvtier-redis-harness` command): a standalone
//! server (`RedisServer`) or a small cluster (`RedisCluster`). Every server
//! binds 127.0.0.1 only, on a free port, keeps no data on disk (`--save ""`,
//! `--appendonly no`), lives in a scratch directory of its own and is killed
//! (SIGKILL) and removed on drop, also when the caller panics. Servers are
//! spawned from one long-lived thread with PR_SET_PDEATHSIG, so even a
//! process that dies without unwinding (abort, SIGKILL, a CTest timeout)
//! takes its servers with it.
//!
//! Skip or require: without `redis-server` and `redis-cli` on PATH, `start`
//! prints why and returns None (a test then returns early); with
//! `KVTIER_REQUIRE_REDIS=1` or `CI=true` a missing server is a panic instead.
//! `try_start` says why instead, for callers that report it themselves.
//!
//! - this file: the programs, ports, spawning, raw commands, skipping;
//! - `server`: one server (`RedisServer`);
//! - `certs`: TLS certificates made with openssl (`TestCerts`);
//! - `cluster`: clusters (`RedisCluster`) and the shared server and cluster.

mod certs;
mod cluster;
mod server;

pub use certs::TestCerts;
pub use cluster::{key_slot, shared_cluster, shared_server, ClusterNode, RedisCluster, Role};
pub use server::RedisServer;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

/// What a test prints (to the real stderr) when it cannot run here: CTest's
/// SKIP_REGULAR_EXPRESSION matches it, so the test counts as skipped.
pub const SKIP_MARKER: &str = "KVTIER-SKIP:";

/// Whether this is a CI run (`CI=true`), where no test may skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.trim() == "true")
}

/// Says why the calling test cannot run here, before it returns early; a
/// panic instead under `CI=true`, so CI never passes a test that did not run.
pub fn skip(why: &str) {
    assert!(
        !in_ci(),
        "cannot run under CI=true, where nothing may skip: {why}"
    );
    let test = std::thread::current().name().unwrap_or("?").to_string();
    // Not eprintln!: libtest captures that and shows it only on failure.
    let _ = writeln!(std::io::stderr(), "{SKIP_MARKER} {test}: {why}");
}

/// A fresh, empty directory under the system temp dir, unique per call.
pub fn scratch_dir() -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("kvtier-test-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Set to 1 to make a missing `redis-server` a failure instead of a skip.
pub const REQUIRE_VAR: &str = "KVTIER_REQUIRE_REDIS";

/// How long a server may take to answer PING after it is spawned.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a new cluster may take to report `cluster_state:ok` everywhere.
pub(crate) const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// Fresh ports tried when the one picked was taken in the meantime.
pub(crate) const PORT_ATTEMPTS: usize = 10;
/// Options the harness sets itself; a test may not override them.
pub(crate) const OWNED: &[&str] = &[
    "bind",
    "port",
    "dir",
    "daemonize",
    "protected-mode",
    "logfile",
    "cluster-enabled",
    "cluster-config-file",
    "cluster-port",
];

/// The two programs, found on PATH.
pub(crate) struct Tools {
    server: PathBuf,
    cli: PathBuf,
}

pub(crate) fn tools() -> Result<&'static Tools, &'static str> {
    static TOOLS: OnceLock<Result<Tools, String>> = OnceLock::new();
    let found = TOOLS.get_or_init(|| match (on_path("redis-server"), on_path("redis-cli")) {
        (Some(server), Some(cli)) => Ok(Tools { server, cli }),
        (None, Some(_)) => Err("redis-server is not on PATH".into()),
        (Some(_), None) => Err("redis-cli is not on PATH".into()),
        (None, None) => Err("redis-server and redis-cli are not on PATH".into()),
    });
    found.as_ref().map_err(|e| e.as_str())
}

/// A program on PATH, if any.
pub fn on_path(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Whether a missing server is a failure: `KVTIER_REQUIRE_REDIS=1`, or a CI
/// run (`CI=true`).
pub fn redis_required() -> bool {
    std::env::var(REQUIRE_VAR).is_ok_and(|v| v.trim() == "1") || in_ci()
}

/// True when Redis tests can run. Otherwise prints why (to the real stderr,
/// so the skip shows even though libtest captures test output) and returns
/// false, or panics when `KVTIER_REQUIRE_REDIS=1` or `CI=true`.
pub fn redis_available() -> bool {
    match tools() {
        Ok(_) => true,
        Err(why) if redis_required() => {
            panic!("redis-server is required ({REQUIRE_VAR}=1 or CI=true) but not found: {why}")
        }
        Err(why) => {
            skip(&format!(
                "{why} (install redis-server; {REQUIRE_VAR}=1 makes this a failure)"
            ));
            false
        }
    }
}

/// Spawns `cmd` in a process group of its own, asking the kernel to SIGKILL it
/// when the thread that forked it ends. That thread is a spawner that lives as
/// long as the test process (a test's own thread ends with the test, which
/// would kill a server another test still uses).
pub(crate) fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();
    let parent = std::process::id() as libc::pid_t;
    // Only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            #[cfg(target_os = "linux")]
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The test process died before the prctl: no signal will come.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("redis-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawner thread");
        tx
    });
    let (reply, result) = mpsc::channel();
    spawner.send((cmd, reply)).expect("spawner alive");
    result.recv().expect("spawner answers")
}

/// Ports the kernel just handed out on 127.0.0.1, all different. They are
/// free when this returns; another process may still take one before the
/// server binds it, which `start` notices and retries.
pub(crate) fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// Sends `command` (RESP) over a new raw connection; the first line of the
/// reply, if any.
pub(crate) fn raw_first_line(port: u16, command: &[u8]) -> Option<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(command).ok()?;
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => reply.push(byte[0]),
            _ => return None,
        }
    }
    reply.truncate(reply.len() - 2);
    Some(String::from_utf8_lossy(&reply).into_owned())
}

/// Sends PING over a raw connection; the first line of the reply, if any
/// (`+PONG`, or `-NOAUTH ...` on a server that wants a password).
pub fn raw_ping(port: u16) -> Option<String> {
    raw_first_line(port, b"*1\r\n$4\r\nPING\r\n")
}

/// DBSIZE over a raw connection (no process started per call, so it can be
/// sampled while jobs stream); None if the server does not answer with a
/// count.
pub fn raw_dbsize(port: u16) -> Option<usize> {
    raw_first_line(port, b"*1\r\n$6\r\nDBSIZE\r\n")?
        .strip_prefix(':')?
        .parse()
        .ok()
}

/// A connection in MONITOR mode: the server sends it every command it runs
/// from then on, one line each: `+<time> [<db> <client address>] "SET"
/// "<name>" "<value, escaped>" ...`.
pub struct Monitor {
    lines: std::io::BufReader<TcpStream>,
}

impl Monitor {
    /// Starts monitoring the (password-less) server on `port`.
    pub fn start(port: u16) -> Monitor {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let mut stream =
            TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect to MONITOR");
        stream
            .write_all(b"*1\r\n$7\r\nMONITOR\r\n")
            .expect("send MONITOR");
        let mut monitor = Monitor {
            lines: std::io::BufReader::new(stream),
        };
        let ok = monitor.line(Duration::from_secs(5));
        assert_eq!(ok.as_deref(), Some("+OK"), "MONITOR answered {ok:?}");
        monitor
    }

    pub(crate) fn line(&mut self, timeout: Duration) -> Option<String> {
        use std::io::BufRead;
        self.lines.get_mut().set_read_timeout(Some(timeout)).ok()?;
        let mut line = String::new();
        match self.lines.read_line(&mut line) {
            Ok(n) if n > 0 => Some(line.trim_end().to_string()),
            _ => None,
        }
    }

    /// The client address of each of the next `n` `command`s (case
    /// insensitive) whose first argument starts with `prefix`, in the order
    /// the server ran them; panics if they do not all come within `timeout`.
    pub fn clients_of(
        &mut self,
        command: &str,
        prefix: &str,
        n: usize,
        timeout: Duration,
    ) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut clients = Vec::new();
        let (quoted_command, quoted_prefix) = (format!("\"{command}\""), format!("\"{prefix}"));
        while clients.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "saw {} of {n} {command}s of {prefix}*",
                clients.len()
            );
            let Some(line) = self.line(left) else {
                continue;
            };
            // `[<db> <address>] "<command>" "<first argument>" ...`
            let Some((client, rest)) = line.split_once(" [").and_then(|(_, r)| r.split_once("] "))
            else {
                continue;
            };
            if let Some((c, args)) = rest.split_once(' ') {
                if c.eq_ignore_ascii_case(&quoted_command) && args.starts_with(&quoted_prefix) {
                    let address = client.split_once(' ').map_or(client, |(_, a)| a);
                    clients.push(address.to_string());
                }
            }
        }
        clients
    }
}

/// `--key value...` arguments: a value is split on whitespace into separate
/// arguments, as on a config file line (`("user", "kv on >pw ~* +@all")`);
/// an empty value is one empty argument (`("save", "")`).
pub(crate) fn config_args(config: &[(&str, &str)]) -> Vec<String> {
    let mut args = Vec::new();
    for &(key, value) in config {
        let key = key.trim_start_matches("--");
        assert!(
            !OWNED.contains(&key),
            "the Redis harness sets `{key}` itself (loopback only, scratch directory)"
        );
        args.push(format!("--{key}"));
        let words: Vec<&str> = value.split_whitespace().collect();
        if words.is_empty() {
            args.push(String::new());
        } else {
            args.extend(words.into_iter().map(String::from));
        }
    }
    args
}

pub(crate) fn password_of(config: &[(&str, &str)]) -> Option<String> {
    config
        .iter()
        .rev()
        .find(|(k, _)| k.trim_start_matches("--") == "requirepass")
        .map(|(_, v)| v.to_string())
        .filter(|v| !v.is_empty())
}

/// Polls `done` every 20 ms until it holds (true) or `timeout` passes (false).
pub fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
