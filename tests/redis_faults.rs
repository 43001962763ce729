//! Redis faults at the edges of the keyspace's contract, on real servers
//! started by the tests: a cluster joined while one master is down, a
//! frozen master reached through a redirection, and values that are not
//! kvtier blocks (another type, no header) under a tier's names. See
//! docs/reliability-rules.md.

mod common;

use common::redis::{redis_config_at, RedisCluster};
use common::*;
use kvtier::{
    ErrorKind, EventKind, FailReason, LookupState::*, PrimaryBuffer, RemovedReason, Tier,
    TierConfig,
};
use std::time::{Duration, Instant};

const BB: usize = 4096;

fn hex_of(i: u64) -> String {
    key(i).iter().map(|b| format!("{b:02x}")).collect()
}

const IO_TIMEOUT_MS: u64 = 1000;

/// The slot test key `i`'s name hashes to (its name ends in `{<key hex>}`).
fn slot_of(i: u64) -> u16 {
    common::redis::key_slot(format!("{{{}}}", hex_of(i)).as_bytes())
}

fn open_err(config: &TierConfig) -> kvtier::Error {
    let mut rows = vec![0u8; 4 * BB];
    let primary = unsafe { PrimaryBuffer::new(rows.as_mut_ptr(), rows.len(), BB) }.unwrap();
    Tier::new(config, primary).expect_err("tier_new should fail")
}

/// Stores block `i` alone; the job's error, if any, and how long it took.
fn store_one(h: &Harness, job: u64, i: u64) -> (Option<ErrorKind>, Duration) {
    h.fill(0, i);
    let started = Instant::now();
    let r = h.store(job, &[i], &[0]);
    (r.error, started.elapsed())
}

