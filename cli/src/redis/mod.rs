//! A Redis or Redis Cluster keyspace as the command sees it: its masters
//! (`CLUSTER NODES` of the first seed that answers; a single server is one),
//! a bounded `SCAN` of each master for the names under `key_prefix`, and what
//! those names are (`kvtier::admin::redis::KeyName`), attributed to a
//! namespace where a generation key, or `--namespace`, names it.
//!
//! Every loop a server drives is bounded: SCAN steps per master, names per
//! step, and the bytes a pipeline of GETs asks for.

pub mod clear;
pub mod gc;
pub mod inspect;
pub mod verify;

use kvtier::admin::redis::{tenant_fingerprints, value_len, KeyName};
use redis::{Client, Connection, ConnectionAddr, Value};
use std::collections::HashMap;
use std::time::Duration;

/// Most SCAN steps on one master, however it answers.
const MAX_SCAN_STEPS: usize = 1 << 22;
/// Names asked for per SCAN step.
const SCAN_COUNT: usize = 1000;
/// Most names one SCAN answer may carry before it is refused.
const MAX_SCAN_NAMES: usize = 100_000;
/// Each request's deadline.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A master, and how to reach it (the first seed's user, password and TLS).
pub struct Node {
    pub name: String,
    client: Client,
}

impl Node {
    pub fn connect(&self) -> Result<Connection, String> {
        let c = self
            .client
            .get_connection_with_timeout(TIMEOUT)
            .map_err(|e| format!("{}: {e}", self.name))?;
        c.set_read_timeout(Some(TIMEOUT))
            .map_err(|e| e.to_string())?;
        c.set_write_timeout(Some(TIMEOUT))
            .map_err(|e| e.to_string())?;
        let mut c = c;
        // Redis 7.2+: this connection's reads are no use of the keys, so a
        // verify leaves gc's idle order alone (older servers refuse it).
        let _: redis::RedisResult<Value> =
            redis::cmd("CLIENT").arg("NO-TOUCH").arg("ON").query(&mut c);
        Ok(c)
    }
}

/// The masters holding a keyspace.
pub struct Keyspace {
    pub nodes: Vec<Node>,
    pub cluster: bool,
    pub key_prefix: String,
}

/// Finds the masters from the first seed that answers.
pub fn open(seeds: &[&str], key_prefix: &str) -> Result<Keyspace, String> {
    let mut failures = Vec::new();
    for seed in seeds {
        let client = Client::open(*seed).map_err(|e| format!("{seed}: {e}"))?;
        let seed_node = Node {
            name: address(client.get_connection_info().addr()),
            client: client.clone(),
        };
        let mut c = match seed_node.connect() {
            Ok(c) => c,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let nodes: Result<String, _> = redis::cmd("CLUSTER").arg("NODES").query(&mut c);
        let nodes = match nodes {
            Ok(text) => text,
            Err(e) if e.to_string().contains("cluster support disabled") => {
                return Ok(Keyspace {
                    nodes: vec![seed_node],
                    cluster: false,
                    key_prefix: key_prefix.to_string(),
                })
            }
            Err(e) => {
                failures.push(format!("{seed}: CLUSTER NODES: {e}"));
                continue;
            }
        };
        let info = client.get_connection_info().clone();
        let mut masters = Vec::new();
        for (host, port) in masters_of(&nodes) {
            let addr = match info.addr() {
                ConnectionAddr::TcpTls {
                    insecure,
                    tls_params,
                    ..
                } => ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port,
                    insecure: *insecure,
                    tls_params: tls_params.clone(),
                },
                _ => ConnectionAddr::Tcp(host.clone(), port),
            };
            let client = Client::open(info.clone().set_addr(addr)).map_err(|e| e.to_string())?;
            masters.push(Node {
                name: format!("{host}:{port}"),
                client,
            });
        }
        return Ok(Keyspace {
            nodes: masters,
            cluster: true,
            key_prefix: key_prefix.to_string(),
        });
    }
    Err(format!("no seed answered: {}", failures.join("; ")))
}

