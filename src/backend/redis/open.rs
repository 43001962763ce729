//! Opening a Redis tier: the URLs checked (passwords redacted from every
//! message), the seeds asked whether they are a cluster, the pool (and a
//! cluster's router) made, and the server reached once.

use super::client::cluster::Router;
use super::client::conn::{Pool, Target};
use super::client::tls::SharedConfig;
use super::{RedisBackend, STRIPES};
use crate::backend::checksum::namespace_fingerprint;
use crate::config::{ClusterMode, RedisConfig};
use crate::error::{bail, Error, ErrorKind, Result};
use crate::seal::{NonceLedger, Sealer};
use crate::striped::Striped;
use redis::cluster::ClusterClient;
use redis::{Client, IntoConnectionInfo};
use std::time::Duration;

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

/// TCP_NODELAY: a pipeline's last partial segment must not wait for the
/// peer's acknowledgement of the previous ones (Nagle), which costs
/// milliseconds per job.
fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// Whether a seed is a cluster node (`INFO cluster`), asked with a short-lived
/// connection.
fn seed_is_cluster(
    client: &Client,
    timeout: Duration,
) -> std::result::Result<bool, redis::RedisError> {
    let mut c = client.get_connection_with_timeout(timeout)?;
    c.set_read_timeout(Some(timeout))?;
    let info: String = redis::cmd("INFO").arg("cluster").query(&mut c)?;
    Ok(info.contains("cluster_enabled:1"))
}

impl RedisBackend {
    pub(crate) fn open(
        cfg: &RedisConfig,
        namespace: &str,
        block_bytes: usize,
        io_threads: usize,
        seal: Option<Sealer>,
        io_timeout_ms: u32,
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
        for url in &cfg.urls {
            let info = match url.as_str().into_connection_info() {
                Ok(info) => info.set_tcp_settings(tcp_settings()),
                Err(e) => bail!(Config, "url: {} is not a usable URL: {e}", redact(url)),
            };
            match Client::open(info) {
                Ok(client) => seeds.push(client),
                Err(e) => bail!(Config, "url: {} is not a usable URL: {e}", redact(url)),
            }
        }
        let shown_seeds = cfg
            .urls
            .iter()
            .map(|u| redact(u))
            .collect::<Vec<_>>()
            .join(",");
        let cluster = match cfg.cluster {
            ClusterMode::On => true,
            ClusterMode::Off => false,
            ClusterMode::Auto => {
                let mut answer = None;
                let mut last_error = None;
                for seed in &seeds {
                    match seed_is_cluster(seed, timeout) {
                        Ok(is) => {
                            answer = Some(is);
                            break;
                        }
                        Err(e) => last_error = Some(e),
                    }
                }
                match (answer, last_error) {
                    (Some(is), _) => is,
                    (None, Some(e)) => return Err(open_error(&shown_seeds, &e)),
                    (None, None) => unreachable!("at least one seed"),
                }
            }
        };
        let target = if cluster {
            let client = ClusterClient::builder(cfg.urls.clone())
                .tcp_settings(tcp_settings())
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .retries(2)
                .build()
                .map_err(|e| open_error(&shown_seeds, &e))?;
            Target::Cluster(client)
        } else {
            if seeds.len() > 1 {
                bail!(
                    Config,
                    "url: {} seeds given for a single server (cluster=off, or not a cluster)",
                    seeds.len()
                );
            }
            Target::Single(seeds[0].clone())
        };
        let connections = cfg.connections.unwrap_or(io_threads);
        // Built by the first TLS connection, shared by every pool of the
        // tier (a cluster's masters each have one).
        let tls = SharedConfig::default();
        let router = if cluster {
            Router::new(&seeds, connections, timeout, tls.clone())
        } else {
            None
        };
        let backend = RedisBackend {
            pool: Pool::new(target, connections, timeout, tls),
            name_prefix: format!(
                "{}:{:016x}:b{block_bytes}:",
                cfg.key_prefix,
                namespace_fingerprint(namespace)
            ),
            namespace_fp: namespace_fingerprint(namespace),
            block_bytes,
            sharing: cfg.sharing,
            ttl_s: cfg.ttl_s,
            seeds,
            shown_seeds,
            connections,
            stripes: Striped::new(STRIPES, 2, || ()),
            seal,
            ledger: NonceLedger::new(),
            router,
        };
        // One round trip now: a wrong password or an unreachable server is a
        // clear tier_new error, not the first job's.
        if let Err(e) = backend.pool.ping() {
            return Err(open_error(&backend.shown_seeds, &e));
        }
        Ok(backend)
    }
}

/// An error of `tier_new` from the server: a refused password is a
/// configuration error, anything else an I/O one.
fn open_error(shown_seeds: &str, e: &redis::RedisError) -> Error {
    let auth = e.kind() == redis::ErrorKind::AuthenticationFailed
        || e.code()
            .is_some_and(|c| c == "WRONGPASS" || c == "NOAUTH" || c == "NOPERM");
    if auth {
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
