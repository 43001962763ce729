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
    let calls: [(&str, Failing); 16] = unsafe {
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
