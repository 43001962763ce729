//! A small safe wrapper over the C ABI (`kvtier::ffi::tier_*`), so the benchmark
//! measures the very entry points, argument conventions and status handling a C
//! engine goes through.

use crate::buffer::MappedBuf;
use kvtier::ffi::{self, tier_config_t, tier_job_result_t, tier_stats_t, tier_status_t, tier_t};
use std::ffi::{c_char, CStr, CString};
use std::marker::PhantomData;

pub use kvtier::ffi::{TIER_HIT, TIER_MISS, TIER_OK, TIER_PENDING};
use kvtier::ffi::{TIER_JOB_LOAD, TIER_JOB_STORE};

/// A job's direction: store (primary -> tier) or load (tier -> primary).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Store,
    Load,
}

impl Kind {
    /// `tier_job_result_t.kind` of a job of this kind.
    pub fn code(self) -> u32 {
        match self {
            Kind::Store => TIER_JOB_STORE,
            Kind::Load => TIER_JOB_LOAD,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Store => "store",
            Kind::Load => "load",
        }
    }
}

/// `tier_submit_store` and `tier_submit_load` share this signature.
type SubmitFn =
    unsafe extern "C" fn(*mut tier_t, u64, *const u8, usize, *const i64, usize) -> tier_status_t;

/// A failed call: which function, its status code and the thread's last error.
#[derive(Debug)]
pub struct ApiError {
    pub call: &'static str,
    pub status: tier_status_t,
    pub message: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} returned {} ({}): {}",
            self.call,
            status_name(self.status),
            self.status,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

pub type ApiResult<T> = Result<T, ApiError>;

/// The name of a status code, e.g. "TIER_ERR_NO_SPACE".
pub fn status_name(status: tier_status_t) -> String {
    // SAFETY: tier_status_str returns a static NUL-terminated string, never NULL.
    unsafe { CStr::from_ptr(ffi::tier_status_str(status)) }
        .to_string_lossy()
        .into_owned()
}

/// The library's version string.
pub fn version() -> String {
    // SAFETY: tier_version returns a static NUL-terminated string, never NULL.
    unsafe { CStr::from_ptr(ffi::tier_version()) }
        .to_string_lossy()
        .into_owned()
}

fn last_error() -> String {
    let mut buf = vec![0u8; 512];
    // SAFETY: buf is writable for its length; the function writes a NUL.
    let len = unsafe { ffi::tier_last_error(buf.as_mut_ptr() as *mut c_char, buf.len()) };
    buf.truncate(len.min(buf.len() - 1));
    String::from_utf8_lossy(&buf).into_owned()
}

/// Negative statuses are errors; 0 and positive outcomes are returned.
#[inline]
fn check(call: &'static str, status: tier_status_t) -> ApiResult<tier_status_t> {
    if status < 0 {
        Err(ApiError {
            call,
            status,
            message: last_error(),
        })
    } else {
        Ok(status)
    }
}

/// An owned `tier_config_t`.
pub struct Config {
    raw: *mut tier_config_t,
}

impl Config {
    pub fn new() -> ApiResult<Config> {
        let raw = ffi::tier_config_new();
        if raw.is_null() {
            return Err(ApiError {
                call: "tier_config_new",
                status: ffi::TIER_ERR_ALLOC,
                message: "returned NULL".into(),
            });
        }
        Ok(Config { raw })
    }

    pub fn set(&mut self, key: &str, value: &str) -> ApiResult<()> {
        let key = CString::new(key).expect("config key has no NUL");
        let value = CString::new(value).expect("config value has no NUL");
        // SAFETY: raw is a live builder; both strings are NUL-terminated.
        check("tier_config_set", unsafe {
            ffi::tier_config_set(self.raw, key.as_ptr(), value.as_ptr())
        })?;
        Ok(())
    }
}

impl Drop for Config {
    fn drop(&mut self) {
        // SAFETY: raw came from tier_config_new and is freed once.
        unsafe { ffi::tier_config_free(self.raw) }
    }
}

/// A `tier_t` over a primary buffer that outlives it.
///
/// The bench keeps the C contract on rows: it reads or writes a row only while
/// no job using that row is in flight.
pub struct Tier<'buf> {
    raw: *mut tier_t,
    _primary: PhantomData<&'buf MappedBuf>,
}

// SAFETY: the C API allows every call but tier_free from any thread, concurrently.
unsafe impl Send for Tier<'_> {}
unsafe impl Sync for Tier<'_> {}

