//! File systems a test mounts itself (as root) at a scratch directory: an
//! ext4 image on a loop device and a tmpfs. Callers skip where mounting is
//! not possible (`common::skip`: a failure under CI=true).

#![allow(dead_code)] // each test binary uses its own part

use super::common::{scratch_dir, skip};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A file system mounted by the test at a scratch directory, unmounted and
/// removed on drop (also when the test fails).
pub struct Mounted {
    pub at: PathBuf,
    pub image: Option<PathBuf>,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.at).status();
        let _ = std::fs::remove_dir_all(&self.at);
        if let Some(image) = &self.image {
            let _ = std::fs::remove_file(image);
        }
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// `mount_ext4`, or None after `skip` if this machine cannot mount one.
pub fn ext4_or_skip(mkfs_args: &[&str]) -> Option<Mounted> {
    mount_ext4(mkfs_args)
        .map_err(|why| skip(&format!("cannot mount an ext4 image on a loop device here (needs root, mkfs.ext4 and a loop device): {why}")))
        .ok()
}

/// `mount_tmpfs`, or None after `skip` if this machine cannot mount one.
pub fn tmpfs_or_skip() -> Option<Mounted> {
    mount_tmpfs()
        .map_err(|why| skip(&format!("cannot mount a tmpfs here (needs root): {why}")))
        .ok()
}

/// A fresh 64 MiB ext4 on a loop device over an image file, made with
/// `mkfs.ext4 -q -F` and `mkfs_args`.
fn mount_ext4(mkfs_args: &[&str]) -> Result<Mounted, String> {
    let at = scratch_dir();
    std::fs::create_dir_all(&at).map_err(|e| e.to_string())?;
    let image = at.with_extension("img");
    let mounted = Mounted {
        at: at.clone(),
        image: Some(image.clone()),
    };
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(64 << 20))
        .map_err(|e| e.to_string())?;
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .args(mkfs_args)
        .arg(&image))?;
    run(Command::new("mount")
        .args(["-o", "loop"])
        .arg(&image)
        .arg(&at))?;
    Ok(mounted)
}

fn mount_tmpfs() -> Result<Mounted, String> {
    let at = scratch_dir();
    std::fs::create_dir_all(&at).map_err(|e| e.to_string())?;
    let mounted = Mounted {
        at: at.clone(),
        image: None,
    };
    run(Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(&at))?;
    Ok(mounted)
}