/// With one master of three down before `tier_new` (the cluster not
/// requiring full coverage, so the others serve their slots), tiers open
/// from any seed, the live masters' slots work, the dead one's fail on time,
/// and once the master is back every slot works. A seed list of only the
/// dead node fails, naming it.
#[test]
fn a_cluster_with_a_dead_master_can_be_joined_and_recovers() {
    let mut cluster = redis_or_skip!(RedisCluster::start_with(
        3,
        0,
        &[("cluster-require-full-coverage", "no")]
    ));
    let dead = cluster.kill9_master(0);
    let mut config = redis_config_at(&cluster.url(), 256, BB);
    config.set("cluster", "on").unwrap();
    config
        .set("io_timeout_ms", &IO_TIMEOUT_MS.to_string())
        .unwrap();
    let in_time = Duration::from_millis(IO_TIMEOUT_MS) + Duration::from_secs(5);

    // Before the others flag it failed (seeds in any order), and after.
    let mut seeds: Vec<u16> = cluster.ports();
    seeds.sort_by_key(|&p| p != dead.port);
    let dead_first = seeds
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut early = config.clone();
    early.set("url", &dead_first).unwrap();
    let early = Harness::new(&early, 8, BB);
    cluster.wait_for_nodes(
        "the dead master flagged",
        Duration::from_secs(30),
        |nodes| nodes.iter().any(|n| n.port == dead.port && n.failed),
    );
    for sharing in ["owned", "shared"] {
        let mut c = config.clone();
        c.set("sharing", sharing).unwrap();
        c.set("namespace", "shared-test").unwrap();
        drop(Harness::new(&c, 8, BB));
    }
    drop(early);
    let ids: Vec<u64> = (0..48).collect();
    let (lost, kept): (Vec<u64>, Vec<u64>) = ids.iter().partition(|&&i| dead.serves(slot_of(i)));
    assert!(!lost.is_empty() && !kept.is_empty(), "keys on every master");
    // A shared tier whose namespace's clear generation lives on the dead
    // master opens all the same; it stores nothing until it can read it.
    let mut on_dead = config.clone();
    on_dead.set("sharing", "shared").unwrap();
    on_dead.set("namespace", "shared-test").unwrap();
    let fp = kvtier::admin::namespace_fingerprint("shared-test");
    let prefix = (0..)
        .map(|n| format!("{}-g{n}", config.redis.key_prefix))
        .find(|p| {
            let name = format!("{p}:{fp:016x}:generation:b{BB}");
            dead.serves(common::redis::key_slot(name.as_bytes()))
        })
        .unwrap();
    on_dead.set("key_prefix", &prefix).unwrap();
    let shared = Harness::new(&on_dead, 8, BB);
    let (error, took) = store_one(&shared, 1, kept[0]);
    assert_eq!(error, Some(ErrorKind::Io), "no generation, no store");
    assert!(took < in_time, "failed after {took:?}");
    let h = Harness::new(&config, 8, BB);

    let mut job = 0;
    for &i in &kept {
        job += 1;
        let (error, _) = store_one(&h, job, i);
        assert_eq!(error, None, "block {i} on a live master");
    }
    for &i in &lost[..3] {
        job += 1;
        let (error, took) = store_one(&h, job, i);
        assert_eq!(error, Some(ErrorKind::Io), "block {i} on the dead master");
        assert!(took < in_time, "failed after {took:?}");
    }
    for &i in &kept {
        job += 1;
        let r = h.load(job, &[i], &[1]);
        assert!(r.is_ok() && h.row_holds(1, i), "block {i}: {r:?}");
    }

    // Only the dead node as seed: it is the one the message names.
    let mut only_dead = config.clone();
    only_dead
        .set("url", &format!("redis://127.0.0.1:{}", dead.port))
        .unwrap();
    let e = open_err(&only_dead);
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.message().contains(&dead.port.to_string()), "{e}");

    cluster.restart(dead.port);
    cluster.wait_for_state("ok", Duration::from_secs(30));
    // The tier's connection to the returned master comes back within its
    // reconnection backoff; every block then stores and loads.
    for &i in &lost {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            job += 1;
            match store_one(&h, job, i) {
                (None, _) => break,
                (Some(e), _) if Instant::now() < deadline => {
                    assert_eq!(e, ErrorKind::Io);
                    std::thread::sleep(Duration::from_millis(200));
                }
                (Some(e), _) => panic!("block {i} after the master returned: {e:?}"),
            }
        }
    }
    let rows: Vec<i64> = (0..ids.len().min(8) as i64).collect();
    for chunk in ids.chunks(8) {
        job += 1;
        let r = h.load(job, chunk, &rows[..chunk.len()]);
        assert!(r.is_ok(), "{chunk:?}: {r:?}");
        assert!(chunk
            .iter()
            .enumerate()
            .all(|(row, &i)| h.row_holds(row, i)));
    }
    // The shared tier reads its generation once the master is back.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match store_one(&shared, 2, kept[0]) {
            (None, _) => break,
            (Some(e), _) if Instant::now() < deadline => {
                assert_eq!(e, ErrorKind::Io);
                std::thread::sleep(Duration::from_millis(200));
            }
            (Some(e), _) => panic!("the shared tier after the master returned: {e:?}"),
        }
    }
    let r = shared.load(3, &[kept[0]], &[1]);
    assert!(r.is_ok() && shared.row_holds(1, kept[0]), "{r:?}");
    // A fresh tier joins the whole cluster again.
    drop(Harness::new(&config, 8, BB));
}

/// What `tamper` leaves under block 1's name makes its load fail Corrupt at
/// once (not a transient Io), the key a MISS with a Removed(Corrupt) event,
/// and (owned keyspace) the value deleted.
fn a_foreign_value_is_corrupt(config: TierConfig, cli: &dyn Fn(&[&str]) -> String) {
    let config = with_events(config, 64);
    let h = Harness::new(&config, 8, BB);
    let prefix = config.redis.key_prefix.clone();
    let headerless = "z".repeat(BB + 64);
    let tampers: [(&str, &[&str]); 5] = [
        ("a list", &["RPUSH", "{name}", "x", "y"]),
        ("a hash", &["HSET", "{name}", "f", "v"]),
        ("a set", &["SADD", "{name}", "m"]),
        ("an empty string", &["SET", "{name}", ""]),
        ("a string without a header", &["SET", "{name}", &headerless]),
    ];
    for (n, (what, tamper)) in tampers.iter().enumerate() {
        let id = 1 + n as u64;
        let job = 10 * id;
        h.store_all(job, &[id]);
        let pattern = format!("{prefix}:*{}}}", hex_of(id));
        let name = cli(&["--scan", "--pattern", &pattern]);
        assert!(!name.is_empty() && !name.contains('\n'), "{name:?}");
        cli(&["DEL", &name]);
        let args: Vec<&str> = tamper
            .iter()
            .map(|a| if *a == "{name}" { name.as_str() } else { a })
            .collect();
        cli(&args);
        let _ = h.events();
        let r = h.load(job + 1, &[id], &[1]);
        assert_eq!(r.error, Some(ErrorKind::Corrupt), "{what}: {r:?}");
        assert_eq!(h.lookup(&[id]), [Miss], "{what}");
        let corrupt = EventKind::Removed(RemovedReason::Corrupt);
        assert_eq!(h.events(), [(corrupt, id)], "{what}");
        assert_eq!(cli(&["EXISTS", &name]), "0", "{what}: deleted (owned)");
        // The name is usable again.
        h.store_all(job + 2, &[id]);
        let r = h.load(job + 3, &[id], &[1]);
        assert!(r.is_ok() && h.row_holds(1, id), "{what}: {r:?}");
    }
}