impl<'buf> Tier<'buf> {
    pub fn new(config: &Config, primary: &'buf MappedBuf, block_bytes: usize) -> ApiResult<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: the buffer is valid for its length and outlives the tier ('buf).
        check("tier_new", unsafe {
            ffi::tier_new(
                config.raw,
                primary.as_ptr() as *mut std::ffi::c_void,
                primary.len(),
                block_bytes,
                &mut raw,
            )
        })?;
        Ok(Tier {
            raw,
            _primary: PhantomData,
        })
    }

    /// Writes one TIER_HIT / TIER_MISS / TIER_PENDING per key into `out`.
    #[inline]
    pub fn lookup(&self, keys: &[u8], key_len: usize, out: &mut [u8]) -> ApiResult<()> {
        debug_assert_eq!(keys.len(), out.len() * key_len);
        // SAFETY: keys holds out.len() keys; out is writable for out.len() bytes.
        check("tier_lookup", unsafe {
            ffi::tier_lookup(
                self.raw,
                keys.as_ptr(),
                key_len,
                out.len(),
                out.as_mut_ptr(),
            )
        })?;
        Ok(())
    }

    #[inline]
    pub fn touch(&self, keys: &[u8], key_len: usize) -> ApiResult<()> {
        // SAFETY: keys holds keys.len() / key_len whole keys.
        check("tier_touch", unsafe {
            ffi::tier_touch(self.raw, keys.as_ptr(), key_len, keys.len() / key_len)
        })?;
        Ok(())
    }

    /// `tier_submit_store` or `tier_submit_load`, by `kind`.
    #[inline]
    pub fn submit(
        &self,
        kind: Kind,
        job_id: u64,
        keys: &[u8],
        key_len: usize,
        rows: &[i64],
    ) -> ApiResult<()> {
        assert_eq!(keys.len(), rows.len() * key_len, "one key per row");
        let (name, call): (_, SubmitFn) = match kind {
            Kind::Store => ("tier_submit_store", ffi::tier_submit_store),
            Kind::Load => ("tier_submit_load", ffi::tier_submit_load),
        };
        // SAFETY: both arrays hold rows.len() entries and are copied by the call.
        check(name, unsafe {
            call(
                self.raw,
                job_id,
                keys.as_ptr(),
                key_len,
                rows.as_ptr(),
                rows.len(),
            )
        })?;
        Ok(())
    }

    /// Moves finished results into `out`; returns how many (0 if none ready).
    #[inline]
    pub fn poll(&self, out: &mut [tier_job_result_t]) -> ApiResult<usize> {
        let mut n = 0usize;
        // SAFETY: out is writable for out.len() results; n is a valid out pointer.
        check("tier_poll_finished", unsafe {
            ffi::tier_poll_finished(
                self.raw,
                out.as_mut_ptr(),
                std::mem::size_of::<tier_job_result_t>(),
                out.len(),
                &mut n,
            )
        })?;
        Ok(n)
    }

    /// Waits for a result to be ready; false on timeout.
    pub fn wait(&self, timeout_ms: u32) -> ApiResult<bool> {
        // SAFETY: raw is a live tier.
        let status = check("tier_wait", unsafe { ffi::tier_wait(self.raw, timeout_ms) })?;
        Ok(status == TIER_OK)
    }

    pub fn clear(&self) -> ApiResult<()> {
        // SAFETY: raw is a live tier.
        check("tier_clear", unsafe { ffi::tier_clear(self.raw) })?;
        Ok(())
    }

    /// The tier's one-line description (backend, O_DIRECT, threads).
    pub fn describe(&self) -> String {
        let mut buf = vec![0u8; 1024];
        // SAFETY: raw is a live tier; buf is writable for its length.
        let len =
            unsafe { ffi::tier_describe(self.raw, buf.as_mut_ptr() as *mut c_char, buf.len()) };
        buf.truncate(len.min(buf.len() - 1));
        String::from_utf8_lossy(&buf).into_owned()
    }

    pub fn stats(&self) -> ApiResult<tier_stats_t> {
        let mut out = tier_stats_t::default();
        // SAFETY: out is a valid, writable struct.
        check("tier_stats", unsafe {
            ffi::tier_stats(self.raw, &mut out, std::mem::size_of::<tier_stats_t>())
        })?;
        Ok(out)
    }
}

impl Drop for Tier<'_> {
    fn drop(&mut self) {
        // SAFETY: raw came from tier_new; this is the last call on it.
        unsafe { ffi::tier_free(self.raw) }
    }
}
