//! A small FUSE file system that keeps its files in memory, served by a
//! thread of the test over /dev/fuse: enough of the protocol for a disk tier
//! to open, store, load, scan and close in it. Mounted with mount(2) as
//! `tests/disk_deadline.rs`'s hung FUSE mount is, but answering, so the
//! kernel reports `statfs` type FUSE for a working directory. Needs root and
//! /dev/fuse.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

const ROOT: u64 = 1;
const MAX_WRITE: u32 = 128 << 10;
const FUSE_BIG_WRITES: u32 = 1 << 5;

enum Body {
    Dir(BTreeMap<Vec<u8>, u64>),
    File(Vec<u8>),
}

struct Node {
    mode: u32,
    body: Body,
}

struct Fs {
    nodes: HashMap<u64, Node>,
    next: u64,
}

/// The mounted file system; unmounted on drop.
pub struct MemFuse {
    pub at: PathBuf,
}

impl MemFuse {
    pub fn mount(at: &Path) -> Result<MemFuse, String> {
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStrExt;
        let device = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .map_err(|e| format!("/dev/fuse: {e}"))?;
        let target = std::ffi::CString::new(at.as_os_str().as_bytes()).unwrap();
        let data = std::ffi::CString::new(format!(
            "fd={},rootmode=40000,user_id=0,group_id=0",
            device.as_raw_fd()
        ))
        .unwrap();
        // SAFETY: NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"kvtier-memfs".as_ptr(),
                target.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data.as_ptr() as *const libc::c_void,
            )
        };
        if rc != 0 {
            return Err(format!("mount: {}", std::io::Error::last_os_error()));
        }
        let mut fs = Fs {
            nodes: HashMap::new(),
            next: ROOT + 1,
        };
        fs.nodes.insert(
            ROOT,
            Node {
                mode: libc::S_IFDIR | 0o755,
                body: Body::Dir(BTreeMap::new()),
            },
        );
        std::thread::spawn(move || fs.serve(device));
        Ok(MemFuse {
            at: at.to_path_buf(),
        })
    }
}

