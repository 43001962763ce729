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
//! Files: this one (the backend's state, key names, verification and the
//! errors a load reports), `open` (the configuration checked, the router
//! made), `operations` (the `Backend` trait and the capabilities),
//! `routed` (what each pass of a job carries: SETs from rows, GETs into
//! rows, one-key commands, whole commands), `format` (key names and the
//! value layout), `sealed` (sealed names and values), `adopt` (an owned
//! tier's keys found on the servers at open), `examine` (key names and
//! values as the operator's `kvtier` command reads them, through
//! `kvtier::admin`), `direct` (the pipelines'
//! framing and replies: `set` writes payloads from rows, `get` reads them
//! into rows), and `client`, what speaks to the servers (see its `mod.rs`):
//! one client, a single server being a slot map of one node.

mod adopt;
mod client;
mod direct;
pub(crate) mod examine;
mod format;
mod generation;
mod open;
mod operations;
mod routed;
mod sealed;

use self::client::{call_each, Problem, Router, SMALL_REPLY};
use self::direct::{Fetched, Layout};
use self::sealed::SealedLayout;
use crate::config::Sharing;
use crate::error::{Error, ErrorKind, Result};
use crate::seal::{NonceLedger, Sealer, RECORD_LEN};
use crate::striped::Striped;
use crate::sync::RwLock;
use std::sync::Arc;
use std::time::Instant;

/// Locks serialising publish (SET) and delete (DEL) of one key. A batch
/// holds its keys' locks for a whole network round trip, so there are many
/// (one byte each): two jobs in flight share one with probability about
/// (16 x 16) / 65536 for jobs of 16 blocks, instead of most of the time.
const STRIPES: usize = 65_536;

/// Key names and the header fingerprint of one clear generation.
#[derive(Clone)]
pub(super) struct Naming {
    /// Key names start with this: `<prefix>:<fingerprint>:b<block_bytes>:`.
    prefix: Arc<str>,
    fp: u64,
    generation: u64,
}

pub(crate) struct RedisBackend {
    /// The slot map and a pool per node (a single server: one node).
    router: Router,
    /// The configured `key_prefix`.
    key_prefix: String,
    /// The namespace's name prefix, the one an owned tier uses (its
    /// adoption scan looks for it); a shared tier's is its generation's.
    name_prefix: String,
    /// The namespace's own fingerprint (an owned tier's blocks carry it).
    namespace_fp: u64,
    /// Whose generation a shared tier keeps: unsealed tiers', or its seal key's.
    tenant: super::SharedTenant,
    /// The generation a shared tier names and checks blocks with, and its
    /// number again, read without a lock (`describe` in a forked child).
    naming: RwLock<Naming>,
    generation: std::sync::atomic::AtomicU64,
    block_bytes: usize,
    sharing: Sharing,
    ttl_s: u64,
    shown_seeds: String,
    connections: usize,
    /// Serialise publish (SET) and delete (DEL) of the same key.
    stripes: Striped<()>,
    /// The tenant's keys when the tier is sealed (see `sealed`).
    seal: Option<Sealer>,
    /// The version of each sealed block this process last wrote or saw.
    ledger: NonceLedger,
    /// Most keys an owned tier adopts at open (see `adopt`).
    adopt_budget: usize,
    /// Why adoption stopped before it walked the whole keyspace, if it did
    /// (for `tier_describe`).
    adoption_stopped: crate::sync::Mutex<Option<String>>,
}

impl RedisBackend {
    fn naming(&self) -> Naming {
        self.naming.read().clone()
    }

    fn set_naming(&self, naming: Naming) {
        let generation = naming.generation;
        *self.naming.write() = naming;
        self.generation
            .store(generation, std::sync::atomic::Ordering::Release);
    }

    fn name(&self, key: &[u8]) -> String {
        let naming = self.naming();
        match self.sealed() {
            Some(seal) => {
                let tag = seal.sealer.name_tag(naming.fp, self.block_bytes, key);
                let mut name = Vec::with_capacity(sealed::name_len(&naming.prefix));
                sealed::write_name(&mut name, &naming.prefix, &tag);
                String::from_utf8(name).expect("prefix, hex digits and braces")
            }
            None => format::key_name(&naming.prefix, key),
        }
    }

