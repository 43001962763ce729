//! Memory backend, first fill: what the kernel's page-fault path costs, how
//! close a cold tier's first stores come to it, and what `prefault` buys.
//!
//! Per repetition, each on a fresh tier or region of the same size, over the
//! source rows the bandwidth phase filled (every stored byte is loaded back
//! and compared):
//!
//! - **population bound**: a fresh `MAP_NORESERVE` region with the arena's page
//!   policy (`MADV_HUGEPAGE` for blocks of 2 MiB or more), populated with
//!   `MADV_POPULATE_WRITE` one block at a time by `io_threads` threads;
//! - **first-touch copy bound**: the same work done raw: each source row
//!   copied into a fresh region with the arena's page policy by `io_threads`
//!   threads, the copy itself faulting the pages in. On a machine where the
//!   copying threads already use every core, the kernel's zeroing of each
//!   page and the copy add up rather than overlap, so this, not population
//!   alone, is what a cold store can reach;
//! - **cold store**: `prefault=off`, the first store pass (pays the faults);
//!   alternated with the bounds (ABBA), as all depend on how much free memory
//!   the kernel has in huge-page-sized pieces at that moment;
//! - **`full`**: time from `tier_new` until `resident_bytes` reaches the
//!   capacity (s/GiB), then the first store pass, alternated (ABBA) with its
//!   own bound: a fresh region with the arena's page policy, populated, then
//!   the first memcpy into it; and on another fresh tier, a store pass
//!   started right after `tier_new` (population in progress);
//! - **`background`** (the default): a store pass right after `tier_new`,
//!   alternated (ABBA) with its own first-touch copy bound;
//! - **page policies**: a fresh region populated under 4 KiB pages
//!   (`MADV_NOHUGEPAGE`), THP (`MADV_HUGEPAGE`), and 4 KiB pages collapsed
//!   afterwards (`MADV_COLLAPSE`), each followed by a memcpy pass into it
//!   (what steady-state copies cost on those pages).
//!
//! Why every target has a bound measured next to it: what the first touch of
//! fresh memory costs changes from one pass to the next. On a VM with free
//! page reporting (this one: `page_reporting_order=11`), memory freed for
//! about 2 s goes back to the hypervisor, and the next first touch of it pays
//! the host's fault as well; so does the first memcpy into memory populated
//! from such pages (docs/runs/memory.md). A median of bounds taken minutes
//! away from the pass they judge then scores the machine, not the tier.

use super::verify::verify;
use crate::buffer::{time_parallel, MappedBuf};
use crate::capi::{Config, Tier};
use crate::cli::Settings;
use crate::jobs::{JobIds, Stream};
use crate::progress::Progress;
use std::time::{Duration, Instant};

/// The rows and streams of the bandwidth phase, reused here.
pub struct Setup<'a> {
    pub buf: &'a MappedBuf,
    pub store: &'a Stream<'a>,
    pub load: &'a Stream<'a>,
    pub rows: usize,
    pub block: usize,
    pub capacity: u64,
    pub io_threads: usize,
    pub helpers: usize,
}

pub struct Results {
    pub threads: usize,
    pub bytes: u64,
    pub capacity: u64,
    pub huge_advice: bool,
    /// GB/s per repetition.
    pub populate_bound: Vec<f64>,
    pub first_touch_bound: Vec<f64>,
    pub cold_store: Vec<f64>,
    pub full_populate_s_per_gib: Vec<f64>,
    pub full_store_after: Vec<f64>,
    /// The first memcpy into a freshly populated region, next to each
    /// `full_store_after` pass.
    pub full_after_bound: Vec<f64>,
    pub full_store_during: Vec<f64>,
    pub background_store_first: Vec<f64>,
    /// A first-touch copy bound next to each `background_store_first` pass.
    pub background_bound: Vec<f64>,
    pub policies: Vec<Policy>,
    pub verified_bytes: u64,
}

/// A page policy's population rate and the memcpy rate into its pages.
pub struct Policy {
    pub name: &'static str,
    pub populate: Vec<f64>,
    /// Seconds of `MADV_COLLAPSE` per GiB (collapse policy only).
    pub collapse_s_per_gib: Vec<f64>,
    /// Repetitions where `MADV_COLLAPSE` refused with EAGAIN (no free huge
    /// pages to collapse into); the memcpy pass then ran on 4 KiB pages.
    pub collapse_refused: usize,
    pub memcpy: Vec<f64>,
}

