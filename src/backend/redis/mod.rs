//! The Redis backend: blocks as values on a Redis or Valkey server, or a
//! Redis Cluster, so that a fleet of engines can share one keyspace.
//!
//! What it guarantees, beyond the common contract:
//! - Every value carries a header (magic, version, namespace fingerprint,
//!   block size, full key, payload checksum) checked on every load: a
//!   mismatch fails that block with TIER_ERR_CORRUPT, the value is deleted
//!   and the key becomes a MISS. A key the server no longer has (evicted,
//!   expired, server restarted empty) fails with TIER_ERR_NOT_FOUND and
//!   becomes a MISS: never stale or wrong bytes.
//! - Every server operation has a deadline (`io_timeout_ms`); a server that
//!   is down fails jobs with TIER_ERR_IO on time, and the pool reconnects
//!   with backoff when it returns (see `client::conn`).
//! - `sharing=owned`: this tier's index is the truth; its LRU evicts by
//!   deleting keys (publish and delete of one key are serialised, and a key
//!   live again is never deleted), and reopening adopts the keys already on
//!   the server. `sharing=shared`: keys absent from the index are probed on
//!   the server (lookup answers PENDING, then HIT or MISS); local eviction
//!   deletes nothing; the server's `maxmemory` policy and `ttl_s` bound the
//!   total.
//! - A URL's password never appears in a message or in `tier_describe`.
//! - `rediss://` uses TLS (rustls, on kvtier's own connection: the same
//!   data path as plain TCP, for a single server and for a cluster's
//!   masters alike); the server's certificate is checked against the
//!   system's roots (`SSL_CERT_FILE` names another bundle), as the crate
//!   checks it. One client configuration per tier, shared by its pools.
//!
//! Files: `format` (key names and the value layout), `sealed` (sealed
//! names and values), `adopt` (an owned tier's keys found on the servers at
//! open), `direct` (the data path over kvtier's connection: payloads
//! written from and read into rows), `routed` (a cluster's data path: what
//! each pass carries, blocks redirected retried through the crate), and
//! `client`, what speaks to the servers: kvtier's RESP connection over TCP
//! or TLS (`transport`, `connect`, `send`, `receive`, `reply`, `frame`,
//! `crate_adapter`, `tls`), the pool (`conn`), the crate's pipelines
//! (`pipe`: for redirected blocks, a cluster whose seeds mix TCP and TLS,
//! and everything but the data path of a cluster), a cluster's slot map and
//! a pool per master (`cluster`), and one pass of a cluster job over its
//! masters (`fanout`: pipelines sent to all, replies read first-come).

mod adopt;
mod client;
mod direct;
mod format;
mod routed;
mod sealed;

use self::client::cluster::Router;
use self::client::conn::{io_error, Conn, Pool, Target};
use self::client::pipe::Pipe;
use self::client::tls::SharedConfig;
use self::direct::{Fetched, Layout};
use self::routed::KeyCommand;
use self::sealed::SealedLayout;
use super::checksum::{namespace_fingerprint, xxh64};
use super::Backend;
use crate::config::{ClusterMode, RedisConfig, Sharing};
use crate::error::{bail, Error, ErrorKind, Result};
use crate::seal::{NonceLedger, Sealer, RECORD_LEN};
use crate::sync::Mutex;
use redis::cluster::ClusterClient;
use redis::{Client, IntoConnectionInfo, RedisWrite, ToRedisArgs};
use std::time::Duration;

/// Locks serialising publish (SET) and delete (DEL) of one key. A batch
/// holds its keys' locks for a whole network round trip, so there are many
/// (one byte each): two jobs in flight share one with probability about
/// (16 x 16) / 65536 for jobs of 16 blocks, instead of most of the time.
const STRIPES: usize = 65_536;

/// The stripe lock that serializes stores and deletes of `key`.
fn stripe_of(key: &[u8]) -> usize {
    xxh64(key, 2) as usize % STRIPES
}

