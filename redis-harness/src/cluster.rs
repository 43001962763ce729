//! Small Redis Clusters (`RedisCluster`) made with `redis-cli --cluster
//! create`, their nodes as `CLUSTER NODES` tells them, and the one server and
//! cluster a whole test binary may share.

use crate::certs::TestCerts;
use crate::server::{cli_output, stdout_of, RedisServer};
use crate::{password_of, redis_available, wait_until, CLUSTER_TIMEOUT};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

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

pub(crate) fn parse_cluster_nodes(text: &str) -> Vec<ClusterNode> {
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
    pub(crate) servers: Vec<RedisServer>,
    pub(crate) password: Option<String>,
    /// A TLS-only cluster (`start_tls`): the CA its nodes' certificates
    /// chain to, for the harness's redis-cli.
    pub(crate) tls_ca: Option<PathBuf>,
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
    pub(crate) fn form(
        masters: usize,
        replicas_per_master: usize,
        config: &[(&str, &str)],
        tls_ca: Option<&Path>,
    ) -> RedisCluster {
        assert!(masters >= 3, "a Redis cluster needs at least 3 masters");
        let count = masters * (1 + replicas_per_master);
        // Each node is dropped (killed) if a later step panics.
        let servers: Vec<RedisServer> = (0..count)
            .map(|_| {
                RedisServer::launch(config, true, tls_ca.is_some(), tls_ca)
                    .unwrap_or_else(|why| panic!("{why}"))
            })
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
    pub(crate) fn running_port(&self) -> u16 {
        self.running_ports()
            .first()
            .copied()
            .expect("a running cluster node")
    }

    pub(crate) fn running_ports(&self) -> Vec<u16> {
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