#[test]
fn a_value_of_another_type_or_without_a_header_is_corrupt_on_a_server() {
    let server = redis_or_skip!();
    let config = redis_config_at(&server.url(), 64, BB);
    a_foreign_value_is_corrupt(config, &|args| server.cli(args));
}

#[test]
fn a_value_of_another_type_or_without_a_header_is_corrupt_on_a_cluster() {
    let cluster = redis_or_skip!(RedisCluster::start(3, 0));
    let mut config = redis_config_at(&cluster.url(), 64, BB);
    config.set("cluster", "on").unwrap();
    a_foreign_value_is_corrupt(config, &|args| {
        if args[0] == "--scan" {
            // A scan of every master: the name lives on one of them.
            cluster
                .masters()
                .iter()
                .map(|m| cluster.cli_at(m.port, args))
                .filter(|out| !out.is_empty())
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            cluster.cli(args)
        }
    });
}

/// One slot of master A is migrating to master B (`CLUSTER SETSLOT ...
/// MIGRATING/IMPORTING`, no key moved), so A answers every command on a key
/// it does not hold with ASK, naming B: each job of new keys on that slot
/// reaches B only through the redirection. With B frozen (SIGSTOP), such
/// jobs fail within about one deadline (the first with
/// `TIER_FAIL_DEADLINE`) instead of hanging, the tier's blocks elsewhere
/// stay served, and once B is thawed the same redirected jobs succeed.
/// Then the same through MOVED: a slot of A given to B behind the tier's
/// back.
#[test]
fn a_frozen_master_behind_a_redirection_fails_jobs_on_time_and_the_tier_recovers() {
    let cluster = redis_or_skip!(RedisCluster::start_with(
        3,
        0,
        &[("cluster-node-timeout", "60000")]
    ));
    let mut config = redis_config_at(&cluster.url(), 1024, BB);
    config.set("cluster", "on").unwrap();
    config
        .set("io_timeout_ms", &IO_TIMEOUT_MS.to_string())
        .unwrap();
    let h = Harness::new(&config, 8, BB);
    let masters = cluster.masters();
    let (a, b) = (&masters[0], &masters[1]);
    // Keys on one slot of A, four per job.
    let first = (0..).find(|&i| a.serves(slot_of(i))).unwrap();
    let slot = slot_of(first);
    let on_slot: Vec<u64> = (first..).filter(|&i| slot_of(i) == slot).take(16).collect();
    let elsewhere: Vec<u64> = (0..)
        .filter(|&i| !a.serves(slot_of(i)) && !b.serves(slot_of(i)))
        .take(4)
        .collect();
    h.store_all(1, &elsewhere);
    let slot_arg = slot.to_string();
    let importing = cluster.cli_at(
        b.port,
        &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &a.id],
    );
    assert_eq!(importing, "OK");
    let migrating = cluster.cli_at(
        a.port,
        &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &b.id],
    );
    assert_eq!(migrating, "OK");
    let rows: Vec<i64> = (0..4).collect();
    for (row, &i) in on_slot[..4].iter().enumerate() {
        h.fill(row, i);
    }

    // B answering: the redirected blocks are stored on B and load back.
    let r = h.store(2, &on_slot[..4], &rows);
    assert!(r.is_ok(), "{r:?}");
    let on_b = cluster.cli_at(b.port, &["CLUSTER", "COUNTKEYSINSLOT", &slot_arg]);
    assert_eq!(on_b, "4", "the blocks went where A's ASK sent them");
    for row in 0..4 {
        h.write_row(row, &[0u8; BB]);
    }
    // A key only on B, asked of A: ASK again, for a load.
    let r = h.load(3, &on_slot[..4], &rows);
    assert!(r.is_ok(), "{r:?}");
    assert!(on_slot[..4]
        .iter()
        .enumerate()
        .all(|(row, &i)| h.row_holds(row, i)));

    // B frozen: jobs through the redirection fail on time.
    cluster.server(b.port).freeze();
    let deadline = Duration::from_millis(IO_TIMEOUT_MS);
    for (job, keys) in on_slot[4..12].chunks(4).enumerate() {
        for (row, &i) in keys.iter().enumerate() {
            h.fill(row, i);
        }
        let started = Instant::now();
        let r = h.store(10 + job as u64, keys, &rows);
        let took = started.elapsed();
        assert_eq!(r.error, Some(ErrorKind::Io), "{r:?}");
        if job == 0 {
            assert_eq!(r.reason, FailReason::Deadline, "{r:?}");
        }
        assert!(
            took < deadline * 2,
            "job {job} through a redirection to a frozen master took {took:?} with a {deadline:?} deadline"
        );
    }
    let started = Instant::now();
    let r = h.load(20, &on_slot[..4], &rows);
    assert_eq!(r.error, Some(ErrorKind::Io), "{r:?}");
    assert!(started.elapsed() < deadline * 2, "{:?}", started.elapsed());
    // The other masters' blocks do not wait for B.
    let started = Instant::now();
    let r = h.load(21, &elsewhere, &rows);
    assert!(r.is_ok(), "{r:?}");
    assert!(started.elapsed() < deadline, "{:?}", started.elapsed());

    // Thawed: the redirected jobs work again.
    cluster.server(b.port).thaw();
    let keys = &on_slot[12..16];
    for (row, &i) in keys.iter().enumerate() {
        h.fill(row, i);
    }
    let stored =
        common::redis::wait_until(Duration::from_secs(10), || h.store(30, keys, &rows).is_ok());
    assert!(stored, "stores through the redirection never worked again");
    for row in 0..4 {
        h.write_row(row, &[0u8; BB]);
    }
    let r = h.load(31, keys, &rows);
    assert!(r.is_ok(), "{r:?}");
    assert!(keys.iter().enumerate().all(|(row, &i)| h.row_holds(row, i)));

    // MOVED: another (empty) slot of A given to B behind the tier's back,
    // so A answers MOVED naming B, and B frozen: the job that follows the
    // redirection fails on time too, and works once B answers.
    let moved: Vec<u64> = (first..)
        .filter(|&i| a.serves(slot_of(i)) && slot_of(i) != slot)
        .take(1)
        .collect();
    let moved_slot = slot_of(moved[0]).to_string();
    for port in [b.port, a.port, masters[2].port] {
        let out = cluster.cli_at(port, &["CLUSTER", "SETSLOT", &moved_slot, "NODE", &b.id]);
        assert_eq!(out, "OK", "SETSLOT NODE at {port}");
    }
    h.fill(0, moved[0]);
    let moved_by_a = || {
        let stats = cluster.cli_at(a.port, &["INFO", "errorstats"]);
        let count = stats
            .lines()
            .find_map(|l| l.strip_prefix("errorstat_MOVED:count="));
        count.map_or(0, |n| n.trim().parse::<u64>().unwrap())
    };
    let before = moved_by_a();
    cluster.server(b.port).freeze();
    let started = Instant::now();
    let r = h.store(40, &moved, &[0]);
    let took = started.elapsed();
    cluster.server(b.port).thaw();
    assert!(moved_by_a() > before, "the job met no MOVED");
    assert_eq!(r.error, Some(ErrorKind::Io), "{r:?}");
    assert_eq!(r.reason, FailReason::Deadline, "{r:?}");
    assert!(
        took < deadline * 2,
        "through MOVED to a frozen master: {took:?}"
    );
    let stored = common::redis::wait_until(Duration::from_secs(10), || {
        h.store(41, &moved, &[0]).is_ok()
    });
    assert!(stored, "stores on the moved slot never worked again");
    let on_b = cluster.cli_at(b.port, &["CLUSTER", "COUNTKEYSINSLOT", &moved_slot]);
    assert_eq!(on_b, "1");
}