/// Blocks per task of a store job that evicts nothing (standalone server;
/// see `min_growing_task_bytes`).
const FILLING_TASK_BLOCKS: usize = 2;

/// A block's value as one command argument, written straight into the
/// command buffer (no intermediate copy of the payload).
struct Value<'a> {
    namespace_fp: u64,
    key: &'a [u8],
    payload: &'a [u8],
}

impl ToRedisArgs for Value<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        // Room first: a 2 MiB value written into a growing buffer would be
        // copied again at every doubling.
        out.reserve_space_for_args([format::header_len(self.key.len()) + self.payload.len()]);
        let mut arg = out.writer_for_next_arg();
        // Writing into the command's own buffer cannot fail.
        format::write_value(&mut arg, self.namespace_fp, self.key, self.payload)
            .expect("writing into memory");
    }
}

/// A block's value as a command argument.
enum ValueArg<'a> {
    Plain(Value<'a>),
    /// Record and ciphertext, and the nonce it was sealed with.
    Sealed(Vec<u8>, crate::seal::Nonce),
}

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

pub(crate) struct RedisBackend {
    pool: Pool,
    /// Key names start with this: `<prefix>:<fingerprint>:b<block_bytes>:`.
    name_prefix: String,
    namespace_fp: u64,
    block_bytes: usize,
    sharing: Sharing,
    ttl_s: u64,
    /// The seeds, for adopting keys at open (owned mode).
    seeds: Vec<Client>,
    shown_seeds: String,
    connections: usize,
    /// Serialise publish (SET) and delete (DEL) of the same key.
    stripes: Vec<Mutex<()>>,
    /// The tenant's keys when the tier is sealed (see `sealed`).
    seal: Option<Sealer>,
    /// The version of each sealed block this process last wrote or saw.
    ledger: NonceLedger,
    /// A cluster over TCP or TLS: the data path's routing to its masters
    /// (`pool` still serves every other command).
    router: Option<Router>,
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
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
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

