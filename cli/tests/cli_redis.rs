//! The `kvtier` command on a Redis Cluster of three masters (and a single
//! server): verify finds every fault a test injects while two live tier
//! processes store and load (a flipped bit, a value cut short, a value of
//! another type, a key of no kvtier format, another namespace's block under
//! this one's name, a block of a generation a clear left), repair removes
//! only what a tier may and no good block; gc under live load ends within
//! the budget plus one job's stores, idle longest first (OBJECT IDLETIME),
//! every load exact or a miss; clear removes one namespace for every live
//! tier and nothing else.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use common::redis::{shared_cluster, shared_server};
use common::{key, Harness};
use kvtier::admin::{generation_fingerprint, namespace_fingerprint};
use kvtier::TierConfig;
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::Commands;
use std::time::Duration;
use support::{config_text, finish_worker, kvtier, spawn_worker, stop_file, strings, JOB_BLOCKS};

const NS: &str = "vllm/org-model-a/float16/t16/tp1pp1/r0/6859a213dc7a";
const OTHER_NS: &str = "vllm/org-model-b/float16/t16/tp1pp1/r0/0123456789ab";
const BB: usize = 16 << 10;

#[test]
#[ignore]
fn worker() {
    support::worker();
}

fn shared(url: &str, prefix: &str, namespace: &str, capacity_blocks: usize) -> TierConfig {
    let mut c = common::redis::redis_config_at(url, capacity_blocks, BB);
    for (k, v) in [
        ("key_prefix", prefix),
        ("sharing", "shared"),
        ("namespace", namespace),
    ] {
        c.set(k, v).unwrap();
    }
    c.probe_ttl_ms = 50;
    c
}

fn worker_config(url: &str, prefix: &str) -> String {
    config_text(&[
        ("backend", "redis".into()),
        ("url", url.into()),
        ("key_prefix", prefix.into()),
        ("sharing", "shared".into()),
        ("namespace", NS.into()),
        ("probe_ttl_ms", "50".into()),
        ("io_timeout_ms", "5000".into()),
        ("capacity_bytes", (256 * BB).to_string()),
    ])
}

/// A shared tier's name for test key `i` of `namespace` in generation 0.
fn name(prefix: &str, namespace: &str, i: u64) -> String {
    let fp = generation_fingerprint(namespace_fingerprint(namespace), 0, 0);
    let hex: String = key(i).iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}:{fp:016x}:b{BB}:{{{hex}}}")
}

fn store_closed(url: &str, prefix: &str, namespace: &str, ids: &[u64]) {
    let h = Harness::leaving_dir(&shared(url, prefix, namespace, 1024), JOB_BLOCKS, BB);
    for (n, chunk) in ids.chunks(JOB_BLOCKS).enumerate() {
        h.store_all(n as u64 + 1, chunk);
    }
}

