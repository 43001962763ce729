//! The caller's primary buffer and its rows: the one place the core touches
//! memory it does not own.

use crate::error::{bail, Result};
use std::ptr::NonNull;

/// A caller-owned buffer of `rows` fixed-size rows of `block_bytes` each.
///
/// The tier copies whole rows out of it (store) and into it (load) on its worker
/// threads. The engine keeps the buffer alive and does not write a row a store
/// is reading, or read/write a row a load is writing, until that job's result is
/// polled — the same rule vLLM's primary tier enforces with its row pins.
#[derive(Debug)]
pub struct PrimaryBuffer {
    base: NonNull<u8>,
    len: usize,
    block_bytes: usize,
    rows: usize,
}

// SAFETY: the buffer is plain bytes; concurrent access to distinct rows is the
// caller's contract above, and the index never hands one row to two writers.
unsafe impl Send for PrimaryBuffer {}
unsafe impl Sync for PrimaryBuffer {}

impl PrimaryBuffer {
    /// Wraps `len` bytes at `base`, cut into rows of `block_bytes`.
    ///
    /// # Safety
    /// `base..base+len` must be valid for reads and writes for as long as any
    /// [`Tier`](crate::Tier) built on this buffer is alive, and the caller keeps the
    /// row-access rule described on the type.
    pub unsafe fn new(base: *mut u8, len: usize, block_bytes: usize) -> Result<PrimaryBuffer> {
        let Some(base) = NonNull::new(base) else {
            bail!(NullArg, "primary: the primary buffer pointer is NULL");
        };
        if block_bytes == 0 {
            bail!(InvalidArg, "block_bytes: must be at least 1");
        }
        if len == 0 {
            bail!(InvalidArg, "primary_len: the primary buffer is empty");
        }
        if block_bytes > len {
            bail!(
                InvalidArg,
                "block_bytes: {block_bytes} is larger than the primary buffer ({len} bytes)"
            );
        }
        if len % block_bytes != 0 {
            bail!(
                InvalidArg,
                "primary_len: {len} is not a whole number of {block_bytes}-byte rows (is block_bytes the row stride?)"
            );
        }
        if len > isize::MAX as usize {
            bail!(InvalidArg, "primary_len: {len} exceeds the address space");
        }
        Ok(PrimaryBuffer {
            base,
            len,
            block_bytes,
            rows: len / block_bytes,
        })
    }

    /// Bytes per row.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: construction rejects empty buffers.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// A caller's byte range inside the primary buffer: a job's item by
/// (offset, length) rather than by row, for engines whose objects are not
/// rows (LMCache's arena). Checked against the buffer at submit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Bytes from the start of the primary buffer.
    pub offset: usize,
    /// Bytes in the range: 1 to the tier's block size.
    pub len: usize,
}

impl PrimaryBuffer {
    /// Row `row` as an extent.
    pub(crate) fn row_extent(&self, row: usize) -> Extent {
        Extent {
            offset: row * self.block_bytes,
            len: self.block_bytes,
        }
    }

    /// Whether `extent` is a valid item: 1 to `block_bytes` long and inside
    /// the buffer.
    pub(crate) fn check_extent(&self, i: usize, extent: Extent) -> Result<()> {
        if extent.len == 0 || extent.len > self.block_bytes {
            bail!(
                InvalidArg,
                "lengths[{i}]: {} is not between 1 and the block size ({})",
                extent.len,
                self.block_bytes
            );
        }
        if extent.offset > self.len || self.len - extent.offset < extent.len {
            bail!(
                InvalidArg,
                "offsets[{i}]: {} + {} bytes runs past the primary buffer ({} bytes)",
                extent.offset,
                extent.len,
                self.len
            );
        }
        Ok(())
    }

    fn extent_ptr(&self, extent: Extent) -> *mut u8 {
        assert!(
            extent.offset <= self.len && self.len - extent.offset >= extent.len,
            "extent {extent:?} out of range"
        );
        // SAFETY: in bounds (checked above, len validated at construction).
        unsafe { self.base.as_ptr().add(extent.offset) }
    }

    /// The bytes of `extent` (a row or an extent job's range), read-only,
    /// for a store. Panics if it is out of range: every row and extent was
    /// checked at submit.
    pub(crate) fn at(&self, extent: Extent) -> &[u8] {
        // SAFETY: in bounds; the caller does not write a range a store reads.
        unsafe { std::slice::from_raw_parts(self.extent_ptr(extent), extent.len) }
    }

    /// The bytes of `extent`, writable, for a load.
    ///
    /// # Safety
    /// No other reference to these bytes may exist while the result lives:
    /// a load's extents do not overlap (checked at submit) and are handed to
    /// one task each.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn at_mut(&self, extent: Extent) -> &mut [u8] {
        std::slice::from_raw_parts_mut(self.extent_ptr(extent), extent.len)
    }

    /// `extent` as an address and length, without borrowing it: for a store
    /// that may outlive the buffer (see `WatchedIo::store_unless`).
    pub(crate) fn at_unborrowed(&self, extent: Extent) -> Row {
        Row::new(self.extent_ptr(extent), extent.len)
    }
}

/// A caller's row handed to a store under a deadline: an address and a
/// length, not a borrow, because the call may outlive the row (see
/// `WatchedIo::store_unless`). Read it through `StoreJob::read_row`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Row {
    ptr: *const u8,
    len: usize,
}

impl Row {
    /// The row at `ptr`, `len` bytes (nothing is read here).
    pub(crate) fn new(ptr: *const u8, len: usize) -> Row {
        Row { ptr, len }
    }

    /// A row that is a plain borrowed slice (backends' own tests, stores
    /// without a deadline).
    pub(crate) fn of(slice: &[u8]) -> Row {
        Row::new(slice.as_ptr(), slice.len())
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The address, for alignment checks and for the kernel (a write system
    /// call given an address no longer mapped fails with EFAULT; it never
    /// faults in user space).
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// The row's bytes.
    ///
    /// # Safety
    /// The row must be valid for reads for as long as the slice lives: inside
    /// `StoreJob::read_row`, or where the row is known to outlive the call.
    pub(crate) unsafe fn bytes<'a>(&self) -> &'a [u8] {
        std::slice::from_raw_parts(self.ptr, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn construction_validates_geometry() {
        let mut buf = vec![0u8; 64];
        let p = buf.as_mut_ptr();
        let kind = |r: Result<PrimaryBuffer>| r.unwrap_err().kind();
        unsafe {
            assert_eq!(
                kind(PrimaryBuffer::new(std::ptr::null_mut(), 64, 16)),
                ErrorKind::NullArg
            );
            assert_eq!(kind(PrimaryBuffer::new(p, 64, 0)), ErrorKind::InvalidArg);
            assert_eq!(kind(PrimaryBuffer::new(p, 64, 65)), ErrorKind::InvalidArg);
            assert_eq!(kind(PrimaryBuffer::new(p, 64, 24)), ErrorKind::InvalidArg);
            assert_eq!(kind(PrimaryBuffer::new(p, 0, 1)), ErrorKind::InvalidArg);
            let pb = PrimaryBuffer::new(p, 64, 16).unwrap();
            assert_eq!(pb.rows(), 4);
            pb.at_mut(pb.row_extent(3)).fill(7);
        }
        assert_eq!(&buf[48..], &[7u8; 16]);
        assert!(buf[..48].iter().all(|&b| b == 0));
    }
}
