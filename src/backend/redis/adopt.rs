//! Adopting an owned tier's keys at open: the keys of its namespace and
//! block size already on the server, or on every cluster master that
//! answers (a master down at open keeps its keys unadopted; see
//! docs/reliability-rules.md).

use super::client::conn::io_error;
use super::client::reply::Value;
use super::client::transport::RespConn;
use super::client::url::Endpoint;
use super::{format, sealed, RedisBackend};
use crate::error::{Error, ErrorKind, Result};
use crate::seal::RECORD_LEN;
use std::io;

/// Keys asked for per SCAN step when adopting a keyspace.
const SCAN_COUNT: &[u8] = b"1000";

/// A reply that is not what the command answers.
fn unexpected(what: &str, value: &Value) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{what} answered {value:?}"),
    )
}

/// `command`'s reply as bytes (a bulk string; an error reply is an error).
fn bulk(c: &mut RespConn, what: &str, args: &[&[u8]]) -> io::Result<Vec<u8>> {
    match c.call(args)? {
        Value::BulkString(bytes) => Ok(bytes),
        Value::Error(message) => Err(io::Error::other(message)),
        other => Err(unexpected(what, &other)),
    }
}

/// The masters in a `CLUSTER NODES` reply that are not failing, as
/// `host:port` pairs.
fn masters_of(nodes: &str) -> Vec<(String, u16)> {
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
        masters.push((host.to_string(), port));
    }
    masters
}

impl RedisBackend {
    /// The servers holding keys: the one server, or every cluster master
    /// (from `CLUSTER NODES` of the first seed that answers; a TLS
    /// cluster's nodes announce their TLS ports).
    pub(super) fn key_holders(&self) -> Result<Vec<Endpoint>> {
        let seeds = self.router.seeds();
        if !self.router.is_cluster() {
            return Ok(seeds.to_vec());
        }
        let mut last = None;
        for seed in seeds {
            let nodes = self
                .router
                .connect(seed)
                .and_then(|mut c| bulk(&mut c, "CLUSTER NODES", &[b"CLUSTER", b"NODES"]));
            match nodes {
                Ok(nodes) => {
                    let nodes = String::from_utf8_lossy(&nodes);
                    return Ok(masters_of(&nodes)
                        .into_iter()
                        .map(|(host, port)| seed.at(&host, port))
                        .collect());
                }
                Err(e) => last = Some(e),
            }
        }
        Err(io_error("CLUSTER NODES", &last.expect("at least one seed")))
    }

    /// Keys of this namespace and block size already on the server(s).
    pub(super) fn scan_keys(&self) -> Result<Vec<Vec<u8>>> {
        let pattern = format!("{}*", self.name_prefix);
        let mut found = Vec::new();
        let holders = self.key_holders()?;
        let mut failed = Vec::new();
        for holder in &holders {
            if let Err(e) = self.scan_holder(holder, &pattern, &mut found) {
                failed.push(format!("{}:{}: {}", holder.host, holder.port, e.message()));
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

    /// Adds the keys of this tier one server holds to `found`, walking
    /// them with SCAN (a key added or removed meanwhile may be seen or
    /// not, as SCAN promises).
    fn scan_holder(
        &self,
        holder: &Endpoint,
        pattern: &str,
        found: &mut Vec<Vec<u8>>,
    ) -> Result<()> {
        let mut walk = || -> io::Result<()> {
            let mut c = self.router.connect(holder)?;
            let mut cursor = b"0".to_vec();
            loop {
                let args: [&[u8]; 6] = [
                    b"SCAN",
                    &cursor,
                    b"MATCH",
                    pattern.as_bytes(),
                    b"COUNT",
                    SCAN_COUNT,
                ];
                let reply = c.call(&args)?;
                let (next, names) = match reply {
                    Value::Array(mut parts) if parts.len() == 2 => {
                        match (parts.remove(0), parts.remove(0)) {
                            (Value::BulkString(next), Value::Array(names)) => (next, names),
                            _ => return Err(unexpected("SCAN", &Value::Nil)),
                        }
                    }
                    Value::Error(message) => return Err(io::Error::other(message)),
                    other => return Err(unexpected("SCAN", &other)),
                };
                for name in names {
                    if let Value::BulkString(name) = name {
                        self.adopt_name(&mut c, name, found)?;
                    }
                }
                if next == b"0" {
                    return Ok(());
                }
                cursor = next;
            }
        };
        walk().map_err(|e| io_error("adopting keys", &e))
    }

    /// Adds the key a value's name stands for to `found`, if the name is
    /// one this tier writes (a sealed or hashed name: its record or header,
    /// read with GETRANGE, says which key).
    fn adopt_name(
        &self,
        c: &mut RespConn,
        name: Vec<u8>,
        found: &mut Vec<Vec<u8>>,
    ) -> io::Result<()> {
        if let Some(seal) = self.sealed() {
            if !sealed::is_sealed_name(&self.name_prefix, &name) {
                return Ok(());
            }
            let last = (RECORD_LEN - 1).to_string();
            let record = bulk(c, "GETRANGE", &[b"GETRANGE", &name, b"0", last.as_bytes()])?;
            let opened = seal.open_key(self.namespace_fp, self.block_bytes, &record);
            if let Some((key, nonce)) = opened {
                if self.name(&key).as_bytes() == name.as_slice() {
                    self.ledger.record(&key, nonce);
                    found.push(key);
                }
            }
            return Ok(());
        }
        match format::key_from_name(&self.name_prefix, &name) {
            Some(key) => found.push(key),
            None => {
                // A hashed name: the key is in the value's header.
                let last = (format::header_len(crate::MAX_KEY_LEN) - 1).to_string();
                let head = bulk(c, "GETRANGE", &[b"GETRANGE", &name, b"0", last.as_bytes()])?;
                if let Ok(h) = format::read_header(&head) {
                    if self.name(h.key).as_bytes() == name.as_slice() {
                        found.push(h.key.to_vec());
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::masters_of;

    #[test]
    fn live_masters_are_read_from_cluster_nodes() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001 master,fail - 0 0 2 disconnected
c3 127.0.0.1:7002@17002 slave a1 0 0 1 connected
d4 10.0.0.5:7003@17003,host.example master - 0 0 3 connected 5461-16383
";
        assert_eq!(
            masters_of(nodes),
            vec![("127.0.0.1".into(), 7000), ("10.0.0.5".into(), 7003)]
        );
    }
}
