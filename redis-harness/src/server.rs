//! One `redis-server` process (`RedisServer`): launched on free ports in
//! a scratch directory, ready once its log says so and it answers PING.

use crate::certs::TestCerts;
use crate::{
    config_args, free_ports, password_of, raw_ping, redis_available, spawn_tied, tools,
    PORT_ATTEMPTS, START_TIMEOUT,
};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Why a launch failed.
pub(crate) enum LaunchError {
    /// Another process bound one of the ports first.
    PortTaken,
    Failed(String),
}

/// One `redis-server` process bound to 127.0.0.1:`port()`.
pub struct RedisServer {
    pub(crate) child: Option<Child>,
    pub(crate) port: u16,
    /// The cluster bus port of a cluster node.
    pub(crate) bus_port: Option<u16>,
    /// The TLS port of a server started with `start_tls`, or of a TLS-only
    /// cluster node (where it is `port` too).
    pub(crate) tls_port: Option<u16>,
    /// A TLS-only server (`--port 0`: no plain port): the CA its clients
    /// trust, for the harness's own redis-cli (readiness, `cli`).
    pub(crate) tls_ca: Option<PathBuf>,
    pub(crate) dir: PathBuf,
    /// The test's `--key value` arguments.
    pub(crate) extra: Vec<String>,
    pub(crate) password: Option<String>,
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
        Some(Self::launch(config, false, false, None).unwrap_or_else(|why| panic!("{why}")))
    }

    /// A server with the default settings, or why there is none (no
    /// redis-server on PATH, or it would not start), never a skip: for
    /// callers that report it themselves (the benchmark).
    pub fn try_start() -> Result<RedisServer, String> {
        tools().map_err(|why| format!("{why} (install redis-server)"))?;
        Self::launch(&[], false, false, None)
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
        Some(Self::launch(&config, false, true, None).unwrap_or_else(|why| panic!("{why}")))
    }

    /// The server of `launch` on `tls` with no plain port when `tls_ca` is
    /// given (`port` is then the TLS port; the harness's redis-cli speaks
    /// TLS, trusting `tls_ca`).
    pub(crate) fn launch(
        config: &[(&str, &str)],
        cluster: bool,
        tls: bool,
        tls_ca: Option<&Path>,
    ) -> Result<RedisServer, String> {
        assert!(tls || tls_ca.is_none(), "a TLS-only server speaks TLS");
        let dir = crate::scratch_dir();
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
                Ok(()) => return Ok(server),
                Err(LaunchError::PortTaken) => continue,
                Err(LaunchError::Failed(why)) => return Err(why),
            }
        }
        Err(format!(
            "redis-server: every port tried was taken ({PORT_ATTEMPTS} attempts)"
        ))
    }

    pub(crate) fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    pub(crate) fn output_path(&self) -> PathBuf {
        self.dir.join("stdout-stderr.log")
    }

    pub(crate) fn args(&self) -> Vec<String> {
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
    pub(crate) fn spawn(&mut self) -> Result<(), LaunchError> {
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
    pub(crate) fn answers_ping(&self) -> bool {
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

    pub(crate) fn signal(&self, signal: libc::c_int) {
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
    pub(crate) fn relaunch(&mut self, keep: &[&str]) {
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

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill9();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// SIGKILL to the server's process group (the server and any child it forked
/// for replication), then reaps it. Only while the server is unreaped: its
/// pid, the group's id, cannot have been reused yet.
pub(crate) fn kill_group(child: &mut Child) {
    if matches!(child.try_wait(), Ok(None)) {
        unsafe {
            libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// `redis-cli` against 127.0.0.1:`port`, over TLS trusting `tls_ca` if given.
pub(crate) fn cli_output(
    port: u16,
    password: Option<&str>,
    tls_ca: Option<&Path>,
    args: &[&str],
) -> Output {
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

pub(crate) fn stdout_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout)
        .trim_end_matches(['\r', '\n'])
        .to_string()
}