fn connect(url: &str) -> ClusterConnection {
    ClusterClient::new(url.split(',').collect::<Vec<_>>())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// Bytes of every value under `prefix`, through the command's own count.
fn usage(url: &str, prefix: &str) -> u64 {
    let (_, inspect) = kvtier(&["inspect", url, "--key-prefix", prefix]);
    inspect["bytes"].as_u64().unwrap()
}

fn sorted(v: &serde_json::Value) -> Vec<String> {
    let mut v = strings(v);
    v.sort();
    v
}

#[test]
fn verify_finds_every_injected_fault_on_a_cluster_and_repair_removes_only_what_a_tier_may() {
    let cluster = redis_or_skip!(shared_cluster());
    let url = cluster.url();
    let prefix = format!("cliv{}", std::process::id());
    let stop = stop_file(&std::env::temp_dir(), &format!("kvtier-stop-{prefix}"));
    let config = worker_config(&url, &prefix);
    let workers = [1, 2].map(|id| spawn_worker("worker", &config, BB, id, 3 - id, &stop, 20));
    let ids: Vec<u64> = (900..940).collect();
    store_closed(&url, &prefix, NS, &ids);
    store_closed(&url, &prefix, OTHER_NS, &[903]);
    store_closed(&url, &prefix, "left-by-a-clear", &[1]);
    let mut c = connect(&url);
    let (flipped, cut, typed) = (
        name(&prefix, NS, 910),
        name(&prefix, NS, 911),
        name(&prefix, NS, 912),
    );
    let mut value: Vec<u8> = c.get(&flipped).unwrap();
    *value.last_mut().unwrap() ^= 1;
    let () = c.set(&flipped, value).unwrap();
    let value: Vec<u8> = c.get(&cut).unwrap();
    let () = c.set(&cut, &value[..value.len() - 100]).unwrap();
    let () = c.del(&typed).unwrap();
    let _: i64 = c.rpush(&typed, "not a block").unwrap();
    let foreign_key = format!("{prefix}:notes");
    let () = c.set(&foreign_key, "an operator's notes").unwrap();
    let other: Vec<u8> = c.get(name(&prefix, OTHER_NS, 903)).unwrap();
    let foreign_block = name(&prefix, NS, 903);
    let () = c.set(&foreign_block, other).unwrap();
    // A namespace cleared once (its generation key says 1): its block of
    // generation 0 is stale, as a clear whose sweep ran out of time leaves.
    let stale = name(&prefix, "left-by-a-clear", 1);
    let generation = format!(
        "{prefix}:{:016x}:generation:b{BB}",
        namespace_fingerprint("left-by-a-clear")
    );
    let () = c.set(&generation, "1").unwrap();

    let (status, verify) = kvtier(&["verify", &url, "--key-prefix", &prefix]);
    assert_eq!(status, 1, "{verify}");
    let mut damaged = vec![flipped.clone(), cut.clone(), typed.clone()];
    damaged.sort();
    assert_eq!(sorted(&verify["damaged"]), damaged, "{verify}");
    let mut foreign = vec![foreign_block.clone(), foreign_key.clone()];
    foreign.sort();
    assert_eq!(sorted(&verify["foreign"]), foreign, "{verify}");
    assert_eq!(sorted(&verify["stale"]), vec![stale.clone()], "{verify}");
    assert!(
        verify["ok"].as_u64().unwrap() >= ids.len() as u64 - 4,
        "{verify}"
    );

    let (status, repaired) = kvtier(&["verify", &url, "--key-prefix", &prefix, "--repair"]);
    assert_eq!(status, 1, "foreign keys stay: {repaired}");
    let mut removed = damaged.clone();
    removed.push(stale.clone());
    removed.sort();
    assert_eq!(
        sorted(&repaired["repair"]["removed"]),
        removed,
        "{repaired}"
    );
    for gone in &removed {
        assert!(!c.exists::<_, bool>(gone).unwrap(), "{gone}");
    }
    for kept in &foreign {
        assert!(c.exists::<_, bool>(kept).unwrap(), "{kept}");
    }
    let good: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|i| ![903, 910, 911, 912].contains(i))
        .collect();
    let h = Harness::leaving_dir(&shared(&url, &prefix, NS, 1024), good.len(), BB);
    let rows: Vec<i64> = (0..good.len() as i64).collect();
    let seen = h.lookup_settled(&good, Duration::from_secs(10));
    assert!(
        seen.iter().all(|s| *s == kvtier::LookupState::Hit),
        "{seen:?}"
    );
    let r = h.load(1, &good, &rows);
    assert!(r.is_ok(), "no good block lost: {r:?}");
    for (row, &i) in good.iter().enumerate() {
        assert!(h.row_holds(row, i), "block {i}");
    }
    drop(h);
    std::fs::write(&stop, b"").unwrap();
    for w in workers {
        finish_worker(w);
    }
    let _ = std::fs::remove_file(&stop);
}

