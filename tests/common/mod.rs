//! Shared test harness: a primary buffer owned by the test, a tier over it, and
//! helpers to make keys, fill rows and run jobs to completion. Real Redis
//! servers and clusters for the redis backend's tests: `redis`.

#![allow(dead_code)]

pub mod hostile;
pub mod redis;

use kvtier::{EventKind, JobResult, LookupState, PrimaryBuffer, Tier, TierConfig};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::path::{Path, PathBuf};

pub const KEY_LEN: usize = 36;

/// Skipping (`skip`, `in_ci`, the marker CTest matches) and scratch
/// directories are the Redis harness's, so a test and its servers agree.
/// (Each test binary uses some of them.)
#[allow(unused_imports)]
pub use kvtier_redis_harness::{in_ci, scratch_dir, skip, SKIP_MARKER};

/// A 36-byte key like vLLM's (32-byte hash + 4-byte group), derived from `i`.
pub fn key(i: u64) -> Vec<u8> {
    let mut k = vec![0u8; KEY_LEN];
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5555;
    for chunk in k[..32].chunks_mut(8) {
        x = splitmix(x);
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    k[32..].copy_from_slice(&(i as u32).to_be_bytes());
    k
}

/// The `i` a key made by [`key`] was derived from.
pub fn id_of(key: &[u8]) -> u64 {
    assert_eq!(key.len(), KEY_LEN, "not a test key: {key:?}");
    u32::from_be_bytes(key[32..].try_into().unwrap()) as u64
}

/// `config` with block events on, holding `capacity` of them.
pub fn with_events(mut config: TierConfig, capacity: usize) -> TierConfig {
    config.events = true;
    config.events_capacity = capacity;
    config
}

pub fn keys(ids: &[u64]) -> Vec<u8> {
    ids.iter().flat_map(|&i| key(i)).collect()
}

pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The bytes block `i` holds in tests: deterministic per key.
pub fn pattern(i: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut x = i ^ 0xdead_beef;
    while out.len() < len {
        x = splitmix(x);
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A small deterministic PRNG for randomized tests.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x1234_5678)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = splitmix(self.0);
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A 4 KiB-aligned zeroed buffer the test owns.
pub struct Buffer {
    ptr: *mut u8,
    layout: Layout,
}

unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Buffer {
    pub fn new(len: usize) -> Buffer {
        let layout = Layout::from_size_align(len, 4096).unwrap();
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Buffer { ptr, layout }
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// A tier over a test-owned primary buffer. Rows are read and written only
/// while no job is using them (the tests' own discipline, as an engine's).
pub struct Harness {
    pub tier: Option<Tier>,
    pub buffer: Buffer,
    pub block_bytes: usize,
    pub rows: usize,
    /// A scratch directory of a disk tier, removed with the harness.
    pub scratch_dir: Option<std::path::PathBuf>,
}

impl Harness {
    pub fn new(config: &TierConfig, rows: usize, block_bytes: usize) -> Harness {
        Self::build(config, rows, block_bytes, false)
    }

    /// A harness over a directory the test owns: it is left behind.
    pub fn leaving_dir(config: &TierConfig, rows: usize, block_bytes: usize) -> Harness {
        let mut h = Self::new(config, rows, block_bytes);
        h.scratch_dir = None;
        h
    }

    /// A tier whose jobs run only via `run`.
    pub fn manual(config: &TierConfig, rows: usize, block_bytes: usize) -> Harness {
        Self::build(config, rows, block_bytes, true)
    }

    fn build(config: &TierConfig, rows: usize, block_bytes: usize, manual: bool) -> Harness {
        let buffer = Buffer::new(rows * block_bytes);
        let primary =
            unsafe { PrimaryBuffer::new(buffer.ptr(), buffer.len(), block_bytes) }.unwrap();
        let tier = if manual {
            Tier::new_manual(config, primary)
        } else {
            Tier::new(config, primary)
        }
        .unwrap();
        let scratch_dir = config
            .disk
            .path
            .clone()
            .or_else(|| config.persist_path.clone())
            .filter(|p| is_scratch(p));
        Harness {
            tier: Some(tier),
            buffer,
            block_bytes,
            rows,
            scratch_dir,
        }
    }

    pub fn tier(&self) -> &Tier {
        self.tier.as_ref().expect("tier alive")
    }

    pub fn row(&self, row: usize) -> &[u8] {
        assert!(row < self.rows);
        unsafe {
            std::slice::from_raw_parts(
                self.buffer.ptr().add(row * self.block_bytes),
                self.block_bytes,
            )
        }
    }

    pub fn write_row(&self, row: usize, data: &[u8]) {
        assert!(row < self.rows && data.len() == self.block_bytes);
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.buffer.ptr().add(row * self.block_bytes),
                data.len(),
            )
        }
    }

    /// Writes block `i`'s pattern into `row`.
    pub fn fill(&self, row: usize, i: u64) {
        self.write_row(row, &pattern(i, self.block_bytes));
    }

    pub fn row_holds(&self, row: usize, i: u64) -> bool {
        self.row(row) == pattern(i, self.block_bytes).as_slice()
    }

    /// Stores blocks `ids` from rows 0.. (each filled with its pattern first)
    /// and checks the job succeeded.
    pub fn store_all(&self, job: u64, ids: &[u64]) {
        for (r, &i) in ids.iter().enumerate() {
            self.fill(r, i);
        }
        let rows: Vec<i64> = (0..ids.len() as i64).collect();
        let r = self.store(job, ids, &rows);
        assert!(r.is_ok(), "{r:?}");
    }

    /// Submits a store and waits for its result.
    pub fn store(&self, job: u64, ids: &[u64], rows: &[i64]) -> JobResult {
        self.tier()
            .submit_store(job, &keys(ids), KEY_LEN, rows)
            .unwrap();
        self.result_of(job)
    }

    /// Submits a load and waits for its result.
    pub fn load(&self, job: u64, ids: &[u64], rows: &[i64]) -> JobResult {
        self.tier()
            .submit_load(job, &keys(ids), KEY_LEN, rows)
            .unwrap();
        self.result_of(job)
    }

    /// The most blocks storage may hold while [`Harness::stream_stores`]
    /// runs on a tier of `capacity` blocks: the resident ones, plus the
    /// evictions of the jobs in flight (each job evicts as many blocks as it
    /// stores), with one window to spare.
    pub fn stream_bound(capacity: usize, window: u64, job_blocks: usize) -> usize {
        capacity + 2 * window as usize * job_blocks
    }

    /// Stores `jobs` jobs of `job_blocks` new keys each (ids from `first_id`
    /// on, all read from rows 0..job_blocks), keeping `window` jobs in
    /// flight, as an engine cascading into a full tier does; checks every
    /// job succeeded. Calls `sample` after every `sample_every` completions
    /// and returns the largest value it gave.
    pub fn stream_stores(
        &self,
        first_id: u64,
        jobs: u64,
        job_blocks: usize,
        window: u64,
        sample_every: u64,
        mut sample: impl FnMut() -> usize,
    ) -> usize {
        for r in 0..job_blocks {
            self.fill(r, first_id + r as u64);
        }
        let rows: Vec<i64> = (0..job_blocks as i64).collect();
        let submit = |job: u64| {
            let ids: Vec<u64> = (0..job_blocks as u64)
                .map(|b| first_id + job * job_blocks as u64 + b)
                .collect();
            self.tier()
                .submit_store(job, &keys(&ids), KEY_LEN, &rows)
                .unwrap();
        };
        let (mut submitted, mut done, mut most) = (0, 0, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while done < jobs {
            while submitted < jobs && submitted - done < window {
                submit(submitted);
                submitted += 1;
            }
            let results = self.tier().poll(window as usize);
            if results.is_empty() {
                assert!(std::time::Instant::now() < deadline, "stores stopped");
                self.tier().wait(std::time::Duration::from_millis(10));
            }
            for r in &results {
                assert!(r.is_ok(), "{r:?}");
                done += 1;
                if done % sample_every == 0 {
                    most = most.max(sample());
                }
            }
        }
        most
    }

    /// Polls until `jobs` results came or `within` passed since `started`;
    /// each result with when it came (since `started`), in that order.
    pub fn results_timed(
        &self,
        jobs: usize,
        started: std::time::Instant,
        within: std::time::Duration,
    ) -> Vec<(JobResult, std::time::Duration)> {
        let mut reported = Vec::new();
        while reported.len() < jobs && started.elapsed() < within {
            for r in self.tier().poll(jobs) {
                reported.push((r, started.elapsed()));
            }
            self.tier().wait(std::time::Duration::from_millis(5));
        }
        reported
    }

    /// Waits for and returns job `job`'s result; fails if another job's result
    /// shows up first.
    pub fn result_of(&self, job: u64) -> JobResult {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let polled = self.tier().poll(1);
            if let Some(r) = polled.first() {
                assert_eq!(r.job_id, job, "unexpected result {r:?}");
                return *r;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "job {job} never finished"
            );
            self.tier().wait(std::time::Duration::from_millis(10));
        }
    }

    pub fn lookup(&self, ids: &[u64]) -> Vec<LookupState> {
        self.tier().lookup(&keys(ids), KEY_LEN).unwrap()
    }

    /// Looks `ids` up until none is PENDING (a shared tier's probes all
    /// answered), failing the test if that takes longer than `within`.
    pub fn lookup_settled(&self, ids: &[u64], within: std::time::Duration) -> Vec<LookupState> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let states = self.lookup(ids);
            if !states.contains(&LookupState::Pending) {
                return states;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "verdicts missing after {within:?}: {states:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    pub fn touch(&self, ids: &[u64]) {
        self.tier().touch(&keys(ids), KEY_LEN).unwrap()
    }

    /// Every block event waiting, as (kind, key id; 0 for LOST), after
    /// checking that their sequence numbers follow on from each other.
    pub fn events(&self) -> Vec<(EventKind, u64)> {
        let events = self.tier().poll_events(usize::MAX).unwrap();
        for pair in events.windows(2) {
            let step = match pair[0].kind {
                EventKind::Lost { dropped } => dropped,
                _ => 1,
            };
            assert_eq!(pair[1].seq, pair[0].seq + step, "{events:?}");
        }
        events
            .iter()
            .map(|e| match e.kind {
                EventKind::Lost { .. } => (e.kind, 0),
                _ => (e.kind, id_of(e.key())),
            })
            .collect()
    }

    /// Which of `ids` are stored (HIT).
    pub fn present(&self, ids: &[u64]) -> Vec<u64> {
        ids.iter()
            .zip(self.lookup(ids))
            .filter(|(_, s)| *s == LookupState::Hit)
            .map(|(&i, _)| i)
            .collect()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // The tier must go before the buffer it points into.
        self.tier.take();
        if let Some(dir) = &self.scratch_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn is_scratch(path: &std::path::Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("kvtier-test-"))
}

/// A fresh, empty directory on /dev/shm (tmpfs: a persistent memory arena's
/// `persist_path` must be in memory), unique per call.
pub fn shm_scratch_dir() -> std::path::PathBuf {
    let dir = std::path::Path::new("/dev/shm").join(scratch_dir().file_name().unwrap());
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A memory tier whose arena persists in a fresh directory on /dev/shm.
pub fn memory_persist_config(capacity_blocks: usize, block_bytes: usize) -> TierConfig {
    TierConfig {
        persist_path: Some(shm_scratch_dir()),
        namespace: "contract".into(),
        ..memory_config(capacity_blocks, block_bytes)
    }
}

/// A disk tier configuration in a fresh scratch directory.
pub fn disk_config(capacity_blocks: usize, block_bytes: usize) -> TierConfig {
    let mut c = memory_config(capacity_blocks, block_bytes);
    c.backend = kvtier::BackendKind::Disk;
    c.io_threads = Some(4);
    c.disk.path = Some(scratch_dir());
    c.namespace = "contract".into();
    c
}

/// A disk tier over `dir`, a directory the test owns, shared or not, sealed
/// with `seal` or not; shared storage is probed every 50 ms, so that other
/// tenants' changes show quickly.
pub fn tenant_disk_config(
    dir: &Path,
    shared: bool,
    seal: Option<&str>,
    block_bytes: usize,
) -> TierConfig {
    let mut c = disk_config(64, block_bytes);
    c.disk.path = Some(dir.to_path_buf());
    c.disk.shared = shared;
    c.probe_ttl_ms = 50;
    if let Some(seal) = seal {
        c.set("seal_key", seal).unwrap();
    }
    c
}

/// Two tenants' seal keys for tests.
pub const SEAL_A: &str = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
pub const SEAL_B: &str = "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2";

/// A disk tier configuration sealed with tenant A's key.
pub fn sealed_disk_config(capacity_blocks: usize, block_bytes: usize) -> TierConfig {
    let mut c = disk_config(capacity_blocks, block_bytes);
    c.set("seal_key", SEAL_A).unwrap();
    c
}

/// The configurations the contract suite runs on, by name.
pub fn memory_config(capacity_blocks: usize, block_bytes: usize) -> TierConfig {
    TierConfig {
        capacity_bytes: (capacity_blocks * block_bytes) as u64,
        io_threads: Some(2),
        ..TierConfig::default()
    }
}

/// [`memory_config`] with the arena populated ahead (`full`) or never
/// (`off`), for the contract suite (the default is `background`).
pub fn memory_full_prefault_config(capacity_blocks: usize, block_bytes: usize) -> TierConfig {
    TierConfig {
        prefault: Some(kvtier::Prefault::Full),
        ..memory_config(capacity_blocks, block_bytes)
    }
}

/// See [`memory_full_prefault_config`].
pub fn memory_no_prefault_config(capacity_blocks: usize, block_bytes: usize) -> TierConfig {
    TierConfig {
        prefault: Some(kvtier::Prefault::Off),
        ..memory_config(capacity_blocks, block_bytes)
    }
}

/// This test binary again, running only its ignored test `name` (the other
/// process of a multi-process test); the caller adds the environment.
pub fn test_child(name: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        name,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    cmd
}

/// Every file under `dir` (recursively) whose name ends with `ext`, sorted;
/// none if `dir` does not exist.
pub fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.extend(files(&p, ext));
        } else if p.to_string_lossy().ends_with(ext) {
            out.push(p);
        }
    }
    out.sort();
    out
}
