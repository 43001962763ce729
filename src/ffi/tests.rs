//! The exports' labels: each failure's message names the export that failed,
//! as `this_export!` reads it from the export's own `fn` item.

use super::boundary::{copy_last_error, export_of};
use super::*;
use std::ffi::c_char;
use std::ptr::{null, null_mut};

fn last_error() -> String {
    let mut buf = vec![0u8; 512];
    let n = copy_last_error(Some(&mut buf));
    String::from_utf8_lossy(&buf[..n.min(511)]).into_owned()
}

#[test]
fn export_of_takes_the_function_around_here() {
    assert_eq!(export_of("kvtier::ffi::api::tier_new::here"), "tier_new");
    assert_eq!(
        export_of("kvtier::ffi::api::tier_describe::{{closure}}::here"),
        "tier_describe"
    );
}

/// An export called so that it fails; its result widened to compare with 0.
type Failing = Box<dyn Fn() -> i64>;

#[test]
fn every_failing_export_names_itself() {
    let t: *mut tier_t = null_mut();
    let k: *const c_char = c"k".as_ptr();
    // SAFETY: every call is given a NULL handle or NULL required pointer,
    // which each export refuses before touching anything else.
    let calls: [(&str, Failing); 18] = unsafe {
        [
            (
                "tier_abi_info",
                Box::new(|| tier_abi_info(null_mut(), 64) as i64),
            ),
            (
                "tier_config_set",
                Box::new(move || tier_config_set(null_mut(), k, k) as i64),
            ),
            (
                "tier_config_get",
                Box::new(move || tier_config_get(null(), k, null_mut(), 0, null_mut()) as i64),
            ),
            (
                "tier_new",
                Box::new(|| tier_new(null(), null_mut(), 64, 64, null_mut()) as i64),
            ),
            (
                "tier_lookup",
                Box::new(move || tier_lookup(t, null(), 8, 0, null_mut()) as i64),
            ),
            (
                "tier_touch",
                Box::new(move || tier_touch(t, null(), 8, 0) as i64),
            ),
            (
                "tier_submit_store",
                Box::new(move || tier_submit_store(t, 1, null(), 8, null(), 0) as i64),
            ),
            (
                "tier_submit_load",
                Box::new(move || tier_submit_load(t, 1, null(), 8, null(), 0) as i64),
            ),
            (
                "tier_poll_finished",
                Box::new(move || tier_poll_finished(t, null_mut(), 64, 1, null_mut()) as i64),
            ),
            ("tier_wait", Box::new(move || tier_wait(t, 0) as i64)),
            (
                "tier_completion_fd",
                Box::new(move || tier_completion_fd(t) as i64),
            ),
            (
                "tier_add_notify_fd",
                Box::new(move || tier_add_notify_fd(t, 2, 0) as i64),
            ),
            ("tier_drain", Box::new(move || tier_drain(t) as i64)),
            ("tier_clear", Box::new(move || tier_clear(t) as i64)),
            (
                "tier_poll_events",
                Box::new(move || tier_poll_events(t, null_mut(), 64, 1, null_mut()) as i64),
            ),
            (
                "tier_describe",
                Box::new(move || tier_describe(t, null_mut(), 0) as i64),
            ),
            (
                "tier_metrics",
                Box::new(move || tier_metrics(t, null_mut(), 0) as i64),
            ),
            (
                "tier_stats",
                Box::new(move || tier_stats(t, null_mut(), 64) as i64),
            ),
        ]
    };
    for (name, call) in calls {
        let result = call();
        assert!(result <= 0, "{name} returned {result}");
        let message = last_error();
        assert!(
            message.starts_with(&format!("{name}: ")),
            "{name}: {message:?}"
        );
    }
}

/// The value `key` reads back from `cfg` through the C export, with a
/// buffer of `cap` bytes: (status, full length, the bytes written).
fn config_get(cfg: *mut tier_config_t, key: &std::ffi::CStr, cap: usize) -> (i32, usize, String) {
    let mut buf = vec![0xAAu8; cap];
    let mut len = usize::MAX;
    let ptr = if cap == 0 {
        null_mut()
    } else {
        buf.as_mut_ptr() as *mut c_char
    };
    // SAFETY: `cfg` is a live builder, `key` a C string, `buf` holds `cap` bytes.
    let st = unsafe { tier_config_get(cfg, key.as_ptr(), ptr, cap, &mut len) };
    let text = buf
        .iter()
        .take_while(|&&b| b != 0 && b != 0xAA)
        .map(|&b| b as char)
        .collect();
    (st, len, text)
}

#[test]
fn config_keys_are_the_table_in_order_ended_by_null() {
    let mut n = 0usize;
    // SAFETY: the export returns a static array of n + 1 entries.
    let names: Vec<String> = unsafe {
        let list = tier_config_keys(&mut n);
        assert!(list.add(n).read().is_null(), "the list ends with NULL");
        (0..n)
            .map(|i| {
                std::ffi::CStr::from_ptr(list.add(i).read())
                    .to_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    assert_eq!(names, crate::config::CONFIG_KEYS);
    // SAFETY: out_n may be NULL.
    assert!(!unsafe { tier_config_keys(null_mut()) }.is_null());
}

#[test]
fn config_get_reads_back_the_librarys_spelling_and_hides_secrets() {
    let cfg = tier_config_new();
    let set = |key: &std::ffi::CStr, value: &std::ffi::CStr| {
        // SAFETY: a live builder and C strings.
        unsafe { tier_config_set(cfg, key.as_ptr(), value.as_ptr()) }
    };
    assert_eq!(
        config_get(cfg, c"backend", 64),
        (TIER_OK, 6, "memory".into())
    );
    assert_eq!(set(c"backend", c" Valkey "), TIER_OK);
    assert_eq!(set(c"sharing", c" shared"), TIER_OK);
    assert_eq!(set(c"shared", c"YES"), TIER_OK);
    assert_eq!(
        config_get(cfg, c"backend", 64),
        (TIER_OK, 5, "redis".into())
    );
    assert_eq!(config_get(cfg, c"sharing", 64).2, "shared");
    assert_eq!(config_get(cfg, c"shared", 64).2, "true");
    assert_eq!(config_get(cfg, c"io_timeout_ms", 64).2, "auto");
    let secret = c"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    assert_eq!(set(c"seal_key", secret), TIER_OK);
    assert_eq!(config_get(cfg, c"seal_key", 64).2, "set");
    assert_eq!(set(c"url", c"redis://user:hunter2@127.0.0.1:6379"), TIER_OK);
    assert_eq!(config_get(cfg, c"url", 64).2, "1 seed");
    // Truncated, NUL-terminated, full length reported; length only with no buffer.
    assert_eq!(config_get(cfg, c"backend", 3), (TIER_OK, 5, "re".into()));
    assert_eq!(config_get(cfg, c"backend", 0), (TIER_OK, 5, String::new()));
    // Unknown key: TIER_ERR_CONFIG naming it, nothing written.
    let (st, len, text) = config_get(cfg, c"no_such_key", 64);
    assert_eq!((st, len, text.as_str()), (TIER_ERR_CONFIG, usize::MAX, ""));
    assert!(last_error().contains("no_such_key"), "{}", last_error());
    // SAFETY: the builder is freed once, last.
    unsafe { tier_config_free(cfg) };
}
