//! The slot map: which master serves a key name (its slot, CRC16 of the
//! hash tag), the masters' nodes with their pools, a job's blocks grouped
//! by the node each goes to, and the redirections a server's error reply
//! asks for. A single server is a map of one node serving every slot.

use super::conn::Pool;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Slots of a Redis Cluster.
pub(super) const SLOTS: usize = 16_384;

/// No node (a slot no master serves, as far as the map knows).
const UNSERVED: u16 = u16::MAX;

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

/// The slots of `n` key names, `name_of(i, out)` appending name i: a job
/// computes them once for all its passes.
pub(in crate::backend::redis) fn slots_of(
    n: usize,
    mut name_of: impl FnMut(usize, &mut Vec<u8>),
) -> Vec<u16> {
    let mut name = Vec::new();
    (0..n)
        .map(|i| {
            name.clear();
            name_of(i, &mut name);
            slot_of(&name)
        })
        .collect()
}

/// A server (a master), and kvtier's own connections to it.
pub(in crate::backend::redis) struct Node {
    pub(super) host: String,
    pub(super) port: u16,
    pub(in crate::backend::redis) pool: Pool,
    /// Its last pipeline failed (refused, broken, past the deadline): a
    /// job's other masters are served before it, so that a master that
    /// hangs costs the job its own blocks, not the deadline of the others.
    suspect: AtomicBool,
}

impl Node {
    pub(super) fn new(host: &str, port: u16, pool: Pool) -> Node {
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

    pub(super) fn is(&self, host: &str, port: u16) -> bool {
        self.host == host && self.port == port
    }
}

/// Which master serves each slot.
pub(in crate::backend::redis) struct SlotMap {
    /// Per slot, an index into `nodes`, or UNSERVED.
    owner: Box<[u16]>,
    pub(super) nodes: Vec<Arc<Node>>,
}

impl SlotMap {
    pub(super) fn empty() -> SlotMap {
        SlotMap {
            owner: vec![UNSERVED; SLOTS].into_boxed_slice(),
            nodes: Vec::new(),
        }
    }

