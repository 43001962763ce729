//! The router: the slot map (`routes`) and a pool of kvtier's own
//! connections (`transport`, over TCP or TLS as the seeds are) per node,
//! for a cluster and for a single server alike (a map of one node serving
//! every slot, never read again). Over TLS, every node's pool shares the
//! tier's one client configuration (`tls::SharedConfig`); a cluster must
//! announce its TLS ports (`tls-cluster yes`: `CLUSTER SLOTS` asked over
//! TLS answers them).
//!
//! A cluster's map is asked from any known node (masters of the current
//! map, then the seeds). It is read again when a node answers MOVED or
//! fails, at most once per `MIN_REFRESH` (a resharding answers MOVED for
//! every block of the moving slots; one refresh serves them all). What
//! becomes of blocks a node redirected or failed is `job`'s business.

use super::conn::Pool;
use super::reply::{Value, MAP_REPLY};
use super::routes::{Node, SlotMap, SLOTS};
use super::tls::SharedConfig;
use super::transport::RespConn;
use super::url::Endpoint;
use crate::sync::Mutex;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Shortest time between two refreshes of the slot map.
const MIN_REFRESH: Duration = Duration::from_millis(250);

/// The slot map and a pool per node.
pub(in crate::backend::redis) struct Router {
    /// The seeds (all `redis://` or all `rediss://`): every node's
    /// connections use the first one's settings (user, password, db,
    /// TLS) with the node's address.
    seeds: Vec<Endpoint>,
    cluster: bool,
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
    /// Blocks sent again after a redirection (MOVED, ASK, TRYAGAIN,
    /// CLUSTERDOWN) or because no master was known for their slot.
    rerouted: AtomicU64,
    /// Blocks a node answered with MOVED, and with ASK.
    moved: AtomicU64,
    asked: AtomicU64,
}

/// The client's counts, for the tier's metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::backend::redis) struct ClientCounts {
    pub slot_map_reads: u64,
    pub rerouted: u64,
    pub moved: u64,
    pub asked: u64,
    pub reconnects: u64,
    pub dropped: u64,
    pub connect_failures: u64,
}

impl Router {
    /// A router over `seeds` (one, unless `cluster`), reached now: a
    /// single server answers PING (that connection stays in its pool); a
    /// cluster's map is read from the first seed that answers.
    pub(in crate::backend::redis) fn open(
        seeds: Vec<Endpoint>,
        cluster: bool,
        connections: usize,
        timeout: Duration,
        tls: SharedConfig,
    ) -> io::Result<Router> {
        let router = Router {
            seeds,
            cluster,
            tls,
            connections,
            timeout,
            map: Mutex::new(Arc::new(SlotMap::empty())),
            known: Mutex::new(Vec::new()),
            refreshing: AtomicBool::new(false),
            last_refresh: Mutex::new(None),
            refreshes: AtomicU64::new(0),
            rerouted: AtomicU64::new(0),
            moved: AtomicU64::new(0),
            asked: AtomicU64::new(0),
        };
        if cluster {
            router.read_map(&[], Instant::now() + timeout)?;
            *router.last_refresh.lock() = Some(Instant::now());
        } else {
            let seed = &router.seeds[0];
            let node = router.node(&seed.host, seed.port);
            node.pool.ping()?;
            let mut map = SlotMap::empty();
            map.assign(0..SLOTS, node);
            *router.map.lock() = Arc::new(map);
        }
        Ok(router)
    }

    pub(in crate::backend::redis) fn is_cluster(&self) -> bool {
        self.cluster
    }

    pub(in crate::backend::redis) fn seeds(&self) -> &[Endpoint] {
        &self.seeds
    }

    /// The deadline of every server operation (`io_timeout_ms`).
    pub(in crate::backend::redis) fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(in crate::backend::redis) fn map(&self) -> Arc<SlotMap> {
        Arc::clone(&self.map.lock())
    }

    /// The node at `host:port`, with its pool (made on first sight).
    pub(in crate::backend::redis) fn node(&self, host: &str, port: u16) -> Arc<Node> {
        let mut known = self.known.lock();
        if let Some(node) = known.iter().find(|n| n.is(host, port)) {
            return Arc::clone(node);
        }
        let pool = Pool::new(
            self.seeds[0].at(host, port),
            self.connections,
            self.timeout,
            self.tls.clone(),
        );
        let node = Arc::new(Node::new(host, port, pool));
        known.push(Arc::clone(&node));
        node
    }

    /// A connection of its own to `at` (not pooled: adoption's SCANs),
    /// over TLS when the seeds are, opened by `deadline`.
    pub(in crate::backend::redis) fn connect(
        &self,
        at: &Endpoint,
        deadline: Instant,
    ) -> io::Result<RespConn> {
        let tls = match at.tls {
            true => Some(self.tls.get()?),
            false => None,
        };
        RespConn::connect(at, tls.as_ref(), self.timeout, deadline)
    }