const POLICIES: [&str; 3] = [
    "4 KiB pages (MADV_NOHUGEPAGE)",
    "THP (MADV_HUGEPAGE)",
    "4 KiB, then MADV_COLLAPSE",
];

/// Whether the memory backend advises huge pages for its arena (it does for
/// blocks of 2 MiB or more).
pub(super) fn arena_huge_pages(block: usize) -> bool {
    block >= 2 << 20
}

pub fn run(p: &Settings, s: &Setup) -> Result<Results, String> {
    let bytes = (s.rows * s.block) as u64;
    let mut r = Results {
        threads: s.io_threads,
        bytes,
        capacity: s.capacity,
        huge_advice: arena_huge_pages(s.block),
        populate_bound: Vec::new(),
        first_touch_bound: Vec::new(),
        cold_store: Vec::new(),
        full_populate_s_per_gib: Vec::new(),
        full_store_after: Vec::new(),
        full_after_bound: Vec::new(),
        full_store_during: Vec::new(),
        background_store_first: Vec::new(),
        background_bound: Vec::new(),
        policies: POLICIES
            .iter()
            .map(|&name| Policy {
                name,
                populate: Vec::new(),
                collapse_s_per_gib: Vec::new(),
                collapse_refused: 0,
                memcpy: Vec::new(),
            })
            .collect(),
        verified_bytes: 0,
    };
    // Per repetition: 2 bounds, cold, 3 prefault tiers (+ verification),
    // their 2 bounds (one populating too), 3 policies.
    let units = (3 + 3 * 2 + 3 + 3 * 2) as u64 * p.repeat as u64;
    let mut bar = Progress::new(p.progress, "first fill: passes", units * bytes);
    let mut ids = JobIds::default();
    for rep in 0..p.repeat {
        let bound_first = rep % 2 == 0;
        let ((), (gbps, verified)) = next_to(
            bound_first,
            &mut bar,
            |bar| bounds(s, &mut r, bar),
            |bar| first_pass(s, "off", Wait::No, &mut ids, bar),
        )?;
        r.cold_store.push(gbps);
        r.verified_bytes += verified;

        let huge = r.huge_advice;
        let mut populated = 0.0;
        let (bound, (gbps, verified)) = next_to(
            bound_first,
            &mut bar,
            |bar| populated_copy(s, huge, bar),
            |bar| first_pass(s, "full", Wait::Resident(&mut populated), &mut ids, bar),
        )?;
        r.full_after_bound.push(bound);
        r.full_populate_s_per_gib
            .push(populated / (s.capacity as f64 / (1u64 << 30) as f64));
        r.full_store_after.push(gbps);
        r.verified_bytes += verified;
        let (gbps, verified) = first_pass(s, "full", Wait::No, &mut ids, &mut bar)?;
        r.full_store_during.push(gbps);
        r.verified_bytes += verified;
        let (bound, (gbps, verified)) = next_to(
            bound_first,
            &mut bar,
            |bar| {
                let gbps = first_touch_copy(s.buf, s.rows, s.block, s.io_threads, huge)?.0;
                bar.add(bytes);
                Ok(gbps)
            },
            |bar| first_pass(s, "background", Wait::No, &mut ids, bar),
        )?;
        r.background_bound.push(bound);
        r.background_store_first.push(gbps);
        r.verified_bytes += verified;

        for (i, advice) in [Advice::NoHuge, Advice::Huge, Advice::Collapse]
            .into_iter()
            .enumerate()
        {
            let (populate, collapse, memcpy) = policy_pass(s, advice)?;
            let policy = &mut r.policies[i];
            policy.populate.push(populate);
            policy.memcpy.push(memcpy);
            match collapse {
                Some(Collapse::Done(c)) => policy.collapse_s_per_gib.push(c),
                Some(Collapse::Refused) => policy.collapse_refused += 1,
                None => {}
            }
            bar.add(2 * bytes);
        }
    }
    bar.finish();
    Ok(r)
}

