//! Where block bytes live. The engine (index, jobs, workers) is the same for
//! every backend; a backend only moves one block between a primary row and its
//! storage, on a worker thread, outside the index lock.

pub(crate) mod memory;

use crate::error::Result;
use crate::primary::PrimaryBuffer;

/// One block's storage operations. `slot` is the block's slot number in the
/// index (unique among live blocks, reused after release); `key` is its key.
pub(crate) trait Backend: Send + Sync {
    /// Copies primary row `row` into the block's storage.
    fn store(&self, primary: &PrimaryBuffer, row: usize, slot: u32, key: &[u8]) -> Result<()>;

    /// Copies the block's stored bytes into primary row `row`.
    fn load(&self, primary: &PrimaryBuffer, row: usize, slot: u32, key: &[u8]) -> Result<()>;

    /// Whether [`Backend::discard`] must be called for released blocks.
    fn wants_discards(&self) -> bool {
        false
    }

    /// The block was evicted or cleared and its slot already reused or free.
    /// Called outside the index lock, so a new store of the same key may be
    /// running: a backend keyed by key (not slot) must tolerate that.
    fn discard(&self, _slot: u32, _key: &[u8]) {}
}
