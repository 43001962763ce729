//! Release tracking, for backends whose storage must be freed when a block
//! leaves the index (disk): the keys of freed blocks, and which keys are still
//! in use by unlinked slots, so storage is never freed under a live block.

use super::{Index, MAX_KEY_LEN};

impl Index {
    /// Starts recording the keys of freed blocks (see [`Index::take_released`]).
    pub(crate) fn track_releases(&mut self) {
        self.released.get_or_insert_with(Vec::new);
    }

    /// Whether any slot (linked, or unlinked but still in use) holds `key`.
    pub(crate) fn holds_key(&self, key: &[u8]) -> bool {
        self.find(key, self.hash(key)).is_some() || self.unlinked_keys.contains_key(key)
    }

    pub(super) fn note_unlinked(&mut self, s: u32, delta: i32) {
        if self.released.is_none() {
            return;
        }
        let mut buf = [0u8; MAX_KEY_LEN];
        let len = self.key_of(s, &mut buf);
        let key = &buf[..len];
        if delta > 0 {
            *self.unlinked_keys.entry(key.into()).or_insert(0) += 1;
        } else if let Some(n) = self.unlinked_keys.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                self.unlinked_keys.remove(key);
            }
        }
    }

    /// Blocks freed since the last call, with their keys, if tracked.
    pub(crate) fn take_released(&mut self) -> Vec<(u32, Vec<u8>)> {
        self.released
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }
}
