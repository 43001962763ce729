//! The exports that describe the configuration keys (added in ABI node
//! KVTIER_1.1): their names, and a value read back in the library's own
//! spelling, so that bindings need no vocabulary of their own.

use super::boundary::{self, as_mut, as_ref, or_default, status, this_export, utf8, OK};
use super::types::*;
use crate::config::{TierConfig, CONFIG_TABLE};
use std::ffi::c_char;

/// The key names as C strings, then NULL: built at compile time from the
/// one table of keys, so it cannot drift from what tier_config_set accepts.
struct KeyNames([*const c_char; CONFIG_TABLE.len() + 1]);

// SAFETY: the pointers are to static, immutable C strings.
unsafe impl Sync for KeyNames {}

static KEY_NAMES: KeyNames = KeyNames(key_names());

const fn key_names() -> [*const c_char; CONFIG_TABLE.len() + 1] {
    let mut names = [std::ptr::null(); CONFIG_TABLE.len() + 1];
    let mut i = 0;
    while i < CONFIG_TABLE.len() {
        names[i] = CONFIG_TABLE[i].c_name.as_ptr();
        i += 1;
    }
    names
}

/// The name of every key tier_config_set accepts, in docs/configuration.md's
/// order, e.g. for a binding's or a CLI's help.
///
/// Returns a static array of static NUL-terminated strings ended by a NULL
/// entry; never NULL, never freed. Writes the number of names (the NULL not
/// counted) to `*out_n` unless `out_n` is NULL.
/// Threads: any thread; needs no tier. Added in KVTIER_1.1.
#[no_mangle]
pub unsafe extern "C" fn tier_config_keys(out_n: *mut usize) -> *const *const c_char {
    or_default(this_export!(), KEY_NAMES.0.as_ptr(), || {
        if !out_n.is_null() {
            *out_n = CONFIG_TABLE.len();
        }
        KEY_NAMES.0.as_ptr()
    })
}

/// Reads one configuration option back as text, in the library's own
/// spelling of what tier_config_set read: "backend" set to " Valkey" reads
/// "redis", "shared" set to "1" reads "true", "sharing" set to " shared"
/// reads "shared"; "auto" or "none" where the library chooses or nothing is
/// set. Secrets are never shown: "seal_key" reads "set" or "none", "url" the
/// number of seeds.
///
/// Writes the value's full length in bytes (excluding the NUL) to
/// `*out_len`, and at most `cap - 1` bytes of it plus a NUL to `buf`, so
/// `*out_len >= cap` means the copy was truncated.
/// Returns TIER_OK; TIER_ERR_CONFIG for an unknown key or non-UTF-8 text;
/// TIER_ERR_NULL_ARG. Nothing is written on failure.
/// Ownership: `key` and `buf` are borrowed for the call.
/// NULL: `cfg`, `key` and `out_len` are required; `buf` may be NULL (or
/// `cap` 0) to query the length only.
/// Threads: not concurrently with tier_config_set on the same builder.
/// Added in KVTIER_1.1.
#[no_mangle]
pub unsafe extern "C" fn tier_config_get(
    cfg: *const tier_config_t,
    key: *const c_char,
    buf: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> tier_status_t {
    status(this_export!(), || {
        let cfg = as_ref(cfg as *const TierConfig, "cfg")?;
        let out_len = as_mut(out_len, "out_len")?;
        let value = cfg.get(utf8(key, "key")?)?;
        *out_len = boundary::copy_text(&value, boundary::text_out(buf, cap));
        OK
    })
}
