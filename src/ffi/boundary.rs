//! What every export goes through: the panic boundary, the thread's last error,
//! and checked conversion of C pointers into references and slices.

use super::types::{tier_status_t, TIER_ERR_PANIC, TIER_OK};
use crate::error::{bail, Error, Result};
use std::any::Any;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The export whose body it is written in (`tier_new` in tier_new), so each
/// export's name is written once, in its `fn` item, which cbindgen reads and
/// the linker exports; its labels in messages follow it.
macro_rules! this_export {
    () => {{
        fn here() {}
        $crate::ffi::boundary::Export(::std::any::type_name_of_val(&here))
    }};
}
pub(crate) use this_export;

/// An export's label, as `this_export!` takes it: the type name of a `fn`
/// nested in it, read down to the export's name only when a message needs
/// it (a successful call, the hot path of lookups and touches, never does).
#[derive(Clone, Copy)]
pub(crate) struct Export(pub(crate) &'static str);

impl Export {
    pub(crate) fn name(self) -> &'static str {
        export_of(self.0)
    }
}

/// The export in the type name of `this_export!`'s `here`
/// (`kvtier::ffi::api::tier_new::here`): its last segment that is neither
/// `here` nor a closure's.
pub(crate) fn export_of(here: &'static str) -> &'static str {
    here.rsplit("::")
        .find(|segment| *segment != "here" && *segment != "{{closure}}")
        .unwrap_or(here)
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn set_last_error(message: String) {
    LAST_ERROR.with(|e| *e.borrow_mut() = message);
}

/// Saves `e` as this thread's last error, as the failure of `function`.
pub(crate) fn record_error(function: Export, e: &Error) {
    set_last_error(format!("{}: {}", function.name(), e.message()));
}

/// A caller's text buffer `(buf, cap)`; None when it is NULL or empty (a
/// length query).
///
/// # Safety
/// A non-NULL `buf` must be writable for `cap` bytes for `'a`.
pub(crate) unsafe fn text_out<'a>(buf: *mut std::ffi::c_char, cap: usize) -> Option<&'a mut [u8]> {
    if buf.is_null() || cap == 0 {
        None
    } else {
        Some(std::slice::from_raw_parts_mut(buf as *mut u8, cap))
    }
}

/// Copies `text` into `buf` (NUL-terminated, truncated to `cap - 1` bytes) and
/// returns its full length.
pub(crate) fn copy_text(text: &str, buf: Option<&mut [u8]>) -> usize {
    if let Some(buf) = buf {
        if let Some(room) = buf.len().checked_sub(1) {
            let n = room.min(text.len());
            buf[..n].copy_from_slice(&text.as_bytes()[..n]);
            buf[n] = 0;
        }
    }
    text.len()
}

/// Copies this thread's last error message into `buf`; see [`copy_text`].
pub(crate) fn copy_last_error(buf: Option<&mut [u8]>) -> usize {
    LAST_ERROR.with(|e| copy_text(&e.borrow(), buf))
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Runs an export's body: `Ok` becomes `TIER_OK`, an error its code (with the
/// message saved as this thread's last error), a panic `TIER_ERR_PANIC`.
pub(crate) fn status(
    function: Export,
    body: impl FnOnce() -> Result<tier_status_t>,
) -> tier_status_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => {
            record_error(function, &e);
            e.kind().code()
        }
        Err(payload) => {
            set_last_error(format!(
                "{}: internal panic: {}",
                function.name(),
                panic_message(&*payload)
            ));
            TIER_ERR_PANIC
        }
    }
}

/// Like [`status`] for exports without a status: a panic yields `fallback`.
pub(crate) fn or_default<T>(function: Export, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            set_last_error(format!(
                "{}: internal panic: {}",
                function.name(),
                panic_message(&*payload)
            ));
            fallback
        }
    }
}

pub(crate) const OK: Result<tier_status_t> = Ok(TIER_OK);

/// Frees a handle made by `Box::into_raw(Box::new(T))` and cast to `H`; NULL
/// is a no-op (the `_free` functions).
///
/// # Safety
/// A non-NULL `handle` must come from that boxing and not be used afterwards.
pub(crate) unsafe fn free_handle<H, T>(function: Export, handle: *mut H) {
    or_default(function, (), || {
        if !handle.is_null() {
            drop(Box::from_raw(handle as *mut T));
        }
    })
}

/// A shared reference from a non-NULL, aligned pointer.
///
/// # Safety
/// A non-NULL `ptr` must point to a live `T` for `'a`.
pub(crate) unsafe fn as_ref<'a, T>(ptr: *const T, name: &str) -> Result<&'a T> {
    if ptr.is_null() {
        bail!(NullArg, "{name} is NULL");
    }
    if !ptr.is_aligned() {
        bail!(InvalidArg, "{name} is not aligned for its type");
    }
    Ok(&*ptr)
}

/// An exclusive reference from a non-NULL, aligned pointer.
///
/// # Safety
/// A non-NULL `ptr` must point to a live, writable `T` not otherwise borrowed.
pub(crate) unsafe fn as_mut<'a, T>(ptr: *mut T, name: &str) -> Result<&'a mut T> {
    if ptr.is_null() {
        bail!(NullArg, "{name} is NULL");
    }
    if !ptr.is_aligned() {
        bail!(InvalidArg, "{name} is not aligned for its type");
    }
    Ok(&mut *ptr)
}

fn check_span<T>(ptr: *const T, len: usize, name: &str) -> Result<()> {
    if ptr.is_null() {
        bail!(NullArg, "{name} is NULL but {len} elements were given");
    }
    if !ptr.is_aligned() {
        bail!(InvalidArg, "{name} is not aligned for its element type");
    }
    if len
        .checked_mul(std::mem::size_of::<T>())
        .is_none_or(|b| b > isize::MAX as usize)
    {
        bail!(
            InvalidArg,
            "{name}: {len} elements exceed the address space"
        );
    }
    Ok(())
}

