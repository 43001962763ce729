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

    /// Runs `f` over row `row`, read-only. Panics if `row` is out of range: every
    /// row id was validated at submit time, so that would be a bug here.
    pub(crate) fn with_row<R>(&self, row: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        assert!(row < self.rows, "row {row} out of range");
        // SAFETY: in bounds (checked above, len validated at construction); the
        // caller does not write this row while a store reads it.
        let slice = unsafe {
            std::slice::from_raw_parts(
                self.base.as_ptr().add(row * self.block_bytes),
                self.block_bytes,
            )
        };
        f(slice)
    }

    /// Row `row` as an address and length, without borrowing it: for a store
    /// that may outlive the buffer (see `WatchedIo::store_unless`). Panics if
    /// `row` is out of range.
    pub(crate) fn row_unborrowed(&self, row: usize) -> Row {
        assert!(row < self.rows, "row {row} out of range");
        // In bounds (checked above, len validated at construction): `add`
        // stays inside the buffer's allocation, and nothing is read.
        let ptr = unsafe { self.base.as_ptr().add(row * self.block_bytes) };
        Row::new(ptr, self.block_bytes)
    }

    /// Row `row`, read-only, for a store that reads several rows at once (a
    /// pipelined batch). Panics if `row` is out of range.
    pub(crate) fn row(&self, row: usize) -> &[u8] {
        self.with_row(row, |r| {
            // SAFETY: the same row `with_row` lends, for as long as `self`:
            // the caller does not write a row while a store reads it.
            unsafe { std::slice::from_raw_parts(r.as_ptr(), r.len()) }
        })
    }

    /// Row `row`, writable, for a load that writes several rows at once (a
    /// pipelined batch). Panics if `row` is out of range.
    ///
    /// # Safety
    /// No other reference to this row may exist while the result lives: a
    /// load job names each row once (checked at submit) and its rows are
    /// handed to one task each.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn row_mut(&self, row: usize) -> &mut [u8] {
        self.with_row_mut(row, |r| {
            std::slice::from_raw_parts_mut(r.as_mut_ptr(), r.len())
        })
    }

    /// Runs `f` over row `row`, writable. Panics if `row` is out of range.
    pub(crate) fn with_row_mut<R>(&self, row: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        assert!(row < self.rows, "row {row} out of range");
        // SAFETY: in bounds; a load owns its destination rows until its result is
        // polled, and the tier hands each destination row of a job to one task.
        let slice = unsafe {
            std::slice::from_raw_parts_mut(
                self.base.as_ptr().add(row * self.block_bytes),
                self.block_bytes,
            )
        };
        f(slice)
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
            pb.with_row_mut(3, |r| r.fill(7));
        }
        assert_eq!(&buf[48..], &[7u8; 16]);
        assert!(buf[..48].iter().all(|&b| b == 0));
    }
}