    /// Gives `slots` to `node` (added to the map's nodes if new).
    pub(super) fn assign(&mut self, slots: Range<usize>, node: Arc<Node>) {
        let i = match self.nodes.iter().position(|n| Arc::ptr_eq(n, &node)) {
            Some(i) => i,
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.owner[slots].fill(i as u16);
    }

    /// The master serving `slot`, as an index into `nodes`.
    fn route(&self, slot: u16) -> Option<usize> {
        match self.owner[slot as usize] {
            UNSERVED => None,
            i => Some(i as usize),
        }
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

/// Where a block goes on a pass after the first: by its slot, or to the
/// node a redirection named (`asking`: behind `ASKING`, for one command).
#[derive(Clone, Default)]
pub(in crate::backend::redis) enum Aim {
    #[default]
    Slot,
    At {
        node: Arc<Node>,
        asking: bool,
    },
}

/// Blocks going to one node in one pipeline.
pub(in crate::backend::redis) struct Group {
    /// None: no master is known to serve these blocks' slots.
    pub node: Option<Arc<Node>>,
    /// Its blocks' place in `Routes::order`.
    pub range: Range<usize>,
    /// Each command goes behind `ASKING` (one block per group).
    pub asking: bool,
}

/// A pass's blocks grouped by the node serving them.
pub(in crate::backend::redis) struct Routes {
    /// Block indices, grouped by node (in block order within a group).
    pub order: Vec<usize>,
    /// Suspect nodes' groups last.
    pub groups: Vec<Group>,
}

impl Routes {
    /// Routes the blocks `i` of `slots` that `include(i)`, each by its
    /// slot or as `aims[i]` says (`aims` empty: all by slot). A handful of
    /// allocations per pass, none per block.
    pub(in crate::backend::redis) fn new(
        map: &SlotMap,
        slots: &[u16],
        include: impl Fn(usize) -> bool,
        aims: &[Aim],
    ) -> Routes {
        // Nodes a redirection named, numbered after the map's.
        let mut named: Vec<Arc<Node>> = Vec::new();
        for aim in aims {
            if let Aim::At { node, .. } = aim {
                if !named.iter().any(|n| Arc::ptr_eq(n, node)) {
                    named.push(Arc::clone(node));
                }
            }
        }
        let unserved = usize::MAX;
        // (node number, own group): a block behind ASKING is a group alone.
        let key = |i: usize| -> (usize, usize) {
            match aims.get(i) {
                Some(Aim::At { node, asking }) => {
                    let k = named.iter().position(|n| Arc::ptr_eq(n, node));
                    let k = map.nodes.len() + k.expect("named above");
                    (k, if *asking { i + 1 } else { 0 })
                }
                _ => (map.route(slots[i]).unwrap_or(unserved), 0),
            }
        };
        // Sized first: collected from a filter, it would grow by doubling,
        // a few allocations more for a big job than for a small one.
        let mut order = Vec::with_capacity(slots.len());
        order.extend((0..slots.len()).filter(|&i| include(i)));
        order.sort_unstable_by_key(|&i| (key(i), i));
        let mut groups = Vec::with_capacity(map.nodes.len() + named.len() + 1);
        let mut start = 0;
        while start < order.len() {
            let (k, own) = key(order[start]);
            let end = start + order[start..].partition_point(|&i| key(i) == (k, own));
            let node = match k {
                k if k == unserved => None,
                k if k < map.nodes.len() => Some(Arc::clone(&map.nodes[k])),
                k => Some(Arc::clone(&named[k - map.nodes.len()])),
            };
            groups.push(Group {
                node,
                range: start..end,
                asking: own > 0,
            });
            start = end;
        }
        // Masters whose last pipeline failed last (see `Node::suspect`).
        groups.sort_by_key(|g| g.node.as_ref().is_some_and(|n| n.is_suspect()));
        Routes { order, groups }
    }
}

/// What a server's error reply to one command asks of the client.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::backend::redis) enum Redirection {
    /// The slot lives elsewhere now (at the address, when given): the map
    /// is stale.
    Moved(Option<(String, u16)>),
    /// The slot is moving: this key is asked for on the node named, behind
    /// `ASKING`.
    Ask(Option<(String, u16)>),
    /// The slot is moving, or the cluster is failing over: ask again a
    /// little later.
    TryAgain,
}

#[cfg(test)]
mod tests {
    use super::super::tls::SharedConfig;
    use super::super::url;
    use super::*;
    use std::time::Duration;

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

    fn node(port: u16) -> Arc<Node> {
        let at = url::parse(&format!("redis://127.0.0.1:{port}")).unwrap();
        let pool = Pool::new(at, 1, Duration::from_secs(1), SharedConfig::default());
        Arc::new(Node::new("127.0.0.1", port, pool))
    }

    #[test]
    fn blocks_are_grouped_by_node_in_block_order() {
        let mut map = SlotMap::empty();
        // Node 0 serves the lower half, node 1 the upper half but the last
        // slot, which nobody serves.
        map.assign(0..SLOTS / 2, node(1));
        map.assign(SLOTS / 2..SLOTS - 1, node(2));
        let names: Vec<Vec<u8>> = (0..200u32)
            .map(|i| format!("p:{{{i:x}}}").into_bytes())
            .collect();
        let slots = slots_of(names.len(), |i, out| out.extend_from_slice(&names[i]));
        let routes = Routes::new(&map, &slots, |i| i % 7 != 3, &[]);
        let mut seen = vec![false; names.len()];
        for g in &routes.groups {
            let blocks = &routes.order[g.range.clone()];
            assert!(blocks.windows(2).all(|w| w[0] < w[1]), "block order");
            for &i in blocks {
                assert!(!seen[i]);
                seen[i] = true;
                assert_eq!(slots[i], slot_of(&names[i]));
                let expected = map.route(slots[i]).map(|k| Arc::as_ptr(&map.nodes[k]));
                assert_eq!(g.node.as_ref().map(Arc::as_ptr), expected);
            }
            assert!(!g.asking);
        }
        assert!(seen.iter().enumerate().all(|(i, &s)| s == (i % 7 != 3)));
        assert_eq!(routes.groups.len(), 2, "200 names over two halves");
    }

    #[test]
    fn redirected_blocks_go_where_they_were_sent_asked_ones_alone() {
        let mut map = SlotMap::empty();
        map.assign(0..SLOTS, node(1));
        let other = node(3);
        let slots = vec![0u16; 6];
        let mut aims = vec![Aim::Slot; 6];
        for i in [1, 2] {
            aims[i] = Aim::At {
                node: Arc::clone(&other),
                asking: false,
            };
        }
        for i in [4, 5] {
            aims[i] = Aim::At {
                node: Arc::clone(&other),
                asking: true,
            };
        }
        let routes = Routes::new(&map, &slots, |i| i != 0, &aims);
        let shape: Vec<(u16, Vec<usize>, bool)> = routes
            .groups
            .iter()
            .map(|g| {
                let port = g.node.as_ref().unwrap().port;
                (port, routes.order[g.range.clone()].to_vec(), g.asking)
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (1, vec![3], false),
                (3, vec![1, 2], false),
                (3, vec![4], true),
                (3, vec![5], true)
            ]
        );
    }
}
