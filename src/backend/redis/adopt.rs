//! Adopting an owned tier's keys at open: the keys of its namespace and
//! block size already on the server, or on every cluster master that
//! answers (a master down at open keeps its keys unadopted; see
//! docs/reliability-rules.md).

use super::client::conn::io_error;
use super::{format, sealed, RedisBackend};
use crate::error::{Error, ErrorKind, Result};
use crate::seal::RECORD_LEN;
use redis::{Client, ConnectionAddr};
use std::time::Duration;

/// Keys asked for per SCAN step when adopting a keyspace.
const SCAN_COUNT: usize = 1000;

impl RedisBackend {
    /// The servers holding keys: the one server, or every cluster master
    /// (from `CLUSTER NODES` of the first seed that answers).
    fn key_holders(&self) -> Result<Vec<Client>> {
        if !self.pool.is_cluster() {
            return Ok(self.seeds.clone());
        }
        let mut last = None;
        for seed in &self.seeds {
            let nodes: std::result::Result<String, _> = seed
                .get_connection_with_timeout(Duration::from_secs(5))
                .and_then(|mut c| redis::cmd("CLUSTER").arg("NODES").query(&mut c));
            match nodes {
                Ok(nodes) => {
                    let mut masters = Vec::new();
                    for line in nodes.lines() {
                        let fields: Vec<&str> = line.split_whitespace().collect();
                        let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
                            continue;
                        };
                        if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                            continue;
                        }
                        let hostport = addr.split('@').next().unwrap_or("");
                        let Some((host, port)) = hostport.rsplit_once(':') else {
                            continue;
                        };
                        let Ok(port) = port.parse::<u16>() else {
                            continue;
                        };
                        let info = seed.get_connection_info();
                        // Over the seed's transport: a TLS cluster's
                        // nodes announce their TLS ports.
                        let addr = match info.addr() {
                            ConnectionAddr::TcpTls {
                                insecure,
                                tls_params,
                                ..
                            } => ConnectionAddr::TcpTls {
                                host: host.to_string(),
                                port,
                                insecure: *insecure,
                                tls_params: tls_params.clone(),
                            },
                            _ => ConnectionAddr::Tcp(host.to_string(), port),
                        };
                        let info = info.clone().set_addr(addr);
                        masters.push(Client::open(info).map_err(|e| io_error("cluster node", &e))?);
                    }
                    return Ok(masters);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(io_error(
            "CLUSTER NODES",
            last.as_ref().expect("at least one seed"),
        ))
    }

    /// Keys of this namespace and block size already on the server(s).
    pub(super) fn scan_keys(&self) -> Result<Vec<Vec<u8>>> {
        let pattern = format!("{}*", self.name_prefix);
        let mut found = Vec::new();
        let holders = self.key_holders()?;
        let mut failed = Vec::new();
        for holder in &holders {
            if let Err(e) = self.scan_holder(holder, &pattern, &mut found) {
                failed.push(format!(
                    "{}: {}",
                    holder.get_connection_info().addr(),
                    e.message()
                ));
            }
        }
        // A master down at open (its slots fail on their own deadline) keeps
        // its keys unadopted; a cluster none of whose masters answer fails.
        if !holders.is_empty() && failed.len() == holders.len() {
            return Err(Error::new(
                ErrorKind::Io,
                format!("redis: adopting keys: {}", failed.join("; ")),
            ));
        }
        Ok(found)
    }

    /// Adds the keys of this tier one server holds to `found`.
    fn scan_holder(&self, holder: &Client, pattern: &str, found: &mut Vec<Vec<u8>>) -> Result<()> {
        let mut con = holder
            .get_connection_with_timeout(Duration::from_secs(5))
            .map_err(|e| io_error("adopting keys", &e))?;
        scan_matching(&mut con, pattern, |con, names| {
            for name in names {
                if let Some(seal) = self.sealed() {
                    if !sealed::is_sealed_name(&self.name_prefix, &name) {
                        continue;
                    }
                    let record: Vec<u8> = redis::cmd("GETRANGE")
                        .arg(&name)
                        .arg(0)
                        .arg(RECORD_LEN - 1)
                        .query(con)
                        .map_err(|e| io_error("GETRANGE", &e))?;
                    let opened = seal.open_key(self.namespace_fp, self.block_bytes, &record);
                    if let Some((key, nonce)) = opened {
                        if self.name(&key).as_bytes() == name.as_slice() {
                            self.ledger.record(&key, nonce);
                            found.push(key);
                        }
                    }
                    continue;
                }
                match format::key_from_name(&self.name_prefix, &name) {
                    Some(key) => found.push(key),
                    None => {
                        // A hashed name: the key is in the value's header.
                        let head: Vec<u8> = redis::cmd("GETRANGE")
                            .arg(&name)
                            .arg(0)
                            .arg(format::header_len(crate::MAX_KEY_LEN) - 1)
                            .query(con)
                            .map_err(|e| io_error("GETRANGE", &e))?;
                        if let Ok(h) = format::read_header(&head) {
                            if self.name(h.key).as_bytes() == name.as_slice() {
                                found.push(h.key.to_vec());
                            }
                        }
                    }
                }
            }
            Ok(())
        })
    }
}

/// Walks the keys matching `pattern` (a SCAN `MATCH` pattern) on one server,
/// handing each step's names to `each` with the connection, on which it may
/// send commands of its own: the loop the Redis backend adopts its keys
/// with, public for tools that clean up after a tier (the bench). A key
/// added or removed during the walk may be seen or not, as SCAN promises.
pub fn scan_matching<C: redis::ConnectionLike>(
    con: &mut C,
    pattern: &str,
    mut each: impl FnMut(&mut C, Vec<Vec<u8>>) -> Result<()>,
) -> Result<()> {
    let mut cursor: u64 = 0;
    loop {
        let (next, names): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query(con)
            .map_err(|e| io_error("SCAN", &e))?;
        each(con, names)?;
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}
