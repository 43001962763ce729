//! Real Redis (or Valkey) servers for tests: a standalone server
//! (`RedisServer`) or a small cluster (`RedisCluster`). Every server binds
//! 127.0.0.1 only, on a free port, keeps no data on disk (`--save ""`,
//! `--appendonly no`), lives in a scratch directory of its own and is killed
//! (SIGKILL) and removed on drop, also when the test panics. Servers are
//! spawned from one long-lived thread with PR_SET_PDEATHSIG, so even a test
//! process that dies without unwinding (abort, SIGKILL, a CTest timeout) takes
//! its servers with it.
//!
//! Skip or require: without `redis-server` and `redis-cli` on PATH, `start`
//! prints why and returns None, and the test returns early
//! (`let server = redis_or_skip!(RedisServer::start());`). With
//! `KVTIER_REQUIRE_REDIS=1` or `CI=true` a missing server is a panic instead.

#![allow(dead_code)]

use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

/// Set to 1 to make a missing `redis-server` a failure instead of a skip.
pub const REQUIRE_VAR: &str = "KVTIER_REQUIRE_REDIS";

/// How long a server may take to answer PING after it is spawned.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a new cluster may take to report `cluster_state:ok` everywhere.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// Fresh ports tried when the one picked was taken in the meantime.
const PORT_ATTEMPTS: usize = 10;
/// Options the harness sets itself; a test may not override them.
const OWNED: &[&str] = &[
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

/// Evaluates to the server or cluster `$start` gives (`RedisServer::start()`
/// when omitted), or returns from the test when Redis is not installed (the
/// reason is already printed). Panics instead when `KVTIER_REQUIRE_REDIS=1`
/// or `CI=true`.
#[macro_export]
macro_rules! redis_or_skip {
    () => {
        $crate::redis_or_skip!($crate::common::redis::RedisServer::start())
    };
    ($start:expr) => {
        match $start {
            Some(started) => started,
            None => return,
        }
    };
}

/// The two programs, found on PATH.
struct Tools {
    server: PathBuf,
    cli: PathBuf,
}

fn tools() -> Result<&'static Tools, &'static str> {
    static TOOLS: OnceLock<Result<Tools, String>> = OnceLock::new();
    let found = TOOLS.get_or_init(|| match (on_path("redis-server"), on_path("redis-cli")) {
        (Some(server), Some(cli)) => Ok(Tools { server, cli }),
        (None, Some(_)) => Err("redis-server is not on PATH".into()),
        (Some(_), None) => Err("redis-cli is not on PATH".into()),
        (None, None) => Err("redis-server and redis-cli are not on PATH".into()),
    });
    found.as_ref().map_err(|e| e.as_str())
}

fn on_path(program: &str) -> Option<PathBuf> {
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
    std::env::var(REQUIRE_VAR).is_ok_and(|v| v.trim() == "1") || super::in_ci()
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
            super::skip(&format!(
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
fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
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
fn free_ports(n: usize) -> Vec<u16> {
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
fn raw_first_line(port: u16, command: &[u8]) -> Option<String> {
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

    fn line(&mut self, timeout: Duration) -> Option<String> {
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
fn config_args(config: &[(&str, &str)]) -> Vec<String> {
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

fn password_of(config: &[(&str, &str)]) -> Option<String> {
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

/// Why a launch failed.
enum LaunchError {
    /// Another process bound one of the ports first.
    PortTaken,
    Failed(String),
}

/// One `redis-server` process bound to 127.0.0.1:`port()`.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    /// The cluster bus port of a cluster node.
    bus_port: Option<u16>,
    /// The TLS port of a server started with `start_tls`, or of a TLS-only
    /// cluster node (where it is `port` too).
    tls_port: Option<u16>,
    /// A TLS-only server (`--port 0`: no plain port): the CA its clients
    /// trust, for the harness's own redis-cli (readiness, `cli`).
    tls_ca: Option<PathBuf>,
    dir: PathBuf,
    /// The test's `--key value` arguments.
    extra: Vec<String>,
    password: Option<String>,
}

impl RedisServer {
    /// A server with the default settings, or None (after printing why) when
    /// Redis is not installed.
    pub fn start() -> Option<RedisServer> {
        Self::start_with(&[])
    }

    /// A server with extra settings, each passed as `--key value`:
    /// `&[("requirepass", "pw")]`, `&[("maxmemory", "8mb"), ("maxmemory-policy",
    /// "allkeys-lru")]`, `&[("user", "kv on >pw ~* +@all"), ("user", "default off")]`.
    /// A value is split on whitespace into separate arguments. `bind`, `port`,
    /// `dir` and the like belong to the harness (asserted).
    pub fn start_with(config: &[(&str, &str)]) -> Option<RedisServer> {
        if !redis_available() {
            return None;
        }
        Some(Self::launch(config, false, false, None))
    }

    /// A server that also speaks TLS, on `tls_port()` (`tls_url()`), with
    /// `certs` (no client certificate asked for). The plain port stays, for
    /// the harness's readiness check and `cli`.
    pub fn start_tls(certs: &TestCerts) -> Option<RedisServer> {
        if !redis_available() {
            return None;
        }
        let settings = certs.server_settings();
        let config: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Some(Self::launch(&config, false, true, None))
    }

    /// The server of `launch` on `tls` with no plain port when `tls_ca` is
    /// given (`port` is then the TLS port; the harness's redis-cli speaks
    /// TLS, trusting `tls_ca`).
    fn launch(
        config: &[(&str, &str)],
        cluster: bool,
        tls: bool,
        tls_ca: Option<&Path>,
    ) -> RedisServer {
        assert!(tls || tls_ca.is_none(), "a TLS-only server speaks TLS");
        let dir = super::scratch_dir();
        fs::create_dir_all(&dir).expect("create the server's scratch directory");
        let mut server = RedisServer {
            child: None,
            port: 0,
            bus_port: None,
            tls_port: None,
            tls_ca: tls_ca.map(Path::to_path_buf),
            dir,
            extra: config_args(config),
            password: password_of(config),
        };
        let tls_only = server.tls_ca.is_some();
        for _ in 0..PORT_ATTEMPTS {
            let ports = free_ports(1 + cluster as usize + (tls && !tls_only) as usize);
            server.port = ports[0];
            server.bus_port = cluster.then(|| ports[1]);
            server.tls_port = tls.then(|| ports[ports.len() - 1]);
            if tls_only {
                server.tls_port = Some(server.port);
            }
            match server.spawn() {
                Ok(()) => return server,
                Err(LaunchError::PortTaken) => continue,
                Err(LaunchError::Failed(why)) => panic!("{why}"),
            }
        }
        panic!("redis-server: every port tried was taken ({PORT_ATTEMPTS} attempts)");
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    fn output_path(&self) -> PathBuf {
        self.dir.join("stdout-stderr.log")
    }

    fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "--save",
            "",
            "--appendonly",
            "no",
            "--bind",
            "127.0.0.1",
            "--port",
            // A TLS-only server's port is its --tls-port (below).
            &if self.tls_ca.is_some() { 0 } else { self.port }.to_string(),
            "--dir",
            &self.dir.to_string_lossy(),
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--logfile",
            &self.log_path().to_string_lossy(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(bus) = self.bus_port {
            for arg in [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
                "--cluster-port",
                &bus.to_string(),
            ] {
                args.push(arg.to_string());
            }
            if let Some(pw) = &self.password {
                // Replicas authenticate to their masters with the same password.
                args.extend(["--masterauth".to_string(), pw.clone()]);
            }
        }
        if let Some(tls) = self.tls_port {
            args.extend(["--tls-port".to_string(), tls.to_string()]);
        }
        // Last, so that the test's settings win (e.g. cluster-node-timeout).
        args.extend(self.extra.iter().cloned());
        args
    }

    /// Starts the process on `port` (and `bus_port`) and waits until it
    /// answers PING. The log must say it is ready first: a PING alone could
    /// reach another server that took the port.
    fn spawn(&mut self) -> Result<(), LaunchError> {
        let _ = fs::remove_file(self.log_path());
        let output = fs::File::create(self.output_path()).expect("create the server's output file");
        let mut cmd = Command::new(&tools().expect("checked by start").server);
        cmd.args(self.args())
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(output.try_clone().expect("dup"))
            .stderr(output);
        let mut child = spawn_tied(cmd)
            .map_err(|e| LaunchError::Failed(format!("cannot run redis-server: {e}")))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = self.log();
                return Err(if log.contains("Address already in use") {
                    LaunchError::PortTaken
                } else {
                    LaunchError::Failed(format!(
                        "redis-server exited ({status}) before answering PING; its output:\n{log}"
                    ))
                });
            }
            if self.log().contains("Ready to accept connections") && self.answers_ping() {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() >= deadline {
                kill_group(&mut child);
                return Err(LaunchError::Failed(format!(
                    "redis-server did not answer PING within {START_TIMEOUT:?}; its output:\n{}",
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether something answers PING on `port` (any reply: a server that
    /// wants a password answers NOAUTH), over TLS for a TLS-only server.
    fn answers_ping(&self) -> bool {
        match &self.tls_ca {
            None => raw_ping(self.port).is_some(),
            Some(ca) => {
                let out = cli_output(self.port, None, Some(ca), &["PING"]);
                out.status.success() && !stdout_of(&out).is_empty()
            }
        }
    }

    /// `redis://127.0.0.1:<port>`, or `rediss://` for a TLS-only server.
    pub fn url(&self) -> String {
        match self.tls_ca {
            Some(_) => self.tls_url(),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TLS port (servers from `start_tls` only).
    pub fn tls_port(&self) -> u16 {
        self.tls_port.expect("a server started with start_tls")
    }

    /// `rediss://127.0.0.1:<tls port>`.
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port())
    }

    /// The cluster bus port (cluster nodes only).
    pub fn bus_port(&self) -> Option<u16> {
        self.bus_port
    }

    /// The `requirepass` the server was started with.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The server's scratch directory (removed on drop).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the process is alive (a frozen one counts as alive).
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// What the server logged, and anything it printed before its log was open.
    pub fn log(&self) -> String {
        let early = fs::read_to_string(self.output_path()).unwrap_or_default();
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        format!("{early}{log}")
    }

    /// SIGKILL: the server vanishes mid-whatever, its connections reset.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&mut child);
        }
    }

    /// SIGSTOP: the server keeps its connections but answers nothing (a hung
    /// server, for timeout tests). `thaw` resumes it; drop kills it anyway.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT after `freeze`.
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = self.pid().expect("server running") as libc::pid_t;
        assert_eq!(
            unsafe { libc::kill(pid, signal) },
            0,
            "kill({pid}, {signal})"
        );
    }

    /// Kills the server (if running) and starts it again on the same port,
    /// empty: the scratch directory is emptied first. Panics if the port was
    /// taken in the meantime.
    pub fn restart(&mut self) {
        self.relaunch(&[]);
    }

    /// Restarts keeping the files named in `keep` (a cluster node's
    /// nodes.conf: it comes back with its identity and slots, without data).
    fn relaunch(&mut self, keep: &[&str]) {
        self.kill9();
        if let Ok(entries) = fs::read_dir(&self.dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                if !keep.iter().any(|k| name == *k) {
                    let _ =
                        fs::remove_file(entry.path()).or_else(|_| fs::remove_dir_all(entry.path()));
                }
            }
        }
        // The port was ours a moment ago; a clash is unlikely and usually brief.
        for _ in 0..PORT_ATTEMPTS {
            match self.spawn() {
                Ok(()) => return,
                Err(LaunchError::PortTaken) => std::thread::sleep(Duration::from_millis(200)),
                Err(LaunchError::Failed(why)) => panic!("{why}"),
            }
        }
        panic!("restart: port {} (or its bus port) stays taken", self.port);
    }

    /// Runs `redis-cli -h 127.0.0.1 -p <port> <args...>` and returns its
    /// stdout without the trailing newlines. Unauthenticated: see
    /// `cli_authed`. redis-cli prints error replies on stdout (`NOAUTH ...`)
    /// and a nil as an empty line.
    pub fn cli(&self, args: &[&str]) -> String {
        stdout_of(&cli_output(self.port, None, self.tls_ca.as_deref(), args))
    }

    /// `cli` with `-a <requirepass>` when the server has one.
    pub fn cli_authed(&self, args: &[&str]) -> String {
        stdout_of(&cli_output(
            self.port,
            self.password.as_deref(),
            self.tls_ca.as_deref(),
            args,
        ))
    }
}

/// Certificates for TLS servers on 127.0.0.1, made with openssl in a
/// scratch directory of their own (removed on drop): a CA (`ca`, what a
/// client must trust) and the server's certificate (`cert`, for IP
/// 127.0.0.1, signed by the CA) and key.
pub struct TestCerts {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCerts {
    /// A server's settings to speak TLS with these certificates, asking no
    /// client certificate.
    fn server_settings(&self) -> [(&'static str, String); 4] {
        let path = |p: &PathBuf| p.to_string_lossy().into_owned();
        [
            ("tls-cert-file", path(&self.cert)),
            ("tls-key-file", path(&self.key)),
            ("tls-ca-cert-file", path(&self.ca)),
            ("tls-auth-clients", "no".to_string()),
        ]
    }

    /// New certificates, or None (after printing why) without openssl; a
    /// panic instead when `KVTIER_REQUIRE_REDIS=1` or `CI=true`.
    pub fn make() -> Option<TestCerts> {
        let dir = super::scratch_dir();
        fs::create_dir_all(&dir).expect("create the certificates' directory");
        let certs = TestCerts {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            dir,
        };
        let ext = certs.dir.join("ext.cnf");
        fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        let (ca_key, csr) = (certs.dir.join("ca.key"), certs.dir.join("srv.csr"));
        let made = make_ca(&certs.ca, &ca_key, "kvtier test CA")
            && openssl(&[
                "req".as_ref(),
                "-newkey".as_ref(),
                "rsa:2048".as_ref(),
                "-nodes".as_ref(),
                "-subj".as_ref(),
                "/CN=127.0.0.1".as_ref(),
                "-keyout".as_ref(),
                certs.key.as_os_str(),
                "-out".as_ref(),
                csr.as_os_str(),
            ])
            && openssl(&[
                "x509".as_ref(),
                "-req".as_ref(),
                "-in".as_ref(),
                csr.as_os_str(),
                "-CA".as_ref(),
                certs.ca.as_os_str(),
                "-CAkey".as_ref(),
                ca_key.as_os_str(),
                "-CAcreateserial".as_ref(),
                "-days".as_ref(),
                "1".as_ref(),
                "-extfile".as_ref(),
                ext.as_os_str(),
                "-out".as_ref(),
                certs.cert.as_os_str(),
            ]);
        if made {
            return Some(certs);
        }
        assert!(!redis_required(), "openssl is needed to make certificates");
        super::skip("openssl could not make certificates");
        None
    }

    /// Another CA's certificate, which signed nothing the server shows.
    pub fn other_ca(&self) -> PathBuf {
        let (ca, key) = (self.dir.join("other-ca.pem"), self.dir.join("other-ca.key"));
        assert!(make_ca(&ca, &key, "another CA"), "openssl makes a CA");
        ca
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A self-signed CA certificate and its key.
fn make_ca(cert: &Path, key: &Path, name: &str) -> bool {
    openssl(&[
        "req".as_ref(),
        "-x509".as_ref(),
        "-newkey".as_ref(),
        "rsa:2048".as_ref(),
        "-nodes".as_ref(),
        "-days".as_ref(),
        "1".as_ref(),
        "-subj".as_ref(),
        format!("/CN={name}").as_ref(),
        "-keyout".as_ref(),
        key.as_os_str(),
        "-out".as_ref(),
        cert.as_os_str(),
    ])
}

fn openssl(args: &[&std::ffi::OsStr]) -> bool {
    Command::new("openssl")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success())
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill9();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// SIGKILL to the server's process group (the server and any child it forked
/// for replication), then reaps it. Only while the server is unreaped: its
/// pid, the group's id, cannot have been reused yet.
fn kill_group(child: &mut Child) {
    if matches!(child.try_wait(), Ok(None)) {
        unsafe {
            libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// `redis-cli` against 127.0.0.1:`port`, over TLS trusting `tls_ca` if given.
fn cli_output(port: u16, password: Option<&str>, tls_ca: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(&tools().expect("redis-cli on PATH").cli);
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(ca) = tls_ca {
        cmd.arg("--tls").arg("--cacert").arg(ca);
    }
    if let Some(pw) = password {
        cmd.args(["-a", pw, "--no-auth-warning"]);
    }
    let output = cmd
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli");
    assert!(
        output.status.code().is_some(),
        "redis-cli {args:?} was killed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout)
        .trim_end_matches(['\r', '\n'])
        .to_string()
}

/// A node's role in the cluster, as `CLUSTER NODES` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Master,
    Replica,
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug)]
pub struct ClusterNode {
    pub id: String,
    pub port: u16,
    pub role: Role,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    /// Flagged `fail` (agreed on by a majority of masters; `fail?` is not).
    pub failed: bool,
    /// Slot ranges served, inclusive.
    pub slots: Vec<(u16, u16)>,
}

fn parse_cluster_nodes(text: &str) -> Vec<ClusterNode> {
    let mut nodes = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            continue;
        }
        let port = fields[1]
            .split(['@', ','])
            .next()
            .and_then(|addr| addr.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        let flags: Vec<&str> = fields[2].split(',').collect();
        let role = if flags.contains(&"master") {
            Role::Master
        } else {
            Role::Replica
        };
        let slots = fields[8..]
            .iter()
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| {
                let (a, b) = s.split_once('-').unwrap_or((s, s));
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .collect();
        nodes.push(ClusterNode {
            id: fields[0].to_string(),
            port,
            role,
            master_id: (fields[3] != "-").then(|| fields[3].to_string()),
            failed: flags.contains(&"fail"),
            slots,
        });
    }
    nodes
}

/// The cluster slot of `key` (CRC16/XMODEM mod 16384, of the `{tag}` if the
/// key has a non-empty one), as `CLUSTER KEYSLOT` computes it.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&c| c == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&c| c == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

impl ClusterNode {
    /// Whether the node serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }

    /// The first of `<prefix>0`, `<prefix>1`, ... the node serves.
    pub fn key_with_prefix(&self, prefix: &str) -> String {
        assert!(!self.slots.is_empty(), "node {} serves no slot", self.port);
        (0u64..)
            .map(|i| format!("{prefix}{i}"))
            .find(|k| self.serves(key_slot(k.as_bytes())))
            .expect("some key lands on every slot range")
    }
}

/// A Redis cluster of `masters * (1 + replicas_per_master)` servers on
/// 127.0.0.1, created by `redis-cli --cluster create`, node timeout 2 s.
pub struct RedisCluster {
    servers: Vec<RedisServer>,
    password: Option<String>,
    /// A TLS-only cluster (`start_tls`): the CA its nodes' certificates
    /// chain to, for the harness's redis-cli.
    tls_ca: Option<PathBuf>,
}

impl RedisCluster {
    /// A cluster whose every node reports `cluster_state:ok`, or None (after
    /// printing why) when Redis is not installed. At least 3 masters. Three
    /// masters without replicas is the cheap default for tests.
    pub fn start(masters: usize, replicas_per_master: usize) -> Option<RedisCluster> {
        Self::start_with(masters, replicas_per_master, &[])
    }

    /// As `start`, each node with the extra settings of
    /// `RedisServer::start_with` (with `requirepass`, replicas get the same
    /// `masterauth` and the harness's own commands authenticate).
    pub fn start_with(
        masters: usize,
        replicas_per_master: usize,
        config: &[(&str, &str)],
    ) -> Option<RedisCluster> {
        if !redis_available() {
            return None;
        }
        Some(Self::form(masters, replicas_per_master, config, None))
    }

    /// As `start`, a cluster that speaks TLS only: every node has its TLS
    /// port and no plain one (`--port 0`; `port()`, `ports()` and `url()`,
    /// `rediss://...`, are the TLS ports), with `certs` (no client
    /// certificate asked for), the cluster bus and replication over TLS too
    /// (`tls-cluster yes`, so nodes announce their TLS ports;
    /// `tls-replication yes`). The harness's redis-cli speaks TLS.
    pub fn start_tls(
        masters: usize,
        replicas_per_master: usize,
        certs: &TestCerts,
    ) -> Option<RedisCluster> {
        if !redis_available() {
            return None;
        }
        let settings = certs.server_settings();
        let mut config: Vec<(&str, &str)> =
            settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        config.extend([("tls-cluster", "yes"), ("tls-replication", "yes")]);
        Some(Self::form(
            masters,
            replicas_per_master,
            &config,
            Some(&certs.ca),
        ))
    }

    /// Starts the nodes (TLS-only ones trusting `tls_ca` when given) and
    /// creates the cluster.
    fn form(
        masters: usize,
        replicas_per_master: usize,
        config: &[(&str, &str)],
        tls_ca: Option<&Path>,
    ) -> RedisCluster {
        assert!(masters >= 3, "a Redis cluster needs at least 3 masters");
        let count = masters * (1 + replicas_per_master);
        // Each node is dropped (killed) if a later step panics.
        let servers: Vec<RedisServer> = (0..count)
            .map(|_| RedisServer::launch(config, true, tls_ca.is_some(), tls_ca))
            .collect();
        let cluster = RedisCluster {
            servers,
            password: password_of(config),
            tls_ca: tls_ca.map(Path::to_path_buf),
        };
        let mut create: Vec<String> = vec!["--cluster".into(), "create".into()];
        create.extend(
            cluster
                .servers
                .iter()
                .map(|s| format!("127.0.0.1:{}", s.port)),
        );
        create.extend([
            "--cluster-replicas".into(),
            replicas_per_master.to_string(),
            "--cluster-yes".into(),
        ]);
        let create: Vec<&str> = create.iter().map(String::as_str).collect();
        let port = cluster.servers[0].port;
        let output = cli_output(
            port,
            cluster.password.as_deref(),
            cluster.tls_ca.as_deref(),
            &create,
        );
        assert!(
            output.status.success() && stdout_of(&output).contains("All 16384 slots covered"),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        cluster.wait_for_state("ok", CLUSTER_TIMEOUT);
        // redis-cli attaches the replicas last; wait until every node knows
        // every role and each replica is in sync with its master.
        cluster.wait_for_nodes("the roles of a new cluster", CLUSTER_TIMEOUT, |nodes| {
            let attached = |m: &ClusterNode| {
                nodes
                    .iter()
                    .filter(|n| n.role == Role::Replica && n.master_id.as_ref() == Some(&m.id))
                    .count()
            };
            let masters_seen: Vec<&ClusterNode> =
                nodes.iter().filter(|n| n.role == Role::Master).collect();
            nodes.len() == count
                && masters_seen.len() == masters
                && masters_seen
                    .iter()
                    .all(|m| attached(m) == replicas_per_master)
        });
        for node in cluster.nodes().iter().filter(|n| n.role == Role::Replica) {
            let synced = wait_until(CLUSTER_TIMEOUT, || {
                cluster
                    .cli_at(node.port, &["INFO", "replication"])
                    .contains("master_link_status:up")
            });
            assert!(synced, "replica {} never synced with its master", node.port);
        }
        cluster
    }

    /// Every node as a seed: `redis://127.0.0.1:p1,redis://127.0.0.1:p2,...`
    /// (`rediss://` for a TLS cluster).
    pub fn url(&self) -> String {
        let urls: Vec<String> = self.servers.iter().map(|s| s.url()).collect();
        urls.join(",")
    }

    pub fn ports(&self) -> Vec<u16> {
        self.servers.iter().map(|s| s.port).collect()
    }

    /// The servers, in start order (a port's role is in `nodes()`).
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    pub fn server_mut(&mut self, port: u16) -> &mut RedisServer {
        self.servers
            .iter_mut()
            .find(|s| s.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    /// A node whose process runs (queries go there).
    fn running_port(&self) -> u16 {
        self.running_ports()
            .first()
            .copied()
            .expect("a running cluster node")
    }

    fn running_ports(&self) -> Vec<u16> {
        self.servers
            .iter()
            .filter(|s| s.child.is_some())
            .map(|s| s.port)
            .collect()
    }

    /// The nodes and their roles as a running node sees them now.
    pub fn nodes(&self) -> Vec<ClusterNode> {
        self.nodes_seen_by(self.running_port())
    }

    /// The nodes as the node on `port` sees them.
    pub fn nodes_seen_by(&self, port: u16) -> Vec<ClusterNode> {
        parse_cluster_nodes(&self.cli_at(port, &["CLUSTER", "NODES"]))
    }

    /// The masters serving slots that are not flagged failed, by first slot
    /// (master 0 serves slot 0 in a new cluster).
    pub fn masters(&self) -> Vec<ClusterNode> {
        let mut masters: Vec<ClusterNode> = self
            .nodes()
            .into_iter()
            .filter(|n| n.role == Role::Master && !n.failed && !n.slots.is_empty())
            .collect();
        masters.sort_by_key(|n| n.slots[0].0);
        masters
    }

    /// SIGKILLs master `i` of `masters()` and returns it as it was.
    pub fn kill9_master(&mut self, i: usize) -> ClusterNode {
        let masters = self.masters();
        let master = masters
            .get(i)
            .unwrap_or_else(|| panic!("no master {i}: {masters:?}"))
            .clone();
        self.server_mut(master.port).kill9();
        master
    }

    /// Restarts the node on `port` (killing it if it runs) with its
    /// nodes.conf: it rejoins with its identity and slots, and no data.
    pub fn restart(&mut self, port: u16) {
        self.server_mut(port).relaunch(&["nodes.conf"]);
    }

    /// `cluster_state` as the node on `port` reports it (`ok`, `fail`).
    pub fn state(&self, port: u16) -> String {
        let info = self.cli_at(port, &["CLUSTER", "INFO"]);
        info.lines()
            .find_map(|l| l.strip_prefix("cluster_state:"))
            .unwrap_or("")
            .trim()
            .to_string()
    }

    /// Waits until every running node reports `cluster_state:<state>`; panics
    /// after `timeout`, showing what each node sees.
    pub fn wait_for_state(&self, state: &str, timeout: Duration) {
        let ports = self.running_ports();
        let reached = wait_until(timeout, || ports.iter().all(|&p| self.state(p) == state));
        if !reached {
            let seen: Vec<String> = ports
                .iter()
                .map(|&p| {
                    format!(
                        "node {p}: cluster_state:{}\n{}",
                        self.state(p),
                        self.cli_at(p, &["CLUSTER", "NODES"])
                    )
                })
                .collect();
            panic!(
                "cluster_state:{state} not reached on every node within {timeout:?}\n{}",
                seen.join("\n")
            );
        }
    }

    /// Waits until every running node sees the cluster as `done` says;
    /// panics after `timeout` with `what` and the nodes' views.
    pub fn wait_for_nodes(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&[ClusterNode]) -> bool,
    ) {
        let ports = self.running_ports();
        let reached = wait_until(timeout, || {
            ports.iter().all(|&p| done(&self.nodes_seen_by(p)))
        });
        assert!(
            reached,
            "{what}: not seen by every node within {timeout:?}; node {} sees\n{}",
            ports[0],
            self.cli_at(ports[0], &["CLUSTER", "NODES"])
        );
    }

    /// `redis-cli -c` (following redirections) against a running node.
    pub fn cli(&self, args: &[&str]) -> String {
        self.cli_at(self.running_port(), args)
    }

    /// `redis-cli -c` against the node on `port` (authenticated if the
    /// cluster has a password).
    pub fn cli_at(&self, port: u16, args: &[&str]) -> String {
        let mut with_c = vec!["-c"];
        with_c.extend_from_slice(args);
        stdout_of(&cli_output(
            port,
            self.password.as_deref(),
            self.tls_ca.as_deref(),
            &with_c,
        ))
    }
}

// ---- tier configurations on shared servers ----

static SHARED_SERVER: OnceLock<Option<RedisServer>> = OnceLock::new();
static SHARED_CLUSTER: OnceLock<Option<RedisCluster>> = OnceLock::new();

/// One standalone server for a whole test binary (suites of many small
/// tests), or None when Redis is not installed. It lives until the process
/// ends (PR_SET_PDEATHSIG then kills it); its directory goes at exit.
pub fn shared_server() -> Option<&'static RedisServer> {
    remove_shared_dirs_at_exit();
    SHARED_SERVER.get_or_init(RedisServer::start).as_ref()
}

/// One three-master cluster for a whole test binary, like [`shared_server`].
pub fn shared_cluster() -> Option<&'static RedisCluster> {
    remove_shared_dirs_at_exit();
    SHARED_CLUSTER
        .get_or_init(|| RedisCluster::start(3, 0))
        .as_ref()
}

/// Statics are never dropped, so the shared servers' directories (their
/// logs, a cluster node's nodes.conf) would stay in the temp dir after
/// every run: removed by an exit handler instead. The servers die with the
/// process a moment later (PR_SET_PDEATHSIG), and a server left running
/// meanwhile cannot create files in a directory that is gone.
fn remove_shared_dirs_at_exit() {
    extern "C" fn remove_shared_dirs() {
        let server = SHARED_SERVER.get().and_then(Option::as_ref);
        let cluster = SHARED_CLUSTER.get().and_then(Option::as_ref);
        let servers = server
            .into_iter()
            .chain(cluster.into_iter().flat_map(|c| c.servers.iter()));
        for s in servers {
            let _ = fs::remove_dir_all(&s.dir);
        }
    }
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a function that only reads statics set by then.
    REGISTERED.call_once(|| unsafe {
        libc::atexit(remove_shared_dirs);
    });
}

/// A Redis tier configuration on `url` with a key prefix of its own, so that
/// tests sharing a server never see each other's blocks.
pub fn redis_config_at(
    url: &str,
    capacity_blocks: usize,
    block_bytes: usize,
) -> kvtier::TierConfig {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut c = super::memory_config(capacity_blocks, block_bytes);
    c.set("backend", "redis").unwrap();
    c.set("url", url).unwrap();
    c.set("key_prefix", &format!("t{}-{n}", std::process::id()))
        .unwrap();
    c.set("io_timeout_ms", "5000").unwrap();
    c
}

/// A configuration on the binary's standalone server (call after checking
/// [`shared_server`]).
pub fn standalone_config(capacity_blocks: usize, block_bytes: usize) -> kvtier::TierConfig {
    let server = shared_server().expect("a Redis server (check shared_server() first)");
    redis_config_at(&server.url(), capacity_blocks, block_bytes)
}

/// [`standalone_config`] sealed with tenant A's key.
pub fn sealed_standalone_config(capacity_blocks: usize, block_bytes: usize) -> kvtier::TierConfig {
    let mut c = standalone_config(capacity_blocks, block_bytes);
    c.set("seal_key", super::SEAL_A).unwrap();
    c
}

/// [`cluster_config`] sealed with tenant A's key (a direct pipeline per master,
/// sealed values from the worker's buffer).
pub fn sealed_cluster_config(capacity_blocks: usize, block_bytes: usize) -> kvtier::TierConfig {
    let mut c = cluster_config(capacity_blocks, block_bytes);
    c.set("seal_key", super::SEAL_A).unwrap();
    c
}

/// A configuration on the binary's cluster (check [`shared_cluster`] first).
pub fn cluster_config(capacity_blocks: usize, block_bytes: usize) -> kvtier::TierConfig {
    let cluster = shared_cluster().expect("a Redis cluster (check shared_cluster() first)");
    let mut c = redis_config_at(&cluster.url(), capacity_blocks, block_bytes);
    c.set("cluster", "on").unwrap();
    c
}