    /// `SET <name> <value> [EX ttl_s]` for one block.
    fn set_command(&self, key: &[u8], value: &ValueArg) -> redis::Cmd {
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.name(key));
        match value {
            ValueArg::Plain(value) => cmd.arg(value),
            ValueArg::Sealed(value, _) => cmd.arg(value.as_slice()),
        };
        if self.ttl_s > 0 {
            cmd.arg("EX").arg(self.ttl_s);
        }
        cmd
    }

    fn name(&self, key: &[u8]) -> String {
        match self.sealed() {
            Some(seal) => {
                let tag = seal
                    .sealer
                    .name_tag(self.namespace_fp, self.block_bytes, key);
                let mut name = Vec::with_capacity(sealed::name_len(&self.name_prefix));
                sealed::write_name(&mut name, &self.name_prefix, &tag);
                String::from_utf8(name).expect("prefix, hex digits and braces")
            }
            None => format::key_name(&self.name_prefix, key),
        }
    }

    fn sealed(&self) -> Option<SealedLayout<'_>> {
        self.seal.as_ref().map(|sealer| SealedLayout {
            sealer,
            ledger: &self.ledger,
        })
    }

    /// A block's value as stored: sealed into a buffer of its own, or
    /// header and payload written straight into the command.
    fn value_arg<'a>(&self, key: &'a [u8], block: &'a [u8]) -> Result<ValueArg<'a>> {
        let Some(seal) = self.sealed() else {
            return Ok(ValueArg::Plain(Value {
                namespace_fp: self.namespace_fp,
                key,
                payload: block,
            }));
        };
        let mut value = vec![0u8; sealed::value_len(block.len())];
        let nonce = seal.seal_into(self.namespace_fp, key, block, &mut value)?;
        Ok(ValueArg::Sealed(value, nonce))
    }

    fn layout(&self) -> Layout<'_> {
        Layout {
            name_prefix: &self.name_prefix,
            namespace_fp: self.namespace_fp,
            block_bytes: self.block_bytes,
            ttl_s: self.ttl_s,
            seal: self.sealed(),
        }
    }

    fn stripe(&self, key: &[u8]) -> &Mutex<()> {
        &self.stripes[stripe_of(key)]
    }

    /// The stripe locks of every key, each once, taken in ascending order,
    /// so two batches never wait on each other.
    fn lock_stripes<'k>(
        &self,
        keys: impl Iterator<Item = &'k [u8]>,
    ) -> Vec<crate::sync::MutexGuard<'_, ()>> {
        let mut stripes: Vec<usize> = keys.map(stripe_of).collect();
        stripes.sort_unstable();
        stripes.dedup();
        stripes.iter().map(|&s| self.stripes[s].lock()).collect()
    }

    /// Checks a value against the header this tier would write for `key`;
    /// copies its payload into `dst` if it is good.
    fn verify_into(
        &self,
        value: &mut [u8],
        key: &[u8],
        dst: &mut [u8],
    ) -> std::result::Result<(), String> {
        if let Some(seal) = self.sealed() {
            if value.len() != sealed::value_len(self.block_bytes) {
                return Err(format!(
                    "value of {} bytes for a sealed block of {}",
                    value.len(),
                    self.block_bytes
                ));
            }
            // Decrypted in the private copy: only it may condemn the value.
            let (record, payload) = value.split_at_mut(RECORD_LEN);
            seal.unseal(self.namespace_fp, self.block_bytes, key, record, payload)?;
            dst.copy_from_slice(payload);
            return Ok(());
        }
        let sum =
            format::check_header(value, value.len(), self.namespace_fp, key, self.block_bytes)?;
        let payload = &value[value.len() - self.block_bytes..];
        if !sum.matches(payload) {
            return Err("payload checksum mismatch".into());
        }
        dst.copy_from_slice(payload);
        Ok(())
    }

    /// A GET's answer for `key`: copied into `dst` if it is this block, else
    /// NotFound (no value) or Corrupt (the bad value is deleted, so that it
    /// cannot fail every later load).
    fn check_value(
        &self,
        name: &str,
        value: Option<Vec<u8>>,
        key: &[u8],
        dst: &mut [u8],
    ) -> Result<()> {
        let Some(mut value) = value else {
            return Err(self.not_found(name));
        };
        if let Err(problem) = self.verify_into(&mut value, key, dst) {
            return Err(self.condemn(name, &problem));
        }
        Ok(())
    }

    fn not_found(&self, name: &str) -> Error {
        Error::new(
            ErrorKind::NotFound,
            format!("redis: {name}: not on the server (evicted, expired or never stored)"),
        )
    }

    /// Deletes a value proved not to be this block (so that it cannot fail
    /// every later load) and returns the load's Corrupt error. A sealed tier
    /// in a shared keyspace deletes nothing: a value that does not
    /// authenticate under its key may be another tenant's; it is a miss.
    fn condemn(&self, name: &str, problem: &str) -> Error {
        if self.seal.is_some() && self.sharing == Sharing::Shared {
            return Error::new(
                ErrorKind::NotFound,
                format!("redis: {name}: {problem}; a miss, left in place (shared)"),
            );
        }
        let _ = self
            .pool
            .with("DEL", |c| redis::cmd("DEL").arg(name).query::<i64>(c));
        Error::new(
            ErrorKind::Corrupt,
            format!("redis: {name}: {problem}; value deleted"),
        )
    }

    /// A GET the server refused: a value of another type under a block's
    /// name (WRONGTYPE) is no block, as garbage is; any other refusal may
    /// pass.
    fn get_refused(&self, name: &str, message: &str) -> Error {
        if message.starts_with("WRONGTYPE") {
            return self.condemn(name, "a value of another type than a string");
        }
        server_error("GET", message)
    }

    /// [`Self::get_refused`] for a GET the crate sent.
    fn get_failed(&self, name: &str, e: &redis::RedisError) -> Error {
        if is_wrong_type(e) {
            return self.condemn(name, "a value of another type than a string");
        }
        io_error("GET", e)
    }

    /// The outcomes of a direct GET pipeline (payloads already in rows),
    /// in order until `done` says stop. Condemning a value (DEL) and the
    /// private re-read of a payload whose checksum failed in its row happen
    /// here, after the pipeline's connection went back to the pool.
    fn report_fetched(
        &self,
        blocks: &mut [(u32, &[u8], &mut [u8])],
        fetched: Vec<Fetched>,
        done: &mut dyn FnMut(usize, Result<()>) -> bool,
    ) {
        for (i, ((slot, key, dst), outcome)) in blocks.iter_mut().zip(fetched).enumerate() {
            if !done(i, self.judge(*slot, key, dst, outcome)) {
                return;
            }
        }
    }

    /// A block's outcome from what its direct GET brought.
    fn judge(&self, slot: u32, key: &[u8], dst: &mut [u8], fetched: Fetched) -> Result<()> {
        match fetched {
            Fetched::Good => Ok(()),
            Fetched::Missing => Err(self.not_found(&self.name(key))),
            Fetched::Refused(message) => Err(self.get_refused(&self.name(key), &message)),
            Fetched::Bad(problem) => Err(self.condemn(&self.name(key), &problem)),
            Fetched::Recheck => self.load(slot, key, dst),
        }
    }

    /// The crate's SET pipeline (redirected blocks, a cluster without a
    /// router) for `blocks`, each value packed into the command; block i's
    /// outcome is `replies[i]`.
    fn store_by_crate(
        &self,
        conn: &mut Conn,
        blocks: &[(u32, &[u8], &[u8])],
    ) -> std::result::Result<Vec<Result<()>>, redis::RedisError> {
        let values = blocks
            .iter()
            .map(|&(_, key, block)| self.value_arg(key, block))
            .collect::<Result<Vec<_>>>();
        let values = match values {
            Ok(values) => values,
            Err(e) => return Ok(vec![Err(e); blocks.len()]),
        };
        let set = |i: usize| self.set_command(blocks[i].1, &values[i]);
        let replies: Vec<Result<()>> = pipelined::<redis::Value>(conn, blocks.len(), set)?
            .into_iter()
            .map(|r| r.map(drop).map_err(|e| io_error("SET", &e)))
            .collect();
        for ((reply, value), &(_, key, _)) in replies.iter().zip(&values).zip(blocks) {
            if let (Ok(()), ValueArg::Sealed(_, nonce)) = (reply, value) {
                self.ledger.record(key, *nonce);
            }
        }
        Ok(replies)
    }

    /// `<command> <name>` for each key (DEL, TOUCH) through the crate, as
    /// one pipeline whose replies are dropped (redirected keys, a server
    /// behind a Unix socket, a cluster without a router).
    fn keys_by_crate(
        &self,
        conn: &mut Conn,
        command: &str,
        keys: &[&[u8]],
    ) -> std::result::Result<(), redis::RedisError> {
        let make = |i: usize| redis::cmd(command).arg(self.name(keys[i])).take();
        pipelined::<redis::Value>(conn, keys.len(), make).map(drop)
    }

    /// The crate's GET pipeline (redirected blocks, a cluster without a
    /// router) for the blocks named `names`: one reply per name (judge it with `check_value`), or the
    /// pipeline's failure.
    fn get_by_crate(&self, names: &[String]) -> Result<Vec<redis::RedisResult<Option<Vec<u8>>>>> {
        let get = |i: usize| redis::cmd("GET").arg(&names[i]).take();
        let values = self.pool.with_conn("GET pipeline", |conn| {
            pipelined::<Option<Vec<u8>>>(conn, names.len(), get)
        })?;
        if values.len() != names.len() {
            return Err(Error::new(
                ErrorKind::Io,
                format!("redis: {} replies to {} GETs", values.len(), names.len()),
            ));
        }
        Ok(values)
    }

    /// The crate's GET pipeline (a cluster without a router, a Unix
    /// socket): each value
    /// copied into its row once verified.
    fn load_batch_by_crate(
        &self,
        blocks: &mut [(u32, &[u8], &mut [u8])],
        done: &mut dyn FnMut(usize, Result<()>) -> bool,
    ) {
        let names: Vec<String> = blocks.iter().map(|(_, key, _)| self.name(key)).collect();
        let values = match self.get_by_crate(&names) {
            Ok(values) => values,
            Err(e) => {
                done(0, Err(e));
                return;
            }
        };
        for (i, ((_, key, dst), value)) in blocks.iter_mut().zip(values).enumerate() {
            let outcome = match value {
                Ok(value) => self.check_value(&names[i], value, key, dst),
                Err(e) => Err(self.get_failed(&names[i], &e)),
            };
            if !done(i, outcome) {
                return;
            }
        }
    }
}