    /// Reads a cluster's slot map again from the first node that answers
    /// (not one of `avoid`, which just failed), unless another thread is
    /// doing so or one did within `MIN_REFRESH`. The old map stays in use
    /// meanwhile. Every node asked shares `deadline` (the job's): with
    /// several nodes hung, asking each in turn would cost one
    /// `io_timeout_ms` per node. A single server's map never changes.
    pub(in crate::backend::redis) fn refresh(&self, avoid: &[Arc<Node>], deadline: Instant) {
        if !self.cluster || self.refreshing.swap(true, Ordering::Acquire) {
            return;
        }
        let recent = self
            .last_refresh
            .lock()
            .is_some_and(|at| at.elapsed() < MIN_REFRESH);
        if !recent {
            // A failure leaves the old map: the next redirection or failure
            // asks again.
            let _ = self.read_map(avoid, deadline);
            *self.last_refresh.lock() = Some(Instant::now());
        }
        self.refreshing.store(false, Ordering::Release);
    }

    /// Asks `CLUSTER SLOTS` of the known masters, then the seeds, until
    /// one answers with a map; the last failure if none did.
    fn read_map(&self, avoid: &[Arc<Node>], deadline: Instant) -> io::Result<()> {
        let mut candidates: Vec<(String, u16)> = self
            .map()
            .nodes
            .iter()
            .map(|n| (n.host.clone(), n.port))
            .collect();
        candidates.extend(self.seeds.iter().map(|s| (s.host.clone(), s.port)));
        // Seeds are often the masters again: each node is asked once.
        let mut asked: Vec<(String, u16)> = Vec::with_capacity(candidates.len());
        let mut last = io::Error::new(io::ErrorKind::TimedOut, "no node asked in time");
        for (host, port) in candidates {
            if Instant::now() >= deadline {
                break;
            }
            if avoid.iter().any(|n| n.is(&host, port)) || asked.contains(&(host.clone(), port)) {
                continue;
            }
            asked.push((host.clone(), port));
            let node = self.node(&host, port);
            let slots = node.pool.with("CLUSTER SLOTS", deadline, |c| {
                c.cap_next(deadline);
                c.call(&[b"CLUSTER", b"SLOTS"], MAP_REPLY)
            });
            match slots {
                Ok(reply) => match self.parse(&reply, &host) {
                    Some(map) => {
                        *self.map.lock() = Arc::new(map);
                        self.refreshes.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    None => {
                        last = io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("{host}:{port}: CLUSTER SLOTS answered {reply:?}"),
                        )
                    }
                },
                Err(e) => last = io::Error::other(format!("{host}:{port}: {}", e.message())),
            }
        }
        Err(last)
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
            map.assign(*start as usize..*end as usize + 1, self.node(host, port));
        }
        Some(map)
    }

    /// Counts blocks sent again after a redirection, or for want of a
    /// master known for their slot.
    pub(in crate::backend::redis) fn note_rerouted(&self, blocks: usize) {
        self.rerouted.fetch_add(blocks as u64, Ordering::Relaxed);
    }

    /// Counts blocks a node answered with MOVED (`moved`) and with ASK.
    pub(in crate::backend::redis) fn note_redirections(&self, moved: usize, asked: usize) {
        self.moved.fetch_add(moved as u64, Ordering::Relaxed);
        self.asked.fetch_add(asked as u64, Ordering::Relaxed);
    }

    /// What the router and every node's pool counted so far.
    pub(in crate::backend::redis) fn counts(&self) -> ClientCounts {
        let mut c = ClientCounts {
            slot_map_reads: self.refreshes.load(Ordering::Relaxed),
            rerouted: self.rerouted.load(Ordering::Relaxed),
            moved: self.moved.load(Ordering::Relaxed),
            asked: self.asked.load(Ordering::Relaxed),
            ..ClientCounts::default()
        };
        for node in self.known.lock().iter() {
            let pool = node.pool.counts();
            c.reconnects += pool.reconnects;
            c.dropped += pool.dropped;
            c.connect_failures += pool.connect_failures;
        }
        c
    }

    /// For `tier_describe`: how many masters the map knows, how often it was
    /// read, how many blocks were rerouted (see `rerouted`).
    pub(in crate::backend::redis) fn describe(&self) -> String {
        format!(
            "slot map: {} masters, read {} times; {} blocks rerouted",
            self.map().masters(),
            self.refreshes.load(Ordering::Relaxed),
            self.rerouted.load(Ordering::Relaxed)
        )
    }
}
