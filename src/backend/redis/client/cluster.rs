//! Routing a Redis Cluster tier's data path: which master serves a key
//! name (its slot, and a slot map read with `CLUSTER SLOTS`), and a pool of
//! kvtier's own connections (`transport`, over TCP or TLS as the seeds are) per
//! master, so that a job's blocks for one node travel in one direct
//! pipeline (`direct`) instead of the crate's cluster pipeline, which
//! parses every value into a `Vec`. Over TLS, every master's pool shares
//! the tier's one client configuration (`tls::SharedConfig`); the cluster
//! must announce its TLS ports (`tls-cluster yes`: `CLUSTER SLOTS` asked
//! over TLS answers them).
//!
//! The map is asked from any known node (masters of the current map, then
//! the seeds). It is refreshed when a node answers MOVED or fails, at most
//! once per `MIN_REFRESH` (a resharding answers MOVED for every block of the
//! moving slots; one refresh serves them all). What becomes of blocks a
//! node redirected or failed is `routed`'s business.

use super::conn::{Conn, Pool, Target};
use super::tls::SharedConfig;
use redis::{Client, ConnectionAddr, ConnectionInfo, Value};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sync::Mutex;

/// Slots of a Redis Cluster.
const SLOTS: usize = 16_384;

/// No node (a slot no master serves, as far as the map knows).
const UNSERVED: u16 = u16::MAX;

/// Shortest time between two refreshes of the slot map.
const MIN_REFRESH: Duration = Duration::from_millis(250);

/// CRC16/XMODEM (polynomial 0x1021, initial 0), the checksum Redis Cluster
/// hashes key names with, one table entry per byte value.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[((crc >> 8) as u8 ^ b) as usize]
    })
}

