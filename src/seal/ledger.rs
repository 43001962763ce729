//! The nonce each block was last written or seen with, so that an older
//! sealed version of a block put back under its name (a replay: it still
//! authenticates) is refused. It knows the blocks this process wrote, found at
//! open, or found by a probe; a block it has never seen is trusted on first
//! sight (docs/sealing.md says what that leaves open).

use super::record::Nonce;
use crate::striped::Striped;
use std::collections::HashMap;

const STRIPES: usize = 64;

pub(crate) struct NonceLedger {
    stripes: Striped<HashMap<Box<[u8]>, Nonce>>,
}

/// What the ledger says of a nonce read from storage.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// The version this process last wrote or saw, or a block it never saw.
    Current,
    /// Another version than the one this process last wrote or saw.
    Replaced,
}

impl NonceLedger {
    pub(crate) fn new() -> NonceLedger {
        NonceLedger {
            stripes: Striped::new(STRIPES, 3, HashMap::new),
        }
    }

    /// Remembers the version of `key` now in storage.
    pub(crate) fn record(&self, key: &[u8], nonce: Nonce) {
        self.stripes.of(key).lock().insert(key.into(), nonce);
    }

    /// Checks a version read from storage; a block never seen is recorded.
    pub(crate) fn check(&self, key: &[u8], nonce: Nonce) -> Seen {
        let mut map = self.stripes.of(key).lock();
        match map.get(key) {
            Some(known) if *known != nonce => Seen::Replaced,
            Some(_) => Seen::Current,
            None => {
                map.insert(key.into(), nonce);
                Seen::Current
            }
        }
    }

    /// The block's storage was released.
    pub(crate) fn forget(&self, key: &[u8]) {
        self.stripes.of(key).lock().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_sight_is_trusted_then_only_that_version() {
        let l = NonceLedger::new();
        assert_eq!(l.check(b"k", [1; 12]), Seen::Current);
        assert_eq!(l.check(b"k", [1; 12]), Seen::Current);
        assert_eq!(l.check(b"k", [2; 12]), Seen::Replaced);
        l.record(b"k", [2; 12]);
        assert_eq!(l.check(b"k", [1; 12]), Seen::Replaced);
        l.forget(b"k");
        assert_eq!(l.check(b"k", [1; 12]), Seen::Current);
    }
}