/// A slice of `len` elements; `(NULL, 0)` is the empty slice.
///
/// # Safety
/// For `len > 0`, `ptr` must point to `len` initialized elements live for `'a`.
pub(crate) unsafe fn as_slice<'a, T>(ptr: *const T, len: usize, name: &str) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    check_span(ptr, len, name)?;
    Ok(std::slice::from_raw_parts(ptr, len))
}

/// A writable slice of `len` elements; `(NULL, 0)` is the empty slice.
///
/// # Safety
/// For `len > 0`, `ptr` must point to `len` writable elements live for `'a`
/// and not otherwise borrowed.
pub(crate) unsafe fn as_mut_slice<'a, T>(
    ptr: *mut T,
    len: usize,
    name: &str,
) -> Result<&'a mut [T]> {
    if len == 0 {
        return Ok(&mut []);
    }
    check_span(ptr, len, name)?;
    Ok(std::slice::from_raw_parts_mut(ptr, len))
}

/// `n` packed keys of `key_len` bytes.
///
/// # Safety
/// As [`as_slice`] for `n * key_len` bytes.
pub(crate) unsafe fn keys<'a>(ptr: *const u8, key_len: usize, n: usize) -> Result<&'a [u8]> {
    crate::key::check_key_len(key_len)?;
    let Some(bytes) = n.checked_mul(key_len) else {
        bail!(InvalidArg, "n: {n} keys of {key_len} bytes overflow");
    };
    as_slice(ptr, bytes, "keys")
}

/// A C string as UTF-8.
///
/// # Safety
/// A non-NULL `ptr` must point to a NUL-terminated string.
pub(crate) unsafe fn utf8<'a>(ptr: *const std::ffi::c_char, name: &str) -> Result<&'a str> {
    if ptr.is_null() {
        bail!(NullArg, "{name} is NULL");
    }
    match std::ffi::CStr::from_ptr(ptr).to_str() {
        Ok(s) => Ok(s),
        Err(_) => Err(Error::new(
            crate::ErrorKind::Config,
            format!("{name} is not valid UTF-8"),
        )),
    }
}

/// A caller's output array of `len` structs laid out `stride` bytes apart,
/// `stride` being the caller's own sizeof: each element gets exactly
/// `min(stride, size_of::<T>())` bytes, so a caller built against an older
/// header is never written past its struct, and one built against a newer
/// header keeps its newer fields untouched.
pub(crate) struct SizedOut<T> {
    ptr: *mut u8,
    stride: usize,
    len: usize,
    _type: PhantomData<T>,
}

impl<T: Copy> SizedOut<T> {
    /// Elements the caller made room for.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Writes `value` as element `i`. Takes `&self`: elements are distinct
    /// bytes, and a job's per-item results are written by one thread.
    pub(crate) fn write(&self, i: usize, value: &T) {
        assert!(i < self.len, "element {i} of {}", self.len);
        let n = self.stride.min(std::mem::size_of::<T>());
        // SAFETY: `sized_out` was promised `len` writable elements of
        // `stride` bytes; byte copies need no alignment.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (value as *const T).cast::<u8>(),
                self.ptr.add(i * self.stride),
                n,
            )
        }
    }
}

/// `len` output elements of `size` bytes each at `ptr`; `size` below
/// `min_size` (the struct's size in ABI 1) is TIER_ERR_INVALID_ARG.
///
/// # Safety
/// A non-NULL `ptr` must be writable for `len * size` bytes while the result
/// lives. `T` must have no padding bytes.
pub(crate) unsafe fn sized_out<T: Copy>(
    ptr: *mut T,
    size: usize,
    len: usize,
    min_size: u32,
    name: &str,
) -> Result<SizedOut<T>> {
    if ptr.is_null() {
        bail!(NullArg, "{name} is NULL");
    }
    if size < min_size as usize {
        bail!(
            InvalidArg,
            "{name}: struct size {size} is below {min_size}, its size in the first ABI"
        );
    }
    if len
        .checked_mul(size)
        .is_none_or(|b| b > isize::MAX as usize)
    {
        bail!(
            InvalidArg,
            "{name}: {len} elements of {size} bytes exceed the address space"
        );
    }
    Ok(SizedOut {
        ptr: ptr.cast(),
        stride: size,
        len,
        _type: PhantomData,
    })
}

/// The shell every polling export shares: `out_n` and `out` are checked,
/// `cap` must be positive, `fill` hands up to `cap` items (what the caller
/// made room for), each written at the caller's stride, and their count goes
/// to `*out_n` only on success. `item` names one element for the error
/// ("a result", "an event").
///
/// # Safety
/// As for `as_mut` (`out_n`) and `sized_out` (`out`, `size`, `cap`).
pub(crate) unsafe fn poll_into<T: Copy>(
    out: *mut T,
    size: usize,
    cap: usize,
    min_size: u32,
    out_n: *mut usize,
    item: &str,
    fill: impl FnOnce(usize, &mut dyn FnMut(&T)) -> Result<()>,
) -> Result<tier_status_t> {
    let out_n = as_mut(out_n, "out_n")?;
    let out = sized_out(out, size, cap, min_size, "out")?;
    if cap == 0 {
        bail!(InvalidArg, "cap is 0: no room for {item}");
    }
    let mut n = 0;
    fill(out.len(), &mut |value| {
        out.write(n, value);
        n += 1;
    })?;
    *out_n = n;
    Ok(TIER_OK)
}
