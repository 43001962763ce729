//! What kind of file system holds the tier's directory, from `statfs`'s
//! `f_type`: whether its calls can hang (network, cluster and FUSE file
//! systems) or not (local block devices, memory). It decides
//! `io_timeout_ms=auto` and where `block_header=auto` puts block headers.
//! The table is documented in docs/disk-deadlines.md; keep the two alike.

use crate::config::DEFAULT_DISK_IO_TIMEOUT_MS;

/// How a file system's calls can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FsClass {
    /// On a local block device: a failing device returns EIO, it does not
    /// leave a call waiting on a server.
    Local,
    /// In memory (tmpfs, ramfs): nothing to wait for.
    Memory,
    /// Network, cluster or FUSE: a call waits on a server or a user-space
    /// process, which can hang.
    Remote,
    /// Anything else, or a type stacked over an unknown one: treated as if
    /// it could hang.
    Unknown,
}

use FsClass::*;

const EXT_MAGIC: i64 = 0xef53;

/// Known `f_type` values (linux/magic.h and the file systems' own sources).
const TABLE: &[(i64, &str, FsClass)] = &[
    (EXT_MAGIC, "ext4", Local), // also ext2 and ext3, which share the magic
    (0x5846_5342, "xfs", Local),
    (0x9123_683e, "btrfs", Local),
    (0xf2f5_2010, "f2fs", Local),
    (0xca45_1a4e, "bcachefs", Local),
    (0x2fc1_2fc1, "zfs", Local),
    (0x3153_464a, "jfs", Local),
    (0x5265_4973, "reiserfs", Local),
    (0x3434, "nilfs2", Local),
    (0x4d44, "vfat", Local),
    (0x2011_bab0, "exfat", Local),
    (0x5346_544e, "ntfs3", Local),
    (0x482b, "hfsplus", Local),
    (0x0102_1994, "tmpfs", Memory),
    (0x8584_58f6, "ramfs", Memory),
    (0x6969, "nfs", Remote),
    (0x517b, "smb", Remote),
    (0xff53_4d42, "cifs", Remote),
    (0xfe53_4d42, "smb2", Remote),
    (0x0bd0_0bd0, "lustre", Remote),
    (0x4750_4653, "gpfs", Remote),
    (0x1983_0326, "beegfs", Remote),
    (0x00c3_6400, "cephfs", Remote),
    (0x6573_5546, "fuse", Remote), // also virtiofs, GlusterFS, JuiceFS, ntfs-3g
    (0x0102_1997, "9p", Remote),
    (0x5346_414f, "afs", Remote),
    (0x6b41_4653, "kafs", Remote),
    (0x0116_1970, "gfs2", Remote),
    (0x7461_636f, "ocfs2", Remote),
    (0x2003_0528, "orangefs", Remote),
    (0xaad7_aaea, "panfs", Remote),
    (0x7375_7245, "coda", Remote),
    (0x794c_7630, "overlayfs", Unknown),
];

/// A file system type as `statfs` reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FsKind {
    /// `f_type`, or None if `statfs` failed.
    magic: Option<i64>,
    name: Option<&'static str>,
    pub(crate) class: FsClass,
}

impl FsKind {
    /// The kind of a `statfs` `f_type`.
    pub(crate) fn of(magic: i64) -> FsKind {
        let known = TABLE.iter().find(|&&(m, _, _)| m == magic);
        FsKind {
            magic: Some(magic),
            name: known.map(|&(_, name, _)| name),
            class: known.map_or(Unknown, |&(_, _, class)| class),
        }
    }

    /// The kind of a file system `statfs` could not describe.
    pub(crate) fn unreadable() -> FsKind {
        FsKind {
            magic: None,
            name: None,
            class: Unknown,
        }
    }

    /// Whether calls may wait on a server or a user-space process.
    pub(crate) fn is_remote(&self) -> bool {
        self.class == Remote
    }

    /// Whether the file system spreads a directory's subdirectories over its
    /// block groups when asked (`io::spread_subdirs`): ext2/3/4's allocator
    /// does, and puts a new file's inode in its directory's group.
    pub(crate) fn spreads_subdirs(&self) -> bool {
        self.magic == Some(EXT_MAGIC)
    }

    /// `io_timeout_ms=auto`: the deadline (0: none) and why, as
    /// `tier_describe` shows it.
    pub(crate) fn auto_deadline(&self) -> (u32, String) {
        let name = match (self.name, self.magic) {
            (Some(name), _) => name.to_string(),
            (None, Some(magic)) => format!("f_type {magic:#x}"),
            (None, None) => "statfs failed".to_string(),
        };
        let (ms, why) = match self.class {
            Local => (0, "local"),
            Memory => (0, "memory"),
            Remote => (DEFAULT_DISK_IO_TIMEOUT_MS, "network, cluster or FUSE"),
            Unknown => (DEFAULT_DISK_IO_TIMEOUT_MS, "not known to be local"),
        };
        let deadline = match ms {
            0 => "no deadline".to_string(),
            ms => format!("deadline {ms} ms"),
        };
        (ms, format!("{name}: {why}, {deadline}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_and_memory_file_systems_get_no_deadline() {
        for magic in [0xef53, 0x5846_5342, 0x9123_683e, 0xf2f5_2010] {
            let (ms, why) = FsKind::of(magic).auto_deadline();
            assert_eq!(ms, 0, "{why}");
            assert!(why.ends_with(": local, no deadline"), "{why}");
        }
        assert_eq!(
            FsKind::of(0xef53).auto_deadline(),
            (0, "ext4: local, no deadline".to_string())
        );
        assert_eq!(
            FsKind::of(0x0102_1994).auto_deadline(),
            (0, "tmpfs: memory, no deadline".to_string())
        );
    }

    #[test]
    fn network_fuse_and_unknown_file_systems_get_the_deadline() {
        for magic in [
            0x6969,
            0xff53_4d42,
            0xfe53_4d42,
            0x0bd0_0bd0,
            0x4750_4653,
            0x1983_0326,
            0x00c3_6400,
            0x6573_5546,
            0x0102_1997,
            0x5346_414f,
        ] {
            let kind = FsKind::of(magic);
            assert!(kind.is_remote(), "{magic:#x}");
            assert_eq!(kind.auto_deadline().0, DEFAULT_DISK_IO_TIMEOUT_MS);
        }
        assert_eq!(
            FsKind::of(0x6573_5546).auto_deadline().1,
            "fuse: network, cluster or FUSE, deadline 10000 ms"
        );
        let unknown = FsKind::of(0x1234_5678);
        assert!(
            !unknown.is_remote(),
            "headers stay in xattrs where they work"
        );
        assert_eq!(
            unknown.auto_deadline(),
            (
                DEFAULT_DISK_IO_TIMEOUT_MS,
                "f_type 0x12345678: not known to be local, deadline 10000 ms".to_string()
            )
        );
        assert_eq!(
            FsKind::of(0x794c_7630).auto_deadline().0,
            DEFAULT_DISK_IO_TIMEOUT_MS
        );
        assert_eq!(
            FsKind::unreadable().auto_deadline().1,
            "statfs failed: not known to be local, deadline 10000 ms"
        );
    }

    #[test]
    fn every_type_is_listed_once() {
        for (i, &(magic, name, _)) in TABLE.iter().enumerate() {
            assert!(
                TABLE[i + 1..]
                    .iter()
                    .all(|&(m, n, _)| m != magic && n != name),
                "{name}"
            );
        }
    }
}