/// The slot of a key name, as Redis computes it: of the hash tag (the bytes
/// between the first `{` and the next `}`) when it is not empty, else of the
/// whole name.
pub(in crate::backend::redis) fn slot_of(name: &[u8]) -> u16 {
    let tag = name
        .iter()
        .position(|&c| c == b'{')
        .and_then(|open| {
            let rest = &name[open + 1..];
            let close = rest.iter().position(|&c| c == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(name);
    crc16(tag) % SLOTS as u16
}

/// A master, and kvtier's own connections to it.
pub(in crate::backend::redis) struct Node {
    host: String,
    port: u16,
    pub(in crate::backend::redis) pool: Pool,
    /// Its last pipeline failed (refused, broken, past the deadline): a
    /// job's other masters are served before it, so that a master that
    /// hangs costs the job its own blocks, not the deadline of the others.
    suspect: AtomicBool,
}

impl Node {
    fn new(host: &str, port: u16, pool: Pool) -> Node {
        Node {
            host: host.to_string(),
            port,
            pool,
            suspect: AtomicBool::new(false),
        }
    }

    /// Records how this node's last pipeline went.
    pub(in crate::backend::redis) fn answered(&self, ok: bool) {
        if self.suspect.load(Ordering::Relaxed) == ok {
            self.suspect.store(!ok, Ordering::Relaxed);
        }
    }

    fn is_suspect(&self) -> bool {
        self.suspect.load(Ordering::Relaxed)
    }

    fn is(&self, host: &str, port: u16) -> bool {
        self.host == host && self.port == port
    }
}

/// Which master serves each slot.
pub(in crate::backend::redis) struct SlotMap {
    /// Per slot, an index into `nodes`, or UNSERVED.
    owner: Box<[u16]>,
    nodes: Vec<Arc<Node>>,
}

impl SlotMap {
    fn empty() -> SlotMap {
        SlotMap {
            owner: vec![UNSERVED; SLOTS].into_boxed_slice(),
            nodes: Vec::new(),
        }
    }

    /// The master serving `slot`, as an index for [`SlotMap::node`].
    fn route(&self, slot: u16) -> Option<usize> {
        match self.owner[slot as usize] {
            UNSERVED => None,
            i => Some(i as usize),
        }
    }

    pub(in crate::backend::redis) fn node(&self, i: usize) -> &Arc<Node> {
        &self.nodes[i]
    }

    /// Whether `slot` is served by another node here than in `before`.
    pub(in crate::backend::redis) fn moved_since(&self, before: &SlotMap, slot: u16) -> bool {
        let node = |map: &SlotMap| map.route(slot).map(|i| Arc::as_ptr(&map.nodes[i]));
        node(self) != node(before)
    }

    pub(in crate::backend::redis) fn masters(&self) -> usize {
        self.nodes.len()
    }
}

/// A job's blocks grouped by the master serving them.
pub(in crate::backend::redis) struct Routes {
    /// Each block's slot.
    pub(in crate::backend::redis) slots: Vec<u16>,
    /// Block indices, grouped by node (in block order within a group).
    pub(in crate::backend::redis) order: Vec<usize>,
    /// Per group: its node in the map (None: no master known for its
    /// slots) and its range of `order`; suspect nodes' groups last.
    pub(in crate::backend::redis) groups: Vec<(Option<usize>, Range<usize>)>,
}

impl Routes {
    /// Routes the blocks `i` of `0..n` that `include(i)`; `name_of(i, out)`
    /// appends block i's key name. A handful of allocations per job, none
    /// per block.
    pub(in crate::backend::redis) fn new(
        map: &SlotMap,
        n: usize,
        include: impl Fn(usize) -> bool,
        mut name_of: impl FnMut(usize, &mut Vec<u8>),
    ) -> Routes {
        let mut name = Vec::new();
        let slots: Vec<u16> = (0..n)
            .map(|i| {
                name.clear();
                name_of(i, &mut name);
                slot_of(&name)
            })
            .collect();
        let node_of = |i: usize| map.route(slots[i]).unwrap_or(usize::MAX);
        // Sized first: collected from a filter, it would grow by doubling,
        // a few allocations more for a big job than for a small one.
        let mut order = Vec::with_capacity(n);
        order.extend((0..n).filter(|&i| include(i)));
        order.sort_unstable_by_key(|&i| (node_of(i), i));
        let mut groups = Vec::with_capacity(map.nodes.len() + 1);
        let mut start = 0;
        while start < order.len() {
            let node = node_of(order[start]);
            let end = start + order[start..].partition_point(|&i| node_of(i) == node);
            groups.push(((node != usize::MAX).then_some(node), start..end));
            start = end;
        }
        // Masters whose last pipeline failed last (see `Node::suspect`).
        groups.sort_by_key(|(node, _)| node.is_some_and(|n| map.node(n).is_suspect()));
        Routes {
            slots,
            order,
            groups,
        }
    }

    /// Blocks in the largest group.
    pub(in crate::backend::redis) fn largest(&self) -> usize {
        self.groups.iter().map(|(_, r)| r.len()).max().unwrap_or(0)
    }
}

/// What a server's error reply to one command asks of the client.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(in crate::backend::redis) enum Redirection {
    /// The slot lives elsewhere now: the map is stale.
    Moved,
    /// The slot is moving: this key is asked for on the target.
    Ask,
    /// The slot is moving: ask again later.
    TryAgain,
}

/// The redirection an error reply is, if it is one.
pub(in crate::backend::redis) fn redirection(message: &str) -> Option<Redirection> {
    let code = message.split(' ').next().unwrap_or("");
    match code {
        "MOVED" => Some(Redirection::Moved),
        "ASK" => Some(Redirection::Ask),
        "TRYAGAIN" => Some(Redirection::TryAgain),
        _ => None,
    }
}

/// How the seeds, hence every node, are reached.
#[derive(Clone, Copy, PartialEq)]
enum Transport {
    Tcp,
    /// TLS, with the seeds' `#insecure` flag (refused when connecting).
    Tls {
        insecure: bool,
    },
}

/// The slot map and a pool per node, for a cluster reached over plain TCP
/// or TLS.
pub(in crate::backend::redis) struct Router {
    /// A seed's connection settings (user, password): every node's
    /// connections use them, with the node's address.
    template: ConnectionInfo,
    seeds: Vec<(String, u16)>,
    transport: Transport,
    /// The tier's TLS configuration, shared by every node's pool.
    tls: SharedConfig,
    connections: usize,
    timeout: Duration,
    map: Mutex<Arc<SlotMap>>,
    /// Every node seen so far (its connections outlive a refresh).
    known: Mutex<Vec<Arc<Node>>>,
    /// A refresh is running (another thread does not wait for it).
    refreshing: AtomicBool,
    last_refresh: Mutex<Option<Instant>>,
    refreshes: AtomicU64,
    /// Blocks sent through the crate's connection after a redirection or a
    /// node's failure.
    rerouted: AtomicU64,
}

impl Router {
    /// A router over `seeds`, or None unless all are plain TCP addresses or
    /// all TLS ones from URLs (no certificates in memory, one `#insecure`
    /// flag): anything else stays on the crate's connections. Every node's
    /// pool uses `tls`, the tier's TLS configuration. The first map is read
    /// now; a cluster that does not answer yet leaves it empty (every block
    /// then goes through the crate's connection, and each job asks again).
    pub(in crate::backend::redis) fn new(
        seeds: &[Client],
        connections: usize,
        timeout: Duration,
        tls: SharedConfig,
    ) -> Option<Router> {
        let mut addrs = Vec::new();
        let mut transports = Vec::new();
        for seed in seeds {
            let (host, port, transport) = match seed.get_connection_info().addr() {
                ConnectionAddr::Tcp(host, port) => (host, port, Transport::Tcp),
                ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure,
                    tls_params: None,
                } => (
                    host,
                    port,
                    Transport::Tls {
                        insecure: *insecure,
                    },
                ),
                _ => return None,
            };
            addrs.push((host.clone(), *port));
            transports.push(transport);
        }
        let transport = *transports.first()?;
        if transports.iter().any(|&t| t != transport) {
            return None;
        }
        let router = Router {
            template: seeds.first()?.get_connection_info().clone(),
            seeds: addrs,
            transport,
            tls,
            connections,
            timeout,
            map: Mutex::new(Arc::new(SlotMap::empty())),
            known: Mutex::new(Vec::new()),
            refreshing: AtomicBool::new(false),
            last_refresh: Mutex::new(None),
            refreshes: AtomicU64::new(0),
            rerouted: AtomicU64::new(0),
        };
        router.refresh(&[], Instant::now() + timeout);
        Some(router)
    }

    pub(in crate::backend::redis) fn map(&self) -> Arc<SlotMap> {
        Arc::clone(&self.map.lock())
    }

    /// The node at `host:port`, with its pool (made on first sight).
    fn node(&self, host: &str, port: u16) -> Option<Arc<Node>> {
        let mut known = self.known.lock();
        if let Some(node) = known.iter().find(|n| n.is(host, port)) {
            return Some(Arc::clone(node));
        }
        let addr = match self.transport {
            Transport::Tcp => ConnectionAddr::Tcp(host.to_string(), port),
            Transport::Tls { insecure } => ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure,
                tls_params: None,
            },
        };
        let client = Client::open(self.template.clone().set_addr(addr)).ok()?;
        let node = Arc::new(Node::new(
            host,
            port,
            Pool::new(
                Target::Single(client),
                self.connections,
                self.timeout,
                self.tls.clone(),
            ),
        ));
        known.push(Arc::clone(&node));
        Some(node)
    }

    /// Reads the slot map again from the first node that answers (not one
    /// of `avoid`, which just failed), unless another thread is doing so or
    /// one did within `MIN_REFRESH`. The old map stays in use meanwhile.
    /// Every node asked shares `deadline` (the job's): with several nodes
    /// hung, asking each in turn would cost one `io_timeout_ms` per node.
    pub(in crate::backend::redis) fn refresh(&self, avoid: &[Arc<Node>], deadline: Instant) {
        if self.refreshing.swap(true, Ordering::Acquire) {
            return;
        }
        let recent = self
            .last_refresh
            .lock()
            .is_some_and(|at| at.elapsed() < MIN_REFRESH);
        if !recent {
            let mut candidates: Vec<(String, u16)> = self
                .map()
                .nodes
                .iter()
                .map(|n| (n.host.clone(), n.port))
                .collect();
            candidates.extend(self.seeds.iter().cloned());
            // Seeds are often the masters again: each node is asked once.
            let mut asked: Vec<(String, u16)> = Vec::with_capacity(candidates.len());
            for (host, port) in candidates {
                if Instant::now() >= deadline {
                    break;
                }
                if avoid.iter().any(|n| n.is(&host, port)) || asked.contains(&(host.clone(), port))
                {
                    continue;
                }
                asked.push((host.clone(), port));
                let Some(node) = self.node(&host, port) else {
                    continue;
                };
                let slots = node.pool.with_conn("CLUSTER SLOTS", |conn| {
                    if let Conn::Direct(c) = conn {
                        c.cap_next(deadline);
                    }
                    redis::cmd("CLUSTER")
                        .arg("SLOTS")
                        .query::<Value>(conn.like())
                });
                if let Some(map) = slots.ok().and_then(|v| self.parse(&v, &host)) {
                    *self.map.lock() = Arc::new(map);
                    self.refreshes.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
            *self.last_refresh.lock() = Some(Instant::now());
        }
        self.refreshing.store(false, Ordering::Release);
    }

    /// A slot map from a `CLUSTER SLOTS` reply asked of `asked_host`:
    /// `[[start, end, [host, port, id, ...], replicas...], ...]`. An empty
    /// host is the node asked; `?` (unknown) leaves the range unserved.
    fn parse(&self, reply: &Value, asked_host: &str) -> Option<SlotMap> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut map = SlotMap::empty();
        for range in ranges {
            let Value::Array(fields) = range else {
                return None;
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return None;
            };
            let (Some(Value::BulkString(host)), Some(Value::Int(port))) =
                (master.first(), master.get(1))
            else {
                return None;
            };
            let host = match std::str::from_utf8(host).ok()? {
                "" => asked_host,
                "?" => continue,
                host => host,
            };
            let port = u16::try_from(*port).ok()?;
            if !(0..SLOTS as i64).contains(start) || !(*start..SLOTS as i64).contains(end) {
                return None;
            }
            let node = self.node(host, port)?;
            let i = match map.nodes.iter().position(|n| Arc::ptr_eq(n, &node)) {
                Some(i) => i,
                None => {
                    map.nodes.push(node);
                    map.nodes.len() - 1
                }
            };
            map.owner[*start as usize..=*end as usize].fill(i as u16);
        }
        Some(map)
    }

    /// Counts blocks sent through the crate's connection after a
    /// redirection or a node's failure.
    pub(in crate::backend::redis) fn note_rerouted(&self, blocks: usize) {
        self.rerouted.fetch_add(blocks as u64, Ordering::Relaxed);
    }

    /// For `tier_describe`: how many masters the map knows, how often it was
    /// read, how many blocks took the crate's way round.
    pub(in crate::backend::redis) fn describe(&self) -> String {
        format!(
            "slot map: {} masters, read {} times; {} blocks rerouted",
            self.map().masters(),
            self.refreshes.load(Ordering::Relaxed),
            self.rerouted.load(Ordering::Relaxed)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_clusters() {
        // CRC16/XMODEM's check value, and `CLUSTER KEYSLOT` answers.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"bar"), 5061);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        // An empty tag hashes the whole name.
        assert_eq!(slot_of(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
        assert_eq!(slot_of(b"p:00ff:b4:{abcd}"), slot_of(b"abcd"));
    }

    #[test]
    fn redirections_are_told_from_other_errors() {
        assert_eq!(
            redirection("MOVED 3999 127.0.0.1:6381"),
            Some(Redirection::Moved)
        );
        assert_eq!(
            redirection("ASK 3999 127.0.0.1:6381"),
            Some(Redirection::Ask)
        );
        assert_eq!(
            redirection("TRYAGAIN Multiple keys request during rehashing of slot"),
            Some(Redirection::TryAgain)
        );
        assert_eq!(redirection("CLUSTERDOWN The cluster is down"), None);
        assert_eq!(redirection("MOVEDX"), None);
    }

    #[test]
    fn blocks_are_grouped_by_node_in_block_order() {
        let mut map = SlotMap::empty();
        let client = Client::open("redis://127.0.0.1:1").unwrap();
        for port in [1, 2] {
            map.nodes.push(Arc::new(Node::new(
                "127.0.0.1",
                port,
                Pool::new(
                    Target::Single(client.clone()),
                    1,
                    Duration::from_secs(1),
                    SharedConfig::default(),
                ),
            )));
        }
        // Node 0 serves the lower half, node 1 the upper half but the last
        // slot, which nobody serves.
        map.owner[..SLOTS / 2].fill(0);
        map.owner[SLOTS / 2..SLOTS - 1].fill(1);
        let names: Vec<Vec<u8>> = (0..200u32)
            .map(|i| format!("p:{{{i:x}}}").into_bytes())
            .collect();
        let routes = Routes::new(
            &map,
            names.len(),
            |i| i % 7 != 3,
            |i, out| out.extend_from_slice(&names[i]),
        );
        let mut seen = vec![false; names.len()];
        let mut nodes: Vec<Option<usize>> = routes.groups.iter().map(|g| g.0).collect();
        nodes.dedup();
        assert_eq!(nodes.len(), routes.groups.len(), "one group per node");
        for (node, range) in &routes.groups {
            let blocks = &routes.order[range.clone()];
            assert!(blocks.windows(2).all(|w| w[0] < w[1]), "block order");
            for &i in blocks {
                assert!(!seen[i]);
                seen[i] = true;
                let slot = slot_of(&names[i]);
                assert_eq!(routes.slots[i], slot);
                assert_eq!(*node, map.route(slot));
            }
        }
        assert!(seen.iter().enumerate().all(|(i, &s)| s == (i % 7 != 3)));
        assert_eq!(routes.groups.len(), 2, "200 names over two halves");
    }
}