/// The two raw bounds of a cold store, each on a fresh region.
fn bounds(s: &Setup, r: &mut Results, bar: &mut Progress) -> Result<(), String> {
    // Each region is unmapped before the next mapping is made, as each tier
    // is, so that all of them get pages the kernel just had back (a page
    // never touched since boot, or handed back to a hypervisor, costs more).
    let populated = populate_region(s, Advice::AsTier(r.huge_advice))?.0;
    r.populate_bound.push(populated);
    let touched = first_touch_copy(s.buf, s.rows, s.block, s.io_threads, r.huge_advice)?.0;
    r.first_touch_bound.push(touched);
    bar.add(2 * r.bytes);
    Ok(())
}

/// Runs `bound` and `pass` one after the other, the bound first when
/// `bound_first` (alternated by repetition: ABBA), so that each pass is judged
/// against a bound the kernel gave the same kind of pages; (bound, pass).
fn next_to<B, T>(
    bound_first: bool,
    bar: &mut Progress,
    bound: impl FnOnce(&mut Progress) -> Result<B, String>,
    pass: impl FnOnce(&mut Progress) -> Result<T, String>,
) -> Result<(B, T), String> {
    if bound_first {
        let b = bound(bar)?;
        Ok((b, pass(bar)?))
    } else {
        let p = pass(bar)?;
        Ok((bound(bar)?, p))
    }
}

/// The bound of a populated tier's first store: a fresh region with the
/// arena's page policy, populated, then the first memcpy into it (GB/s of the
/// memcpy).
fn populated_copy(s: &Setup, huge: bool, bar: &mut Progress) -> Result<f64, String> {
    let (_, region) = populate_region(s, Advice::AsTier(huge))?;
    let gbps = copy_rows_into(s.buf, &region, s.block, s.io_threads)?;
    bar.add(2 * region.len as u64);
    Ok(gbps)
}

enum Wait<'a> {
    /// Store at once.
    No,
    /// Wait until the whole capacity is resident; its seconds from `tier_new`.
    Resident(&'a mut f64),
}

/// A fresh tier with `prefault`, one store pass (GB/s), then every key loaded
/// back and compared (bytes verified).
fn first_pass(
    s: &Setup,
    prefault: &str,
    wait: Wait,
    ids: &mut JobIds,
    bar: &mut Progress,
) -> Result<(f64, u64), String> {
    let mut cfg = Config::new().map_err(|e| e.to_string())?;
    for (k, v) in [
        ("capacity_bytes", s.capacity.to_string()),
        ("io_threads", s.io_threads.to_string()),
        ("prefault", prefault.to_string()),
    ] {
        cfg.set(k, &v).map_err(|e| e.to_string())?;
    }
    let opened = Instant::now();
    let tier = Tier::new(&cfg, s.buf, s.block).map_err(|e| e.to_string())?;
    if let Wait::Resident(secs) = wait {
        let deadline = opened + Duration::from_secs(600);
        loop {
            let st = tier.stats().map_err(|e| e.to_string())?;
            if st.resident_bytes >= st.capacity_bytes {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "prefault=full: {} of {} bytes resident after 600 s ({})",
                    st.resident_bytes,
                    st.capacity_bytes,
                    tier.describe()
                ));
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        *secs = opened.elapsed().as_secs_f64();
    }
    let pass = s.store.run(&tier, ids, |b| bar.add(b))?;
    let verified = verify(&tier, s.buf, s.load, s.rows, s.block, s.helpers, ids, bar)?;
    Ok((pass.gbps(), verified))
}

#[derive(Clone, Copy)]
enum Advice {
    /// What the memory backend does: huge pages for blocks of 2 MiB or more.
    AsTier(bool),
    NoHuge,
    Huge,
    /// No advice while populating (4 KiB pages here), then `MADV_COLLAPSE`.
    Collapse,
}

/// A fresh region of the pass's size with `advice`, populated block by block
/// with the tier's thread count: (GB/s, the region).
fn populate_region(s: &Setup, advice: Advice) -> Result<(f64, Region), String> {
    let region = Region::new((s.rows * s.block) as u64 as usize)?;
    let huge = match advice {
        Advice::AsTier(huge) => huge.then_some(libc::MADV_HUGEPAGE),
        Advice::NoHuge => Some(libc::MADV_NOHUGEPAGE),
        Advice::Huge => Some(libc::MADV_HUGEPAGE),
        Advice::Collapse => None,
    };
    if let Some(advice) = huge {
        region.advise(0, region.len, advice)?;
    }
    let secs = time_parallel(s.io_threads, s.rows, |i| {
        region.advise(i * s.block, s.block, libc::MADV_POPULATE_WRITE)
    })?;
    Ok((region.len as f64 / secs / 1e9, region))
}

