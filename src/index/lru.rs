//! The recency list of readable, linked slots (least recent at the head), kept
//! apart from the slot records so a touch rewrites 8-byte links only.

use super::{Index, MAX_KEY_LEN, NIL};

/// A slot's neighbours in the LRU list (NIL at the ends and when unlisted).
#[derive(Clone, Copy)]
pub(super) struct Link {
    pub(super) prev: u32,
    pub(super) next: u32,
}

impl Link {
    pub(super) const NONE: Link = Link {
        prev: NIL,
        next: NIL,
    };
}

impl Index {
    pub(super) fn lru_unlink(&mut self, s: u32) {
        let Link { prev, next } = self.links[s as usize];
        if prev == NIL {
            self.lru_head = next;
        } else {
            self.links[prev as usize].next = next;
        }
        if next == NIL {
            self.lru_tail = prev;
        } else {
            self.links[next as usize].prev = prev;
        }
        self.links[s as usize] = Link::NONE;
    }

    pub(super) fn lru_push_mru(&mut self, s: u32) {
        let tail = self.lru_tail;
        self.links[s as usize] = Link {
            prev: tail,
            next: NIL,
        };
        if tail == NIL {
            self.lru_head = s;
        } else {
            self.links[tail as usize].next = s;
        }
        self.lru_tail = s;
    }

    /// Readable keys from least to most recently used (tests and debugging).
    #[cfg(test)]
    pub(crate) fn lru_order(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        self.for_each_lru(&mut |_, key| out.push(key.to_vec()));
        out
    }

    /// Calls `f` with every readable block's slot and key, least recently
    /// used first.
    pub(crate) fn for_each_lru(&self, f: &mut dyn FnMut(u32, &[u8])) {
        let mut s = self.lru_head;
        let mut buf = [0u8; MAX_KEY_LEN];
        while s != NIL {
            let len = self.key_of(s, &mut buf);
            f(s, &buf[..len]);
            s = self.links[s as usize].next;
        }
    }

    /// Collects up to `need` eviction victims from the LRU end, skipping pinned
    /// slots. Returns false (with `out` partially filled) if there are not enough.
    pub(super) fn pick_victims(&self, need: usize, out: &mut Vec<u32>) -> bool {
        out.clear();
        let mut s = self.lru_head;
        while out.len() < need && s != NIL {
            if self.slots[s as usize].pins == 0 {
                out.push(s);
            }
            s = self.links[s as usize].next;
        }
        out.len() == need
    }
}
