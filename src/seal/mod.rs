//! Tenant sealing: blocks on shared storage that only their tenant can read,
//! find or forge.
//!
//! A shared disk directory or Redis keyspace is a shared prompt store: a KV
//! block tells much about the prompt that produced it, and whether a block
//! exists tells whether someone sent a guessed prefix. With a seal key
//! (`seal_key` or `seal_key_file`), every block a tier writes is encrypted
//! and authenticated (AES-256-GCM), and stored under a name derived from its
//! key by a keyed PRF (HMAC-SHA-256), so that a process without the key can
//! neither read a block, nor tell whether a prefix is stored, nor plant a
//! block another tenant would accept.
//!
//! Files: `key` (the secret itself: parsing, never shown, wiped), `sealer`
//! (subkeys, names, nonces, the AEAD), `record` (the sealed header both
//! backends store), `ledger` (the nonce each block was last seen with, which
//! catches an old version replayed under the same name).

mod key;
mod ledger;
mod record;
mod sealer;

pub(crate) use self::key::KeyOrigin;
pub use self::key::SealKey;
pub(crate) use self::ledger::{NonceLedger, Seen};
pub(crate) use self::record::{Nonce, RECORD_LEN};
// What only the Redis backend reads of a record and a name.
#[cfg(feature = "redis-backend")]
pub(crate) use self::record::NEWER;
#[cfg(feature = "redis-backend")]
pub(crate) use self::sealer::NAME_TAG_LEN;
pub(crate) use self::sealer::{NameTag, OpenedRecord, Sealer};