impl Drop for MemFuse {
    fn drop(&mut self) {
        let target = std::ffi::CString::new(self.at.as_os_str().to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path. Detached: the server thread sees
        // ENODEV once the last reference goes, and ends.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}

/// The NUL-terminated name at the start of `b`, and what follows it.
fn name(b: &[u8]) -> (Vec<u8>, &[u8]) {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    (b[..end].to_vec(), &b[(end + 1).min(b.len())..])
}

type Reply = Result<Vec<u8>, i32>;

impl Fs {
    fn serve(mut self, mut device: std::fs::File) {
        let mut buf = vec![0u8; MAX_WRITE as usize + (64 << 10)];
        loop {
            let n = match device.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(_) => return, // ENODEV: unmounted
            };
            let req = &buf[..n];
            let (opcode, unique, node) = (u32_at(req, 4), u64_at(req, 8), u64_at(req, 16));
            let arg = &req[40..];
            let reply = match opcode {
                2 | 42 | 36 => continue, // FORGET, BATCH_FORGET, INTERRUPT: no reply
                _ => self.handle(opcode, node, arg),
            };
            let (error, body) = match reply {
                Ok(body) => (0i32, body),
                Err(errno) => (-errno, Vec::new()),
            };
            let mut out = Vec::with_capacity(16 + body.len());
            out.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
            out.extend_from_slice(&error.to_ne_bytes());
            out.extend_from_slice(&unique.to_ne_bytes());
            out.extend_from_slice(&body);
            // A request interrupted meanwhile is answered with ENOENT.
            let _ = device.write(&out);
        }
    }

    fn handle(&mut self, opcode: u32, node: u64, arg: &[u8]) -> Reply {
        match opcode {
            26 => Ok(init_out(u32_at(arg, 8))),
            1 => {
                let (name, _) = name(arg);
                let child = self.child(node, &name)?;
                Ok(self.entry_out(child))
            }
            3 => Ok(self.attr_out(node)?),
            4 => self.setattr(node, arg),
            9 => {
                let (name, _) = name(&arg[8..]);
                let mode = libc::S_IFDIR | (u32_at(arg, 0) & 0o7777);
                let ino = self.add(node, name, mode, Body::Dir(BTreeMap::new()))?;
                Ok(self.entry_out(ino))
            }
            35 => {
                let (name, _) = name(&arg[16..]);
                let mode = libc::S_IFREG | (u32_at(arg, 4) & 0o7777);
                let flags = u32_at(arg, 0) as i32;
                let ino = match self.child(node, &name) {
                    Ok(_) if flags & libc::O_EXCL != 0 => return Err(libc::EEXIST),
                    Ok(ino) => ino,
                    Err(_) => self.add(node, name, mode, Body::File(Vec::new()))?,
                };
                let mut out = self.entry_out(ino);
                out.extend_from_slice(&[0u8; 16]); // fuse_open_out
                Ok(out)
            }
            10 | 11 => {
                let (name, _) = name(arg);
                let child = self.child(node, &name)?;
                if let Body::Dir(entries) = &self.nodes[&child].body {
                    if opcode == 10 {
                        return Err(libc::EISDIR);
                    }
                    if !entries.is_empty() {
                        return Err(libc::ENOTEMPTY);
                    }
                }
                self.dir(node)?.remove(&name);
                Ok(Vec::new())
            }
            12 | 45 => {
                let (newdir, rest) = match opcode {
                    12 => (u64_at(arg, 0), &arg[8..]),
                    _ => (u64_at(arg, 0), &arg[16..]),
                };
                let (old, rest) = name(rest);
                let (new, _) = name(rest);
                let ino = self.child(node, &old)?;
                self.dir(newdir)?;
                self.dir(node)?.remove(&old);
                self.dir(newdir)?.insert(new, ino);
                Ok(Vec::new())
            }
            14 | 27 => Ok(vec![0u8; 16]), // OPEN, OPENDIR: fuse_open_out
            15 => {
                let (offset, size) = (u64_at(arg, 8) as usize, u32_at(arg, 16) as usize);
                match &self.nodes.get(&node).ok_or(libc::ENOENT)?.body {
                    Body::File(data) => {
                        let start = offset.min(data.len());
                        Ok(data[start..(start + size).min(data.len())].to_vec())
                    }
                    Body::Dir(_) => Err(libc::EISDIR),
                }
            }
            16 => {
                let (offset, size) = (u64_at(arg, 8) as usize, u32_at(arg, 16) as usize);
                let bytes = &arg[40..40 + size];
                match &mut self.nodes.get_mut(&node).ok_or(libc::ENOENT)?.body {
                    Body::File(data) => {
                        if data.len() < offset + size {
                            data.resize(offset + size, 0);
                        }
                        data[offset..offset + size].copy_from_slice(bytes);
                        let mut out = (size as u32).to_ne_bytes().to_vec();
                        out.extend_from_slice(&[0u8; 4]);
                        Ok(out)
                    }
                    Body::Dir(_) => Err(libc::EISDIR),
                }
            }
            17 => {
                // fuse_kstatfs: blocks, bfree, bavail, files, ffree, bsize,
                // namelen, frsize, padding, spare[6].
                let mut out = Vec::with_capacity(80);
                for v in [1u64 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20] {
                    out.extend_from_slice(&v.to_ne_bytes());
                }
                for v in [4096u32, 255, 4096] {
                    out.extend_from_slice(&v.to_ne_bytes());
                }
                out.resize(80, 0);
                Ok(out)
            }
            28 => {
                let (offset, size) = (u64_at(arg, 8) as usize, u32_at(arg, 16) as usize);
                let entries: Vec<(Vec<u8>, u64)> = self
                    .dir(node)?
                    .iter()
                    .map(|(k, &v)| (k.clone(), v))
                    .collect();
                let mut out = Vec::new();
                for (i, (name, ino)) in entries.iter().enumerate().skip(offset) {
                    let len = (24 + name.len()).div_ceil(8) * 8;
                    if out.len() + len > size {
                        break;
                    }
                    let kind = match self.nodes[ino].body {
                        Body::Dir(_) => libc::DT_DIR,
                        Body::File(_) => libc::DT_REG,
                    };
                    out.extend_from_slice(&ino.to_ne_bytes());
                    out.extend_from_slice(&(i as u64 + 1).to_ne_bytes());
                    out.extend_from_slice(&(name.len() as u32).to_ne_bytes());
                    out.extend_from_slice(&(kind as u32).to_ne_bytes());
                    out.extend_from_slice(name);
                    out.resize(out.len().div_ceil(8) * 8, 0);
                }
                Ok(out)
            }
            // RELEASE, FSYNC, FLUSH, RELEASEDIR, FSYNCDIR, ACCESS
            18 | 20 | 25 | 29 | 30 | 34 => Ok(Vec::new()),
            _ => Err(libc::ENOSYS),
        }
    }

    fn dir(&mut self, node: u64) -> Result<&mut BTreeMap<Vec<u8>, u64>, i32> {
        match &mut self.nodes.get_mut(&node).ok_or(libc::ENOENT)?.body {
            Body::Dir(entries) => Ok(entries),
            Body::File(_) => Err(libc::ENOTDIR),
        }
    }

    fn child(&mut self, node: u64, name: &[u8]) -> Result<u64, i32> {
        self.dir(node)?.get(name).copied().ok_or(libc::ENOENT)
    }

    fn add(&mut self, parent: u64, name: Vec<u8>, mode: u32, body: Body) -> Result<u64, i32> {
        let ino = self.next;
        let entries = self.dir(parent)?;
        if entries.contains_key(&name) {
            return Err(libc::EEXIST);
        }
        entries.insert(name, ino);
        self.next += 1;
        self.nodes.insert(ino, Node { mode, body });
        Ok(ino)
    }

    fn setattr(&mut self, node: u64, arg: &[u8]) -> Reply {
        const FATTR_MODE: u32 = 1;
        const FATTR_SIZE: u32 = 8;
        let valid = u32_at(arg, 0);
        let entry = self.nodes.get_mut(&node).ok_or(libc::ENOENT)?;
        if valid & FATTR_SIZE != 0 {
            match &mut entry.body {
                Body::File(data) => data.resize(u64_at(arg, 16) as usize, 0),
                Body::Dir(_) => return Err(libc::EISDIR),
            }
        }
        if valid & FATTR_MODE != 0 {
            entry.mode = (entry.mode & libc::S_IFMT) | (u32_at(arg, 68) & 0o7777);
        }
        self.attr_out(node)
    }

    /// fuse_attr: nothing cached by the kernel (valid for 0 s).
    fn attr(&self, ino: u64) -> Result<Vec<u8>, i32> {
        let node = self.nodes.get(&ino).ok_or(libc::ENOENT)?;
        let (size, nlink) = match &node.body {
            Body::File(data) => (data.len() as u64, 1u32),
            Body::Dir(_) => (0, 2),
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let mut out = Vec::with_capacity(88);
        for v in [
            ino,
            size,
            size.div_ceil(512),
            now.as_secs(),
            now.as_secs(),
            now.as_secs(),
        ] {
            out.extend_from_slice(&v.to_ne_bytes());
        }
        let nanos = now.subsec_nanos();
        for v in [nanos, nanos, nanos, node.mode, nlink, 0, 0, 0, 4096, 0] {
            out.extend_from_slice(&v.to_ne_bytes());
        }
        Ok(out)
    }

    fn attr_out(&self, ino: u64) -> Reply {
        let mut out = vec![0u8; 16];
        out.extend_from_slice(&self.attr(ino)?);
        Ok(out)
    }

    fn entry_out(&self, ino: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        out.extend_from_slice(&ino.to_ne_bytes());
        out.extend_from_slice(&[0u8; 32]); // generation, entry and attr validity
        out.extend_from_slice(&self.attr(ino).expect("a node just found"));
        out
    }
}

/// fuse_init_out for protocol 7.31.
fn init_out(max_readahead: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    for v in [7u32, 31, max_readahead, FUSE_BIG_WRITES] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
    out.extend_from_slice(&16u16.to_ne_bytes()); // max_background
    out.extend_from_slice(&12u16.to_ne_bytes()); // congestion_threshold
    out.extend_from_slice(&MAX_WRITE.to_ne_bytes());
    out.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
    out.resize(64, 0);
    out
}
