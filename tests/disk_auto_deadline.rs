//! `io_timeout_ms=auto`, the disk backend's default: the deadline is chosen
//! by the file system the tier's directory is on, on file systems the test
//! mounts itself (as root): a local ext4 on a loop device and a tmpfs get
//! none, a FUSE file system gets the deadline, and an explicit value always
//! wins. Like the FUSE tests of `tests/disk_deadline.rs`, a test that cannot
//! mount skips (`common::skip`: a failure under CI=true).

mod common;
mod fuse_memfs;
mod mounts;

use common::*;
use fuse_memfs::MemFuse;
use kvtier::TierConfig;
use mounts::{ext4_or_skip, tmpfs_or_skip};
use std::path::Path;

const BB: usize = 64 << 10;

/// A disk tier in `dir`, with `io_timeout_ms` as given (None: auto).
fn config_in(dir: &Path, io_timeout_ms: Option<&str>) -> TierConfig {
    let mut c = disk_config(16, BB);
    c.disk.path = Some(dir.join("tier"));
    if let Some(value) = io_timeout_ms {
        c.set("io_timeout_ms", value).unwrap();
    }
    c
}

/// Opens a tier in `dir`, checks that it stores and loads byte-exact, and
/// returns its description.
fn describe_working_tier(dir: &Path, io_timeout_ms: Option<&str>) -> String {
    let h = Harness::new(&config_in(dir, io_timeout_ms), 16, BB);
    h.store_all(1, &[1, 2]);
    let r = h.load(2, &[1, 2], &[8, 9]);
    assert!(r.is_ok() && h.row_holds(8, 1) && h.row_holds(9, 2), "{r:?}");
    h.tier().describe()
}

/// The auto choice on a local file system, and explicit values over it.
fn check_local(dir: &Path, why: &str) {
    let line = describe_working_tier(dir, None);
    assert!(
        line.contains(&format!("io_timeout_ms=auto ({why})")),
        "{line}"
    );
    assert!(!line.contains("stuck"), "no deadline, no watchdog: {line}");
    let line = describe_working_tier(dir, Some("auto"));
    assert!(line.contains("io_timeout_ms=auto ("), "{line}");
    let line = describe_working_tier(dir, Some("1500"));
    assert!(
        line.contains("io_timeout_ms=1500 (up to"),
        "an explicit value wins: {line}"
    );
    let line = describe_working_tier(dir, Some("0"));
    assert!(!line.contains("io_timeout_ms"), "0 is none: {line}");
}

#[test]
fn auto_gives_a_local_ext4_no_deadline_and_an_explicit_value_wins() {
    let Some(fs) = ext4_or_skip(&[]) else {
        return;
    };
    check_local(&fs.at, "ext4: local, no deadline");
}

#[test]
fn auto_gives_a_tmpfs_no_deadline() {
    let Some(fs) = tmpfs_or_skip() else {
        return;
    };
    check_local(&fs.at, "tmpfs: memory, no deadline");
}

#[test]
fn auto_gives_a_fuse_file_system_the_deadline_and_an_explicit_value_wins() {
    let at = scratch_dir();
    std::fs::create_dir_all(&at).unwrap();
    let fs = match MemFuse::mount(&at) {
        Ok(fs) => fs,
        Err(why) => {
            let _ = std::fs::remove_dir(&at);
            skip(&format!(
                "cannot mount a FUSE file system here (needs root and /dev/fuse): {why}"
            ));
            return;
        }
    };
    let line = describe_working_tier(&fs.at, None);
    assert!(
        line.contains(&format!(
            "io_timeout_ms=auto (fuse: network, cluster or FUSE, deadline {} ms; up to",
            kvtier::DEFAULT_DISK_IO_TIMEOUT_MS
        )),
        "{line}"
    );
    assert!(line.contains("headers in the files"), "{line}");
    let line = describe_working_tier(&fs.at, Some("0"));
    assert!(
        !line.contains("io_timeout_ms"),
        "an explicit 0 wins: {line}"
    );
    let line = describe_working_tier(&fs.at, Some("2500"));
    assert!(line.contains("io_timeout_ms=2500 (up to"), "{line}");
    drop(fs);
    let _ = std::fs::remove_dir(&at);
}
