//! Opening a Redis tier: the URLs checked (passwords redacted from every
//! message), the seeds asked whether they are a cluster, the router made
//! (a single server: a slot map of one node), and the servers reached once.

use super::adopt::ADOPT_BUDGET_PER_BLOCK;
use super::client::{parse_url, Endpoint, RespConn, Router, SharedConfig, Value, MAP_REPLY};
use super::{Naming, RedisBackend, STRIPES};
use crate::backend::checksum::namespace_fingerprint;
use crate::config::{ClusterMode, RedisConfig};
use crate::error::{bail, Error, ErrorKind, Result};
use crate::seal::{NonceLedger, Sealer};
use crate::striped::Striped;
use crate::sync::{Mutex, RwLock};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `url` with any password replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(unparsable url)".into();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            let shown = if userinfo.contains(':') || user.is_empty() {
                format!("{user}:***")
            } else {
                "***".into()
            };
            format!("{scheme}://{shown}@{host}{path}")
        }
        None => url.to_string(),
    }
}

/// Reaches the first seed that answers, with a connection of its own
/// (AUTH and SELECT as its URL says): whether it is a cluster node (`INFO
/// cluster`), when `ask` (cluster=auto).
fn reach_seed(
    seeds: &[Endpoint],
    tls: &SharedConfig,
    timeout: Duration,
    ask: bool,
) -> io::Result<bool> {
    let mut last = None;
    for seed in seeds {
        let reached = (|| {
            let config = match seed.tls {
                true => Some(tls.get()?),
                false => None,
            };
            let deadline = Instant::now() + timeout;
            let mut c = RespConn::connect(seed, config.as_ref(), timeout, deadline)?;
            if !ask {
                return Ok(false);
            }
            c.cap_next(deadline);
            match c.call(&[b"INFO", b"cluster"], MAP_REPLY)? {
                Value::BulkString(info) => Ok(info
                    .windows(b"cluster_enabled:1".len())
                    .any(|w| w == b"cluster_enabled:1")),
                other => Err(io::Error::other(format!("INFO cluster answered {other:?}"))),
            }
        })();
        match reached {
            Ok(is) => return Ok(is),
            // A refused password is the same on every seed.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Err(e),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("at least one seed"))
}

impl RedisBackend {
    pub(crate) fn open(
        cfg: &RedisConfig,
        namespace: &str,
        block_bytes: usize,
        io_threads: usize,
        seal: Option<Sealer>,
        io_timeout_ms: u32,
        capacity_blocks: usize,
    ) -> Result<RedisBackend> {
        if cfg.urls.is_empty() {
            bail!(
                Config,
                "url: the redis backend needs a server (set \"url\" to redis://host:port)"
            );
        }
        if io_timeout_ms == 0 {
            bail!(
                Config,
                "io_timeout_ms: the redis backend needs a deadline (1..=600000); 0 turns off only the disk's"
            );
        }
        let timeout = Duration::from_millis(io_timeout_ms as u64);
        let mut seeds = Vec::new();
        for u in &cfg.urls {
            match parse_url(u) {
                Ok(seed) => seeds.push(seed),
                Err(e) => bail!(Config, "url: {} is not a usable URL: {e}", redact(u)),
            }
        }
        let shown_seeds = cfg
            .urls
            .iter()
            .map(|u| redact(u))
            .collect::<Vec<_>>()
            .join(",");
        if seeds.iter().any(|s| s.tls != seeds[0].tls) {
            bail!(
                Config,
                "url: {shown_seeds}: the seeds mix redis:// and rediss://; a cluster is reached one way (all redis://, or all rediss://)"
            );
        }
        // Built by the first TLS connection, shared by every pool of the
        // tier (a cluster's masters each have one).
        let tls = SharedConfig::default();
        // One round trip now: a wrong password or an unreachable server is a
        // clear tier_new error, not the first job's.
        let asked = reach_seed(&seeds, &tls, timeout, cfg.cluster == ClusterMode::Auto)
            .map_err(|e| open_error(&shown_seeds, &e))?;
        let cluster = match cfg.cluster {
            ClusterMode::On => true,
            ClusterMode::Off => false,
            ClusterMode::Auto => asked,
        };
        if !cluster && seeds.len() > 1 {
            bail!(
                Config,
                "url: {} seeds given for a single server (cluster=off, or not a cluster)",
                seeds.len()
            );
        }
        let connections = cfg.connections.unwrap_or(io_threads);
        let router = Router::open(seeds, cluster, connections, timeout, tls)
            .map_err(|e| open_error(&shown_seeds, &e))?;
        let namespace_fp = namespace_fingerprint(namespace);
        let name_prefix = format!("{}:{namespace_fp:016x}:b{block_bytes}:", cfg.key_prefix);
        Ok(RedisBackend {
            name_prefix: name_prefix.clone(),
            router,
            naming: RwLock::new(Naming {
                prefix: Arc::from(name_prefix.as_str()),
                fp: namespace_fp,
                generation: 0,
            }),
            generation: Default::default(),
            key_prefix: cfg.key_prefix.clone(),
            tenant: crate::backend::SharedTenant::of(seal.as_ref(), namespace_fp, block_bytes),
            namespace_fp,
            block_bytes,
            sharing: cfg.sharing,
            ttl_s: cfg.ttl_s,
            shown_seeds,
            connections,
            stripes: Striped::new(STRIPES, 2, || ()),
            seal,
            ledger: NonceLedger::new(),
            adopt_budget: capacity_blocks.saturating_mul(ADOPT_BUDGET_PER_BLOCK),
            adoption_stopped: Mutex::new(None),
        })
    }
}

/// An error of `tier_new` from the server: a refused password is a
/// configuration error, anything else an I/O one.
fn open_error(shown_seeds: &str, e: &io::Error) -> Error {
    if e.kind() == io::ErrorKind::PermissionDenied {
        Error::new(
            ErrorKind::Config,
            format!("url: {shown_seeds}: authentication failed: {e}"),
        )
    } else {
        Error::new(
            ErrorKind::Io,
            format!("url: cannot reach {shown_seeds}: {e}"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redact("redis://user:secret@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(redact("redis://:secret@host"), "redis://:***@host");
        assert_eq!(redact("redis://host:1"), "redis://host:1");
        assert!(!redact("redis://a:b:c@h").contains('b'));
    }
}
