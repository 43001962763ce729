//! The `kvtier` command on a disk directory: inspect, verify (faults a test
//! injects while two live tier processes store and load), repair (only what
//! a tier may remove, no good block lost), gc under live load (within the
//! budget plus one job's stores; every load exact or a miss; least recently
//! used first, by the access time loads stamp), clear (one namespace, for
//! every live tier, nothing else), and a closed directory counted from its
//! manifest.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use common::{files, key, Harness, KEY_LEN};
use kvtier::admin::disk::NamespaceDir;
use kvtier::TierConfig;
use std::fs::{File, FileTimes};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use support::{config_text, finish_worker, kvtier, spawn_worker, stop_file, strings, JOB_BLOCKS};

const NS: &str = "vllm/org-model-a/float16/t16/tp1pp1/r0/6859a213dc7a";
const OTHER_NS: &str = "vllm/org-model-b/float16/t16/tp1pp1/r0/0123456789ab";
const BB: usize = 16 << 10;

#[test]
#[ignore]
fn worker() {
    support::worker();
}

fn shared(root: &Path, namespace: &str, capacity_blocks: usize) -> TierConfig {
    let mut c = common::disk_config(capacity_blocks, BB);
    c.disk.path = Some(root.to_path_buf());
    c.disk.shared = true;
    c.namespace = namespace.into();
    c.probe_ttl_ms = 50;
    c
}

fn worker_config(root: &Path, capacity_blocks: usize) -> String {
    config_text(&[
        ("backend", "disk".into()),
        ("path", root.display().to_string()),
        ("shared", "true".into()),
        ("namespace", NS.into()),
        ("probe_ttl_ms", "50".into()),
        ("io_threads", "4".into()),
        ("capacity_bytes", (capacity_blocks * BB).to_string()),
    ])
}

fn ns_dir(root: &Path, namespace: &str) -> PathBuf {
    root.join(NamespaceDir::name_of(namespace, BB))
}