/// Sends commands `make(0..n)` as one pipeline and returns each reply. In a
/// cluster whose slots are moving, the crate's pipeline does not follow
/// MOVED/ASK: then the commands are made again and sent one by one, which
/// the cluster connection redirects. A failure of the connection itself (a
/// dead node) fails the whole pipeline at once, without retrying command by
/// command.
fn pipelined<T: redis::FromRedisValue>(
    conn: &mut client::conn::Conn,
    n: usize,
    make: impl Fn(usize) -> redis::Cmd,
) -> std::result::Result<Vec<redis::RedisResult<T>>, redis::RedisError> {
    let mut pipe = Pipe::new(conn);
    for i in 0..n {
        pipe.add(make(i));
    }
    match pipe.query::<Vec<T>>(conn) {
        Ok(replies) => Ok(replies.into_iter().map(Ok).collect()),
        // One command's refusal fails the crate's whole pipeline: one by
        // one, each gets its own answer.
        Err(e) if redirected(&e) || is_wrong_type(&e) || wrong_type_within(&e) => {
            Ok((0..n).map(|i| make(i).query(conn.like())).collect())
        }
        Err(e) => Err(e),
    }
}

/// Whether the server refused a command on a value of another type.
fn is_wrong_type(e: &redis::RedisError) -> bool {
    e.code() == Some("WRONGTYPE")
}