/// The raw cold copy: the first `rows` rows of `src` copied block by block
/// by `threads` threads into a fresh region with the arena's page policy
/// (`MADV_HUGEPAGE` when `huge`), so that each copy faults its pages in as a
/// cold store's does. Returns (GB/s, the region): a caller that keeps the
/// region mapped keeps the kernel from handing its pages to the next fresh
/// mapping, whose first touch then costs what this one's did.
pub(super) fn first_touch_copy(
    src: &MappedBuf,
    rows: usize,
    block: usize,
    threads: usize,
    huge: bool,
) -> Result<(f64, Region), String> {
    let region = Region::new(rows * block)?;
    if huge {
        region.advise(0, region.len, libc::MADV_HUGEPAGE)?;
    }
    let gbps = copy_rows_into(src, &region, block, threads)?;
    Ok((gbps, region))
}

/// Copies source row i of `src` to block i of `region`, for every block of
/// the region, with `threads` threads; GB/s.
fn copy_rows_into(
    src: &MappedBuf,
    region: &Region,
    block: usize,
    threads: usize,
) -> Result<f64, String> {
    let rows = region.len / block;
    let secs = time_parallel(threads, rows, |i| {
        // SAFETY: source row i of `src` (no job in flight; the primary
        // buffer holds at least `rows` rows) and block i of our region:
        // distinct mappings, in bounds.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr().add(i * block), region.at(i * block), block)
        };
        Ok::<(), String>(())
    })?;
    Ok(region.len as f64 / secs / 1e9)
}

/// What `MADV_COLLAPSE` did to a populated region.
enum Collapse {
    /// Seconds per GiB.
    Done(f64),
    /// EAGAIN: the kernel found no free huge pages (or could not compact
    /// enough in time); the region stays on 4 KiB pages. A fact about the
    /// machine at that moment, reported rather than fatal.
    Refused,
}

/// (populate GB/s, what collapse did for that policy, memcpy GB/s into the pages).
fn policy_pass(s: &Setup, advice: Advice) -> Result<(f64, Option<Collapse>, f64), String> {
    let (populate, region) = populate_region(s, advice)?;
    let collapse = match advice {
        Advice::Collapse => {
            let start = Instant::now();
            match region.advise_raw(0, region.len, libc::MADV_COLLAPSE) {
                Ok(()) => {
                    let secs = start.elapsed().as_secs_f64();
                    Some(Collapse::Done(
                        secs / (region.len as f64 / (1u64 << 30) as f64),
                    ))
                }
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Some(Collapse::Refused),
                Err(e) => {
                    return Err(format!(
                        "madvise(MADV_COLLAPSE) of {} bytes: {e}",
                        region.len
                    ))
                }
            }
        }
        _ => None,
    };
    let memcpy = copy_rows_into(s.buf, &region, s.block, s.io_threads)?;
    Ok((populate, collapse, memcpy))
}

/// A fresh reserved anonymous mapping, as the memory backend makes its arena.
pub(super) struct Region {
    buf: MappedBuf,
    len: usize,
}

impl Region {
    fn new(len: usize) -> Result<Region, String> {
        Ok(Region {
            buf: MappedBuf::reserve(len)?,
            len,
        })
    }

    fn at(&self, offset: usize) -> *mut u8 {
        assert!(offset < self.len);
        // SAFETY: in bounds (checked above).
        unsafe { self.buf.as_ptr().add(offset) }
    }

    fn advise(&self, offset: usize, len: usize, advice: libc::c_int) -> Result<(), String> {
        self.advise_raw(offset, len, advice)
            .map_err(|e| format!("madvise({advice}) of {len} bytes: {e}"))
    }

    fn advise_raw(&self, offset: usize, len: usize, advice: libc::c_int) -> std::io::Result<()> {
        assert!(offset + len <= self.len);
        // SAFETY: advice on our own mapping.
        let rc = unsafe { libc::madvise(self.at(offset) as *mut libc::c_void, len, advice) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}