fn address(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        other => other.to_string(),
    }
}

/// The masters `CLUSTER NODES` lists that serve slots and are not failing.
fn masters_of(nodes: &str) -> Vec<(String, u16)> {
    let mut out = Vec::new();
    for line in nodes.lines().take(10_000) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 9
            || !fields[2].split(',').any(|f| f == "master")
            || fields[2].contains("fail")
        {
            continue;
        }
        let addr = fields[1].split('@').next().unwrap_or("");
        if let Some((host, port)) = addr.rsplit_once(':') {
            if let Ok(port) = port.parse() {
                out.push((host.to_string(), port));
            }
        }
    }
    out
}

/// One name found under the prefix, and what was asked of it.
pub struct Found {
    pub name: Vec<u8>,
    pub what: KeyName,
    /// The value's length (as its name says), when asked.
    pub len: Option<u64>,
    /// Seconds since its last use (OBJECT IDLETIME), when asked and known.
    pub idle_s: Option<i64>,
}

/// SCANs master `node` for the names under the prefix, handing batches of
/// them to `f`; with `sizes`, each block's length and OBJECT IDLETIME too
/// (one pipeline per SCAN step). Returns how many names it found.
pub fn scan(
    ks: &Keyspace,
    node: usize,
    sizes: bool,
    mut f: impl FnMut(&mut Connection, Vec<Found>) -> Result<(), String>,
) -> Result<u64, String> {
    let mut c = ks.nodes[node].connect()?;
    let pattern = format!("{}:*", ks.key_prefix);
    let mut cursor = "0".to_string();
    let mut found = 0u64;
    for _ in 0..MAX_SCAN_STEPS {
        let (next, names): (String, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(&cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query(&mut c)
            .map_err(|e| format!("{}: SCAN: {e}", ks.nodes[node].name))?;
        if names.len() > MAX_SCAN_NAMES {
            return Err(format!(
                "{}: SCAN answered {} names for COUNT {SCAN_COUNT}",
                ks.nodes[node].name,
                names.len()
            ));
        }
        let mut batch: Vec<Found> = names
            .into_iter()
            .filter(|n| n.starts_with(&pattern.as_bytes()[..pattern.len() - 1]))
            .map(|name| Found {
                what: KeyName::parse(&ks.key_prefix, &name),
                name,
                len: None,
                idle_s: None,
            })
            .collect();
        if sizes && !batch.is_empty() {
            // OBJECT IDLETIME reads the key without using it; a size is the
            // name's (STRLEN would count as a use and reset the idle time).
            let mut pipe = redis::pipe();
            for key in &batch {
                pipe.cmd("OBJECT").arg("IDLETIME").arg(&key.name);
            }
            let answers: Vec<Value> = pipe
                .ignore_errors()
                .query(&mut c)
                .map_err(|e| format!("{}: OBJECT IDLETIME: {e}", ks.nodes[node].name))?;
            for (key, idle) in batch.iter_mut().zip(answers) {
                if let KeyName::Block {
                    block_bytes, tag, ..
                } = &key.what
                {
                    key.len = Some(value_len(*block_bytes, tag));
                }
                if let Value::Int(idle) = idle {
                    key.idle_s = Some(idle);
                }
            }
        }
        found += batch.len() as u64;
        if !batch.is_empty() {
            f(&mut c, batch)?;
        }
        if next == "0" {
            return Ok(found);
        }
        cursor = next;
    }
    Err(format!(
        "{}: SCAN did not end in {MAX_SCAN_STEPS} steps",
        ks.nodes[node].name
    ))
}

/// Runs `f` on every master at once (one thread each); the results in the
/// masters' order.
pub fn each_node<R: Send>(ks: &Keyspace, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..ks.nodes.len())
            .map(|i| {
                scope.spawn({
                    let f = &f;
                    move || f(i)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a node's thread panicked"))
            .collect()
    })
}

/// Whose a block name's fingerprint is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Owner {
    pub namespace_fp: u64,
    pub tenant: u64,
    pub sealed: bool,
    /// A generation before the tenant's current one (a clear left it).
    pub stale: bool,
}

/// Block fingerprints attributed to namespaces, per block size: from the
/// generation keys found (`generations`: name parts and value) and, for a
/// namespace named on the command line, its unsealed generation 0 where no
/// key says otherwise.
#[derive(Default)]
pub struct Attribution {
    map: HashMap<(u64, usize), Owner>,
}

impl Attribution {
    pub fn new(
        generations: &[(KeyName, Option<u64>)],
        named: Option<u64>,
        sizes: &[usize],
    ) -> Attribution {
        let mut a = Attribution::default();
        let mut unsealed_known = Vec::new();
        for (key, value) in generations {
            if let KeyName::Generation {
                namespace_fp,
                tenant,
                sealed,
                block_bytes,
            } = *key
            {
                a.add(
                    namespace_fp,
                    tenant,
                    sealed,
                    block_bytes,
                    value.unwrap_or(0),
                );
                if !sealed {
                    unsealed_known.push((namespace_fp, block_bytes));
                }
            }
        }
        if let Some(ns) = named {
            for &bb in sizes {
                if !unsealed_known.contains(&(ns, bb)) {
                    a.add(ns, 0, false, bb, 0);
                }
            }
        }
        a
    }

    fn add(
        &mut self,
        namespace_fp: u64,
        tenant: u64,
        sealed: bool,
        block_bytes: usize,
        generation: u64,
    ) {
        let (current, stale) = tenant_fingerprints(namespace_fp, tenant, generation);
        for (fps, stale) in [(current, false), (stale, true)] {
            for fp in fps {
                let owner = Owner {
                    namespace_fp,
                    tenant,
                    sealed,
                    stale,
                };
                self.map.insert((fp, block_bytes), owner);
            }
        }
    }

    pub fn owner(&self, fp: u64, block_bytes: usize) -> Option<Owner> {
        self.map.get(&(fp, block_bytes)).copied()
    }
}

/// What names a keyspace's blocks: the generation keys under the prefix on
/// every master, with their values, and the (fingerprint, block size) pairs
/// of the block names seen.
pub struct Names {
    pub generations: Vec<(KeyName, Option<u64>)>,
    /// The generation keys' names, in the order of `generations`.
    pub generation_keys: Vec<Vec<u8>>,
    pub groups: std::collections::BTreeSet<(u64, usize)>,
}

impl Names {
    /// The block sizes seen.
    pub fn sizes(&self) -> Vec<usize> {
        let mut sizes: Vec<usize> = self.groups.iter().map(|g| g.1).collect();
        sizes.dedup();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }
}

/// Reads the [`Names`] of a keyspace (a SCAN of every master, and a GET of
/// each generation key).
pub fn names(ks: &Keyspace) -> Result<Names, String> {
    let per_node = each_node(ks, |node| {
        let mut gens = Vec::new();
        let mut groups = std::collections::BTreeSet::new();
        scan(ks, node, false, |c, batch| {
            for found in batch {
                match found.what {
                    KeyName::Generation { .. } => {
                        let value: Option<String> =
                            redis::cmd("GET").arg(&found.name).query(c).ok().flatten();
                        gens.push((
                            found.name,
                            found.what,
                            value.and_then(|v| v.trim().parse().ok()),
                        ));
                    }
                    KeyName::Block {
                        fp, block_bytes, ..
                    } => {
                        groups.insert((fp, block_bytes));
                    }
                    KeyName::Other => {}
                }
            }
            Ok(())
        })?;
        Ok::<_, String>((gens, groups))
    });
    let mut all = Names {
        generations: Vec::new(),
        generation_keys: Vec::new(),
        groups: Default::default(),
    };
    for result in per_node {
        let (g, s) = result?;
        for (name, key, value) in g {
            all.generation_keys.push(name);
            all.generations.push((key, value));
        }
        all.groups.extend(s);
    }
    Ok(all)
}