/// Whether a pipeline failed because the server refused a command on a
/// value of another type.
fn wrong_type_within(e: &redis::RedisError) -> bool {
    e.clone()
        .into_server_errors()
        .is_some_and(|errors| errors.iter().any(|(_, err)| err.code() == "WRONGTYPE"))
}

/// Whether a pipeline failed because slots are moving (MOVED, ASK, TRYAGAIN).
fn redirected(e: &redis::RedisError) -> bool {
    use redis::ServerErrorKind::{Ask, Moved, TryAgain};
    e.clone().into_server_errors().is_some_and(|errors| {
        errors
            .iter()
            .any(|(_, err)| matches!(err.kind(), Some(Moved | Ask | TryAgain)))
    })
}

/// A server's error reply to one command of a pipeline (the connection
/// stays usable).
fn server_error(what: &str, message: &str) -> Error {
    Error::new(ErrorKind::Io, format!("redis: {what}: {message}"))
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

impl Backend for RedisBackend {
    fn store(&self, _slot: u32, key: &[u8], block: &[u8]) -> Result<u64> {
        let value = self.value_arg(key, block)?;
        let cmd = self.set_command(key, &value);
        let _guard = self.stripe(key).lock();
        self.pool.with("SET", |c| cmd.query::<()>(c))?;
        if let ValueArg::Sealed(_, nonce) = value {
            self.ledger.record(key, nonce);
        }
        Ok(self.block_bytes as u64)
    }

    fn load(&self, _slot: u32, key: &[u8], dst: &mut [u8]) -> Result<()> {
        let name = self.name(key);
        let value = self.pool.with("GET", |c| {
            match redis::cmd("GET").arg(&name).query::<Option<Vec<u8>>>(c) {
                Err(e) if is_wrong_type(&e) => Ok(Err(e)),
                other => other.map(Ok),
            }
        })?;
        match value {
            Ok(value) => self.check_value(&name, value, key, dst),
            Err(e) => Err(self.get_failed(&name, &e)),
        }
    }

    fn batches(&self) -> bool {
        true
    }

    /// One pipeline of SETs for the task's blocks (per node in a cluster),
    /// under the blocks' stripe locks. A failed pipeline fails all of them.
    fn store_batch(
        &self,
        blocks: &[(u32, &[u8], &[u8])],
        done: &mut dyn FnMut(usize, Result<u64>),
    ) {
        let _guards = self.lock_stripes(blocks.iter().map(|&(_, key, _)| key));
        if let Some(router) = &self.router {
            return self.store_routed(router, blocks, done);
        }
        let sent = self.pool.with_conn("SET pipeline", |conn| {
            if let Conn::Direct(c) = conn {
                let mut replies = Vec::with_capacity(blocks.len());
                direct::set_pipeline(c, &self.layout(), blocks, &mut replies)?;
                return Ok(replies
                    .into_iter()
                    .map(|r| r.map_err(|m| server_error("SET", &m)))
                    .collect::<Vec<_>>());
            }
            self.store_by_crate(conn, blocks)
        });
        for i in 0..blocks.len() {
            done(
                i,
                match &sent {
                    Ok(replies) => match &replies[i] {
                        Ok(()) => Ok(self.block_bytes as u64),
                        Err(e) => Err(e.clone()),
                    },
                    Err(e) => Err(e.clone()),
                },
            );
        }
    }

    /// One pipeline of GETs for the task's blocks (per master in a
    /// cluster), then each value verified (in its row on the direct path,
    /// else copied into it once verified), reported in order until the first
    /// failure.
    fn load_batch(
        &self,
        blocks: &mut [(u32, &[u8], &mut [u8])],
        done: &mut dyn FnMut(usize, Result<()>) -> bool,
    ) {
        if let Some(router) = &self.router {
            return self.load_routed(router, blocks, done);
        }
        let mut fetched = Vec::with_capacity(blocks.len());
        let direct = self.pool.with_conn("GET pipeline", |conn| match conn {
            Conn::Direct(c) => {
                direct::get_pipeline(c, &self.layout(), blocks, &mut fetched)?;
                Ok(true)
            }
            _ => Ok(false),
        });
        match direct {
            Ok(true) => self.report_fetched(blocks, fetched, done),
            Ok(false) => self.load_batch_by_crate(blocks, done),
            Err(e) => {
                done(0, Err(e));
            }
        }
    }

    fn forwards_touches(&self) -> bool {
        true
    }

    /// One pipeline of `TOUCH`es (on a single server up to 256 keys each;
    /// in a cluster one key each, a pipeline per master, so that a dead
    /// master costs only its own keys' touches), so that the server's LRU
    /// follows what the engines use.
    fn touch(&self, keys: &[u8], key_len: usize) {
        let keys: Vec<&[u8]> = keys.chunks_exact(key_len).collect();
        if let Some(router) = &self.router {
            return self.best_effort_routed(router, KeyCommand::Touch, &keys);
        }
        let _ = self.pool.with_conn("TOUCH pipeline", |conn| {
            if let Conn::Direct(c) = conn {
                direct::variadic_pipeline(c, &self.layout(), "TOUCH", &keys)?;
                return Ok(());
            }
            self.keys_by_crate(conn, "TOUCH", &keys)
        });
    }

    fn wants_discards(&self) -> bool {
        self.sharing == Sharing::Owned
    }

    /// One pipeline of `DEL`s (on a single server up to 256 keys each; in a
    /// cluster one key each, a pipeline per node) for the released keys not
    /// stored again meanwhile, under their stripe locks, so that no store of
    /// the same key runs between the liveness check and the delete.
    fn discard(&self, released: &[(u32, Vec<u8>)], is_live: &dyn Fn(&[u8]) -> bool) {
        let _guards = self.lock_stripes(released.iter().map(|(_, key)| key.as_slice()));
        let dead: Vec<&[u8]> = released
            .iter()
            .map(|(_, key)| key.as_slice())
            .filter(|key| !is_live(key))
            .collect();
        if dead.is_empty() {
            return;
        }
        // Best effort, like a single DEL: a block left behind is found again
        // by the next open's adoption scan or expires with `ttl_s`.
        match &self.router {
            Some(router) => self.best_effort_routed(router, KeyCommand::Del, &dead),
            None => {
                let _ = self.pool.with_conn("DEL pipeline", |conn| {
                    if let Conn::Direct(c) = conn {
                        // A server's refusal of one DEL leaves its keys, as
                        // the crate's pipeline does.
                        direct::variadic_pipeline(c, &self.layout(), "DEL", &dead)?;
                        return Ok(());
                    }
                    self.keys_by_crate(conn, "DEL", &dead)
                });
            }
        }
        for key in dead {
            self.ledger.forget(key);
        }
    }

    fn recover(&self) -> Result<Vec<Vec<u8>>> {
        match self.sharing {
            Sharing::Owned => self.scan_keys(),
            // A shared keyspace is learnt key by key, by probes.
            Sharing::Shared => Ok(Vec::new()),
        }
    }

    fn probes_absent_keys(&self) -> bool {
        self.sharing == Sharing::Shared
    }

    fn probe(&self, key: &[u8], record: &mut dyn FnMut(bool)) {
        self.probe_many(&[key.to_vec()], &mut |_, found| record(found));
    }

    fn probes_in_batches(&self) -> bool {
        true
    }

    /// One pipeline of `EXISTS`, one per key (in a cluster one per master,
    /// kvtier's own, so that a dead master costs only its own keys).
    fn probe_many(&self, keys: &[Vec<u8>], record: &mut dyn FnMut(usize, bool)) {
        if let Some(router) = &self.router {
            let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            return self.probe_routed(router, &keys, record);
        }
        let exists = |i: usize| redis::cmd("EXISTS").arg(self.name(&keys[i])).take();
        // Unknown (server unreachable) reads as absent: a MISS, not a wait.
        let counts = self
            .pool
            .with_conn("EXISTS pipeline", |conn| {
                pipelined::<i64>(conn, keys.len(), exists)
            })
            .ok()
            .filter(|counts| counts.len() == keys.len());
        for i in 0..keys.len() {
            let found = counts
                .as_ref()
                .is_some_and(|c| c[i].as_ref().is_ok_and(|&n| n > 0));
            record(i, found);
        }
    }

    fn min_task_bytes(&self) -> usize {
        // A job is one task: its blocks travel in one pipeline.
        usize::MAX
    }

    /// Tasks of two blocks, each its own pipeline on its own connection,
    /// while the tier fills up. Every value is then new memory the server
    /// faults in, and it takes such values faster from several connections
    /// a value or two deep than from one deep pipeline. Once every store
    /// evicts, the server reuses the memory its DELs free, per-request costs
    /// dominate, and one pipeline per job costs it less (`kvtier-bench
    /// --backend redis --repeat 3`; docs/runs/redis.md, "The bound's
    /// shape"). A cluster job is spread over its masters already.
    fn min_growing_task_bytes(&self) -> usize {
        if self.router.is_some() {
            usize::MAX
        } else {
            FILLING_TASK_BLOCKS * self.block_bytes
        }
    }

    fn describe(&self) -> String {
        format!(
            "redis: {} ({}, sharing={}, keys {}*, ttl_s={}, {} connections{})",
            self.shown_seeds,
            match (&self.router, self.pool.is_cluster()) {
                (Some(router), _) => format!("cluster, {}", router.describe()),
                (None, true) => "cluster".to_string(),
                (None, false) => "single server".to_string(),
            },
            match self.sharing {
                Sharing::Owned => "owned",
                Sharing::Shared => "shared",
            },
            self.name_prefix,
            self.ttl_s,
            self.connections,
            if self.seal.is_some() { ", sealed" } else { "" }
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
