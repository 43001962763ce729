//! On ext2/3/4 the disk backend marks its namespace directory as the top of
//! a hierarchy (`chattr +T`), so that its fan-out directories, and the
//! files whose inodes the allocator puts beside them, land in block groups
//! of their own instead of all in the group of the directory the caller
//! chose. Checked on an ext4 image the test mounts (made with `-G 1`, so
//! that a small image has several groups to spread over) against a plain
//! directory's subdirectories in the same file system, and on a tmpfs,
//! which has no block groups and is left alone. Like the other mounting
//! tests, "skipped: ..." where it cannot mount (a failure under CI=true).

mod common;
mod mounts;

use common::*;
use mounts::{ext4_or_skip, tmpfs_or_skip, Mounted};
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const BB: usize = 4096;
const NOTE: &str = "fan-out directories spread over block groups";

/// A disk tier with every fan-out directory made at open, in `dir`; stores
/// and loads two blocks byte-exact and returns the tier's description.
fn describe_working_tier(dir: &Path) -> String {
    describe_working_tier_of(dir, BB)
}

/// [`describe_working_tier`] with blocks of `block_bytes`.
fn describe_working_tier_of(dir: &Path, block_bytes: usize) -> String {
    let mut c = disk_config(16, block_bytes);
    c.disk.path = Some(dir.to_path_buf());
    c.set("prepare_dirs", "true").unwrap();
    let h = Harness::new(&c, 16, block_bytes);
    h.store_all(1, &[1, 2]);
    let r = h.load(2, &[1, 2], &[8, 9]);
    assert!(r.is_ok() && h.row_holds(8, 1) && h.row_holds(9, 2), "{r:?}");
    h.tier().describe()
}

/// The one namespace directory a tier made under `root`.
fn namespace_dir(root: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.into_iter().next().unwrap()
}

/// "Inodes per group" of the ext4 image under `fs`, from `dumpe2fs -h`.
fn inodes_per_group(fs: &Mounted) -> u64 {
    let out = Command::new("dumpe2fs")
        .arg("-h")
        .arg(fs.image.as_ref().unwrap())
        .output()
        .expect("dumpe2fs (e2fsprogs, as mkfs.ext4)");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("Inodes per group:"))
        .unwrap_or_else(|| panic!("no inodes per group in: {text}"));
    line.rsplit(' ').next().unwrap().trim().parse().unwrap()
}

/// The block groups holding the inodes of `dir`'s subdirectories.
fn groups_of_subdirs(dir: &Path, per_group: u64) -> BTreeSet<u64> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap())
        .filter(|m| m.is_dir())
        .map(|m| (m.ino() - 1) / per_group)
        .collect()
}

#[test]
fn fan_out_directories_spread_over_ext4_block_groups() {
    let Some(fs) = ext4_or_skip(&["-G", "1"]) else {
        return;
    };
    let per_group = inodes_per_group(&fs);
    let line = describe_working_tier(&fs.at.join("tier"));
    assert!(line.contains(NOTE), "{line}");
    let ns_dir = namespace_dir(&fs.at.join("tier"));
    let (flagged, attrs) = top_of_hierarchy_flag(&ns_dir);
    assert!(
        flagged,
        "the namespace directory is the top of a hierarchy: {attrs}",
    );
    let spread = groups_of_subdirs(&ns_dir, per_group);
    // What the same file system does with a plain directory's subdirectories.
    let plain = fs.at.join("plain");
    std::fs::create_dir(&plain).unwrap();
    for i in 0..64 {
        std::fs::create_dir(plain.join(i.to_string())).unwrap();
    }
    let together = groups_of_subdirs(&plain, per_group);
    assert!(
        spread.len() >= 4 && together.len() <= 2,
        "fan-out directories in groups {spread:?}, a plain directory's in {together:?}"
    );
    // Opening again (the flag already set) works and says the same.
    assert!(describe_working_tier(&fs.at.join("tier")).contains(NOTE));
}

/// Blocks over 1 MiB are few per GB (the allocator's walk costs them
/// little), and with their directories spread each file's directory and
/// inode blocks sit in a group of their own, more device requests: their
/// fan-out directories stay where a plain directory's go.
#[test]
fn fan_out_directories_of_blocks_over_a_mib_stay_together_on_ext4() {
    let Some(fs) = ext4_or_skip(&["-G", "1"]) else {
        return;
    };
    let per_group = inodes_per_group(&fs);
    let line = describe_working_tier_of(&fs.at.join("tier"), 2 << 20);
    assert!(!line.contains(NOTE), "{line}");
    let ns_dir = namespace_dir(&fs.at.join("tier"));
    let (flagged, attrs) = top_of_hierarchy_flag(&ns_dir);
    assert!(
        !flagged,
        "the namespace directory is not the top of a hierarchy: {attrs}",
    );
    let together = groups_of_subdirs(&ns_dir, per_group);
    assert!(
        together.len() <= 2,
        "fan-out directories in groups {together:?}"
    );
}

#[test]
fn a_tmpfs_tier_is_not_spread() {
    let Some(fs) = tmpfs_or_skip() else {
        return;
    };
    let line = describe_working_tier(&fs.at.join("tier"));
    assert!(!line.contains(NOTE), "{line}");
}

/// Whether `dir` carries ext4's top-of-hierarchy flag (`chattr +T`), and
/// lsattr's line saying so.
fn top_of_hierarchy_flag(dir: &std::path::Path) -> (bool, String) {
    let out = Command::new("lsattr").arg("-d").arg(dir).output().unwrap();
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    (line.split(' ').next().unwrap().contains('T'), line)
}