/// The block file of test key `i` in `namespace`'s directory.
fn block_file(root: &Path, namespace: &str, i: u64) -> PathBuf {
    let name = format!(
        "{}.kvb",
        key(i)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let found = files(&ns_dir(root, namespace), &name);
    assert_eq!(found.len(), 1, "block {i}: {found:?}");
    found[0].clone()
}

fn set_times(path: &Path, accessed: SystemTime, modified: SystemTime) {
    let f = File::options().write(true).open(path).unwrap();
    f.set_times(
        FileTimes::new()
            .set_accessed(accessed)
            .set_modified(modified),
    )
    .unwrap();
}

/// Copies a block file, with its header attribute when it has one (another
/// namespace's block at the very name this namespace's would have).
fn copy_block(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap();
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut value = vec![0u8; 4096];
    // SAFETY: valid C strings and a buffer of `value.len()` bytes.
    let n = unsafe {
        libc::getxattr(
            c(from).as_ptr(),
            c"user.kvtier".as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    if n > 0 {
        // SAFETY: as above, `n` bytes of it.
        let rc = unsafe {
            libc::setxattr(
                c(to).as_ptr(),
                c"user.kvtier".as_ptr(),
                value.as_ptr().cast(),
                n as usize,
                0,
            )
        };
        assert_eq!(rc, 0, "setxattr {}", to.display());
    }
}

fn root_dir() -> PathBuf {
    let root = common::scratch_dir();
    std::fs::create_dir_all(&root).unwrap();
    root
}

/// Stores blocks `ids` through a tier of `namespace` that then closes.
fn store_closed(root: &Path, namespace: &str, ids: &[u64]) {
    let h = Harness::leaving_dir(&shared(root, namespace, 1024), JOB_BLOCKS, BB);
    for (n, chunk) in ids.chunks(JOB_BLOCKS).enumerate() {
        h.store_all(n as u64 + 1, chunk);
    }
}

#[test]
fn verify_finds_every_injected_fault_and_repair_removes_only_what_a_tier_may() {
    let root = root_dir();
    let stop = stop_file(&root, "stop-faults");
    let config = worker_config(&root, 128);
    let workers = [1, 2].map(|id| spawn_worker("worker", &config, BB, id, 3 - id, &stop, 20));
    std::thread::sleep(Duration::from_millis(500));
    // Stored after the workers opened: no live tier indexes these blocks
    // (a shared tier adopts the blocks its open finds, and evicts them).
    let ids: Vec<u64> = (900..940).collect();
    store_closed(&root, NS, &ids);
    store_closed(&root, OTHER_NS, &[903]);
    // The faults, in blocks no live tier indexes (they store and load others).
    let flipped = block_file(&root, NS, 910);
    let mut bytes = std::fs::read(&flipped).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x10;
    std::fs::write(&flipped, &bytes).unwrap();
    let truncated = block_file(&root, NS, 911);
    File::options()
        .write(true)
        .open(&truncated)
        .unwrap()
        .set_len((BB - 4096) as u64)
        .unwrap();
    let foreign_block = block_file(&root, NS, 903);
    copy_block(&block_file(&root, OTHER_NS, 903), &foreign_block);
    let fan = block_file(&root, NS, 912).parent().unwrap().to_path_buf();
    let foreign_file = fan.join("notes.txt");
    std::fs::write(&foreign_file, b"an operator's notes").unwrap();
    let old_tmp = fan.join("00ab.kvb.4242-1.tmp");
    let young_tmp = fan.join("00ab.kvb.4242-2.tmp");
    std::fs::write(&old_tmp, b"half a store").unwrap();
    std::fs::write(&young_tmp, b"a store in progress").unwrap();
    let long_ago = SystemTime::now() - Duration::from_secs(1200);
    set_times(&old_tmp, long_ago, long_ago);
    let root_s = root.to_str().unwrap();

    let (status, inspect) = kvtier(&["inspect", root_s]);
    assert_eq!(status, 0, "{inspect}");
    let ours = inspect["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["namespace"] == NS)
        .expect("named by .namespace");
    assert_eq!(ours["held_by"], "shared tiers", "{ours}");
    assert!(
        ours["blocks"].as_u64().unwrap() >= ids.len() as u64,
        "{ours}"
    );
    assert!(
        ours["temporaries"]["files"].as_u64().unwrap() >= 2,
        "{ours}"
    );
    assert!(ours["foreign"]["files"].as_u64().unwrap() >= 1, "{ours}");

    let (status, verify) = kvtier(&["verify", root_s]);
    assert_eq!(status, 1, "problems found: {verify}");
    let set = |v: &serde_json::Value| {
        let mut v = strings(v);
        v.sort();
        v
    };
    let show = |paths: &[&PathBuf]| {
        let mut v: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        v.sort();
        v
    };
    assert_eq!(
        set(&verify["damaged"]),
        show(&[&flipped, &truncated]),
        "{verify}"
    );
    assert_eq!(
        set(&verify["foreign"]),
        show(&[&foreign_block, &foreign_file]),
        "{verify}"
    );
    assert_eq!(
        set(&verify["orphans"]),
        show(&[&old_tmp]),
        "the young one may be a store's: {verify}"
    );
    assert!(
        verify["ok"].as_u64().unwrap() >= ids.len() as u64 - 3,
        "{verify}"
    );

    let (status, repaired) = kvtier(&["verify", root_s, "--repair"]);
    assert_eq!(
        status, 1,
        "foreign files stay, so problems remain: {repaired}"
    );
    assert_eq!(
        set(&repaired["repair"]["removed"]),
        show(&[&flipped, &old_tmp, &truncated]),
        "{repaired}"
    );
    for kept in [&foreign_block, &foreign_file, &young_tmp] {
        assert!(kept.exists(), "{} was removed", kept.display());
    }
    assert!(!flipped.exists() && !truncated.exists() && !old_tmp.exists());

    // No good block was lost: every other block of the closed tier loads.
    let good: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|i| ![903, 910, 911].contains(i))
        .collect();
    let h = Harness::leaving_dir(&shared(&root, NS, 1024), good.len(), BB);
    let rows: Vec<i64> = (0..good.len() as i64).collect();
    let r = h.load(1, &good, &rows);
    assert!(r.is_ok(), "{r:?}");
    for (row, &i) in good.iter().enumerate() {
        assert!(h.row_holds(row, i), "block {i}");
    }
    drop(h);
    std::fs::write(&stop, b"").unwrap();
    for w in workers {
        finish_worker(w);
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn gc_under_live_load_ends_within_the_budget_least_recently_used_first() {
    let root = root_dir();
    let old: Vec<u64> = (5000..5200).collect();
    store_closed(&root, NS, &old);
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    for &i in &old {
        set_times(&block_file(&root, NS, i), an_hour_ago, an_hour_ago);
    }
    // Loads stamp the access time: these 20 become the old ones in use.
    let used: Vec<u64> = old[..20].to_vec();
    let h = Harness::leaving_dir(&shared(&root, NS, 1024), used.len(), BB);
    let rows: Vec<i64> = (0..used.len() as i64).collect();
    assert!(h.load(1, &used, &rows).is_ok());
    drop(h);
    let stop = stop_file(&root, "stop-gc");
    let config = worker_config(&root, 512);
    let workers = [1, 2].map(|id| spawn_worker("worker", &config, BB, id, 3 - id, &stop, 100));
    std::thread::sleep(Duration::from_millis(1000));
    let usage = support::block_bytes_on_disk(&root);
    let budget = usage - 100 * BB as u64;
    let budget_s = budget.to_string();
    let (status, gc) = kvtier(&["gc", root.to_str().unwrap(), "--max-bytes", &budget_s]);
    let after = support::block_bytes_on_disk(&root);
    eprintln!("gc: {gc}; {after} bytes after");
    assert_eq!(status, 0, "{gc}");
    assert!(gc["bytes_after"].as_u64().unwrap() <= budget, "{gc}");
    assert!(gc["removed"].as_u64().unwrap() >= 90, "{gc}");
    // Within the budget plus one job's stores of each live tier.
    let slack = 2 * JOB_BLOCKS as u64 * BB as u64;
    assert!(
        after <= budget + slack,
        "{after} bytes after gc, budget {budget}: {gc}"
    );
    for &i in &used {
        let name = format!(
            "{}.kvb",
            key(i)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        assert_eq!(
            files(&ns_dir(&root, NS), &name).len(),
            1,
            "block {i}, loaded, went before older ones"
        );
    }
    // Down to a few blocks, while the workers load theirs: misses, no errors.
    let few = (8 * BB).to_string();
    let (status, gc) = kvtier(&[
        "gc",
        root.to_str().unwrap(),
        "--max-bytes",
        &few,
        "--namespace",
        NS,
    ]);
    assert_eq!(status, 0, "{gc}");
    assert!(gc["bytes_after"].as_u64().unwrap() <= 8 * BB as u64, "{gc}");
    std::fs::write(&stop, b"").unwrap();
    for w in workers {
        let said = finish_worker(w);
        assert!(said.contains("ok"), "{said}");
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn clear_removes_one_namespace_for_every_live_tier_and_nothing_else() {
    let root = root_dir();
    store_closed(&root, OTHER_NS, &(100..120).collect::<Vec<_>>());
    let theirs = files(&ns_dir(&root, OTHER_NS), ".kvb");
    let stop = stop_file(&root, "stop-clear");
    let config = worker_config(&root, 256);
    let workers = [1, 2].map(|id| spawn_worker("worker", &config, BB, id, 3 - id, &stop, 20));
    std::thread::sleep(Duration::from_millis(800));
    let began = SystemTime::now();
    let (status, clear) = kvtier(&[
        "clear",
        root.to_str().unwrap(),
        "--namespace",
        NS,
        "--probe-ttl-ms",
        "100",
    ]);
    eprintln!("clear: {clear}");
    assert_eq!(status, 0, "{clear}");
    let dir = &clear["directories"][0];
    assert_eq!(dir["generation"], 1, "{clear}");
    assert!(dir["blocks_before"].as_u64().unwrap() > 0, "{clear}");
    assert_eq!(dir["old_blocks_left"], 0, "{clear}");
    for file in files(&ns_dir(&root, NS), ".kvb") {
        let Ok(meta) = std::fs::metadata(&file) else {
            continue;
        };
        assert!(
            meta.modified().unwrap() >= began,
            "{} was stored before the clear and stayed",
            file.display()
        );
    }
    assert_eq!(
        files(&ns_dir(&root, OTHER_NS), ".kvb"),
        theirs,
        "another namespace's blocks were touched"
    );
    let (_, inspect) = kvtier(&["inspect", root.to_str().unwrap(), "--namespace", NS]);
    assert_eq!(
        inspect["namespaces"][0]["tenants"][0]["generation"], 1,
        "{inspect}"
    );
    std::fs::write(&stop, b"").unwrap();
    for w in workers {
        finish_worker(w);
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_closed_directory_is_counted_from_its_manifest_and_a_held_one_says_so() {
    let root = root_dir();
    let mut c = common::disk_config(256, BB);
    c.disk.path = Some(root.clone());
    c.namespace = "solo".into();
    {
        let h = Harness::leaving_dir(&c, JOB_BLOCKS, BB);
        for n in 0..10u64 {
            h.store_all(n + 1, &(n * 5..n * 5 + 4).collect::<Vec<_>>());
        }
    }
    let root_s = root.to_str().unwrap();
    let (status, inspect) = kvtier(&["inspect", root_s]);
    assert_eq!(status, 0);
    let ns = &inspect["namespaces"][0];
    assert_eq!(
        (ns["source"].as_str(), ns["blocks"].as_u64()),
        (Some("manifest"), Some(40)),
        "{inspect}"
    );
    assert_eq!(ns["manifest"]["trusted"], true, "{inspect}");
    assert_eq!(ns["held_by"], "nobody");
    let (_, scanned) = kvtier(&["inspect", root_s, "--scan"]);
    assert_eq!(scanned["namespaces"][0]["source"], "scan");
    assert_eq!(scanned["blocks"], 40, "{scanned}");
    assert_eq!(
        scanned["bytes"], inspect["bytes"],
        "the manifest's sizes are the files'"
    );
    assert_eq!(scanned["namespaces"][0]["ages"]["<1m"], 40, "{scanned}");

    let h = Harness::leaving_dir(&c, JOB_BLOCKS, BB);
    let (_, held) = kvtier(&["inspect", root_s]);
    assert_eq!(
        held["namespaces"][0]["held_by"], "a non-shared tier",
        "{held}"
    );
    assert_eq!(
        held["namespaces"][0]["source"], "scan",
        "a live directory is listed"
    );
    let (status, verify) = kvtier(&["verify", root_s]);
    assert_eq!((status, verify["ok"].as_u64()), (0, Some(40)), "{verify}");
    let (status, clear) = kvtier(&["clear", root_s, "--namespace", "solo"]);
    assert_eq!(status, 1, "a non-shared tier owns it: {clear}");
    assert!(
        clear["directories"][0]["error"]
            .as_str()
            .unwrap()
            .contains("shared=false"),
        "{clear}"
    );
    assert!(h.tier().lookup(&common::keys(&[0]), KEY_LEN).unwrap()[0] == kvtier::LookupState::Hit);
    drop(h);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn bad_usage_exits_2() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kvtier"))
            .args(args)
            .output()
            .unwrap()
            .status
            .code()
    };
    assert_eq!(run(&["gc", "/tmp"]), Some(2), "--max-bytes is required");
    assert_eq!(run(&["gc", "/tmp", "--max-bytes", "lots"]), Some(2));
    assert_eq!(run(&["verify"]), Some(2));
    assert_eq!(run(&["clear", "/tmp", "--namespace", " "]), Some(2));
    assert_eq!(run(&["frobnicate"]), Some(2));
}