    fn sealed(&self) -> Option<SealedLayout<'_>> {
        self.seal.as_ref().map(|sealer| SealedLayout {
            sealer,
            ledger: &self.ledger,
        })
    }

    fn layout<'a>(&'a self, naming: &'a Naming) -> Layout<'a> {
        Layout {
            name_prefix: &naming.prefix,
            namespace_fp: naming.fp,
            block_bytes: self.block_bytes,
            ttl_s: self.ttl_s,
            seal: self.sealed(),
        }
    }

    /// Checks a value against the header this tier would write for `key`;
    /// copies its payload into `dst` if it is good.
    fn verify_into(
        &self,
        value: &mut [u8],
        key: &[u8],
        dst: &mut [u8],
    ) -> std::result::Result<std::result::Result<(), usize>, String> {
        if let Some(seal) = self.sealed() {
            // A newer format's value may be of another length: its record
            // says so first, once its key field proves it (a miss, never
            // deleted).
            if let Some(problem) = seal.sealer.newer_problem(value) {
                return Err(problem);
            }
            if value.len() != sealed::value_len(self.block_bytes) {
                return Err(format!(
                    "value of {} bytes for a sealed block of {}",
                    value.len(),
                    self.block_bytes
                ));
            }
            // Decrypted in the private copy: only it may condemn the value.
            let (record, payload) = value.split_at_mut(RECORD_LEN);
            seal.unseal(self.naming().fp, self.block_bytes, key, record, payload)?;
            dst.copy_from_slice(payload);
            return Ok(Ok(()));
        }
        let sum =
            format::check_header(value, value.len(), self.naming().fp, key, self.block_bytes)?;
        let payload = &value[format::header_len(key.len())..];
        if !sum.matches(payload) {
            return Err("payload checksum mismatch".into());
        }
        // A good block of another length than asked (an extent load): not
        // copied, and kept.
        if payload.len() != dst.len() {
            return Ok(Err(payload.len()));
        }
        dst.copy_from_slice(payload);
        Ok(Ok(()))
    }

    /// A private GET's answer for `key`: copied into `dst` if it is this
    /// block, else NotFound (no value) or Corrupt (the bad value is deleted
    /// by `deadline`, so that it cannot fail every later load).
    fn check_value(
        &self,
        name: &str,
        value: Option<Vec<u8>>,
        key: &[u8],
        dst: &mut [u8],
        deadline: Instant,
    ) -> Result<()> {
        let Some(mut value) = value else {
            return Err(self.not_found(name));
        };
        match self.verify_into(&mut value, key, dst) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(stored)) => Err(Error::new(
                ErrorKind::InvalidArg,
                format!(
                    "redis: {name}: the block was stored with {stored} bytes; the load asked for {}",
                    dst.len()
                ),
            )
            .wrong_length()),
            Err(problem) => Err(self.condemn(name, &problem, deadline)),
        }
    }

    fn not_found(&self, name: &str) -> Error {
        Error::new(
            ErrorKind::NotFound,
            format!("redis: {name}: not on the server (evicted, expired or never stored)"),
        )
    }

    /// Deletes a value proved not to be this block (so that it cannot fail
    /// every later load) and returns the load's Corrupt error. A block in a
    /// newer format (unsealed or sealed: both errors start with
    /// `format::NEWER`) is another version's: a miss, never deleted. A
    /// sealed tier in a shared keyspace deletes nothing: a value that does
    /// not authenticate under its key may be another tenant's; it is a miss.
    /// Only a private read, on a connection in step, proves a value bad.
    fn condemn(&self, name: &str, problem: &str, deadline: Instant) -> Error {
        if problem.starts_with(format::NEWER) {
            return Error::new(
                ErrorKind::NotFound,
                format!("redis: {name}: {problem}; a miss, left in place"),
            );
        }
        if self.seal.is_some() && self.sharing == Sharing::Shared {
            return Error::new(
                ErrorKind::NotFound,
                format!("redis: {name}: {problem}; a miss, left in place (shared)"),
            );
        }
        self.delete_named(name, deadline);
        Error::new(
            ErrorKind::Corrupt,
            format!("redis: {name}: {problem}; value deleted"),
        )
    }

    /// Deletes the value named `name` (a condemned one), best effort, by
    /// `deadline`.
    fn delete_named(&self, name: &str, deadline: Instant) {
        let _ = call_each(
            &self.router,
            "DEL",
            &[name.as_bytes()],
            SMALL_REPLY,
            deadline,
            |name| vec![b"DEL", name],
        );
    }

    /// A private GET the server refused: a value of another type under a
    /// block's name (WRONGTYPE) is no block, as garbage is; any other
    /// refusal may pass.
    fn get_refused(&self, name: &str, message: &str, deadline: Instant) -> Error {
        if Problem::of(message) == Problem::WrongType {
            return self.condemn(name, "a value of another type than a string", deadline);
        }
        server_error("GET", message)
    }

    /// A block's outcome from what its direct GET brought, by `deadline`
    /// (the job's). Anything but a good block or a plain miss is read again
    /// privately before it is judged: the direct read may have met a row
    /// written meanwhile, or a connection out of step whose replies belong
    /// to other requests, and neither may condemn a value.
    fn judge(&self, key: &[u8], dst: &mut [u8], fetched: Fetched, deadline: Instant) -> Result<()> {
        match fetched {
            Fetched::Good => Ok(()),
            Fetched::Missing => Err(self.not_found(&self.name(key))),
            Fetched::Refused(refused) if refused.problem != Problem::WrongType => {
                Err(server_error("GET", &refused.message))
            }
            Fetched::Refused(_) | Fetched::Bad(_) | Fetched::Recheck => {
                self.load_by(key, dst, deadline)
            }
        }
    }
}

/// A server's error reply to one command of a pipeline (the connection
/// stays usable).
fn server_error(what: &str, message: &str) -> Error {
    Error::new(ErrorKind::Io, format!("redis: {what}: {message}"))
}