#[test]
fn gc_and_clear_on_a_cluster_under_live_load() {
    let cluster = redis_or_skip!(shared_cluster());
    let url = cluster.url();
    let prefix = format!("clig{}", std::process::id());
    let old: Vec<u64> = (5000..5100).collect();
    store_closed(&url, &prefix, NS, &old);
    // OBJECT IDLETIME counts seconds: the old blocks idle a few of them,
    // then 20 of them are loaded (a GET is a use).
    std::thread::sleep(Duration::from_secs(3));
    let used: Vec<u64> = old[..20].to_vec();
    let h = Harness::leaving_dir(&shared(&url, &prefix, NS, 1024), used.len(), BB);
    let rows: Vec<i64> = (0..used.len() as i64).collect();
    h.lookup_settled(&used, Duration::from_secs(10));
    assert!(h.load(1, &used, &rows).is_ok());
    drop(h);
    // As fresh as the used ones: only --namespace keeps them from a gc.
    store_closed(&url, &prefix, OTHER_NS, &(100..120).collect::<Vec<_>>());
    let stop = stop_file(&std::env::temp_dir(), &format!("kvtier-stop-{prefix}"));
    let config = worker_config(&url, &prefix);
    let workers = [1, 2].map(|id| spawn_worker("worker", &config, BB, id, 3 - id, &stop, 100));
    std::thread::sleep(Duration::from_millis(1000));
    let value_len = (BB + 56 + 36) as u64;
    let budget = usage(&url, &prefix) - 50 * value_len;
    let (status, gc) = kvtier(&[
        "gc",
        &url,
        "--key-prefix",
        &prefix,
        "--max-bytes",
        &budget.to_string(),
    ]);
    let after = usage(&url, &prefix);
    eprintln!("gc: {gc}; {after} bytes after");
    assert_eq!(status, 0, "{gc}");
    assert!(gc["bytes_after"].as_u64().unwrap() <= budget, "{gc}");
    assert!(
        after <= budget + 2 * JOB_BLOCKS as u64 * value_len,
        "{after} after, budget {budget}: {gc}"
    );
    let mut c = connect(&url);
    for &i in &used {
        assert!(
            c.exists::<_, bool>(name(&prefix, NS, i)).unwrap(),
            "block {i} was used, and went before idler ones"
        );
    }
    // Down to a few blocks of NS, while the workers load theirs: misses.
    let few = (8 * value_len).to_string();
    let (status, gc) = kvtier(&[
        "gc",
        &url,
        "--key-prefix",
        &prefix,
        "--max-bytes",
        &few,
        "--namespace",
        NS,
    ]);
    assert_eq!(status, 0, "{gc}");
    let theirs = kvtier(&[
        "inspect",
        &url,
        "--key-prefix",
        &prefix,
        "--namespace",
        OTHER_NS,
    ])
    .1;
    assert_eq!(
        theirs["namespaces"][0]["blocks"], 20,
        "another namespace's blocks stay: {theirs}"
    );

    let (status, clear) = kvtier(&[
        "clear",
        &url,
        "--key-prefix",
        &prefix,
        "--namespace",
        NS,
        "--probe-ttl-ms",
        "100",
    ]);
    eprintln!("clear: {clear}");
    assert_eq!(status, 0, "{clear}");
    assert_eq!(clear["old_blocks_left"], 0, "{clear}");
    let generation = format!(
        "{prefix}:{:016x}:generation:b{BB}",
        namespace_fingerprint(NS)
    );
    assert_eq!(c.get::<_, String>(&generation).unwrap(), "1");
    for i in old.iter().chain(&used) {
        assert!(
            !c.exists::<_, bool>(name(&prefix, NS, *i)).unwrap(),
            "block {i} of before the clear"
        );
    }
    let theirs = kvtier(&[
        "inspect",
        &url,
        "--key-prefix",
        &prefix,
        "--namespace",
        OTHER_NS,
    ])
    .1;
    assert_eq!(theirs["namespaces"][0]["blocks"], 20, "{theirs}");
    std::fs::write(&stop, b"").unwrap();
    for w in workers {
        finish_worker(w);
    }
    let _ = std::fs::remove_file(&stop);
}

#[test]
fn inspect_names_namespaces_and_tenants_on_a_single_server() {
    let server = redis_or_skip!(shared_server());
    let url = server.url();
    let prefix = format!("clii{}", std::process::id());
    store_closed(&url, &prefix, NS, &(0..8).collect::<Vec<_>>());
    let (status, inspect) = kvtier(&["inspect", &url, "--key-prefix", &prefix]);
    assert_eq!(status, 0, "{inspect}");
    assert_eq!(
        (inspect["cluster"].as_bool(), inspect["blocks"].as_u64()),
        (Some(false), Some(8)),
        "{inspect}"
    );
    let group = &inspect["namespaces"][0];
    assert_eq!(
        group["attributed"], false,
        "never cleared, not named: {inspect}"
    );
    let (_, named) = kvtier(&["inspect", &url, "--key-prefix", &prefix, "--namespace", NS]);
    let ns = &named["namespaces"][0];
    assert_eq!(
        (ns["namespace"].as_str(), ns["blocks"].as_u64()),
        (Some(NS), Some(8)),
        "{named}"
    );
    assert_eq!(ns["tenants"][0]["tenant"], "unsealed");
    assert_eq!(ns["ages"]["<1m"], 8, "{named}");
    let (status, verify) = kvtier(&["verify", &url, "--key-prefix", &prefix]);
    assert_eq!((status, verify["ok"].as_u64()), (0, Some(8)), "{verify}");
}
